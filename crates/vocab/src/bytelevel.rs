//! The GPT-2 byte ↔ unicode map used by byte-level BPE vocabularies (GPT-2, Llama-3, Qwen,
//! SmolLM, …).
//!
//! Byte-level BPE spells every byte as one printable character so that token strings are valid
//! text: the 188 bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` stand for themselves (as the code
//! points of the same value) and the other 68 bytes, in increasing order, become U+0100,
//! U+0101, … U+0143. A space (0x20) is therefore `Ġ` (U+0120) and a newline `Ċ` (U+010A).

/// Whether byte `b` is spelled as the code point of the same value.
const fn is_direct(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_char() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        if is_direct(b as u8) {
            t[b] = b as u32;
        } else {
            t[b] = 256 + n;
            n += 1;
        }
        b += 1;
    }
    t
}

/// Highest code point used by the map, plus one.
const CHAR_LIMIT: usize = 0x144;

const fn build_char_to_byte() -> [i16; CHAR_LIMIT] {
    let fwd = build_byte_to_char();
    let mut t = [-1i16; CHAR_LIMIT];
    let mut b = 0usize;
    while b < 256 {
        t[fwd[b] as usize] = b as i16;
        b += 1;
    }
    t
}

static BYTE_TO_CHAR: [u32; 256] = build_byte_to_char();
static CHAR_TO_BYTE: [i16; CHAR_LIMIT] = build_char_to_byte();

/// The character that spells byte `b`.
#[inline]
pub fn byte_to_char(b: u8) -> char {
    // Every entry is below U+0144, so always a valid scalar value.
    char::from_u32(BYTE_TO_CHAR[b as usize]).unwrap_or('\u{FFFD}')
}

/// The byte that character `c` spells, if `c` is one of the 256 characters of the map.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let i = c as usize;
    if i < CHAR_LIMIT {
        let b = CHAR_TO_BYTE[i];
        if b >= 0 {
            return Some(b as u8);
        }
    }
    None
}

/// Spells `bytes` in the byte-level alphabet (the inverse of [`decode_into`]).
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// Appends the bytes that `token` spells to `out` and returns `true` when every character of
/// `token` belongs to the map; otherwise appends `token`'s own UTF-8 bytes and returns `false`.
///
/// This is the rule of the Hugging Face `ByteLevel` decoder, applied token by token: a token
/// with any character outside the map (e.g. an added token containing a space) is taken
/// literally.
pub fn decode_into(token: &str, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    for c in token.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_is_a_bijection_with_known_points() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(0xAD), '\u{0143}');
        assert_eq!(byte_to_char(0), '\u{0100}');
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('▁'), None);
    }

    #[test]
    fn decode_literal_fallback() {
        let mut v = Vec::new();
        assert!(decode_into("Ġhello", &mut v));
        assert_eq!(v, b" hello");
        v.clear();
        assert!(!decode_into("a b", &mut v));
        assert_eq!(v, b"a b");
        v.clear();
        // "é" as two bytes C3 A9, spelled "Ã©".
        assert!(decode_into("Ã©", &mut v));
        assert_eq!(v, "é".as_bytes());
        assert_eq!(encode("é".as_bytes()), "Ã©");
    }
}
