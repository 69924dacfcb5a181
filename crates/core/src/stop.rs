//! Stop strings matched on token bytes, across token boundaries.
//!
//! [`StopStrings`] compiles the request's stop strings into an Aho–Corasick DFA over bytes
//! (the `aho-corasick` crate's low-level automaton). The per-sequence state is a single DFA
//! state id ([`StopScan`]), so it is `Copy`, clones for beams for free, and is recorded in step
//! records. Feeding a token's bytes advances the automaton byte by byte and reports the first
//! stop string that completes: a stop string may start in an earlier token, start or end in the
//! middle of a token, or span any number of tokens. When several stop strings end at the same
//! byte, the longest (the one that starts earliest) is reported.
//!
//! [`StopStrings::holdback`] tells a streaming detokeniser how many trailing bytes could still
//! become the start of a stop string and must not be shown yet.

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The compiled stop strings of a request (immutable, shareable).
#[derive(Debug, Clone)]
pub struct StopStrings {
    patterns: Vec<Vec<u8>>,
    dfa: DFA,
    /// Per pattern, its prefix function (KMP): `pi[i]` is the length of the longest proper
    /// prefix of `p[..=i]` that is also its suffix.
    prefix_fn: Vec<Vec<u32>>,
    start: StateID,
    max_len: usize,
}

/// The longest stop string, in bytes. Building the automaton costs more than linear time in
/// a pattern's length (a 100,000-byte stop string took minutes), and a longer stop string is
/// no use to a stream (the text it must hold back is as long).
pub const MAX_STOP_BYTES: usize = 1024;

/// The most bytes of all stop strings together.
pub const MAX_STOP_TOTAL_BYTES: usize = 64 * 1024;

/// Per-sequence scanning state: the DFA state after every output byte seen so far, and the
/// number of bytes seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopScan {
    /// DFA state id.
    pub state: u32,
    /// Output bytes fed so far.
    pub bytes_seen: u64,
}

/// A completed stop string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopHit {
    /// Index of the stop string in the request's list.
    pub pattern: usize,
    /// The stop string.
    pub stop: String,
    /// Byte offset in the whole output where the match ends (exclusive).
    pub end: u64,
    /// Byte offset in the whole output where the match starts.
    pub start: u64,
    /// Byte offset inside the token's bytes where the match ends (exclusive).
    pub end_in_token: usize,
}

/// The rules of a request's stop strings: none empty, each at most [`MAX_STOP_BYTES`], all
/// together at most [`MAX_STOP_TOTAL_BYTES`]. Errors name `stop[i]` or `stop`.
pub fn check(stops: &[String]) -> Result<()> {
    for (i, s) in stops.iter().enumerate() {
        if s.is_empty() {
            return Err(Error::invalid(
                format!("stop[{i}]"),
                "a stop string cannot be empty",
            ));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(Error::invalid(
                format!("stop[{i}]"),
                format!(
                    "{} bytes; a stop string has at most {MAX_STOP_BYTES}",
                    s.len()
                ),
            ));
        }
    }
    let total: usize = stops.iter().map(String::len).sum();
    if total > MAX_STOP_TOTAL_BYTES {
        return Err(Error::invalid(
            "stop",
            format!("{total} bytes in all; the stop strings have at most {MAX_STOP_TOTAL_BYTES}"),
        ));
    }
    Ok(())
}

impl StopStrings {
    /// Compiles `stops`. An empty stop string is rejected (`stop[i]`).
    pub fn new(stops: &[String]) -> Result<StopStrings> {
        check(stops)?;
        let patterns: Vec<Vec<u8>> = stops.iter().map(|s| s.as_bytes().to_vec()).collect();
        let dfa = DFA::builder()
            .match_kind(MatchKind::Standard)
            .start_kind(aho_corasick::StartKind::Unanchored)
            .build(&patterns)
            .map_err(|e| Error::invalid("stop", format!("cannot compile stop strings: {e}")))?;
        let start = dfa
            .start_state(Anchored::No)
            .map_err(|e| Error::invalid("stop", format!("cannot compile stop strings: {e}")))?;
        let max_len = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let prefix_fn = patterns.iter().map(|p| prefix_function(p)).collect();
        Ok(StopStrings {
            patterns,
            prefix_fn,
            dfa,
            start,
            max_len,
        })
    }

