//! The memory guard: what a model's weights will take, and what this machine has left.
//!
//! A model whose weights do not fit, or a KV cache budget that cannot fit beside them, is refused
//! when it is loaded, in one line naming the sizes, instead of being killed by the system part
//! way through a request once the memory runs out.
//!
//! What is left is the smallest of the system's `MemAvailable` (`/proc/meminfo`), the room
//! under the process's cgroup memory limit (v2 `memory.max − memory.current`, or v1's
//! `limit_in_bytes − usage_in_bytes`), and the `NEXTOK_MEMORY_LIMIT` environment variable (bytes,
//! or with a `K`, `M`, `G` suffix in binary units), which caps what nextok may assume. Where
//! none of them can be read (another system), nothing is checked.

use std::path::Path;

/// Bytes this process may still take, and where the figure comes from; `None` where nothing
/// can be read.
pub fn available() -> Option<(u64, &'static str)> {
    let mut best: Option<(u64, &'static str)> = None;
    let mut consider = |v: Option<u64>, what: &'static str| {
        if let Some(v) = v {
            if best.is_none_or(|(b, _)| v < b) {
                best = Some((v, what));
            }
        }
    };
    consider(mem_available(), "MemAvailable");
    consider(cgroup_room(), "the cgroup's memory limit");
    consider(env_limit(), "NEXTOK_MEMORY_LIMIT");
    best
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Room under this process's cgroup memory limit (v2, then v1); `None` without a limit.
fn cgroup_room() -> Option<u64> {
    let read = |p: &str| -> Option<u64> {
        std::fs::read_to_string(Path::new(p))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let pairs = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ];
    for (limit, usage) in pairs {
        // "max" (v2) does not parse: no limit
        if let (Some(l), Some(u)) = (read(limit), read(usage)) {
            // v1 reports "no limit" as a number near 2^63
            if l < (1 << 60) {
                return Some(l.saturating_sub(u));
            }
        }
    }
    None
}

/// `NEXTOK_MEMORY_LIMIT`, in bytes (`None` when unset or not a size).
fn env_limit() -> Option<u64> {
    parse_size(std::env::var("NEXTOK_MEMORY_LIMIT").ok()?.trim())
}

/// `123`, `64K`, `512M`, `2G` (binary units; a trailing `iB` or `B` is accepted).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim_end_matches("iB").trim_end_matches('B');
    let (digits, unit) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_uppercase()),
        _ => (s, ' '),
    };
    let n: u64 = digits.trim().parse().ok()?;
    let shift = match unit {
        ' ' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        'T' => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// `bytes` in GiB (or MiB below one GiB), for messages.
pub fn show(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// `Err(line)` when `need` bytes (`what`) do not fit in what is available.
pub fn check(need: u64, what: &str) -> Result<(), String> {
    match available() {
        Some((room, source)) if need > room => Err(format!(
            "{what} need{} {} of memory, and {} is available ({source})",
            if what.ends_with('s') { "" } else { "s" },
            show(need),
            show(room),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("3Q"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }

    #[test]
    fn this_machine_reports_memory() {
        // Linux has /proc/meminfo; elsewhere the guard checks nothing, and says so here
        match available() {
            Some((b, what)) => assert!(b > 0, "{what}: {b}"),
            None => eprintln!("memory guard: nothing readable on this system: skipped"),
        }
        assert!(check(0, "nothing").is_ok());
        if available().is_some() {
            let e = check(u64::MAX, "the weights").unwrap_err();
            assert!(e.starts_with("the weights need "), "{e}");
        }
    }
}
