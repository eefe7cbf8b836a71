//! `tq kv-norms`: the L2 norms of K and V head vectors per layer, their ratio, and the
//! outlier layers.
//!
//! Invariant: a layer is an outlier exactly when its mean K/V norm ratio is more than
//! [`OUTLIER_FACTOR`] times, or less than its inverse, the median over layers.

use crate::capture::Capture;
use crate::metrics::{norm, quantile};
use serde::Serialize;

#[derive(Serialize, Clone, Debug)]
pub struct NormRow {
    pub layer: usize,
    pub k_mean: f64,
    pub k_p99: f64,
    pub v_mean: f64,
    pub v_p99: f64,
    pub ratio_mean: f64,
    pub ratio_p99: f64,
    pub outlier: bool,
}

/// Outlier rule: a layer whose mean K/V norm ratio is more than twice, or less than half,
/// the median over layers.
pub const OUTLIER_FACTOR: f64 = 2.0;

pub fn norm_rows(c: &Capture) -> Vec<NormRow> {
    let h = &c.header;
    let mut rows: Vec<NormRow> = (0..h.n_layer)
        .map(|l| {
            let kn: Vec<f64> = c.k[l].chunks_exact(h.head_k).map(norm).collect();
            let vn: Vec<f64> = c.v[l].chunks_exact(h.head_v).map(norm).collect();
            let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
            let (km, vm) = (mean(&kn), mean(&vn));
            let (k99, v99) = (quantile(&kn, 0.99), quantile(&vn, 0.99));
            NormRow {
                layer: l,
                k_mean: km,
                k_p99: k99,
                v_mean: vm,
                v_p99: v99,
                ratio_mean: km / vm,
                ratio_p99: k99 / v99,
                outlier: false,
            }
        })
        .collect();
    let med = median_ratio(&rows);
    for r in &mut rows {
        r.outlier = r.ratio_mean > OUTLIER_FACTOR * med || r.ratio_mean < med / OUTLIER_FACTOR;
    }
    rows
}

/// The median over layers of the mean K/V norm ratio.
pub fn median_ratio(rows: &[NormRow]) -> f64 {
    quantile(&rows.iter().map(|r| r.ratio_mean).collect::<Vec<_>>(), 0.5)
}
