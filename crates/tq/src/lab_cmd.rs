//! The lab subcommands on a capture file (`tq capture`): rotation-stats, kv-norms,
//! distortion, niah, recommend, kmean-sim. Argument parsing and printing only: each prints a
//! table, or JSON with `--json`, and draws a PNG with `--plot`; every computation is in
//! `turboquant_lab`'s modules.

use crate::lab_plot::{self, Series};
use crate::progress::progress;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use turboquant_lab::kmean_mode::{Frame, KMeanMode};
use turboquant_lab::needle::{niah_cells, NiahParams};
use turboquant_lab::norms::{self, NormRow, OUTLIER_FACTOR};
use turboquant_lab::recommend::pair_rows;
use turboquant_lab::rotation_stats::{RotRow, Stat};
use turboquant_lab::{self as lab, distortion, Capture, Codec};

/// Output options shared by every lab subcommand.
#[derive(Args, Clone)]
pub struct Out {
    /// capture file written by `tq capture`
    pub capture: PathBuf,
    /// print JSON instead of the table
    #[arg(long)]
    pub json: bool,
    /// also draw a PNG chart (needs the DejaVu Sans font, Debian fonts-dejavu-core)
    #[arg(long, value_name = "OUT.png")]
    pub plot: Option<PathBuf>,
}

fn load(o: &Out) -> Result<Capture, String> {
    let h = Capture::read_header(&o.capture).map_err(|e| e.to_string())?;
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!(
        "reading {} ({} layers x {} tokens)",
        o.capture.display(),
        h.n_layer,
        h.n_tokens
    ));
    pb.enable_steady_tick(Duration::from_millis(200));
    let c = Capture::read(&o.capture).map_err(|e| e.to_string());
    pb.finish_and_clear();
    c
}

fn emit<T: Serialize>(o: &Out, value: &T, table: impl FnOnce()) {
    if o.json {
        println!("{}", serde_json::to_string_pretty(value).unwrap());
    } else {
        table();
    }
}

fn plot_or_warn(o: &Out, draw: impl FnOnce(&Path) -> Result<(), String>) -> Result<(), String> {
    if let Some(p) = &o.plot {
        draw(p)?;
        if !o.json {
            println!("plot: {}", p.display());
        }
    }
    Ok(())
}

fn header_line(c: &Capture) -> String {
    let h = &c.header;
    format!(
        "{} ({}), {} tokens, {} layers, {} heads / {} KV heads, head {}/{}",
        h.model, h.desc, h.n_tokens, h.n_layer, h.n_head, h.n_head_kv, h.head_k, h.head_v
    )
}

// ---------------------------------------------------------------------------------------
// rotation-stats

