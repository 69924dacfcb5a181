//! llama.cpp GBNF → Lark (llguidance's dialect).
//!
//! GBNF rules are `name ::= alternatives`; elements are string literals `"..."`, character
//! classes `[a-z]` / `[^"\\]`, any character `.`, rule references, groups `( ... )`, and the
//! postfix operators `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`. `#` starts a comment. A
//! rule ends at a newline unless the newline follows `::=` or `|`, or is inside parentheses
//! (llama.cpp's rule). The start rule is `root`.
//!
//! The conversion keeps GBNF's character-level meaning exactly: every lexeme it emits is one
//! character (a literal becomes a sequence of one-character literals, a class a one-character
//! regex), so llguidance's lexer never has to choose between overlapping lexemes and all
//! ambiguity is resolved by its Earley parser, as in llama.cpp. Rule names are mapped to Lark
//! rule names (lower case, `-` → `_`); `root` becomes `start`.
//!
//! Not supported (an unsupported-keyword [`ConstraintError`] naming it): token references `<[id]>`,
//! `<name>` and their negations `!<...>` (newer llama.cpp).

use std::collections::{HashMap, HashSet};

use crate::error::{ConstraintError, LimitKind};

/// Deepest nesting of groups `( ... )` accepted: the Lark parser that compiles the converted
/// grammar refuses deeper nesting, and the converter's own recursion stays shallow.
pub const MAX_GROUP_NESTING: usize = 30;

