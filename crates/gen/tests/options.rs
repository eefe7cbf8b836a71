//! The options table (ggml-ext/llama/tq-options.def): it parses, keeps its rules, and the
//! copies in README.md and docs/OPTIONS.md are what it renders now (without the minutes of
//! trellis training that `fresh.rs` needs in a debug build).

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
