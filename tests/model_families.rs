//! Every model family users bring (issue 38), each through the real llama-perplexity with
//! turbo caches (and the massive-K model through llama-server):
//!
//! - massive K channels on real weights: SmolLM2 with a few RoPE pairs of K per KV head
//!   x 100 and the matching Q pairs x 1/100 plus a K bias (scripts/transform_gguf.py): the
//!   same model, whose cache now holds channels 100 times the rest. KLD of turbo4 / turbo3
//!   against q4_0's, both against the f16 cache.
//! - random-weight models (scripts/random_gguf.py) of the attention variants: soft-capping
//!   (gemma2), learned sinks (gpt-oss), partial RoPE (stablelm), MLA (deepseek2), 512-wide
//!   heads (llama), hybrids (granitehybrid, lfm2): each runs, its PPL stays near the f16
//!   cache's, and llama's log says what the turbo K mean does there.
//!
//! The generated GGUFs are cached under target/test-models/families-*, keyed by a hash of
//! both scripts and the arguments. Measured numbers and the table: docs/FAMILIES.md.
#![cfg(feature = "llama")]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::*;

/// PPL of the random models with turbo4 K / turbo3 V against the f16 cache: measured within
/// 1.2 % (docs/FAMILIES.md); a random model's PPL is about its vocabulary (49152), so a
/// broken cache shows as a large move either way.
const RANDOM_PPL_REL: f64 = 0.03;

/// The massive-K model at ctx 512 (4 chunks, one pass), KLD against the f16 cache, turbo
/// over q4_0 (which collapses there: KLD 6.41). Measured since balancing's clamp is
/// [1/64, 64] (2026-12-07): turbo4 0.0026x, turbo3 0.0103x, each about the unscaled model's
/// own KLD; with the old [1/8, 8] they were 0.0056x and 0.019x, twice that, which these
/// bounds (the measured ratios x 1.5) catch. The targets are 0.5x and 1.0x.
const TURBO4_VS_Q4_0: f64 = 0.004;
const TURBO3_VS_Q4_0: f64 = 0.015;
/// turbo PPL over the f16 cache's there: measured 1.012 (turbo4), 1.060 (turbo3); the issue
/// allows 1.5.
const PPL_VS_F16: f64 = 1.12;

/// A python with numpy and pyyaml for vendor/llama.cpp/gguf-py (the venv tests/memory.rs
/// makes, in the turboquant cache).
fn python() -> PathBuf {
    venv(
        turboquant::cache_dir::GGUF_PY_VENV,
        turboquant::cache_dir::GGUF_PY_PKGS,
    )
}

/// FNV-1a, 64 bits: a cache key that stays the same across Rust releases.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.iter().chain(b"\0") {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Runs scripts/`script` with `args` and `-o`/`--out` into target/test-models, once per
/// (both scripts' text, args): `name-<hash>.gguf`.
fn gguf(name: &str, script: &str, args: &[String]) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scripts: Vec<Vec<u8>> = ["random_gguf.py", "transform_gguf.py"]
        .iter()
        .map(|s| std::fs::read(root.join("scripts").join(s)).unwrap())
        .collect();
    let mut parts: Vec<&[u8]> = scripts.iter().map(|s| &s[..]).collect();
    parts.push(script.as_bytes());
    parts.extend(args.iter().map(|a| a.as_bytes()));
    let dir = root.join("target/test-models");
    let out = dir.join(format!("families-{name}-{:016x}.gguf", fnv(&parts)));
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !out.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = out.with_extension("partial");
        run_limited(
            Command::new(python())
                .env("PYTHONPATH", root.join("vendor/llama.cpp/gguf-py"))
                .arg(root.join("scripts").join(script))
                .args(args)
                .arg("-o")
                .arg(&tmp),
            Duration::from_secs(300),
            script,
        );
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// A random-weight model: scripts/random_gguf.py with `args` (tokenizer: SmolLM2's).
fn random(name: &str, args: &str) -> PathBuf {
    let mut a = vec![
        "--tokenizer-from".to_string(),
        model().display().to_string(),
    ];
    a.extend(args.split_whitespace().map(|s| s.to_string()));
    gguf(name, "random_gguf.py", &a)
}

