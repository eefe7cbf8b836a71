//! `tq kmean-sim`: which K-side statistics hold at long context, by simulation on a capture
//! (what the removed scripts/kmean_long_sim.py and kbal_sim.py measured, on this crate's oracle
//! of tq-kmean.h / tq-kmean-rope.h).
//!
//! For every layer and KV head, keys are stored as `x = s ⊙ k - m` plus isotropic Gaussian
//! noise of relative energy `D` (what the codec's error looks like after the random
//! rotation), queries attend with `q ⊘ s`, and the score is the mean KL divergence between
//! exact and noisy causal attention rows of queries in the capture's second half. Any fixed
//! `m` and `s` leave attention exact, so only the noise differs between the variants:
//!
//! | variant | the K statistics |
//! |---|---|
//! | `none` | m = 0, s = 1 |
//! | `plain` | m = the mean of the first B keys (B = llama.cpp's first ubatch, 512) |
//! | `fitted` | m = F · that mean, tq-kmean.h's per-pair map for a cache of T positions |
//! | `oracle` | m = the mean of all T keys: the best fixed m, with hindsight |
//! | `rope-frame` | key p stores `k_p - R_p mu`, mu the mean of `R_p^-1 k_p` over the first B keys (tq-kmean-rope.h); `rope-frame:r` keeps only the r pairs a fixed vector follows worst in that frame, the fitted m on the others |
//! | `+bal` | llama.cpp's K/Q balancing `s` from the first B tokens, the keys weighted by the attention of the last 64 of those queries (tq-kmean.h's `tq_kbal_scale`); with `rope-frame`, the same formula on the residual `k_p - R_p mu` |
//! | `+ubal` | the same with every key weighted alike |
//! | `+bal-all` | balancing statistics from all T tokens (hindsight) |
//! | `/sinkN` | any of the above with the first N keys stored exactly (no noise), what tq-sink.h's exact first key buys with N = 1 |
//!
//! Not modelled: tq_kmean_stat_weights' leaving position 0 out of the statistics when the
//! first key is kept exact (the statistics here always count every token).
//!
//! Invariant: a variant's m, mu and s come from this crate's K mean oracle
//! ([`k_mean`], [`rope_fit_mean`], [`unrope_mean`], [`rope_mean_rows`]) and the balancing
//! formula of `tq_kbal_scale`; every variant of one (layer, KV head) sees the same keys and
//! queries, and its noise is drawn from a seed fixed by (seed, layer, head, variant), so a
//! figure does not depend on the thread count or on which other variants ran.

use crate::capture::{one_head, Capture};
use crate::kmean::{k_mean, rope_fit_mean};
use crate::kmean_mode::rope_frame_missing;
use crate::kmean_rope::{rope_mean_rows, rope_pair, unrope_mean, RopeFrame};
use crate::parallel::per_layer;
use serde::Serialize;
use turboquant_codec::rotation::SplitMix64;

/// tq-kmean.h's `TQ_KBAL_QUERIES`: the last queries of the first ubatch whose attention
/// weighs the keys of balancing.
pub const KBAL_QUERIES: usize = 64;
/// tq-kmean.h's `TQ_KBAL_MAX`: s is clamped to [1/64, 64].
pub const KBAL_MAX: f64 = 64.0;

/// The mean a variant removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    None,
    Plain,
    Fitted,
    Oracle,
    /// the mean in RoPE's frame on the `Some(r)` pairs it helps most (all: `None`)
    RopeFrame(Option<usize>),
}

/// Whether and how a variant balances K against Q.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balance {
    Off,
    /// keys weighted by the attention of the first ubatch's last 64 queries
    Attn,
    /// every key of the first ubatch weighted alike
    Uniform,
    /// attention weights and query energy from all T tokens
    AttnAll,
}

/// One simulated configuration, e.g. `rope-frame+bal/sink1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: String,
    pub base: Base,
    pub balance: Balance,
    /// the first `sink` keys stored exactly
    pub sink: usize,
}