pub fn rotation_stats(o: Out) -> Result<(), String> {
    let c = load(&o)?;
    let h = c.header.clone();
    let pb = progress(h.n_layer as u64, "layers");
    let (rows, all) = lab::rotation_stats::rotation_stats(&c, &|| pb.inc(1))?;
    pb.finish_and_clear();
    let theory_std_k = 1.0 / (h.head_k as f64).sqrt();
    let theory_std_v = 1.0 / (h.head_v as f64).sqrt();
    let json = serde_json::json!({
        "capture": o.capture, "model": h.model, "head_k": h.head_k, "head_v": h.head_v,
        "rotation": "seeded randomized Hadamard R = D H D / sqrt(n) (TQ_DEFAULT_SEED), K: n = largest power of 2 dividing head_k, V: n = 64",
        "theory": {"kurtosis_gaussian": 3.0, "kurtosis_sphere_k": lab::sphere_kurtosis(h.head_k),
                   "std_k": theory_std_k, "std_v": theory_std_v},
        "all_layers": {"k_before": all[0], "k_after": all[1],
                       "v_before": all[2], "v_after": all[3]},
        "layers": rows,
    });
    emit(&o, &json, || {
        println!("{}", header_line(&c));
        println!(
            "coordinates of unit-normalized head vectors, before / after the seeded rotation; \
             theory after: std 1/sqrt(d) = {theory_std_k:.4} (K), {theory_std_v:.4} (V), \
             kurtosis 3 (Gaussian limit; {:.3} exactly for a uniform point on S^{})",
            lab::sphere_kurtosis(h.head_k),
            h.head_k - 1
        );
        println!("| layer | K std before | K std after | K kurt before | K kurt after | V std before | V std after | V kurt before | V kurt after | K mean energy | V mean energy |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        let line = |name: String, s: [Stat; 4], e: (f64, f64)| {
            println!(
                "| {name} | {:.4} | {:.4} | {:.2} | {:.3} | {:.4} | {:.4} | {:.2} | {:.3} | {:.2} | {:.2} |",
                s[0].std, s[1].std, s[0].kurtosis, s[1].kurtosis, s[2].std, s[3].std,
                s[2].kurtosis, s[3].kurtosis, e.0, e.1
            )
        };
        for r in &rows {
            line(
                r.layer.to_string(),
                [r.k_before, r.k_after, r.v_before, r.v_after],
                (r.k_mean_energy, r.v_mean_energy),
            );
        }
        let n = rows.len() as f64;
        line(
            "all".into(),
            all,
            (
                rows.iter().map(|r| r.k_mean_energy).sum::<f64>() / n,
                rows.iter().map(|r| r.v_mean_energy).sum::<f64>() / n,
            ),
        );
        println!("(mean energy: |mean of a head's unit-normalized vectors|², the share of a fixed per-head offset; a large offset makes the rotated coordinates a mixture of shifted laws, kurtosis below 3)");
    });
    plot_or_warn(&o, |p| {
        let pts = |f: &dyn Fn(&RotRow) -> f64| -> Vec<(f64, f64)> {
            rows.iter().map(|r| (r.layer as f64, f(r))).collect()
        };
        lab_plot::lines(
            p,
            &format!(
                "{}: kurtosis per layer, before/after rotation",
                stem(&h.model)
            ),
            "layer",
            "kurtosis (log)",
            true,
            &[
                Series::line("K before", pts(&|r| r.k_before.kurtosis), 0, false),
                Series::line("K after", pts(&|r| r.k_after.kurtosis), 0, true),
                Series::line("V before", pts(&|r| r.v_before.kurtosis), 1, false),
                Series::line("V after", pts(&|r| r.v_after.kurtosis), 1, true),
            ],
            &[("Gaussian: 3".into(), 3.0)],
        )
    })
}

fn stem(model: &str) -> String {
    Path::new(model)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.to_string())
}

// ---------------------------------------------------------------------------------------
// kv-norms

pub fn kv_norms(o: Out) -> Result<(), String> {
    let c = load(&o)?;
    let h = &c.header;
    let rows = norms::norm_rows(&c);
    let med = norms::median_ratio(&rows);
    let outliers: Vec<usize> = rows.iter().filter(|r| r.outlier).map(|r| r.layer).collect();
    let json = serde_json::json!({
        "capture": o.capture, "model": h.model, "median_ratio": med,
        "outlier_rule": format!("mean K/V norm ratio > {OUTLIER_FACTOR} x or < 1/{OUTLIER_FACTOR} x the median over layers"),
        "outlier_layers": outliers, "layers": rows,
    });
    emit(&o, &json, || {
        println!("{}", header_line(&c));
        println!("L2 norms of every head vector (all tokens, all KV heads)");
        println!("| layer | K mean | K p99 | V mean | V p99 | K/V mean | K/V p99 | |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {:.2} | {:.2} | {:.3} | {:.3} | {:.1} | {:.1} | {} |",
                r.layer,
                r.k_mean,
                r.k_p99,
                r.v_mean,
                r.v_p99,
                r.ratio_mean,
                r.ratio_p99,
                if r.outlier { "outlier" } else { "" }
            );
        }
        println!(
            "median K/V ratio {med:.1}; outlier layers (ratio > {OUTLIER_FACTOR}x or < 1/{OUTLIER_FACTOR} of the median): {outliers:?}"
        );
    });
    plot_or_warn(&o, |p| {
        let pts = |f: &dyn Fn(&NormRow) -> f64| -> Vec<(f64, f64)> {
            rows.iter().map(|r| (r.layer as f64, f(r))).collect()
        };
        lab_plot::lines(
            p,
            &format!("{}: K and V norms per layer", stem(&h.model)),
            "layer",
            "L2 norm per head vector (log)",
            true,
            &[
                Series::line("K mean", pts(&|r| r.k_mean), 0, true),
                Series::line("K p99", pts(&|r| r.k_p99), 0, false),
                Series::line("V mean", pts(&|r| r.v_mean), 1, true),
                Series::line("V p99", pts(&|r| r.v_p99), 1, false),
                Series::line("K/V mean ratio", pts(&|r| r.ratio_mean), 3, true),
            ],
            &[],
        )
    })
}

