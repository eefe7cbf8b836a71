//! The C ABI of `ggml-ext/abi/turboquant.h`.
//!
//! Every function runs its body inside `std::panic::catch_unwind`: a panic
//! (a bug) never unwinds into C; checked functions then return
//! `TQ_ERR_PANIC`, the `void` ggml hooks return without writing.
//!
//! Checked functions validate in this order: the type (or rotation `dim`), then
//! every pointer (NULL is an error even when the length is 0), then lengths
//! (negative or not a multiple of the block size / `dim`).
//!
//! The `tq_ggml_*` hooks trust ggml's invariants (non-null, lengths multiples
//! of 64); a trailing partial block is ignored rather than read out of bounds.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};

use turboquant_codec::block::{scale_is_valid, TqType, QK};
use turboquant_codec::error::{TqError, TQ_ERR_PANIC, TQ_OK};
use turboquant_codec::kernels::{self, simd_level};
use turboquant_codec::rotation;
use turboquant_codec::tcq::{self, TcqType};

#[inline(always)]
fn guard(f: impl FnOnce() -> Result<c_int, TqError>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => e.code(),
        Err(_) => TQ_ERR_PANIC,
    }
}

#[inline(always)]
fn guard_void(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// A C type id of the checked functions: a scalar turbo type (`tq_type`) or a trellis type
/// (`TQ_TURBO3_TCQ`, `TQ_TURBO2_TCQ`). One dispatch point, so each checked function exists
/// once for every type family.
#[derive(Clone, Copy)]
enum CType {
    Turbo(TqType),
    Tcq(TcqType),
}

fn ty_of(t: c_int) -> Result<CType, TqError> {
    TqType::from_i32(t)
        .map(CType::Turbo)
        .or_else(|_| tcq_abi::tcq_type_of(t).map(CType::Tcq))
}

impl CType {
    fn block_bytes(self) -> usize {
        match self {
            CType::Turbo(t) => t.block_bytes(),
            CType::Tcq(t) => t.block_bytes(),
        }
    }
}

fn blocks_of(n: i64) -> Result<usize, TqError> {
    if n < 0 || n % QK as i64 != 0 {
        Err(TqError::BadLength)
    } else {
        Ok((n / QK as i64) as usize)
    }
}

fn nonnull<T>(p: *const T) -> Result<(), TqError> {
    if p.is_null() {
        Err(TqError::NullPointer)
    } else {
        Ok(())
    }
}

/// Values per block (64); -1 for an unknown type.
#[no_mangle]
pub extern "C" fn tq_block_values(t: c_int) -> i64 {
    match ty_of(t) {
        Ok(_) => QK as i64,
        Err(_) => -1,
    }
}

/// Bytes per block (18/26/34, trellis 26/18); -1 for an unknown type.
#[no_mangle]
pub extern "C" fn tq_block_bytes(t: c_int) -> i64 {
    match ty_of(t) {
        Ok(ty) => ty.block_bytes() as i64,
        Err(_) => -1,
    }
}

/// Encodes `n` floats into `n / 64` blocks (a trellis type with the calling thread's
/// Viterbi scratch, as its ggml hook).
#[no_mangle]
pub unsafe extern "C" fn tq_quantize(t: c_int, x: *const f32, out: *mut c_void, n: i64) -> c_int {
    guard(|| {
        let ty = ty_of(t)?;
        nonnull(x)?;
        nonnull(out)?;
        let nb = blocks_of(n)?;
        let xs = core::slice::from_raw_parts(x, nb * QK);
        let os = core::slice::from_raw_parts_mut(out as *mut u8, nb * ty.block_bytes());
        match ty {
            CType::Turbo(ty) => kernels::scalar::quantize_row(ty, xs, os),
            CType::Tcq(ty) => tcq::codec::quantize_thread_scratch(ty, xs, os)?,
        }
        Ok(TQ_OK)
    })
}

/// Decodes `n / 64` blocks into `n` floats.
#[no_mangle]
pub unsafe extern "C" fn tq_dequantize(t: c_int, x: *const c_void, y: *mut f32, n: i64) -> c_int {
    guard(|| {
        let ty = ty_of(t)?;
        nonnull(x)?;
        nonnull(y)?;
        let nb = blocks_of(n)?;
        let x = x as *const u8;
        match ty {
            CType::Turbo(ty) => kernels::dequantize_raw(simd_level(), ty, x, y, nb),
            CType::Tcq(ty) => tcq::kernels::dequantize_raw(simd_level(), ty, x, y, nb),
        }
        Ok(TQ_OK)
    })
}

/// `*out = Σ decode(x) * y` over `n` values.
#[no_mangle]
pub unsafe extern "C" fn tq_vec_dot_f32(
    t: c_int,
    x: *const c_void,
    y: *const f32,
    n: i64,
    out: *mut f32,
) -> c_int {
    guard(|| {
        let ty = ty_of(t)?;
        nonnull(x)?;
        nonnull(y)?;
        nonnull(out)?;
        let nb = blocks_of(n)?;
        let x = x as *const u8;
        *out = match ty {
            CType::Turbo(ty) => kernels::vec_dot_raw(simd_level(), ty, x, y, nb),
            CType::Tcq(ty) => tcq::kernels::vec_dot_raw(simd_level(), ty, x, y, nb),
        };
        Ok(TQ_OK)
    })
}

/// Addition to the header: checked `y[0..n) += v * decode(x)`.
#[no_mangle]
pub unsafe extern "C" fn tq_mad(t: c_int, x: *const c_void, y: *mut f32, n: i64, v: f32) -> c_int {
    guard(|| {
        let ty = ty_of(t)?;
        nonnull(x)?;
        nonnull(y)?;
        let nb = blocks_of(n)?;
        let x = x as *const u8;
        match ty {
            CType::Turbo(ty) => kernels::mad_raw(simd_level(), ty, x, y, nb, v),
            CType::Tcq(ty) => tcq::kernels::mad_raw(simd_level(), ty, x, y, nb, v),
        }
        Ok(TQ_OK)
    })
}

fn dim_of(dim: i64) -> Result<usize, TqError> {
    if dim < 2 || dim > rotation::MAX_DIM as i64 {
        return Err(TqError::BadDim);
    }
    let d = dim as usize;
    rotation::check_dim(d)?;
    Ok(d)
}

/// The dense `dim x dim` row-major rotation matrix.
#[no_mangle]
pub unsafe extern "C" fn tq_rotation_matrix(dim: i64, seed: u64, out: *mut f32) -> c_int {
    guard(|| {
        let d = dim_of(dim)?;
        nonnull(out)?;
        let os = core::slice::from_raw_parts_mut(out, d * d);
        rotation::rotation_matrix_into(d, seed, os)?;
        Ok(TQ_OK)
    })
}

/// Rotates `n / dim` consecutive vectors in place.
#[no_mangle]
pub unsafe extern "C" fn tq_rotate(dim: i64, seed: u64, x: *mut f32, n: i64) -> c_int {
    guard(|| {
        let d = dim_of(dim)?;
        nonnull(x)?;
        if n < 0 || n % dim != 0 {
            return Err(TqError::BadLength);
        }
        let xs = core::slice::from_raw_parts_mut(x, n as usize);
        rotation::rotate(d, seed, xs)?;
        Ok(TQ_OK)
    })
}

/// Copies the type's `2^bits` ascending centroids into `out`
/// (`capacity >= 2^bits`, else `TQ_ERR_BAD_LENGTH`). Returns 0. A trellis type has no
/// codebook (its reconstruction table is in turboquant_tcq_tables.h): unknown type.
#[no_mangle]
pub unsafe extern "C" fn tq_codebook(t: c_int, out: *mut f32, capacity: i64) -> c_int {
    guard(|| {
        let ty = TqType::from_i32(t)?;
        nonnull(out)?;
        let cb = ty.codebook();
        if capacity < cb.len() as i64 {
            return Err(TqError::BadLength);
        }
        core::ptr::copy_nonoverlapping(cb.as_ptr(), out, cb.len());
        Ok(TQ_OK)
    })
}

/// A static message for an error code; never NULL.
#[no_mangle]
pub extern "C" fn tq_error_string(code: c_int) -> *const c_char {
    let s: &'static [u8] = match code {
        0 => b"success\0",
        -1 => b"unknown turbo type (expected 2, 3 or 4)\0",
        -2 => b"bad length: negative, not a multiple of the block size or dimension, or buffer too small\0",
        -3 => b"null pointer\0",
        -4 => b"bad dimension: must be a power of two in 2..=65536\0",
        -5 => b"internal panic caught at the C ABI boundary\0",
        _ => b"unknown error code\0",
    };
    s.as_ptr() as *const c_char
}

