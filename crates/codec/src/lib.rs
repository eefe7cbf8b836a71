//! TurboQuant KV-cache codec: the `turbo2` / `turbo3` / `turbo4` block types
//! (64 values per block, fp16 scale + Lloyd-Max indices), the seeded
//! randomized Hadamard rotation, the Lloyd-Max solver that produced the
//! codebooks and an optional QJL second stage. Pure Rust (`half`, `thiserror`); the
//! C ABI over it is `turboquant-capi`.
//!
//! The encoding rule is normative in docs/CODEC.md (the CUDA port reproduces it bit for
//! bit); [`kernels::scalar::quantize_block`] is its reference implementation. Decoding is
//! `d * C[idx]`, one f32 multiply; a stored scale the encoder never writes (NaN, infinite,
//! negative) decodes as 0.

pub mod block;
pub mod codebook;
pub mod error;
pub mod gain;
pub mod kernels;
pub mod qjl;
pub mod rotation;
pub mod switches;
#[rustfmt::skip]
pub mod tables;
pub mod tcq;
#[doc(hidden)]
pub mod testing;
pub mod types;

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
    if !n.is_multiple_of(QK) {
        return Err(TqError::BadLength);
    }
    Ok(n / QK * ty.block_bytes())
}

fn checked_blocks(ty: TqType, nvals: usize, nbytes: usize) -> Result<usize> {
    if !nvals.is_multiple_of(QK) || nbytes != nvals / QK * ty.block_bytes() {
        return Err(TqError::BadLength);
    }
    Ok(nvals / QK)
}
