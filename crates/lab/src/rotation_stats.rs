//! `tq rotation-stats`: the moments of every unit-normalized head vector's coordinates,
//! before and after the seeded rotation of a turbo cache, and the share of a head's energy
//! in a fixed offset.
//!
//! Invariant: the vectors are normalized before the rotation, so the std after it is
//! `1/sqrt(d)` by construction; only the kurtosis (3 in the Gaussian limit) measures how
//! far the rotated coordinates are from the law the codebook assumes.

use crate::capture::Capture;
use crate::metrics::{norm, Moments};
use crate::parallel::per_layer;
use crate::rotation::{apply_rotation, rot_dims, Rotation};
use serde::Serialize;

#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct Stat {
    pub std: f64,
    pub kurtosis: f64,
}

impl From<&Moments> for Stat {
    fn from(m: &Moments) -> Stat {
        Stat {
            std: m.std(),
            kurtosis: m.kurtosis(),
        }
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct RotRow {
    pub layer: usize,
    pub k_before: Stat,
    pub k_after: Stat,
    pub v_before: Stat,
    pub v_after: Stat,
    /// |mean of the unit-normalized vectors of a head|², mean over heads: the share of
    /// the energy in a fixed per-head offset (0 for isotropic vectors)
    pub k_mean_energy: f64,
    pub v_mean_energy: f64,
}

/// Moments of the coordinates of every unit-normalized head vector, raw and after the
/// seeded rotation of a turbo cache, and the mean-offset energy share (see RotRow).
pub fn rot_moments(
    rows: &[f32],
    dim: usize,
    rot_dim: usize,
    heads: usize,
) -> (Moments, Moments, f64) {
    let (mut before, mut after) = (Moments::default(), Moments::default());
    let mut buf = vec![0f32; dim];
    let mut mean = vec![0f64; heads * dim];
    let mut count = vec![0usize; heads];
    for (i, x) in rows.chunks_exact(dim).enumerate() {
        let n = norm(x);
        if n == 0.0 {
            continue;
        }
        for (b, &v) in buf.iter_mut().zip(x) {
            *b = (v as f64 / n) as f32;
        }
        let h = i % heads;
        count[h] += 1;
        for (m, &b) in mean[h * dim..(h + 1) * dim].iter_mut().zip(&buf) {
            *m += b as f64;
        }
        before.extend(&buf);
        apply_rotation(Rotation::Seeded, rot_dim, &mut buf);
        after.extend(&buf);
    }
    let energy = (0..heads)
        .map(|h| {
            let c = count[h].max(1) as f64;
            mean[h * dim..(h + 1) * dim]
                .iter()
                .map(|m| (m / c).powi(2))
                .sum::<f64>()
        })
        .sum::<f64>()
        / heads as f64;
    (before, after, energy)
}

/// Per layer its row, and all layers pooled: K before, K after, V before, V after.
pub fn rotation_stats(
    c: &Capture,
    tick: &(dyn Fn() + Sync),
) -> Result<(Vec<RotRow>, [Stat; 4]), String> {
    let h = &c.header;
    let (rk, rv) = rot_dims(h)?;
    let rows: Vec<(RotRow, [Moments; 4])> = per_layer(h.n_layer, tick, |l| {
        let (kb, ka, ke) = rot_moments(&c.k[l], h.head_k, rk, h.n_head_kv);
        let (vb, va, ve) = rot_moments(&c.v[l], h.head_v, rv, h.n_head_kv);
        (
            RotRow {
                layer: l,
                k_before: (&kb).into(),
                k_after: (&ka).into(),
                v_before: (&vb).into(),
                v_after: (&va).into(),
                k_mean_energy: ke,
                v_mean_energy: ve,
            },
            [kb, ka, vb, va],
        )
    });
    // all layers pooled: Moments are plain power sums, merging is adding them
    let mut all = [Moments::default(); 4];
    for (_, m) in &rows {
        for i in 0..4 {
            all[i].merge(&m[i]);
        }
    }
    Ok((
        rows.into_iter().map(|(r, _)| r).collect(),
        all.each_ref().map(Stat::from),
    ))
}
