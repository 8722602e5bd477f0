//! A small JSON reader and writer, just enough for CNI configs, results and the agent protocol.
//!
//! Why not serde: `tidepool-cni` is started once per pod operation and has to be small and quick
//! to start (research: std `UnixStream` + a tiny HTTP/1.1 client measured 1.1 ms start plus round
//! trip). A per-pod process gets no dependency; everything it runs is std plus this file.
//!
//! What it keeps: object members in document order (the network config is forwarded to the agent
//! as it came), and numbers as their literal text (no precision is lost passing them through).
//! What it refuses: anything RFC 8259 refuses (control characters in strings, lone surrogates,
//! leading zeros, trailing commas, a byte-order mark), and nesting deeper than [`MAX_DEPTH`].
//! A parse error names the byte offset where it was found.

use std::fmt::{self, Write as _};

/// Deeper nesting than this is refused: no CNI config comes near it, and a recursive reader
/// must not be driven into a stack overflow by hostile input.
pub const MAX_DEPTH: usize = 128;

/// A JSON value. Objects keep their members in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// The number's literal text, already checked against the JSON number grammar.
    Number(String),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    /// A string value.
    pub fn str(s: impl Into<String>) -> Value {
        Value::String(s.into())
    }

    /// A string value, or `null` for `None`.
    pub fn opt_str(s: Option<&str>) -> Value {
        s.map_or(Value::Null, Value::str)
    }

    /// An unsigned integer value.
    pub fn uint(n: u64) -> Value {
        Value::Number(n.to_string())
    }

    /// An object from `(key, value)` pairs, in that order.
    pub fn object<K: Into<String>>(members: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Object(members.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The member `key` of an object (the last one if a key repeats, as Go's decoder does);
    /// `None` for a missing key or a value that is not an object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn is_object(&self) -> bool {
        matches!(self, Value::Object(_))
    }

    /// The value as a non-negative integer, if it is a number literal without fraction or
    /// exponent that fits in a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) if n.bytes().all(|b| b.is_ascii_digit()) => n.parse().ok(),
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages ("expected a string, got number").
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// Compact JSON text (no whitespace), `to_string()` gives the document.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
            Value::Number(n) => f.write_str(n),
            Value::String(s) => write_string(f, s),
            Value::Array(items) => {
                f.write_char('[')?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_char(',')?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_char(']')
            }
            Value::Object(members) => {
                f.write_char('{')?;
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        f.write_char(',')?;
                    }
                    write_string(f, k)?;
                    f.write_char(':')?;
                    write!(f, "{v}")?;
                }
                f.write_char('}')
            }
        }
    }
}

/// Writes `s` as a JSON string: quotes, backslashes and control characters escaped, everything
/// else (non-ASCII included) as is.
fn write_string(f: &mut impl fmt::Write, s: &str) -> fmt::Result {
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            '\u{08}' => f.write_str("\\b")?,
            '\u{0c}' => f.write_str("\\f")?,
            c if u32::from(c) < 0x20 => write!(f, "\\u{:04x}", u32::from(c))?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

/// Why a text is not JSON, and where (a byte offset into the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub offset: usize,
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.msg, self.offset)
    }
}

impl std::error::Error for ParseError {}

