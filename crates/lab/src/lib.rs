//! The lab behind `tq capture / rotation-stats / kv-norms / distortion / niah / recommend`:
//! the capture file format, the cache codecs as llama.cpp applies them (rotation included),
//! moments, the needle proxy and attention-output error. Pure Rust on `f32` slices; the
//! capture itself (llama.cpp's eval callback) lives in the `tq` binary.

use half::f16;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;
use turboquant_codec::rotation::{self, SplitMix64, DEFAULT_SEED};
use turboquant_codec::tcq::TcqType;
use turboquant_codec::TqType;

// ---------------------------------------------------------------------------------------
// Capture file: b"TQKVCAP1", u32 LE header length, JSON header, then per layer K, V, Q as
// little-endian f16, each `[n_tokens][heads][head_dim]` (token-major, the order of the
// model's own tensors).

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

// ---------------------------------------------------------------------------------------
// Moments

/// Mean, standard deviation and (Pearson, non-excess) kurtosis `E[(x-μ)^4] / σ^4`,
/// accumulated in f64. A Gaussian has kurtosis 3.
#[derive(Clone, Copy, Debug, Default)]
pub struct Moments {
    n: f64,
    s1: f64,
    s2: f64,
    s3: f64,
    s4: f64,
}

impl Moments {
    pub fn push(&mut self, x: f64) {
        let x2 = x * x;
        self.n += 1.0;
        self.s1 += x;
        self.s2 += x2;
        self.s3 += x2 * x;
        self.s4 += x2 * x2;
    }
    pub fn extend(&mut self, xs: &[f32]) {
        for &x in xs {
            self.push(x as f64);
        }
    }
    /// Adds the samples of `o` (the sums are plain power sums).
    pub fn merge(&mut self, o: &Moments) {
        self.n += o.n;
        self.s1 += o.s1;
        self.s2 += o.s2;
        self.s3 += o.s3;
        self.s4 += o.s4;
    }
    pub fn count(&self) -> f64 {
        self.n
    }
    pub fn mean(&self) -> f64 {
        self.s1 / self.n
    }
    pub fn std(&self) -> f64 {
        let m = self.mean();
        (self.s2 / self.n - m * m).max(0.0).sqrt()
    }
    pub fn kurtosis(&self) -> f64 {
        let m = self.mean();
        let (e2, e3, e4) = (self.s2 / self.n, self.s3 / self.n, self.s4 / self.n);
        let c2 = e2 - m * m;
        let c4 = e4 - 4.0 * m * e3 + 6.0 * m * m * e2 - 3.0 * m.powi(4);
        c4 / (c2 * c2)
    }
}

/// Kurtosis of one coordinate of a uniform unit vector in R^d: `3d / (d + 2)` (3 as d → ∞).
pub fn sphere_kurtosis(d: usize) -> f64 {
    3.0 * d as f64 / (d as f64 + 2.0)
}

/// `p`-quantile (0..=1) of `xs` (sorted copy, nearest rank).
pub fn quantile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((p * (v.len() - 1) as f64).round() as usize).min(v.len() - 1);
    v[i]
}

pub fn norm(x: &[f32]) -> f64 {
    x.iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt()
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // four partial sums: vectorizes, and is what a kernel would do
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    let mut t: f32 = s.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        t += x * y;
    }
    t
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 || nb == 0.0 {
        return if na == nb { 1.0 } else { 0.0 };
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 * y as f64)
        .sum::<f64>()
        / (na * nb)
}

// ---------------------------------------------------------------------------------------
// Rotations, as llama.cpp applies them to a head

/// Size of llama.cpp's K rotation for a head of `head` values: the largest power of two
/// dividing it (64 → 64, 128 → 128, 256 → 256); `None` when the head is not a multiple of 64
/// (no rotation, no turbo).
pub fn rot_dim_k(head: usize) -> Option<usize> {
    head.is_multiple_of(64).then(|| 1 << head.trailing_zeros())
}

/// Size of llama.cpp's V rotation: always 64 (upstream found smaller is better for V).
pub fn rot_dim_v(head: usize) -> Option<usize> {
    head.is_multiple_of(64).then_some(64)
}

/// Which rotation: the seeded `R = D H D / sqrt(n)` of turbo caches, or upstream's plain
/// `H / sqrt(n)` that llama.cpp uses for every other quantized cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotation {
    None,
    Plain,
    Seeded,
}

