//! A reader of the entmax-ref conformance corpus (format 2), standard library only.
//!
//! ```no_run
//! use entmax_corpus::{read_cases, Case};
//! for case in read_cases("corpus/entmax.jsonl").unwrap() {
//!     let x = case.numbers("x");              // x_hex: the exact values of the case's dtype
//!     let p = vec![0.0; x.len()];             // your implementation's result
//!     let n = p.len();
//!     let ok = (0..n).all(|i| case.within("p", i, n, p[i], case.numbers("p")[i]));
//! }
//! ```
//!
//! Numbers are read from the `NAME_hex` fields (C99 hex floats, `"inf"`, `"-inf"`, `"nan"`), which
//! give each value exactly; integer fields (`support`, `tol_support`) are plain JSON numbers.  The
//! tolerance classes (a line's `"tol"` object, the manifest's `"tolerance_classes"`) are `exact`
//! and `abs:@FIELD`; [`Case::within`] implements them.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The format major this reader knows.
pub const FORMAT_MAJOR: f64 = 2.0;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

impl Value {
    /// The value of `key` in an object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Obj(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Every number of a (nested) array of hex-float strings or JSON numbers, row-major.
    pub fn numbers(&self) -> Vec<f64> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect(&self, out: &mut Vec<f64>) {
        match self {
            Value::Num(v) => out.push(*v),
            Value::Str(s) => out.push(hex_to_f64(s).unwrap_or(f64::NAN)),
            Value::Arr(items) => items.iter().for_each(|v| v.collect(out)),
            _ => {}
        }
    }
}

/// Parse one JSON text.
pub fn parse(text: &str) -> Result<Value, String> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("text after the value at byte {}", p.i));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn fail<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{} at byte {}", what, self.i))
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > 64 {
            return self.fail("nested too deeply");
        }
        self.ws();
        let rest = &self.s[self.i..];
        match rest.first() {
            Some(b'"') => self.string().map(Value::Str),
            Some(&open) if open == b'[' || open == b'{' => {
                let (object, close) = (open == b'{', if open == b'{' { b'}' } else { b']' });
                self.i += 1;
                let mut items = Vec::new();
                if !self.close(close) {
                    loop {
                        let key = if object { self.key()? } else { String::new() };
                        items.push((key, self.value(depth + 1)?));
                        if self.close(close) {
                            break;
                        }
                        self.comma()?;
                    }
                }
                Ok(if object { Value::Obj(items) } else { Value::Arr(items.into_iter().map(|(_, v)| v).collect()) })
            }
            _ if rest.starts_with(b"true") => {
                self.i += 4;
                Ok(Value::Bool(true))
            }
            _ if rest.starts_with(b"false") => {
                self.i += 5;
                Ok(Value::Bool(false))
            }
            _ if rest.starts_with(b"null") => {
                self.i += 4;
                Ok(Value::Null)
            }
            _ => {
                let n = rest.iter().take_while(|c| matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')).count();
                let text = std::str::from_utf8(&rest[..n]).unwrap_or("");
                match text.parse::<f64>() {
                    Ok(v) if n > 0 => {
                        self.i += n;
                        Ok(Value::Num(v))
                    }
                    _ => self.fail("unexpected character"),
                }
            }
        }
    }

    /// An object's key and its colon.
    fn key(&mut self) -> Result<String, String> {
        self.ws();
        let key = self.string()?;
        self.ws();
        if self.s.get(self.i) != Some(&b':') {
            return self.fail("expected ':'");
        }
        self.i += 1;
        Ok(key)
    }

    fn close(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            return true;
        }
        false
    }

    fn comma(&mut self) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&b',') {
            self.i += 1;
            return Ok(());
        }
        self.fail("expected ',' or a closing bracket")
    }

    fn string(&mut self) -> Result<String, String> {
        if self.s.get(self.i) != Some(&b'"') {
            return self.fail("expected a string");
        }
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i] != b'"' && self.s[self.i] != b'\\' {
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?);
            match self.s.get(self.i) {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let c = *self.s.get(self.i + 1).ok_or("unterminated string")?;
                    self.i += 2;
                    match c {
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code) && self.s[self.i..].starts_with(b"\\u") {
                                self.i += 2;
                                code = 0x10000 + ((code - 0xD800) << 10) + (self.hex4()? - 0xDC00);
                            }
                            out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                        }
                        other => out.push(other as char),
                    }
                }
                _ => return self.fail("unterminated string"),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.s.get(self.i..self.i + 4).ok_or("bad \\u escape")?;
        let code = u32::from_str_radix(std::str::from_utf8(digits).unwrap_or("x"), 16).map_err(|_| "bad \\u escape")?;
        self.i += 4;
        Ok(code)
    }
}

