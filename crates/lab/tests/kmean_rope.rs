//! The K mean in RoPE's frame (crates/lab/src/kmean_rope.rs, after ggml-ext/llama/tq-kmean-rope.h):
//! the pre-RoPE mean, the reconstruction `dequant(quant(k_p - R_p mu)) + R_p mu`, and what it
//! buys over the fitted mean far beyond the first ubatch.

use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::TqType;
use turboquant_lab::{self as lab, Codec, KMean, Pool, RopeFrame};

const D: usize = 64;
/// Noise per coordinate of the synthetic keys.
const SIGMA: f32 = 0.1;

fn gauss(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_gaussian() as f32).collect()
}

/// llama.cpp's default RoPE frequencies for a head of 64, base 10000: w_i = 10000^(-2i/64).
fn freqs() -> Vec<f64> {
    (0..D / 2)
        .map(|i| 10000f64.powf(-2.0 * i as f64 / D as f64))
        .collect()
}

/// `|mu|` large: N(0, 25) per coordinate, |mu| about 40, 400 times the noise's sigma.
fn big_mu(rng: &mut SplitMix64, heads: usize) -> Vec<f32> {
    gauss(rng, heads * D).iter().map(|x| 5.0 * x).collect()
}

/// Keys `k_p = R_p mu + N(0, SIGMA² I)` at positions 0..n, `[token][heads][D]`. `R_p` is
/// written out here as llama.cpp's `tq_rf_rotate_mean_op` (and ggml's RoPE) has it, not taken
/// from the lab, so a rotation of the wrong sense or pairing in the lab fails the tests.
fn rope_keys(rope: RopeFrame, mu: &[f32], n: usize, rng: &mut SplitMix64) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * mu.len());
    for p in 0..n {
        for m in mu.chunks_exact(D) {
            let mut k: Vec<f32> = (0..D).map(|_| SIGMA * rng.next_gaussian() as f32).collect();
            for (i, &wi) in rope.w.iter().enumerate() {
                let (a, b) = if rope.neox {
                    (i, i + D / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (c, s) = ((p as f64 * wi).cos() as f32, (p as f64 * wi).sin() as f32);
                k[a] += c * m[a] - s * m[b];
                k[b] += s * m[a] + c * m[b];
            }
            out.extend(k);
        }
    }
    out
}

fn sq(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| ((x - y) as f64).powi(2))
        .sum()
}

#[test]
fn rope_rotation_inverts_and_keeps_norms() {
    let w = freqs();
    let mut rng = SplitMix64::new(3);
    for neox in [false, true] {
        let rope = RopeFrame { w: &w, neox };
        let x = gauss(&mut rng, 2 * D);
        let mut y = x.clone();
        rope.rotate(&mut y, D, 7777, false);
        assert!((lab::norm(&y) - lab::norm(&x)).abs() < 1e-5 * lab::norm(&x));
        assert!(sq(&x, &y) > 1.0, "R_p must move the vector");
        rope.rotate(&mut y, D, 7777, true);
        assert!(sq(&x, &y) < 1e-10, "{}", sq(&x, &y));
        // position 0 is the identity
        let mut z = x.clone();
        rope.rotate(&mut z, D, 0, false);
        assert_eq!(z, x);
    }
}

/// (a) The unroped mean of `R_p mu + noise` over the first 512 positions is `mu` plus the
/// mean of 512 rotated noise vectors. R_p^-1 is orthogonal, so each rotated noise vector is
/// again N(0, SIGMA² I) and independent of the others: the error per coordinate is
/// N(0, SIGMA²/512), sd 0.0044. Tolerance: 5 sd per coordinate (over 192 coordinates a
/// chance under 1e-4 of a false failure, and the seed is fixed), and for the norm 1.5 times
/// its expectation SIGMA sqrt(D/512) = 0.035 per head (a chi with 64 degrees of freedom is
/// within 1.5x of its mean with probability far above 1 - 1e-9). The plain post-RoPE mean is
/// checked to miss mu by far more, so the test can tell the two apart.
#[test]
fn unrope_mean_recovers_pre_rope_mean() {
    let w = freqs();
    let heads = 3;
    let mut rng = SplitMix64::new(21);
    let n = lab::K_MEAN_TOKENS;
    let tol_coord = 5.0 * SIGMA as f64 / (n as f64).sqrt();
    let tol_norm = 1.5 * SIGMA as f64 * (D as f64 / n as f64).sqrt();
    for neox in [false, true] {
        let rope = RopeFrame { w: &w, neox };
        let mu = big_mu(&mut rng, heads);
        // 1024 positions: only the first 512 (the first ubatch) may count
        let keys = rope_keys(rope, &mu, 2 * n, &mut rng);
        let est = lab::unrope_mean(&keys, heads, D, rope, n);
        for h in 0..heads {
            let (e, m) = (&est[h * D..(h + 1) * D], &mu[h * D..(h + 1) * D]);
            for (j, (&a, &b)) in e.iter().zip(m).enumerate() {
                assert!(
                    ((a - b) as f64).abs() < tol_coord,
                    "neox {neox} head {h} coord {j}: {a} vs {b}"
                );
            }
            assert!(sq(e, m).sqrt() < tol_norm, "head {h}: {}", sq(e, m).sqrt());
            let plain = lab::k_mean(&keys[..n * heads * D], heads, D, n);
            let miss = sq(&plain[h * D..(h + 1) * D], m).sqrt();
            assert!(
                miss > 100.0 * tol_norm,
                "the post-RoPE mean misses mu by only {miss}"
            );
        }
        // the first ubatch is the mean's whole input: later keys do not change it
        let first = lab::unrope_mean(&keys[..n * heads * D], heads, D, rope, n);
        assert_eq!(first, est);
        // under 32 tokens llama.cpp takes no mean
        let few = lab::unrope_mean(&keys[..31 * heads * D], heads, D, rope, n);
        assert!(few.iter().all(|&x| x == 0.0));
    }
}