impl Variant {
    /// `base[+bal|+ubal|+bal-all][/sinkN]`, base one of none, plain, fitted, oracle,
    /// rope-frame, rope-frame:r.
    pub fn parse(s: &str) -> Result<Variant, String> {
        let bad = |why: &str| {
            format!(
                "variant `{s}`: {why} (base[+bal|+ubal|+bal-all][/sinkN], base one of none, plain, fitted, oracle, rope-frame, rope-frame:R)"
            )
        };
        let (spec, sink) = match s.split_once('/') {
            Some((spec, sink)) => {
                let n = sink
                    .strip_prefix("sink")
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| bad("the part after / must be sinkN"))?;
                (spec, n)
            }
            None => (s, 0),
        };
        let (base, bal) = match spec.split_once('+') {
            Some((b, bal)) => (b, Some(bal)),
            None => (spec, None),
        };
        let base = match base {
            "none" => Base::None,
            "plain" => Base::Plain,
            "fitted" => Base::Fitted,
            "oracle" => Base::Oracle,
            "rope-frame" => Base::RopeFrame(None),
            b => match b.strip_prefix("rope-frame:").map(str::parse::<usize>) {
                Some(Ok(r)) => Base::RopeFrame(Some(r)),
                _ => return Err(bad("unknown base")),
            },
        };
        let balance = match bal {
            None => Balance::Off,
            Some("bal") => Balance::Attn,
            Some("ubal") => Balance::Uniform,
            Some("bal-all") => Balance::AttnAll,
            Some(_) => return Err(bad("unknown balancing")),
        };
        Ok(Variant {
            name: s.to_string(),
            base,
            balance,
            sink,
        })
    }

    /// A comma-separated list of variants.
    pub fn parse_list(s: &str) -> Result<Vec<Variant>, String> {
        s.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(Variant::parse)
            .collect()
    }
}

/// The default variants (those of the journal's long-context table).
pub const DEFAULT_VARIANTS: &str = "none,plain,fitted,oracle,rope-frame,fitted+bal,fitted+bal-all";

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimParams {
    /// use the first `tokens` tokens (0: all)
    pub tokens: usize,
    /// the codec's relative error energy D (turbo4 0.0081, turbo3 0.0307, turbo2 0.111)
    pub distortion: f64,
    /// tokens of the first ubatch (B)
    pub first: usize,
    /// every `stride`-th query position of the second half is scored
    pub stride: usize,
    /// the layers to simulate (empty: all)
    pub layers: Vec<usize>,
    pub seed: u64,
    pub variants: Vec<Variant>,
}

/// One layer's mean attention KL per variant (same order as `SimParams::variants`), the
/// mean over its KV heads.
#[derive(Serialize, Clone, Debug)]
pub struct SimLayer {
    pub layer: usize,
    pub kl: Vec<f64>,
}

/// The keys and queries of one (layer, KV head), the first T tokens: `k` `[T][d]`, `q[j]`
/// `[T][d]` for the g query heads of the group.
struct Head<'a> {
    k: Vec<f32>,
    q: Vec<Vec<f32>>,
    d: usize,
    t: usize,
    rope: RopeFrame<'a>,
}

