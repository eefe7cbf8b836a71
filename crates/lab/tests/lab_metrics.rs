//! The lab's math (crates/lab/src: capture, metrics, rotation, codec, needle): capture file round trip and its errors, moments, rotations,
//! the ggml q8_0/q4_0 re-implementations, distortion against theory, the needle metric.

use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::TqType;
use turboquant_lab::{
    self as lab, Capture, CaptureError, CaptureHeader, Codec, Moments, Pool, Rotation,
};

fn gauss(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_gaussian() as f32).collect()
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tq-lab-{}-{name}", std::process::id()))
}

fn sample_capture() -> Capture {
    let header = CaptureHeader {
        version: 1,
        model: "m.gguf".into(),
        desc: "test".into(),
        text: "t.txt".into(),
        n_tokens: 5,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_k: 64,
        head_v: 128,
        dtype: "f16".into(),
        note: String::new(),
        rope: None,
    };
    let mut rng = SplitMix64::new(7);
    // values exactly representable in f16, so the round trip is exact
    let mut f = |n: usize| -> Vec<f32> {
        gauss(&mut rng, n)
            .into_iter()
            .map(|x| half::f16::from_f32(x * 10.0).to_f32())
            .collect()
    };
    let [lk, lv, lq] = Capture::layer_lens(&header);
    Capture {
        k: vec![f(lk), f(lk)],
        v: vec![f(lv), f(lv)],
        q: vec![f(lq), f(lq)],
        header,
    }
}

#[test]
fn capture_file_round_trip() {
    let c = sample_capture();
    let p = tmp("rt.tqkv");
    c.write(&p).unwrap();
    let r = Capture::read(&p).unwrap();
    assert_eq!(r, c);
    assert_eq!(Capture::read_header(&p).unwrap(), c.header);
    // indexing: token 3, KV head 1 of layer 1
    let o = (3 * 2 + 1) * 128;
    assert_eq!(r.value(1, 3, 1), &c.v[1][o..o + 128]);
    let o = (4 * 4 + 2) * 64;
    assert_eq!(r.query(0, 4, 2), &c.q[0][o..o + 64]);

    // truncated, wrong magic, missing
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 2]).unwrap();
    assert!(matches!(
        Capture::read(&p),
        Err(CaptureError::Truncated(..))
    ));
    std::fs::write(&p, b"GGUF\x03\0\0\0 not a capture").unwrap();
    let e = Capture::read(&p).unwrap_err();
    assert!(matches!(e, CaptureError::Magic(_)));
    assert!(e.to_string().contains("tq capture"), "{e}");
    std::fs::remove_file(&p).unwrap();
    assert!(matches!(Capture::read(&p), Err(CaptureError::Io { .. })));
}

#[test]
fn moments_of_gaussian_samples() {
    // n = 400k: the standard error of the sample kurtosis is sqrt(24/n) = 0.008; allow 6σ.
    let mut rng = SplitMix64::new(1);
    let mut m = Moments::default();
    for _ in 0..400_000 {
        m.push(2.0 + 0.5 * rng.next_gaussian());
    }
    assert!((m.mean() - 2.0).abs() < 0.005, "mean {}", m.mean());
    assert!((m.std() - 0.5).abs() < 0.005, "std {}", m.std());
    assert!(
        (m.kurtosis() - 3.0).abs() < 0.05,
        "kurtosis {}",
        m.kurtosis()
    );
    // uniform on [0, 1): kurtosis 9/5
    let mut u = Moments::default();
    for _ in 0..400_000 {
        u.push(rng.next_f64());
    }
    assert!(
        (u.kurtosis() - 1.8).abs() < 0.02,
        "uniform kurtosis {}",
        u.kurtosis()
    );
}

