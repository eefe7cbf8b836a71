//! AVX2 + FMA kernels of the trellis-coded types (`K` = 3 or 2 bits per
//! value, `L` = 8; see `crates/codec/src/tcq/kernels.rs` for the window rule and the
//! semantics each kernel keeps).
//!
//! Per block: one or two 16-byte loads and one `vpshufb` build the eight
//! big-endian group words `w_g` (stored, then read as scalars). Lookups go
//! through a *pair table*: the `8 + K`-bit window ending at value `2p + 1`
//! holds the states of values `2p` and `2p + 1` (`s_{2p} = w >> K`,
//! `s_{2p+1} = w & 0xff`), so `PAIR[w] = [TABLE[w >> K], TABLE[w & 0xff]]`
//! (2^(8+K) × 8 bytes: 16 KB for K = 3, 8 KB for K = 2, generated at compile
//! time from the tables) gives two values per 64-bit load; four loads
//! (`vmovsd` / `vmovhpd`, `vinsertf128`) make 8 values. The values are the
//! table's own f32s, so every product equals the scalar oracle's.
//! Measured against the alternatives (docs/TCQ.md): `vgatherdps` over the
//! 256-entry table was 2-3× slower on Zen 3, scalar 32-bit lookups 1.5×.
#![allow(clippy::missing_safety_doc)]

use core::arch::x86_64::*;

// the scale, the horizontal sums and the tile's store: the turbo types' (kernels/x86.rs)
use crate::kernels::x86::rows::{hsum4_256 as hsum4, store_first};
use crate::kernels::x86::{hsum256, scale_at};

/// Lane `g` = big-endian word of `ext[K g .. K g + 4]`, `ext[0] = qs[8K - 1]`,
/// `ext[i] = qs[i - 1]`, `ext[8K + 1] = 0`. Reads exactly the `8 K` payload
/// bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn words<const K: usize>(qs: *const u8) -> __m256i {
    if K == 2 {
        let q = _mm_loadu_si128(qs as *const __m128i);
        #[rustfmt::skip]
        let sh = _mm256_setr_epi8(
            2, 1, 0, 15, 4, 3, 2, 1, 6, 5, 4, 3, 8, 7, 6, 5,
            10, 9, 8, 7, 12, 11, 10, 9, 14, 13, 12, 11, -128, 15, 14, 13,
        );
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(q), sh)
    } else {
        let lo = _mm_loadu_si128(qs as *const __m128i);
        let hi = _mm_loadu_si128(qs.add(8) as *const __m128i);
        #[rustfmt::skip]
        let sh = _mm256_setr_epi8(
            2, 1, 0, -128, 5, 4, 3, 2, 8, 7, 6, 5, 11, 10, 9, 8,
            6, 5, 4, 3, 9, 8, 7, 6, 12, 11, 10, 9, 15, 14, 13, 12,
        );
        let w = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), sh);
        let wrap = ((*qs.add(23)) as i32) << 24;
        _mm256_or_si256(w, _mm256_setr_epi32(wrap, 0, 0, 0, 0, 0, 0, 0))
    }
}

/// A pair table (see the module documentation), cache-line aligned.
#[repr(C, align(64))]
pub struct PairTable<const N: usize>(pub [[f32; 2]; N]);

const fn pair_table<const N: usize>(t: &[f32; 256], k: u32) -> PairTable<N> {
    let mut out = [[0f32; 2]; N];
    let mut w = 0;
    while w < N {
        out[w] = [t[(w >> k) & 0xff], t[w & 0xff]];
        w += 1;
    }
    PairTable(out)
}

/// Pair table of turbo3_tcq (11-bit windows).
pub static PAIR3: PairTable<2048> = pair_table(&crate::tcq::tables::TCQ3_TABLE, 3);
/// Pair table of turbo2_tcq (10-bit windows).
pub static PAIR2: PairTable<1024> = pair_table(&crate::tcq::tables::TCQ2_TABLE, 2);

#[inline(always)]
fn pairs<const K: usize>() -> *const f64 {
    if K == 3 {
        PAIR3.0.as_ptr() as *const f64
    } else {
        PAIR2.0.as_ptr() as *const f64
    }
}

/// The group words of a block, as scalars.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_words<const K: usize>(qs: *const u8) -> [u32; 8] {
    let mut wv = [0u32; 8];
    _mm256_storeu_si256(wv.as_mut_ptr() as *mut __m256i, words::<K>(qs));
    wv
}

/// The unscaled table values of the 8 values of group word `w`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn look<const K: usize>(pd: *const f64, w: u32) -> __m256 {
    let mask = (1u32 << (8 + K)) - 1;
    let s = |p: usize| ((w >> (24 - 2 * K - 2 * K * p)) & mask) as usize;
    let lo = _mm_loadh_pd(_mm_load_sd(pd.add(s(0))), pd.add(s(1)));
    let hi = _mm_loadh_pd(_mm_load_sd(pd.add(s(2))), pd.add(s(3)));
    _mm256_castpd_ps(_mm256_set_m128d(hi, lo))
}

