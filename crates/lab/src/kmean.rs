//! The K mean of llama.cpp's turbo K caches in its fixed frame (ggml-ext/llama/tq-kmean.h):
//! the mean of the first ubatch's keys, mapped to the cache's positions by the RoPE fit.
//!
//! Invariant: this is the Rust oracle of tq-kmean.h's mean: the same first-ubatch rule
//! (`K_MEAN_TOKENS`, none under `K_MEAN_MIN_TOKENS`) and the same per-pair map `F`; removing
//! a fixed `m` moves every logit of a query by the same `-q·m`, so attention over
//! `k - m` is attention over `k` (tests/lab_metrics.rs, 1e-6 relative).

use crate::codec::{roundtrip_rows, Codec};
use crate::kmean_rope::rope_pair;

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