// ---------------------------------------------------------------------------------------
// K mean removal (distortion, niah, recommend)

/// The K mean switch of distortion, niah and recommend.
#[derive(Args, Clone)]
pub struct KMeanOpt {
    /// no K mean removal: turbo K caches store k itself (llama.cpp with --tq-k-mean off, and
    /// this lab before llama.cpp removed the K mean). Default, as llama.cpp does: a turbo K
    /// cache takes a mean out of every key (see --k-mean-frame), fitted per layer and KV head
    /// on the first min(512, n) captured keys (the first ubatch llama.cpp writes into an
    /// empty cache at its default -ub 512; no mean when that is under 32 tokens); q8_0/q4_0/f16
    /// K and all V are unchanged. Exact attention is unchanged (softmax ignores a shift
    /// common to a query's logits; in RoPE's frame the term is added back per key); only the
    /// quantization error moves
    #[arg(long)]
    pub no_k_mean: bool,
    /// the K mean's frame. rope (default; llama.cpp's where the model runs on the CPU,
    /// tq-kmean-rope.h): mu = the mean of R_p^-1 k_p over those keys (p = token index), key p
    /// stores k_p - R_p mu and its logit gets q·R_p mu back. fitted (llama.cpp with the model
    /// on a GPU or RPC device, or TQ_K_MEAN_FRAME=fitted): one fixed m, their mean mapped by
    /// the RoPE fit to the capture's positions (tq-kmean.h). A capture without RoPE frequencies, or with a
    /// layer without full RoPE, cannot model rope: it falls back to fitted (or the plain
    /// mean) and says so
    #[arg(long, value_enum, default_value_t = KMeanFrame::Rope)]
    pub k_mean_frame: KMeanFrame,
}

/// `--k-mean-frame`: which of llama.cpp's two K mean frames to model.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KMeanFrame {
    Rope,
    Fitted,
}

impl KMeanOpt {
    pub fn on(&self) -> bool {
        !self.no_k_mean
    }

    /// The mode for the capture of header `h`; a RoPE frame that cannot be modelled falls
    /// back to the fixed mean, with a line on stderr (the JSON says it too).
    pub fn mode(&self, h: &lab::CaptureHeader) -> KMeanMode {
        let asked = match self.k_mean_frame {
            KMeanFrame::Rope => lab::kmean_mode::KMeanFrame::Rope,
            KMeanFrame::Fitted => lab::kmean_mode::KMeanFrame::Fitted,
        };
        let mode = KMeanMode::new(self.on(), asked, h);
        if let Some(line) = mode.fallback_message() {
            eprintln!("tq: {line}");
        }
        mode
    }
}

// ---------------------------------------------------------------------------------------
// distortion

#[derive(Args, Clone)]
pub struct DistortionOpts {
    #[command(flatten)]
    pub out: Out,
    /// comma-separated cache types
    #[arg(long, default_value = "turbo4,turbo3,turbo2,q8_0,q4_0")]
    pub types: String,
    #[command(flatten)]
    pub k_mean: KMeanOpt,
}

