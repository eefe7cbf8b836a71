//! The options table (ggml-ext/llama/tq-options.def, ending with ggml's own switches,
//! ggml-ext/ggml/tq-switches.def): it parses, keeps its rules, the copies in README.md and
//! docs/OPTIONS.md are what it renders now (without the minutes of trellis training that
//! `fresh.rs` needs in a debug build), and every `TQ_*` switch the sources read is a row.

use turboquant_gen::options::{self, Changes};

#[test]
fn readme_and_docs_carry_the_current_options_table() {
    let root = turboquant_gen::repo_root();
    for g in options::generated(&root) {
        let now = std::fs::read_to_string(root.join(g.path)).unwrap();
        assert!(
            now == g.text,
            "{}: the options table is stale (regenerate with `cargo run --release -p turboquant-gen`)",
            g.path
        );
    }
}

#[test]
fn every_switch_that_changes_results_or_state_has_a_flag_and_a_field() {
    let rows = options::rows();
    for r in &rows {
        if r.results == Changes::Yes || r.state {
            assert!(r.flag.is_some() && r.field.is_some(), "{}", r.name);
        }
    }
    let want = [
        ("k_mean", "--tq-k-mean", "TQ_K_MEAN", "tq_k_mean"),
        (
            "k_balance",
            "--tq-k-balance",
            "TQ_K_BALANCE",
            "tq_k_balance",
        ),
        ("k_sink", "--tq-k-sink", "TQ_K_SINK", "tq_k_sink"),
        (
            "k_mean_frame",
            "--tq-k-mean-frame",
            "TQ_K_MEAN_FRAME",
            "tq_k_mean_frame",
        ),
    ];
    for (name, flag, env, field) in want {
        let r = rows.iter().find(|r| r.name == name).expect(name);
        assert_eq!(
            (r.flag.as_deref(), r.env.as_str(), r.field.as_deref()),
            (Some(flag), env, Some(field))
        );
    }
    let frame = rows.iter().find(|r| r.name == "k_mean_frame").unwrap();
    assert_eq!(
        frame.unknown("TQ_K_MEAN_FRAME", "x"),
        "turboquant: TQ_K_MEAN_FRAME=x: unknown value; valid: rope, fitted"
    );
}

#[test]
fn the_parser_refuses_a_row_that_breaks_the_rules() {
    let row = |field: &str, results: &str, values: &str, def: &str| {
        let flag = if field == "TQ_NO_FIELD" {
            "NULL"
        } else {
            "\"--x\""
        };
        format!(
            "// c\nTQ_OPTION(X, \"x\", {flag}, \"TQ_X\", {field}, \"{values}\", \"{def}\", {results}, 0, TQ_READ_CONTEXT, \"h\" \"elp\")\n"
        )
    };
    let ok = options::parse(&row("TQ_FIELD(tq_x)", "TQ_CHANGES_YES", "a=1|b", "a")).unwrap();
    assert_eq!(ok[0].help, "help");
    assert_eq!(ok[0].valid(), ["a", "b", "1"]);
    for (bad, why) in [
        (
            row("TQ_NO_FIELD", "TQ_CHANGES_YES", "a|b", "a"),
            "results without a field",
        ),
        (
            row("TQ_FIELD(tq_x)", "TQ_CHANGES_NO", "a|b|c|d", "a"),
            "4 values in 2 bits",
        ),
        (
            row("TQ_FIELD(tq_x)", "TQ_CHANGES_NO", "a|b", "c"),
            "default not a value",
        ),
        (
            row("TQ_FIELD(tq_x)", "TQ_CHANGES_NO", "a|b=a", "a"),
            "a spelling twice",
        ),
    ] {
        assert!(options::parse(&bad).is_err(), "{why}: {bad}");
    }
}

#[test]
fn ggml_switches_are_the_tables_last_rows_and_environment_only() {
    let rows = options::rows();
    let ggml = turboquant_codec::switches::ggml_rows();
    assert_eq!(
        &rows[rows.len() - ggml.len()..],
        ggml,
        "tq-options.def ends by including tq-switches.def"
    );
    let names: Vec<&str> = ggml.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "fa_tile",
            "prefill_decode",
            "rows_threads",
            "cuda_fa",
            "simd"
        ]
    );
    for r in ggml {
        assert!(
            r.flag.is_none()
                && r.field.is_none()
                && !r.state
                && r.read == options::Read::Process
                && r.results != Changes::Yes,
            "{}: ggml has no flag, no field, no saved state; read once per process",
            r.name
        );
    }
    // the generated table lists each with its variable, values, default and what it changes
    let docs =
        std::fs::read_to_string(turboquant_gen::repo_root().join("docs/OPTIONS.md")).unwrap();
    for r in ggml {
        let line = docs
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` | — | `{}` |", r.name, r.env)))
            .unwrap_or_else(|| panic!("docs/OPTIONS.md has no row for {}", r.name));
        assert!(
            line.contains(&format!("| `{}` |", r.default)) && line.contains(&r.help),
            "{line}"
        );
    }
}

/// Variables named `TQ_*` that the sources read and that are not switches: paths and
/// diagnostics output, which change neither results nor speed.
const NOT_SWITCHES: [(&str, &str); 5] = [
    ("TQ_CACHE_DIR", "a path: where the build's caches live"),
    (
        "TQ_LLAMA_BIN_DIR",
        "a path: where tq finds the llama.cpp tools",
    ),
    (
        "TQ_TEST_REPORT",
        "a path: where codec_simd writes its report",
    ),
    ("TQ_TRACE_CAPTURE", "diagnostics: tq capture traces layer 0"),
    ("TQ_VERBOSE", "diagnostics: tq shows llama.cpp's log"),
];

fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if !p.ends_with("patches") {
                sources(&p, out);
            }
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("rs" | "h" | "c" | "cpp" | "cu" | "cuh" | "inc")
        ) {
            out.push(p);
        }
    }
}

#[test]
fn every_tq_variable_the_sources_read_is_a_row_of_the_table() {
    let root = turboquant_gen::repo_root();
    let rows = options::rows();
    let mut files = Vec::new();
    for d in ["ggml-ext", "crates", "src"] {
        sources(&root.join(d), &mut files);
    }
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for call in ["getenv(\"", "env::var(\"", "env::var_os(\""] {
            for (at, _) in text.match_indices(call) {
                let name = &text[at + call.len()..];
                let name = &name[..name.find('"').unwrap()];
                if !name.starts_with("TQ_") {
                    continue;
                }
                seen += 1;
                // a row's variable goes through the table's parser (tq_switch_get,
                // tq_opt_env, turboquant_codec::switches::get), never a reader's own
                assert!(
                    !rows.iter().any(|r| r.env == name),
                    "{}: reads {name} itself: use the table's parser",
                    f.display()
                );
                assert!(
                    NOT_SWITCHES.iter().any(|(n, _)| *n == name),
                    "{}: reads {name}, which is not a row of {} (add one, or name it in NOT_SWITCHES with why)",
                    f.display(),
                    options::DEF_PATH
                );
            }
        }
    }
    assert!(seen >= NOT_SWITCHES.len(), "the scan found {seen} reads");
}