#[test]
fn rotated_vectors_look_like_the_sphere() {
    // Normalized Gaussian vectors are uniform on S^63 and stay so after the seeded rotation:
    // coordinate std 1/8, kurtosis 3d/(d+2) = 2.909.
    let mut rng = SplitMix64::new(3);
    let stats = |rng: &mut SplitMix64, heavy: bool| {
        let (mut before, mut after) = (Moments::default(), Moments::default());
        for _ in 0..4000 {
            let mut x = gauss(rng, 64);
            if heavy {
                // Gaussian scale mixture: 10% of the coordinates 6x wider (kurtosis ~19)
                for v in x.iter_mut() {
                    *v *= if rng.next_f64() < 0.1 { 3.0 } else { 0.5 };
                }
            }
            let n = lab::norm(&x) as f32;
            x.iter_mut().for_each(|v| *v /= n);
            before.extend(&x);
            lab::apply_rotation(Rotation::Seeded, 64, &mut x);
            after.extend(&x);
        }
        (before, after)
    };
    let (_, after) = stats(&mut rng, false);
    assert!((after.std() - 0.125).abs() < 0.001, "{}", after.std());
    assert!(
        (after.kurtosis() - lab::sphere_kurtosis(64)).abs() < 0.06,
        "{}",
        after.kurtosis()
    );
    // Heavy-tailed vectors: the rotation brings kurtosis from ~15 to near 3, but not to it.
    // Given the magnitudes a_j of one vector, each rotated coordinate is a random-sign sum
    // with kurtosis 3 - 2 Σa_j⁴/(Σa_j²)²: below 3 when a few coordinates carry the energy.
    let (before, after) = stats(&mut rng, true);
    assert!(before.kurtosis() > 10.0, "{}", before.kurtosis());
    assert!((after.std() - 0.125).abs() < 0.001, "{}", after.std());
    assert!(
        (2.4..3.0).contains(&after.kurtosis()),
        "{}",
        after.kurtosis()
    );
}

#[test]
fn rotations_preserve_norms_and_undo_themselves() {
    let mut rng = SplitMix64::new(5);
    for rot in [Rotation::Seeded, Rotation::Plain] {
        for dim in [64usize, 128, 256] {
            let x = gauss(&mut rng, dim * 3);
            let mut y = x.clone();
            lab::apply_rotation(rot, dim, &mut y);
            for (a, b) in x.chunks(dim).zip(y.chunks(dim)) {
                let (na, nb) = (lab::norm(a), lab::norm(b));
                assert!((na - nb).abs() < 1e-5 * na, "{rot:?} {dim}: {na} vs {nb}");
            }
            assert_ne!(x, y);
            lab::apply_rotation(rot, dim, &mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "{rot:?} {dim}: not an involution");
            }
        }
    }
    assert_eq!(lab::rot_dim_k(64), Some(64));
    assert_eq!(lab::rot_dim_k(192), Some(64));
    assert_eq!(lab::rot_dim_k(256), Some(256));
    assert_eq!(lab::rot_dim_v(256), Some(64));
    assert_eq!(lab::rot_dim_k(80), None);
}

#[test]
fn ggml_reference_quantizers() {
    // q8_0: d = amax/127, round half away from zero
    let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 15.5).collect();
    let orig = x.clone();
    lab::q8_0_roundtrip(&mut x);
    let d = half::f16::from_f32(1.0 / 127.0).to_f32();
    for (a, b) in orig.iter().zip(&x) {
        assert_eq!(*b, (a * 127.0).round() * d);
    }
    // q4_0: the signed absmax maps to -8 exactly; every value on the 16-level grid
    let mut x: Vec<f32> = (0..32).map(|i| i as f32 * 0.05 - 0.8).collect();
    x[7] = 2.0;
    lab::q4_0_roundtrip(&mut x);
    let d = half::f16::from_f32(2.0 / -8.0).to_f32();
    assert_eq!(x[7], -8.0 * d);
    for v in &x {
        let q = v / d;
        assert!(q == q.round() && (-8.0..=7.0).contains(&q), "{v} -> {q}");
    }
    // all-zero block stays zero
    let mut z = [0f32; 32];
    lab::q4_0_roundtrip(&mut z);
    lab::q8_0_roundtrip(&mut z);
    assert!(z.iter().all(|&v| v == 0.0));
}

#[test]
fn distortion_on_gaussian_rows_matches_theory() {
    // Gaussian rows: turbo's relative MSE is at or below the fixed-gain Lloyd-Max optimum
    // (the encoder's gain search fits each block's gain; measured 0.00700 / 0.0296 / 0.1147,
    // asserted within about ±5 %) and above the 4^-b bound; the order of types by bits is
    // the order of errors.
    let mut rng = SplitMix64::new(9);
    let x = gauss(&mut rng, 64 * 2000);
    let rel = |c: Codec| {
        let y = lab::roundtrip_rows(c, 64, 64, &x);
        let e: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        e / x.iter().map(|a| (*a as f64).powi(2)).sum::<f64>()
    };
    let mut prev = 0.0;
    for (t, lo, hi) in [
        (TqType::Turbo4, 0.0066, 0.0074),
        (TqType::Turbo3, 0.0281, 0.0311),
        (TqType::Turbo2, 0.109, 0.120),
    ] {
        let r = rel(Codec::Turbo(t));
        let lm = lab::lloyd_max_distortion(t.bits());
        assert!(r > lab::lower_bound(t.bits()), "{t:?} {r}");
        assert!((lo..hi).contains(&r), "{t:?}: rel MSE {r}, Lloyd-Max {lm}");
        assert!(r < 1.01 * lm, "{t:?}: {r} vs {lm}");
        assert!(r > prev);
        prev = r;
    }
    assert!(rel(Codec::Q8_0) < 1e-4);
    assert!((0.006..0.009).contains(&rel(Codec::Q4_0)));
    assert_eq!(rel(Codec::Identity), 0.0);
}