/// Addition to the header: name of the SIMD path in use (`"avx512"`,
/// `"avx2"`, `"scalar"`); static, never NULL.
#[no_mangle]
pub extern "C" fn tq_simd_name() -> *const c_char {
    let s: &'static [u8] = match simd_level() {
        kernels::SimdLevel::Scalar => b"scalar\0",
        kernels::SimdLevel::Avx2 => b"avx2\0",
        kernels::SimdLevel::Avx512 => b"avx512\0",
    };
    s.as_ptr() as *const c_char
}

// ------------------------------------------------------------ ggml hooks ---

#[inline(always)]
fn nblocks(k: i64) -> usize {
    if k <= 0 {
        0
    } else {
        (k as u64 / QK as u64) as usize
    }
}

/// ggml `from_float` of a turbo type: `k` floats into `k / 64` blocks (the scalar encoder).
fn turbo_quantize_raw(ty: TqType, x: *const f32, y: *mut c_void, k: i64) {
    let nb = nblocks(k);
    // SAFETY (caller): ggml passes k floats and room for k / 64 blocks.
    let xs = unsafe { core::slice::from_raw_parts(x, nb * QK) };
    let ys = unsafe { core::slice::from_raw_parts_mut(y as *mut u8, nb * ty.block_bytes()) };
    kernels::scalar::quantize_row(ty, xs, ys);
}

