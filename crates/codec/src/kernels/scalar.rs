//! Scalar reference kernels: the encoder (the only encoder: it must be
//! deterministic so the CUDA port can reproduce its bytes) and the decode-side
//! oracles the SIMD paths are tested against.

use crate::block::{decode_scale, pack_indices, unpack_indices, TqType, QK};
use crate::gain::{GAIN_COARSE, GAIN_PLAIN, GAIN_REFINE, GAIN_STEP};
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
/// 4. else `u_j = x_j / n` (f64); a candidate with gain `g` has
///    `idx_j = #{k : u_j > T[k]·f}`, `f = g · GAIN_STEP`, over the f32 thresholds `T`
///    widened to f64 (a tie goes to the lower centroid), and the score
///    `(Σ x_j C[idx_j])² / Σ C[idx_j]²` (f64; each sum as eight interleaved partial sums
///    over `j ≡ l mod 8`, combined pairwise); the candidates of [`crate::gain`] are tried
///    in its order and the first with the largest score is kept;
/// 5. `cn = sqrt(Σ C[idx_j]²)` over the kept codes (the same eight-lane sum);
///    `d = f16(f32(n / cn))`, round to nearest even, an overflow to ±Inf clamped to 65504.
#[inline(always)]
pub fn quantize_block(ty: TqType, x: &[f32], out: &mut [u8]) {
    let x = &x[..QK];
    let mut xs = [0f64; QK];
    let mut ss = 0f64;
    for (dst, &v) in xs.iter_mut().zip(x) {
        let v = sanitize(v) as f64;
        *dst = v;
        ss += v * v;
    }
    let n = ss.sqrt();
    let idx: [u8; QK];
    let d: u16;
    if n == 0.0 || !n.is_finite() {
        idx = [(ty.levels() / 2) as u8; QK];
        d = 0;
    } else {
        let mut u = [0f64; QK];
        for (u, &v) in u.iter_mut().zip(xs.iter()) {
            *u = v / n;
        }
        // The gain search (docs/CODEC.md "Encoding"): the codes of u / f for a few gains f,
        // keeping the codes whose direction is closest to x (largest ⟨x, c⟩² / |c|²).
        // A candidate replaces the best only on a strictly larger score.
        let try_gain = |best: &mut Candidate, g: i32| {
            let cand = classify_scaled(ty, &u, &xs, g);
            if cand.score > best.score {
                *best = cand;
            }
        };
        let mut best = classify_scaled(ty, &u, &xs, GAIN_PLAIN);
        for &g in GAIN_COARSE.iter() {
            try_gain(&mut best, g);
        }
        for &step in GAIN_REFINE.iter() {
            let centre = best.gain;
            try_gain(&mut best, centre - step);
            try_gain(&mut best, centre + step);
        }
        idx = best.idx;
        let h = f16::from_f32((n / best.cs.sqrt()) as f32);
        d = if h.is_infinite() {
            f16::MAX.to_bits()
        } else {
            h.to_bits()
        };
    }
    out[..2].copy_from_slice(&d.to_ne_bytes());
    pack_indices(ty, &idx, &mut out[2..ty.block_bytes()]);
}

/// One candidate of the gain search.
struct Candidate {
    gain: i32,
    idx: [u8; QK],
    /// Σ C[idx_j]² (f64, the eight-lane sum).
    cs: f64,
    /// ⟨x, c⟩² / Σ C[idx_j]², the part of |x|² the codes' direction keeps.
    score: f64,
}

/// `idx_j = #{k : u_j > T[k]·f}` with `f = gain · GAIN_STEP` (both products in f64), and the
/// candidate's score. Thresholds outer, values inner: the compiler vectorizes across the
/// 64 values.
#[inline(always)]
fn classify_scaled(ty: TqType, u: &[f64; QK], xs: &[f64; QK], gain: i32) -> Candidate {
    let f = gain as f64 * GAIN_STEP;
    let cb = ty.codebook();
    let mut idx = [0u8; QK];
    for &t in ty.thresholds() {
        let t = t as f64 * f;
        for (c, &uj) in idx.iter_mut().zip(u.iter()) {
            *c += (uj > t) as u8;
        }
    }
    // Eight interleaved partial sums (lane l takes j ≡ l mod 8), combined pairwise: eight
    // independent chains instead of one 64-long chain of dependent adds.
    let mut cs8 = [0f64; 8];
    let mut sx8 = [0f64; 8];
    for (ki, xi) in idx.chunks_exact(8).zip(xs.chunks_exact(8)) {
        for l in 0..8 {
            let cv = cb[ki[l] as usize] as f64;
            cs8[l] += cv * cv;
            sx8[l] += xi[l] * cv;
        }
    }
    let cs = pairwise8(&cs8);
    let sxc = pairwise8(&sx8);
    Candidate {
        gain,
        idx,
        cs,
        score: sxc * sxc / cs,
    }
}

/// `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`.
#[inline(always)]
fn pairwise8(a: &[f64; 8]) -> f64 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// Encodes `x.len() / 64` blocks.
///
/// The same scalar code is also compiled with AVX2 / AVX-512 enabled and picked
/// at run time: every operation in it is an exactly rounded IEEE operation (no
/// reassociation, no FMA contraction in Rust), so the bytes are identical on
/// every path (crates/codec/tests/codec_golden.rs pins them).
pub fn quantize_row(ty: TqType, x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::SimdLevel;
        match super::simd_level() {
            // SAFETY: the level is only ever set to one the CPU supports.
            SimdLevel::Avx512 => return unsafe { quantize_row_avx512(ty, x, out) },
            SimdLevel::Avx2 => return unsafe { quantize_row_avx2(ty, x, out) },
            SimdLevel::Scalar => {}
        }
    }
    quantize_row_generic(ty, x, out)
}

/// The portable build of the encoder (the reference).
pub fn quantize_row_generic(ty: TqType, x: &[f32], out: &mut [u8]) {
    let bb = ty.block_bytes();
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
        quantize_block(ty, xb, ob);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(ty: TqType, x: &[f32], out: &mut [u8]) {
    let bb = ty.block_bytes();
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
        quantize_block(ty, xb, ob);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_row_avx512(ty: TqType, x: &[f32], out: &mut [u8]) {
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

/// `out[r] = vec_dot_row(row r, q)` for `out.len()` rows `stride` bytes apart
/// (the multi-row oracle: the per-row f64 oracle, row by row).
pub fn dot_rows(ty: TqType, x: &[u8], stride: usize, q: &[f32], out: &mut [f32]) {
    let len = q.len() / QK * ty.block_bytes();
    for (r, o) in out.iter_mut().enumerate() {
        *o = vec_dot_row(ty, &x[r * stride..r * stride + len], q);
    }
}

/// `y += w[r] * decode(row r)` for `w.len()` rows `stride` bytes apart, in row
/// order (exactly `w.len()` calls of [`mad_row`]).
pub fn mad_rows(ty: TqType, x: &[u8], stride: usize, w: &[f32], y: &mut [f32]) {
    let len = y.len() / QK * ty.block_bytes();
    for (r, &wr) in w.iter().enumerate() {
        mad_row(ty, &x[r * stride..r * stride + len], y, wr);
    }
}
