//! The options table (`ggml-ext/llama/tq-options.def`, the one source of turboquant's
//! switches) as markdown, between `<!-- options:begin -->` and `<!-- options:end -->` in
//! README.md and docs/OPTIONS.md. The `.def` file is an X-macro table for C; [`parse`] reads
//! its rows (string literals, `NULL`, integers and the identifiers the file documents).

/// The table, as compiled into this crate (cargo rebuilds it when the file changes).
pub const DEF: &str = include_str!("../../../ggml-ext/llama/tq-options.def");
pub const DEF_PATH: &str = "ggml-ext/llama/tq-options.def";

pub const BEGIN: &str = "<!-- options:begin -->";
pub const END: &str = "<!-- options:end -->";

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
                            return Err("escapes are not supported in tq-options.def".into());
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

/// The rows of the checked-in table.
pub fn rows() -> Vec<Row> {
    parse(DEF).unwrap_or_else(|e| panic!("{DEF_PATH}: {e}"))
}

fn code(s: &str) -> String {
    format!("`{s}`")
}

/// The table as markdown (without the markers).
pub fn markdown(rows: &[Row]) -> String {
    let mut t = format!(
        "<!-- generated from {DEF_PATH} by `cargo run --release -p turboquant-gen`: edit the table there -->\n\n"
    );
    t += "| option | flag | environment | `llama_context_params` field | values | default | changes results | changes saved state | read | what |\n";
    t += "|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        let names: Vec<String> = r.values.iter().map(|v| code(&v[0])).collect();
        let aliases: Vec<String> = r
            .valid()
            .into_iter()
            .skip(r.values.len())
            .map(code)
            .collect();
        let mut values = names.join(", ");
        if !aliases.is_empty() {
            values += &format!(" (also {})", aliases.join(", "));
        }
        let field = match &r.field {
            Some(f) => {
                let enc: Vec<String> = r
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{} {}", i + 1, v[0]))
                    .collect();
                format!("{} (0 default, {})", code(f), enc.join(", "))
            }
            None => "—".into(),
        };
        let results = match r.results {
            Changes::Yes => "yes",
            Changes::Rounding => "rounding only",
            Changes::No => "no",
        };
        let read = match r.read {
            Read::Context => "each context",
            Read::Process => "once per process",
        };
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            code(&r.name),
            r.flag.as_deref().map(code).unwrap_or_else(|| "—".into()),
            code(&r.env),
            field,
            values,
            code(&r.default),
            results,
            if r.state { "yes" } else { "no" },
            read,
            r.help.replace('|', "\\|"),
        );
    }
    t + "\n"
}

/// `text` with what stands between the markers replaced by `body`.
pub fn splice(text: &str, body: &str) -> Result<String, String> {
    let b = text.find(BEGIN).ok_or(format!("no {BEGIN}"))? + BEGIN.len();
    let e = text[b..]
        .find(END)
        .ok_or(format!("no {END} after {BEGIN}"))?
        + b;
    Ok(format!("{}\n{}{}", &text[..b], body, &text[e..]))
}

/// The files that carry the table, as they must read now.
pub fn generated(root: &std::path::Path) -> Vec<crate::Generated> {
    let body = markdown(&rows());
    ["README.md", "docs/OPTIONS.md"]
        .into_iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
            crate::Generated {
                path,
                text: splice(&text, &body).unwrap_or_else(|e| panic!("{path}: {e}")),
            }
        })
        .collect()
}