pub fn distortion(o: DistortionOpts) -> Result<(), String> {
    let codecs = Codec::parse_list(&o.types)?;
    let c = load(&o.out)?;
    let mode = o.k_mean.mode(&c.header);
    let km = mode.frame != Frame::Off;
    let pb = progress(c.header.n_layer as u64, "layers");
    let rows = distortion::distortion_rows(&c, &codecs, &mode, &|| pb.inc(1))?;
    pb.finish_and_clear();
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model,
        "method": "each head vector through the cache type as llama.cpp applies it: turbo after the seeded rotation, q8_0/q4_0 (Rust re-implementation of ggml's quantize_row_q*_0_ref, fp16 scale) after upstream's plain Hadamard rotation; K rotation size = largest power of 2 dividing head_k, V: 64. Means over all tokens, heads and layers; cos_p1 = worst layer's 1st percentile. k: k vs its reconstruction, no mean removal; k_with_k_mean (turbo, K mean removal on): k - m vs dequant(quant(k - m)); k_centred_without_k_mean: k - m vs k^ - m, the cache storing k, i.e. the error of the no-removal cache in the quantity attention sees",
        "k_mean": mode.json(&c.header),
        "types": rows,
    });
    emit(&o.out, &json, || {
        println!("{}", header_line(&c));
        println!("relative MSE |x-x̂|²/|x|² and cosine per head vector, mean over all layers; Lloyd-Max = optimum of the b-bit codebook per unit vector (cos = sqrt(1-D)), bound = 4^-b");
        let th = |d: Option<f64>| {
            d.map(|d| format!("{d:.4} ({:.4})", (1.0 - d).sqrt()))
                .unwrap_or_else(|| "-".into())
        };
        if km {
            println!(
                "K, no mean removal: k vs k̂. K-m, with K mean removal (turbo; what llama.cpp stores): k-m vs dequant(quant(k-m)), m from the first min({}, n) keys per (layer, KV head), {} (in RoPE's frame m is R_p mu at key p). K-m, no removal: k-m vs k̂-m (the same quantity, the cache storing k)",
                lab::K_MEAN_TOKENS,
                mode.words()
            );
            println!("| type | bits/value | K rel MSE, no mean removal | K cos, no mean removal | K cos p1, no mean removal | K-m rel MSE, with K mean removal | K-m cos, with K mean removal | K-m cos p1, with K mean removal | K-m rel MSE, no removal | K-m cos, no removal | V rel MSE | V cos | V cos p1 | Lloyd-Max D (cos) | bound 4^-b (cos) |");
            println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        } else {
            println!("| type | bits/value | K rel MSE | K cos | K cos p1 | V rel MSE | V cos | V cos p1 | Lloyd-Max D (cos) | bound 4^-b (cos) |");
            println!("|---|---|---|---|---|---|---|---|---|---|");
        }
        for r in &rows {
            let with = if km {
                let w = r
                    .k_with_k_mean
                    .map(|d| format!("{:.5} | {:.4} | {:.4}", d.rel_mse, d.cos, d.cos_p1))
                    .unwrap_or_else(|| "- | - | -".into());
                let cn = r
                    .k_centred_without_k_mean
                    .map(|d| format!("{:.5} | {:.4}", d.rel_mse, d.cos))
                    .unwrap_or_else(|| "- | -".into());
                format!(" {w} | {cn} |")
            } else {
                String::new()
            };
            println!(
                "| {} | {:.2} | {:.5} | {:.4} | {:.4} |{with} {:.5} | {:.4} | {:.4} | {} | {} |",
                r.codec,
                r.bits_per_value,
                r.k.rel_mse,
                r.k.cos,
                r.k.cos_p1,
                r.v.rel_mse,
                r.v.cos,
                r.v.cos_p1,
                th(r.lloyd_max),
                th(r.lower_bound)
            );
        }
    });
    plot_or_warn(&o.out, |p| {
        let k_label = if km {
            "K, no mean removal"
        } else {
            "K (measured)"
        };
        let mut series = vec![
            Series::points(
                k_label,
                rows.iter()
                    .map(|r| (r.bits_per_value, r.k.rel_mse))
                    .collect(),
                0,
            )
            .labelled(rows.iter().map(|r| r.codec.to_string()).collect()),
            Series::points(
                "V (measured)",
                rows.iter()
                    .map(|r| (r.bits_per_value, r.v.rel_mse))
                    .collect(),
                1,
            ),
        ];
        if km {
            series.push(Series::points(
                "K-m with K mean removal (turbo)",
                rows.iter()
                    .filter_map(|r| r.k_with_k_mean.map(|d| (r.bits_per_value, d.rel_mse)))
                    .collect(),
                3,
            ));
            series.push(Series::points(
                "K-m, cache storing k (no removal)",
                rows.iter()
                    .filter_map(|r| {
                        r.k_centred_without_k_mean
                            .map(|d| (r.bits_per_value, d.rel_mse))
                    })
                    .collect(),
                4,
            ));
        }
        // theory at the turbo types' bits/value
        let bits = [2u32, 3, 4];
        let at = |b: u32| b as f64 + 0.25;
        series.push(Series::line(
            "Lloyd-Max optimum (b-bit codebook)",
            bits.iter()
                .map(|&b| (at(b), lab::lloyd_max_distortion(b)))
                .collect(),
            2,
            true,
        ));
        series.push(Series::line(
            "lower bound 4^-b",
            bits.iter().map(|&b| (at(b), lab::lower_bound(b))).collect(),
            7,
            false,
        ));
        lab_plot::lines(
            p,
            &format!("{}: relative MSE by bits/value", stem(&c.header.model)),
            "bits per value",
            "relative MSE (log)",
            true,
            &series,
            &[],
        )
    })
}