/// Mean squared reconstruction error per key at positions `p0..p1` (the error in the
/// logits' frame: for the fitted mean, (k - m) - dequant(quant(k - m))).
fn recon_err(km: KMean, keys: &[f32], p0: usize, p1: usize) -> f64 {
    let rows = &keys[p0 * D..p1 * D];
    let codec = Codec::Turbo(TqType::Turbo3);
    let y = km.roundtrip(codec, D, D, rows, p0);
    let target = lab::sub_mean(rows, &km.removed(D, rows.len(), p0));
    let y_frame = match km {
        // the fitted mean's reconstruction is in the shifted frame
        KMean::Fixed(_) => y,
        KMean::Rope { .. } => lab::sub_mean(&y, &km.removed(D, rows.len(), p0)),
    };
    sq(&target, &y_frame) / (p1 - p0) as f64
}

/// (b) Far beyond the first ubatch (positions 4000-8000 of an 8000-position cache), keys
/// `R_p mu + noise` with |mu| about 40: the RoPE frame leaves only the noise to quantize,
/// the fitted mean (the first-512 mean mapped by rope_fit_mean) leaves most of R_p mu on the
/// pairs RoPE spins, and turbo3's error scales with what it is given. Measured (seed 5,
/// turbo3, mean squared error per key over positions 4000-7999): RoPE frame 0.0191 / 0.0189
/// (interleaved / NEOX), fitted 38.68 / 36.85; mean |k|² there 1636 / 1322. The assertions:
/// fitted - rope > half the smaller measured gap (36.83 / 2 = 18.4), and rope under twice
/// the larger measured 0.0191 (a RoPE frame that lost part of R_p mu fails the second).
#[test]
fn rope_frame_beats_fitted_far_from_first_ubatch() {
    let w = freqs();
    let n_pos = 8000;
    let mut rng = SplitMix64::new(5);
    for neox in [false, true] {
        let rope = RopeFrame { w: &w, neox };
        let mu = big_mu(&mut rng, 1);
        let keys = rope_keys(rope, &mu, n_pos, &mut rng);
        let mu_hat = lab::unrope_mean(&keys, 1, D, rope, lab::K_MEAN_TOKENS);
        let mut fit = lab::k_mean(&keys, 1, D, lab::K_MEAN_TOKENS);
        lab::rope_fit_mean(&mut fit, D, &w, neox, lab::K_MEAN_TOKENS, n_pos);
        let e_rope = recon_err(KMean::Rope { mu: &mu_hat, rope }, &keys, 4000, n_pos);
        let e_fit = recon_err(KMean::Fixed(&fit), &keys, 4000, n_pos);
        let k2 = sq(&keys[4000 * D..], &vec![0.0; (n_pos - 4000) * D]) / (n_pos - 4000) as f64;
        eprintln!("neox {neox}: rope {e_rope:.4} fitted {e_fit:.4} |k|^2 {k2:.1}");
        assert!(
            e_fit - e_rope > 0.5 * MEASURED_GAP,
            "rope {e_rope} fitted {e_fit}"
        );
        assert!(e_rope < 2.0 * MEASURED_ROPE, "rope {e_rope}");
    }
}
/// The smaller fitted - rope gap measured above (NEOX: 36.8465 - 0.0189).
const MEASURED_GAP: f64 = 36.83;
/// The larger RoPE-frame error measured above (interleaved).
const MEASURED_ROPE: f64 = 0.0191;

