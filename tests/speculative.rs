//! Speculative decoding with turbo caches (issue 38): llama-server with a draft model
//! (`-md`, `--spec-type draft-simple`, the draft's cache set by `-ctkd`/`-ctvd`) and with a
//! draft-free type (`ngram-simple`), on the default model drafting for itself. Temperature 0
//! and batches of verification below 64 tokens (draft-simple drafts 3, ngram-simple up to
//! 48), which flash attention runs on the same turbo tiles as a one-token decode: the answer
//! must be the plain decode's, token for token. Acceptance is compared with f16's (for the
//! n-gram type on the tokens both caches answer alike), tokens/s with q8_0's. Figures and the
//! margins' derivation: docs/SPECULATIVE.md.
#![cfg(feature = "llama")]

mod support;

use serde_json::{json, Value};
use std::sync::Mutex;
use support::server::Server;

/// The timing comparison must not share the two cores with the other test of this file.
static SERIAL: Mutex<()> = Mutex::new(());

/// Prose that does not repeat: only a draft model has something to propose.
const PROSE: &str = "The history of the printing press begins";
/// A list to copy: the n-gram types find their drafts in the prompt.
const COPY: &str = support::COPY_LIST_PROMPT;

/// Rounds of the interleaved timing (turbo, q8_0, turbo, q8_0, ...).
const ROUNDS: usize = 3;
/// Floor on the median of the rounds' turbo4/turbo3 / q8_0 tokens/s ratios. The issue's
/// target is 0.9x and is met (median 0.99x over 8 rounds; 0.986-1.029 over 5 runs of this
/// test), but on the shared 2-core machine single rounds ranged 0.886-1.153 (29 rounds,
/// load average 9-13): 0.9 sits at the lowest rounds, two of which in one run would fail it.
/// Below 0.85 two of three paired rounds must fall under the worst round seen.
/// docs/SPECULATIVE.md has the table.
const MIN_RATIO_VS_Q8_0: f64 = 0.85;
/// Acceptance may differ from f16's by at most this many percentage points.
const MAX_ACCEPT_POINTS: f64 = 2.0;

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn model() -> String {
    support::model().to_str().unwrap().to_string()
}

/// A one-slot server with K/V cache `k`/`v`; `spec` adds a speculative type, with the model
/// itself as draft (same cache types, one thread) for the draft types.
fn server(k: &str, v: &str, spec: Option<&str>) -> Server {
    let m = model();
    // -lv 4: the caches' sizes and types (a few lines per request, the same for every server)
    let mut a: Vec<&str> = vec![
        "-fa", "on", "-c", "1024", "-np", "1", "-lv", "4", "-ctk", k, "-ctv", v,
    ];
    if let Some(t) = spec {
        a.extend(["--spec-type", t]);
        if t.starts_with("draft") {
            // -td 1: ggml's threads spin while they wait, and two per context on two shared
            // cores made every cache type 6-10x slower than plain decoding
            a.extend(["-md", &m, "-td", "1", "-ctkd", k, "-ctvd", v]);
        }
    }
    Server::start(&a)
}

struct Run {
    text: String,
    tps: f64,
    drafted: u64,
    accepted: u64,
}

impl Run {
    fn acceptance(&self) -> f64 {
        100.0 * self.accepted as f64 / self.drafted.max(1) as f64
    }
}

fn complete(s: &Server, prompt: &str, n: u32) -> Run {
    let v: Value = s.post_ok(
        "/completion",
        &json!({"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": false}),
    );
    let t = &v["timings"];
    Run {
        text: v["content"].as_str().unwrap().to_string(),
        tps: t["predicted_per_second"].as_f64().unwrap(),
        drafted: t["draft_n"].as_u64().unwrap_or(0),
        accepted: t["draft_n_accepted"].as_u64().unwrap_or(0),
    }
}

