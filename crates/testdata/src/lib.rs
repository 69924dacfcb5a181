//! Where nextok's tests and benchmarks find real test data.
//!
//! `scripts/fetch-testdata.sh` fetches files no one here wrote — real tokenizers and the default
//! model — into `.testdata/` at the repository root, or into the directory named by
//! `NEXTOK_TESTDATA`. A test that needs one calls [`require`]: when the file is absent the test
//! prints a notice and returns early, except when the environment variable `CI` is set (to
//! anything but empty, `0` or `false`), where a missing file fails the test. Benchmarks call
//! [`optional`], which never fails. [`vectors`] runs the shared test vectors under the same
//! rule. [`rows`] makes the deterministic synthetic logits rows the sampler benchmarks and the
//! core's tests share.
//!
//! Notices go straight to standard error, past the test harness's output capture, so a skipped
//! test is seen as skipped rather than passing silently.

use std::io::Write;
use std::path::PathBuf;

pub mod rows;
pub mod vectors;

/// The default model, relative to [`dir`].
pub const SMOLLM2: &str = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The Llama-3 `tokenizer.json`, relative to [`dir`].
pub const LLAMA3: &str = "llama3/tokenizer.json";
/// Gemma 3 270M Q4_K_M (assembled from its four part packages).
pub const GEMMA3_270M: &str = "gemma3/gemma-3-270m-q4_k_m.gguf";
/// Qwen2.5-Coder 0.5B Instruct, Q4_K_M (qwen2), fetched only with `fetch-testdata.sh --large`.
pub const QWEN25_CODER_05B: &str = "qwen2.5-coder/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// Qwen2.5-Coder 1.5B Instruct, Q4_K_M (qwen2), fetched only with `fetch-testdata.sh --large`.
pub const QWEN25_CODER_15B: &str = "qwen2.5-coder/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The test-data directory: `NEXTOK_TESTDATA`, or `.testdata/` at the repository root.
pub fn dir() -> PathBuf {
    std::env::var_os("NEXTOK_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".testdata"))
}

/// Whether `CI` is set (to anything but empty, `0` or `false`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Writes `msg` to standard error directly (not through `eprintln!`, which the test harness
/// captures and shows only for failing tests).
pub fn notice(msg: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
}

/// The test-data file `rel`, or `None` after a notice when it is absent outside CI.
///
/// # Panics
///
/// When the file is absent and [`in_ci`]: CI must run every real-data test.
pub fn require(rel: &str) -> Option<PathBuf> {
    let p = dir().join(rel);
    if p.is_file() {
        return Some(p);
    }
    if in_ci() {
        panic!(
            "test data {} is missing (CI is set): run scripts/fetch-testdata.sh",
            p.display()
        );
    }
    notice(&format!(
        "SKIPPED: test data {} is absent; run scripts/fetch-testdata.sh",
        p.display()
    ));
    None
}

/// The test-data file `rel`, or `None` after a notice when it is absent (never panics: for
/// benchmarks).
pub fn optional(rel: &str) -> Option<PathBuf> {
    let p = dir().join(rel);
    if p.is_file() {
        Some(p)
    } else {
        notice(&format!(
            "notice: test data {} is absent; run scripts/fetch-testdata.sh",
            p.display()
        ));
        None
    }
}