/// 2^k, exactly (k in the normal range).
fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// A C99 hex float (`"-0x1.8p-1"`, `"0x0.0000000000001p-1022"`), `"inf"`, `"-inf"` or `"nan"` to
/// the number it denotes, exactly.
pub fn hex_to_f64(s: &str) -> Option<f64> {
    match s {
        "inf" => return Some(f64::INFINITY),
        "-inf" => return Some(f64::NEG_INFINITY),
        "nan" => return Some(f64::NAN),
        _ => {}
    }
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let body = body.strip_prefix("0x")?;
    let (mant, exp) = body.split_once('p')?;
    let (lead, frac) = mant.split_once('.').unwrap_or((mant, ""));
    if lead.len() != 1 || frac.len() > 13 {
        return None;
    }
    let m = u64::from_str_radix(&format!("{}{}", lead, frac), 16).ok()?; // at most 53 bits: exact
    let e: i32 = exp.parse().ok()?;
    let e = e - 4 * frac.len() as i32;
    let v = if e < -1000 { m as f64 * pow2(e + 200) * pow2(-200) } else { m as f64 * pow2(e) }; // one rounding at most
    Some(if neg { -v } else { v })
}

/// A number as printf's `%a` writes it (the corpus's hex form).
pub fn f64_to_hex(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let bits = v.to_bits();
    let sign = if bits >> 63 == 1 { "-" } else { "" };
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let digits = format!("{:013x}", bits & 0xf_ffff_ffff_ffff);
    let digits = digits.trim_end_matches('0');
    let frac = if digits.is_empty() { String::new() } else { format!(".{}", digits) };
    if exp == 0 {
        return if v == 0.0 { format!("{}0x0p+0", sign) } else { format!("{}0x0{}p-1022", sign, frac) };
    }
    format!("{}0x1{}p{:+}", sign, frac, exp - 1023)
}

/// One line of a corpus file.
pub struct Case(pub Value);

impl Case {
    /// A field of the line.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// A string field ("" when absent).
    pub fn str(&self, key: &str) -> &str {
        self.0.get(key).and_then(Value::as_str).unwrap_or("")
    }

    /// The exact numbers of field `name`: `name_hex`, or `name` itself for an integer field.
    pub fn numbers(&self, name: &str) -> Vec<f64> {
        self.0.get(&format!("{}_hex", name)).or_else(|| self.0.get(name)).map(Value::numbers).unwrap_or_default()
    }

    /// The tolerance class of output field `name` ("" when the case has none).
    pub fn class(&self, name: &str) -> &str {
        self.0.get("tol").and_then(|t| t.get(name)).and_then(Value::as_str).unwrap_or("")
    }

    /// The bound on |got - expected| of entry i (of n) of output field `name`, by its class;
    /// None for a class this reader does not know.  A bound field of fewer numbers than n
    /// broadcasts row-major: entry i uses number i * count / n.
    pub fn bound(&self, name: &str, i: usize, n: usize) -> Option<f64> {
        let cls = self.class(name);
        if cls == "exact" {
            return Some(0.0);
        }
        let field = cls.strip_prefix("abs:@")?;
        let t = self.numbers(field);
        match t.len() {
            0 => None,
            len if len == n => Some(t[i]),
            len => Some(t[i * len / n]),
        }
    }

    /// Whether `got` matches entry i (of n, value `expected`) of output field `name`.  A
    /// non-finite expected value must be matched exactly (NaN by NaN); 0 and -0 are equal.
    pub fn within(&self, name: &str, i: usize, n: usize, got: f64, expected: f64) -> bool {
        if expected.is_nan() {
            return got.is_nan();
        }
        if expected.is_infinite() {
            return got == expected;
        }
        match self.bound(name, i, n) {
            Some(b) => (got - expected).abs() <= b, // false for a NaN result
            None => false,
        }
    }
}

/// Every case of a corpus file (JSON Lines), checked to be of [`FORMAT_MAJOR`].
pub fn read_cases(path: impl AsRef<Path>) -> Result<Vec<Case>, String> {
    let path = path.as_ref();
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {}", path.display(), e))?;
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        let v = parse(line).map_err(|e| format!("{}:{}: {}", path.display(), n + 1, e))?;
        let format = v.get("schema").and_then(|s| s.get("format"));
        if format != Some(&Value::Num(FORMAT_MAJOR)) {
            return Err(format!("{}:{}: not a format {} corpus", path.display(), n + 1, FORMAT_MAJOR));
        }
        cases.push(Case(v));
    }
    Ok(cases)
}

/// Counts of field checks per (file, field, class), and a total per case.
#[derive(Default)]
pub struct Tallies {
    pub fields: BTreeMap<(String, String, String), [u64; 3]>,
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    pub acceptable: u64,
}

impl Tallies {
    /// Count one check of `field` in `file` under `class`: 0 passed, 1 failed, 2 skipped.
    pub fn count(&mut self, file: &str, field: &str, class: &str, outcome: usize) {
        self.fields.entry((file.into(), field.into(), class.into())).or_default()[outcome] += 1;
    }

    /// The counts per file, field and class, then the total.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for ((file, field, class), [p, f, s]) in &self.fields {
            out += &format!("{} {} {}: {} passed, {} failed, {} skipped\n", file, field, class, p, f, s);
        }
        out += &format!("{} passed, {} failed, {} skipped", self.passed, self.failed, self.skipped);
        if self.acceptable > 0 {
            out += &format!(", {} acceptable differences", self.acceptable);
        }
        out
    }
}
