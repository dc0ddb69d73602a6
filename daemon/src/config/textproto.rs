//! A parser for protobuf's text format (what Perfetto's `--txt` configs
//! are written in), into an untyped tree: a message is a list of fields,
//! each with its name, where it was written and its value.
//!
//! Covered: `#` comments; `name: value` and `name { ... }` / `name < ... >`
//! (the colon is optional before a message); `name: [v, v]` lists; `,` or
//! `;` after a field; strings in double or single quotes with C escapes
//! (`\n \t \\ \" \' \NNN \xNN`), adjacent strings concatenated; decimal,
//! hex, octal and negative integers; identifiers (`true`, enum names).
//! Extensions (`[pkg.ext]`) and `Any` expansion are refused with a message.
//! Input is bounded (1 MiB, nesting 32) and every error names the line and
//! column.

use std::fmt;

/// Largest config accepted.
pub const MAX_INPUT: usize = 1 << 20;
/// Deepest nesting of messages accepted.
const MAX_DEPTH: usize = 32;

/// Where something was written: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column (in characters), from 1.
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A scalar as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar {
    /// An identifier: `true`, `false`, an enum value name.
    Ident(String),
    /// An integer, with its sign.
    Int {
        /// Written with a leading `-`.
        negative: bool,
        /// The magnitude.
        magnitude: u64,
    },
    /// A floating-point number, as written.
    Float(String),
    /// A string (escapes resolved), as bytes.
    Str(Vec<u8>),
}

/// A field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A scalar.
    Scalar(Scalar),
    /// A nested message.
    Message(Message),
}

/// One field as written (a list `[a, b]` gives one `Field` per element).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The field's name.
    pub name: String,
    /// Where the name was written.
    pub pos: Pos,
    /// Its value.
    pub value: Value,
}

/// A message: its fields in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// The fields.
    pub fields: Vec<Field>,
}

/// A syntax error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pos}: {message}")]
pub struct SyntaxError {
    /// Where.
    pub pos: Pos,
    /// What.
    pub message: String,
}

/// Parses a whole text-format message.
pub fn parse(text: &str) -> Result<Message, SyntaxError> {
    if text.len() > MAX_INPUT {
        return Err(SyntaxError {
            pos: Pos { line: 1, col: 1 },
            message: format!("the config is larger than {} KiB", MAX_INPUT >> 10),
        });
    }
    let mut p = Parser {
        chars: text.chars().collect(),
        at: 0,
        line: 1,
        col: 1,
    };
    let m = p.message(None, 0)?;
    Ok(m)
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    line: u32,
    col: u32,
}