/// The random-weight family models: (cache name, scripts/random_gguf.py arguments).
const GEMMA2: (&str, &str) = (
    "gemma2",
    "--arch gemma2 --head 128 --n-head 2 --n-head-kv 1 --n-layer 4 --n-ff 1024 --swa 128",
);
const GPT_OSS: (&str, &str) = (
    "gpt-oss",
    "--arch gpt-oss --head 64 --n-head 4 --n-head-kv 2 --n-layer 4 --n-ff 256 --swa 128",
);
const STABLELM: (&str, &str) = (
    "stablelm",
    "--arch stablelm --head 64 --n-head 4 --n-head-kv 4 --n-layer 4 --n-ff 1024",
);
const DEEPSEEK2: (&str, &str) = (
    "deepseek2",
    "--arch deepseek2 --head 128 --n-head 4 --n-layer 4 --n-ff 1024 --q-lora 128 --kv-lora 256 --rot 64",
);
const LLAMA_H512: (&str, &str) = (
    "llama-h512",
    "--arch llama --head 512 --n-head 1 --n-head-kv 1 --n-layer 4 --n-ff 1024",
);
const GRANITE: (&str, &str) = (
    "granitehybrid",
    "--arch granitehybrid --head 64 --n-head 8 --n-head-kv 2 --n-layer 6 --n-ff 1024 --d-state 128",
);
const LFM2: (&str, &str) = (
    "lfm2",
    "--arch lfm2 --head 64 --n-head 8 --n-head-kv 2 --n-layer 6 --n-ff 1024 --swa 1024 --l-cache 3",
);

fn random_family(f: (&str, &str)) -> PathBuf {
    random(f.0, f.1)
}

/// SmolLM2 with massive K channels: 2 RoPE pairs per KV head x 100 (Q x 1/100), and a
/// K bias of 100 x 4 on the lowest-frequency pair: `tq fetch smollm2-135m-k100b`, which
/// makes it with scripts/transform_gguf.py and checks its pinned sha256 (the model of the
/// results file's massive-K tables).
fn massive_k() -> PathBuf {
    let out = run(Command::new(bin("tq")).args(["fetch", "smollm2-135m-k100b"]));
    assert!(
        out.status.success(),
        "tq fetch smollm2-135m-k100b: {}",
        text(&out)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// One llama-perplexity run over the llama.cpp docs with K/V cache types `ct`; returns
/// its log (at -lv 4: the turbo K mean lines are there).
fn perplexity(m: &Path, ct: (&str, &str), ctx: u32, chunks: u32, extra: &[&str]) -> String {
    let t = Instant::now();
    let mut cmd = Command::new(bin("llama-perplexity"));
    cmd.arg("-m").arg(m).arg("-f").arg(corpus());
    cmd.args(["-c", &ctx.to_string(), "--chunks", &chunks.to_string()]);
    cmd.args([
        "-t", "2", "-fa", "on", "-lv", "4", "-ctk", ct.0, "-ctv", ct.1,
    ]);
    cmd.args(extra);
    let o = run_for(&mut cmd, 600);
    let log = text(&o);
    assert!(
        o.status.success(),
        "llama-perplexity {} -ctk {} -ctv {} failed ({}):\n{}",
        m.display(),
        ct.0,
        ct.1,
        o.status,
        tail(&log)
    );
    eprintln!(
        "{} -ctk {} -ctv {} -c {ctx} --chunks {chunks}: {:.1} s",
        m.file_name().unwrap().to_string_lossy(),
        ct.0,
        ct.1,
        t.elapsed().as_secs_f64()
    );
    log
}

fn tail(log: &str) -> String {
    // the debug lines (-lv 4) are many: the last lines without them
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains(" D ")).collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn final_ppl(log: &str) -> f64 {
    let p = number_after(log, "Final estimate: PPL =")
        .unwrap_or_else(|| panic!("no final PPL:\n{}", tail(log)));
    assert!(p.is_finite() && p > 0.0, "PPL {p}");
    p
}

/// The turbo K mean lines llama logged (one set per cache: iSWA models have two).
fn k_mean_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("turbo K mean")
                || l.contains("turbo exact first keys")
                || l.contains("turbo K/Q")
        })
        .map(|l| l[l.find("turbo").unwrap()..].to_string())
        .collect()
}

/// f16 against turbo4 K / turbo3 V at -c 256 --chunks 2: both run, PPL finite and close;
/// returns the turbo run's K mean lines and both PPLs.
fn family(m: &Path, ct: (&str, &str)) -> (Vec<String>, f64, f64) {
    let f16 = final_ppl(&perplexity(m, ("f16", "f16"), 256, 2, &[]));
    let log = perplexity(m, ct, 256, 2, &[]);
    let turbo = final_ppl(&log);
    let lines = k_mean_lines(&log);
    eprintln!(
        "f16 PPL {f16:.2}, {ct:?} PPL {turbo:.2}\n{}",
        lines.join("\n")
    );
    assert!(
        (turbo / f16 - 1.0).abs() <= RANDOM_PPL_REL,
        "{}: PPL {turbo} with {ct:?} against {f16} with f16",
        m.display()
    );
    (lines, f16, turbo)
}

