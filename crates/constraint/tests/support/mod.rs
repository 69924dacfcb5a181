//! Shared test helpers: the repository root, the real Llama-3 tokenizer, and running a token
//! sequence through a constraint.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use nextok_constraint::{ConstraintEngine, ConstraintVocab, SequenceState};
use nextok_core::constraint::{bitset_words, ConstraintState, ConstraintStatus};
use nextok_vocab::encode::Encoder;
use nextok_vocab::{LoadOptions, Vocabulary};

/// The repository root.
pub fn repo_root() -> PathBuf {
    nextok_testdata::repo_root()
}

/// The Llama-3 engine and encoder, or `None` (with a notice) when the file is absent outside
/// CI.
pub fn llama3() -> Option<&'static (Arc<ConstraintEngine>, Encoder)> {
    static L: OnceLock<Option<(Arc<ConstraintEngine>, Encoder)>> = OnceLock::new();
    L.get_or_init(|| {
        let p = nextok_testdata::require(nextok_testdata::LLAMA3)?;
        let v = Vocabulary::from_tokenizer_json_file(&p, &LoadOptions::default()).unwrap();
        let cv = ConstraintVocab::new(&v.bytes, &v.info).unwrap();
        let engine = ConstraintEngine::new(Arc::new(cv)).unwrap();
        let enc = Encoder::from_tokenizer_json_file(&p).unwrap();
        Some((Arc::new(engine), enc))
    })
    .as_ref()
}

/// Feeds `ids` one by one, checking each is in the mask; returns `Ok(())` when every token is
/// allowed and EOS is allowed at the end, else `Err(index)` of the first rejected step
/// (`ids.len()` when only the end was rejected).
pub fn run(state: &mut SequenceState, ids: &[u32]) -> Result<(), usize> {
    let n = state.compiled().vocab().vocab_size();
    let eos = state.compiled().vocab().eos_token_ids()[0];
    let mut mask = vec![0u64; bitset_words(n)];
    for (i, &t) in ids.iter().enumerate() {
        mask.fill(0);
        state.fill_mask(&mut mask).map_err(|_| i)?;
        let bit = mask[(t / 64) as usize] >> (t % 64) & 1 == 1;
        let ok = state.commit(t).is_ok();
        assert_eq!(bit, ok, "mask and commit disagree at step {i} (token {t})");
        if !ok {
            return Err(i);
        }
    }
    mask.fill(0);
    state.fill_mask(&mut mask).map_err(|_| ids.len())?;
    let end_ok = mask[(eos / 64) as usize] >> (eos % 64) & 1 == 1;
    let st = state.status();
    assert_eq!(
        end_ok,
        matches!(st, ConstraintStatus::Accepted | ConstraintStatus::OnlyEnd),
        "EOS bit and status {st:?} disagree"
    );
    if end_ok {
        Ok(())
    } else {
        Err(ids.len())
    }
}

/// The maskbench subset beside the repository (`../shared/maskbench-dev`), or `None` with a
/// notice (naming `what` is skipped) when it is absent.
pub fn maskbench_dir(what: &str) -> Option<PathBuf> {
    let dir = repo_root().join("../shared/maskbench-dev");
    if dir.exists() {
        Some(dir)
    } else {
        eprintln!("notice: {} absent; skipping {what}", dir.display());
        None
    }
}

/// Which schemas a maskbench run checks: every `NEXTOK_MASKBENCH_SAMPLE`-th (default every
/// 10th, to keep the suite fast in debug builds; `scripts/schema-coverage.sh` runs all).
pub fn maskbench_sample() -> usize {
    std::env::var("NEXTOK_MASKBENCH_SAMPLE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// Every `every`-th `.json` file of `dir`, in name order.
pub fn schema_files(dir: &std::path::Path, every: usize) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths.into_iter().step_by(every.max(1)).collect()
}
