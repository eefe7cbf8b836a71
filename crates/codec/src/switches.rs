//! turboquant's switches, as the Rust readers see them: the one table of every switch
//! (`ggml-ext/llama/tq-options.def`, whose last rows are ggml's own,
//! `ggml-ext/ggml/tq-switches.def`), its one parser and its one message for a value it does
//! not know. The `.def` files are X-macro tables for C (`tq-switch.h` parses the same rows in
//! C); [`parse`] reads their rows (string literals, `NULL`, integers and the identifiers the
//! files document). The gen crate renders the rows as docs/OPTIONS.md's table.
//!
//! The codec and the C ABI read ggml's switches (`TQ_SIMD`, `TQ_FA_TILE`) through
//! [`get`]: the index of the environment variable's value, the row's default where it is
//! unset or empty. A reader has no way to return an error (a kernel's dispatch), so a value
//! the row does not know prints the table's message once and stops the process, as ggml's
//! readers do (`GGML_ABORT`), rather than compute with another value:
//!
//! ```text
//! turboquant: TQ_SIMD=avx3: unknown value; valid: auto, scalar, avx2, avx512, none, 0
//! ```

use std::sync::OnceLock;

/// ggml's switches (the last rows of the one table), as compiled into this crate.
pub const GGML_DEF: &str = include_str!("../../../ggml-ext/ggml/tq-switches.def");
pub const GGML_DEF_PATH: &str = "ggml-ext/ggml/tq-switches.def";

/// What a switch does to the model's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changes {
    Yes,
    Rounding,
    No,
}

/// When a switch is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Context,
    Process,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub id: String,
    pub name: String,
    pub flag: Option<String>,
    pub env: String,
    pub field: Option<String>,
    /// each value's spellings, its name first
    pub values: Vec<Vec<String>>,
    pub default: String,
    pub results: Changes,
    pub state: bool,
    pub read: Read,
    pub help: String,
}

impl Row {
    /// Every spelling in the order of the parsers' message: the names, then the aliases.
    pub fn valid(&self) -> Vec<&str> {
        let most = self.values.iter().map(Vec::len).max().unwrap_or(0);
        (0..most)
            .flat_map(|a| self.values.iter().filter_map(move |v| v.get(a)))
            .map(String::as_str)
            .collect()
    }

    /// The message every parser gives for a value the row does not know, `what` being the
    /// flag or the environment variable.
    pub fn unknown(&self, what: &str, value: &str) -> String {
        format!(
            "turboquant: {what}={value}: unknown value; valid: {}",
            self.valid().join(", ")
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Ident(String),
    Call(String, String),
    Int(i64),
}

/// The rows of a `.def` text, checked against the table's rules.
pub fn parse(def: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let mut rest = strip_comments(def);
    while let Some(at) = rest.find("TQ_OPTION(") {
        let body = &rest[at + "TQ_OPTION(".len()..];
        let (args, after) = args(body)?;
        rows.push(row(&args)?);
        rest = after.to_string();
    }
    if rows.is_empty() {
        return Err("no TQ_OPTION rows".into());
    }
    Ok(rows)
}

fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '/' && chars.peek() == Some(&'/') {
            for n in chars.by_ref() {
                if n == '\n' {
                    out.push('\n');
                    break;
                }
            }
        } else {
            if c == '"' {
                in_str = true;
            }
            out.push(c);
        }
    }
    out
}