// ---------------------------------------------------------------------------------------
// niah

/// The needle proxy, on keys from the capture and on synthetic Gaussian keys.
///
/// One trial, for a sequence length L: pick a source (a (layer, KV head) of the capture,
/// or a synthetic Gaussian pool), a query q (a captured query of that layer, from a query
/// head of that KV head's group, at a uniform random token; synthetic: q ~ N(0, I)) and L
/// haystack keys drawn uniformly with replacement from the source's pool of keys (all
/// captured tokens of that head, post-RoPE; synthetic: --synthetic-pool keys ~ N(0, I)). The
/// key at a uniform random position p is replaced by the needle k_p + α q/|q|², α chosen so
/// that the needle's exact attention weight softmax(q·k/sqrt(d))_p is --needle-weight (0.5:
/// the needle's logit equals the logsumexp of all other logits, so it is the exact top-1).
/// Its value is v_p. Every key and value is then passed through the cache type (rotation
/// included) and the metric is whether argmax_j q·k̂_j is still the exact top-1 position.
/// The attention-output cosine compares softmax(q·K̂/sqrt(d))·V̂ with the exact
/// softmax(q·K/sqrt(d))·V.
///
/// K mean removal (default; --no-k-mean turns it off), as llama.cpp's turbo K caches do,
/// from the first min(512, n) keys of the source's pool in token order (llama.cpp's first
/// ubatch at its default -ub 512; none under 32 keys); pool key i is at position i.
/// --k-mean-frame rope (default, llama.cpp's on the CPU): mu = the mean of
/// R_i^-1 k_i over those keys, turbo types quantize k_i - R_i mu and get R_i mu back, so
/// k̂_i = dequant(quant(k_i - R_i mu)) + R_i mu (the needle at the position of the key it
/// replaces). --k-mean-frame fitted: turbo types quantize k - m (the needle too), m their
/// mean mapped by the RoPE fit, k̂ = dequant(quant(k - m)), and the shift -q·m common to a
/// query's logits is ignored by softmax and argmax. Either way k̂ is compared with exact
/// attention over k. Synthetic pools have no positions: the plain mean. q8_0/q4_0 keys and
/// all values are unchanged.
#[derive(Args, Clone)]
#[command(verbatim_doc_comment)]
pub struct NiahOpts {
    #[command(flatten)]
    pub out: Out,
    /// sequence lengths (haystack sizes)
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384,65536")]
    pub lengths: Vec<usize>,
    /// trials per length and source (real, synthetic)
    #[arg(long, default_value_t = 200)]
    pub trials: usize,
    /// the needle's exact attention weight (>= 0.5: the needle is the exact top-1)
    #[arg(long, default_value_t = 0.5)]
    pub needle_weight: f64,
    /// keys in each synthetic pool
    #[arg(long, default_value_t = 4096)]
    pub synthetic_pool: usize,
    /// comma-separated cache types
    #[arg(long, default_value = "turbo4,turbo3,turbo2,q8_0,q4_0")]
    pub types: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub k_mean: KMeanOpt,
}

impl NiahOpts {
    fn params(&self) -> NiahParams {
        NiahParams {
            lengths: self.lengths.clone(),
            trials: self.trials,
            needle_weight: self.needle_weight,
            synthetic_pool: self.synthetic_pool,
            seed: self.seed,
        }
    }
}

