//! The SHA-256 of a model file, and a cache of it keyed by the file's identity.
//!
//! A model's digest names it in traces and replays, so every load needs it; hashing a 1.1 GB
//! file takes a core for most of a second, as long as repacking its weights. Like git's index,
//! [`file_digest`] remembers the digest of a file under what the file system says about it —
//! device, inode, size, modification and change times in nanoseconds — in the cache directory
//! (`<cache>/digests/`), and hashes again whenever any of them differs. A write to the file
//! moves its change time, which no program can set back, so a remembered digest is one of the
//! bytes the file holds. A digest is remembered only for a file whose times are at least
//! [`SETTLED`] older than the start of its hashing (a write within the file system's clock
//! tick of the hashing could otherwise leave the times unchanged), and only when the file's
//! identity did not change while it was hashed. An entry that cannot be read, does not name
//! the same identity, or does not hold a digest is ignored; one that cannot be written is
//! skipped (the digest is then computed again next time).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::{ModelError, ModelErrorKind, Result};

/// How much older than the start of hashing a file's times must be for its digest to be
/// remembered (FAT's clock has a 2-second tick; most file systems' are far finer).
pub const SETTLED: Duration = Duration::from_secs(3);

/// SHA-256 of a file, hex, always computed from its bytes.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| {
        ModelError::new(format!("{}: cannot open: {e}", path.display()))
            .with_kind(ModelErrorKind::Io)
            .with_source(e)
    })?;
    let mut h = Sha256::new();
    // large reads: a system call per 8 KiB (`io::copy`'s buffer) cost more than the hashing
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match std::io::Read::read(&mut f, &mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(crate::hex(&h.finalize()))
}

/// SHA-256 of a model file, hex: remembered in the cache directory under the file's identity
/// (see the module documentation), computed when not remembered.
pub fn file_digest(path: &Path) -> Result<String> {
    match crate::fetch::cache_dir() {
        Ok(dir) => cached_digest(path, &dir.join("digests"), SETTLED),
        Err(_) => sha256_file(path),
    }
}

/// What the file system says identifies a file's bytes, as one line.
#[cfg(unix)]
fn identity(path: &Path) -> Option<(String, [SystemTime; 2])> {
    use std::os::unix::fs::MetadataExt;
    let canonical = std::fs::canonicalize(path).ok()?;
    let m = std::fs::metadata(&canonical).ok()?;
    let line = format!(
        "{} dev={} ino={} size={} mtime={}.{:09} ctime={}.{:09}",
        canonical.to_str()?,
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    );
    let at = |s: i64, ns: i64| {
        let secs = u64::try_from(s).ok()?;
        let nanos = u32::try_from(ns).ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
    };
    Some((
        line,
        [
            at(m.mtime(), m.mtime_nsec())?,
            at(m.ctime(), m.ctime_nsec())?,
        ],
    ))
}

/// No change time elsewhere: never remembered.
#[cfg(not(unix))]
fn identity(_: &Path) -> Option<(String, [SystemTime; 2])> {
    None
}

/// The cache entry of an identity line.
fn entry(dir: &Path, line: &str) -> PathBuf {
    dir.join(crate::hex(&Sha256::digest(line.as_bytes())))
}

/// [`file_digest`] with the cache in `dir` and `settled` as the age the file's times need.
pub(crate) fn cached_digest(path: &Path, dir: &Path, settled: Duration) -> Result<String> {
    let Some((line, times)) = identity(path) else {
        return sha256_file(path);
    };
    let at = entry(dir, &line);
    if let Ok(text) = std::fs::read_to_string(&at) {
        if let Some((key, digest)) = text.trim_end().split_once('\n') {
            let hex = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
            if key == line && hex {
                return Ok(digest.to_ascii_lowercase());
            }
        }
    }
    let start = SystemTime::now();
    let digest = sha256_file(path)?;
    let settled_before = |t: &SystemTime| start.duration_since(*t).is_ok_and(|age| age >= settled);
    let unchanged = identity(path).is_some_and(|(after, _)| after == line);
    if unchanged && times.iter().all(settled_before) {
        remember(dir, &at, &format!("{line}\n{digest}\n"));
    }
    Ok(digest)
}

/// Writes a cache entry whole (a temporary file renamed over it), or not at all.
fn remember(dir: &Path, at: &Path, text: &str) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = at.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, at).is_ok() {
        return;
    }
    let _ = std::fs::remove_file(&tmp);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nextok-digest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(dir: &Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |r| r.count())
    }

    #[test]
    fn a_remembered_digest_is_returned_and_a_changed_file_is_hashed_again() {
        let d = fresh("remembered");
        let (file, cache) = (d.join("m.gguf"), d.join("digests"));
        std::fs::write(&file, b"first bytes").unwrap();
        let want = sha256_file(&file).unwrap();
        assert_eq!(cached_digest(&file, &cache, Duration::ZERO).unwrap(), want);
        assert_eq!(entries(&cache), 1);
        // the entry is what a second call returns: make it say something else to see it used
        let (line, _) = identity(&file).unwrap();
        let at = entry(&cache, &line);
        let other = "ab".repeat(32);
        std::fs::write(&at, format!("{line}\n{other}\n")).unwrap();
        assert_eq!(cached_digest(&file, &cache, Duration::ZERO).unwrap(), other);
        // a write moves the change time: a new identity, hashed again
        std::fs::write(&file, b"other, longer bytes").unwrap();
        let now = sha256_file(&file).unwrap();
        assert_ne!(now, want);
        assert_eq!(cached_digest(&file, &cache, Duration::ZERO).unwrap(), now);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_broken_or_foreign_entry_is_ignored() {
        let d = fresh("broken");
        let (file, cache) = (d.join("m.gguf"), d.join("digests"));
        std::fs::write(&file, b"bytes").unwrap();
        let want = sha256_file(&file).unwrap();
        let (line, _) = identity(&file).unwrap();
        let at = entry(&cache, &line);
        std::fs::create_dir_all(&cache).unwrap();
        for text in [
            String::new(),
            "garbage".to_string(),
            format!("{line}\nnot-a-digest\n"),
            format!("{line} but another file\n{}\n", "cd".repeat(32)),
        ] {
            std::fs::write(&at, &text).unwrap();
            assert_eq!(
                cached_digest(&file, &cache, Duration::from_secs(1 << 40)).unwrap(),
                want,
                "{text:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_written_just_now_is_not_remembered() {
        let d = fresh("racy");
        let (file, cache) = (d.join("m.gguf"), d.join("digests"));
        std::fs::write(&file, b"bytes").unwrap();
        let want = sha256_file(&file).unwrap();
        assert_eq!(cached_digest(&file, &cache, SETTLED).unwrap(), want);
        assert_eq!(
            entries(&cache),
            0,
            "a file changed within {SETTLED:?} was remembered"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