/// Applies the rotation (an involution in both cases) to every `dim` chunk of `x`.
pub fn apply_rotation(rot: Rotation, dim: usize, x: &mut [f32]) {
    match rot {
        Rotation::None => {}
        Rotation::Seeded => rotation::rotate(dim, DEFAULT_SEED, x).expect("power-of-two chunks"),
        Rotation::Plain => {
            let f = rotation::norm_factor(dim);
            for c in x.chunks_exact_mut(dim) {
                rotation::fwht(c);
                c.iter_mut().for_each(|v| *v *= f);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Codecs

/// A KV-cache type as the lab simulates it: f16 (the reference; the captured values are
/// already f16, so it is the identity on them), ggml's reference q8_0 / q4_0 quantizers
/// re-implemented in Rust (`quantize_row_q8_0_ref` / `quantize_row_q4_0_ref` of
/// ggml-quants.c, fp16 scale), and the turbo types through this crate's encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// no quantization at all (for tests and as a sanity row)
    Identity,
    F16,
    Q8_0,
    Q4_0,
    Turbo(TqType),
    /// the trellis-coded types (turbo3_tcq, turbo2_tcq)
    Tcq(TcqType),
}

impl Codec {
    pub const ALL: [Codec; 8] = [
        Codec::F16,
        Codec::Q8_0,
        Codec::Q4_0,
        Codec::Turbo(TqType::Turbo4),
        Codec::Turbo(TqType::Turbo3),
        Codec::Turbo(TqType::Turbo2),
        Codec::Tcq(TcqType::Turbo3Tcq),
        Codec::Tcq(TcqType::Turbo2Tcq),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Codec::Identity => "identity",
            Codec::F16 => "f16",
            Codec::Q8_0 => "q8_0",
            Codec::Q4_0 => "q4_0",
            Codec::Turbo(t) => t.name(),
            Codec::Tcq(t) => t.name(),
        }
    }

    pub fn parse(s: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == s)
    }

    pub fn bits_per_value(self) -> f64 {
        match self {
            Codec::Identity => 32.0,
            Codec::F16 => 16.0,
            Codec::Q8_0 => 8.5,
            Codec::Q4_0 => 4.5,
            Codec::Turbo(t) => t.traits().bits_per_value(),
            Codec::Tcq(t) => t.traits().bits_per_value(),
        }
    }

    /// Index bits (2/3/4 for turbo; for the 4^-b bound and the Lloyd-Max optimum).
    pub fn index_bits(self) -> Option<u32> {
        match self {
            Codec::Turbo(t) => Some(t.bits()),
            _ => None,
        }
    }

    /// The rotation llama.cpp applies before this cache type (none for f16).
    pub fn rotation(self) -> Rotation {
        match self {
            Codec::Identity | Codec::F16 => Rotation::None,
            Codec::Q8_0 | Codec::Q4_0 => Rotation::Plain,
            Codec::Turbo(_) | Codec::Tcq(_) => Rotation::Seeded,
        }
    }

    /// Quantize + dequantize `x` (whole rows, rotated first with `rot_dim`, rotated back
    /// after, as the cache sees them) into `out`.
    pub fn roundtrip(self, rot_dim: usize, x: &[f32], out: &mut [f32]) {
        out.copy_from_slice(x);
        let rot = self.rotation();
        apply_rotation(rot, rot_dim, out);
        match self {
            Codec::Identity => {}
            Codec::F16 => out.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32()),
            Codec::Q8_0 => out.chunks_exact_mut(32).for_each(q8_0_roundtrip),
            Codec::Q4_0 => out.chunks_exact_mut(32).for_each(q4_0_roundtrip),
            Codec::Turbo(t) => {
                let mut bytes = vec![0u8; out.len() / 64 * t.block_bytes()];
                turboquant_codec::quantize(t, out, &mut bytes).expect("whole blocks");
                turboquant_codec::dequantize(t, &bytes, out).expect("whole blocks");
            }
            Codec::Tcq(t) => {
                let mut bytes = vec![0u8; out.len() / 64 * t.block_bytes()];
                turboquant_codec::tcq::codec::quantize_thread_scratch(t, out, &mut bytes)
                    .expect("whole blocks");
                turboquant_codec::tcq::codec::dequantize(t, &bytes, out).expect("whole blocks");
            }
        }
        apply_rotation(rot, rot_dim, out);
    }
}

