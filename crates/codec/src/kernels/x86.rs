//! x86-64 SIMD kernels: AVX2+FMA and AVX-512F.
//!
//! Codebook lookups stay in registers: per block the (tiny) codebook is scaled
//! by the block scale (`d * C[k]`, the very product the scalar decoder
//! computes, so dequantize is bit-exact) and looked up with
//! `vpermps` (`_mm256_permutevar8x32_ps`, 8 entries; two of them and a blend on
//! index bit 3 for 16 entries) or `_mm512_permutexvar_ps` (16 entries).
//! Tables with fewer entries than the permute width are replicated, so index
//! bits above the type's width never need masking.
//!
//! All functions take raw pointers to `nb` whole blocks and `nb * 64` floats;
//! callers guarantee the lengths.
#![allow(unused_unsafe)]
#![allow(clippy::missing_safety_doc)]

use core::arch::x86_64::*;

use crate::block::decode_scale;
use crate::tables::{CODEBOOK_2BIT, CODEBOOK_3BIT, CODEBOOK_4BIT};

const fn rep<const M: usize>(src: &[f32], off: usize, len: usize) -> [f32; M] {
    let mut out = [0.0f32; M];
    let mut i = 0;
    while i < M {
        out[i] = src[off + i % len];
        i += 1;
    }
    out
}

// Replicated tables.
static T2_X8: [f32; 8] = rep::<8>(&CODEBOOK_2BIT, 0, 4);
static T3_LO_X8: [f32; 8] = rep::<8>(&CODEBOOK_3BIT, 0, 4);
static T3_HI_X8: [f32; 8] = rep::<8>(&CODEBOOK_3BIT, 4, 4);
static T2_X16: [f32; 16] = rep::<16>(&CODEBOOK_2BIT, 0, 4);
static T3_LO_X16: [f32; 16] = rep::<16>(&CODEBOOK_3BIT, 0, 4);
static T3_HI_X16: [f32; 16] = rep::<16>(&CODEBOOK_3BIT, 4, 4);

#[inline(always)]
pub(crate) unsafe fn scale_at(p: *const u8) -> f32 {
    decode_scale(u16::from_ne_bytes([*p, *p.add(1)]))
}

// ------------------------------------------------------------------ AVX2 ---

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn ld8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// 16-entry lookup: entries 0-7 in `lo`, 8-15 in `hi`, bit 3 of each lane
/// selects (bits above 3 are ignored).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lut16(lo: __m256, hi: __m256, idx: __m256i) -> __m256 {
    let m = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx));
    _mm256_blendv_ps(
        _mm256_permutevar8x32_ps(lo, idx),
        _mm256_permutevar8x32_ps(hi, idx),
        m,
    )
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Visits the 8 groups of 8 values of one turbo2 block: `$f(offset, values)`.
macro_rules! avx2_t2_groups {
    ($qs:expr, $t:expr, $f:expr) => {{
        let q0 = ld8($qs);
        let q1 = ld8($qs.add(8));
        let t = $t;
        $f(0, _mm256_permutevar8x32_ps(t, q0));
        $f(8, _mm256_permutevar8x32_ps(t, q1));
        $f(16, _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<2>(q0)));
        $f(24, _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<2>(q1)));
        $f(32, _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<4>(q0)));
        $f(40, _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<4>(q1)));
        $f(48, _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<6>(q0)));
        $f(56, _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<6>(q1)));
    }};
}

/// turbo3: low two bits as turbo2, high bit of lane `l` of group `g` is bit `l`
/// of `qs[16 + g]`, moved to the sign bit by a variable left shift.
macro_rules! avx2_t3_groups {
    ($qs:expr, $tlo:expr, $thi:expr, $f:expr) => {{
        let qs = $qs;
        let q0 = ld8(qs);
        let q1 = ld8(qs.add(8));
        let (tlo, thi) = ($tlo, $thi);
        // High-bit byte g is broadcast straight from memory (a load, no shuffle
        // port): a dword at qs+16+g (g < 4) has it in bits 0-7, a dword at
        // qs+13+g (g >= 4, stays inside the block) in bits 24-31; the variable
        // shift moves bit l of it to the sign bit of lane l.
        let sh_lo = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
        let sh_hi = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
        let look = |i: __m256i, g: usize| {
            let (p, sh) = if g < 4 {
                (qs.add(16 + g), sh_lo)
            } else {
                (qs.add(13 + g), sh_hi)
            };
            let m = _mm256_sllv_epi32(_mm256_set1_epi32((p as *const i32).read_unaligned()), sh);
            _mm256_blendv_ps(
                _mm256_permutevar8x32_ps(tlo, i),
                _mm256_permutevar8x32_ps(thi, i),
                _mm256_castsi256_ps(m),
            )
        };
        $f(0, look(q0, 0));
        $f(8, look(q1, 1));
        $f(16, look(_mm256_srli_epi32::<2>(q0), 2));
        $f(24, look(_mm256_srli_epi32::<2>(q1), 3));
        $f(32, look(_mm256_srli_epi32::<4>(q0), 4));
        $f(40, look(_mm256_srli_epi32::<4>(q1), 5));
        $f(48, look(_mm256_srli_epi32::<6>(q0), 6));
        $f(56, look(_mm256_srli_epi32::<6>(q1), 7));
    }};
}