/// Parses one JSON document; whitespace may surround it, nothing else may follow it.
pub fn parse(text: &str) -> Result<Value, ParseError> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        pos: 0,
        depth: 0,
    };
    p.skip_ws();
    let value = p.value()?;
    p.skip_ws();
    if p.pos < p.s.len() {
        return Err(p.err("unexpected characters after the JSON value"));
    }
    Ok(value)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, msg: impl Into<String>) -> ParseError {
        ParseError {
            offset: self.pos,
            msg: msg.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn consume(&mut self, b: u8) -> Result<(), ParseError> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(&format!("'{}'", char::from(b))))
        }
    }

    fn unexpected(&self, wanted: &str) -> ParseError {
        match self
            .text
            .get(self.pos..)
            .and_then(|rest| rest.chars().next())
        {
            Some(c) => self.err(format!("expected {wanted}, found {c:?}")),
            None => self.err(format!("expected {wanted}, found the end of the input")),
        }
    }

    fn value(&mut self) -> Result<Value, ParseError> {
        match self.peek() {
            Some(b'{') => self.nested(Self::object),
            Some(b'[') => self.nested(Self::array),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.unexpected("a JSON value")),
        }
    }

    fn nested(
        &mut self,
        f: fn(&mut Self) -> Result<Value, ParseError>,
    ) -> Result<Value, ParseError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err(format!("nesting deeper than {MAX_DEPTH}")));
        }
        self.depth += 1;
        let value = f(self);
        self.depth -= 1;
        value
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, ParseError> {
        if self.s[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.unexpected("a JSON value"))
        }
    }

    fn object(&mut self) -> Result<Value, ParseError> {
        self.consume(b'{')?;
        let mut members = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a string (an object key)"));
            }
            let key = self.string()?;
            self.skip_ws();
            self.consume(b':')?;
            self.skip_ws();
            let value = self.value()?;
            members.push((key, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.unexpected("',' or '}'")),
            }
        }
    }

    fn array(&mut self) -> Result<Value, ParseError> {
        self.consume(b'[')?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value()?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected("',' or ']'")),
            }
        }
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(self.err("leading zero in a number"));
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.unexpected("a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.unexpected("a digit after '.'"));
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.unexpected("a digit in the exponent"));
            }
            self.digits();
        }
        Ok(Value::Number(self.text[start..self.pos].to_owned()))
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.consume(b'"')?;
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote, backslash or control character in one go; the
            // input is a &str, so any run that stops at an ASCII byte is valid UTF-8.
            let run = self.s[self.pos..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .unwrap_or(self.s.len() - self.pos);
            out.push_str(&self.text[self.pos..self.pos + run]);
            self.pos += run;
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut out)?;
                }
                Some(_) => return Err(self.err("control character in a string (must be escaped)")),
                None => return Err(self.err("unterminated string")),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), ParseError> {
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{08}',
            Some(b'f') => '\u{0c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                return self.unicode_escape(out);
            }
            _ => return Err(self.unexpected("an escape character (one of \"\\/bfnrtu)")),
        };
        self.pos += 1;
        out.push(c);
        Ok(())
    }

    /// `\uXXXX`, with UTF-16 surrogate pairs joined; a lone surrogate is an error.
    fn unicode_escape(&mut self, out: &mut String) -> Result<(), ParseError> {
        let start = self.pos - 2;
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.s[self.pos..].starts_with(b"\\u") {
                    return Err(ParseError {
                        offset: start,
                        msg: "lone surrogate in \\u escape".into(),
                    });
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(ParseError {
                        offset: start,
                        msg: "lone surrogate in \\u escape".into(),
                    });
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => {
                return Err(ParseError {
                    offset: start,
                    msg: "lone surrogate in \\u escape".into(),
                });
            }
            c => c,
        };
        let c = char::from_u32(code).ok_or_else(|| ParseError {
            offset: start,
            msg: "invalid \\u escape".into(),
        })?;
        out.push(c);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self.peek().and_then(|b| char::from(b).to_digit(16));
            match digit {
                Some(d) => {
                    code = code * 16 + d;
                    self.pos += 1;
                }
                None => return Err(self.unexpected("a hex digit in a \\u escape")),
            }
        }
        Ok(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str) -> String {
        parse(text).expect("valid JSON").to_string()
    }

    #[test]
    fn round_trips_every_kind_compactly_and_in_order() {
        let text = r#" { "z": 1, "a": [true, false, null, -0.5e+10, 12], "m": {"k": "v"}, "e": [], "o": {} } "#;
        assert_eq!(
            round_trip(text),
            r#"{"z":1,"a":[true,false,null,-0.5e+10,12],"m":{"k":"v"},"e":[],"o":{}}"#
        );
    }

    #[test]
    fn numbers_keep_their_literal_text() {
        assert_eq!(
            round_trip("123456789012345678901234567890"),
            "123456789012345678901234567890"
        );
        assert_eq!(round_trip("1E-7"), "1E-7");
        assert_eq!(parse("2500").expect("number").as_u64(), Some(2500));
        assert_eq!(parse("2.5").expect("number").as_u64(), None);
        assert_eq!(parse("-1").expect("number").as_u64(), None);
        assert_eq!(parse("1e3").expect("number").as_u64(), None);
    }

    #[test]
    fn string_escapes_decode_and_re_encode() {
        let v = parse(r#""q\" b\\ s\/ \b\f\n\r\t \u0041 \u00e9 \ud83d\ude00 é""#).expect("string");
        assert_eq!(v.as_str(), Some("q\" b\\ s/ \u{8}\u{c}\n\r\t A é 😀 é"));
        assert_eq!(v.to_string(), r#""q\" b\\ s/ \b\f\n\r\t A é 😀 é""#);
        assert_eq!(Value::str("\u{1}\u{1f}").to_string(), r#""\u0001\u001f""#);
        // What the writer writes, the reader reads back.
        let nasty = Value::str("\"\\\u{0}\u{7f}ünï\u{2028}");
        assert_eq!(parse(&nasty.to_string()), Ok(nasty));
    }

    #[test]
    fn get_takes_the_last_of_repeated_keys() {
        let v = parse(r#"{"a":1,"a":2}"#).expect("object");
        assert_eq!(v.get("a"), Some(&Value::Number("2".into())));
        assert_eq!(v.get("b"), None);
        assert_eq!(Value::Null.get("a"), None);
    }

    #[test]
    fn errors_name_the_offset_and_the_problem() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 0, "expected a JSON value, found the end of the input"),
            ("{", 1, "expected a string (an object key)"),
            (r#"{"a" 1}"#, 5, "expected ':', found '1'"),
            (
                r#"{"a":1,}"#,
                7,
                "expected a string (an object key), found '}'",
            ),
            ("[1,]", 3, "expected a JSON value, found ']'"),
            ("[1 2]", 3, "expected ',' or ']', found '2'"),
            ("01", 1, "leading zero"),
            ("1.", 2, "expected a digit after '.'"),
            ("1e", 2, "expected a digit in the exponent"),
            ("-", 1, "expected a digit"),
            ("tru", 0, "expected a JSON value"),
            (r#""abc"#, 4, "unterminated string"),
            ("\"a\nb\"", 2, "control character in a string"),
            (r#""\x""#, 2, "expected an escape character"),
            (r#""\u12g4""#, 5, "expected a hex digit"),
            (r#""\ud83d""#, 1, "lone surrogate"),
            (r#""\ude00""#, 1, "lone surrogate"),
            (r#""\ud83d\u0041""#, 1, "lone surrogate"),
            ("{} x", 3, "unexpected characters after the JSON value"),
            ("\u{feff}{}", 0, "expected a JSON value, found '\\u{feff}'"),
        ];
        for (text, offset, msg) in cases {
            let err = parse(text).expect_err(text);
            assert_eq!(err.offset, *offset, "{text:?}: {err}");
            assert!(err.msg.contains(msg), "{text:?}: {err}");
            assert!(
                err.to_string().ends_with(&format!("at byte {offset}")),
                "{err}"
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok).is_ok());
        let deep = "[".repeat(100_000);
        let err = parse(&deep).expect_err("too deep");
        assert_eq!(err.offset, MAX_DEPTH);
        assert!(err.msg.contains("nesting deeper than 128"), "{err}");
    }

    #[test]
    fn builders_write_what_they_say() {
        let v = Value::object([
            ("s", Value::str("x")),
            ("n", Value::uint(7)),
            ("none", Value::opt_str(None)),
            ("some", Value::opt_str(Some("y"))),
            ("arr", Value::Array(vec![Value::Bool(true)])),
        ]);
        assert_eq!(
            v.to_string(),
            r#"{"s":"x","n":7,"none":null,"some":"y","arr":[true]}"#
        );
        assert!(v.is_object());
        assert_eq!(
            v.get("arr").and_then(Value::as_array).map(<[Value]>::len),
            Some(1)
        );
        assert_eq!(v.get("n").map(Value::kind), Some("number"));
    }
}
