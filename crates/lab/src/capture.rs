//! The capture file `tq capture` writes and every lab command reads: b"TQKVCAP1", u32 LE
//! header length, JSON header, then per layer K, V, Q as little-endian f16, each
//! `[n_tokens][heads][head_dim]` (token-major, the order of the model's own tensors).
//!
//! Invariant: a capture read back is the one written, value for value (the values are f16,
//! what an f16 KV cache holds); a file that is not one, has a header this version does not
//! read, or holds fewer or more data bytes than its header says is refused with the reason.

use half::f16;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

/// First 8 bytes of a capture file.
pub const MAGIC: &[u8; 8] = b"TQKVCAP1";

/// What a capture holds. Every layer has the same shape.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CaptureHeader {
    /// format version (1)
    pub version: u32,
    /// the GGUF it came from
    pub model: String,
    /// llama.cpp's model description (`llama_model_desc`)
    pub desc: String,
    /// the text file
    pub text: String,
    pub n_tokens: usize,
    pub n_layer: usize,
    /// query heads
    pub n_head: usize,
    /// KV heads
    pub n_head_kv: usize,
    pub head_k: usize,
    pub head_v: usize,
    /// always "f16": what an f16 KV cache holds
    pub dtype: String,
    /// K/Q: post-RoPE (the last `Kcur-<il>` / `Qcur-<il>` of llama.cpp's graph), V: `Vcur-<il>`
    pub note: String,
    /// The model's RoPE as llama.cpp's K mean uses it; absent in captures made before it was
    /// recorded (the lab then falls back to the plain first-ubatch mean, and says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope: Option<RopeInfo>,
}

/// RoPE frequencies per layer, from llama.cpp itself (`tq_llama_rope_freqs`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RopeInfo {
    /// pair i is channels (i, i + n/2) (NEOX) rather than (2i, 2i + 1)
    pub neox: bool,
    /// per layer, the angle per position of each channel pair (empty: no RoPE handled)
    pub freqs: Vec<Vec<f64>>,
}

/// A capture in memory: per layer, `[n_tokens][n_head_kv][head_k]` keys, the same for
/// values, `[n_tokens][n_head][head_k]` queries.
#[derive(Clone, Debug, PartialEq)]
pub struct Capture {
    pub header: CaptureHeader,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub q: Vec<Vec<f32>>,
}

/// Why a capture file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: not a tq capture file (no TQKVCAP1 magic; make one with `tq capture`)")]
    Magic(String),
    #[error("{0}: bad capture header: {1}")]
    Header(String, String),
    #[error("{0}: truncated capture file: expected {1} data bytes, found {2}")]
    Truncated(String, u64, u64),
}

impl Capture {
    /// Values per layer of K, V and Q.
    pub fn layer_lens(h: &CaptureHeader) -> [usize; 3] {
        [
            h.n_tokens * h.n_head_kv * h.head_k,
            h.n_tokens * h.n_head_kv * h.head_v,
            h.n_tokens * h.n_head * h.head_k,
        ]
    }

    fn check(h: &CaptureHeader) -> Result<(), String> {
        if h.version != 1 || h.dtype != "f16" {
            return Err(format!(
                "version {} dtype {} (this tq reads version 1, f16)",
                h.version, h.dtype
            ));
        }
        if h.n_tokens == 0 || h.n_layer == 0 || h.n_head_kv == 0 || h.head_k == 0 || h.head_v == 0 {
            return Err("empty shape".into());
        }
        if !h.n_head.is_multiple_of(h.n_head_kv) {
            return Err(format!(
                "n_head {} is not a multiple of n_head_kv {}",
                h.n_head, h.n_head_kv
            ));
        }
        Ok(())
    }