fn fp16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// ggml's `quantize_row_q8_0_ref` + `dequantize_row_q8_0` on one block of 32.
pub fn q8_0_roundtrip(x: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let dh = fp16_round(d);
    for v in x.iter_mut() {
        let q = (*v * id).round() as i8; // C roundf: half away from zero, like f32::round
        *v = q as f32 * dh;
    }
}

/// ggml's `quantize_row_q4_0_ref` + `dequantize_row_q4_0` on one block of 32.
pub fn q4_0_roundtrip(x: &mut [f32]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x.iter() {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let dh = fp16_round(d);
    for v in x.iter_mut() {
        let q = ((*v * id + 8.5) as i8).min(15); // C: MIN(15, (int8_t)(x + 8.5f))
        *v = (q as i32 - 8) as f32 * dh;
    }
}

/// The codec rounds every row of `rows` (each `dim` long) with rotation size `rot_dim`.
pub fn roundtrip_rows(codec: Codec, dim: usize, rot_dim: usize, rows: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; rows.len()];
    for (x, y) in rows.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        codec.roundtrip(rot_dim, x, y);
    }
    out
}

// ---------------------------------------------------------------------------------------
// K mean removal (llama.cpp's turbo K caches, ggml-ext/llama/tq-kmean.h)

/// Keys of the first ubatch at llama.cpp's default `-ub 512`: the K mean is their mean.
pub const K_MEAN_TOKENS: usize = 512;
/// llama.cpp's `TQ_KMEAN_MIN_TOKENS`: a first ubatch smaller than this leaves m = 0 (where the
/// first key is not kept exact; the lab does not model that key, tq-sink.h).
pub const K_MEAN_MIN_TOKENS: usize = 32;

impl Codec {
    /// Whether llama.cpp stores `k - m` instead of `k` in a K cache of this type (the
    /// turbo types, trellis-coded ones included, unless the K mean is turned off).
    pub fn removes_k_mean(self) -> bool {
        matches!(self, Codec::Turbo(_) | Codec::Tcq(_))
    }
}

/// The K mean of llama.cpp's turbo caches for token-major `[token][n_heads][dim]` keys, as
/// `[n_heads][dim]`: per head, the mean of the first `min(first, n)` tokens (the first
/// ubatch written into an empty cache, `first` = the ubatch size); zero when that is fewer
/// than [`K_MEAN_MIN_TOKENS`] tokens, as llama.cpp does.
pub fn k_mean(rows: &[f32], n_heads: usize, dim: usize, first: usize) -> Vec<f32> {
    let w = n_heads * dim;
    let n = (rows.len() / w).min(first);
    if n < K_MEAN_MIN_TOKENS {
        return vec![0.0; w];
    }
    let mut s = vec![0f64; w];
    for t in rows.chunks_exact(w).take(n) {
        for (a, &x) in s.iter_mut().zip(t) {
            *a += x as f64;
        }
    }
    s.iter().map(|&a| (a / n as f64) as f32).collect()
}

/// The K mean llama.cpp's turbo caches use when the cache holds `n_pos` positions
/// (tq-kmean.h): the first-ubatch mean `kbar` of [`k_mean`] (positions `0..first`) mapped
/// per RoPE pair of angular frequency `w[i]` by `F = a_N conj(a_B) / max(|a_B|², |a_N||a_B|)`,
/// `a_X` the mean of `e^{ipw}` over the positions of X. The map is what carries a mean fitted
/// at positions 0..511 to keys at any position; `w` empty leaves `kbar` as it is.
/// `m` is `[n_heads][dim]`, changed in place.
pub fn rope_fit_mean(m: &mut [f32], dim: usize, w: &[f64], neox: bool, first: usize, n_pos: usize) {
    let b = first.min(n_pos);
    if b == 0 || n_pos == 0 {
        return;
    }
    let half = w.len().min(dim / 2);
    for (i, &wi) in w.iter().enumerate().take(half) {
        let mean_exp = |n: usize| -> (f64, f64) {
            // mean of e^{ipw} over p < n, by the geometric sum (1 as w -> 0 mod 2 pi)
            let (zr, zi) = (1.0 - wi.cos(), -wi.sin());
            let den = n as f64 * (zr * zr + zi * zi);
            if (zr * zr + zi * zi).sqrt() < 1e-12 {
                return (1.0, 0.0);
            }
            let (nr, ni) = (1.0 - (wi * n as f64).cos(), -(wi * n as f64).sin());
            // (nr + i ni) / (n (zr + i zi))
            ((nr * zr + ni * zi) / den, (ni * zr - nr * zi) / den)
        };
        let (nr, ni) = mean_exp(n_pos);
        let (br, bi) = mean_exp(b);
        let (an, ab2) = ((nr * nr + ni * ni).sqrt(), br * br + bi * bi);
        let den = ab2.max(an * ab2.sqrt());
        // F = a_N conj(a_B) / den
        let (fr, fi) = if den > 0.0 {
            ((nr * br + ni * bi) / den, (ni * br - nr * bi) / den)
        } else {
            (0.0, 0.0)
        };
        let (a, c) = rope_pair(neox, dim, i);
        for h in m.chunks_exact_mut(dim) {
            let (x, y) = (h[a] as f64, h[c] as f64);
            h[a] = (fr * x - fi * y) as f32;
            h[c] = (fi * x + fr * y) as f32;
        }
    }
}