#[test]
fn draft_model_with_turbo_caches_answers_as_plain_decoding_and_keeps_pace_with_q8_0() {
    let _g = lock();
    let turbo = server("turbo4", "turbo3", Some("draft-simple"));
    let q8 = server("q8_0", "q8_0", Some("draft-simple"));
    let f16 = server("f16", "f16", Some("draft-simple"));
    let plain = server("turbo4", "turbo3", None);
    // warm-up: first-touch page faults and allocations out of the timed runs
    for s in [&turbo, &q8] {
        complete(s, "Hello", 8);
    }

    let reference = complete(&plain, PROSE, 128);
    let f16_run = complete(&f16, PROSE, 128);
    let mut ratios = Vec::new();
    let (mut best_turbo, mut best_q8) = (0.0f64, 0.0f64);
    for round in 0..ROUNDS {
        let t = complete(&turbo, PROSE, 128);
        let q = complete(&q8, PROSE, 128);
        eprintln!(
            "round {round}: turbo4/turbo3 {:.1} t/s ({}/{} accepted), q8_0 {:.1} t/s ({}/{}): {:.3}x",
            t.tps,
            t.accepted,
            t.drafted,
            q.tps,
            q.accepted,
            q.drafted,
            t.tps / q.tps
        );
        assert!(
            t.drafted > 0,
            "turbo: nothing drafted:\n{}",
            turbo.log_tail()
        );
        assert_eq!(
            t.text, reference.text,
            "turbo4/turbo3 with a draft model answers differently from plain decoding"
        );
        assert!(
            (t.acceptance() - f16_run.acceptance()).abs() <= MAX_ACCEPT_POINTS,
            "turbo acceptance {:.1} % ({}/{}) vs f16 {:.1} % ({}/{})",
            t.acceptance(),
            t.accepted,
            t.drafted,
            f16_run.acceptance(),
            f16_run.accepted,
            f16_run.drafted
        );
        ratios.push(t.tps / q.tps);
        best_turbo = best_turbo.max(t.tps);
        best_q8 = best_q8.max(q.tps);
    }
    // the median of the rounds' ratios: each pairs two runs next to each other in time, and
    // a run that a burst of load slowed (or a lull sped up) moves one ratio, not the median
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios[ROUNDS / 2];
    eprintln!(
        "median ratio {ratio:.3}x; best: turbo4/turbo3 {best_turbo:.1} t/s, q8_0 {best_q8:.1} t/s \
         ({:.3}x); f16 {:.1} t/s, acceptance f16 {:.1} %; plain turbo {:.1} t/s",
        best_turbo / best_q8,
        f16_run.tps,
        f16_run.acceptance(),
        reference.tps
    );
    assert!(
        ratio >= MIN_RATIO_VS_Q8_0,
        "speculative turbo4/turbo3 at {ratio:.3}x q8_0's tokens/s (floor {MIN_RATIO_VS_Q8_0})"
    );

    // the draft context got the turbo cache too: two contexts name it
    let log = turbo.stop();
    let n = log.matches("K (turbo4)").count();
    assert!(
        n >= 2,
        "turbo4 K in {n} contexts, want target and draft:\n{log}"
    );
}

/// The shortest common start of turbo's and f16's plain answers that the n-gram comparison
/// accepts: two lines of the copied list (8 tokens each with its number, " dog, cat, mouse\n3.").
/// Both caches answered alike for 31 tokens here.
const MIN_COMMON_TOKENS: usize = 16;