/// The arguments up to the closing parenthesis, and the text after it.
fn args(s: &str) -> Result<(Vec<Tok>, &str), String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            return Err("unterminated TQ_OPTION(".into());
        }
        let tok = match b[i] {
            b'"' => {
                let mut v = String::new();
                // adjacent literals concatenate, as in C
                while i < b.len() && b[i] == b'"' {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        if b[i] == b'\\' {
                            return Err("escapes are not supported in a .def table".into());
                        }
                        v.push(b[i] as char);
                        i += 1;
                    }
                    i += 1;
                    while i < b.len() && b[i].is_ascii_whitespace() {
                        i += 1;
                    }
                }
                Tok::Str(v)
            }
            c if c.is_ascii_digit() || c == b'-' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                Tok::Int(s[start..i].parse().map_err(|e| format!("{e}"))?)
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let name = s[start..i].to_string();
                if i < b.len() && b[i] == b'(' {
                    let close = s[i..].find(')').ok_or("unterminated call")? + i;
                    let arg = s[i + 1..close].trim().to_string();
                    i = close + 1;
                    Tok::Call(name, arg)
                } else {
                    Tok::Ident(name)
                }
            }
            c => return Err(format!("unexpected {:?} in a TQ_OPTION row", c as char)),
        };
        out.push(tok);
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b')') => return Ok((out, &s[i + 1..])),
            _ => return Err("expected , or ) in a TQ_OPTION row".into()),
        }
    }
}

fn row(a: &[Tok]) -> Result<Row, String> {
    if a.len() != 11 {
        return Err(format!(
            "a TQ_OPTION row has 11 columns, not {}: {a:?}",
            a.len()
        ));
    }
    let id = match &a[0] {
        Tok::Ident(s) => s.clone(),
        t => return Err(format!("id: {t:?}")),
    };
    let string = |i: usize, what: &str| match &a[i] {
        Tok::Str(s) => Ok(s.clone()),
        t => Err(format!("{id}: {what} is not a string: {t:?}")),
    };
    let opt_string = |i: usize, what: &str| match &a[i] {
        Tok::Ident(n) if n == "NULL" => Ok(None),
        Tok::Str(s) => Ok(Some(s.clone())),
        t => Err(format!("{id}: {what}: {t:?}")),
    };
    let field = match &a[4] {
        Tok::Call(n, f) if n == "TQ_FIELD" => Some(f.clone()),
        Tok::Ident(n) if n == "TQ_NO_FIELD" => None,
        t => return Err(format!("{id}: field: {t:?}")),
    };
    let values: Vec<Vec<String>> = string(5, "values")?
        .split('|')
        .map(|v| v.split('=').map(str::to_string).collect())
        .collect();
    let results = match &a[7] {
        Tok::Ident(n) if n == "TQ_CHANGES_YES" => Changes::Yes,
        Tok::Ident(n) if n == "TQ_CHANGES_ROUNDING" => Changes::Rounding,
        Tok::Ident(n) if n == "TQ_CHANGES_NO" => Changes::No,
        t => return Err(format!("{id}: results: {t:?}")),
    };
    let state = match &a[8] {
        Tok::Int(0) => false,
        Tok::Int(1) => true,
        t => return Err(format!("{id}: state: {t:?}")),
    };
    let read = match &a[9] {
        Tok::Ident(n) if n == "TQ_READ_CONTEXT" => Read::Context,
        Tok::Ident(n) if n == "TQ_READ_PROCESS" => Read::Process,
        t => return Err(format!("{id}: read: {t:?}")),
    };
    let r = Row {
        name: string(1, "name")?,
        flag: opt_string(2, "flag")?,
        env: string(3, "env")?,
        field,
        values,
        default: string(6, "default")?,
        results,
        state,
        read,
        help: string(10, "help")?,
        id,
    };
    check(&r)?;
    Ok(r)
}

/// The table's rules (tq-options.def; tq-llama-options.h asserts the same at compile time).
fn check(r: &Row) -> Result<(), String> {
    let id = &r.id;
    if (r.results == Changes::Yes || r.state) && r.field.is_none() {
        return Err(format!(
            "{id}: changes results or saved state without a flag and a field"
        ));
    }
    if r.flag.is_some() != r.field.is_some() {
        return Err(format!("{id}: a flag exactly where there is a field"));
    }
    if r.field.is_some() && r.values.len() > 3 {
        return Err(format!("{id}: a 2-bit field takes at most 3 values"));
    }
    if !r.values.iter().any(|v| v[0] == r.default) {
        return Err(format!(
            "{id}: default {:?} is not one of its values",
            r.default
        ));
    }
    let all = r.valid();
    for (i, s) in all.iter().enumerate() {
        if s.is_empty() || all[..i].contains(s) {
            return Err(format!("{id}: value {s:?} empty or given twice"));
        }
    }
    Ok(())
}

