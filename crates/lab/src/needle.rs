//! The needle proxy of `tq niah`: one trial (a haystack drawn from a pool of keys, a needle
//! whose exact attention weight is fixed, every cache type's keys and values) and the
//! trials over a capture's (layer, KV head) pools and synthetic Gaussian pools.
//!
//! Invariant: the exact side is always attention over the unshifted captured keys, and
//! every cache type of a trial sees the same haystack, needle and query; a trial's random
//! draws depend only on the seed, the unit, the length and the trial index, so results do
//! not depend on the number of threads.

use crate::attention::{argmax, softmax, weighted_sum};
use crate::capture::{one_head, Capture};
use crate::codec::{roundtrip_rows, Codec};
use crate::kmean::{k_mean as k_mean_of, K_MEAN_TOKENS};
use crate::kmean_mode::{layer_k_mean, Frame, KMeanMode, LayerMean};
use crate::kmean_rope::KMean;
use crate::metrics::{cosine, dot};
use crate::parallel::parallel_map;
use crate::rotation::rot_dims;
use serde::Serialize;
use turboquant_codec::rotation::SplitMix64;

/// Where the keys of one needle trial come from.
pub struct Pool<'a> {
    /// `n` keys of `dim` values, exact
    pub keys: &'a [f32],
    /// the same keys after each codec (same order as `codecs`), made with
    /// [`KMean::roundtrip`] of `k_mean` at positions from 0 (or [`roundtrip_rows`] without)
    pub keys_q: &'a [Vec<f32>],
    /// the pool's K mean (one head) when the turbo codecs remove it; `None`: no mean
    /// removal. Pool key `i` is at position `i` (a capture is one sequence from 0): in
    /// RoPE's frame each drawn key keeps its own `R_i mu`, which `keys_q` already holds
    pub k_mean: Option<KMean<'a>>,
    /// `n` values of `dim_v` values, exact and after each codec
    pub values: &'a [f32],
    pub values_q: &'a [Vec<f32>],
    pub dim: usize,
    pub dim_v: usize,
    pub rot_dim: usize,
}

/// Outcome of one trial for one codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrialResult {
    /// the top-1 position after quantizing the keys is the exact top-1 (the needle when
    /// `needle_weight >= 0.5`)
    pub top1_same: bool,
    /// cosine of softmax(q·K̂)·V̂ against softmax(q·K)·V
    pub out_cos: f64,
}

/// One needle trial (see `tq niah --help`): `len` haystack keys drawn uniformly with
/// replacement from the pool, the key at a uniformly random position `p` replaced by the
/// needle `k_p + α q / |q|²`, with `α` chosen so that the needle's exact attention weight is
/// `needle_weight` (at 0.5 or more the needle is the exact top-1); the needle's value stays
/// `v_p`. For each codec the keys (and values) are quantized and the top-1 position of
/// `q·k̂ * scale` compared with the exact one. With `pool.k_mean`, turbo codecs quantize
/// `k - m` (the needle too) and `k̂` is in the shifted frame (see [`roundtrip_keys`]), or, in
/// RoPE's frame, `k_i - R_i mu` with `R_i mu` added back (the needle at the position of the
/// pool key it replaces): the exact side is always attention over the unshifted keys.
pub fn needle_trial(
    pool: &Pool,
    codecs: &[Codec],
    q: &[f32],
    len: usize,
    needle_weight: f64,
    scale: f32,
    rng: &mut SplitMix64,
) -> Vec<TrialResult> {
    let n = pool.keys.len() / pool.dim;
    let d = pool.dim;
    let idx: Vec<usize> = (0..len).map(|_| (rng.next() % n as u64) as usize).collect();
    let p = (rng.next() % len as u64) as usize;
    // exact scores of the pool, then of the haystack
    let pool_s: Vec<f32> = pool
        .keys
        .chunks_exact(d)
        .map(|k| dot(q, k) * scale)
        .collect();
    let hay: Vec<f32> = idx.iter().map(|&i| pool_s[i]).collect();
    // logsumexp of every other position
    let m = hay
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != p)
        .map(|(_, &s)| s as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = hay
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != p)
        .map(|(_, &s)| (s as f64 - m).exp())
        .sum();
    let lse = m + z.ln();
    let target = lse + (needle_weight / (1.0 - needle_weight)).ln();
    let k_p = &pool.keys[idx[p] * d..(idx[p] + 1) * d];
    let qq = dot(q, q) as f64;
    let alpha = (target / scale as f64 - dot(q, k_p) as f64) / qq;
    let needle: Vec<f32> = k_p
        .iter()
        .zip(q)
        .map(|(&k, &qi)| k + (alpha * qi as f64) as f32)
        .collect();
    let v_p = &pool.values[idx[p] * pool.dim_v..(idx[p] + 1) * pool.dim_v];

    // exact output: the needle's weight plus the pool-aggregated haystack weights
    let (exact, top_exact) = {
        let mut s = hay.clone();
        s[p] = dot(q, &needle) * scale;
        (
            attention_out(&s, &idx, p, pool.values, pool.dim_v, v_p),
            argmax(&s),
        )
    };
    let mut res = Vec::with_capacity(codecs.len());
    for (ci, &c) in codecs.iter().enumerate() {
        let needle_q = match pool.k_mean {
            Some(km) => km.roundtrip(c, d, pool.rot_dim, &needle, idx[p]),
            None => roundtrip_rows(c, d, pool.rot_dim, &needle),
        };
        let kq = &pool.keys_q[ci];
        let pool_sq: Vec<f32> = kq.chunks_exact(d).map(|k| dot(q, k) * scale).collect();
        let mut s: Vec<f32> = idx.iter().map(|&i| pool_sq[i]).collect();
        s[p] = dot(q, &needle_q) * scale;
        let top = argmax(&s);
        let vq = &pool.values_q[ci];
        let v_pq = &vq[idx[p] * pool.dim_v..(idx[p] + 1) * pool.dim_v];
        let out = attention_out(&s, &idx, p, vq, pool.dim_v, v_pq);
        res.push(TrialResult {
            top1_same: top == top_exact,
            out_cos: cosine(&exact, &out),
        });
    }
    res
}