/// Converts a GBNF grammar to a Lark grammar. Errors name the line and column.
pub fn to_lark(src: &str) -> Result<String, ConstraintError> {
    let mut p = P {
        s: src.as_bytes(),
        src,
        i: 0,
        depth: 0,
    };
    let mut rules: Vec<(String, usize, String)> = Vec::new();
    let mut defined: HashSet<String> = HashSet::new();
    loop {
        p.ws(true);
        if p.i >= p.s.len() {
            break;
        }
        let at = p.i;
        let name = p.name().ok_or_else(|| p.err(at, "expected a rule name"))?;
        p.ws(false);
        if !p.eat_str("::=") {
            return Err(p.err(p.i, &format!("expected `::=` after rule name `{name}`")));
        }
        p.ws(true);
        let body = p.alternates(false)?;
        if !defined.insert(name.clone()) {
            return Err(p.err(at, &format!("rule `{name}` is defined twice")));
        }
        rules.push((name, at, body));
        p.ws(false);
        if p.i < p.s.len() && !matches!(p.s[p.i], b'\n' | b'\r') {
            return Err(p.err(p.i, &format!("unexpected `{}`", p.peek_char())));
        }
    }
    if !defined.contains("root") {
        return Err(ConstraintError::syntax(
            "gbnf",
            "top level",
            "no `root` rule",
        ));
    }
    // Map names and check references.
    let mut map: HashMap<String, String> = HashMap::new();
    let mut used: HashSet<String> = HashSet::from(["start".to_string()]);
    for (n, _, _) in &rules {
        let lark = if n == "root" {
            "start".to_string()
        } else {
            let mut s: String = n
                .chars()
                .map(|c| {
                    if c == '-' {
                        '_'
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect();
            if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
                s = format!("r_{s}");
            }
            let base = s.clone();
            let mut k = 2;
            while used.contains(&s) {
                s = format!("{base}_{k}");
                k += 1;
            }
            s
        };
        used.insert(lark.clone());
        map.insert(n.clone(), lark);
    }
    let mut out = String::new();
    for (n, _, body) in &rules {
        out.push_str(&map[n]);
        out.push_str(": ");
        // Substitute references (written as \u{1}name\u{1} by the parser).
        let mut parts = body.split('\u{1}');
        out.push_str(parts.next().unwrap_or(""));
        while let Some(r) = parts.next() {
            let (refname, pos) = r.split_once('@').unwrap_or((r, "0"));
            match map.get(refname) {
                Some(l) => out.push_str(l),
                None => {
                    let pos: usize = pos.parse().unwrap_or(0);
                    return Err(p.err(pos, &format!("undefined rule `{refname}`")));
                }
            }
            out.push_str(parts.next().unwrap_or(""));
        }
        out.push('\n');
    }
    Ok(out)
}

struct P<'a> {
    s: &'a [u8],
    src: &'a str,
    i: usize,
    /// Groups open at the current position.
    depth: usize,
}

impl P<'_> {
    fn err(&self, at: usize, msg: &str) -> ConstraintError {
        let before = &self.src[..at.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConstraintError::syntax("gbnf", format!("line {line}, column {col}"), msg)
    }

    /// `line L, column C: msg` for a position (the text of a syntax error without its input).
    fn place_and_message(&self, at: usize, msg: &str) -> String {
        let e = self.err(at, msg);
        format!("{}: {}", e.place().unwrap_or_default(), e.message())
    }

    fn peek_char(&self) -> char {
        self.src[self.i..].chars().next().unwrap_or(' ')
    }

    /// Skips spaces, tabs, comments and (when `nl`) newlines.
    fn ws(&mut self, nl: bool) {
        while self.i < self.s.len() {
            match self.s[self.i] {
                b' ' | b'\t' => self.i += 1,
                b'\r' | b'\n' if nl => self.i += 1,
                b'#' => {
                    while self.i < self.s.len() && self.s[self.i] != b'\n' {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn eat_str(&mut self, t: &str) -> bool {
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn name(&mut self) -> Option<String> {
        let st = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || matches!(self.s[self.i], b'-' | b'_'))
        {
            self.i += 1;
        }
        (self.i > st).then(|| self.src[st..self.i].to_string())
    }

    /// Whether a rule definition (`name ::=`) starts at the current position.
    fn at_rule_def(&self) -> bool {
        let mut j = self.i;
        while j < self.s.len()
            && (self.s[j].is_ascii_alphanumeric() || matches!(self.s[j], b'-' | b'_'))
        {
            j += 1;
        }
        if j == self.i {
            return false;
        }
        while j < self.s.len() && matches!(self.s[j], b' ' | b'\t') {
            j += 1;
        }
        self.s[j..].starts_with(b"::=")
    }

    fn alternates(&mut self, nested: bool) -> Result<String, ConstraintError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.i < self.s.len() && self.s[self.i] == b'|' {
            self.i += 1;
            self.ws(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, ConstraintError> {
        let mut items: Vec<String> = Vec::new();
        loop {
            if self.i >= self.s.len() {
                break;
            }
            let c = self.s[self.i];
            if matches!(c, b'|' | b')' | b'\n' | b'\r') {
                break;
            }
            if !nested && self.at_rule_def() {
                break;
            }
            let at = self.i;
            let item = match c {
                b'"' => {
                    self.i += 1;
                    let mut chars = Vec::new();
                    loop {
                        if self.i >= self.s.len() {
                            return Err(self.err(at, "unterminated string literal"));
                        }
                        if self.s[self.i] == b'"' {
                            self.i += 1;
                            break;
                        }
                        chars.push(self.char_in(at)?);
                    }
                    if chars.is_empty() {
                        "\"\"".to_string()
                    } else {
                        let parts: Vec<String> = chars
                            .iter()
                            .map(|ch| serde_json::to_string(&ch.to_string()).expect("string"))
                            .collect();
                        if parts.len() == 1 {
                            parts[0].clone()
                        } else {
                            format!("({})", parts.join(" "))
                        }
                    }
                }
                b'[' => {
                    self.i += 1;
                    let neg = self.eat_str("^");
                    let mut class = String::new();
                    loop {
                        if self.i >= self.s.len() {
                            return Err(self.err(at, "unterminated character class"));
                        }
                        if self.s[self.i] == b']' {
                            self.i += 1;
                            break;
                        }
                        let a = self.char_in(at)?;
                        class.push_str(&format!("\\x{{{:X}}}", a as u32));
                        if self.i + 1 < self.s.len()
                            && self.s[self.i] == b'-'
                            && self.s[self.i + 1] != b']'
                        {
                            self.i += 1;
                            let b = self.char_in(at)?;
                            if b < a {
                                return Err(self.err(at, "character range out of order"));
                            }
                            class.push_str(&format!("-\\x{{{:X}}}", b as u32));
                        }
                    }
                    if class.is_empty() {
                        return Err(self.err(at, "empty character class"));
                    }
                    format!("/[{}{}]/", if neg { "^" } else { "" }, class)
                }
                b'.' => {
                    self.i += 1;
                    "/(?s:.)/".to_string()
                }
                b'(' => {
                    if self.depth >= MAX_GROUP_NESTING {
                        return Err(ConstraintError::limit_exceeded(
                            LimitKind::GroupNesting,
                            self.place_and_message(
                                at,
                                &format!("groups nested deeper than {MAX_GROUP_NESTING}"),
                            ),
                        ));
                    }
                    self.i += 1;
                    self.ws(true);
                    self.depth += 1;
                    let inner = self.alternates(true);
                    self.depth -= 1;
                    let inner = inner?;
                    self.ws(true);
                    if !self.eat_str(")") {
                        return Err(self.err(at, "unclosed `(`"));
                    }
                    format!("({inner})")
                }
                b'<' | b'!' => {
                    return Err(ConstraintError::unsupported(
                        "token reference",
                        self.place_and_message(
                            at,
                            "token references (`<...>`, `!<...>`) are not supported",
                        ),
                    ))
                }
                _ => match self.name() {
                    Some(n) => format!("\u{1}{n}@{at}\u{1}"),
                    None => return Err(self.err(at, &format!("unexpected `{}`", self.peek_char()))),
                },
            };
            let item = self.postfix(item)?;
            items.push(item);
            self.ws(nested);
        }
        if items.is_empty() {
            Ok("\"\"".into())
        } else {
            Ok(items.join(" "))
        }
    }

    fn postfix(&mut self, item: String) -> Result<String, ConstraintError> {
        let at = self.i;
        if self.i >= self.s.len() {
            return Ok(item);
        }
        match self.s[self.i] {
            b'*' | b'+' | b'?' => {
                let op = self.s[self.i] as char;
                self.i += 1;
                Ok(format!("{item}{op}"))
            }
            b'{' => {
                self.i += 1;
                self.ws(false);
                let m = self.num();
                self.ws(false);
                let (lo, hi) = if self.eat_str(",") {
                    self.ws(false);
                    (m.unwrap_or(0), self.num())
                } else {
                    let m = m.ok_or_else(|| self.err(at, "expected a number in `{...}`"))?;
                    (m, Some(m))
                };
                self.ws(false);
                if !self.eat_str("}") {
                    return Err(self.err(at, "unclosed `{`"));
                }
                match hi {
                    Some(h) if h < lo => Err(self.err(at, "repetition bounds out of order")),
                    Some(0) => Ok("\"\"".into()),
                    Some(h) => Ok(format!("({item}){{{lo},{h}}}")),
                    None => Ok(format!("({item}){{{lo},}}")),
                }
            }
            _ => Ok(item),
        }
    }

    fn num(&mut self) -> Option<u32> {
        let st = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        self.src[st..self.i].parse().ok()
    }

    /// One (possibly escaped) character inside a literal or class.
    fn char_in(&mut self, at: usize) -> Result<char, ConstraintError> {
        let c = self.peek_char();
        if c != '\\' {
            self.i += c.len_utf8();
            return Ok(c);
        }
        self.i += 1;
        if self.i >= self.s.len() {
            return Err(self.err(at, "dangling `\\`"));
        }
        let e = self.s[self.i];
        self.i += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char, ConstraintError> {
            let end = p.i + n;
            let h = p
                .src
                .get(p.i..end)
                .ok_or_else(|| p.err(at, "truncated escape"))?;
            let v = u32::from_str_radix(h, 16).map_err(|_| p.err(at, "bad hex escape"))?;
            p.i = end;
            char::from_u32(v).ok_or_else(|| p.err(at, "escape is not a Unicode scalar value"))
        };
        Ok(match e {
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'\\' => '\\',
            b'"' => '"',
            b'[' => '[',
            b']' => ']',
            b'-' => '-',
            b'^' => '^',
            b'/' => '/',
            b'x' => hex(self, 2)?,
            b'u' => hex(self, 4)?,
            b'U' => hex(self, 8)?,
            _ => return Err(self.err(self.i - 2, &format!("unknown escape `\\{}`", e as char))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::to_lark;

    #[test]
    fn converts_rules() {
        let g = "root ::= \"a\" ws-x+ (\"b\" | [c-d])? # comment\nws-x ::= [ \\t\\n]{1,3}\n";
        let l = to_lark(g).unwrap();
        assert!(
            l.contains("start: \"a\" ws_x+ (\"b\" | /[\\x{63}-\\x{64}]/)?"),
            "{l}"
        );
        assert!(l.contains("ws_x: (/[\\x{20}\\x{9}\\x{A}]/){1,3}"), "{l}");
    }

    #[test]
    fn continuation_lines() {
        let g = "root ::=\n  \"x\" |\n  \"y\"\n";
        assert_eq!(to_lark(g).unwrap(), "start: \"x\" | \"y\"\n");
    }

    #[test]
    fn errors_name_the_place() {
        let e = to_lark("root ::= foo\n").unwrap_err().to_string();
        assert!(
            e.contains("line 1, column 10") && e.contains("undefined rule `foo`"),
            "{e}"
        );
        let e = to_lark("root ::= \"a\"\nx ::= [a-\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = to_lark("x ::= \"a\"\n").unwrap_err().to_string();
        assert!(e.contains("no `root` rule"), "{e}");
    }
}
