//! Decode-side row kernels of the trellis-coded types, laid out like
//! `crate::kernels` for turbo2/3/4: a scalar reference (the test oracle) and
//! an AVX2 path, selected at run time by [`crate::kernels::simd_level`]
//! (`TQ_SIMD=scalar` caps it; the AVX-512 level runs the AVX2 kernels).
//!
//! State windows are read straight from the bit string, no serial state
//! recursion: with `ext` the payload preceded by its own last byte
//! (`ext[0] = qs[n-1]`, `ext[i] = qs[i-1]`, one zero byte past the end), the
//! big-endian 32-bit word `w_g` at `ext[k g]` holds the `L = 8`-bit states of
//! the 8 values `8g..8g+8`: value `8g + j` has state
//! `(w_g >> (24 - k - k j)) & 0xff` (module invariant of `crates/codec/src/tcq/mod.rs`:
//! the window of stream bits `[k t + k - 8, k t + k)` mod `64 k`).
//!
//! Semantics, per path:
//! * dequantize: `y = d * TABLE[s]`, one f32 multiply: bit-exact everywhere;
//! * mad: `y += v * (d * TABLE[s])`: bit-exact everywhere;
//! * mad_rows: `nrows` sequential mads, rows in order: bit-exact;
//! * vec_dot / dot_rows: the scalar oracle sums the f32 terms
//!   `(d * TABLE[s]) * q` in f64; SIMD sums `TABLE[s] * q` per block in f32
//!   with FMA and scales each block's sum by `d` (one FMA): within
//!   `1e-5 * Σ|terms|` of the oracle (crates/codec/tests/tcq_kernels.rs; the turbo bound).
//!
//! Everything takes raw pointers to `nb` whole blocks and `nb * 64` floats;
//! callers guarantee the lengths. No function here allocates.

use super::block::TcqType;
use super::tables::{TCQ2_L, TCQ2_TABLE, TCQ3_L, TCQ3_TABLE};
use crate::block::decode_scale;
use crate::kernels::{scalar_row_kernels, RowKernels, RowType, SimdLevel};
use crate::QK;

// The window extraction reads 8-bit states from 32-bit words (L <= k + 8 and
// 8 k + 8 <= 32); another L needs wider words here (the codec's
// `dequantize_block_with` handles any L).
const _: () = assert!(TCQ3_L == 8 && TCQ2_L == 8);

/// Scale of a block (NaN / Inf / negative scales decode as 0).
#[inline(always)]
fn scale(b: &[u8]) -> f32 {
    decode_scale(u16::from_ne_bytes([b[0], b[1]]))
}

/// The 8 big-endian group words of a payload of `8 K` bytes (see the module
/// documentation).
#[inline(always)]
pub fn group_words<const K: usize>(qs: &[u8]) -> [u32; 8] {
    let n = 8 * K;
    let qs = &qs[..n];
    let at = |i: usize| -> u32 {
        // ext[i]
        match i {
            0 => qs[n - 1] as u32,
            i if i <= n => qs[i - 1] as u32,
            _ => 0,
        }
    };
    core::array::from_fn(|g| {
        let b = K * g;
        (at(b) << 24) | (at(b + 1) << 16) | (at(b + 2) << 8) | at(b + 3)
    })
}

/// The 64 states of a payload of `8 K` bytes.
#[inline(always)]
pub fn block_states<const K: usize>(qs: &[u8]) -> [u8; QK] {
    let w = group_words::<K>(qs);
    core::array::from_fn(|t| (w[t / 8] >> (24 - K - K * (t % 8))) as u8)
}

/// The trellis table of a type as a fixed-size array.
#[inline(always)]
pub fn table(ty: TcqType) -> &'static [f32; 256] {
    match ty {
        TcqType::Turbo3Tcq => &TCQ3_TABLE,
        TcqType::Turbo2Tcq => &TCQ2_TABLE,
    }
}

/// Scalar reference kernels (the oracles of the SIMD paths).
pub mod scalar {
    use super::*;

    #[inline(always)]
    fn each_block<const K: usize>(x: &[u8], n: usize, mut f: impl FnMut(usize, f32, &[u8; QK])) {
        let bb = 2 + 8 * K;
        for (i, b) in x.chunks_exact(bb).take(n).enumerate() {
            f(i, scale(b), &block_states::<K>(&b[2..]));
        }
    }

    fn dequantize_k<const K: usize>(tab: &[f32; 256], x: &[u8], y: &mut [f32]) {
        each_block::<K>(x, y.len() / QK, |i, d, s| {
            for (o, &st) in y[i * QK..(i + 1) * QK].iter_mut().zip(s) {
                *o = d * tab[st as usize];
            }
        })
    }