/// `rows - m` with `m` repeated over every `m.len()`-long chunk (a token of
/// `[token][n_heads][dim]` rows and the `[n_heads][dim]` mean of [`k_mean`]).
pub fn sub_mean(rows: &[f32], m: &[f32]) -> Vec<f32> {
    let mut out = rows.to_vec();
    for t in out.chunks_exact_mut(m.len()) {
        for (x, &a) in t.iter_mut().zip(m) {
            *x -= a;
        }
    }
    out
}

/// What a K cache of type `codec` gives back for the keys `rows` (`[token][n_heads][dim]`,
/// `m` their `[n_heads][dim]` K mean, `None` for no mean removal): `dequant(quant(k - m))`
/// when the codec removes the K mean (turbo), else `dequant(quant(k))`. The former is in the
/// shifted frame, as in llama.cpp: logits `q·k̂` are off by `-q·m`, the same for every key of
/// a query, so softmax and the top-1 are as if `m` were added back.
pub fn roundtrip_keys(
    codec: Codec,
    dim: usize,
    rot_dim: usize,
    rows: &[f32],
    m: Option<&[f32]>,
) -> Vec<f32> {
    match m {
        Some(m) if codec.removes_k_mean() => {
            roundtrip_rows(codec, dim, rot_dim, &sub_mean(rows, m))
        }
        _ => roundtrip_rows(codec, dim, rot_dim, rows),
    }
}

// ---------------------------------------------------------------------------------------
// K mean in RoPE's frame (llama.cpp's default with the model on the CPU,
// ggml-ext/llama/tq-kmean-rope.h)

/// Channels `(a, b)` of RoPE pair `i` in a head of `dim` values: `(i, i + dim/2)` for NEOX,
/// `(2i, 2i + 1)` otherwise (tq-kmean-rope.h's `tq_rf_ch`).
pub fn rope_pair(neox: bool, dim: usize, i: usize) -> (usize, usize) {
    if neox {
        (i, i + dim / 2)
    } else {
        (2 * i, 2 * i + 1)
    }
}

/// One layer's RoPE as the mean in RoPE's frame needs it: the angle per position `w[i]` of
/// each channel pair (the capture's `RopeInfo::freqs[l]`) and the pairing.
#[derive(Clone, Copy, Debug)]
pub struct RopeFrame<'a> {
    pub w: &'a [f64],
    pub neox: bool,
}

