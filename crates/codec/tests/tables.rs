//! The checked-in codebook tables are exactly what the Lloyd-Max solver
//! produces, and the solver reproduces the published numbers.
//! (crates/gen checks that the checked-in Rust and C tables are fresh.)

use turboquant_codec::codebook::{lloyd_max, mse_of, Density};

#[test]
fn compiled_tables_match_solver() {
    // What the codec actually decodes with (compiled-in constants) equals the solver.
    for (b, ty) in [
        (2, turboquant_codec::TqType::Turbo2),
        (3, turboquant_codec::TqType::Turbo3),
        (4, turboquant_codec::TqType::Turbo4),
    ] {
        let cb = lloyd_max(Density::Exact, 64, b);
        let c: Vec<f32> = cb.centroids.iter().map(|&v| v as f32).collect();
        let t: Vec<f32> = cb.thresholds.iter().map(|&v| v as f32).collect();
        assert_eq!(ty.codebook(), &c[..], "{b}-bit codebook");
        assert_eq!(ty.thresholds(), &t[..], "{b}-bit thresholds");
        // ascending, antisymmetric, no zero centroid, middle threshold exactly 0
        assert!(c.windows(2).all(|w| w[0] < w[1]));
        for k in 0..c.len() {
            assert_eq!(c[k], -c[c.len() - 1 - k]);
        }
        assert!(c.iter().all(|&v| v != 0.0));
        assert_eq!(t[t.len() / 2], 0.0);
    }
}

/// DESIGN.md §5: Lloyd-Max centroids for N(0, 1/128), positive half.
const DESIGN_2: [f64; 2] = [0.039994, 0.133462];
const DESIGN_3: [f64; 4] = [0.02166, 0.06682, 0.11879, 0.19021];
const DESIGN_4: [f64; 8] = [
    0.01114, 0.03369, 0.05709, 0.08205, 0.10960, 0.14149, 0.18139, 0.24021,
];

fn full(pos: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = pos.iter().rev().map(|x| -x).collect();
    v.extend_from_slice(pos);
    v
}

#[test]
fn solver_reproduces_design_centroids_d128() {
    for (b, want) in [
        (2u32, &DESIGN_2[..]),
        (3, &DESIGN_3[..]),
        (4, &DESIGN_4[..]),
    ] {
        // DESIGN's list is for N(0, 1/128): the Gaussian-limit solver.
        {
            let dens = Density::Gaussian;
            let cb = lloyd_max(dens, 128, b);
            let got = cb.positive();
            eprintln!("{dens:?} d=128 b={b}: {got:?}");
            for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
                // DESIGN's 4-bit list runs ~1% low from k=2 up (0.08205 vs 0.083292,
                // 0.18139 vs 0.182877, 0.24021 vs 0.241529): Max (1960) agrees with the
                // solver (test below) and the quoted list has the higher MSE (asserted
                // below). So 1e-3 for 2/3 bits, 1.6e-3 for the 4-bit list.
                let _ = k;
                let tol = if b == 4 { 1.6e-3 } else { 1e-3 };
                assert!(
                    (g - w).abs() <= tol,
                    "{dens:?} b={b} k={k}: got {g}, DESIGN {w}"
                );
            }
        }
        // and the solved Gaussian codebook is at least as good as the quoted one
        let cb = lloyd_max(Density::Gaussian, 128, b);
        let quoted = mse_of(Density::Gaussian, 128, &full(want));
        assert!(
            cb.mse <= quoted * (1.0 + 1e-12),
            "b={b}: solver mse {} > quoted {quoted}",
            cb.mse
        );
    }
}

#[test]
fn solver_matches_max_1960_gaussian_table() {
    // Max (1960), N(0,1), 16 levels, positive outputs (4 significant digits).
    let max16 = [0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733];
    let cb = lloyd_max(Density::Gaussian, 128, 4);
    for (g, m) in cb.positive().iter().zip(max16) {
        let m = m / 128f64.sqrt();
        assert!((g - m).abs() <= 1e-4 * 0.6, "got {g}, Max {m}");
    }
}

#[test]
fn gaussian_distortion_matches_paper() {
    let want = [0.3634, 0.1175, 0.03454, 0.009497];
    for d in [32usize, 64, 128, 256] {
        for b in 1..=4u32 {
            let g = lloyd_max(Density::Gaussian, d, b);
            let w = want[b as usize - 1];
            assert!(
                (g.distortion() - w).abs() <= 0.01 * w,
                "d={d} b={b}: {} vs {w}",
                g.distortion()
            );
            let e = lloyd_max(Density::Exact, d, b);
            eprintln!(
                "d={d} b={b}: gaussian {:.6} exact {:.6}",
                g.distortion(),
                e.distortion()
            );
            assert!(
                e.distortion() <= g.distortion() + 1e-9,
                "exact worse than gaussian at d={d} b={b}"
            );
            // the paper's upper bound sqrt(3) pi / 2 * 4^-b
            assert!(
                e.distortion() < 3f64.sqrt() * std::f64::consts::PI / 2.0 * 4f64.powi(-(b as i32))
            );
        }
    }
}

#[test]
fn solver_is_a_fixed_point() {
    // Each centroid is the conditional mean of its cell to 1e-10: perturbing the
    // codebook can only increase the MSE (first-order stationarity + convexity
    // of the centroid step).
    for b in 1..=4u32 {
        let cb = lloyd_max(Density::Exact, 64, b);
        let base = cb.mse;
        let n = cb.centroids.len();
        for k in n / 2..n {
            for eps in [1e-4, -1e-4] {
                let mut c = cb.centroids.clone();
                c[k] += eps;
                c[n - 1 - k] -= eps;
                if c.windows(2).all(|w| w[0] < w[1]) {
                    assert!(
                        mse_of(Density::Exact, 64, &c) > base,
                        "b={b} k={k} eps={eps}"
                    );
                }
            }
        }
        // the Lloyd iteration converged: one more step moves nothing by 1e-10
        assert!(cb.iterations < 1_000_000);
    }
}
