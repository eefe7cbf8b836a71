//! The options table (`ggml-ext/llama/tq-options.def`, the one source of turboquant's
//! switches, whose last rows are ggml's own, `ggml-ext/ggml/tq-switches.def`) as markdown,
//! between `<!-- options:begin -->` and `<!-- options:end -->` in README.md and
//! docs/OPTIONS.md. The rows are read by the codec's parser ([`parse`], the one the Rust
//! readers of the switches use).

pub use turboquant_codec::switches::{parse, Changes, Read, Row, GGML_DEF, GGML_DEF_PATH};

/// llama's rows, as compiled into this crate (cargo rebuilds it when the file changes); the
/// file ends by including [`GGML_DEF`].
pub const DEF: &str = include_str!("../../../ggml-ext/llama/tq-options.def");
pub const DEF_PATH: &str = "ggml-ext/llama/tq-options.def";

/// The line of [`DEF`] that makes ggml's rows its last ones.
pub const INCLUDE_GGML: &str = "#include \"tq-switches.def\"";

pub const BEGIN: &str = "<!-- options:begin -->";
pub const END: &str = "<!-- options:end -->";

/// The rows of the checked-in table, in the order C sees them: llama's, then ggml's
/// (where [`DEF`] includes [`GGML_DEF`]).
pub fn rows() -> Vec<Row> {
    assert!(
        DEF.lines().any(|l| l.trim() == INCLUDE_GGML),
        "{DEF_PATH} no longer includes {GGML_DEF_PATH} ({INCLUDE_GGML})"
    );
    let mut all = parse(DEF).unwrap_or_else(|e| panic!("{DEF_PATH}: {e}"));
    all.extend(parse(GGML_DEF).unwrap_or_else(|e| panic!("{GGML_DEF_PATH}: {e}")));
    all
}

fn code(s: &str) -> String {
    format!("`{s}`")
}

/// The table as markdown (without the markers).
pub fn markdown(rows: &[Row]) -> String {
    let mut t = format!(
        "<!-- generated from {DEF_PATH} and {GGML_DEF_PATH} by `cargo run --release -p turboquant-gen`: edit the table there -->\n\n"
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