/// softmax(s) · V where position j holds pool value `idx[j]`, except position `p` (`v_p`).
fn attention_out(
    s: &[f32],
    idx: &[usize],
    p: usize,
    values: &[f32],
    dv: usize,
    v_p: &[f32],
) -> Vec<f32> {
    let mut w = s.to_vec();
    softmax(&mut w);
    let n = values.len() / dv;
    let mut per = vec![0f32; n];
    for (j, &i) in idx.iter().enumerate() {
        if j != p {
            per[i] += w[j];
        }
    }
    let mut out = vec![0f32; dv];
    weighted_sum(&per, values, dv, &mut out);
    for (o, &v) in out.iter_mut().zip(v_p) {
        *o += w[p] * v;
    }
    out
}

/// The parameters of the needle trials over a capture (`tq niah`'s options).
#[derive(Clone, Debug)]
pub struct NiahParams {
    /// sequence lengths (haystack sizes)
    pub lengths: Vec<usize>,
    /// trials per length and source (real, synthetic)
    pub trials: usize,
    /// the needle's exact attention weight, in (0, 1)
    pub needle_weight: f64,
    /// keys in each synthetic pool
    pub synthetic_pool: usize,
    pub seed: u64,
}

impl NiahParams {
    /// Why these parameters cannot run, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.lengths.is_empty() || self.lengths.iter().any(|&l| l < 2) || self.trials == 0 {
            return Err("--lengths must be at least 2 and --trials positive".into());
        }
        if !(self.needle_weight > 0.0 && self.needle_weight < 1.0) {
            return Err("--needle-weight must be in (0, 1)".into());
        }
        Ok(())
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct NiahCell {
    pub source: &'static str,
    pub length: usize,
    pub codec: &'static str,
    pub trials: usize,
    /// fraction of trials whose top-1 position is unchanged by quantizing the keys
    pub top1: f64,
    /// mean attention-output cosine
    pub out_cos: f64,
}

struct Unit {
    keys: Vec<f32>,
    values: Vec<f32>,
    /// (layer, KV head) for real units
    real: Option<(usize, usize)>,
}