macro_rules! avx2_t4_groups {
    ($qs:expr, $tlo:expr, $thi:expr, $f:expr) => {{
        let qs = $qs;
        let (tlo, thi) = ($tlo, $thi);
        let v0 = ld8(qs);
        let v1 = ld8(qs.add(8));
        let v2 = ld8(qs.add(16));
        let v3 = ld8(qs.add(24));
        $f(0, lut16(tlo, thi, v0));
        $f(8, lut16(tlo, thi, v1));
        $f(16, lut16(tlo, thi, v2));
        $f(24, lut16(tlo, thi, v3));
        $f(32, lut16(tlo, thi, _mm256_srli_epi32::<4>(v0)));
        $f(40, lut16(tlo, thi, _mm256_srli_epi32::<4>(v1)));
        $f(48, lut16(tlo, thi, _mm256_srli_epi32::<4>(v2)));
        $f(56, lut16(tlo, thi, _mm256_srli_epi32::<4>(v3)));
    }};
}

static T4_LO: [f32; 8] = rep::<8>(&CODEBOOK_4BIT, 0, 8);
static T4_HI: [f32; 8] = rep::<8>(&CODEBOOK_4BIT, 8, 8);

// --------------------------------------------------------------- AVX-512 ---

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn ld16(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
}

macro_rules! avx512_t2_groups {
    ($qs:expr, $t:expr, $f:expr) => {{
        let q = ld16($qs);
        let t = $t;
        $f(0, _mm512_permutexvar_ps(q, t));
        $f(16, _mm512_permutexvar_ps(_mm512_srli_epi32::<2>(q), t));
        $f(32, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), t));
        $f(48, _mm512_permutexvar_ps(_mm512_srli_epi32::<6>(q), t));
    }};
}

macro_rules! avx512_t3_groups {
    ($qs:expr, $tlo:expr, $thi:expr, $f:expr) => {{
        let qs = $qs;
        let q = ld16(qs);
        let (tlo, thi) = ($tlo, $thi);
        let look = |i: __m512i, g: usize| {
            let k: __mmask16 = u16::from_le_bytes([*qs.add(16 + 2 * g), *qs.add(17 + 2 * g)]);
            _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(i, tlo), k, i, thi)
        };
        $f(0, look(q, 0));
        $f(16, look(_mm512_srli_epi32::<2>(q), 1));
        $f(32, look(_mm512_srli_epi32::<4>(q), 2));
        $f(48, look(_mm512_srli_epi32::<6>(q), 3));
    }};
}

macro_rules! avx512_t4_groups {
    ($qs:expr, $t:expr, $f:expr) => {{
        let qs = $qs;
        let t = $t;
        let v0 = ld16(qs);
        let v1 = ld16(qs.add(16));
        $f(0, _mm512_permutexvar_ps(v0, t));
        $f(16, _mm512_permutexvar_ps(v1, t));
        $f(32, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v0), t));
        $f(48, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v1), t));
    }};
}

// ---------------------------------------------------------- both widths ---

/// The spellings AVX2 and AVX-512 differ in, handed to `$m!` in front of its arguments:
/// `[target features, lanes, vector type, loadu, storeu, set1, setzero, add, mul, fmadd,
/// horizontal sum, the four horizontal sums of four vectors (rows.rs)]`. The kernels are
/// written once (`kernels!` here, `rows!` in rows.rs) over these; the group visitors
/// (`avx2_t3_groups`, ...) stay per width, since their lookups differ in more than names.
macro_rules! avx2 {
    ($m:ident!($($args:tt)*)) => {
        $m!(["avx2,fma", 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
             _mm256_setzero_ps, _mm256_add_ps, _mm256_mul_ps, _mm256_fmadd_ps, hsum256, hsum4_256]
            $($args)*);
    };
}
macro_rules! avx512 {
    ($m:ident!($($args:tt)*)) => {
        $m!(["avx512f", 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
             _mm512_setzero_ps, _mm512_add_ps, _mm512_mul_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps,
             hsum4_512]
            $($args)*);
    };
}

