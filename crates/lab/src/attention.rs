//! Attention primitives on one query's scores: softmax, argmax, the weighted sum of rows.
//!
//! Invariant: softmax subtracts the maximum and normalizes with an f64 sum, so a shift
//! common to every score (what the K mean removes) leaves its output unchanged.

/// Softmax of `s` in place (max-subtracted, f64 sum).
pub fn softmax(s: &mut [f32]) {
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut z = 0f64;
    for v in s.iter_mut() {
        *v = (*v - m).exp();
        z += *v as f64;
    }
    let iz = (1.0 / z) as f32;
    s.iter_mut().for_each(|v| *v *= iz);
}

pub fn argmax(s: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in s.iter().enumerate() {
        if v > s[best] {
            best = i;
        }
    }
    best
}

/// `Σ_j p_j rows_j` (rows `dim` long).
pub fn weighted_sum(p: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for (&w, r) in p.iter().zip(rows.chunks_exact(dim)) {
        if w != 0.0 {
            for (o, &x) in out.iter_mut().zip(r) {
                *o += w * x;
            }
        }
    }
}
