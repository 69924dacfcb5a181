//! Writes the tiny seeded model of every family (the ones `tests/families.rs` builds) into a
//! directory: `cargo run -p nextok-model --example tiny_models -- DIR`; with `--real-vocab`,
//! the same models carrying their families' real tokenizers (from the test data) instead; with
//! `--wide`, one-layer models whose rows hold 256 values (for the K-quants); with `--keys`, the
//! Gemma 3 model with the optional keys llama.cpp reads (its layer pattern, local rotary base
//! and logit soft-cap: a fuzzing seed, `scripts/fuzz.sh`). The
//! script that makes the llama.cpp references (`scripts/reference/model-logits.sh`) runs
//! llama.cpp on them.

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let Some(dir) = args.iter().find(|a| !a.to_string_lossy().starts_with("--")) else {
        eprintln!("usage: tiny_models DIR [--real-vocab | --wide | --keys]");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    if flag("--keys") {
        use nextok_vocab::gguf::{Array, Value as G};
        let t = common::tiny::Tiny::of(nextok_model::arch::Arch::Gemma3);
        let mut md = t.metadata();
        md.extend([
            (
                "gemma3.attention.sliding_window_pattern".to_string(),
                G::Array(Array::Bool(vec![
                    true, false, true, true, true, false, true,
                ])),
            ),
            ("gemma3.rope.freq_base_swa".to_string(), G::F32(5000.0)),
            ("gemma3.final_logit_softcapping".to_string(), G::F32(30.0)),
        ]);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tiny-gemma3-keys.gguf");
        std::fs::write(&p, common::gguf(&md, &t.tensors(common::tiny::SEED))).unwrap();
        println!("{}", p.display());
        return;
    }
    let tinies = if flag("--real-vocab") {
        common::tiny::Tiny::all_with_real_vocab().unwrap_or_else(|| {
            eprintln!(
                "tiny_models: the real vocabularies are missing: run scripts/fetch-testdata.sh"
            );
            std::process::exit(1);
        })
    } else if flag("--wide") {
        nextok_model::arch::Arch::ALL
            .into_iter()
            .map(common::tiny::Tiny::wide)
            .collect()
    } else {
        common::tiny::Tiny::all()
    };
    for t in tinies {
        let p = t.write_to(&dir, &t.tensors(common::tiny::SEED));
        println!("{}", p.display());
    }
}
