//! `tq distortion`: relative MSE and cosine of every K and V head vector through each cache
//! type, K with and without the K mean, next to the codebook's Lloyd-Max optimum and the
//! `4^-b` bound.
//!
//! Invariant: every type sees the same vectors; `k` is always the cache storing k itself,
//! `k_with_k_mean` what llama.cpp stores for the types that remove the mean (k - m, or
//! k_p - R_p mu), and `k_centred_without_k_mean` the no-removal cache measured on that same
//! quantity, so the two K mean columns compare like with like.

use crate::capture::Capture;
use crate::codec::{roundtrip_rows, Codec};
use crate::kmean::sub_mean;
use crate::kmean_mode::{layer_k_mean, KMeanMode};
use crate::metrics::{dist, lloyd_max_distortion, lower_bound, mean_dist, Dist};
use crate::parallel::per_layer;
use crate::rotation::rot_dims;
use serde::Serialize;

#[derive(Serialize, Clone, Debug)]
pub struct DistRow {
    pub codec: &'static str,
    pub bits_per_value: f64,
    /// k against the reconstruction of k (the cache storing k: no mean removal)
    pub k: Dist,
    /// turbo types with K mean removal: k - m against dequant(quant(k - m)), what attention
    /// sees up to the softmax-invariant shift (in RoPE's frame m is R_p mu at key p, and
    /// attention adds it back exactly)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k_with_k_mean: Option<Dist>,
    /// no mean removal, measured on the same quantity: k - m against k̂ - m (k̂ the
    /// reconstruction of k); every type, when K mean removal is on
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k_centred_without_k_mean: Option<Dist>,
    pub v: Dist,
    /// Lloyd-Max distortion per unit vector of the b-bit codebook (turbo types only)
    pub lloyd_max: Option<f64>,
    /// 4^-b
    pub lower_bound: Option<f64>,
    pub k_layers: Vec<Dist>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub k_with_k_mean_layers: Vec<Dist>,
    pub v_layers: Vec<Dist>,
}

/// One layer's distortions of one type (see DistRow).
#[derive(Clone, Copy)]
struct LayerDist {
    k: Dist,
    k_with: Option<Dist>,
    k_centred: Option<Dist>,
    v: Dist,
}

/// One row per type in `codecs`, `tick()` once per layer.
pub fn distortion_rows(
    c: &Capture,
    codecs: &[Codec],
    k_mean: &KMeanMode,
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<DistRow>, String> {
    let h = &c.header;
    let (dk, dv) = (h.head_k, h.head_v);
    let (rk, rv) = rot_dims(h)?;
    let per: Vec<Vec<LayerDist>> = per_layer(h.n_layer, tick, |l| {
        // what each key has taken off: m, or R_p mu in RoPE's frame (sub_mean takes both)
        let removed = layer_k_mean(c, l, k_mean).map(|m| m.get().removed(dk, c.k[l].len(), 0));
        let centred = removed.as_deref().map(|r| sub_mean(&c.k[l], r));
        codecs
            .iter()
            .map(|&cd| {
                let y = roundtrip_rows(cd, dk, rk, &c.k[l]);
                let (k_with, k_centred) = match (&removed, &centred) {
                    (Some(r), Some(kc)) => (
                        // what llama.cpp stores: k - m (k_p - R_p mu), for the types that remove it
                        cd.removes_k_mean()
                            .then(|| dist(kc, &roundtrip_rows(cd, dk, rk, kc), dk)),
                        Some(dist(kc, &sub_mean(&y, r), dk)),
                    ),
                    _ => (None, None),
                };
                LayerDist {
                    k: dist(&c.k[l], &y, dk),
                    k_with,
                    k_centred,
                    v: dist(&c.v[l], &roundtrip_rows(cd, dv, rv, &c.v[l]), dv),
                }
            })
            .collect()
    });
    Ok(codecs
        .iter()
        .enumerate()
        .map(|(i, &cd)| {
            let col = |f: &dyn Fn(&LayerDist) -> Option<Dist>| -> Vec<Dist> {
                per.iter().filter_map(|p| f(&p[i])).collect()
            };
            let kl = col(&|d| Some(d.k));
            let kw = col(&|d| d.k_with);
            let kc = col(&|d| d.k_centred);
            let vl = col(&|d| Some(d.v));
            DistRow {
                codec: cd.name(),
                bits_per_value: cd.bits_per_value(),
                k: mean_dist(&kl),
                k_with_k_mean: (!kw.is_empty()).then(|| mean_dist(&kw)),
                k_centred_without_k_mean: (!kc.is_empty()).then(|| mean_dist(&kc)),
                v: mean_dist(&vl),
                lloyd_max: cd.index_bits().map(lloyd_max_distortion),
                lower_bound: cd.index_bits().map(lower_bound),
                k_layers: kl,
                k_with_k_mean_layers: kw,
                v_layers: vl,
            }
        })
        .collect())
}