pub fn niah(o: NiahOpts) -> Result<(), String> {
    let codecs = Codec::parse_list(&o.types)?;
    let params = o.params();
    params.check()?;
    let c = load(&o.out)?;
    let mode = o.k_mean.mode(&c.header);
    let pb = progress((2 * o.trials * o.lengths.len()) as u64, "trials");
    let cells = niah_cells(&c, &params, &codecs, &mode, &|| pb.inc(1))?;
    pb.finish_and_clear();
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model,
        "definition": "haystack of L keys drawn with replacement from a pool (real: all captured post-RoPE keys of one (layer, KV head); synthetic: N(0,I) keys), query real (same layer, a query head of that group, random token) or N(0,I); needle at a random position p: k_p + alpha q/|q|^2 with exact attention weight needle_weight; metric top1 = fraction of trials where argmax_j q.k^_j after quantizing keys is the exact argmax (= p for needle_weight >= 0.5) (rotation included); out_cos = mean cosine of softmax(qK^/sqrt(d))V^ vs exact; with K mean removal, see k_mean.rule (pool key i at position i)",
        "k_mean": mode.json(&c.header),
        "needle_weight": o.needle_weight, "trials": o.trials, "synthetic_pool": o.synthetic_pool,
        "seed": o.seed, "cells": cells,
    });
    emit(&o.out, &json, || {
        println!("{}", header_line(&c));
        println!(
            "needle proxy: top-1 unchanged after quantizing K (fraction of {} trials), needle weight {}; attention-output cosine in parentheses; {}",
            o.trials, o.needle_weight, mode.words()
        );
        for src in ["real", "synthetic"] {
            print!("| {src} K | ");
            for &l in &o.lengths {
                print!("L={l} | ");
            }
            println!();
            println!("|---|{}", "---|".repeat(o.lengths.len()));
            for cd in &codecs {
                print!("| {} | ", cd.name());
                for &l in &o.lengths {
                    let x = cells
                        .iter()
                        .find(|x| x.source == src && x.length == l && x.codec == cd.name())
                        .unwrap();
                    print!("{:.3} ({:.4}) | ", x.top1, x.out_cos);
                }
                println!();
            }
        }
    });
    plot_or_warn(&o.out, |p| {
        let mut series = Vec::new();
        for (ci, cd) in codecs.iter().enumerate() {
            for src in ["real", "synthetic"] {
                let pts = cells
                    .iter()
                    .filter(|x| x.source == src && x.codec == cd.name())
                    .map(|x| ((x.length as f64).log2(), x.top1))
                    .collect();
                series.push(Series::line(
                    &format!("{} {src}", cd.name()),
                    pts,
                    ci,
                    src == "real",
                ));
            }
        }
        lab_plot::lines(
            p,
            &format!(
                "{}: needle top-1 vs length, {} (bold: real K)",
                stem(&c.header.model),
                mode.words()
            ),
            "log2 sequence length",
            "top-1 unchanged (fraction)",
            false,
            &series,
            &[],
        )
    })
}

// ---------------------------------------------------------------------------------------
// recommend

#[derive(Args, Clone)]
pub struct RecommendOpts {
    #[command(flatten)]
    pub out: Out,
    /// the quality target: every layer's mean attention-output cosine at least this
    #[arg(long, default_value_t = 0.99)]
    pub target: f64,
    /// query positions per layer and head (spread evenly over the second half of the capture)
    #[arg(long, default_value_t = 32)]
    pub queries: usize,
    /// candidate types for K and for V
    #[arg(long, default_value = "f16,q8_0,q4_0,turbo4,turbo3,turbo2")]
    pub types: String,
    #[command(flatten)]
    pub k_mean: KMeanOpt,
}

