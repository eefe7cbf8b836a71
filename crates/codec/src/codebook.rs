//! Lloyd-Max codebooks, solved rather than typed.
//!
//! Two source densities for one coordinate `x` of a vector in `R^d`:
//!
//! * [`Density::Exact`]: one coordinate of a uniformly random unit vector,
//!   `f(x) ∝ (1 - x²)^((d-3)/2)` on `[-1, 1]`. A block of 64 coordinates of a
//!   randomly rotated vector, divided by its own norm, is uniform on `S^63`, so
//!   with `d = 64` this is the exact law the turbo codecs quantize.
//! * [`Density::Gaussian`]: the large-`d` limit `N(0, 1/d)` (the paper's tables).
//!
//! The solver runs Lloyd's fixed-point iteration on the positive half (the
//! densities are symmetric, so the codebook is too and has no zero centroid):
//! thresholds are midpoints of consecutive centroids and each centroid is the
//! conditional mean of its cell. The first moments have closed forms; the cell
//! masses are integrated with composite 20-point Gauss-Legendre quadrature on
//! panels no wider than `σ/2`, which is exact to rounding for these smooth
//! integrands. Iteration stops when no centroid moves by more than `1e-14`
//! (well inside the required `1e-10`).
//!
//! `crates/gen` renders [`codec_codebooks`] into the checked-in `crates/codec/src/tables.rs`
//! and `ggml-ext/abi/turboquant_tables.h` (its test regenerates and compares).

use std::sync::OnceLock;

/// The density of one coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Density {
    /// One coordinate of a uniform random unit vector in `R^d`.
    Exact,
    /// `N(0, 1/d)`, the `d -> ∞` limit.
    Gaussian,
}

/// A solved Lloyd-Max codebook.
#[derive(Clone, Debug)]
pub struct Codebook {
    /// Source density.
    pub density: Density,
    /// Dimension `d`.
    pub dim: usize,
    /// Bits per index.
    pub bits: u32,
    /// All `2^bits` centroids, ascending (exactly antisymmetric).
    pub centroids: Vec<f64>,
    /// The `2^bits - 1` midpoints between consecutive centroids, ascending.
    pub thresholds: Vec<f64>,
    /// Lloyd iterations used.
    pub iterations: usize,
    /// Mean squared error per coordinate.
    pub mse: f64,
}

impl Codebook {
    /// Distortion per unit-norm vector: `d * mse` (what the paper tabulates).
    pub fn distortion(&self) -> f64 {
        self.dim as f64 * self.mse
    }

    /// The positive half of the centroids, ascending.
    pub fn positive(&self) -> &[f64] {
        &self.centroids[self.centroids.len() / 2..]
    }
}

const GL_POINTS: usize = 20;

/// Gauss-Legendre nodes and weights on [-1, 1], by Newton on P_n.
fn gauss_legendre() -> &'static [(f64, f64); GL_POINTS] {
    static GL: OnceLock<[(f64, f64); GL_POINTS]> = OnceLock::new();
    GL.get_or_init(|| {
        let n = GL_POINTS;
        let mut out = [(0.0, 0.0); GL_POINTS];
        for (i, slot) in out.iter_mut().enumerate() {
            let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            let mut dp = 0.0;
            for _ in 0..100 {
                // P_n(x) and P_n'(x) by the three-term recurrence.
                let (mut p0, mut p1) = (1.0f64, x);
                for k in 2..=n {
                    let p2 = ((2 * k - 1) as f64 * x * p1 - (k - 1) as f64 * p0) / k as f64;
                    p0 = p1;
                    p1 = p2;
                }
                dp = n as f64 * (x * p1 - p0) / (x * x - 1.0);
                let dx = p1 / dp;
                x -= dx;
                if dx.abs() < 1e-16 {
                    break;
                }
            }
            *slot = (x, 2.0 / ((1.0 - x * x) * dp * dp));
        }
        out
    })
}

/// Unnormalized density and its closed-form first moment.
#[derive(Clone, Copy)]
struct Kernel {
    density: Density,
    d: f64,
    /// exponent (d-3)/2 of the exact density
    a: f64,
    sigma: f64,
    /// ∫_0^sup g
    half_mass: f64,
}

impl Kernel {
    fn new(density: Density, dim: usize) -> Kernel {
        assert!(dim >= 3, "dimension must be >= 3");
        let d = dim as f64;
        let mut k = Kernel {
            density,
            d,
            a: (d - 3.0) / 2.0,
            sigma: 1.0 / d.sqrt(),
            half_mass: 0.0,
        };
        k.half_mass = match density {
            Density::Gaussian => (std::f64::consts::PI / (2.0 * d)).sqrt(),
            Density::Exact => k.mass(0.0, 1.0),
        };
        k
    }

    /// Upper end of the support.
    fn sup(&self) -> f64 {
        match self.density {
            Density::Exact => 1.0,
            Density::Gaussian => f64::INFINITY,
        }
    }

    #[inline]
    fn g(&self, x: f64) -> f64 {
        match self.density {
            Density::Exact => (1.0 - x * x).max(0.0).powf(self.a),
            Density::Gaussian => (-0.5 * self.d * x * x).exp(),
        }
    }