const TURBO: (&str, &str) = ("turbo4", "turbo3");

fn has(lines: &[String], s: &str) -> bool {
    lines.iter().any(|l| l.contains(s))
}

/// The mean in RoPE's frame, on in every cache that holds layers, with the exact first keys.
fn assert_rope_frame(lines: &[String], caches: usize) {
    let n = |s: &str| lines.iter().filter(|l| l.contains(s)).count();
    assert_eq!(n("turbo K mean removal: on"), caches, "{lines:#?}");
    assert_eq!(n("turbo K mean in RoPE's frame: on"), caches, "{lines:#?}");
    assert_eq!(n("turbo exact first keys: on"), caches, "{lines:#?}");
    assert_eq!(n("turbo K/Q channel balancing: on"), caches, "{lines:#?}");
    assert!(!has(lines, "off here"), "{lines:#?}");
}

/// A random family model with turbo4 K / turbo3 V through family(), the K mean in RoPE's
/// frame on in each of its `caches` caches; returns the K mean lines.
fn rope_frame_family(f: (&str, &str), caches: usize) -> Vec<String> {
    let (lines, _, _) = family(&random_family(f), TURBO);
    assert_rope_frame(&lines, caches);
    lines
}

/// Gemma-2 style: attention logits soft-capped (50), every other layer a 128-token window.
#[test]
fn soft_capping_gemma2() {
    // the mean in RoPE's frame adds each key's share back before the cap: exact, so on
    rope_frame_family(GEMMA2, 2);
}

/// gpt-oss style: a learned sink logit per head, windowed layers, a small MoE.
#[test]
fn learned_sinks_gpt_oss() {
    // the sink logit is left untouched, the keys' raw logits restored: exact, so on
    rope_frame_family(GPT_OSS, 2);
}

/// StableLM style: RoPE on a quarter of each head (16 of 64 channels, NEOX). The K mean is
/// on: the 16 roped channels in RoPE's frame, the other 48 a plain mean whose q.mu the
/// same term adds back (tq_rf_pairs in ggml-ext/llama/tq-kmean-rope.h), balancing on.
#[test]
fn partial_rope_stablelm() {
    let lines = rope_frame_family(STABLELM, 1);
    assert!(
        has(
            &lines,
            "partial RoPE: the roped channels as with full RoPE, the others a plain mean"
        ),
        "{lines:#?}"
    );
    // turbo3 K as well (family() checks the PPL against f16's)
    family(&random_family(STABLELM), ("turbo3", "turbo3"));
}

/// DeepSeek-V2 style MLA (q_lora 128, kv_lora 256, 64 RoPE channels): the cache holds one
/// 320-wide latent K per token and no V (V is a view of K), so K and V must share a type.
/// It runs, with the K mean off: V is a view of K's latent part, so a mean taken out of K
/// would come out of V too (not a logit term); the reason is logged once.
/// (It was refused until tq_rot_init stopped judging the V type of a cache that stores no V.)
#[test]
fn mla_deepseek2() {
    let (lines, _, _) = family(&random_family(DEEPSEEK2), ("turbo4", "turbo4"));
    let off = "turbo K mean removal: off (MLA: V is a view of K's latent part";
    assert_eq!(
        lines.iter().filter(|l| l.contains(off)).count(),
        1,
        "{lines:#?}"
    );
}

/// 512-wide heads (Gemma-4-style global layers) on the llama arch.
#[test]
fn head_512_llama() {
    rope_frame_family(LLAMA_H512, 1);
}

/// Hybrids keep K/V only in their attention layers: 6 layers, attention at 2 and 5, the
/// rest recurrent. Granite-4.0-H style: Mamba-2 layers (R and S state) beside global
/// attention; the one KV cache gets the mean in RoPE's frame.
#[test]
fn hybrid_granite() {
    rope_frame_family(GRANITE, 1);
}

/// LFM2 style: short-conv layers (R state) beside attention layers that all slide (a window
/// of 1024), so llama.cpp's global cache holds no layer. Only the window cache decides and
/// logs a K mean (before 2026-12-07 the empty cache logged one too, for keys it never holds).
#[test]
fn hybrid_lfm2_all_layers_in_the_window() {
    rope_frame_family(LFM2, 1);
}

