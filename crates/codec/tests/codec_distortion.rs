//! Measured distortion of the codec on 1e5 Gaussian blocks (what rotated K/V
//! rows look like) against the d = 64 Lloyd-Max optimum from the solver.

use turboquant_codec::codebook::{lloyd_max, Density};
use turboquant_codec::testing::*;
use turboquant_codec::TqType;

const BLOCKS: usize = 100_000;

#[test]
fn distortion_matches_measurement() {
    let mut rng = TRng::new(2504_19874);
    let x = rng.gauss_vec(BLOCKS * 64);
    for ty in TqType::ALL {
        let y = decode(ty, &encode(ty, &x));
        // mean over blocks of ||x - y||^2 / ||x||^2 (distortion per unit-norm vector)
        let mut per_vec = 0.0;
        let (mut num, mut den) = (0.0, 0.0);
        for b in 0..BLOCKS {
            let (mut e, mut n) = (0.0f64, 0.0f64);
            for j in b * 64..(b + 1) * 64 {
                e += (x[j] as f64 - y[j] as f64).powi(2);
                n += (x[j] as f64).powi(2);
            }
            per_vec += e / n;
            num += e;
            den += n;
        }
        per_vec /= BLOCKS as f64;
        let opt = lloyd_max(Density::Exact, 64, ty.bits()).distortion();
        let gauss = lloyd_max(Density::Gaussian, 64, ty.bits()).distortion();
        // first-order prediction if the quantization error were orthogonal to the
        // centroid vector in every block: 2 - 2 sqrt(1 - D)
        let predicted = 2.0 - 2.0 * (1.0 - opt).sqrt();
        eprintln!(
            "{}: measured {per_vec:.6} (pooled rel. MSE {:.6}), d=64 optimum {opt:.6} (ratio {:.4}), \
             norm-restoring prediction {predicted:.6}, Gaussian-limit {gauss:.6}",
            ty.name(),
            num / den,
            per_vec / opt
        );
        // The gain search (crates/codec/src/gain.rs) fits each block's gain, so the codec
        // lands below the fixed-gain scalar optimum: measured ratios 0.9997 / 0.8884 / 0.7615
        // (turbo2 / 3 / 4, docs/CODEC.md; the plain codes gave 1.017 / 0.983 / 0.967).
        // Each within 0.01 of its measurement, so a search that stops helping fails here.
        let measured = match ty {
            TqType::Turbo2 => 0.9997,
            TqType::Turbo3 => 0.8884,
            TqType::Turbo4 => 0.7615,
        };
        assert!(
            (per_vec / opt - measured).abs() <= 0.01,
            "{ty:?}: {per_vec} vs optimum {opt}: ratio {} against the measured {measured}",
            per_vec / opt
        );
        // and it is never worse than the Gaussian-limit (paper) codebook's optimum + 2%
        assert!(
            per_vec <= 1.02 * gauss,
            "{ty:?}: {per_vec} vs Gaussian {gauss}"
        );
    }
}
