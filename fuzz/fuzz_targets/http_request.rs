#![no_main]
//! The body of an OpenAI-style request: JSON text parsed as `/v1/chat/completions` and as
//! `/v1/completions` would parse it, down to the engine request (no model is needed for that).

use libfuzzer_sys::fuzz_target;
use nextok_server::api::{self, Endpoint};

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for ep in [Endpoint::Chat, Endpoint::Completions] {
        if let Ok(req) = api::parse(ep, &v) {
            // every engine field has a request name
            for f in ["prompt", "constraint", "processors[0].top_k", "speculative.drafter"] {
                let _ = req.param(f);
            }
        }
    }
});
