//! TurboQuant-prod (MSE + QJL): unbiased inner products, at a higher variance
//! than the MSE-only quantizer with the same total bits.

use turboquant_codec::qjl::{MseQuantizer, QjlQuantizer};
use turboquant_codec::testing::*;

struct Stats {
    mean: f64,
    var: f64,
}

fn stats(e: &[f64]) -> Stats {
    let n = e.len() as f64;
    let mean = e.iter().sum::<f64>() / n;
    let var = e.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Stats { mean, var }
}

#[test]
fn qjl_is_unbiased_and_noisier_than_mse_only() {
    let dim = 64;
    let trials = 3000;
    for bits in [2u32, 3] {
        let q0 = QjlQuantizer::new(dim, bits, 1).unwrap();
        let m0 = MseQuantizer::new(dim, bits, 1).unwrap();
        let mut rng = TRng::new(bits as u64);
        // a fixed pair (x, y) with a large inner product: the MSE-only estimator's
        // shrink bias (E<y, x̂> ~ (1 - D) <y, x>) is visible, QJL's is not.
        let x = rng.gauss_vec(dim);
        let y: Vec<f32> = x.iter().map(|&v| v + 0.5 * rng.gauss()).collect();
        let truth: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mut e_qjl = vec![];
        let mut e_mse = vec![];
        for t in 0..trials {
            let seed = 1000 + t as u64;
            let q = q0.reseeded(seed);
            let m = m0.reseeded(seed);
            e_qjl.push(q.inner_product(&q.encode(&x), &y) as f64 - truth);
            e_mse.push(m.inner_product(&m.encode(&x), &y) as f64 - truth);
        }
        let sq = stats(&e_qjl);
        let sm = stats(&e_mse);
        let se_q = (sq.var / trials as f64).sqrt();
        let se_m = (sm.var / trials as f64).sqrt();
        eprintln!(
            "bits {bits}: truth {truth:.3}; QJL mean err {:.4} (se {se_q:.4}) var {:.4}; \
             MSE-only mean err {:.4} (se {se_m:.4}) var {:.4}",
            sq.mean, sq.var, sm.mean, sm.var
        );
        assert!(
            sq.mean.abs() <= 4.0 * se_q,
            "QJL biased: mean {} > 4 se {}",
            sq.mean,
            se_q
        );
        assert!(
            sm.mean.abs() > 4.0 * se_m,
            "MSE-only should be visibly biased (test power)"
        );
        assert!(
            sq.var > sm.var,
            "QJL variance {} should exceed MSE-only {}",
            sq.var,
            sm.var
        );
    }
}

#[test]
fn mse_decode_is_close() {
    let q = MseQuantizer::new(128, 4, 5).unwrap();
    let mut rng = TRng::new(6);
    let x = rng.gauss_vec(128);
    let xh = q.decode(&q.encode(&x));
    let e: f64 = x
        .iter()
        .zip(&xh)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let n: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
    assert!(e / n < 0.02, "rel err {}", e / n);
}