    /// Number of stop strings.
    pub fn len(&self) -> usize {
        self.patterns.len()
    }

    /// Whether there are no stop strings.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The stop strings' bytes.
    pub fn patterns(&self) -> &[Vec<u8>] {
        &self.patterns
    }

    /// Length of the longest stop string.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The initial scanning state.
    pub fn start(&self) -> StopScan {
        StopScan {
            state: self.start.as_u32(),
            bytes_seen: 0,
        }
    }

    /// Feeds `bytes` (one token's bytes) and returns the first stop string completed inside
    /// them. On a hit the scan stops at the match's end; `scan` is advanced either way.
    pub fn feed(&self, scan: &mut StopScan, bytes: &[u8]) -> Option<StopHit> {
        let mut sid = StateID::new(scan.state as usize).unwrap_or(self.start);
        for (i, &b) in bytes.iter().enumerate() {
            sid = self.dfa.next_state(Anchored::No, sid, b);
            if self.dfa.is_match(sid) {
                // several patterns may end here; report the longest
                let mut best: Option<(usize, usize)> = None;
                for k in 0..self.dfa.match_len(sid) {
                    let pid = self.dfa.match_pattern(sid, k).as_usize();
                    let len = self.patterns[pid].len();
                    if best.is_none_or(|(bp, bl)| len > bl || (len == bl && pid < bp)) {
                        best = Some((pid, len));
                    }
                }
                if let Some((pid, len)) = best {
                    let end = scan.bytes_seen + i as u64 + 1;
                    scan.state = sid.as_u32();
                    scan.bytes_seen = end;
                    return Some(StopHit {
                        pattern: pid,
                        stop: String::from_utf8_lossy(&self.patterns[pid]).into_owned(),
                        end,
                        start: end - len as u64,
                        end_in_token: i + 1,
                    });
                }
            }
        }
        scan.state = sid.as_u32();
        scan.bytes_seen += bytes.len() as u64;
        None
    }

    /// How many trailing bytes of `text` could still be the start of a stop string (the
    /// longest suffix that is a proper prefix of some stop string).
    ///
    /// Linear: each pattern's prefix function (computed once) runs over the last
    /// `max_len - 1` bytes, so the cost is `O(patterns × max_len)` however long the stop strings
    /// are (trying every suffix against every pattern would be quadratic in their length).
    pub fn holdback(&self, text: &[u8]) -> usize {
        self.holdback_counted(text).0
    }

    /// [`StopStrings::holdback`], and the steps it took (a byte read or a fall back along the
    /// prefix function): the tests bound its work by this count, not by the clock.
    fn holdback_counted(&self, text: &[u8]) -> (usize, usize) {
        let most = self.max_len.saturating_sub(1).min(text.len());
        let tail = &text[text.len() - most..];
        let mut best = 0;
        let mut steps = 0;
        for (p, pi) in self.patterns.iter().zip(&self.prefix_fn) {
            let mut k = 0usize;
            for &b in tail {
                steps += 1;
                while k > 0 && (k == p.len() || p[k] != b) {
                    k = pi[k - 1] as usize;
                    steps += 1;
                }
                if k < p.len() && p[k] == b {
                    k += 1;
                }
            }
            // a whole pattern is no longer a prefix that could still grow: its longest border is
            if k == p.len() && k > 0 {
                k = pi[k - 1] as usize;
            }
            best = best.max(k);
        }
        (best, steps)
    }
}

