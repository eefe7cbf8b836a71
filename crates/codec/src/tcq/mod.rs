//! Trellis-coded turbo types (`turbo3_tcq`, `turbo2_tcq`): 64 values per
//! block, one fp16 scale and `64 * k` bits of a tail-biting bitshift trellis
//! (k = 3 or 2 bits per value), so exactly the sizes of turbo3 / turbo2.
//!
//! Invariant of the format (see docs/TCQ.md): the `64 k` payload bits form a
//! circular bit string read MSB-first (stream bit `i` is bit `7 - i % 8` of
//! `qs[i / 8]`). Value `t` decodes to `d * TABLE[s_t]`, where the `L`-bit state
//! `s_t` is the window of stream bits `[k t + k - L, k t + k)` taken modulo
//! `64 k`, read MSB-first. Equivalently `s_t = ((s_{t-1} << k) | c_t) mod 2^L`
//! with `c_t` the `t`-th k-bit symbol and `s_{-1} = s_63` (tail-biting: no
//! start state is stored). The encoder is a Viterbi search over this trellis;
//! the table is trained on seeded Gaussian data (crates/codec/src/tcq/train.rs).
//!
//! The codec, its scalar references and the decode-side row kernels
//! ([`kernels`]: scalar oracle + AVX2); GGML registration and CUDA come later
//! (docs/TCQ.md lists what is left).

pub mod block;
pub mod codec;
pub mod kernels;
pub mod train;
pub mod viterbi;
#[cfg(target_arch = "x86_64")]
pub mod x86;
#[rustfmt::skip]
pub mod tables;

pub use block::{BlockTurbo2Tcq, BlockTurbo3Tcq, TcqType};
pub use codec::{dequantize, mad, quantize, vec_dot};
pub use viterbi::{Scratch, Trellis};
