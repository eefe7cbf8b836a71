//! Scalar reference kernels: the encoder (the only encoder: it must be
//! deterministic so the CUDA port can reproduce its bytes) and the decode-side
//! oracles the SIMD paths are tested against.

use crate::block::{decode_scale, pack_indices, unpack_indices, TqType, QK};
use half::f16;

/// Replaces NaN by 0 and ±Inf by ±65504 (the largest finite fp16); every other
/// value is returned unchanged.
#[inline(always)]
pub fn sanitize(v: f32) -> f32 {
    if v.is_nan() {
        0.0
    } else if v.is_infinite() {
        if v > 0.0 {
            65504.0
        } else {
            -65504.0
        }
    } else {
        v
    }
}

/// Encodes one block of 64 values into `out` (`ty.block_bytes()` bytes).
///
/// The rule, bit for bit (see docs/CODEC.md):
/// 1. sanitize every value ([`sanitize`]);
/// 2. `n = sqrt(Σ x_j²)`, squares and sum in f64, sequential `j = 0..64`;
/// 3. if `n == 0` (or not finite): `d = 0` and every index is `2^(b-1)`
///    (the smallest positive centroid);
/// 4. else `u_j = x_j / n` (f64) and `idx_j = #{k : u_j > T[k]}` over the f32
///    thresholds `T` widened to f64 (a tie goes to the lower centroid);
/// 5. `cn = sqrt(Σ C[idx_j]²)` in f64 (sequential); `d = f16(f32(n / cn))`,
///    round to nearest even, an overflow to ±Inf clamped to 65504.
pub fn quantize_block(ty: TqType, x: &[f32], out: &mut [u8]) {
    let x = &x[..QK];
    let mut xs = [0f32; QK];
    let mut ss = 0f64;
    for (dst, &v) in xs.iter_mut().zip(x) {
        let v = sanitize(v);
        *dst = v;
        ss += (v as f64) * (v as f64);
    }
    let n = ss.sqrt();
    let mut idx = [0u8; QK];
    let d: u16;
    if n == 0.0 || !n.is_finite() {
        idx = [(ty.levels() / 2) as u8; QK];
        d = 0;
    } else {
        let cb = ty.codebook();
        let thr = ty.thresholds();
        let mut cs = 0f64;
        for (k, &v) in idx.iter_mut().zip(xs.iter()) {
            let u = v as f64 / n;
            let mut c = 0u8;
            for &t in thr {
                c += (u > t as f64) as u8;
            }
            *k = c;
            let cv = cb[c as usize] as f64;
            cs += cv * cv;
        }
        let cn = cs.sqrt();
        let h = f16::from_f32((n / cn) as f32);
        d = if h.is_infinite() {
            f16::MAX.to_bits()
        } else {
            h.to_bits()
        };
    }
    out[..2].copy_from_slice(&d.to_ne_bytes());
    pack_indices(ty, &idx, &mut out[2..ty.block_bytes()]);
}

/// Encodes `x.len() / 64` blocks.
pub fn quantize_row(ty: TqType, x: &[f32], out: &mut [u8]) {
    let bb = ty.block_bytes();
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
        quantize_block(ty, xb, ob);
    }
}

#[inline(always)]
fn block_scale(b: &[u8]) -> f32 {
    decode_scale(u16::from_ne_bytes([b[0], b[1]]))
}

/// `y_j = d * C[idx_j]` (one f32 multiply per value).
pub fn dequantize_row(ty: TqType, x: &[u8], y: &mut [f32]) {
    let cb = ty.codebook();
    let mut idx = [0u8; QK];
    for (b, yb) in x.chunks_exact(ty.block_bytes()).zip(y.chunks_exact_mut(QK)) {
        let d = block_scale(b);
        unpack_indices(ty, &b[2..], &mut idx);
        for (o, &k) in yb.iter_mut().zip(idx.iter()) {
            *o = d * cb[k as usize];
        }
    }
}

/// `Σ_j (d * C[idx_j]) * y_j`: f32 terms, accumulated in f64 (the oracle).
pub fn vec_dot_row(ty: TqType, x: &[u8], y: &[f32]) -> f32 {
    let cb = ty.codebook();
    let mut idx = [0u8; QK];
    let mut acc = 0f64;
    for (b, yb) in x.chunks_exact(ty.block_bytes()).zip(y.chunks_exact(QK)) {
        let d = block_scale(b);
        unpack_indices(ty, &b[2..], &mut idx);
        for (&yv, &k) in yb.iter().zip(idx.iter()) {
            acc += ((d * cb[k as usize]) * yv) as f64;
        }
    }
    acc as f32
}

/// `y_j += v * (d * C[idx_j])`.
pub fn mad_row(ty: TqType, x: &[u8], y: &mut [f32], v: f32) {
    let cb = ty.codebook();
    let mut idx = [0u8; QK];
    for (b, yb) in x.chunks_exact(ty.block_bytes()).zip(y.chunks_exact_mut(QK)) {
        let d = block_scale(b);
        unpack_indices(ty, &b[2..], &mut idx);
        for (o, &k) in yb.iter_mut().zip(idx.iter()) {
            *o += v * (d * cb[k as usize]);
        }
    }
}