    fn vec_dot_k<const K: usize>(tab: &[f32; 256], x: &[u8], q: &[f32]) -> f32 {
        let mut acc = 0f64;
        each_block::<K>(x, q.len() / QK, |i, d, s| {
            for (&v, &st) in q[i * QK..(i + 1) * QK].iter().zip(s) {
                acc += ((d * tab[st as usize]) * v) as f64;
            }
        });
        acc as f32
    }

    fn mad_k<const K: usize>(tab: &[f32; 256], x: &[u8], y: &mut [f32], v: f32) {
        each_block::<K>(x, y.len() / QK, |i, d, s| {
            for (o, &st) in y[i * QK..(i + 1) * QK].iter_mut().zip(s) {
                *o += v * (d * tab[st as usize]);
            }
        })
    }

    /// `y_j = d * TABLE[s_j]` for `y.len() / 64` blocks of `x`.
    pub fn dequantize_row(ty: TcqType, x: &[u8], y: &mut [f32]) {
        match ty {
            TcqType::Turbo3Tcq => dequantize_k::<3>(table(ty), x, y),
            TcqType::Turbo2Tcq => dequantize_k::<2>(table(ty), x, y),
        }
    }

    /// `Σ_j (d * TABLE[s_j]) * q_j`: f32 terms accumulated in f64.
    pub fn vec_dot_row(ty: TcqType, x: &[u8], q: &[f32]) -> f32 {
        match ty {
            TcqType::Turbo3Tcq => vec_dot_k::<3>(table(ty), x, q),
            TcqType::Turbo2Tcq => vec_dot_k::<2>(table(ty), x, q),
        }
    }

    /// `y_j += v * (d * TABLE[s_j])`.
    pub fn mad_row(ty: TcqType, x: &[u8], y: &mut [f32], v: f32) {
        match ty {
            TcqType::Turbo3Tcq => mad_k::<3>(table(ty), x, y, v),
            TcqType::Turbo2Tcq => mad_k::<2>(table(ty), x, y, v),
        }
    }

    /// `out[r] = vec_dot_row(row r, q)`, rows `stride` bytes apart.
    pub fn dot_rows(ty: TcqType, x: &[u8], stride: usize, q: &[f32], out: &mut [f32]) {
        let len = q.len() / QK * ty.block_bytes();
        for (r, o) in out.iter_mut().enumerate() {
            *o = vec_dot_row(ty, &x[r * stride..r * stride + len], q);
        }
    }

    /// `y += w[r] * decode(row r)` for every row in order (`w.len()` mads).
    pub fn mad_rows(ty: TcqType, x: &[u8], stride: usize, w: &[f32], y: &mut [f32]) {
        let len = y.len() / QK * ty.block_bytes();
        for (r, &wr) in w.iter().enumerate() {
            mad_row(ty, &x[r * stride..r * stride + len], y, wr);
        }
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! avx2_row_kernels {
    ($k:literal) => {
        RowKernels {
            dequantize: super::x86::avx2_dequantize::<$k>,
            vec_dot: super::x86::avx2_vec_dot::<$k>,
            mad: super::x86::avx2_mad::<$k>,
            dot_rows: super::x86::avx2_dot_rows::<$k>,
            mad_rows: super::x86::avx2_mad_rows::<$k>,
        }
    };
}

const SCALAR_ROW: [RowKernels; 2] = [
    scalar_row_kernels!(self::scalar, TcqType::Turbo3Tcq),
    scalar_row_kernels!(self::scalar, TcqType::Turbo2Tcq),
];

#[cfg(target_arch = "x86_64")]
const AVX2_ROW: [RowKernels; 2] = [avx2_row_kernels!(3), avx2_row_kernels!(2)];
#[cfg(not(target_arch = "x86_64"))]
const AVX2_ROW: [RowKernels; 2] = SCALAR_ROW;

/// `KERNELS[level][type]` (type in `TcqType` order); the AVX-512 level runs the AVX2
/// kernels (AVX-512 CPUs have AVX2 and FMA).
static KERNELS: [[RowKernels; 2]; 3] = [SCALAR_ROW, AVX2_ROW, AVX2_ROW];

impl RowType for TcqType {
    #[inline(always)]
    fn block_bytes(self) -> usize {
        TcqType::block_bytes(self)
    }
    #[inline(always)]
    fn kernels(self, level: SimdLevel) -> &'static RowKernels {
        let t = match self {
            TcqType::Turbo3Tcq => 0,
            TcqType::Turbo2Tcq => 1,
        };
        &KERNELS[level as usize][t]
    }
}

// The raw dispatchers and the safe row API are the turbo types' ones, generic over
// [`RowType`].
pub use crate::kernels::{
    dequantize_raw, dequantize_row_at, dot_rows_at, dot_rows_raw, mad_raw, mad_row_at, mad_rows_at,
    mad_rows_raw, vec_dot_raw, vec_dot_row_at,
};
