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
    start: StateID,
    max_len: usize,
}

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

impl StopStrings {
    /// Compiles `stops`. An empty stop string is rejected (`stop[i]`).
    pub fn new(stops: &[String]) -> Result<StopStrings> {
        for (i, s) in stops.iter().enumerate() {
            if s.is_empty() {
                return Err(Error::invalid(
                    format!("stop[{i}]"),
                    "a stop string cannot be empty",
                ));
            }
        }
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
        Ok(StopStrings {
            patterns,
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
    pub fn holdback(&self, text: &[u8]) -> usize {
        let most = self.max_len.saturating_sub(1).min(text.len());
        for k in (1..=most).rev() {
            let suffix = &text[text.len() - k..];
            if self
                .patterns
                .iter()
                .any(|p| p.len() > k && p.starts_with(suffix))
            {
                return k;
            }
        }
        0
    }
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

    #[test]
    fn holdback_is_the_longest_prefix_suffix() {
        let st = s(&["</s>", "##"]);
        assert_eq!(st.holdback(b"hello </"), 2);
        assert_eq!(st.holdback(b"hello #"), 1);
        assert_eq!(st.holdback(b"hello"), 0);
    }
}