/// The four ggml type-trait hooks of one block type (turbo or trellis): `$encode` is its
/// `from_float`; decoding goes through the codec's dispatching row kernels
/// ([`kernels::RowType`]), the same for both families.
macro_rules! ggml_hooks {
    ($ty:expr, $encode:ident, $q:ident, $dq:ident, $dot:ident, $mad:ident) => {
        /// ggml `from_float`: encodes `k` floats.
        #[no_mangle]
        pub unsafe extern "C" fn $q(x: *const f32, y: *mut c_void, k: i64) {
            guard_void(|| $encode($ty, x, y, k))
        }

        /// ggml `to_float`: decodes `k` values.
        #[no_mangle]
        pub unsafe extern "C" fn $dq(x: *const c_void, y: *mut f32, k: i64) {
            guard_void(|| kernels::dequantize_raw(simd_level(), $ty, x as *const u8, y, nblocks(k)))
        }

        /// ggml `vec_dot`: `s[0] = dot(x, y)` over `n` values (only `nrc == 1`
        /// is meaningful; strides are unused).
        #[no_mangle]
        pub unsafe extern "C" fn $dot(
            n: c_int,
            s: *mut f32,
            _bs: usize,
            x: *const c_void,
            _bx: usize,
            y: *const c_void,
            _by: usize,
            _nrc: c_int,
        ) {
            guard_void(|| {
                *s = kernels::vec_dot_raw(
                    simd_level(),
                    $ty,
                    x as *const u8,
                    y as *const f32,
                    nblocks(n as i64),
                );
            })
        }

        /// Flash-attention V accumulation: `y[0..k) += v * decode(x)`.
        #[no_mangle]
        pub unsafe extern "C" fn $mad(x: *const c_void, y: *mut f32, k: i64, v: f32) {
            guard_void(|| kernels::mad_raw(simd_level(), $ty, x as *const u8, y, nblocks(k), v))
        }
    };
}