impl Parser {
    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            col: self.col,
        }
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, SyntaxError> {
        Err(SyntaxError {
            pos: self.pos(),
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    /// Skips white space and comments.
    fn skip(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else if c.is_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }

    /// Fields until `close` (or the end of the input at the top level).
    fn message(&mut self, close: Option<char>, depth: usize) -> Result<Message, SyntaxError> {
        if depth > MAX_DEPTH {
            return self.err(format!("messages nested more than {MAX_DEPTH} deep"));
        }
        let mut m = Message::default();
        loop {
            self.skip();
            match (self.peek(), close) {
                (None, None) => return Ok(m),
                (None, Some(c)) => return self.err(format!("missing `{c}` at the end")),
                (Some(c), Some(want)) if c == want => {
                    self.bump();
                    return Ok(m);
                }
                _ => {}
            }
            self.field(&mut m, depth)?;
            self.skip();
            if matches!(self.peek(), Some(',' | ';')) {
                self.bump();
            }
        }
    }

    fn field(&mut self, m: &mut Message, depth: usize) -> Result<(), SyntaxError> {
        let pos = self.pos();
        if self.peek() == Some('[') {
            return self.err("extensions and Any fields (`[...]`) are not supported here");
        }
        let name = self.ident();
        if name.is_empty() {
            let c = self.peek().unwrap_or(' ');
            return self.err(format!("expected a field name, found `{c}`"));
        }
        self.skip();
        let colon = self.peek() == Some(':');
        if colon {
            self.bump();
            self.skip();
        }
        match self.peek() {
            Some('{') | Some('<') => {
                let close = if self.bump() == Some('{') { '}' } else { '>' };
                let value = Value::Message(self.message(Some(close), depth + 1)?);
                m.fields.push(Field { name, pos, value });
            }
            Some('[') if colon => {
                self.bump();
                self.skip();
                if self.peek() == Some(']') {
                    self.bump();
                    return Ok(());
                }
                loop {
                    self.skip();
                    let value = match self.peek() {
                        Some('{') | Some('<') => {
                            let close = if self.bump() == Some('{') { '}' } else { '>' };
                            Value::Message(self.message(Some(close), depth + 1)?)
                        }
                        _ => Value::Scalar(self.scalar()?),
                    };
                    m.fields.push(Field {
                        name: name.clone(),
                        pos,
                        value,
                    });
                    self.skip();
                    match self.bump() {
                        Some(',') => continue,
                        Some(']') => break,
                        _ => return self.err(format!("expected `,` or `]` in the list `{name}`")),
                    }
                }
            }
            _ if colon => {
                let value = Value::Scalar(self.scalar()?);
                m.fields.push(Field { name, pos, value });
            }
            _ => {
                return self.err(format!(
                    "expected `:` or `{{` after the field name `{name}`"
                ));
            }
        }
        Ok(())
    }

    fn ident(&mut self) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' || (c == '.' && !s.is_empty()) {
                s.push(c);
                self.bump();
            } else {
                break;
            }
        }
        s
    }

    fn scalar(&mut self) -> Result<Scalar, SyntaxError> {
        match self.peek() {
            Some('"') | Some('\'') => {
                let mut bytes = self.string()?;
                // Adjacent strings are one string.
                loop {
                    self.skip();
                    if matches!(self.peek(), Some('"' | '\'')) {
                        bytes.extend(self.string()?);
                    } else {
                        return Ok(Scalar::Str(bytes));
                    }
                }
            }
            Some(c) if c == '-' || c.is_ascii_digit() || c == '.' => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => Ok(Scalar::Ident(self.ident())),
            Some(c) => self.err(format!("expected a value, found `{c}`")),
            None => self.err("expected a value, found the end of the config"),
        }
    }

    fn number(&mut self) -> Result<Scalar, SyntaxError> {
        let pos = self.pos();
        let negative = self.peek() == Some('-');
        if negative {
            self.bump();
            self.skip();
        }
        let mut text = String::new();
        while let Some(c) = self.peek() {
            let exponent_sign =
                (c == '-' || c == '+') && text.ends_with(['e', 'E']) && !text.starts_with("0x");
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || exponent_sign {
                text.push(c);
                self.bump();
            } else {
                break;
            }
        }
        let bad = || SyntaxError {
            pos,
            message: format!(
                "`{}{text}` is not a number",
                if negative { "-" } else { "" }
            ),
        };
        let lower = text.to_ascii_lowercase();
        let magnitude = if let Some(hex) = lower.strip_prefix("0x") {
            u64::from_str_radix(hex, 16).ok()
        } else if lower.len() > 1
            && lower.starts_with('0')
            && lower.bytes().all(|b| b.is_ascii_digit())
        {
            u64::from_str_radix(&lower[1..], 8).ok()
        } else if lower.bytes().all(|b| b.is_ascii_digit()) {
            lower.parse().ok()
        } else {
            let float = lower.trim_end_matches('f');
            if float.parse::<f64>().is_ok() || lower == "inf" || lower == "nan" {
                let sign = if negative { "-" } else { "" };
                return Ok(Scalar::Float(format!("{sign}{float}")));
            }
            return Err(bad());
        };
        match magnitude {
            Some(magnitude) => Ok(Scalar::Int {
                negative,
                magnitude,
            }),
            None => Err(bad()),
        }
    }

    fn string(&mut self) -> Result<Vec<u8>, SyntaxError> {
        let quote = self.bump().unwrap_or('"');
        let mut out = Vec::new();
        loop {
            let Some(c) = self.bump() else {
                return self.err("a string is not closed");
            };
            match c {
                '\n' => return self.err("a string is not closed on its line"),
                c if c == quote => return Ok(out),
                '\\' => self.escape(&mut out)?,
                c => {
                    let mut b = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), SyntaxError> {
        let Some(c) = self.bump() else {
            return self.err("a string ends inside an escape");
        };
        let b = match c {
            'n' => b'\n',
            't' => b'\t',
            'r' => b'\r',
            'a' => 0x07,
            'b' => 0x08,
            'f' => 0x0c,
            'v' => 0x0b,
            '\\' => b'\\',
            '\'' => b'\'',
            '"' => b'"',
            '?' => b'?',
            'x' | 'X' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 {
                    match self.peek().and_then(|c| c.to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            self.bump();
                            n += 1;
                        }
                        None => break,
                    }
                }
                if n == 0 {
                    return self.err("`\\x` without hex digits");
                }
                v as u8
            }
            '0'..='7' => {
                let mut v = c.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match self.peek().and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            v = v * 8 + d;
                            self.bump();
                        }
                        None => break,
                    }
                }
                if v > 0xff {
                    return self.err("an octal escape above \\377");
                }
                v as u8
            }
            other => return self.err(format!("unknown escape `\\{other}`")),
        };
        out.push(b);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(n: u64) -> Value {
        Value::Scalar(Scalar::Int {
            negative: false,
            magnitude: n,
        })
    }

    #[test]
    fn fields_lists_and_nesting() {
        let m = parse(
            "# a comment\n\
             sampling_interval_bytes: 4096  # trailing\n\
             process_cmdline: \"a\" process_cmdline: 'b'\n\
             pid: [1, 0x10, 010];\n\
             continuous_dump_config { dump_phase_ms: 0, dump_interval_ms: 1000 }\n\
             inner: < x: true >\n\
             s: \"tab\\there\" \" more\\x41\\101\"\n\
             neg: -5 f: 1.5e-3",
        )
        .expect("parses");
        let names: Vec<&str> = m.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sampling_interval_bytes",
                "process_cmdline",
                "process_cmdline",
                "pid",
                "pid",
                "pid",
                "continuous_dump_config",
                "inner",
                "s",
                "neg",
                "f"
            ]
        );
        assert_eq!(m.fields[0].value, int(4096));
        assert_eq!(m.fields[2].value, Value::Scalar(Scalar::Str(b"b".to_vec())));
        assert_eq!(m.fields[4].value, int(16));
        assert_eq!(m.fields[5].value, int(8));
        assert_eq!(m.fields[3].pos, Pos { line: 4, col: 1 });
        let Value::Message(cd) = &m.fields[6].value else {
            panic!("a message")
        };
        assert_eq!(cd.fields[1].value, int(1000));
        assert_eq!(
            m.fields[8].value,
            Value::Scalar(Scalar::Str(b"tab\there moreAA".to_vec()))
        );
        assert_eq!(
            m.fields[9].value,
            Value::Scalar(Scalar::Int {
                negative: true,
                magnitude: 5
            })
        );
        assert_eq!(
            m.fields[10].value,
            Value::Scalar(Scalar::Float("1.5e-3".into()))
        );
    }

    #[test]
    fn errors_say_where() {
        for (text, want) in [
            ("a: ", "1:4: expected a value"),
            ("a {", "missing `}`"),
            ("a: \"open", "not closed"),
            ("a b", "1:3: expected `:` or `{`"),
            ("[ext]: 1", "extensions"),
            ("a: 12z", "`12z` is not a number"),
            ("a: [1 2]", "expected `,` or `]`"),
            ("a: \"\\q\"", "unknown escape"),
            ("\n  : 1", "2:3: expected a field name"),
            ("a: 99999999999999999999", "is not a number"),
        ] {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let deep = "a {".repeat(40) + &"}".repeat(40);
        assert!(parse(&deep).unwrap_err().to_string().contains("nested"));
        assert!(parse(&"#".repeat(MAX_INPUT + 1)).is_err());
        assert_eq!(parse("").expect("empty"), Message::default());
        assert_eq!(parse("a: []").expect("empty list").fields.len(), 0);
    }
}
