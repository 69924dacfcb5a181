#![no_main]
//! A GGUF file as the model loader meets it: parse it (metadata and tensor descriptions, every
//! size checked against the file), tell its family, read the family's hyper-parameters (head
//! counts, RoPE settings, window sizes, norms) and load its tensors. Every failure must be a
//! typed error naming the key or tensor: no panic, no allocation sized by the input before it
//! is checked.

use libfuzzer_sys::fuzz_target;
use nextok_model::arch::Arch;
use nextok_model::file::GgufFile;
use nextok_model::{ModelWeights, Requant};

fuzz_target!(|data: &[u8]| {
    // the loader reads files: one per fuzzing process, rewritten for every input
    let path = std::env::temp_dir().join(format!("nextok-fuzz-model-{}.gguf", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(f) = GgufFile::open(&path) {
        if let Ok(arch) = Arch::of(&f) {
            let _ = arch.config(&f);
        }
        let _ = ModelWeights::from_file(&f, Requant::Keep);
    }
});