/// ggml's switches: the rows of [`GGML_DEF`].
pub fn ggml_rows() -> &'static [Row] {
    static ROWS: OnceLock<Vec<Row>> = OnceLock::new();
    ROWS.get_or_init(|| parse(GGML_DEF).unwrap_or_else(|e| panic!("{GGML_DEF_PATH}: {e}")))
}

/// The row of ggml's switch whose environment variable is `env` (a name the table lacks is
/// a bug of the caller: it panics).
pub fn ggml_row(env: &str) -> &'static Row {
    ggml_rows()
        .iter()
        .find(|r| r.env == env)
        .unwrap_or_else(|| panic!("{env} is not a row of {GGML_DEF_PATH}"))
}

impl Row {
    /// The index of value `s` (its name or an alias: exact strings), or `None`.
    pub fn parse(&self, s: &str) -> Option<usize> {
        self.values.iter().position(|v| v.iter().any(|a| a == s))
    }

    /// The index of the default value.
    pub fn default_index(&self) -> usize {
        self.parse(&self.default)
            .expect("the default is one of the values (checked by parse)")
    }

    /// The value `raw` of the row's environment variable: its index, the default's where it
    /// is unset or empty, or the table's message.
    pub fn value_of(&self, raw: Option<&str>) -> Result<usize, String> {
        match raw {
            None | Some("") => Ok(self.default_index()),
            Some(s) => self.parse(s).ok_or_else(|| self.unknown(&self.env, s)),
        }
    }

    /// The row's environment variable now: see [`Row::value_of`] (a value that is not
    /// Unicode is unknown too).
    pub fn env_value(&self) -> Result<usize, String> {
        match std::env::var(&self.env) {
            Ok(s) => self.value_of(Some(&s)),
            Err(std::env::VarError::NotPresent) => self.value_of(None),
            Err(std::env::VarError::NotUnicode(s)) => {
                Err(self.unknown(&self.env, &s.to_string_lossy()))
            }
        }
    }
}

/// ggml's switch `env` as its readers take it: see the module documentation. Not cached
/// (each reader keeps what it read, once per process).
pub fn get(env: &str) -> usize {
    match ggml_row(env).env_value() {
        Ok(v) => v,
        Err(msg) => refuse(&msg),
    }
}

/// Prints `msg` once (whichever thread gets here first) and stops the process.
#[cold]
pub fn refuse(msg: &str) -> ! {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| eprintln!("{msg}"));
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_rows_parse_with_their_values_and_message() {
        let names: Vec<&str> = ggml_rows().iter().map(|r| r.env.as_str()).collect();
        assert_eq!(
            names,
            [
                "TQ_FA_TILE",
                "TQ_PREFILL_DECODE",
                "TQ_ROWS_THREADS",
                "TQ_CUDA_FA",
                "TQ_SIMD"
            ]
        );
        let simd = ggml_row("TQ_SIMD");
        assert_eq!(simd.value_of(None), Ok(0));
        assert_eq!(simd.value_of(Some("")), Ok(0));
        assert_eq!(simd.value_of(Some("none")), Ok(1));
        assert_eq!(simd.value_of(Some("avx512")), Ok(3));
        // exact strings: no case folding, no trimming
        for bad in ["AVX2", " avx2", "avx3"] {
            assert_eq!(
                simd.value_of(Some(bad)),
                Err(format!(
                    "turboquant: TQ_SIMD={bad}: unknown value; valid: auto, scalar, avx2, avx512, none, 0"
                ))
            );
        }
        let tile = ggml_row("TQ_FA_TILE");
        assert_eq!(tile.default_index(), 2);
        assert_eq!(
            tile.value_of(Some("3")).unwrap_err(),
            "turboquant: TQ_FA_TILE=3: unknown value; valid: 0, 1, 2"
        );
    }
}