/// Calls the group visitor `$groups` with the table registers `$t` (one or two).
macro_rules! visit {
    ($groups:ident, $qs:expr, $t:expr, $f:expr, [$t0:ident]) => {
        $groups!($qs, $t[0], $f)
    };
    ($groups:ident, $qs:expr, $t:expr, $f:expr, [$t0:ident, $t1:ident]) => {
        $groups!($qs, $t[0], $t[1], $f)
    };
}

/// Generates dequantize / vec_dot / mad of each type, at one width (`avx2!(kernels!(...))`).
/// Per type: `(block bytes, names, [unscaled table statics], group visitor)`.
macro_rules! kernels {
    ([$feat:literal, $w:literal, $V:ident, $loadu:ident, $storeu:ident, $set1:ident, $zero:ident,
      $add:ident, $mul:ident, $fmadd:ident, $hsum:ident, $hsum4:ident]
     $(($bytes:expr, $deq:ident, $dot:ident, $mad:ident, [$($tab:ident),+], $groups:ident)),+ $(,)?) => {$(
        #[target_feature(enable = $feat)]
        pub unsafe fn $deq(x: *const u8, y: *mut f32, nb: usize) {
            let tabs = [$($loadu($tab.as_ptr())),+];
            for b in 0..nb {
                let blk = x.add(b * $bytes);
                let d = $set1(scale_at(blk));
                let yb = y.add(b * 64);
                let st = |off: usize, v: $V| $storeu(yb.add(off), v);
                let t = tabs.map(|t| $mul(d, t));
                visit!($groups, blk.add(2), t, st, [$($tab),+]);
            }
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn $dot(x: *const u8, y: *const f32, nb: usize) -> f32 {
            let tabs = [$($loadu($tab.as_ptr())),+];
            // four independent accumulators hide the FMA latency
            let mut acc = [$zero(); 4];
            for b in 0..nb {
                let blk = x.add(b * $bytes);
                let d = $set1(scale_at(blk));
                let yb = y.add(b * 64);
                let mut f = |off: usize, v: $V| {
                    let a = &mut acc[(off / $w) % 4];
                    *a = $fmadd(v, $loadu(yb.add(off)), *a);
                };
                let t = tabs.map(|t| $mul(d, t));
                visit!($groups, blk.add(2), t, f, [$($tab),+]);
            }
            $hsum($add($add(acc[0], acc[1]), $add(acc[2], acc[3])))
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn $mad(x: *const u8, y: *mut f32, nb: usize, v: f32) {
            let tabs = [$($loadu($tab.as_ptr())),+];
            let vv = $set1(v);
            for b in 0..nb {
                let blk = x.add(b * $bytes);
                let d = $set1(scale_at(blk));
                let yb = y.add(b * 64);
                let f = |off: usize, t: $V| {
                    let p = yb.add(off);
                    $storeu(p, $add($loadu(p), t));
                };
                // table = v * (d * C): the same two roundings as the scalar oracle.
                let t = tabs.map(|t| $mul(vv, $mul(d, t)));
                visit!($groups, blk.add(2), t, f, [$($tab),+]);
            }
        }
    )+};
}

avx2!(kernels!(
    (
        crate::types::TURBO2.block_bytes(),
        avx2_dequantize_t2,
        avx2_vec_dot_t2,
        avx2_mad_t2,
        [T2_X8],
        avx2_t2_groups
    ),
    (
        crate::types::TURBO3.block_bytes(),
        avx2_dequantize_t3,
        avx2_vec_dot_t3,
        avx2_mad_t3,
        [T3_LO_X8, T3_HI_X8],
        avx2_t3_groups
    ),
    (
        crate::types::TURBO4.block_bytes(),
        avx2_dequantize_t4,
        avx2_vec_dot_t4,
        avx2_mad_t4,
        [T4_LO, T4_HI],
        avx2_t4_groups
    ),
));
avx512!(kernels!(
    (
        crate::types::TURBO2.block_bytes(),
        avx512_dequantize_t2,
        avx512_vec_dot_t2,
        avx512_mad_t2,
        [T2_X16],
        avx512_t2_groups
    ),
    (
        crate::types::TURBO3.block_bytes(),
        avx512_dequantize_t3,
        avx512_vec_dot_t3,
        avx512_mad_t3,
        [T3_LO_X16, T3_HI_X16],
        avx512_t3_groups
    ),
    (
        crate::types::TURBO4.block_bytes(),
        avx512_dequantize_t4,
        avx512_vec_dot_t4,
        avx512_mad_t4,
        [CODEBOOK_4BIT],
        avx512_t4_groups
    ),
));

pub mod rows;