/// `y = d * TABLE[s]` (bit-exact with the scalar oracle).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn avx2_dequantize<const K: usize>(x: *const u8, y: *mut f32, nb: usize) {
    let bb = 2 + 8 * K;
    let pd = pairs::<K>();
    for b in 0..nb {
        let blk = x.add(b * bb);
        let w = block_words::<K>(blk.add(2));
        let d = _mm256_set1_ps(scale_at(blk));
        let yb = y.add(b * 64);
        for (g, &wg) in w.iter().enumerate() {
            _mm256_storeu_ps(yb.add(8 * g), _mm256_mul_ps(d, look::<K>(pd, wg)));
        }
    }
}

/// `Σ decode(x) * q`: per block `Σ TABLE[s] q` in f32 (FMA), times `d`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn avx2_vec_dot<const K: usize>(x: *const u8, q: *const f32, nb: usize) -> f32 {
    let bb = 2 + 8 * K;
    let pd = pairs::<K>();
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..nb {
        let blk = x.add(b * bb);
        let w = block_words::<K>(blk.add(2));
        let qb = q.add(b * 64);
        let mut p = [_mm256_setzero_ps(); 2];
        for g in 0..8 {
            let v = look::<K>(pd, w[g]);
            p[g % 2] = _mm256_fmadd_ps(v, _mm256_loadu_ps(qb.add(8 * g)), p[g % 2]);
        }
        let d = _mm256_set1_ps(scale_at(blk));
        acc[b % 2] = _mm256_fmadd_ps(d, _mm256_add_ps(p[0], p[1]), acc[b % 2]);
    }
    hsum256(_mm256_add_ps(acc[0], acc[1]))
}

/// `y += v * (d * TABLE[s])` (bit-exact with the scalar oracle).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn avx2_mad<const K: usize>(x: *const u8, y: *mut f32, nb: usize, v: f32) {
    let bb = 2 + 8 * K;
    let pd = pairs::<K>();
    let vv = _mm256_set1_ps(v);
    for b in 0..nb {
        let blk = x.add(b * bb);
        let w = block_words::<K>(blk.add(2));
        let d = _mm256_set1_ps(scale_at(blk));
        let yb = y.add(b * 64);
        for (g, &wg) in w.iter().enumerate() {
            let t = _mm256_mul_ps(vv, _mm256_mul_ps(d, look::<K>(pd, wg)));
            let p = yb.add(8 * g);
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), t));
        }
    }
}

/// Flash-attention key tile: four rows at a time (past the last row the last
/// row is repeated, computed and never stored), the query block loaded once
/// per four rows; per row and block `Σ TABLE[s] q` in f32, times `d` (FMA).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn avx2_dot_rows<const K: usize>(
    x: *const u8,
    stride: usize,
    nrows: usize,
    q: *const f32,
    nb: usize,
    out: *mut f32,
) {
    let bb = 2 + 8 * K;
    let pd = pairs::<K>();
    let last = nrows - 1;
    let mut r = 0;
    while r < nrows {
        let rows = [0, 1, 2, 3].map(|i| x.add((r + i).min(last) * stride));
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let qb = q.add(b * 64);
            let blks = rows.map(|p| p.add(b * bb));
            let ws = blks.map(|p| block_words::<K>(p.add(2)));
            let mut p = [_mm256_setzero_ps(); 4];
            for g in 0..8 {
                let qv = _mm256_loadu_ps(qb.add(8 * g));
                for (pi, wi) in p.iter_mut().zip(&ws) {
                    *pi = _mm256_fmadd_ps(look::<K>(pd, wi[g]), qv, *pi);
                }
            }
            for i in 0..4 {
                let d = _mm256_set1_ps(scale_at(blks[i]));
                acc[i] = _mm256_fmadd_ps(d, p[i], acc[i]);
            }
        }
        store_first(out.add(r), hsum4(acc), (nrows - r).min(4));
        r += 4;
    }
}

/// Flash-attention value tile: one output block stays in registers while
/// every row's `w[r] * (d * TABLE[s])` is added, rows in order (bit-exact
/// with `nrows` sequential mads).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn avx2_mad_rows<const K: usize>(
    x: *const u8,
    stride: usize,
    nrows: usize,
    w: *const f32,
    y: *mut f32,
    nb: usize,
) {
    let bb = 2 + 8 * K;
    let pd = pairs::<K>();
    for b in 0..nb {
        let yb = y.add(b * 64);
        let mut acc: [__m256; 8] = core::array::from_fn(|g| _mm256_loadu_ps(yb.add(8 * g)));
        for r in 0..nrows {
            let blk = x.add(r * stride + b * bb);
            let ww = block_words::<K>(blk.add(2));
            let d = _mm256_set1_ps(scale_at(blk));
            let vv = _mm256_set1_ps(*w.add(r));
            for (g, a) in acc.iter_mut().enumerate() {
                let t = _mm256_mul_ps(vv, _mm256_mul_ps(d, look::<K>(pd, ww[g])));
                *a = _mm256_add_ps(*a, t);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(yb.add(8 * g), *a);
        }
    }
}