impl RopeFrame<'_> {
    /// Whether llama.cpp keeps the mean in RoPE's frame for a head of `dim`: only with full
    /// RoPE, one frequency per pair (`tq_kmean_rope_setup`); else the cache keeps the fitted mean.
    pub fn full(&self, dim: usize) -> bool {
        !self.w.is_empty() && self.w.len() * 2 == dim
    }

    /// `x <- R_p x` (or `R_p^{-1} x` with `inverse`) for every `dim` chunk of `x`. cos/sin
    /// are taken in f64 and rounded to f32, the rotation done in f32, as llama.cpp's table
    /// (`tq_kmean_rope_fill`) and `tq_rf_rotate_mean_op` / `tq_rf_unrope_mean` do.
    pub fn rotate(&self, x: &mut [f32], dim: usize, p: usize, inverse: bool) {
        let sign = if inverse { -1.0 } else { 1.0 };
        for (i, &wi) in self.w.iter().enumerate().take(dim / 2) {
            let a = p as f64 * wi;
            let (c, s) = (a.cos() as f32, sign * a.sin() as f32);
            let (ca, cb) = rope_pair(self.neox, dim, i);
            for h in x.chunks_exact_mut(dim) {
                let (u, v) = (h[ca], h[cb]);
                h[ca] = c * u - s * v;
                h[cb] = s * u + c * v;
            }
        }
    }

    /// [`RopeFrame::rotate`] on token-major rows `[token][n_heads][dim]`, token `t` at
    /// position `p0 + t`.
    pub fn rotate_rows(
        &self,
        rows: &mut [f32],
        n_heads: usize,
        dim: usize,
        p0: usize,
        inverse: bool,
    ) {
        for (t, tok) in rows.chunks_exact_mut(n_heads * dim).enumerate() {
            self.rotate(tok, dim, p0 + t, inverse);
        }
    }
}

/// The pre-RoPE K mean `mu` (`[n_heads][dim]`) of llama.cpp's cache in RoPE's frame: the
/// mean of `R_p^{-1} k_p` over the first `min(first, n)` tokens of `rows`
/// (`[token][n_heads][dim]`, token `t` at position `t`), zero under [`K_MEAN_MIN_TOKENS`]
/// tokens ([`k_mean`] on the un-roped keys). A component common to the keys before RoPE
/// comes back whole here, at any frequency, where the post-RoPE mean averages it away.
pub fn unrope_mean(
    rows: &[f32],
    n_heads: usize,
    dim: usize,
    rope: RopeFrame,
    first: usize,
) -> Vec<f32> {
    let w = n_heads * dim;
    let n = (rows.len() / w).min(first);
    let mut un = rows[..n * w].to_vec();
    rope.rotate_rows(&mut un, n_heads, dim, 0, true);
    k_mean(&un, n_heads, dim, first)
}

/// `R_p mu` for `n` tokens at positions `p0..p0 + n`, as `[token][n_heads][dim]` rows (`mu`
/// `[n_heads][dim]`): what the cache subtracts from each key and adds back to its logit.
pub fn rope_mean_rows(mu: &[f32], dim: usize, rope: RopeFrame, p0: usize, n: usize) -> Vec<f32> {
    let mut out = mu.repeat(n);
    rope.rotate_rows(&mut out, mu.len() / dim, dim, p0, false);
    out
}

/// A key cache in RoPE's frame around any quantizer: `quant` gets the stored quantity
/// `k_p - R_p mu` (rows at positions `p0..`) and its output gets `R_p mu` back, so the
/// result is in the keys' own frame: llama.cpp adds `q·R_p mu` to each logit exactly, and
/// `q·(quant(k_p - R_p mu) + R_p mu)` is that logit. Separate from the codec so that a
/// lossless `quant` can check the frame arithmetic alone.
pub fn through_rope_frame(
    rows: &[f32],
    mu: &[f32],
    dim: usize,
    rope: RopeFrame,
    p0: usize,
    quant: impl FnOnce(&[f32]) -> Vec<f32>,
) -> Vec<f32> {
    let rm = rope_mean_rows(mu, dim, rope, p0, rows.len() / mu.len());
    let mut y = quant(&sub_mean(rows, &rm));
    y.iter_mut().zip(&rm).for_each(|(v, &r)| *v += r);
    y
}

/// The K mean a turbo K cache removes, in one of llama.cpp's two frames.
#[derive(Clone, Copy, Debug)]
pub enum KMean<'a> {
    /// One fixed vector per head (`[n_heads][dim]`): tq-kmean.h's fitted mean
    /// ([`rope_fit_mean`]), or the plain first-ubatch mean. The cache stores `k - m` and
    /// reconstructions stay in that shifted frame (see [`roundtrip_keys`]).
    Fixed(&'a [f32]),
    /// The pre-RoPE mean `mu` ([`unrope_mean`]): the key at position p stores `k_p - R_p mu`
    /// and attention adds `q·R_p mu` back per key; reconstructions are in the keys' frame.
    Rope { mu: &'a [f32], rope: RopeFrame<'a> },
}