/// `trials` needle trials (Gaussian queries, head 64, scale 1/8) over a pool of `keys` and
/// `values`, turbo codecs removing the K mean `m` when given: per codec, the top-1 rate,
/// the mean and the lowest attention-output cosine.
#[allow(clippy::too_many_arguments)]
fn pool_trials(
    codecs: &[Codec],
    keys: &[f32],
    values: &[f32],
    m: Option<&[f32]>,
    len: usize,
    weight: f64,
    trials: usize,
    rng: &mut SplitMix64,
) -> Vec<(f64, f64, f64)> {
    let d = 64;
    let keys_q: Vec<Vec<f32>> = codecs
        .iter()
        .map(|&c| lab::roundtrip_keys(c, d, 64, keys, m))
        .collect();
    let values_q: Vec<Vec<f32>> = codecs
        .iter()
        .map(|&c| lab::roundtrip_rows(c, d, 64, values))
        .collect();
    let pool = Pool {
        keys,
        keys_q: &keys_q,
        k_mean: m.map(lab::KMean::Fixed),
        values,
        values_q: &values_q,
        dim: d,
        dim_v: d,
        rot_dim: 64,
    };
    let mut acc = vec![(0usize, 0f64, f64::INFINITY); codecs.len()];
    for _ in 0..trials {
        let q = gauss(rng, d);
        let r = lab::needle_trial(&pool, codecs, &q, len, weight, 0.125, rng);
        for (a, t) in acc.iter_mut().zip(&r) {
            a.0 += usize::from(t.top1_same);
            a.1 += t.out_cos;
            a.2 = a.2.min(t.out_cos);
            assert!(t.out_cos <= 1.0 + 1e-9);
        }
    }
    let n = trials as f64;
    acc.iter()
        .map(|&(h, c, lo)| (h as f64 / n, c / n, lo))
        .collect()
}

fn needle_rate(codecs: &[Codec], len: usize, weight: f64, trials: usize) -> Vec<f64> {
    let mut rng = SplitMix64::new(11);
    let n = 2048;
    let keys = gauss(&mut rng, n * 64);
    let values = gauss(&mut rng, n * 64);
    let r = pool_trials(codecs, &keys, &values, None, len, weight, trials, &mut rng);
    for &(_, _, lo) in &r {
        assert!(lo > 0.5, "attention-output cosine {lo}");
    }
    r.iter().map(|t| t.0).collect()
}

#[test]
fn needle_metric_is_one_for_identity_and_drops_for_turbo2() {
    let codecs = [
        Codec::Identity,
        Codec::Turbo(TqType::Turbo4),
        Codec::Turbo(TqType::Turbo2),
    ];
    // needle weight 0.5: the needle is the exact top-1 and no codec loses it on Gaussian keys
    let r = needle_rate(&codecs, 1024, 0.5, 40);
    assert_eq!(r[0], 1.0);
    assert!(r[1] >= 0.95, "{r:?}");
    // a negligible needle (weight 1e-4): the top-1 is the largest of 4096 Gaussian scores,
    // close to its runner-up, and quantization noise reorders them: the metric falls, more
    // for 2 bits than for 4
    let r = needle_rate(&codecs, 4096, 1e-4, 60);
    assert_eq!(r[0], 1.0, "identity must never change the top-1: {r:?}");
    assert!(r[2] < 0.9, "turbo2 should lose the top-1 often: {r:?}");
    assert!(r[1] > r[2], "turbo4 keeps it more often than turbo2: {r:?}");
}

