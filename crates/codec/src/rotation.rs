//! The seeded randomized Walsh-Hadamard rotation.
//!
//! `R = D H D / sqrt(dim)` where `H` is the Sylvester Walsh-Hadamard matrix,
//! `H[i][j] = (-1)^popcount(i & j)` (the ordering of llama.cpp's
//! `ggml_gen_hadamard`), and `D = diag(s_0, ..., s_{dim-1})` with `s_i = +1`
//! if the `i`-th output of a SplitMix64 stream has its top bit clear, else
//! `-1`. The stream is seeded with `seed ^ (dim as u64).wrapping_mul(0x9E3779B97F4A7C15)`.
//!
//! Since `H H = dim I` and `D D = I`, `R` is symmetric and involutory:
//! `R R = I`, so applying it twice undoes it (llama.cpp relies on that).
//! `dim`: a power of two in `2..=65536`.

use crate::error::{Result, TqError};

/// The seed of the rotation llama.cpp uses for turbo caches (`TQ_DEFAULT_SEED`,
/// ASCII "Turbquat").
pub const DEFAULT_SEED: u64 = 0x5475_7262_7175_6174;

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream starting at `seed`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next output.
    #[inline(always)]
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform f64 in `[0, 1)` (53 bits).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal deviate (Box-Muller, one of the pair).
    pub fn next_gaussian(&mut self) -> f64 {
        let u1 = ((self.next() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Largest supported rotation dimension.
pub const MAX_DIM: usize = 65536;

/// Checks that `dim` is a power of two in `2..=65536`.
pub fn check_dim(dim: usize) -> Result<()> {
    if (2..=MAX_DIM).contains(&dim) && dim.is_power_of_two() {
        Ok(())
    } else {
        Err(TqError::BadDim)
    }
}

/// The seed of the sign stream for `dim`.
#[inline]
pub fn sign_seed(dim: usize, seed: u64) -> u64 {
    seed ^ (dim as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The `dim` signs `s_i` as ±1.0.
pub fn signs(dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(sign_seed(dim, seed));
    (0..dim)
        .map(|_| if rng.next() >> 63 == 0 { 1.0 } else { -1.0 })
        .collect()
}

#[inline(always)]
fn apply_signs(x: &mut [f32], seed: u64, scale: f32) {
    let mut rng = SplitMix64::new(sign_seed(x.len(), seed));
    for v in x.iter_mut() {
        let neg = (rng.next() >> 63) as u32;
        // flip the sign bit; `scale` is 1 or a power of two -> exact either way.
        *v = f32::from_bits((*v * scale).to_bits() ^ (neg << 31));
    }
}

/// In-place unnormalized fast Walsh-Hadamard transform (Sylvester order):
/// `x <- H x`. `x.len()` must be a power of two.
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            let (a, b) = x[i..i + 2 * h].split_at_mut(h);
            for (p, q) in a.iter_mut().zip(b.iter_mut()) {
                let (u, v) = (*p, *q);
                *p = u + v;
                *q = u - v;
            }
        }
        h *= 2;
    }
}

/// `1/sqrt(dim)` as f32 (exact when `dim` is a power of 4).
#[inline]
pub fn norm_factor(dim: usize) -> f32 {
    (1.0 / (dim as f64).sqrt()) as f32
}

/// Applies `R` in place to one vector of length `dim = x.len()`. O(dim log dim),
/// no allocation.
pub fn rotate_in_place(x: &mut [f32], seed: u64) -> Result<()> {
    check_dim(x.len())?;
    apply_signs(x, seed, 1.0);
    fwht(x);
    apply_signs(x, seed, norm_factor(x.len()));
    Ok(())
}

/// Applies `R` (of size `dim`) to each of the `x.len() / dim` consecutive vectors.
pub fn rotate(dim: usize, seed: u64, x: &mut [f32]) -> Result<()> {
    check_dim(dim)?;
    if !x.len().is_multiple_of(dim) {
        return Err(TqError::BadLength);
    }
    for v in x.chunks_exact_mut(dim) {
        rotate_in_place(v, seed)?;
    }
    Ok(())
}

/// Writes the dense row-major `dim x dim` matrix `R` into `out`.
pub fn rotation_matrix_into(dim: usize, seed: u64, out: &mut [f32]) -> Result<()> {
    check_dim(dim)?;
    if out.len() < dim * dim {
        return Err(TqError::BadLength);
    }
    let s = signs(dim, seed);
    let f = norm_factor(dim);
    for i in 0..dim {
        let row = &mut out[i * dim..(i + 1) * dim];
        for (j, r) in row.iter_mut().enumerate() {
            let h = if (i & j).count_ones() % 2 == 0 { f } else { -f };
            *r = s[i] * s[j] * h;
        }
    }
    Ok(())
}

/// The dense matrix `R` as a new vector.
pub fn rotation_matrix(dim: usize, seed: u64) -> Result<Vec<f32>> {
    check_dim(dim)?;
    let mut m = vec![0.0; dim * dim];
    rotation_matrix_into(dim, seed, &mut m)?;
    Ok(m)
}