impl KMean<'_> {
    /// What each key of `rows` (`[token][n_heads][dim]`, positions `p0..`) has taken off:
    /// `m` (which [`sub_mean`] repeats over the tokens) or `R_p mu` per token, so that
    /// `sub_mean(rows, &removed)` is what the cache quantizes in either frame.
    pub fn removed(&self, dim: usize, rows_len: usize, p0: usize) -> Vec<f32> {
        match *self {
            KMean::Fixed(m) => m.to_vec(),
            KMean::Rope { mu, rope } => rope_mean_rows(mu, dim, rope, p0, rows_len / mu.len()),
        }
    }

    /// What a K cache of type `codec` gives back for `rows` at positions `p0..`, in a frame
    /// where softmax and argmax over `q·k̂` are those of llama.cpp's attention (non-turbo
    /// codecs keep `k`, as llama.cpp).
    pub fn roundtrip(
        &self,
        codec: Codec,
        dim: usize,
        rot_dim: usize,
        rows: &[f32],
        p0: usize,
    ) -> Vec<f32> {
        match *self {
            KMean::Fixed(m) => roundtrip_keys(codec, dim, rot_dim, rows, Some(m)),
            KMean::Rope { .. } if !codec.removes_k_mean() => {
                roundtrip_rows(codec, dim, rot_dim, rows)
            }
            KMean::Rope { mu, rope } => through_rope_frame(rows, mu, dim, rope, p0, |x| {
                roundtrip_rows(codec, dim, rot_dim, x)
            }),
        }
    }
}

/// Distortion per unit-norm vector of the `b`-bit Lloyd-Max quantizer for one coordinate
/// of a uniform point on S^63 (what the turbo codebooks are), and the implied cosine
/// `sqrt(1 - D)` (the optimum's reconstruction is shorter than the input: E x·x̂ = E|x̂|²).
pub fn lloyd_max_distortion(bits: u32) -> f64 {
    turboquant_codec::codebook::lloyd_max(turboquant_codec::codebook::Density::Exact, 64, bits)
        .distortion()
}

/// The information-theoretic lower bound on distortion per unit-norm vector, `4^-b`.
pub fn lower_bound(bits: u32) -> f64 {
    4f64.powi(-(bits as i32))
}

// ---------------------------------------------------------------------------------------
// Attention

/// Softmax of `s` in place (max-subtracted, f64 sum).
pub fn softmax(s: &mut [f32]) {
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut z = 0f64;
    for v in s.iter_mut() {
        *v = (*v - m).exp();
        z += *v as f64;
    }
    let iz = (1.0 / z) as f32;
    s.iter_mut().for_each(|v| *v *= iz);
}

pub fn argmax(s: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in s.iter().enumerate() {
        if v > s[best] {
            best = i;
        }
    }
    best
}

