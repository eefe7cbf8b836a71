//! turboquant's options table (ggml-ext/llama/tq-options.def, docs/OPTIONS.md) through the
//! real tools: a value no row knows is refused with the table's one message, as a flag
//! (common's argument error) and as an environment variable (the context is not created),
//! with an error exit and no abort; the start-up log states each switch and what decided it,
//! and a flag wins over its environment alias. The README's copy of the table is checked by
//! crates/gen's tests.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use support::{bin, model, run_for, text};

/// Every environment variable of the table, cleared in each child so that the caller's
/// environment cannot decide a result.
const TQ_ENV: [&str; 9] = [
    "TQ_K_MEAN",
    "TQ_K_BALANCE",
    "TQ_K_SINK",
    "TQ_K_MEAN_FRAME",
    "TQ_FA_TILE",
    "TQ_PREFILL_DECODE",
    "TQ_ROWS_THREADS",
    "TQ_CUDA_FA",
    "TQ_SIMD",
];

const ON_OFF: &str = "valid: off, on, 0, 1, false, true, disabled, enabled";

/// A two-token text: llama-perplexity creates the context (and logs the options), then
/// stops because there is nothing to evaluate.
fn tiny() -> PathBuf {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("tq-options-{}.txt", std::process::id()));
        std::fs::write(&p, "hello world").unwrap();
        p
    })
    .clone()
}

fn tool(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin(name));
    cmd.arg("-m").arg(model()).args(args).stdin(Stdio::null());
    for e in TQ_ENV {
        cmd.env_remove(e);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_for(&mut cmd, 120)
}

/// llama-perplexity over the tiny text with a turbo K and V cache on the CPU (so the K mean
/// in RoPE's frame and the exact first keys can run), llama's info lines in the log.
fn perplexity(args: &[&str], env: &[(&str, &str)]) -> String {
    let tiny = tiny();
    let mut all = vec!["-f", tiny.to_str().unwrap()];
    all.extend([
        "-c", "256", "-fa", "on", "-t", "2", "-lv", "4", "-ngl", "0", "-ctk", "turbo4", "-ctv",
        "turbo4",
    ]);
    all.extend(args);
    text(&tool("llama-perplexity", &all, env))
}

/// Refused: an error exit (not a signal: no abort, no core dump) whose output has `msg`.
fn refused(o: &Output, what: &str, msg: &str) {
    let t = text(o);
    assert!(
        !o.status.success() && o.status.code().is_some(),
        "{what}: expected an error exit, got {}:\n{t}",
        o.status
    );
    assert!(t.contains(msg), "{what}: no {msg:?} in:\n{t}");
    for crash in ["GGML_ASSERT", "terminate called", "core dumped", "Aborted"] {
        assert!(!t.contains(crash), "{what}: {crash}:\n{t}");
    }
}

