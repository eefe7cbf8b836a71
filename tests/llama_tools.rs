//! The shipped llama.cpp tools with turbo caches, on the real default model
//! (SmolLM2-135M, head 64) and the llama.cpp docs as text.
#![cfg(feature = "llama")]

mod support;

use std::process::Command;
use support::*;

const TURBO: [&str; 3] = ["turbo2", "turbo3", "turbo4"];

/// The issue's target: allowed PPL increase over f16 for a cache type (a pair gets its
/// worse member's bound).
fn ppl_target(t: &str) -> f64 {
    match t {
        "turbo4" => 0.08,
        "turbo3" => 0.25,
        _ => 1.00,
    }
}

/// Pairs that miss the target today, with the regression guard they must stay under.
/// Measured on this corpus (16 chunks of 512, one chunk per batch), with K mean removal
/// (ggml-ext/include/tq-kmean.h): turbo2/turbo2 +101.3% (KLD 0.699) against the +100%
/// target; every other pair meets its target (turbo3/turbo3 +15%, turbo2/turbo3 and
/// turbo2/turbo4 under +90%). Before K mean removal turbo2/turbo2 was +271%. The entry is
/// a known miss, reported in docs/BENCHMARKS.md, never a target.
const KNOWN_MISSES: [(&str, &str, f64); 1] = [("turbo2", "turbo2", 1.15)];

fn perplexity(ctk: &str, ctv: &str, base: &std::path::Path, save_base: bool) -> String {
    let mut cmd = perplexity_cmd(&corpus());
    cmd.args([
        "-c", "512", "--chunks", "16", "-fa", "on", "-t", "2", "-b", "512",
    ]);
    cmd.args(["-ctk", ctk, "-ctv", ctv]);
    cmd.arg("--kl-divergence-base").arg(base);
    if !save_base {
        cmd.arg("--kl-divergence");
    }
    let o = run(&mut cmd);
    let t = text(&o);
    assert!(
        o.status.success(),
        "llama-perplexity {ctk}/{ctv} failed:\n{t}"
    );
    t
}

#[test]
fn perplexity_every_turbo_pair_within_bounds_of_f16() {
    let base = std::env::temp_dir().join(format!("tq-kld-base-{}.bin", std::process::id()));
    let f16 = perplexity("f16", "f16", &base, true);
    let ppl_f16 = number_after(&f16, "Final estimate: PPL =").expect("f16 PPL");
    eprintln!("f16/f16: PPL {ppl_f16:.4}");
    let mut failures = Vec::new();
    for k in TURBO {
        for v in TURBO {
            let out = perplexity(k, v, &base, false);
            let ppl = number_after(&out, "Mean PPL(Q)  ").expect("PPL(Q)");
            let kld = number_after(&out, "Mean    KLD:").expect("KLD");
            let top = number_after(&out, "Same top p:").expect("top p");
            assert!(
                ppl.is_finite() && kld.is_finite(),
                "{k}/{v}: non-finite result\n{out}"
            );
            let rel = ppl / ppl_f16 - 1.0;
            let target = ppl_target(k).max(ppl_target(v));
            let miss = KNOWN_MISSES.iter().find(|m| m.0 == k && m.1 == v);
            let bound = miss.map_or(target, |m| m.2);
            let note = miss.map_or(String::new(), |m| {
                format!(", known miss, guard {:+.0}%", m.2 * 100.0)
            });
            eprintln!(
                "{k}/{v}: PPL {ppl:.4} ({:+.2}%), KLD {kld:.5}, same top {top:.2}% (target {:+.0}%{note})",
                rel * 100.0,
                target * 100.0,
            );
            if rel > bound {
                failures.push(format!(
                    "{k}/{v}: PPL {ppl:.4} is {:+.2}% over f16 {ppl_f16:.4}, bound {:+.0}%",
                    rel * 100.0,
                    bound * 100.0
                ));
            }
            if miss.is_some() && rel <= target {
                eprintln!("{k}/{v} now meets its target: remove it from KNOWN_MISSES");
            }
        }
    }
    let _ = std::fs::remove_file(&base);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `llama_kv_cache: ... K (turbo4): 12.34 MiB, V (turbo3): 5.67 MiB`
fn kv_sizes(log: &str) -> (f64, f64) {
    let line = log
        .lines()
        .find(|l| l.contains("llama_kv_cache: size ="))
        .expect("kv size line");
    let k = number_after(&line[line.find("K (").unwrap()..], "):").unwrap();
    let v = number_after(&line[line.find("V (").unwrap()..], "):").unwrap();
    (k, v)
}

#[test]
fn kv_cache_size_at_ctx_4096_is_f16_times_bits_over_16() {
    // A two-token text: llama-perplexity creates the context (and logs the cache size),
    // then stops because there is nothing to evaluate.
    let tiny = std::env::temp_dir().join(format!("tq-tiny-{}.txt", std::process::id()));
    std::fs::write(&tiny, "hello world").unwrap();
    let size = |ctk: &str, ctv: &str| {
        let o = run(perplexity_cmd(&tiny).args([
            "-c", "4096", "-fa", "on", "-t", "2", "-lv", "4", "-ctk", ctk, "-ctv", ctv,
        ]));
        kv_sizes(&text(&o))
    };
    let (k16, v16) = size("f16", "f16");
    for (t, bits) in [("turbo2", 2.25), ("turbo3", 3.25), ("turbo4", 4.25)] {
        let (k, v) = size(t, t);
        for (got, f16) in [(k, k16), (v, v16)] {
            let want = f16 * bits / 16.0;
            assert!(
                (got / want - 1.0).abs() < 0.02,
                "{t}: {got} MiB, expected {want} MiB (f16 {f16} MiB)"
            );
        }
    }
}

fn http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    support::server::request(port, method, path, body).map(|r| (r.code, r.body))
}

