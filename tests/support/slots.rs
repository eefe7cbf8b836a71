//! Slot helpers for the llama-server tests: a server with a slot save directory, greedy
//! token completions on a chosen slot, slot actions, and the layout of a saved turbo state
//! (where each layer's K-mean tag sits) for crafting corrupt files.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

use super::server::{Response, Server};

pub const TURBO: &[&str] = &["-ctk", "turbo4", "-ctv", "turbo3", "-fa", "on"];

pub fn slot_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tq-rel-slots-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// llama-server with turbo caches, `np` slots of 1024 tokens, slot files in `dir`.
pub fn slot_server(dir: &Path, np: usize, more: &[&str]) -> Server {
    slot_server_env(dir, np, more, &[])
}

/// `slot_server` with `env` set for the server (e.g. TQ_K_SINK=1: the exact first keys whatever the caller's environment says).
pub fn slot_server_env(dir: &Path, np: usize, more: &[&str], env: &[(&str, &str)]) -> Server {
    let c = (1024 * np).to_string();
    let np = np.to_string();
    let mut a: Vec<&str> = TURBO.to_vec();
    a.extend([
        "-c",
        &c,
        "-np",
        &np,
        "--cache-ram",
        "0",
        "--slot-save-path",
        dir.to_str().unwrap(),
    ]);
    a.extend(more);
    Server::start_env(&a, env)
}

pub fn tokens(srv: &Server, text: &str) -> Vec<u64> {
    let v = srv.post_ok("/tokenize", &json!({"content": text, "add_special": true}));
    token_ids(&v["tokens"])
}

/// A JSON array of token ids (`/tokenize`'s `tokens`, `/completion`'s with `return_tokens`).
pub fn token_ids(a: &Value) -> Vec<u64> {
    a.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|t| t.as_u64().expect("a token id"))
        .collect()
}

pub struct Completion {
    pub tokens: Vec<u64>,
    pub content: String,
    /// prompt tokens evaluated (the rest came from the slot's cache)
    pub prompt_n: u64,
    /// milliseconds spent generating the tokens
    pub predicted_ms: f64,
}

/// Greedy completion of a token prompt on `slot`, EOS ignored so that the length is fixed.
pub fn complete(srv: &Server, slot: usize, prompt: &[u64], n: u32) -> Completion {
    let v: Value = srv.post_ok(
        "/completion",
        &json!({"prompt": prompt, "n_predict": n, "temperature": 0, "seed": 7, "id_slot": slot,
                "cache_prompt": true, "return_tokens": true, "ignore_eos": true}),
    );
    let tokens = token_ids(&v["tokens"]);
    assert_eq!(tokens.len(), n as usize, "{v}");
    Completion {
        tokens,
        content: v["content"].as_str().unwrap().to_string(),
        prompt_n: v["timings"]["prompt_n"].as_u64().unwrap(),
        predicted_ms: v["timings"]["predicted_ms"].as_f64().unwrap_or(0.0),
    }
}

pub fn slot_action(srv: &Server, slot: usize, action: &str, file: &str) -> Response {
    srv.request(
        "POST",
        &format!("/slots/{slot}?action={action}"),
        &json!({"filename": file}).to_string(),
    )
    .unwrap_or_else(|e| panic!("{action} {file}: no answer ({e}):\n{}", srv.log_tail()))
}

pub fn slot_ok(srv: &Server, slot: usize, action: &str, file: &str) -> Value {
    let r = slot_action(srv, slot, action, file);
    assert_eq!(r.code, 200, "{action} {file}: {}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

pub fn u32_at(b: &[u8], o: usize) -> usize {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize
}

/// Where the per-layer K-mean records of a saved single-stream turbo-K state lie.
pub struct TurboState {
    /// offset of each layer's tag; the f32 values follow it
    pub tags: Vec<usize>,
    /// f32 values after each tag: m (n), then s - 1 (n) with K/Q balancing
    pub n_values: usize,
    /// offset of each layer's exact first keys (tag "TQS2", entry count u32, floats per
    /// row u64, then per entry the saved cell's index u32 and its f32 row), where the state
    /// has them
    pub sinks: Vec<usize>,
}

/// Walks a slot file: server token header, then llama's seq state (stream count, cell
/// count, cells of pos / n_seq_id / one seq id, v_trans, n_layer, then per layer: K type,
/// K row size, the K rows, the turbo tag and values, the exact first keys).
pub fn turbo_state_layout(f: &[u8]) -> TurboState {
    let n_tok = u32_at(f, 8);
    let kv = 12 + 4 * n_tok;
    assert_eq!(u32_at(f, kv), 1, "one stream");
    let cells = u32_at(f, kv + 4);
    let mut o = kv + 8 + cells * 12;
    let n_layer = u32_at(f, o + 4);
    o += 8;
    let mut tags = Vec::new();
    let mut sinks = Vec::new();
    let mut n_values = 0;
    for il in 0..n_layer {
        assert_eq!(u32_at(f, o), 98, "layer {il}: K type turbo4 at {o}");
        let row = u64::from_le_bytes(f[o + 4..o + 12].try_into().unwrap()) as usize;
        o += 12 + cells * row;
        let tag = &f[o..o + 4];
        // the fitted mean (TQ?2) or the mean in RoPE's frame (TQ?F); B: with balancing
        assert!(
            [b"TQB2", b"TQM2", b"TQBF", b"TQMF"].contains(&tag.try_into().unwrap()),
            "layer {il}: no K-mean tag at {o}: {tag:?}"
        );
        // 34-byte turbo4 blocks of 64 values: the row holds n_embd_k_gqa values
        let n = row / 34 * 64;
        n_values = if tag[2] == b'B' { 2 * n } else { n };
        tags.push(o);
        o += 4 + 4 * n_values;
        if &f[o..o + 4] == b"TQS2" {
            let entries = u32_at(f, o + 4);
            let row_f = u64::from_le_bytes(f[o + 8..o + 16].try_into().unwrap()) as usize;
            assert_eq!(
                row_f, n,
                "layer {il}: an exact first key has n_embd_k_gqa floats"
            );
            sinks.push(o);
            o += 16 + entries * (4 + 4 * row_f);
        }
    }
    TurboState {
        tags,
        n_values,
        sinks,
    }
}
