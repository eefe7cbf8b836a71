//! `tq recommend`: the attention-output cosine of every (K type, V type) pair per layer,
//! causal attention of captured queries over all earlier captured keys and values, and the
//! cheapest pair that meets a target in every layer.
//!
//! Invariant: every pair is measured on the same queries, positions and exact outputs;
//! rows are ordered by bits per value, ties by the worst layer's cosine (best first), so
//! the first row meeting the target is the recommendation.

use crate::attention::{softmax, weighted_sum};
use crate::capture::{one_head, Capture};
use crate::codec::{roundtrip_rows, Codec};
use crate::kmean_mode::{layer_k_mean, KMeanMode, LayerMean};
use crate::metrics::{cosine, dot};
use crate::parallel::per_layer;
use crate::rotation::rot_dims;
use serde::Serialize;

#[derive(Serialize, Clone, Debug)]
pub struct PairRow {
    pub ctk: &'static str,
    pub ctv: &'static str,
    /// average bits per K and V value
    pub bits_per_value: f64,
    /// mean over layers, heads and queries
    pub out_cos_mean: f64,
    /// the worst layer's mean
    pub out_cos_worst_layer: f64,
    pub worst_layer: usize,
    pub meets_target: bool,
}

/// Attention-output cosine per layer for every (K type, V type): causal attention of the
/// captured queries over all earlier captured keys/values (`queries` positions per layer
/// and head, spread evenly over the capture's second half). With `k_mean`, turbo K caches
/// hold dequant(quant(k - m)), or dequant(quant(k_p - R_p mu)) + R_p mu in RoPE's frame,
/// compared with exact attention over k. `tick()` once per layer.
pub fn pair_rows(
    c: &Capture,
    codecs: &[Codec],
    queries: usize,
    target: f64,
    k_mean: &KMeanMode,
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<PairRow>, String> {
    let h = &c.header;
    let (rk, rv) = rot_dims(h)?;
    let scale = 1.0 / (h.head_k as f32).sqrt();
    let group = h.n_head / h.n_head_kv;
    let t0 = h.n_tokens / 2;
    let nq = queries.clamp(1, h.n_tokens - t0);
    let positions: Vec<usize> = (0..nq).map(|i| t0 + (i * (h.n_tokens - t0)) / nq).collect();
    let nc = codecs.len();
    // per layer: [kc][vc] mean cosine
    let per: Vec<Vec<f64>> = per_layer(h.n_layer, tick, |l| {
        let m = layer_k_mean(c, l, k_mean);
        let kq: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&cd| LayerMean::roundtrip(&m, cd, h.head_k, rk, &c.k[l]))
            .collect();
        let vq: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&cd| roundtrip_rows(cd, h.head_v, rv, &c.v[l]))
            .collect();
        let mut sum = vec![0f64; nc * nc];
        let mut n = 0usize;
        let (dk, dv) = (h.head_k, h.head_v);
        let mut exact = vec![0f32; dv];
        let mut out = vec![0f32; dv];
        for kh in 0..h.n_head_kv {
            let gather = |rows: &[f32], d| one_head(rows, h.n_head_kv, kh, d);
            let k_exact = gather(&c.k[l], dk);
            let v_exact = gather(&c.v[l], dv);
            let k_q: Vec<Vec<f32>> = kq.iter().map(|k| gather(k, dk)).collect();
            let v_q: Vec<Vec<f32>> = vq.iter().map(|v| gather(v, dv)).collect();
            for qh in kh * group..(kh + 1) * group {
                for &pos in &positions {
                    let q = c.query(l, pos, qh);
                    let len = pos + 1;
                    let probs = |keys: &[f32]| -> Vec<f32> {
                        let mut s: Vec<f32> = keys[..len * dk]
                            .chunks_exact(dk)
                            .map(|k| dot(q, k) * scale)
                            .collect();
                        softmax(&mut s);
                        s
                    };
                    let p = probs(&k_exact);
                    weighted_sum(&p, &v_exact[..len * dv], dv, &mut exact);
                    for ki in 0..nc {
                        let pk = probs(&k_q[ki]);
                        for vi in 0..nc {
                            weighted_sum(&pk, &v_q[vi][..len * dv], dv, &mut out);
                            sum[ki * nc + vi] += cosine(&exact, &out);
                        }
                    }
                    n += 1;
                }
            }
        }
        sum.iter().map(|s| s / n as f64).collect()
    });
    let mut rows = Vec::new();
    for (ki, &kc) in codecs.iter().enumerate() {
        for (vi, &vc) in codecs.iter().enumerate() {
            let layer: Vec<f64> = per.iter().map(|p| p[ki * nc + vi]).collect();
            let (worst_layer, worst) = layer
                .iter()
                .copied()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            let bits = (kc.bits_per_value() * h.head_k as f64
                + vc.bits_per_value() * h.head_v as f64)
                / (h.head_k + h.head_v) as f64;
            rows.push(PairRow {
                ctk: kc.name(),
                ctv: vc.name(),
                bits_per_value: bits,
                out_cos_mean: layer.iter().sum::<f64>() / layer.len() as f64,
                out_cos_worst_layer: worst,
                worst_layer,
                meets_target: worst >= target,
            });
        }
    }
    rows.sort_by(|a, b| {
        a.bits_per_value
            .total_cmp(&b.bits_per_value)
            .then(b.out_cos_worst_layer.total_cmp(&a.out_cos_worst_layer))
    });
    Ok(rows)
}

/// The llama-server flags of a pair (flash attention for a quantized V).
pub fn flags(r: &PairRow) -> String {
    let fa = if r.ctv == "f16" { "" } else { " -fa on" };
    format!("-ctk {} -ctv {}{fa}", r.ctk, r.ctv)
}
