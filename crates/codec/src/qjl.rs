//! Optional second stage of the paper: TurboQuant-prod (MSE + QJL).
//!
//! A library option only: the KV-cache types never use it (every llama.cpp
//! integration found its extra variance hurts softmax attention).
//!
//! A vector `x` of dimension `dim` (a power of two) is rotated with the seeded
//! rotation `R` ([`crate::rotation`]); `Rx` is quantized with the `(b-1)`-bit
//! Lloyd-Max codebook of the exact finite-`dim` density, scaled by `||x||`
//! (the paper's MSE quantizer, `x̂`); the residual `r = Rx - x̂` is sketched
//! with a seeded Gaussian projection `S` (`m = dim` rows): `sign(S r)` plus
//! `||r||`. For a query `y` the estimator
//!
//! `<y, x> ≈ <Ry, x̂> + ||r|| sqrt(π/2) / m <S Ry, sign(S r)>`
//!
//! is unbiased over the draw of `S`, at the price of a higher variance than
//! the `b`-bit MSE-only estimator `<Ry, x̂_b>`.

use crate::codebook::{lloyd_max, Density};
use crate::error::{Result, TqError};
use crate::rotation::{check_dim, rotate_in_place, SplitMix64};

/// `b`-bit MSE quantizer of whole vectors (norm + one index per coordinate).
#[derive(Clone, Debug)]
pub struct MseQuantizer {
    dim: usize,
    seed: u64,
    centroids: Vec<f32>,
    thresholds: Vec<f32>,
}

/// An MSE-quantized vector.
#[derive(Clone, Debug)]
pub struct MseCode {
    /// `||x||`.
    pub norm: f32,
    /// One index per coordinate of `Rx`.
    pub idx: Vec<u8>,
}

impl MseQuantizer {
    /// A quantizer for vectors of `dim` (power of two, >= 4) with `bits` (1..=8).
    pub fn new(dim: usize, bits: u32, seed: u64) -> Result<MseQuantizer> {
        check_dim(dim)?;
        if dim < 4 || !(1..=8).contains(&bits) {
            return Err(TqError::BadDim);
        }
        let cb = lloyd_max(Density::Exact, dim, bits);
        Ok(MseQuantizer {
            dim,
            seed,
            centroids: cb.centroids.iter().map(|&v| v as f32).collect(),
            thresholds: cb.thresholds.iter().map(|&v| v as f32).collect(),
        })
    }

    /// The same codebook with another rotation seed.
    pub fn reseeded(&self, seed: u64) -> MseQuantizer {
        MseQuantizer {
            seed,
            ..self.clone()
        }
    }

    /// Dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    fn rotated(&self, x: &[f32]) -> Vec<f32> {
        assert_eq!(x.len(), self.dim, "vector length must equal dim");
        let mut v = x.to_vec();
        rotate_in_place(&mut v, self.seed).expect("dim checked at construction");
        v
    }

    fn encode_rotated(&self, xr: &[f32]) -> MseCode {
        let norm = xr
            .iter()
            .map(|&v| (v as f64) * (v as f64))
            .sum::<f64>()
            .sqrt();
        let idx = xr
            .iter()
            .map(|&v| {
                let u = if norm > 0.0 { v as f64 / norm } else { 0.0 };
                self.thresholds.iter().filter(|&&t| u > t as f64).count() as u8
            })
            .collect();
        MseCode {
            norm: norm as f32,
            idx,
        }
    }

    /// Encodes `x`.
    pub fn encode(&self, x: &[f32]) -> MseCode {
        self.encode_rotated(&self.rotated(x))
    }

    /// `x̂` in the rotated domain.
    fn decode_rotated(&self, code: &MseCode) -> Vec<f32> {
        code.idx
            .iter()
            .map(|&k| code.norm * self.centroids[k as usize])
            .collect()
    }

    /// Decodes to the original domain (`R` is involutory).
    pub fn decode(&self, code: &MseCode) -> Vec<f32> {
        let mut v = self.decode_rotated(code);
        rotate_in_place(&mut v, self.seed).expect("dim checked at construction");
        v
    }

    /// `<y, x̂>`.
    pub fn inner_product(&self, code: &MseCode, y: &[f32]) -> f32 {
        let yr = self.rotated(y);
        dot(&yr, &self.decode_rotated(code)) as f32
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum()
}

/// TurboQuant-prod: `(bits-1)`-bit MSE stage + 1-bit QJL sketch of the residual.
#[derive(Clone, Debug)]
pub struct QjlQuantizer {
    mse: MseQuantizer,
    /// `m x dim` Gaussian projection, row-major (`m = dim`).
    proj: Vec<f32>,
}

/// A TurboQuant-prod code.
#[derive(Clone, Debug)]
pub struct QjlCode {
    /// The MSE stage.
    pub mse: MseCode,
    /// `sign(S r)`, bit `i` set when row `i` is non-negative.
    pub signs: Vec<u64>,
    /// `||r||`.
    pub rnorm: f32,
}

impl QjlQuantizer {
    /// `bits` total per coordinate (2..=9): `bits - 1` for the MSE stage, 1 for QJL.
    pub fn new(dim: usize, bits: u32, seed: u64) -> Result<QjlQuantizer> {
        if !(2..=9).contains(&bits) {
            return Err(TqError::BadDim);
        }
        let mse = MseQuantizer::new(dim, bits - 1, seed)?;
        Ok(QjlQuantizer {
            proj: gaussian_matrix(dim, seed),
            mse,
        })
    }

    /// Same codebook, new rotation and projection drawn from `seed`.
    pub fn reseeded(&self, seed: u64) -> QjlQuantizer {
        QjlQuantizer {
            mse: self.mse.reseeded(seed),
            proj: gaussian_matrix(self.mse.dim, seed),
        }
    }

    fn project(&self, v: &[f32]) -> Vec<f64> {
        let d = self.mse.dim;
        self.proj.chunks_exact(d).map(|row| dot(row, v)).collect()
    }

    /// Encodes `x`.
    pub fn encode(&self, x: &[f32]) -> QjlCode {
        let xr = self.mse.rotated(x);
        let mse = self.mse.encode_rotated(&xr);
        let xh = self.mse.decode_rotated(&mse);
        let r: Vec<f32> = xr.iter().zip(&xh).map(|(&a, &b)| a - b).collect();
        let rnorm = dot(&r, &r).sqrt() as f32;
        let sr = self.project(&r);
        let mut signs = vec![0u64; sr.len().div_ceil(64)];
        for (i, &v) in sr.iter().enumerate() {
            if v >= 0.0 {
                signs[i / 64] |= 1 << (i % 64);
            }
        }
        QjlCode { mse, signs, rnorm }
    }

    /// The unbiased inner-product estimate of `<y, x>`.
    pub fn inner_product(&self, code: &QjlCode, y: &[f32]) -> f32 {
        let yr = self.mse.rotated(y);
        let base = dot(&yr, &self.mse.decode_rotated(&code.mse));
        let sy = self.project(&yr);
        let m = sy.len() as f64;
        let mut corr = 0.0;
        for (i, &v) in sy.iter().enumerate() {
            let s = if code.signs[i / 64] >> (i % 64) & 1 == 1 {
                1.0
            } else {
                -1.0
            };
            corr += s * v;
        }
        (base + code.rnorm as f64 * (std::f64::consts::PI / 2.0).sqrt() / m * corr) as f32
    }
}

fn gaussian_matrix(dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed ^ 0x514A_4C5F_5052_4F4A); // "QJL_PROJ"
    (0..dim * dim).map(|_| rng.next_gaussian() as f32).collect()
}
