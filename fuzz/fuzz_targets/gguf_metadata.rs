#![no_main]
//! GGUF metadata: parse it, load the vocabulary and the encoder from it.

use libfuzzer_sys::fuzz_target;
use nextok_vocab::gguf::Gguf;
use nextok_vocab::{LoadOptions, Vocabulary};

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data, "fuzz") else {
        return;
    };
    if let Ok(v) = Vocabulary::from_gguf(&g, "fuzz", &LoadOptions::default()) {
        let _ = v.token(0);
    }
    if let Ok(e) = nextok_vocab::encode::Encoder::from_gguf(&g, "fuzz") {
        let _ = e.encode("hello world 12 <s>", true);
    }
});
