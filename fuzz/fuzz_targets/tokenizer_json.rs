#![no_main]
//! A `tokenizer.json` file: load the vocabulary (exact token bytes, special tokens, EOS).

use libfuzzer_sys::fuzz_target;
use nextok_vocab::{LoadOptions, Vocabulary};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = Vocabulary::from_tokenizer_json(data, "fuzz", &LoadOptions::default()) {
        let n = v.info.vocab_size as u32;
        for id in [0, n / 2, n.saturating_sub(1)] {
            let _ = v.token(id);
            let _ = v.name(id);
        }
    }
});