    /// Antiderivative of x g(x).
    fn g1(&self, x: f64) -> f64 {
        match self.density {
            Density::Exact => {
                if x >= 1.0 {
                    0.0
                } else {
                    -(1.0 - x * x).powf(self.a + 1.0) / (2.0 * (self.a + 1.0))
                }
            }
            Density::Gaussian => {
                if x.is_infinite() {
                    0.0
                } else {
                    -(-0.5 * self.d * x * x).exp() / self.d
                }
            }
        }
    }

    /// ∫_lo^hi g for a finite interval, composite Gauss-Legendre.
    fn mass(&self, lo: f64, hi: f64) -> f64 {
        if hi <= lo {
            return 0.0;
        }
        let panels = (((hi - lo) / (0.5 * self.sigma)).ceil() as usize).max(1);
        let w = (hi - lo) / panels as f64;
        let gl = gauss_legendre();
        let mut total = 0.0;
        for p in 0..panels {
            let a = lo + w * p as f64;
            let mid = a + 0.5 * w;
            let mut s = 0.0;
            for &(x, wt) in gl.iter() {
                s += wt * self.g(mid + 0.5 * w * x);
            }
            total += 0.5 * w * s;
        }
        total
    }

    /// (mass, first moment) of every positive cell given the positive
    /// thresholds `t` (cells [0,t0], [t0,t1], ..., [t_last, sup]).
    fn cells(&self, t: &[f64], mass: &mut [f64], m1: &mut [f64]) {
        let mut lo = 0.0;
        let mut acc = 0.0;
        let n = mass.len();
        for k in 0..n {
            let hi = if k + 1 < n { t[k] } else { self.sup() };
            let m = if k + 1 < n {
                self.mass(lo, hi)
            } else {
                self.half_mass - acc
            };
            acc += m;
            mass[k] = m;
            m1[k] = self.g1(hi) - self.g1(lo);
            lo = hi;
        }
    }
}

/// Solves the Lloyd-Max codebook with `2^bits` levels (`bits` in 1..=8).
pub fn lloyd_max(density: Density, dim: usize, bits: u32) -> Codebook {
    assert!((1..=8).contains(&bits), "bits must be in 1..=8");
    let kern = Kernel::new(density, dim);
    let half = 1usize << (bits - 1);
    // Start from evenly spaced points over ±3σ.
    let mut c: Vec<f64> = (0..half)
        .map(|k| kern.sigma * 3.0 * (k as f64 + 0.5) / half as f64)
        .collect();
    let mut t = vec![0.0; half.saturating_sub(1)];
    let mut mass = vec![0.0; half];
    let mut m1 = vec![0.0; half];
    let mut iterations = 0;
    loop {
        for k in 0..t.len() {
            t[k] = 0.5 * (c[k] + c[k + 1]);
        }
        kern.cells(&t, &mut mass, &mut m1);
        let mut delta: f64 = 0.0;
        for k in 0..half {
            let nc = m1[k] / mass[k];
            delta = delta.max((nc - c[k]).abs());
            c[k] = nc;
        }
        iterations += 1;
        if delta < 1e-14 || iterations >= 1_000_000 {
            break;
        }
    }
    let mut centroids: Vec<f64> = c.iter().rev().map(|v| -v).collect();
    centroids.extend_from_slice(&c);
    let thresholds: Vec<f64> = centroids.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
    let mse = mse_of(density, dim, &centroids);
    Codebook {
        density,
        dim,
        bits,
        centroids,
        thresholds,
        iterations,
        mse,
    }
}

/// Per-coordinate MSE of an arbitrary symmetric, ascending codebook under the
/// given density, with nearest-centroid (midpoint) cells.
pub fn mse_of(density: Density, dim: usize, centroids: &[f64]) -> f64 {
    let kern = Kernel::new(density, dim);
    let half = centroids.len() / 2;
    assert!(
        centroids.len() == 2 * half && half >= 1,
        "need an even, symmetric codebook"
    );
    let pos = &centroids[half..];
    let t: Vec<f64> = pos.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
    let mut mass = vec![0.0; half];
    let mut m1 = vec![0.0; half];
    kern.cells(&t, &mut mass, &mut m1);
    // E[(X - c)^2] over the positive half, doubled, normalized: E[X^2] = 1/d.
    let z = 2.0 * kern.half_mass;
    let mut cross = 0.0;
    for k in 0..half {
        cross += 2.0 * (-2.0 * pos[k] * m1[k] + pos[k] * pos[k] * mass[k]);
    }
    1.0 / kern.d + cross / z
}

/// The codebooks the turbo types use: exact density, `d = 64`, 2/3/4 bits.
pub fn codec_codebooks() -> [Codebook; 3] {
    [2, 3, 4].map(|b| lloyd_max(Density::Exact, 64, b))
}

/// f32 tables of a codebook: (centroids, thresholds). Thresholds are the f64
/// midpoints rounded to f32; the middle one is exactly 0.
pub fn f32_tables(cb: &Codebook) -> (Vec<f32>, Vec<f32>) {
    (
        cb.centroids.iter().map(|&v| v as f32).collect(),
        cb.thresholds.iter().map(|&v| v as f32).collect(),
    )
}