/// The needle trials of `tq niah` (its help has the definition): real pools (one per
/// (layer, KV head) of the capture) and 8 synthetic Gaussian ones, one cell per source,
/// length and codec; `tick()` once per trial.
pub fn niah_cells(
    c: &Capture,
    o: &NiahParams,
    codecs: &[Codec],
    k_mean: &KMeanMode,
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<NiahCell>, String> {
    let h = &c.header;
    let (rk, rv) = rot_dims(h)?;
    o.check()?;
    let scale = 1.0 / (h.head_k as f32).sqrt();
    let n_units_real = h.n_layer * h.n_head_kv;
    let n_units_syn = 8usize;
    // trials[(source, unit)] -> list of (length index, trial seed)
    let mut rng = SplitMix64::new(o.seed);
    let mut plan: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_units_real + n_units_syn];
    for (li, _) in o.lengths.iter().enumerate() {
        for t in 0..o.trials {
            let u = (rng.next() % n_units_real as u64) as usize;
            plan[u].push((li, t));
            plan[n_units_real + t % n_units_syn].push((li, t));
        }
    }
    // (source, length, codec) -> (hits, cos sum, n)
    let nl = o.lengths.len();
    let mut acc = vec![(0usize, 0f64, 0usize); 2 * nl * codecs.len()];
    let group = h.n_head / h.n_head_kv;
    let work: Vec<usize> = (0..plan.len()).filter(|&u| !plan[u].is_empty()).collect();
    let per_unit = parallel_map(work.len(), |wi| {
        let u = work[wi];
        let unit = if u < n_units_real {
            let (l, kh) = (u / h.n_head_kv, u % h.n_head_kv);
            let gather = |rows: &[f32], d| one_head(rows, h.n_head_kv, kh, d);
            Unit {
                keys: gather(&c.k[l], h.head_k),
                values: gather(&c.v[l], h.head_v),
                real: Some((l, kh)),
            }
        } else {
            let mut g = SplitMix64::new(o.seed ^ 0xA5A5_0000 ^ u as u64);
            let mut gen =
                |n: usize| -> Vec<f32> { (0..n).map(|_| g.next_gaussian() as f32).collect() };
            Unit {
                keys: gen(o.synthetic_pool * h.head_k),
                values: gen(o.synthetic_pool * h.head_v),
                real: None,
            }
        };
        let m = match unit.real {
            Some((l, kh)) => layer_k_mean(c, l, k_mean).map(|m| m.head(kh, h.head_k)),
            // synthetic keys have no positions: the plain mean
            None => (k_mean.frame != Frame::Off).then(|| LayerMean {
                m: k_mean_of(&unit.keys, 1, h.head_k, K_MEAN_TOKENS),
                rope: None,
            }),
        };
        // per pool key (position i) its reconstruction, R_i mu included in RoPE's frame
        let keys_q: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&cd| LayerMean::roundtrip(&m, cd, h.head_k, rk, &unit.keys))
            .collect();
        let values_q: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&cd| roundtrip_rows(cd, h.head_v, rv, &unit.values))
            .collect();
        let pool = Pool {
            keys: &unit.keys,
            keys_q: &keys_q,
            values: &unit.values,
            values_q: &values_q,
            k_mean: m.as_ref().map(LayerMean::get),
            dim: h.head_k,
            dim_v: h.head_v,
            rot_dim: rk,
        };
        let src = usize::from(unit.real.is_none());
        let mut out = Vec::with_capacity(plan[u].len());
        for &(li, t) in &plan[u] {
            let mut trng =
                SplitMix64::new(o.seed ^ ((u as u64) << 40) ^ ((li as u64) << 32) ^ t as u64);
            let q: Vec<f32> = match unit.real {
                Some((l, kh)) => {
                    let tok = (trng.next() % h.n_tokens as u64) as usize;
                    let qh = kh * group + (trng.next() % group as u64) as usize;
                    c.query(l, tok, qh).to_vec()
                }
                None => (0..h.head_k).map(|_| trng.next_gaussian() as f32).collect(),
            };
            let r = needle_trial(
                &pool,
                codecs,
                &q,
                o.lengths[li],
                o.needle_weight,
                scale,
                &mut trng,
            );
            out.push((src, li, r));
            tick();
        }
        out
    });
    for (src, li, r) in per_unit.into_iter().flatten() {
        for (ci, tr) in r.iter().enumerate() {
            let cell = &mut acc[(src * nl + li) * codecs.len() + ci];
            cell.0 += usize::from(tr.top1_same);
            cell.1 += tr.out_cos;
            cell.2 += 1;
        }
    }
    let mut cells = Vec::new();
    for (src, name) in [(0, "real"), (1, "synthetic")] {
        for (li, &len) in o.lengths.iter().enumerate() {
            for (ci, cd) in codecs.iter().enumerate() {
                let (hits, cs, n) = acc[(src * nl + li) * codecs.len() + ci];
                cells.push(NiahCell {
                    source: name,
                    length: len,
                    codec: cd.name(),
                    trials: n,
                    top1: hits as f64 / n.max(1) as f64,
                    out_cos: cs / n.max(1) as f64,
                });
            }
        }
    }
    Ok(cells)
}
