//! Streaming text: an incremental detokeniser over token bytes.
//!
//! [`TextStream`] receives each selected token's visible bytes and returns the text that can be
//! shown now. It emits only settled UTF-8 — a multi-byte character split across tokens is held
//! until complete — and it holds back any trailing bytes that could still become the start of a
//! stop string, so a stop string is never streamed. Byte sequences that can never become valid
//! UTF-8 are shown as U+FFFD, one per maximal invalid subpart (exactly as
//! `String::from_utf8_lossy`).
//!
//! At the end: after a stop-string hit, the text ends where the stop string ends
//! (`include_stop_str_in_output`) or where it starts (default), and everything after is dropped;
//! otherwise (EOS, stop token, length) everything held back is released, an unfinished UTF-8
//! tail becoming U+FFFD. The concatenation of all chunks always equals [`TextStream::text`].

use std::sync::Arc;

use crate::stop::{StopHit, StopStrings};

/// Incremental detokeniser with stop-string hold-back.
#[derive(Debug, Clone)]
pub struct TextStream {
    stops: Option<Arc<StopStrings>>,
    include_stop: bool,
    buf: Vec<u8>,
    emitted: usize,
    end: Option<usize>,
    shown: String,
}

impl TextStream {
    /// A stream for a request with these stop strings.
    pub fn new(stops: Option<Arc<StopStrings>>, include_stop_str_in_output: bool) -> Self {
        TextStream {
            stops,
            include_stop: include_stop_str_in_output,
            buf: Vec::new(),
            emitted: 0,
            end: None,
            shown: String::new(),
        }
    }

    /// Feeds one token's visible bytes (empty for hidden special tokens) and the stop hit the
    /// stop matcher reported for it, if any. Returns the text that may be shown now.
    pub fn push(&mut self, bytes: &[u8], hit: Option<&StopHit>) -> String {
        if self.end.is_some() {
            return String::new();
        }
        self.buf.extend_from_slice(bytes);
        if let Some(h) = hit {
            let end = if self.include_stop { h.end } else { h.start } as usize;
            let end = end.min(self.buf.len()).max(self.emitted);
            self.end = Some(end);
            return self.emit_final(end);
        }
        let hold = self.stops.as_ref().map_or(0, |s| s.holdback(&self.buf));
        let safe = self.buf.len() - hold;
        self.emit_settled(safe)
    }

    /// Ends the stream without a stop-string hit (EOS, stop token, length): releases what was
    /// held back.
    pub fn finish(&mut self) -> String {
        match self.end {
            Some(_) => String::new(),
            None => {
                let end = self.buf.len();
                self.end = Some(end);
                self.emit_final(end)
            }
        }
    }

    /// The text shown so far (after the stream ended: the final text).
    pub fn text(&self) -> &str {
        &self.shown
    }

    /// Bytes received but not yet shown.
    pub fn held_back(&self) -> usize {
        self.end.unwrap_or(self.buf.len()) - self.emitted
    }

    fn emit_final(&mut self, end: usize) -> String {
        let s = String::from_utf8_lossy(&self.buf[self.emitted..end]).into_owned();
        self.emitted = end;
        self.shown.push_str(&s);
        s
    }

    /// Emits the longest settled prefix of `buf[emitted..safe]`.
    fn emit_settled(&mut self, safe: usize) -> String {
        let mut out = String::new();
        let mut pos = self.emitted;
        while pos < safe {
            match std::str::from_utf8(&self.buf[pos..safe]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = safe;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // valid UTF-8 by construction
                    out.push_str(&String::from_utf8_lossy(&self.buf[pos..pos + valid]));
                    pos += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            pos += n;
                        }
                        None => break, // an unfinished character: wait for more bytes
                    }
                }
            }
        }
        self.emitted = pos;
        self.shown.push_str(&out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_character_split_across_tokens_is_held() {
        let mut t = TextStream::new(None, false);
        let e = "é".as_bytes();
        assert_eq!(t.push(b"caf", None), "caf");
        assert_eq!(t.push(&e[..1], None), "");
        assert_eq!(t.push(&e[1..], None), "é");
        assert_eq!(t.finish(), "");
        assert_eq!(t.text(), "café");
    }

    #[test]
    fn stop_prefix_is_held_then_released() {
        let stops = Arc::new(StopStrings::new(&["</s>".to_string()]).unwrap());
        let mut t = TextStream::new(Some(stops), false);
        assert_eq!(t.push(b"a </", None), "a ");
        assert_eq!(t.push(b"x", None), "</x");
        assert_eq!(t.finish(), "");
    }

    #[test]
    fn unfinished_tail_becomes_replacement_at_finish() {
        let mut t = TextStream::new(None, false);
        assert_eq!(t.push(&[b'a', 0xE2, 0x82], None), "a");
        assert_eq!(t.finish(), "\u{FFFD}");
        assert_eq!(t.text(), String::from_utf8_lossy(&[b'a', 0xE2, 0x82]));
    }
}
