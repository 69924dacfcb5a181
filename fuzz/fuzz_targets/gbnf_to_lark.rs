#![no_main]
//! GBNF → Lark conversion, then compilation and a few steps of the result.

mod common;

use libfuzzer_sys::fuzz_target;
use nextok_constraint::ConstraintSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if nextok_constraint::gbnf::to_lark(text).is_err() {
        return;
    }
    thread_local!(static E: std::sync::Arc<nextok_constraint::ConstraintEngine> = common::engine());
    E.with(|e| {
        if let Ok(c) = e.compile(&ConstraintSpec::Gbnf {
            gbnf: text.to_string(),
        }) {
            common::exercise(&c);
        }
    });
});
