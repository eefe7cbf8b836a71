//! The lab behind `tq capture / rotation-stats / kv-norms / distortion / niah / recommend /
//! kmean-sim`: the capture file format, the cache codecs as llama.cpp applies them
//! (rotation included), the K mean as llama.cpp keeps it (the Rust oracle of
//! ggml-ext/llama/tq-kmean*.h), metrics, and each command's computation. Pure Rust on `f32`
//! slices; the capture itself (llama.cpp's eval callback) and all printing live in `tq`.
//!
//! One module, one job; each states its invariant on top:
//!
//! | module | what |
//! |---|---|
//! | [`capture`] | the `.tqkv` file format |
//! | [`metrics`] | moments, quantiles, cosine, distortion, codebook theory |
//! | [`rotation`] | the rotations llama.cpp applies before a cache type |
//! | [`codec`] | the cache types as reference codecs (f16, q8_0, q4_0, turbo, TCQ) |
//! | [`kmean`] | the fixed K mean (first ubatch, RoPE-fitted) |
//! | [`kmean_rope`] | the K mean in RoPE's frame |
//! | [`kmean_mode`] | which K mean a capture gets, one layer's mean |
//! | [`attention`] | softmax, argmax, weighted sums |
//! | [`needle`] | the needle proxy (`tq niah`) |
//! | [`kmean_sim`] | which K statistics hold at long context, by simulation (`tq kmean-sim`) |
//! | [`rotation_stats`], [`norms`], [`distortion`], [`recommend`] | those commands' computations |
//! | [`parallel`] | work over the cores, results in order |
//!
//! The items of the first eight are re-exported here (`turboquant_lab::Codec`, ...).

pub mod attention;
pub mod capture;
pub mod codec;
pub mod distortion;
pub mod kmean;
pub mod kmean_mode;
pub mod kmean_rope;
pub mod kmean_sim;
pub mod metrics;
pub mod needle;
pub mod norms;
pub mod parallel;
pub mod recommend;
pub mod rotation;
pub mod rotation_stats;

pub use attention::*;
pub use capture::*;
pub use codec::*;
pub use kmean::*;
pub use kmean_rope::*;
pub use metrics::*;
pub use needle::{needle_trial, Pool, TrialResult};
pub use rotation::*;