pub fn recommend(o: RecommendOpts) -> Result<(), String> {
    let codecs = Codec::parse_list(&o.types)?;
    let c = load(&o.out)?;
    if c.header.n_tokens < 4 {
        return Err("the capture needs at least 4 tokens".into());
    }
    let mode = o.k_mean.mode(&c.header);
    let pb = progress(c.header.n_layer as u64, "layers");
    let rows = pair_rows(&c, &codecs, o.queries, o.target, &mode, &|| pb.inc(1))?;
    pb.finish_and_clear();
    let norms = norms::norm_rows(&c);
    let best = rows.iter().find(|r| r.meets_target);
    let best_sym = rows.iter().find(|r| r.meets_target && r.ctk == r.ctv);
    let flags = lab::recommend::flags;
    let ratio_max = norms.iter().map(|r| r.ratio_mean).fold(0.0, f64::max);
    let ratio_med = norms::median_ratio(&norms);
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model, "target": o.target,
        "criterion": "every layer's mean attention-output cosine (softmax(qK^/sqrt(d))V^ vs exact, causal, captured queries at positions in the second half) >= target; least bits per value wins, ties to higher quality",
        "k_mean": mode.json(&c.header),
        "kv_norm_ratio": {"median": ratio_med, "max": ratio_max},
        "recommended": best.map(|r| serde_json::json!({"ctk": r.ctk, "ctv": r.ctv, "flags": flags(r), "bits_per_value": r.bits_per_value})),
        "recommended_symmetric": best_sym.map(|r| serde_json::json!({"ctk": r.ctk, "ctv": r.ctv, "flags": flags(r), "bits_per_value": r.bits_per_value})),
        "pairs": rows,
    });
    emit(&o.out, &json, || {
        println!("{}", header_line(&c));
        println!(
            "K/V norm ratio per layer: median {ratio_med:.1}, max {ratio_max:.1}; attention-output cosine per (K, V) cache pair, {} queries x {} heads per layer; {}",
            o.queries.min(c.header.n_tokens / 2), c.header.n_head, mode.words()
        );
        println!(
            "| -ctk | -ctv | bits/value | out cos mean | worst layer (cos) | target {} |",
            o.target
        );
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {} | {:.3} | {:.5} | {} ({:.5}) | {} |",
                r.ctk,
                r.ctv,
                r.bits_per_value,
                r.out_cos_mean,
                r.worst_layer,
                r.out_cos_worst_layer,
                if r.meets_target { "yes" } else { "no" }
            );
        }
        match best {
            Some(r) => {
                println!(
                    "recommended: llama-server -m {} {} ({:.2} bits/value, worst layer {} cos {:.4})",
                    c.header.model,
                    flags(r),
                    r.bits_per_value,
                    r.worst_layer,
                    r.out_cos_worst_layer
                );
                if let Some(s) = best_sym.filter(|s| s.ctk != r.ctk || s.ctv != r.ctv) {
                    println!(
                        "cheapest symmetric pair: {} ({:.2} bits/value)",
                        flags(s),
                        s.bits_per_value
                    );
                }
            }
            None => println!(
                "no pair meets the target {}: use -ctk f16 -ctv f16 (or lower --target)",
                o.target
            ),
        }
    });
    plot_or_warn(&o.out, |p| {
        let mut series = Vec::new();
        for (i, kc) in codecs.iter().enumerate() {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.ctk == kc.name())
                .map(|r| (r.bits_per_value, 1.0 - r.out_cos_worst_layer))
                .collect();
            let labels = rows
                .iter()
                .filter(|r| r.ctk == kc.name())
                .map(|r| r.ctv.to_string())
                .collect();
            series.push(
                Series::points(&format!("K {} (label: V type)", kc.name()), pts, i)
                    .labelled(labels),
            );
        }
        lab_plot::lines(
            p,
            &format!(
                "{}: worst-layer attention error by pair, {}",
                stem(&c.header.model),
                mode.words()
            ),
            "average bits per value (K and V)",
            "1 - attention-output cosine, worst layer (log)",
            true,
            &series,
            &[(format!("target cos {}", o.target), 1.0 - o.target)],
        )
    })
}

// ---------------------------------------------------------------------------------------
// kmean-sim

