//! The rotations llama.cpp applies to a head before quantizing it: the seeded randomized
//! Hadamard `R = D H D / sqrt(n)` of turbo caches, upstream's plain `H / sqrt(n)` of every
//! other quantized cache, over K chunks of the largest power of two dividing the head and
//! V chunks of 64.
//!
//! Invariant: both rotations are orthogonal involutions (applying one twice is the
//! identity up to f32 rounding), so an error measured after rotating back is the error in
//! the rotated domain, where the cache quantizes.

use turboquant_codec::rotation::{self as hadamard, DEFAULT_SEED};

/// Size of llama.cpp's K rotation for a head of `head` values: the largest power of two
/// dividing it (64 → 64, 128 → 128, 256 → 256); `None` when the head is not a multiple of 64
/// (no rotation, no turbo).
pub fn rot_dim_k(head: usize) -> Option<usize> {
    head.is_multiple_of(64).then(|| 1 << head.trailing_zeros())
}

/// Size of llama.cpp's V rotation: always 64 (upstream found smaller is better for V).
pub fn rot_dim_v(head: usize) -> Option<usize> {
    head.is_multiple_of(64).then_some(64)
}

/// Which rotation: the seeded `R = D H D / sqrt(n)` of turbo caches, or upstream's plain
/// `H / sqrt(n)` that llama.cpp uses for every other quantized cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotation {
    None,
    Plain,
    Seeded,
}

/// Applies the rotation (an involution in both cases) to every `dim` chunk of `x`.
pub fn apply_rotation(rot: Rotation, dim: usize, x: &mut [f32]) {
    match rot {
        Rotation::None => {}
        Rotation::Seeded => hadamard::rotate(dim, DEFAULT_SEED, x).expect("power-of-two chunks"),
        Rotation::Plain => {
            let f = hadamard::norm_factor(dim);
            for c in x.chunks_exact_mut(dim) {
                hadamard::fwht(c);
                c.iter_mut().for_each(|v| *v *= f);
            }
        }
    }
}

/// The K and V rotation sizes of a capture's heads, or why llama.cpp takes no turbo cache
/// for them.
pub fn rot_dims(h: &crate::capture::CaptureHeader) -> Result<(usize, usize), String> {
    match (rot_dim_k(h.head_k), rot_dim_v(h.head_v)) {
        (Some(k), Some(v)) => Ok((k, v)),
        _ => Err(format!(
            "head size {}/{} is not a multiple of 64: llama.cpp neither rotates it nor takes turbo \
             caches for it",
            h.head_k, h.head_v
        )),
    }
}
