//! Metrics on `f32` vectors: moments (kurtosis), quantiles, norm, dot, cosine, the
//! distortion of a reconstruction, and the codebook theory they are compared with.
//!
//! Invariant: every statistic accumulates in f64 (except `dot`, which is what an attention
//! kernel computes, in f32), so the lab's figures do not depend on summation order beyond
//! f64 rounding; the theory figures come from the shipped codebook solver, never a copy.

use serde::Serialize;

/// Mean, standard deviation and (Pearson, non-excess) kurtosis `E[(x-μ)^4] / σ^4`,
/// accumulated in f64. A Gaussian has kurtosis 3.
#[derive(Clone, Copy, Debug, Default)]
pub struct Moments {
    n: f64,
    s1: f64,
    s2: f64,
    s3: f64,
    s4: f64,
}

impl Moments {
    pub fn push(&mut self, x: f64) {
        let x2 = x * x;
        self.n += 1.0;
        self.s1 += x;
        self.s2 += x2;
        self.s3 += x2 * x;
        self.s4 += x2 * x2;
    }
    pub fn extend(&mut self, xs: &[f32]) {
        for &x in xs {
            self.push(x as f64);
        }
    }
    /// Adds the samples of `o` (the sums are plain power sums).
    pub fn merge(&mut self, o: &Moments) {
        self.n += o.n;
        self.s1 += o.s1;
        self.s2 += o.s2;
        self.s3 += o.s3;
        self.s4 += o.s4;
    }
    pub fn count(&self) -> f64 {
        self.n
    }
    pub fn mean(&self) -> f64 {
        self.s1 / self.n
    }
    pub fn std(&self) -> f64 {
        let m = self.mean();
        (self.s2 / self.n - m * m).max(0.0).sqrt()
    }
    pub fn kurtosis(&self) -> f64 {
        let m = self.mean();
        let (e2, e3, e4) = (self.s2 / self.n, self.s3 / self.n, self.s4 / self.n);
        let c2 = e2 - m * m;
        let c4 = e4 - 4.0 * m * e3 + 6.0 * m * m * e2 - 3.0 * m.powi(4);
        c4 / (c2 * c2)
    }
}

/// Kurtosis of one coordinate of a uniform unit vector in R^d: `3d / (d + 2)` (3 as d → ∞).
pub fn sphere_kurtosis(d: usize) -> f64 {
    3.0 * d as f64 / (d as f64 + 2.0)
}

/// `p`-quantile (0..=1) of `xs` (sorted copy, nearest rank).
pub fn quantile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((p * (v.len() - 1) as f64).round() as usize).min(v.len() - 1);
    v[i]
}

pub fn norm(x: &[f32]) -> f64 {
    x.iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt()
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // four partial sums: vectorizes, and is what a kernel would do
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    let mut t: f32 = s.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        t += x * y;
    }
    t
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 || nb == 0.0 {
        return if na == nb { 1.0 } else { 0.0 };
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 * y as f64)
        .sum::<f64>()
        / (na * nb)
}

/// Distortion per unit-norm vector of the `b`-bit Lloyd-Max quantizer for one coordinate
/// of a uniform point on S^63 (what the turbo codebooks are), and the implied cosine
/// `sqrt(1 - D)` (the optimum's reconstruction is shorter than the input: E x·x̂ = E|x̂|²).
pub fn lloyd_max_distortion(bits: u32) -> f64 {
    turboquant_codec::codebook::lloyd_max(turboquant_codec::codebook::Density::Exact, 64, bits)
        .distortion()
}

/// The information-theoretic lower bound on distortion per unit-norm vector, `4^-b`.
pub fn lower_bound(bits: u32) -> f64 {
    4f64.powi(-(bits as i32))
}

/// The distortion of a reconstruction, per vector, averaged.
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct Dist {
    /// mean over vectors of |x - x̂|² / |x|²
    pub rel_mse: f64,
    /// mean cosine(x, x̂)
    pub cos: f64,
    /// 1st percentile of cosine(x, x̂)
    pub cos_p1: f64,
}

/// Distortion of the reconstruction `y` of the rows `rows` (each `dim` long); zero rows
/// are left out.
pub fn dist(rows: &[f32], y: &[f32], dim: usize) -> Dist {
    let mut mse = 0.0;
    let mut coss = Vec::with_capacity(rows.len() / dim);
    for (x, xh) in rows.chunks_exact(dim).zip(y.chunks_exact(dim)) {
        let n2 = norm(x).powi(2);
        if n2 == 0.0 {
            continue;
        }
        let e: f64 = x
            .iter()
            .zip(xh)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum();
        mse += e / n2;
        coss.push(cosine(x, xh));
    }
    let n = coss.len().max(1) as f64;
    Dist {
        rel_mse: mse / n,
        cos: coss.iter().sum::<f64>() / n,
        cos_p1: quantile(&coss, 0.01),
    }
}

/// The mean of per-layer distortions; `cos_p1` the worst layer's.
pub fn mean_dist(ds: &[Dist]) -> Dist {
    let n = ds.len().max(1) as f64;
    Dist {
        rel_mse: ds.iter().map(|d| d.rel_mse).sum::<f64>() / n,
        cos: ds.iter().map(|d| d.cos).sum::<f64>() / n,
        cos_p1: ds.iter().map(|d| d.cos_p1).fold(f64::INFINITY, f64::min),
    }
}
