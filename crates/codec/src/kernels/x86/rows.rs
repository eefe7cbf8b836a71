//! Multi-row kernels for flash-attention decode: a tile of key rows scored
//! against one query, and a tile of value rows accumulated into one output.
//!
//! `dot_rows` runs four rows at once: each row keeps its own vector
//! accumulator, the query block is loaded once per four rows, and the four
//! horizontal sums are done together by one transpose-and-add. Codebook
//! lookups use the unscaled table; the block scale multiplies the block's
//! partial sum (one FMA per row and block), so results differ from
//! `vec_dot` only in rounding order.
//!
//! `mad_rows` keeps one output block in registers while it adds every row's
//! `w[r] * (d * C[idx])` (the table scaled exactly as `mad` scales it, rows in
//! order): bit-exact with `nrows` sequential `mad` calls.
//!
//! Rows are `stride` bytes apart, each `nb` whole blocks; callers guarantee
//! the lengths.

use core::arch::x86_64::*;

use super::*;

/// Row pointers of a pass of four starting at row `r`; past the last row the
/// last row is repeated (computed, never stored).
#[inline(always)]
unsafe fn rows4(x: *const u8, stride: usize, r: usize, nrows: usize) -> [*const u8; 4] {
    let last = nrows - 1;
    [0, 1, 2, 3].map(|i| x.add((r + i).min(last) * stride))
}

/// Stores the first `n <= 4` lanes of `s` (a full pass: one unaligned store).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn store_first(out: *mut f32, s: __m128, n: usize) {
    if n == 4 {
        _mm_storeu_ps(out, s);
    } else {
        let mut t = [0f32; 4];
        _mm_storeu_ps(t.as_mut_ptr(), s);
        for (i, &v) in t.iter().enumerate().take(n) {
            *out.add(i) = v;
        }
    }
}

/// The four horizontal sums of `a[0..4]` (8 lanes each).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum4_256(a: [__m256; 4]) -> __m128 {
    let h01 = _mm256_hadd_ps(a[0], a[1]);
    let h23 = _mm256_hadd_ps(a[2], a[3]);
    let h = _mm256_hadd_ps(h01, h23);
    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
}

/// The four horizontal sums of `a[0..4]` (16 lanes each).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hsum4_512(a: [__m512; 4]) -> __m128 {
    // 128-bit lane k of x01 = lane k%2 + lane k%2+2 of a[k/2]
    let x01 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(a[0], a[1]),
        _mm512_shuffle_f32x4::<0xEE>(a[0], a[1]),
    );
    let x23 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(a[2], a[3]),
        _mm512_shuffle_f32x4::<0xEE>(a[2], a[3]),
    );
    // lane r = the four partial sums of row r
    let y = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x88>(x01, x23),
        _mm512_shuffle_f32x4::<0xDD>(x01, x23),
    );
    let y = _mm512_add_ps(y, _mm512_permute_ps::<0xB1>(y));
    let y = _mm512_add_ps(y, _mm512_permute_ps::<0x4E>(y));
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, y))
}

/// Generates dot_rows / mad_rows of each type, at one width (`avx2!(rows!(...))`, the
/// spellings in x86.rs). Per type: `(block bytes, names, [unscaled table statics], group
/// visitor)`.
macro_rules! rows {
    ([$feat:literal, $w:literal, $V:ident, $loadu:ident, $storeu:ident, $set1:ident, $zero:ident,
      $add:ident, $mul:ident, $fmadd:ident, $hsum:ident, $hsum4:ident]
     $(($bytes:expr, $dot:ident, $mad:ident, [$($tab:ident),+], $groups:ident)),+ $(,)?) => {$(
        #[target_feature(enable = $feat)]
        pub unsafe fn $dot(
            x: *const u8,
            stride: usize,
            nrows: usize,
            q: *const f32,
            nb: usize,
            out: *mut f32,
        ) {
            let tabs = [$($loadu($tab.as_ptr())),+];
            let mut r = 0;
            while r < nrows {
                let rows = rows4(x, stride, r, nrows);
                let mut acc = [$zero(); 4];
                for b in 0..nb {
                    let qb = q.add(b * 64);
                    for i in 0..4 {
                        let blk = rows[i].add(b * $bytes);
                        let mut p = [$zero(); 2];
                        let mut f = |off: usize, v: $V| {
                            let a = &mut p[(off / $w) % 2];
                            *a = $fmadd(v, $loadu(qb.add(off)), *a);
                        };
                        visit!($groups, blk.add(2), tabs, f, [$($tab),+]);
                        let d = $set1(scale_at(blk));
                        acc[i] = $fmadd(d, $add(p[0], p[1]), acc[i]);
                    }
                }
                store_first(out.add(r), $hsum4(acc), (nrows - r).min(4));
                r += 4;
            }
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn $mad(
            x: *const u8,
            stride: usize,
            nrows: usize,
            w: *const f32,
            y: *mut f32,
            nb: usize,
        ) {
            let tabs = [$($loadu($tab.as_ptr())),+];
            for b in 0..nb {
                let yb = y.add(b * 64);
                let mut acc: [$V; 64 / $w] = core::array::from_fn(|g| $loadu(yb.add($w * g)));
                for r in 0..nrows {
                    let blk = x.add(r * stride + b * $bytes);
                    let d = $set1(scale_at(blk));
                    let vv = $set1(*w.add(r));
                    // table = w * (d * C): the roundings of `mad`
                    let t = tabs.map(|t| $mul(vv, $mul(d, t)));
                    let mut f = |off: usize, v: $V| acc[off / $w] = $add(acc[off / $w], v);
                    visit!($groups, blk.add(2), t, f, [$($tab),+]);
                }
                for (g, a) in acc.iter().enumerate() {
                    $storeu(yb.add($w * g), *a);
                }
            }
        }
    )+};
}

avx2!(rows!(
    (
        crate::types::TURBO2.block_bytes(),
        avx2_dot_rows_t2,
        avx2_mad_rows_t2,
        [T2_X8],
        avx2_t2_groups
    ),
    (
        crate::types::TURBO3.block_bytes(),
        avx2_dot_rows_t3,
        avx2_mad_rows_t3,
        [T3_LO_X8, T3_HI_X8],
        avx2_t3_groups
    ),
    (
        crate::types::TURBO4.block_bytes(),
        avx2_dot_rows_t4,
        avx2_mad_rows_t4,
        [T4_LO, T4_HI],
        avx2_t4_groups
    ),
));
avx512!(rows!(
    (
        crate::types::TURBO2.block_bytes(),
        avx512_dot_rows_t2,
        avx512_mad_rows_t2,
        [T2_X16],
        avx512_t2_groups
    ),
    (
        crate::types::TURBO3.block_bytes(),
        avx512_dot_rows_t3,
        avx512_mad_rows_t3,
        [T3_LO_X16, T3_HI_X16],
        avx512_t3_groups
    ),
    (
        crate::types::TURBO4.block_bytes(),
        avx512_dot_rows_t4,
        avx512_mad_rows_t4,
        [CODEBOOK_4BIT],
        avx512_t4_groups
    ),
));