/// `Σ_j p_j rows_j` (rows `dim` long).
pub fn weighted_sum(p: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for (&w, r) in p.iter().zip(rows.chunks_exact(dim)) {
        if w != 0.0 {
            for (o, &x) in out.iter_mut().zip(r) {
                *o += w * x;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Needle proxy

/// Where the keys of one needle trial come from.
pub struct Pool<'a> {
    /// `n` keys of `dim` values, exact
    pub keys: &'a [f32],
    /// the same keys after each codec (same order as `codecs`), made with
    /// [`KMean::roundtrip`] of `k_mean` at positions from 0 (or [`roundtrip_rows`] without)
    pub keys_q: &'a [Vec<f32>],
    /// the pool's K mean (one head) when the turbo codecs remove it; `None`: no mean
    /// removal. Pool key `i` is at position `i` (a capture is one sequence from 0): in
    /// RoPE's frame each drawn key keeps its own `R_i mu`, which `keys_q` already holds
    pub k_mean: Option<KMean<'a>>,
    /// `n` values of `dim_v` values, exact and after each codec
    pub values: &'a [f32],
    pub values_q: &'a [Vec<f32>],
    pub dim: usize,
    pub dim_v: usize,
    pub rot_dim: usize,
}

/// Outcome of one trial for one codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrialResult {
    /// the top-1 position after quantizing the keys is the exact top-1 (the needle when
    /// `needle_weight >= 0.5`)
    pub top1_same: bool,
    /// cosine of softmax(q·K̂)·V̂ against softmax(q·K)·V
    pub out_cos: f64,
}

/// One needle trial (see `tq niah --help`): `len` haystack keys drawn uniformly with
/// replacement from the pool, the key at a uniformly random position `p` replaced by the
/// needle `k_p + α q / |q|²`, with `α` chosen so that the needle's exact attention weight is
/// `needle_weight` (at 0.5 or more the needle is the exact top-1); the needle's value stays
/// `v_p`. For each codec the keys (and values) are quantized and the top-1 position of
/// `q·k̂ * scale` compared with the exact one. With `pool.k_mean`, turbo codecs quantize
/// `k - m` (the needle too) and `k̂` is in the shifted frame (see [`roundtrip_keys`]), or, in
/// RoPE's frame, `k_i - R_i mu` with `R_i mu` added back (the needle at the position of the
/// pool key it replaces): the exact side is always attention over the unshifted keys.
pub fn needle_trial(
    pool: &Pool,
    codecs: &[Codec],
    q: &[f32],
    len: usize,
    needle_weight: f64,
    scale: f32,
    rng: &mut SplitMix64,
) -> Vec<TrialResult> {
    let n = pool.keys.len() / pool.dim;
    let d = pool.dim;
    let idx: Vec<usize> = (0..len).map(|_| (rng.next() % n as u64) as usize).collect();
    let p = (rng.next() % len as u64) as usize;
    // exact scores of the pool, then of the haystack
    let pool_s: Vec<f32> = pool
        .keys
        .chunks_exact(d)
        .map(|k| dot(q, k) * scale)
        .collect();
    let hay: Vec<f32> = idx.iter().map(|&i| pool_s[i]).collect();
    // logsumexp of every other position
    let m = hay
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != p)
        .map(|(_, &s)| s as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = hay
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != p)
        .map(|(_, &s)| (s as f64 - m).exp())
        .sum();
    let lse = m + z.ln();
    let target = lse + (needle_weight / (1.0 - needle_weight)).ln();
    let k_p = &pool.keys[idx[p] * d..(idx[p] + 1) * d];
    let qq = dot(q, q) as f64;
    let alpha = (target / scale as f64 - dot(q, k_p) as f64) / qq;
    let needle: Vec<f32> = k_p
        .iter()
        .zip(q)
        .map(|(&k, &qi)| k + (alpha * qi as f64) as f32)
        .collect();
    let v_p = &pool.values[idx[p] * pool.dim_v..(idx[p] + 1) * pool.dim_v];

    // exact output: the needle's weight plus the pool-aggregated haystack weights
    let (exact, top_exact) = {
        let mut s = hay.clone();
        s[p] = dot(q, &needle) * scale;
        (
            attention_out(&s, &idx, p, pool.values, pool.dim_v, v_p),
            argmax(&s),
        )
    };
    let mut res = Vec::with_capacity(codecs.len());
    for (ci, &c) in codecs.iter().enumerate() {
        let needle_q = match pool.k_mean {
            Some(km) => km.roundtrip(c, d, pool.rot_dim, &needle, idx[p]),
            None => roundtrip_rows(c, d, pool.rot_dim, &needle),
        };
        let kq = &pool.keys_q[ci];
        let pool_sq: Vec<f32> = kq.chunks_exact(d).map(|k| dot(q, k) * scale).collect();
        let mut s: Vec<f32> = idx.iter().map(|&i| pool_sq[i]).collect();
        s[p] = dot(q, &needle_q) * scale;
        let top = argmax(&s);
        let vq = &pool.values_q[ci];
        let v_pq = &vq[idx[p] * pool.dim_v..(idx[p] + 1) * pool.dim_v];
        let out = attention_out(&s, &idx, p, vq, pool.dim_v, v_pq);
        res.push(TrialResult {
            top1_same: top == top_exact,
            out_cos: cosine(&exact, &out),
        });
    }
    res
}

/// softmax(s) · V where position j holds pool value `idx[j]`, except position `p` (`v_p`).
fn attention_out(
    s: &[f32],
    idx: &[usize],
    p: usize,
    values: &[f32],
    dv: usize,
    v_p: &[f32],
) -> Vec<f32> {
    let mut w = s.to_vec();
    softmax(&mut w);
    let n = values.len() / dv;
    let mut per = vec![0f32; n];
    for (j, &i) in idx.iter().enumerate() {
        if j != p {
            per[i] += w[j];
        }
    }
    let mut out = vec![0f32; dv];
    weighted_sum(&per, values, dv, &mut out);
    for (o, &v) in out.iter_mut().zip(v_p) {
        *o += w[p] * v;
    }
    out
}
