//! The K mean in RoPE's frame (llama.cpp's default with the model on the CPU,
//! ggml-ext/llama/tq-kmean-rope.h): `mu` the mean of `R_p^-1 k_p` over the first ubatch,
//! key p stored as `k_p - R_p mu`, attention adding `q·R_p mu` back per key.
//!
//! Invariant: the Rust oracle of tq-kmean-rope.h: the same pairing (`tq_rf_ch`), cos/sin
//! rounded to f32 as llama.cpp's table, and a lossless quantizer through the frame gives
//! the keys back exactly (tests/kmean_rope.rs); `KMean::roundtrip` is in a frame where
//! softmax and argmax over `q·k̂` are llama.cpp's.

use crate::codec::{roundtrip_rows, Codec};
use crate::kmean::{k_mean, roundtrip_keys, sub_mean};

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