#[test]
fn ngram_speculation_with_turbo_caches_answers_as_plain_decoding() {
    let _g = lock();
    // An n-gram type drafts from the text itself, so its acceptance is a property of the
    // text: two caches whose answers part (turbo4/turbo3 and f16 on this prompt after 31
    // tokens, here; on CI's machine f16's answer went on copying longer, 50/63 against 29/42
    // over 64 tokens) compare different drafts, not the verification. So both answer the prompt plainly
    // first, and the speculative runs stop where those answers part: the server drafts at most
    // up to n_predict, so every draft then lies on the same tokens for both caches.
    let plain = server("turbo4", "turbo3", None);
    let plain_f16 = server("f16", "f16", None);
    let reference = complete_tokens(&plain, COPY, 64);
    let reference_f16 = complete_tokens(&plain_f16, COPY, 64);
    let common = reference
        .iter()
        .zip(&reference_f16)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(
        common >= MIN_COMMON_TOKENS,
        "turbo4/turbo3's plain answer leaves f16's after {common} tokens (at least \
         {MIN_COMMON_TOKENS} wanted): {reference:?} vs {reference_f16:?}"
    );
    let n = common as u32;
    let expected = complete(&plain, COPY, n);

    let turbo = server("turbo4", "turbo3", Some("ngram-simple"));
    let f16 = server("f16", "f16", Some("ngram-simple"));
    let t = complete(&turbo, COPY, n);
    let f = complete(&f16, COPY, n);
    eprintln!(
        "ngram-simple over the {n} tokens both caches answer alike: turbo4/turbo3 {}/{} accepted, \
         {:.1} t/s; f16 {}/{}, {:.1} t/s; plain turbo {:.1} t/s",
        t.accepted, t.drafted, t.tps, f.accepted, f.drafted, f.tps, expected.tps
    );
    assert!(t.drafted > 0, "nothing drafted:\n{}", turbo.log_tail());
    assert_eq!(
        t.text, expected.text,
        "turbo4/turbo3 with ngram-simple answers differently from plain decoding"
    );
    assert!(
        (t.acceptance() - f.acceptance()).abs() <= MAX_ACCEPT_POINTS,
        "turbo acceptance {:.1} % ({}/{}) vs f16 {:.1} % ({}/{}) on the same {n} tokens",
        t.acceptance(),
        t.accepted,
        t.drafted,
        f.acceptance(),
        f.accepted,
        f.drafted
    );
}

/// The answer's token ids (`return_tokens`), for comparing two caches' answers token by token.
fn complete_tokens(s: &Server, prompt: &str, n: u32) -> Vec<u64> {
    let v: Value = s.post_ok(
        "/completion",
        &json!({"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": false,
                "return_tokens": true}),
    );
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens in the answer: {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// The property the tests above rely on, node by node: on the CPU, a token's every graph node
/// (1206 f32 nodes of SmolLM2 with turbo4/turbo3, logits included) has the same bits inside a
/// batch of 4 as decoded alone (`tq batch-check`, docs/LAB.md). Bad options are refused by name.
#[test]
fn tq_batch_check_finds_the_cpu_batch_invariant() {
    let m = model();
    let tq = support::bin("tq");
    let out = support::run_for(
        std::process::Command::new(&tq).args(["batch-check", "-m", &m, "--batch", "4"]),
        300,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let (summary, same) = support::batch_check_summary(&text);
    assert!(
        out.status.success()
            && summary.contains(" 0 of the token's nodes differ")
            && text
                .lines()
                .any(|l| l.starts_with("result_output#0") && l.contains(" 0 of ")),
        "tq batch-check on the CPU:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 1206 measured; fewer would mean nodes went uncompared (a layout the slicing misses)
    assert!(same >= 1200, "only {same} nodes compared:\n{text}");
    for (args, want) in [
        (vec!["--ctk", "turbo5"], "unknown cache type `turbo5`"),
        (vec!["--batch", "1"], "--batch must be at least 2"),
        (vec!["--device", "NoSuchGPU0"], "no device `NoSuchGPU0`"),
    ] {
        let mut c = std::process::Command::new(&tq);
        c.args(["batch-check", "-m", &m]).args(&args);
        let out = support::run_for(&mut c, 120);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "tq batch-check {args:?}: want an error naming {want:?}, got:\n{err}"
        );
    }
}
