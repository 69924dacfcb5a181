#![no_main]
//! JSON-schema compilation (and a few steps of the result).

mod common;

use libfuzzer_sys::fuzz_target;
use nextok_constraint::ConstraintSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    thread_local!(static E: std::sync::Arc<nextok_constraint::ConstraintEngine> = common::engine());
    E.with(|e| {
        let spec = ConstraintSpec::JsonSchema {
            schema,
            options: Default::default(),
        };
        if let Ok(c) = e.compile(&spec) {
            common::exercise(&c);
        }
    });
});