    pub fn write(&self, path: &Path) -> Result<(), CaptureError> {
        let io = |source| CaptureError::Io {
            path: path.display().to_string(),
            source,
        };
        let f = std::fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::new(f);
        let json = serde_json::to_vec(&self.header).expect("header serializes");
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&(json.len() as u32).to_le_bytes())
            .map_err(io)?;
        w.write_all(&json).map_err(io)?;
        let mut buf = Vec::new();
        for l in 0..self.header.n_layer {
            for t in [&self.k[l], &self.v[l], &self.q[l]] {
                buf.clear();
                buf.extend(t.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()));
                w.write_all(&buf).map_err(io)?;
            }
        }
        w.flush().map_err(io)
    }

    /// Only the header (cheap).
    pub fn read_header(path: &Path) -> Result<CaptureHeader, CaptureError> {
        let mut f = open(path)?;
        read_header_from(path, &mut f)
    }

    pub fn read(path: &Path) -> Result<Capture, CaptureError> {
        let p = path.display().to_string();
        let mut f = open(path)?;
        let header = read_header_from(path, &mut f)?;
        let lens = Self::layer_lens(&header);
        let need = 2 * header.n_layer as u64 * lens.iter().sum::<usize>() as u64;
        let mut data = Vec::new();
        f.read_to_end(&mut data)
            .map_err(|source| CaptureError::Io {
                path: p.clone(),
                source,
            })?;
        if data.len() as u64 != need {
            return Err(CaptureError::Truncated(p, need, data.len() as u64));
        }
        let mut off = 0;
        let mut take = |n: usize| {
            let v: Vec<f32> = data[off..off + 2 * n]
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect();
            off += 2 * n;
            v
        };
        let (mut k, mut v, mut q) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..header.n_layer {
            k.push(take(lens[0]));
            v.push(take(lens[1]));
            q.push(take(lens[2]));
        }
        Ok(Capture { header, k, v, q })
    }

    /// Key of token `t`, KV head `h`, layer `l`.
    pub fn key(&self, l: usize, t: usize, h: usize) -> &[f32] {
        let d = self.header.head_k;
        let o = (t * self.header.n_head_kv + h) * d;
        &self.k[l][o..o + d]
    }
    pub fn value(&self, l: usize, t: usize, h: usize) -> &[f32] {
        let d = self.header.head_v;
        let o = (t * self.header.n_head_kv + h) * d;
        &self.v[l][o..o + d]
    }
    /// Query of token `t`, query head `h`.
    pub fn query(&self, l: usize, t: usize, h: usize) -> &[f32] {
        let d = self.header.head_k;
        let o = (t * self.header.n_head + h) * d;
        &self.q[l][o..o + d]
    }
}

/// The vectors of head `h` of token-major `[token][n_heads][d]` rows, as `[token][d]`.
pub fn one_head(rows: &[f32], n_heads: usize, h: usize, d: usize) -> Vec<f32> {
    rows.chunks_exact(n_heads * d)
        .flat_map(|t| t[h * d..(h + 1) * d].iter().copied())
        .collect()
}

fn open(path: &Path) -> Result<std::fs::File, CaptureError> {
    std::fs::File::open(path).map_err(|source| CaptureError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn read_header_from(path: &Path, f: &mut std::fs::File) -> Result<CaptureHeader, CaptureError> {
    let p = path.display().to_string();
    let io = |source| CaptureError::Io {
        path: p.clone(),
        source,
    };
    let mut magic = [0u8; 12];
    if f.read_exact(&mut magic).is_err() || &magic[..8] != MAGIC {
        return Err(CaptureError::Magic(p));
    }
    let n = u32::from_le_bytes(magic[8..12].try_into().unwrap()) as usize;
    if n > 1 << 20 {
        return Err(CaptureError::Header(p, format!("header length {n}")));
    }
    let mut json = vec![0u8; n];
    f.read_exact(&mut json).map_err(io)?;
    let h: CaptureHeader = serde_json::from_slice(&json)
        .map_err(|e| CaptureError::Header(p.clone(), e.to_string()))?;
    Capture::check(&h).map_err(|e| CaptureError::Header(p, e))?;
    Ok(h)
}