/// Needle trials on keys `N(0, I) + c` with a large shared offset `c` (|c|² = 9 d, 90% of
/// the keys' energy, more than SmolLM2's 49%): top-1 rate and mean attention-output cosine
/// per codec, with or without K mean removal.
fn offset_needle(codecs: &[Codec], remove_mean: bool, seed: u64) -> Vec<(f64, f64)> {
    let mut rng = SplitMix64::new(seed);
    let (n, d) = (2048, 64);
    let c: Vec<f32> = gauss(&mut rng, d).iter().map(|x| 3.0 * x).collect();
    let keys: Vec<f32> = gauss(&mut rng, n * d)
        .iter()
        .enumerate()
        .map(|(i, x)| x + c[i % d])
        .collect();
    let values = gauss(&mut rng, n * d);
    let m = remove_mean.then(|| lab::k_mean(&keys, 1, d, lab::K_MEAN_TOKENS));
    // a negligible needle (weight 1e-4): the top-1 is the largest of 4096 haystack scores,
    // close to its runner-up, so K noise in the scores shows
    pool_trials(
        codecs,
        &keys,
        &values,
        m.as_deref(),
        4096,
        1e-4,
        60,
        &mut rng,
    )
    .iter()
    .map(|t| (t.0, t.1))
    .collect()
}

#[test]
fn k_mean_removal_helps_keys_with_a_shared_offset() {
    // Turbo's error is proportional to |k|; with |c|² = 9 d the keys are ~3x longer than
    // their spread, and removing the mean cuts the score noise ~3x. Measured on seeds 21-23
    // (60 trials each, the encoder with its gain search), mean removal raises the top-1
    // rate by at least 0.217 (turbo4 0.60-0.67 -> 0.85-0.88; turbo3 0.23-0.33 -> 0.63-0.75;
    // turbo2 0.05-0.15 -> 0.43-0.48) and the attention-output cosine by at least 0.025
    // (turbo4: 0.965-0.969 -> 0.992-0.994; turbo3 0.87-0.88 -> 0.970-0.974; turbo2
    // 0.61-0.63 -> 0.88-0.90). Asserted: +0.2 and +0.02. q4_0 keeps k (llama.cpp removes the mean only for turbo K): identical results.
    let codecs = [
        Codec::Turbo(TqType::Turbo4),
        Codec::Turbo(TqType::Turbo3),
        Codec::Turbo(TqType::Turbo2),
        Codec::Q4_0,
    ];
    for seed in [21, 22, 23] {
        let off = offset_needle(&codecs, false, seed);
        let on = offset_needle(&codecs, true, seed);
        for (i, cd) in codecs.iter().enumerate() {
            let ((t0, c0), (t1, c1)) = (off[i], on[i]);
            if cd.removes_k_mean() {
                assert!(t1 >= t0 + 0.2, "seed {seed} {cd:?}: top-1 {t0} -> {t1}");
                assert!(c1 >= c0 + 0.02, "seed {seed} {cd:?}: out cos {c0} -> {c1}");
            } else {
                assert_eq!((t0, c0), (t1, c1), "seed {seed} {cd:?}");
            }
        }
    }
}

#[test]
fn k_mean_rule_and_softmax_invariance() {
    let mut rng = SplitMix64::new(31);
    let (n, d, heads) = (1024, 64, 2);
    let c: Vec<f32> = gauss(&mut rng, heads * d).iter().map(|x| 3.0 * x).collect();
    let keys: Vec<f32> = gauss(&mut rng, n * heads * d)
        .iter()
        .enumerate()
        .map(|(i, x)| x + c[i % (heads * d)])
        .collect();
    // m: per head, the mean of the first 512 tokens (llama.cpp's first ubatch), not all
    let m = lab::k_mean(&keys, heads, d, lab::K_MEAN_TOKENS);
    for (j, &mj) in m.iter().enumerate() {
        let first: f64 = (0..512)
            .map(|t| keys[t * heads * d + j] as f64)
            .sum::<f64>()
            / 512.0;
        assert!((mj as f64 - first).abs() < 1e-6, "{j}: {mj} vs {first}");
    }
    // under 32 tokens in the first ubatch: m = 0, as llama.cpp (TQ_KMEAN_MIN_TOKENS)
    assert!(lab::k_mean(&keys[..31 * heads * d], heads, d, 512)
        .iter()
        .all(|&x| x == 0.0));
    assert_ne!(
        lab::k_mean(&keys[..32 * heads * d], heads, d, 512),
        vec![0.0; heads * d]
    );
    // only turbo codecs shift; the others give back k
    let identity = lab::roundtrip_keys(Codec::Identity, d, 64, &keys, Some(&m));
    assert_eq!(identity, keys);

    // unquantized keys: attention over k - m is attention over k (softmax ignores -q·m).
    // What is left is f32 rounding of the logits, larger with the offset: at most 6.7e-7
    // relative over these 50 queries (seed 31).
    let shifted = lab::sub_mean(&keys, &m);
    let values = gauss(&mut rng, n * d);
    let one = |rows: &[f32]| lab::one_head(rows, heads, 1, d);
    let (k1, s1) = (one(&keys), one(&shifted));
    let attention = |q: &[f32], keys: &[f32]| {
        let mut s: Vec<f32> = keys
            .chunks_exact(d)
            .map(|k| lab::dot(q, k) * 0.125)
            .collect();
        lab::softmax(&mut s);
        let mut out = vec![0f32; d];
        lab::weighted_sum(&s, &values, d, &mut out);
        (out, s)
    };
    for _ in 0..50 {
        let q = gauss(&mut rng, d);
        let ((a, pa), (b, pb)) = (attention(&q, &k1), attention(&q, &s1));
        let diff: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        let rel = lab::norm(&diff) / lab::norm(&a);
        assert!(rel < 1e-6, "attention output differs by {rel} (relative)");
        assert_eq!(lab::argmax(&pa), lab::argmax(&pb));
    }
}