/// The simulation of `turboquant_lab::kmean_sim` (its module documentation defines every
/// variant): per layer and KV head, keys stored as s ⊙ k - m plus isotropic Gaussian noise
/// of relative energy --distortion, queries q ⊘ s; the score is the mean KL divergence
/// between exact and noisy causal attention rows of every --stride-th query of the second
/// half.
///
/// Variants: base[+bal|+ubal|+bal-all][/sinkN]; base none, plain (first-ubatch mean),
/// fitted (tq-kmean.h), oracle (mean of all keys), rope-frame (tq-kmean-rope.h),
/// rope-frame:R (only the R pairs it helps most); +bal llama.cpp's K/Q balancing from the
/// first ubatch, +ubal the same with every key weighted alike, +bal-all from all tokens;
/// /sinkN the first N keys stored exactly (tq-sink.h: N = 1).
#[derive(Args, Clone)]
pub struct KmeanSimOpts {
    #[command(flatten)]
    pub out: Out,
    /// use the first N tokens (0: all)
    #[arg(long, default_value_t = 0)]
    pub tokens: usize,
    /// the codec's relative error energy D (turbo4 0.0081, turbo3 0.0307, turbo2 0.111)
    #[arg(long, default_value_t = 0.0307)]
    pub distortion: f64,
    /// tokens of the first ubatch
    #[arg(long, default_value_t = 512)]
    pub first: usize,
    /// score every N-th query position of the second half
    #[arg(long, default_value_t = 128)]
    pub stride: usize,
    /// comma-separated layers (default: all)
    #[arg(long, value_delimiter = ',')]
    pub layers: Vec<usize>,
    /// the noise draw
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// comma-separated variants, each base[+bal|+ubal|+bal-all][/sinkN]; base none, plain,
    /// fitted, oracle, rope-frame or rope-frame:R (docs/LAB.md, "kmean-sim")
    #[arg(long, default_value = lab::kmean_sim::DEFAULT_VARIANTS)]
    pub variants: String,
}

pub fn kmean_sim(o: KmeanSimOpts) -> Result<(), String> {
    use lab::kmean_sim::{mean_kl, simulate, SimParams, Variant};
    let variants = Variant::parse_list(&o.variants)?;
    let c = load(&o.out)?;
    let p = SimParams {
        tokens: o.tokens,
        distortion: o.distortion,
        first: o.first,
        stride: o.stride,
        layers: o.layers.clone(),
        seed: o.seed,
        variants,
    };
    let n_layers = if p.layers.is_empty() {
        c.header.n_layer
    } else {
        p.layers.len()
    };
    let pb = progress(n_layers as u64, "layers");
    let rows = simulate(&c, &p, &|| pb.inc(1))?;
    pb.finish_and_clear();
    let names: Vec<&str> = p.variants.iter().map(|v| v.name.as_str()).collect();
    let mean = mean_kl(&rows, names.len());
    let fitted = names.iter().position(|&n| n == "fitted").map(|i| mean[i]);
    let t = if p.tokens > 0 {
        p.tokens.min(c.header.n_tokens)
    } else {
        c.header.n_tokens
    };
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model, "tokens": t,
        "first_ubatch": p.first.min(t), "distortion": p.distortion, "stride": p.stride,
        "seed": p.seed, "variants": names,
        "definition": "per layer and KV head: keys stored as s*k - m plus isotropic Gaussian noise of relative energy D, queries q/s; kl = mean KL(exact || noisy) of causal attention rows of every stride-th query of the second half, mean over KV heads (turboquant_lab::kmean_sim)",
        "mean_kl": names.iter().zip(&mean).map(|(n, k)| (n.to_string(), serde_json::json!(k))).collect::<serde_json::Map<_, _>>(),
        "layers": rows,
    });
    emit(&o.out, &json, || {
        println!("{}", header_line(&c));
        println!(
            "T = {t}, first ubatch {}, distortion {}; mean attention KL per layer (mean over KV heads)",
            p.first.min(t),
            p.distortion
        );
        println!("| layer | {} |", names.join(" | "));
        println!("|---|{}", "---|".repeat(names.len()));
        for r in &rows {
            let cells: Vec<String> = r.kl.iter().map(|k| format!("{k:.5}")).collect();
            println!("| {} | {} |", r.layer, cells.join(" | "));
        }
        let cells: Vec<String> = mean
            .iter()
            .map(|k| match fitted {
                Some(f) => format!("{k:.5} ({:.3}x fitted)", k / f),
                None => format!("{k:.5}"),
            })
            .collect();
        println!("| mean | {} |", cells.join(" | "));
    });
    plot_or_warn(&o.out, |path| {
        let series: Vec<Series> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let pts = rows.iter().map(|r| (r.layer as f64, r.kl[i])).collect();
                Series::line(n, pts, i, n.contains("rope-frame"))
            })
            .collect();
        lab_plot::lines(
            path,
            &format!(
                "{}: attention KL per layer, D = {} (bold: RoPE frame)",
                stem(&c.header.model),
                p.distortion
            ),
            "layer",
            "mean attention KL (log)",
            true,
            &series,
            &[],
        )
    })
}
