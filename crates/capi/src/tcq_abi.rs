//! C ABI of the trellis-coded types turbo3_tcq / turbo2_tcq (docs/TCQ.md) beyond what
//! `lib.rs` exports for them: their type ids, which the checked functions of `lib.rs`
//! (`tq_quantize`, `tq_dequantize`, `tq_vec_dot_f32`, `tq_mad`, `tq_block_bytes`,
//! `tq_ggml_validate_row`) accept beside the `tq_type` ids, and the flash-attention tile
//! hooks. The per-type ggml hooks (`tq_ggml_{quantize_row,dequantize_row}_*_tcq`,
//! `tq_ggml_vec_dot_*_tcq_f32`, `tq_ggml_mad_*_tcq`) are in `lib.rs`.
//!
//! NaN / ±Inf inputs are sanitized by the encoder as for the turbo types
//! (NaN -> 0, ±Inf -> ±65504). The encoder's Viterbi scratch (about 72 KB) is
//! per thread and type, made on the thread's first call.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_int, c_void};

use turboquant_codec::error::TqError;
use turboquant_codec::kernels::simd_level;
use turboquant_codec::tcq::{kernels, TcqType};

// The tile hooks' panic guard and block count are the turbo hooks' own (lib.rs).
use super::{guard_void, nblocks};

/// C type id of turbo3_tcq (`TQ_TURBO3_TCQ` in turboquant.h).
pub const TQ_TURBO3_TCQ: c_int = 13;
/// C type id of turbo2_tcq (`TQ_TURBO2_TCQ` in turboquant.h).
pub const TQ_TURBO2_TCQ: c_int = 12;

/// The trellis type of a C type id.
pub fn tcq_type_of(t: c_int) -> Result<TcqType, TqError> {
    match t {
        TQ_TURBO3_TCQ => Ok(TcqType::Turbo3Tcq),
        TQ_TURBO2_TCQ => Ok(TcqType::Turbo2Tcq),
        _ => Err(TqError::UnknownType),
    }
}

ggml_tile_hooks!(
    TcqType::Turbo3Tcq,
    tq_ggml_dot_rows_turbo3_tcq,
    tq_ggml_mad_rows_turbo3_tcq
);
ggml_tile_hooks!(
    TcqType::Turbo2Tcq,
    tq_ggml_dot_rows_turbo2_tcq,
    tq_ggml_mad_rows_turbo2_tcq
);