/// Keys `rope(mu, p) + noise` at positions 0..n: what a common pre-RoPE component looks like
/// after RoPE. Residual energy of `k_p - m` over every position.
fn rope_keys(w: &[f64], mu: &[f32], n: usize, neox: bool, rng: &mut SplitMix64) -> Vec<f32> {
    let d = mu.len();
    let mut out = Vec::with_capacity(n * d);
    for p in 0..n {
        let mut k = gauss(rng, d).iter().map(|x| 0.1 * x).collect::<Vec<f32>>();
        for (i, &wi) in w.iter().enumerate() {
            let (a, b) = if neox {
                (i, i + d / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (c, s) = ((wi * p as f64).cos() as f32, (wi * p as f64).sin() as f32);
            k[a] += c * mu[a] - s * mu[b];
            k[b] += s * mu[a] + c * mu[b];
        }
        out.extend(k);
    }
    out
}

fn residual(keys: &[f32], m: &[f32]) -> f64 {
    keys.chunks_exact(m.len())
        .map(|k| {
            k.iter()
                .zip(m)
                .map(|(&x, &y)| ((x - y) as f64).powi(2))
                .sum::<f64>()
        })
        .sum()
}

#[test]
fn rope_fitted_mean_models_llama_cpp_map() {
    // one pair that barely turns over 4096 positions, one that turns part way, two that spin
    let w = [0.00001, 0.002, 0.05, 1.0];
    let mut rng = SplitMix64::new(11);
    let mu = gauss(&mut rng, 8);
    for neox in [false, true] {
        let keys = rope_keys(&w, &mu, 4096, neox, &mut rng);
        let plain = lab::k_mean(&keys, 1, 8, lab::K_MEAN_TOKENS);
        // the cache holds only the first ubatch: the map is the identity (F = 1)
        let mut same = plain.clone();
        lab::rope_fit_mean(
            &mut same,
            8,
            &w,
            neox,
            lab::K_MEAN_TOKENS,
            lab::K_MEAN_TOKENS,
        );
        for (a, b) in same.iter().zip(&plain) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "N = B must leave the mean: {a} vs {b}"
            );
        }
        // no RoPE handled: unchanged
        let mut none = plain.clone();
        lab::rope_fit_mean(&mut none, 8, &[], neox, lab::K_MEAN_TOKENS, 4096);
        assert_eq!(none, plain);
        // over 4096 positions the fitted mean leaves less energy than the first-ubatch mean
        // and than none, and it keeps the slow pair's mean
        let mut fit = plain.clone();
        lab::rope_fit_mean(&mut fit, 8, &w, neox, lab::K_MEAN_TOKENS, 4096);
        let (e_fit, e_plain, e_none) = (
            residual(&keys, &fit),
            residual(&keys, &plain),
            residual(&keys, &[0.0; 8]),
        );
        assert!(
            e_fit < e_plain && e_fit < e_none,
            "fitted {e_fit} plain {e_plain} none {e_none}"
        );
        let (a, b) = if neox { (0, 4) } else { (0, 1) };
        let kept = fit[a].hypot(fit[b]) / plain[a].hypot(plain[b]);
        assert!((0.95..=1.0 + 1e-6).contains(&kept), "slow pair kept {kept}");
        // the spinning pair's mean shrinks toward 0 (|F| < 1 there)
        let (a, b) = if neox { (3, 7) } else { (6, 7) };
        assert!(fit[a].hypot(fit[b]) < 0.2 * plain[a].hypot(plain[b]).max(1e-3));
    }
}