/// The prefix function of `p` (Knuth–Morris–Pratt).
fn prefix_function(p: &[u8]) -> Vec<u32> {
    let mut pi = vec![0u32; p.len()];
    let mut k = 0usize;
    for i in 1..p.len() {
        while k > 0 && p[i] != p[k] {
            k = pi[k - 1] as usize;
        }
        if p[i] == p[k] {
            k += 1;
        }
        pi[i] = k as u32;
    }
    pi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> StopStrings {
        StopStrings::new(&v.iter().map(|x| x.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn finds_a_stop_string_across_three_tokens() {
        let st = s(&["STOP"]);
        let mut scan = st.start();
        assert!(st.feed(&mut scan, b"xS").is_none());
        assert!(st.feed(&mut scan, b"T").is_none());
        let hit = st.feed(&mut scan, b"OPyy").unwrap();
        assert_eq!((hit.start, hit.end, hit.end_in_token), (1, 5, 2));
    }

    #[test]
    fn overlapping_patterns_report_the_earliest_end() {
        let st = s(&["ab", "bc"]);
        let mut scan = st.start();
        let hit = st.feed(&mut scan, b"abc").unwrap();
        assert_eq!(hit.stop, "ab");
        assert_eq!(hit.end, 2);
    }

    #[test]
    fn longest_wins_at_the_same_end() {
        let st = s(&["b", "ab"]);
        let mut scan = st.start();
        let hit = st.feed(&mut scan, b"ab").unwrap();
        assert_eq!(hit.stop, "ab");
    }

    #[test]
    fn empty_stop_string_is_rejected() {
        let e = StopStrings::new(&["x".into(), String::new()]).unwrap_err();
        assert_eq!(e.field(), Some("stop[1]"));
    }

    /// The definition, by brute force.
    fn holdback_naive(st: &StopStrings, text: &[u8]) -> usize {
        let most = st.max_len.saturating_sub(1).min(text.len());
        (1..=most)
            .rev()
            .find(|&k| {
                let suffix = &text[text.len() - k..];
                st.patterns
                    .iter()
                    .any(|p| p.len() > k && p.starts_with(suffix))
            })
            .unwrap_or(0)
    }

    #[test]
    fn holdback_equals_its_definition() {
        let mut x = 12345u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut word = move |n: u64| -> String {
            let len = 1 + next() % n;
            (0..len)
                .map(|_| ["a", "b", "c"][(next() % 3) as usize])
                .collect()
        };
        for i in 0..2000u64 {
            let stops: Vec<String> = (0..1 + i % 3).map(|_| word(6)).collect();
            let text = word(10);
            let st = StopStrings::new(&stops).unwrap();
            assert_eq!(
                st.holdback(text.as_bytes()),
                holdback_naive(&st, text.as_bytes()),
                "{stops:?} {text:?}"
            );
        }
    }

    #[test]
    fn stop_strings_are_bounded_and_the_longest_is_cheap() {
        let e = StopStrings::new(&["a".repeat(MAX_STOP_BYTES + 1)])
            .err()
            .unwrap();
        assert_eq!(e.field(), Some("stop[0]"));
        let many = vec!["ab".repeat(MAX_STOP_BYTES / 2); MAX_STOP_TOTAL_BYTES / MAX_STOP_BYTES + 1];
        assert_eq!(StopStrings::new(&many).err().unwrap().field(), Some("stop"));
        // the longest stop string, periodic (its prefix function falls back the most): each
        // hold-back reads at most `max_len - 1` bytes and falls back at most as often, so its
        // steps stay within twice the longest stop string, however long the text (trying
        // every suffix would take about `max_len² / 2`, half a million here)
        let st = s(&[&"ab".repeat(MAX_STOP_BYTES / 2)]);
        let mut text = Vec::new();
        let mut most = 0;
        for _ in 0..MAX_STOP_BYTES {
            text.extend_from_slice(b"ab");
            let want = text
                .len()
                .min(MAX_STOP_BYTES - 2 + (text.len() % 2 == 1) as usize);
            let (got, steps) = st.holdback_counted(&text);
            assert_eq!(got, want);
            most = most.max(steps);
            // a last byte off the period: the match falls back all the way
            text.push(b'b');
            let (got, steps) = st.holdback_counted(&text);
            assert_eq!(got, 0);
            most = most.max(steps);
            text.pop();
        }
        assert!(most <= 2 * (MAX_STOP_BYTES - 1), "{most} steps");
        // and with many stop strings: per stop string
        let many: Vec<String> = (0..64).map(|i| format!("{}{i}", "ab".repeat(7))).collect();
        let st = StopStrings::new(&many).unwrap();
        let text = "ab".repeat(10_000);
        let (_, steps) = st.holdback_counted(text.as_bytes());
        assert!(steps <= 2 * 64 * (st.max_len() - 1), "{steps} steps");
    }

    #[test]
    fn holdback_is_the_longest_prefix_suffix() {
        let st = s(&["</s>", "##"]);
        assert_eq!(st.holdback(b"hello </"), 2);
        assert_eq!(st.holdback(b"hello #"), 1);
        assert_eq!(st.holdback(b"hello"), 0);
    }
}