ggml_hooks!(
    TqType::Turbo2,
    turbo_quantize_raw,
    tq_ggml_quantize_row_turbo2,
    tq_ggml_dequantize_row_turbo2,
    tq_ggml_vec_dot_turbo2_f32,
    tq_ggml_mad_turbo2
);
ggml_hooks!(
    TqType::Turbo3,
    turbo_quantize_raw,
    tq_ggml_quantize_row_turbo3,
    tq_ggml_dequantize_row_turbo3,
    tq_ggml_vec_dot_turbo3_f32,
    tq_ggml_mad_turbo3
);
ggml_hooks!(
    TqType::Turbo4,
    turbo_quantize_raw,
    tq_ggml_quantize_row_turbo4,
    tq_ggml_dequantize_row_turbo4,
    tq_ggml_vec_dot_turbo4_f32,
    tq_ggml_mad_turbo4
);

/// The flash-attention tile hooks of one block type (turbo or trellis), on the codec's
/// dispatching row kernels ([`kernels::RowType`]).
macro_rules! ggml_tile_hooks {
    ($ty:expr, $dot_rows:ident, $mad_rows:ident) => {
        /// Flash-attention key tile: `scores[r] = dot(decode(x + r * stride), q)`
        /// over `k` values, `r < nrows`.
        #[no_mangle]
        pub unsafe extern "C" fn $dot_rows(
            x: *const c_void,
            stride: usize,
            nrows: i64,
            q: *const f32,
            k: i64,
            scores: *mut f32,
        ) {
            guard_void(|| {
                let n = nrows.max(0) as usize;
                let (x, nb) = (x as *const u8, nblocks(k));
                kernels::dot_rows_raw(simd_level(), $ty, x, stride, n, q, nb, scores)
            })
        }

        /// Flash-attention value tile: `y[0..k) += Σ_r w[r] * decode(x + r * stride)`.
        #[no_mangle]
        pub unsafe extern "C" fn $mad_rows(
            x: *const c_void,
            stride: usize,
            nrows: i64,
            w: *const f32,
            y: *mut f32,
            k: i64,
        ) {
            guard_void(|| {
                let n = nrows.max(0) as usize;
                let (x, nb) = (x as *const u8, nblocks(k));
                kernels::mad_rows_raw(simd_level(), $ty, x, stride, n, w, y, nb)
            })
        }
    };
}

ggml_tile_hooks!(
    TqType::Turbo2,
    tq_ggml_dot_rows_turbo2,
    tq_ggml_mad_rows_turbo2
);
ggml_tile_hooks!(
    TqType::Turbo3,
    tq_ggml_dot_rows_turbo3,
    tq_ggml_mad_rows_turbo3
);
ggml_tile_hooks!(
    TqType::Turbo4,
    tq_ggml_dot_rows_turbo4,
    tq_ggml_mad_rows_turbo4
);

/// The tiled flash-attention decode path (tq-ggml-fa.h): 0 off (ggml's per-key loop), 1
/// tiles per query head, 2 tiles shared by the query heads of a GQA group (the default).
/// Read once from `TQ_FA_TILE` (a row of the switches table: `0`, `1` or `2`, unset or empty
/// is 2; any other value stops the process with the table's message), unless
/// [`tq_ggml_set_fa_tile`] said otherwise.
#[no_mangle]
pub extern "C" fn tq_ggml_fa_tile() -> c_int {
    match FA_TILE.load(Ordering::Relaxed) {
        v @ 0..=2 => v as c_int,
        _ => {
            // the row's values are "0|1|2": the index is the level
            let v = turboquant_codec::switches::get("TQ_FA_TILE") as u8;
            FA_TILE.store(v, Ordering::Relaxed);
            v as c_int
        }
    }
}