#[test]
fn an_unknown_value_is_refused_naming_the_valid_ones() {
    let tiny = tiny();
    let tiny = tiny.to_str().unwrap();
    // flags: common's argument error, before the model is loaded
    let o = tool(
        "llama-perplexity",
        &["-f", tiny, "--tq-k-sink", "maybe"],
        &[],
    );
    refused(
        &o,
        "--tq-k-sink maybe",
        &format!("turboquant: --tq-k-sink=maybe: unknown value; {ON_OFF}"),
    );
    let o = tool("llama-cli", &["--tq-k-mean-frame", "sideways"], &[]);
    refused(
        &o,
        "llama-cli --tq-k-mean-frame sideways",
        "turboquant: --tq-k-mean-frame=sideways: unknown value; valid: rope, fitted",
    );
    // environment variables: the context is not created; environment-only switches too
    // (TQ_CUDA_FA used to abort at the first CUDA decode, TQ_FA_TILE=3 meant 2; outside
    // llama each reader refuses them itself: tests/switches.rs)
    for (var, val, valid) in [
        ("TQ_K_MEAN_FRAME", "sideways", "valid: rope, fitted"),
        ("TQ_K_SINK", "maybe", ON_OFF),
        ("TQ_CUDA_FA", "fast", "valid: gqa, vec"),
        ("TQ_FA_TILE", "3", "valid: 0, 1, 2"),
        ("TQ_PREFILL_DECODE", "off", "valid: 0, 1"),
        ("TQ_ROWS_THREADS", "2", "valid: 0, 1"),
        (
            "TQ_SIMD",
            "AVX2",
            "valid: auto, scalar, avx2, avx512, none, 0",
        ),
    ] {
        let o = tool(
            "llama-perplexity",
            &[
                "-f", tiny, "-c", "256", "-fa", "on", "-ctk", "turbo4", "-ctv", "turbo4",
            ],
            &[(var, val)],
        );
        let msg = format!("turboquant: {var}={val}: unknown value; {valid}");
        refused(&o, &format!("{var}={val}"), &msg);
        assert!(
            text(&o).contains("failed to initialize the context"),
            "{var}={val}: not refused at context creation:\n{}",
            text(&o)
        );
    }
    let o = tool(
        "llama-cli",
        &["-p", "hi", "-n", "1"],
        &[("TQ_K_MEAN", "maybe")],
    );
    refused(
        &o,
        "llama-cli TQ_K_MEAN=maybe",
        &format!("turboquant: TQ_K_MEAN=maybe: unknown value; {ON_OFF}"),
    );
    // the help lists the new flags with their values, default and environment alias
    let o = tool("llama-perplexity", &["--help"], &[]);
    let t = text(&o);
    for want in [
        "--tq-k-sink off|on",
        "--tq-k-mean-frame rope|fitted",
        "env: TQ_K_SINK",
        "env: TQ_K_MEAN_FRAME",
    ] {
        assert!(t.contains(want), "--help lacks {want:?}:\n{t}");
    }
}

#[test]
fn k_sink_and_k_mean_frame_take_the_flag_over_the_environment() {
    let has = |log: &str, what: &str, lines: &[&str]| {
        for l in lines {
            assert!(log.contains(l), "{what}: the log lacks {l:?}:\n{log}");
        }
    };
    let log = perplexity(&[], &[]);
    has(
        &log,
        "defaults",
        &[
            "turboquant option k_sink = on (default)",
            "turboquant option k_mean_frame = rope (default)",
            "turboquant option k_mean = on (default)",
            "turboquant option fa_tile = 2 (default)",
            "turbo K mean in RoPE's frame: on",
            "turbo exact first keys: on (default;",
        ],
    );

    let env = [("TQ_K_SINK", "off"), ("TQ_K_MEAN_FRAME", "fitted")];
    let log = perplexity(&[], &env);
    has(
        &log,
        "environment",
        &[
            "turboquant option k_sink = off (env TQ_K_SINK)",
            "turboquant option k_mean_frame = fitted (env TQ_K_MEAN_FRAME)",
            "turbo K mean removal: on",
        ],
    );
    assert!(
        !log.contains("turbo K mean in RoPE's frame: on"),
        "TQ_K_MEAN_FRAME=fitted: the cache still keeps the mean in RoPE's frame:\n{log}"
    );

    let log = perplexity(&["--tq-k-sink", "on", "--tq-k-mean-frame", "rope"], &env);
    has(
        &log,
        "flags over the environment",
        &[
            "turboquant option k_sink = on (flag --tq-k-sink)",
            "turboquant option k_mean_frame = rope (flag --tq-k-mean-frame)",
            "turbo K mean in RoPE's frame: on",
            "turbo exact first keys: on (option tq_k_sink;",
        ],
    );

    let log = perplexity(&["--tq-k-sink", "off"], &[("TQ_K_SINK", "on")]);
    has(
        &log,
        "--tq-k-sink off",
        &[
            "turboquant option k_sink = off (flag --tq-k-sink)",
            "turbo exact first keys: off (option tq_k_sink;",
        ],
    );
}
