//! C ABI of the trellis-coded types turbo3_tcq / turbo2_tcq (docs/TCQ.md),
//! the functions GGML registration calls beyond the four per-type hooks that
//! `lib.rs` exports (`tq_ggml_{quantize_row,dequantize_row}_*_tcq`,
//! `tq_ggml_vec_dot_*_tcq_f32`, `tq_ggml_mad_*_tcq`, which run on the same
//! dispatching kernels through `turboquant_codec::tcq::codec`).
//!
//! Conventions are `lib.rs`'s exactly:
//! * every body runs inside `catch_unwind`: checked functions return
//!   `TQ_ERR_PANIC`, `void` hooks return without writing;
//! * checked functions (`tq_tcq_*`) validate the type id (`TQ_TURBO3_TCQ` /
//!   `TQ_TURBO2_TCQ`, else `TQ_ERR_UNKNOWN_TYPE`), then every pointer (NULL is
//!   an error even when the length is 0), then the length (negative or not a
//!   multiple of 64: `TQ_ERR_BAD_LENGTH`), and write nothing on error;
//! * the `tq_ggml_*` hooks trust ggml's invariants (non-null, lengths multiples
//!   of 64); a trailing partial block is ignored, `k <= 0` / `nrows <= 0` do
//!   nothing.
//!
//! NaN / ±Inf inputs are sanitized by the encoder as for the turbo types
//! (NaN -> 0, ±Inf -> ±65504). The encoder's Viterbi scratch (about 72 KB) is
//! per thread and type, made on the thread's first call.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_int, c_void};

use turboquant_codec::block::scale_is_valid;
use turboquant_codec::error::{TqError, TQ_OK};
use turboquant_codec::kernels::simd_level;
use turboquant_codec::tcq::{codec, kernels, TcqType};
use turboquant_codec::QK;

// The checks and panic guards are the turbo functions' own (lib.rs).
use super::{blocks_of, guard, guard_void, nblocks, nonnull};

/// Type id of turbo3_tcq in the checked `tq_tcq_*` functions.
pub const TQ_TURBO3_TCQ: c_int = 13;
/// Type id of turbo2_tcq in the checked `tq_tcq_*` functions.
pub const TQ_TURBO2_TCQ: c_int = 12;

/// The trellis type of a C type id.
pub fn tcq_type_of(t: c_int) -> Result<TcqType, TqError> {
    match t {
        TQ_TURBO3_TCQ => Ok(TcqType::Turbo3Tcq),
        TQ_TURBO2_TCQ => Ok(TcqType::Turbo2Tcq),
        _ => Err(TqError::UnknownType),
    }
}

/// Bytes per block (26 / 18); -1 for an unknown type id.
#[no_mangle]
pub extern "C" fn tq_tcq_block_bytes(t: c_int) -> i64 {
    match tcq_type_of(t) {
        Ok(ty) => ty.block_bytes() as i64,
        Err(_) => -1,
    }
}

/// Encodes `n` floats into `n / 64` blocks (the ggml hook's bytes).
#[no_mangle]
pub unsafe extern "C" fn tq_tcq_quantize(
    t: c_int,
    x: *const f32,
    out: *mut c_void,
    n: i64,
) -> c_int {
    guard(|| {
        let ty = tcq_type_of(t)?;
        nonnull(x)?;
        nonnull(out)?;
        let nb = blocks_of(n)?;
        let xs = core::slice::from_raw_parts(x, nb * QK);
        let os = core::slice::from_raw_parts_mut(out as *mut u8, nb * ty.block_bytes());
        codec::quantize_thread_scratch(ty, xs, os)?;
        Ok(TQ_OK)
    })
}

/// Decodes `n / 64` blocks into `n` floats.
#[no_mangle]
pub unsafe extern "C" fn tq_tcq_dequantize(
    t: c_int,
    x: *const c_void,
    y: *mut f32,
    n: i64,
) -> c_int {
    guard(|| {
        let ty = tcq_type_of(t)?;
        nonnull(x)?;
        nonnull(y)?;
        let nb = blocks_of(n)?;
        kernels::dequantize_raw(simd_level(), ty, x as *const u8, y, nb);
        Ok(TQ_OK)
    })
}

/// `*out = Σ decode(x) * y` over `n` values.
#[no_mangle]
pub unsafe extern "C" fn tq_tcq_vec_dot_f32(
    t: c_int,
    x: *const c_void,
    y: *const f32,
    n: i64,
    out: *mut f32,
) -> c_int {
    guard(|| {
        let ty = tcq_type_of(t)?;
        nonnull(x)?;
        nonnull(y)?;
        nonnull(out)?;
        let nb = blocks_of(n)?;
        *out = kernels::vec_dot_raw(simd_level(), ty, x as *const u8, y, nb);
        Ok(TQ_OK)
    })
}

/// Checked `y[0..n) += v * decode(x)`.
#[no_mangle]
pub unsafe extern "C" fn tq_tcq_mad(
    t: c_int,
    x: *const c_void,
    y: *mut f32,
    n: i64,
    v: f32,
) -> c_int {
    guard(|| {
        let ty = tcq_type_of(t)?;
        nonnull(x)?;
        nonnull(y)?;
        let nb = blocks_of(n)?;
        kernels::mad_raw(simd_level(), ty, x as *const u8, y, nb, v);
        Ok(TQ_OK)
    })
}

/// `ggml_validate_row_data` for a trellis type: 1 if `nbytes` is a whole
/// number of blocks and every block scale is a finite, non-negative fp16;
/// else 0 (also for an unknown type id, or a NULL `x` with `nbytes > 0`).
/// Every payload bit pattern is a valid trellis path.
#[no_mangle]
pub unsafe extern "C" fn tq_tcq_validate_row(t: c_int, x: *const c_void, nbytes: usize) -> c_int {
    let r = guard(|| {
        let ty = tcq_type_of(t)?;
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

ggml_tile_hooks!(
    kernels,
    TcqType::Turbo3Tcq,
    tq_ggml_dot_rows_turbo3_tcq,
    tq_ggml_mad_rows_turbo3_tcq
);
ggml_tile_hooks!(
    kernels,
    TcqType::Turbo2Tcq,
    tq_ggml_dot_rows_turbo2_tcq,
    tq_ggml_mad_rows_turbo2_tcq
);