/// Sets the tiled decode level (0, 1 or 2 as [`tq_ggml_fa_tile`]; values above 2 mean 2,
/// below 0 mean 0), overriding `TQ_FA_TILE` (for tests and benchmarks comparing them).
#[no_mangle]
pub extern "C" fn tq_ggml_set_fa_tile(on: c_int) {
    FA_TILE.store(on.clamp(0, 2) as u8, Ordering::Relaxed);
}

static FA_TILE: AtomicU8 = AtomicU8::new(u8::MAX);

/// `ggml_validate_row_data`: 1 if `nbytes` is a whole number of blocks and
/// every block scale is a finite, non-negative fp16; else 0 (also for an
/// unknown type, or a NULL `x` with `nbytes > 0`).
#[no_mangle]
pub unsafe extern "C" fn tq_ggml_validate_row(t: c_int, x: *const c_void, nbytes: usize) -> c_int {
    let r = guard(|| {
        let ty = ty_of(t)?;
        let bb = ty.block_bytes();
        if !nbytes.is_multiple_of(bb) {
            return Ok(0);
        }
        if nbytes == 0 {
            return Ok(1);
        }
        nonnull(x)?;
        let bytes = core::slice::from_raw_parts(x as *const u8, nbytes);
        Ok(bytes
            .chunks_exact(bb)
            .all(|b| scale_is_valid(u16::from_ne_bytes([b[0], b[1]]))) as c_int)
    });
    (r == 1) as c_int
}

// ------------------------------------------- trellis-coded ggml hooks ---
//
// turbo3_tcq / turbo2_tcq (crates/codec/src/tcq, docs/TCQ.md), on the codec's
// dispatching kernels. The encoder needs a Viterbi `Scratch` (tens of KB): one per
// thread and type, made on a thread's first call and reused, so no call after the
// first allocates.

fn tcq_quantize_raw(ty: TcqType, x: *const f32, y: *mut c_void, k: i64) {
    let nb = nblocks(k);
    // SAFETY (caller): ggml passes k floats and room for k / 64 blocks.
    let xs = unsafe { core::slice::from_raw_parts(x, nb * QK) };
    let ys = unsafe { core::slice::from_raw_parts_mut(y as *mut u8, nb * ty.block_bytes()) };
    // the codec's per-thread scratch, shared with tq_quantize
    let _ = tcq::codec::quantize_thread_scratch(ty, xs, ys);
}

ggml_hooks!(
    turboquant_codec::tcq::TcqType::Turbo3Tcq,
    tcq_quantize_raw,
    tq_ggml_quantize_row_turbo3_tcq,
    tq_ggml_dequantize_row_turbo3_tcq,
    tq_ggml_vec_dot_turbo3_tcq_f32,
    tq_ggml_mad_turbo3_tcq
);
ggml_hooks!(
    turboquant_codec::tcq::TcqType::Turbo2Tcq,
    tcq_quantize_raw,
    tq_ggml_quantize_row_turbo2_tcq,
    tq_ggml_dequantize_row_turbo2_tcq,
    tq_ggml_vec_dot_turbo2_tcq_f32,
    tq_ggml_mad_turbo2_tcq
);

// The trellis types' checked functions and tile hooks (they use the macros above).
mod tcq_abi;
pub use tcq_abi::*;

// -------------------------------------------------------- link anchor ---

#[repr(transparent)]
struct ExportTable<const N: usize>([*const (); N]);
// SAFETY: the table holds code addresses only, never dereferenced as data.
unsafe impl<const N: usize> Sync for ExportTable<N> {}

include!(concat!(env!("OUT_DIR"), "/exports.rs"));

/// References every exported C function, so a binary that links static C++
/// archives calling these symbols keeps them: call it (once) from the binary.
/// Returns a value derived from the addresses (meaningless, non-zero).
#[inline(never)]
pub fn link_anchor() -> usize {
    let t = std::hint::black_box(&EXPORTS);
    t.0.iter().fold(0usize, |a, &p| a.wrapping_add(p as usize)) | 1
}
