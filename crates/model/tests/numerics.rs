//! The numerics identifier read from a file's metadata alone (what a replay checks before it
//! loads anything) is the one of the loaded weights, for every family and format of the tiny
//! quantised models, both re-quantisations and both KV cache types.

use nextok_model::file::GgufFile;
use nextok_model::numerics::{identifier, identifier_of_file};
use nextok_model::{KvCacheType, ModelWeights, Requant};

#[test]
fn the_identifier_from_metadata_is_the_loaded_weights_one() {
    let dir = nextok_testdata::repo_root().join("testdata/tiny-quant");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    assert!(files.len() >= 40, "{} tiny models", files.len());
    let mut seen = std::collections::BTreeSet::new();
    for p in &files {
        let f = GgufFile::open(p).unwrap();
        for requant in [Requant::Keep, Requant::Q8_0] {
            let w = ModelWeights::load(p, requant).unwrap();
            for kv in KvCacheType::ALL {
                let from_file = identifier_of_file(&f, requant, kv).unwrap();
                assert_eq!(from_file, identifier(&w, kv), "{}", p.display());
                seen.insert(from_file);
            }
        }
    }
    // the families, formats and caches give distinct identifiers
    assert!(seen.len() > 40, "{} identifiers", seen.len());
    eprintln!(
        "{} distinct identifiers over {} files",
        seen.len(),
        files.len()
    );
}
