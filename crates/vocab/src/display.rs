//! Printing token bytes for people: hexadecimal and an escaped text form.

use std::fmt::Write;

/// Lower-case hexadecimal, two digits per byte, separated by spaces (`"e2 96 81"`).
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Lower-case hexadecimal without separators (`"e29681"`), as used in JSON output.
pub fn hex_compact(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// An escaped, printable rendering of `bytes`: valid UTF-8 characters print as themselves,
/// except `\` and `"` (backslash-escaped), `\n`, `\r`, `\t` and other control characters
/// (`\u{..}`); each byte that is not part of valid UTF-8 prints as `\xNN`. The rendering is
/// unambiguous: distinct byte strings never print alike.
pub fn escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() + 2);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => s.push_str("\\\\"),
                '"' => s.push_str("\\\""),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if c.is_control() => {
                    let _ = write!(s, "\\u{{{:x}}}", c as u32);
                }
                c => s.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        assert_eq!(hex(b" a"), "20 61");
        assert_eq!(hex_compact(&[0xe2, 0x96]), "e296");
        assert_eq!(escape(b"a\"b\\c\n"), "a\\\"b\\\\c\\n");
        assert_eq!(escape("é".as_bytes()), "é");
        assert_eq!(escape(&[0xe4, 0xb8]), "\\xe4\\xb8");
        assert_eq!(escape(&[0x00, b'x', 0xff]), "\\u{0}x\\xff");
    }
}