#[test]
fn server_answers_chat_and_parallel_requests_with_turbo_cache() {
    let srv = support::server::Server::start(&[
        "-c", "4096", "-np", "4", "-ctk", "turbo4", "-ctv", "turbo3", "-fa", "on", "-lv", "4",
    ]);
    let port = srv.port;
    let chat = move |q: &str| {
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"{q}"}}],"max_tokens":24,"temperature":0}}"#
        );
        http(port, "POST", "/v1/chat/completions", &body)
    };
    let (code, body) = chat("What is the capital of France?").unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(!answer.trim().is_empty(), "empty answer: {body}");
    eprintln!("answer: {answer:?}");

    let handles: Vec<_> = (0..4)
        .map(|i| std::thread::spawn(move || chat(&format!("Count from {i} to {}.", i + 5))))
        .collect();
    for h in handles {
        let (code, body) = h.join().unwrap().unwrap();
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
            "{body}"
        );
    }

    // clean stop: SIGTERM, then the server must exit by itself with status 0
    let log = srv.stop();
    assert!(
        log.contains("K (turbo4)") && log.contains("V (turbo3)"),
        "server log does not show the turbo cache"
    );
    assert!(
        log.contains("seeded randomized Hadamard"),
        "server log does not show the seeded rotation"
    );
    assert!(
        log.contains("turbo K mean removal: on"),
        "server log does not show the K mean policy"
    );
    assert!(
        log.contains("turbo K/Q channel balancing: on"),
        "server log does not show the K/Q balancing policy"
    );
}

#[test]
fn bench_prints_a_table_for_turbo_and_q4_0() {
    let o = run(Command::new(bin("llama-bench"))
        .arg("-m")
        .arg(model())
        .args([
            "-ctk",
            "turbo4,q4_0",
            "-ctv",
            "turbo3",
            "-fa",
            "1",
            "-p",
            "64",
            "-n",
            "8",
            "-r",
            "1",
            "-t",
            "2",
        ]));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with('|') && l.contains("turbo3"))
        .collect();
    assert!(
        rows.iter().any(|l| l.contains("turbo4")) && rows.iter().any(|l| l.contains("q4_0")),
        "{t}"
    );
    assert!(
        rows.len() >= 4,
        "expected pp and tg rows for both K types:\n{t}"
    );
}

#[test]
fn unknown_cache_type_is_refused_naming_the_valid_ones() {
    let o = run(Command::new(bin("llama-server"))
        .arg("-m")
        .arg(model())
        .args(["-ctk", "turbo9"]));
    let t = text(&o);
    assert!(!o.status.success(), "llama-server accepted turbo9");
    assert!(
        t.contains("turbo9") && t.contains("turbo4") && t.contains("q8_0"),
        "{t}"
    );

    let o = run(Command::new(bin("llama-bench"))
        .arg("-m")
        .arg(model())
        .args(["-ctk", "turbo9"]));
    assert!(!o.status.success(), "llama-bench accepted turbo9");
}

#[test]
fn turbo_v_without_flash_attention_is_refused_clearly() {
    let o = run(perplexity_cmd(&corpus()).args([
        "-c", "512", "--chunks", "1", "-fa", "off", "-ctk", "turbo4", "-ctv", "turbo3",
    ]));
    let t = text(&o);
    assert!(
        !o.status.success(),
        "turbo V without flash attention ran:\n{t}"
    );
    assert!(
        t.contains("requires flash_attn") || t.contains("requires Flash Attention"),
        "{t}"
    );
}

#[test]
fn turbo_k_without_flash_attention_works() {
    let o = run(perplexity_cmd(&corpus()).args([
        "-c", "512", "--chunks", "2", "-fa", "off", "-ctk", "turbo4", "-ctv", "f16", "-t", "2",
    ]));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let ppl = number_after(&t, "Final estimate: PPL =").unwrap();
    assert!(ppl.is_finite() && ppl > 1.0 && ppl < 1000.0, "PPL {ppl}");
}
