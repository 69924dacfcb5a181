//! Writes the tiny seeded model of every family (the ones `tests/families.rs` builds) into a
//! directory: `cargo run -p nextok-model --example tiny_models -- DIR`. The script that makes
//! the llama.cpp references (`scripts/reference/model-logits.sh`) runs llama.cpp on them.

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: tiny_models DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    for t in common::tiny::Tiny::all() {
        let p = t.write_to(&dir, &t.tensors(common::tiny::SEED));
        println!("{}", p.display());
    }
}