impl Head<'_> {
    fn key(&self, j: usize) -> &[f32] {
        &self.k[j * self.d..(j + 1) * self.d]
    }

    /// The channels of RoPE pair i, for the pairs the layer has.
    fn pairs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.rope.w.len().min(self.d / 2)).map(|i| rope_pair(self.rope.neox, self.d, i))
    }

    /// `x` with both channels of each RoPE pair set to their mean.
    fn tie(&self, x: &mut [f64]) {
        for (a, b) in self.pairs() {
            let m = 0.5 * (x[a] + x[b]);
            x[a] = m;
            x[b] = m;
        }
    }

    /// tq-kmean.h's fitted map `F` from a mean over positions `0..b` to a cache of T.
    fn fit(&self, m: &[f64], b: usize) -> Vec<f64> {
        let mut y: Vec<f32> = m.iter().map(|&v| v as f32).collect();
        rope_fit_mean(&mut y, self.d, self.rope.w, self.rope.neox, b, self.t);
        y.into_iter().map(f64::from).collect()
    }

    /// The attention each of the first `n` keys gets from the last min(n, 64) of those
    /// queries (causal, 1/sqrt(d)), averaged over them and the group's query heads.
    fn attn_weights(&self, n: usize) -> Vec<f64> {
        let nql = n.min(KBAL_QUERIES);
        let g = self.q.len();
        let scale = 1.0 / (self.d as f64).sqrt();
        let mut wt = vec![0f64; n];
        let mut row = vec![0f64; n];
        for q in &self.q {
            for i in 0..nql {
                let t = n - nql + i;
                let qt = &q[t * self.d..(t + 1) * self.d];
                let len = t + 1;
                for (j, r) in row[..len].iter_mut().enumerate() {
                    *r = dot64(qt, self.key(j)) * scale;
                }
                let mx = row[..len].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut z = 0.0;
                for r in row[..len].iter_mut() {
                    *r = (*r - mx).exp();
                    z += *r;
                }
                for (w, r) in wt.iter_mut().zip(&row[..len]) {
                    *w += r / z / (nql * g) as f64;
                }
            }
        }
        wt
    }

    /// The key weights of balancing over the first `n` keys.
    fn bal_weights(&self, bal: Balance, n: usize) -> Vec<f64> {
        match bal {
            Balance::Uniform => vec![1.0 / n as f64; n],
            _ => self.attn_weights(n),
        }
    }

    /// `s` from the key energy `rk` (per channel) and the query energy of the first `n`
    /// tokens: tq_kbal_scale's `(rq / rk)^(1/4)`, pairs tied, normalised so that the
    /// weighted `|s x|²` keeps its energy, clamped to [1/64, 64].
    fn scale_from(&self, mut rk: Vec<f64>, n: usize) -> Vec<f64> {
        let d = self.d;
        self.tie(&mut rk);
        rk.iter_mut().for_each(|v| *v = v.max(1e-20));
        let mut rq = vec![0f64; d];
        for q in &self.q {
            for t in 0..n {
                for (r, &x) in rq.iter_mut().zip(&q[t * d..(t + 1) * d]) {
                    *r += (x as f64) * (x as f64);
                }
            }
        }
        let cnt = (n * self.q.len()) as f64;
        rq.iter_mut().for_each(|v| *v /= cnt);
        self.tie(&mut rq);
        rq.iter_mut().for_each(|v| *v = v.max(1e-20));
        let mut s: Vec<f64> = rq
            .iter()
            .zip(&rk)
            .map(|(q, k)| (q / k).clamp(1e-12, 1e12).powf(0.25))
            .collect();
        let e0: f64 = rk.iter().sum();
        let e1: f64 = s.iter().zip(&rk).map(|(s, k)| s * s * k).sum();
        let f = (e0 / e1).sqrt();
        s.iter_mut()
            .for_each(|v| *v = (*v * f).clamp(1.0 / KBAL_MAX, KBAL_MAX));
        s
    }

    /// Balancing for a fixed mean `m` from the first `n` tokens: the key energy left after
    /// m at the cache's T positions, `Σ w_j k_j² - 2 m (F kbar_w) + m²`.
    fn balance_fixed(&self, m: &[f64], bal: Balance, n: usize) -> Vec<f64> {
        let d = self.d;
        let wt = self.bal_weights(bal, n);
        let (mut e2, mut kw) = (vec![0f64; d], vec![0f64; d]);
        for (j, &w) in wt.iter().enumerate() {
            for ((e, k), &x) in e2.iter_mut().zip(kw.iter_mut()).zip(self.key(j)) {
                let x = x as f64;
                *e += w * x * x;
                *k += w * x;
            }
        }
        let fkw = self.fit(&kw, n);
        let rk = (0..d)
            .map(|c| e2[c] - 2.0 * m[c] * fkw[c] + m[c] * m[c])
            .collect();
        self.scale_from(rk, n)
    }

    /// The stored vectors `x` `[T][d]` and the scale `s` of variant `v`.
    fn stored(&self, v: &Variant, first: usize) -> (Vec<f64>, Vec<f64>) {
        let (d, t) = (self.d, self.t);
        let b = first.min(t);
        // the first-ubatch mean as llama.cpp takes it (none under K_MEAN_MIN_TOKENS)
        let kbar: Vec<f64> = k_mean(&self.k, 1, d, b)
            .into_iter()
            .map(f64::from)
            .collect();
        let n_bal = if v.balance == Balance::AttnAll { t } else { b };
        match v.base {
            Base::RopeFrame(r) => {
                let mu = unrope_mean(&self.k, 1, d, self.rope, b);
                let npair = self.rope.w.len().min(d / 2);
                // the r pairs a fixed vector follows worst: mu's energy on the pair times the
                // part of it RoPE spins away over the cache's T positions
                let mut order: Vec<usize> = (0..npair).collect();
                let score = |i: usize| {
                    let (a, c) = rope_pair(self.rope.neox, d, i);
                    let (mr, mi) = mean_exp(self.rope.w[i], t);
                    let spin = 1.0 - (mr * mr + mi * mi);
                    ((mu[a] as f64).powi(2) + (mu[c] as f64).powi(2)) * spin
                };
                order.sort_by(|&x, &y| score(y).total_cmp(&score(x)));
                let keep = r.unwrap_or(npair).min(npair);
                let mut mu_s = vec![0f32; d];
                let mut m = self.fit(&kbar, b);
                for &i in &order[..keep] {
                    let (a, c) = rope_pair(self.rope.neox, d, i);
                    (mu_s[a], mu_s[c]) = (mu[a], mu[c]);
                    (m[a], m[c]) = (0.0, 0.0);
                }
                let rm = rope_mean_rows(&mu_s, d, self.rope, 0, t);
                let mut x: Vec<f64> = (0..t * d)
                    .map(|i| self.k[i] as f64 - rm[i] as f64 - m[i % d])
                    .collect();
                let mut s = vec![1f64; d];
                if v.balance != Balance::Off {
                    // the formula on the residual: per pair its energy does not depend on
                    // the position, so the first n tokens estimate it for all T
                    let wt = self.bal_weights(v.balance, n_bal);
                    let mut rk = vec![0f64; d];
                    for (j, &w) in wt.iter().enumerate() {
                        for (e, &xv) in rk.iter_mut().zip(&x[j * d..(j + 1) * d]) {
                            *e += w * xv * xv;
                        }
                    }
                    s = self.scale_from(rk, n_bal);
                    for row in x.chunks_exact_mut(d) {
                        row.iter_mut().zip(&s).for_each(|(v, s)| *v *= s);
                    }
                }
                (x, s)
            }
            base => {
                let m: Vec<f64> = match base {
                    Base::None => vec![0.0; d],
                    Base::Plain => kbar,
                    Base::Fitted => self.fit(&kbar, b),
                    _ => mean_rows(&self.k, d),
                };
                let s = if v.balance == Balance::Off {
                    vec![1f64; d]
                } else {
                    self.balance_fixed(&m, v.balance, n_bal)
                };
                let x = (0..t * d)
                    .map(|i| s[i % d] * (self.k[i] as f64 - m[i % d]))
                    .collect();
                (x, s)
            }
        }
    }

    /// Mean KL(exact || noisy) of the causal attention rows of every `stride`-th query of
    /// the second half, each query head of the group; logits q·k against q·(k + noise).
    fn attn_kl(&self, noise: &[f64], stride: usize) -> f64 {
        let d = self.d;
        let scale = 1.0 / (d as f64).sqrt();
        let (mut sum, mut n) = (0.0, 0usize);
        let mut l0 = vec![0f64; self.t];
        let mut l1 = vec![0f64; self.t];
        for t in (self.t / 2..self.t).step_by(stride.max(1)) {
            for q in &self.q {
                let qq: Vec<f64> = q[t * d..(t + 1) * d]
                    .iter()
                    .map(|&x| x as f64 * scale)
                    .collect();
                for j in 0..=t {
                    let e: f64 = qq
                        .iter()
                        .zip(&noise[j * d..(j + 1) * d])
                        .map(|(a, b)| a * b)
                        .sum();
                    l0[j] = qq.iter().zip(self.key(j)).map(|(a, &b)| a * b as f64).sum();
                    l1[j] = l0[j] + e;
                }
                let lse = |l: &[f64]| {
                    let mx = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    mx + l.iter().map(|v| (v - mx).exp()).sum::<f64>().ln()
                };
                let (z0, z1) = (lse(&l0[..=t]), lse(&l1[..=t]));
                sum += (0..=t)
                    .map(|j| {
                        let lp = l0[j] - z0;
                        lp.exp() * (lp - (l1[j] - z1))
                    })
                    .sum::<f64>();
                n += 1;
            }
        }
        sum / n.max(1) as f64
    }
}

fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Mean of `[n][d]` rows, per channel.
fn mean_rows(rows: &[f32], d: usize) -> Vec<f64> {
    let n = (rows.len() / d).max(1) as f64;
    let mut m = vec![0f64; d];
    for r in rows.chunks_exact(d) {
        m.iter_mut().zip(r).for_each(|(a, &x)| *a += x as f64);
    }
    m.iter_mut().for_each(|a| *a /= n);
    m
}

/// The mean of `e^{ipw}` over `p < n`.
fn mean_exp(w: f64, n: usize) -> (f64, f64) {
    let (mut r, mut i) = (0.0, 0.0);
    for p in 0..n {
        r += (p as f64 * w).cos();
        i += (p as f64 * w).sin();
    }
    (r / n as f64, i / n as f64)
}

/// Runs the simulation: one row per simulated layer, `tick()` once per layer.
pub fn simulate(
    c: &Capture,
    o: &SimParams,
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<SimLayer>, String> {
    let h = &c.header;
    let rope = h
        .rope
        .as_ref()
        .ok_or("this capture has no RoPE frequencies: make it again with this tree's tq capture")?;
    if o.variants.is_empty() || o.distortion <= 0.0 || o.first == 0 {
        return Err("need variants, --distortion > 0 and --first > 0".into());
    }
    if o.variants
        .iter()
        .any(|v| matches!(v.base, Base::RopeFrame(_)))
    {
        if let Some(why) = rope_frame_missing(h) {
            return Err(format!("rope-frame variants need full RoPE: {why}"));
        }
    }
    let t = if o.tokens > 0 {
        o.tokens.min(h.n_tokens)
    } else {
        h.n_tokens
    };
    if t < 4 {
        return Err("the simulation needs at least 4 tokens".into());
    }
    let layers: Vec<usize> = if o.layers.is_empty() {
        (0..h.n_layer).collect()
    } else {
        o.layers.clone()
    };
    if let Some(&l) = layers.iter().find(|&&l| l >= h.n_layer) {
        return Err(format!("layer {l}: the capture has {} layers", h.n_layer));
    }
    let (d, g) = (h.head_k, h.n_head / h.n_head_kv);
    Ok(per_layer(layers.len(), tick, |li| {
        let l = layers[li];
        let rf = RopeFrame {
            w: rope.freqs.get(l).map_or(&[][..], |f| &f[..]),
            neox: rope.neox,
        };
        let mut kl = vec![0f64; o.variants.len()];
        for hk in 0..h.n_head_kv {
            let head = Head {
                k: one_head(&c.k[l], h.n_head_kv, hk, d)[..t * d].to_vec(),
                q: (0..g)
                    .map(|j| one_head(&c.q[l], h.n_head, hk * g + j, d)[..t * d].to_vec())
                    .collect(),
                d,
                t,
                rope: rf,
            };
            for (vi, v) in o.variants.iter().enumerate() {
                let (x, s) = head.stored(v, o.first);
                let mut rng = SplitMix64::new(
                    o.seed ^ ((l as u64) << 48) ^ ((hk as u64) << 32) ^ ((vi as u64) << 16),
                );
                let mut noise = vec![0f64; t * d];
                for (j, (nr, xr)) in noise.chunks_exact_mut(d).zip(x.chunks_exact(d)).enumerate() {
                    let e: f64 = xr.iter().map(|v| v * v).sum();
                    let sd = (o.distortion * e / d as f64).sqrt();
                    for (nv, sc) in nr.iter_mut().zip(&s) {
                        // noise on the stored vector, seen by the query q / s
                        let z = rng.next_gaussian();
                        *nv = if j < v.sink { 0.0 } else { z * sd / sc };
                    }
                }
                kl[vi] += head.attn_kl(&noise, o.stride) / h.n_head_kv as f64;
            }
        }
        SimLayer { layer: l, kl }
    }))
}

/// The mean over layers per variant.
pub fn mean_kl(rows: &[SimLayer], n_variants: usize) -> Vec<f64> {
    (0..n_variants)
        .map(|v| rows.iter().map(|r| r.kl[v]).sum::<f64>() / rows.len().max(1) as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    /// KBAL_MAX mirrors the C define the llama graph clamps with; they must agree.
    #[test]
    fn kbal_max_is_the_llama_graph_define() {
        let h = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../ggml-ext/llama/tq-kmean.h"),
        )
        .unwrap();
        let v: f64 = h
            .lines()
            .find_map(|l| l.strip_prefix("#define TQ_KBAL_MAX "))
            .expect("TQ_KBAL_MAX in tq-kmean.h")
            .trim()
            .trim_end_matches('f')
            .parse()
            .unwrap();
        assert_eq!(v, KBAL_MAX);
    }

    use super::*;

    #[test]
    fn variants_parse_and_refuse() {
        let v = Variant::parse("rope-frame:4+bal-all/sink1").unwrap();
        assert_eq!(v.base, Base::RopeFrame(Some(4)));
        assert_eq!(v.balance, Balance::AttnAll);
        assert_eq!(v.sink, 1);
        assert_eq!(Variant::parse_list(DEFAULT_VARIANTS).unwrap().len(), 7);
        for bad in ["mean", "fitted+bal2", "plain/sink", "rope-frame:x"] {
            assert!(Variant::parse(bad).is_err(), "{bad}");
        }
    }
}