/// (c) Through a lossless quantizer the RoPE frame gives back the keys to f32 rounding
/// (subtracting and adding back R_p mu), and what it hands the quantizer is k_p - R_p mu:
/// here the noise alone (|noise| about SIGMA sqrt(D) = 0.8 per key against |k| about 40),
/// which a wrong rotation direction or position would not give.
#[test]
fn rope_frame_is_exact_through_a_lossless_path() {
    let w = freqs();
    let heads = 2;
    let mut rng = SplitMix64::new(9);
    for neox in [false, true] {
        let rope = RopeFrame { w: &w, neox };
        let mu = big_mu(&mut rng, heads);
        let keys = rope_keys(rope, &mu, 6000, &mut rng);
        let (p0, p1) = (5000, 6000);
        let rows = &keys[p0 * heads * D..p1 * heads * D];
        let mut stored = Vec::new();
        let y = lab::through_rope_frame(rows, &mu, D, rope, p0, |x| {
            stored = x.to_vec();
            x.to_vec()
        });
        for (i, (&a, &b)) in y.iter().zip(rows).enumerate() {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{i}: {a} vs {b}");
        }
        let noise2 = sq(&stored, &vec![0.0; stored.len()]) / (rows.len() / D) as f64;
        let expect = (SIGMA * SIGMA) as f64 * D as f64;
        assert!(
            (0.8 * expect..1.2 * expect).contains(&noise2),
            "stored |k - R_p mu|² {noise2} vs noise {expect}"
        );
        // the same through KMean with a codec that keeps k (no mean removal): k exactly
        let km = KMean::Rope { mu: &mu, rope };
        assert_eq!(km.roundtrip(Codec::Identity, D, D, rows, p0), rows);
    }
}

/// The needle proxy in RoPE's frame: on a pool of `R_i mu + noise` keys at positions
/// 0..8000 (pool key i at position i, the needle at its pool key's), 100 trials at L = 2048.
/// Measured (seed 17/99): turbo3 top-1 98/100 and output cosine 0.9788 in RoPE's frame,
/// 84/100 and 0.8942 with the fitted mean; asserted: RoPE's frame at least as many hits and
/// a higher cosine. A needle reconstructed at the wrong position would carry a wrong
/// R_p mu (|mu| about 40) and lose the trial. q8_0 removes no mean: identical both ways.
#[test]
fn needle_trial_in_rope_frame() {
    let w = freqs();
    let rope = RopeFrame { w: &w, neox: true };
    let mut rng = SplitMix64::new(17);
    let n = 8000;
    let mu = big_mu(&mut rng, 1);
    let keys = rope_keys(rope, &mu, n, &mut rng);
    let values = gauss(&mut rng, n * D);
    let mu_hat = lab::unrope_mean(&keys, 1, D, rope, lab::K_MEAN_TOKENS);
    let mut fit = lab::k_mean(&keys, 1, D, lab::K_MEAN_TOKENS);
    lab::rope_fit_mean(&mut fit, D, &w, true, lab::K_MEAN_TOKENS, n);
    let codecs = [Codec::Turbo(TqType::Turbo3), Codec::Q8_0];
    let values_q: Vec<Vec<f32>> = codecs
        .iter()
        .map(|&c| lab::roundtrip_rows(c, D, D, &values))
        .collect();
    let run = |km: KMean| {
        let keys_q: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&c| km.roundtrip(c, D, D, &keys, 0))
            .collect();
        let pool = Pool {
            keys: &keys,
            keys_q: &keys_q,
            k_mean: Some(km),
            values: &values,
            values_q: &values_q,
            dim: D,
            dim_v: D,
            rot_dim: D,
        };
        let mut trng = SplitMix64::new(99);
        let mut acc = [(0usize, 0f64); 2];
        for _ in 0..100 {
            let q = gauss(&mut trng, D);
            let r = lab::needle_trial(&pool, &codecs, &q, 2048, 0.5, 0.125, &mut trng);
            for (a, t) in acc.iter_mut().zip(&r) {
                a.0 += usize::from(t.top1_same);
                a.1 += t.out_cos / 100.0;
            }
        }
        acc
    };
    let (r, f) = (
        run(KMean::Rope { mu: &mu_hat, rope }),
        run(KMean::Fixed(&fit)),
    );
    eprintln!("rope {r:?} fitted {f:?}");
    assert!(
        r[0].0 >= f[0].0 && r[0].1 > f[0].1,
        "turbo3: rope {r:?} fitted {f:?}"
    );
    assert_eq!(r[1].0, f[1].0, "q8_0 does not remove the mean");
    assert!((r[1].1 - f[1].1).abs() < 1e-6);
}