/// Every random family through llama-server with turbo caches: the model loads, a raw
/// completion of 16 tokens (end of text ignored: random weights) comes back whole, and the
/// log shows the turbo cache and what the K mean does there (MLA: turbo4 for K and V, which
/// share a type there, the mean off with its reason).
#[test]
fn every_family_serves_with_turbo_caches() {
    for (f, ct, k_mean) in [
        (GEMMA2, TURBO, "turbo K mean in RoPE's frame: on"),
        (GPT_OSS, TURBO, "turbo K mean in RoPE's frame: on"),
        (STABLELM, TURBO, "turbo K mean in RoPE's frame: on"),
        (
            DEEPSEEK2,
            ("turbo4", "turbo4"),
            "turbo K mean removal: off (MLA",
        ),
        (LLAMA_H512, TURBO, "turbo K mean in RoPE's frame: on"),
        (GRANITE, TURBO, "turbo K mean in RoPE's frame: on"),
        (LFM2, TURBO, "turbo K mean in RoPE's frame: on"),
    ] {
        let m = random_family(f);
        let srv = server::Server::start_model(
            &m,
            &[
                "-c", "1024", "-np", "1", "-fa", "on", "-ctk", ct.0, "-ctv", ct.1, "-lv", "4",
            ],
            &[],
        );
        let r = srv.post_ok(
            "/completion",
            &serde_json::json!({
                "prompt": "The cache of a language model holds",
                "n_predict": 16,
                "temperature": 0,
                "ignore_eos": true,
            }),
        );
        let log = srv.stop();
        let tail = &log[log.len().saturating_sub(3000)..];
        assert_eq!(r["tokens_predicted"], 16, "{}: {r}\n{tail}", f.0);
        assert!(
            log.contains(&format!("K ({}):", ct.0)) && log.contains(k_mean),
            "{}: {tail}",
            f.0
        );
        eprintln!("{}: llama-server with {ct:?}: 16 tokens", f.0);
    }
}

fn kld(log: &str) -> f64 {
    let k = number_after(log, "Mean    KLD:").unwrap_or_else(|| panic!("no KLD:\n{}", tail(log)));
    assert!(k.is_finite() && k >= 0.0, "KLD {k}");
    k
}

/// The massive-K SmolLM2 at ctx 512 (4 chunks, one pass): turbo's KLD against q4_0's.
#[test]
fn massive_k_channels_smollm2() {
    let m = massive_k();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-families-massive-k.kld");
    let base_s = base.to_str().unwrap();
    let f16 = final_ppl(&perplexity(
        &m,
        ("f16", "f16"),
        512,
        4,
        &["--kl-divergence-base", base_s],
    ));
    let run = |ct: &str| {
        let log = perplexity(
            &m,
            (ct, ct),
            512,
            4,
            &["--kl-divergence-base", base_s, "--kl-divergence"],
        );
        let ppl = number_after(&log, "Mean PPL(Q)").unwrap();
        (kld(&log), ppl, log)
    };
    let (q4, q4_ppl, _) = run("q4_0");
    let (t4, t4_ppl, log4) = run("turbo4");
    let (t3, t3_ppl, _) = run("turbo3");
    let _ = std::fs::remove_file(&base);
    eprintln!(
        "massive K, ctx 512 x 4: PPL f16 {f16:.3}, q4_0 {q4_ppl:.3}, turbo4 {t4_ppl:.3}, \
         turbo3 {t3_ppl:.3}; KLD q4_0 {q4:.4}, turbo4 {t4:.4} ({:.3}x), turbo3 {t3:.4} ({:.3}x)",
        t4 / q4,
        t3 / q4
    );
    assert_rope_frame(&k_mean_lines(&log4), 1);
    assert!(t4 <= TURBO4_VS_Q4_0 * q4, "turbo4 KLD {t4} vs q4_0 {q4}");
    assert!(t3 <= TURBO3_VS_Q4_0 * q4, "turbo3 KLD {t3} vs q4_0 {q4}");
    for (ct, p) in [("turbo4", t4_ppl), ("turbo3", t3_ppl)] {
        assert!(p <= PPL_VS_F16 * f16, "{ct} PPL {p} vs f16 {f16}");
    }
}

/// One chat completion (temperature 0) from llama-server with turbo4 K / turbo3 V on the
/// massive-K model returns text.
#[test]
fn massive_k_server_chat() {
    let m = massive_k();
    let srv = server::Server::start_model(
        &m,
        &[
            "-c", "2048", "-np", "1", "-fa", "on", "-ctk", "turbo4", "-ctv", "turbo3", "-lv", "4",
        ],
        &[],
    );
    let r = srv.post_ok(
        "/v1/chat/completions",
        &serde_json::json!({
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 24,
        }),
    );
    let text = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let log = srv.stop();
    eprintln!("massive-K model, turbo4/turbo3: {text:?}");
    assert!(!text.trim().is_empty(), "{r}");
    assert!(
        log.contains("turbo K mean in RoPE's frame: on"),
        "{}",
        &log[log.len().saturating_sub(3000)..]
    );
}
