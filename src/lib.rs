//! TurboQuant KV-cache codec: the `turbo2` / `turbo3` / `turbo4` block types
//! (64 values per block, fp16 scale + Lloyd-Max indices), the seeded
//! randomized Hadamard rotation, the Lloyd-Max solver that produced the
//! codebooks, an optional QJL second stage, and the C ABI of
//! `ggml-ext/include/turboquant.h`.
//!
//! Encoding rule of one block `x[0..64]` (bit-exact; the CUDA port reproduces it):
//!
//! 1. sanitize: NaN -> 0, ±Inf -> ±65504, other values unchanged;
//! 2. `n = sqrt(Σ x_j²)`, squares and sum in f64, in order `j = 0..64`;
//! 3. `n == 0` -> `d = 0`, every index `2^(b-1)` (smallest positive centroid);
//! 4. else `u_j = x_j / n` in f64, `idx_j = #{k : u_j > T[k]}` with `T` the
//!    ascending f32 midpoint thresholds widened to f64 (ties -> lower centroid);
//! 5. `cn = sqrt(Σ C[idx_j]²)` in f64; `d = f16::from_f32((n / cn) as f32)`
//!    (round to nearest even), an overflow clamped to 65504.
//!
//! Decoding: `y_j = f32(d) * C[idx_j]`, one f32 multiply; a NaN, infinite or
//! negative stored scale decodes as 0 (never NaN), and `tq_ggml_validate_row`
//! rejects it. See docs/CODEC.md.

pub mod block;
pub mod codebook;
pub mod error;
pub mod ffi;
pub mod ffi_tcq;
pub mod kernels;
pub mod lab;
pub mod qjl;
pub mod rotation;
#[rustfmt::skip]
pub mod tables;
pub mod tcq;

pub use block::{BlockTurbo2, BlockTurbo3, BlockTurbo4, TqType, TurboBlock, QK};
pub use error::{Result, TqError};
pub use kernels::{SimdLevel, TurboKernels};

/// Encodes `x` (a multiple of 64 values) into `out` (exactly `x.len() / 64`
/// blocks of `ty`).
pub fn quantize(ty: TqType, x: &[f32], out: &mut [u8]) -> Result<()> {
    let nb = checked_blocks(ty, x.len(), out.len())?;
    kernels::scalar::quantize_row(ty, &x[..nb * QK], out);
    Ok(())
}

/// Decodes `x` (whole blocks of `ty`) into `y` (`64` values per block).
pub fn dequantize(ty: TqType, x: &[u8], y: &mut [f32]) -> Result<()> {
    checked_blocks(ty, y.len(), x.len())?;
    kernels::dequantize_row(ty, x, y);
    Ok(())
}

/// `Σ decode(x)_j * y_j`.
pub fn vec_dot(ty: TqType, x: &[u8], y: &[f32]) -> Result<f32> {
    checked_blocks(ty, y.len(), x.len())?;
    Ok(kernels::vec_dot_row(ty, x, y))
}

/// `y_j += v * decode(x)_j`.
pub fn mad(ty: TqType, x: &[u8], y: &mut [f32], v: f32) -> Result<()> {
    checked_blocks(ty, y.len(), x.len())?;
    kernels::mad_row(ty, x, y, v);
    Ok(())
}

/// Bytes needed to encode `n` values (`n` a multiple of 64).
pub fn encoded_len(ty: TqType, n: usize) -> Result<usize> {
    if n % QK != 0 {
        return Err(TqError::BadLength);
    }
    Ok(n / QK * ty.block_bytes())
}

fn checked_blocks(ty: TqType, nvals: usize, nbytes: usize) -> Result<usize> {
    if nvals % QK != 0 || nbytes != nvals / QK * ty.block_bytes() {
        return Err(TqError::BadLength);
    }
    Ok(nvals / QK)
}
