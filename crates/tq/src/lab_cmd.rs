//! The lab subcommands on a capture file (`tq capture`): rotation-stats, kv-norms,
//! distortion, niah, recommend. Each prints a table, or JSON with `--json`, and draws a PNG
//! with `--plot`. The math is in `turboquant_lab`.

use crate::lab_plot::{self, Series};
use crate::progress::progress;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use turboquant_codec::rotation::SplitMix64;
use turboquant_lab::{self as lab, Capture, Codec, Moments, Pool, Rotation};

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

/// `f(0..n)` on all cores (work-stealing by index); results in index order.
fn parallel_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(n.max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let results = std::sync::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = f(i);
                results.lock().unwrap()[i] = Some(r);
            });
        }
    });
    out.into_iter().map(|r| r.unwrap()).collect()
}

/// `f(layer)` for every layer on all cores, one progress tick per layer.
fn per_layer<T: Send>(
    n_layer: usize,
    pb: &indicatif::ProgressBar,
    f: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    parallel_map(n_layer, |l| {
        let r = f(l);
        pb.inc(1);
        r
    })
}

fn header_line(c: &Capture) -> String {
    let h = &c.header;
    format!(
        "{} ({}), {} tokens, {} layers, {} heads / {} KV heads, head {}/{}",
        h.model, h.desc, h.n_tokens, h.n_layer, h.n_head, h.n_head_kv, h.head_k, h.head_v
    )
}

fn rot_dims(c: &Capture) -> Result<(usize, usize), String> {
    let h = &c.header;
    match (lab::rot_dim_k(h.head_k), lab::rot_dim_v(h.head_v)) {
        (Some(k), Some(v)) => Ok((k, v)),
        _ => Err(format!(
            "head size {}/{} is not a multiple of 64: llama.cpp neither rotates it nor takes turbo \
             caches for it",
            h.head_k, h.head_v
        )),
    }
}

// ---------------------------------------------------------------------------------------
// rotation-stats

#[derive(Serialize, Clone, Copy, Default)]
pub struct Stat {
    pub std: f64,
    pub kurtosis: f64,
}

impl From<&Moments> for Stat {
    fn from(m: &Moments) -> Stat {
        Stat {
            std: m.std(),
            kurtosis: m.kurtosis(),
        }
    }
}

#[derive(Serialize)]
pub struct RotRow {
    pub layer: usize,
    pub k_before: Stat,
    pub k_after: Stat,
    pub v_before: Stat,
    pub v_after: Stat,
    /// |mean of the unit-normalized vectors of a head|², mean over heads: the share of
    /// the energy in a fixed per-head offset (0 for isotropic vectors)
    pub k_mean_energy: f64,
    pub v_mean_energy: f64,
}

/// Moments of the coordinates of every unit-normalized head vector, raw and after the
/// seeded rotation of a turbo cache, and the mean-offset energy share (see RotRow).
fn rot_moments(rows: &[f32], dim: usize, rot_dim: usize, heads: usize) -> (Moments, Moments, f64) {
    let (mut before, mut after) = (Moments::default(), Moments::default());
    let mut buf = vec![0f32; dim];
    let mut mean = vec![0f64; heads * dim];
    let mut count = vec![0usize; heads];
    for (i, x) in rows.chunks_exact(dim).enumerate() {
        let n = lab::norm(x);
        if n == 0.0 {
            continue;
        }
        for (b, &v) in buf.iter_mut().zip(x) {
            *b = (v as f64 / n) as f32;
        }
        let h = i % heads;
        count[h] += 1;
        for (m, &b) in mean[h * dim..(h + 1) * dim].iter_mut().zip(&buf) {
            *m += b as f64;
        }
        before.extend(&buf);
        lab::apply_rotation(Rotation::Seeded, rot_dim, &mut buf);
        after.extend(&buf);
    }
    let energy = (0..heads)
        .map(|h| {
            let c = count[h].max(1) as f64;
            mean[h * dim..(h + 1) * dim]
                .iter()
                .map(|m| (m / c).powi(2))
                .sum::<f64>()
        })
        .sum::<f64>()
        / heads as f64;
    (before, after, energy)
}

pub fn rotation_stats(o: Out) -> Result<(), String> {
    let c = load(&o)?;
    let h = c.header.clone();
    let (rk, rv) = rot_dims(&c)?;
    let pb = progress(h.n_layer as u64, "layers");
    let rows: Vec<(RotRow, [Moments; 4])> = per_layer(h.n_layer, &pb, |l| {
        let (kb, ka, ke) = rot_moments(&c.k[l], h.head_k, rk, h.n_head_kv);
        let (vb, va, ve) = rot_moments(&c.v[l], h.head_v, rv, h.n_head_kv);
        (
            RotRow {
                layer: l,
                k_before: (&kb).into(),
                k_after: (&ka).into(),
                v_before: (&vb).into(),
                v_after: (&va).into(),
                k_mean_energy: ke,
                v_mean_energy: ve,
            },
            [kb, ka, vb, va],
        )
    });
    pb.finish_and_clear();
    // all layers pooled
    let mut all = [Moments::default(); 4];
    for (_, m) in &rows {
        for i in 0..4 {
            all[i] = merge(&all[i], &m[i]);
        }
    }
    let rows: Vec<RotRow> = rows.into_iter().map(|(r, _)| r).collect();
    let theory_std_k = 1.0 / (h.head_k as f64).sqrt();
    let theory_std_v = 1.0 / (h.head_v as f64).sqrt();
    let json = serde_json::json!({
        "capture": o.capture, "model": h.model, "head_k": h.head_k, "head_v": h.head_v,
        "rotation": "seeded randomized Hadamard R = D H D / sqrt(n) (TQ_DEFAULT_SEED), K: n = largest power of 2 dividing head_k, V: n = 64",
        "theory": {"kurtosis_gaussian": 3.0, "kurtosis_sphere_k": lab::sphere_kurtosis(h.head_k),
                   "std_k": theory_std_k, "std_v": theory_std_v},
        "all_layers": {"k_before": Stat::from(&all[0]), "k_after": Stat::from(&all[1]),
                       "v_before": Stat::from(&all[2]), "v_after": Stat::from(&all[3])},
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
            all.each_ref().map(Stat::from),
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

fn merge(a: &Moments, b: &Moments) -> Moments {
    // Moments are plain power sums: merging is adding them.
    let mut m = *a;
    m.merge(b);
    m
}

fn stem(model: &str) -> String {
    Path::new(model)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.to_string())
}

// ---------------------------------------------------------------------------------------
// kv-norms

#[derive(Serialize)]
pub struct NormRow {
    pub layer: usize,
    pub k_mean: f64,
    pub k_p99: f64,
    pub v_mean: f64,
    pub v_p99: f64,
    pub ratio_mean: f64,
    pub ratio_p99: f64,
    pub outlier: bool,
}

/// Outlier rule: a layer whose mean K/V norm ratio is more than twice, or less than half,
/// the median over layers.
pub const OUTLIER_FACTOR: f64 = 2.0;

pub fn norm_rows(c: &Capture) -> Vec<NormRow> {
    let h = &c.header;
    let mut rows: Vec<NormRow> = (0..h.n_layer)
        .map(|l| {
            let kn: Vec<f64> = c.k[l].chunks_exact(h.head_k).map(lab::norm).collect();
            let vn: Vec<f64> = c.v[l].chunks_exact(h.head_v).map(lab::norm).collect();
            let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
            let (km, vm) = (mean(&kn), mean(&vn));
            let (k99, v99) = (lab::quantile(&kn, 0.99), lab::quantile(&vn, 0.99));
            NormRow {
                layer: l,
                k_mean: km,
                k_p99: k99,
                v_mean: vm,
                v_p99: v99,
                ratio_mean: km / vm,
                ratio_p99: k99 / v99,
                outlier: false,
            }
        })
        .collect();
    let ratios: Vec<f64> = rows.iter().map(|r| r.ratio_mean).collect();
    let med = lab::quantile(&ratios, 0.5);
    for r in &mut rows {
        r.outlier = r.ratio_mean > OUTLIER_FACTOR * med || r.ratio_mean < med / OUTLIER_FACTOR;
    }
    rows
}

pub fn kv_norms(o: Out) -> Result<(), String> {
    let c = load(&o)?;
    let h = &c.header;
    let rows = norm_rows(&c);
    let ratios: Vec<f64> = rows.iter().map(|r| r.ratio_mean).collect();
    let med = lab::quantile(&ratios, 0.5);
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

/// The K mean the lab applies to one capture, once the capture's RoPE info is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// --no-k-mean
    Off,
    /// the first-ubatch mean as it is (a capture without RoPE frequencies)
    Plain,
    /// tq-kmean.h's fitted mean
    Fitted,
    /// tq-kmean-rope.h's mean in RoPE's frame
    Rope,
}

/// What `KMeanOpt` asked for and what this capture gets (`fallback`: why they differ).
#[derive(Clone, Debug)]
pub struct KMeanMode {
    frame: Frame,
    asked: Option<KMeanFrame>,
    fallback: Option<String>,
}

impl KMeanOpt {
    pub fn on(&self) -> bool {
        !self.no_k_mean
    }

    /// The mode for the capture of header `h`; a RoPE frame that cannot be modelled falls
    /// back to the fixed mean, with a line on stderr (the JSON says it too).
    pub fn mode(&self, h: &lab::CaptureHeader) -> KMeanMode {
        let fixed = if h.rope.is_some() {
            Frame::Fitted
        } else {
            Frame::Plain
        };
        let (frame, fallback) = match (self.on(), self.k_mean_frame) {
            (false, _) => (Frame::Off, None),
            (true, KMeanFrame::Fitted) => (fixed, None),
            (true, KMeanFrame::Rope) => match rope_frame_missing(h) {
                None => (Frame::Rope, None),
                Some(why) => (fixed, Some(why)),
            },
        };
        if let Some(why) = &fallback {
            eprintln!(
                "tq: the K mean in RoPE's frame is not modelled for this capture ({why}); using the {} mean instead",
                if fixed == Frame::Fitted { "fitted" } else { "plain first-ubatch" }
            );
        }
        KMeanMode {
            frame,
            asked: self.on().then_some(self.k_mean_frame),
            fallback,
        }
    }
}

/// Layer `l`'s RoPE as recorded by `tq capture` (frequencies empty when it recorded none).
fn rope_frame(h: &lab::CaptureHeader, l: usize) -> Option<lab::RopeFrame<'_>> {
    h.rope.as_ref().map(|r| lab::RopeFrame {
        w: r.freqs.get(l).map_or(&[][..], |f| &f[..]),
        neox: r.neox,
    })
}

/// Why the mean in RoPE's frame cannot be modelled on this capture, if it cannot: no RoPE
/// info, or a layer without full RoPE (where llama.cpp too keeps the fitted mean).
fn rope_frame_missing(h: &lab::CaptureHeader) -> Option<String> {
    if h.rope.is_none() {
        return Some(
            "the capture has no RoPE frequencies: it predates their recording by tq capture; capture again"
                .into(),
        );
    }
    (0..h.n_layer).find_map(|l| {
        let r = rope_frame(h, l)?;
        (!r.full(h.head_k)).then(|| {
            format!(
                "layer {l} has {} RoPE frequencies recorded for {} channel pairs, where llama.cpp keeps the fitted mean too",
                r.w.len(),
                h.head_k / 2
            )
        })
    })
}

fn k_mean_json(mode: &KMeanMode, h: &lab::CaptureHeader) -> serde_json::Value {
    let map = if h.rope.is_some() {
        "then mapped per RoPE pair by F = a_N conj(a_B) / max(|a_B|^2, |a_N| |a_B|) to a cache of n_tokens positions, as llama.cpp does (frequencies recorded by tq capture)"
    } else {
        "not mapped to later positions (this capture predates the recorded RoPE frequencies: llama.cpp's RoPE-fitted mean is not modelled; capture again)"
    };
    let first = format!(
        "the first min({}, n_tokens) captured keys (llama.cpp's first ubatch at its default -ub {}), none if that is under {} tokens",
        lab::K_MEAN_TOKENS,
        lab::K_MEAN_TOKENS,
        lab::K_MEAN_MIN_TOKENS
    );
    let rule = match mode.frame {
        Frame::Off => "none (--no-k-mean: turbo K caches store k, as llama.cpp with --tq-k-mean off)".to_string(),
        Frame::Rope => format!("turbo K caches keep the mean in RoPE's frame (llama.cpp's default with the model on the CPU, tq-kmean-rope.h; the capture is one sequence): mu per layer and KV head = mean of R_p^-1 k_p over {first}, p = token index; key p stores k_p - R_p mu and attention adds q.R_p mu back, so k^_p = dequant(quant(k_p - R_p mu)) + R_p mu (the needle at the position of the key it replaces); q8_0/q4_0/f16 K and V unchanged"),
        Frame::Fitted | Frame::Plain => format!("turbo K caches store k - m (llama.cpp's K mean removal, tq-kmean.h); m per layer and KV head = mean of {first}, {map}; q8_0/q4_0/f16 K and V unchanged"),
    };
    serde_json::json!({
        "removed": mode.frame != Frame::Off,
        "frame": frame_name(mode.frame),
        "frame_asked": mode.asked.map(|a| if a == KMeanFrame::Rope { "rope" } else { "fitted" }),
        "fallback": mode.fallback,
        "rule": rule,
    })
}

fn frame_name(f: Frame) -> &'static str {
    match f {
        Frame::Off => "none",
        Frame::Plain => "plain",
        Frame::Fitted => "fitted",
        Frame::Rope => "rope",
    }
}

/// For titles and table captions.
fn k_mean_words(mode: &KMeanMode) -> &'static str {
    match mode.frame {
        Frame::Off => "no K mean removal",
        Frame::Plain => "turbo K mean removed (plain first-ubatch mean)",
        Frame::Fitted => "turbo K mean removed (fitted mean)",
        Frame::Rope => "turbo K mean removed (RoPE frame)",
    }
}

/// One layer's K mean, owned: `[n_head_kv][head_k]` values (`m`, or `mu` in RoPE's frame)
/// and, in RoPE's frame, the layer's RoPE; `get` lends it as the lab's `KMean`.
struct LayerMean<'c> {
    m: Vec<f32>,
    rope: Option<lab::RopeFrame<'c>>,
}

impl<'c> LayerMean<'c> {
    fn get(&self) -> lab::KMean<'_> {
        match self.rope {
            Some(rope) => lab::KMean::Rope { mu: &self.m, rope },
            None => lab::KMean::Fixed(&self.m),
        }
    }

    /// KV head `kh` alone (a needle pool is one head).
    fn head(self, kh: usize, d: usize) -> LayerMean<'c> {
        LayerMean {
            m: self.m[kh * d..(kh + 1) * d].to_vec(),
            rope: self.rope,
        }
    }

    /// What the cache of type `cd` gives back for the layer's keys `rows` (positions from
    /// 0); `lm` `None`: no mean removal.
    fn roundtrip(
        lm: &Option<Self>,
        cd: Codec,
        dim: usize,
        rot_dim: usize,
        rows: &[f32],
    ) -> Vec<f32> {
        match lm {
            Some(m) => m.get().roundtrip(cd, dim, rot_dim, rows, 0),
            None => lab::roundtrip_rows(cd, dim, rot_dim, rows),
        }
    }
}

/// Layer `l`'s K mean in `mode` (see `KMeanOpt`), `None` for no removal.
fn layer_k_mean<'c>(c: &'c Capture, l: usize, mode: &KMeanMode) -> Option<LayerMean<'c>> {
    let h = &c.header;
    let (nh, d) = (h.n_head_kv, h.head_k);
    match mode.frame {
        Frame::Off => None,
        Frame::Rope => {
            let rope = rope_frame(h, l).expect("KMeanOpt::mode checked the RoPE info");
            Some(LayerMean {
                m: lab::unrope_mean(&c.k[l], nh, d, rope, lab::K_MEAN_TOKENS),
                rope: Some(rope),
            })
        }
        Frame::Plain | Frame::Fitted => {
            let mut m = lab::k_mean(&c.k[l], nh, d, lab::K_MEAN_TOKENS);
            if let Some(r) = rope_frame(h, l) {
                // the cache holds every captured position, as a context of n_tokens would
                lab::rope_fit_mean(&mut m, d, r.w, r.neox, lab::K_MEAN_TOKENS, h.n_tokens);
            }
            Some(LayerMean { m, rope: None })
        }
    }
}

// ---------------------------------------------------------------------------------------
// distortion

fn parse_codecs(s: &str) -> Result<Vec<Codec>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            Codec::parse(t).ok_or_else(|| {
                format!(
                    "unknown type `{t}` (one of: {})",
                    Codec::ALL.map(Codec::name).join(", ")
                )
            })
        })
        .collect()
}

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

#[derive(Serialize, Clone, Copy, Default)]
pub struct Dist {
    /// mean over vectors of |x - x̂|² / |x|²
    pub rel_mse: f64,
    /// mean cosine(x, x̂)
    pub cos: f64,
    /// 1st percentile of cosine(x, x̂)
    pub cos_p1: f64,
}

/// Distortion of the reconstruction `y` of the rows `rows` (each `dim` long).
fn dist(rows: &[f32], y: &[f32], dim: usize) -> Dist {
    let mut mse = 0.0;
    let mut coss = Vec::with_capacity(rows.len() / dim);
    for (x, xh) in rows.chunks_exact(dim).zip(y.chunks_exact(dim)) {
        let n2 = lab::norm(x).powi(2);
        if n2 == 0.0 {
            continue;
        }
        let e: f64 = x
            .iter()
            .zip(xh)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum();
        mse += e / n2;
        coss.push(lab::cosine(x, xh));
    }
    let n = coss.len().max(1) as f64;
    Dist {
        rel_mse: mse / n,
        cos: coss.iter().sum::<f64>() / n,
        cos_p1: lab::quantile(&coss, 0.01),
    }
}

#[derive(Serialize)]
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

fn mean_dist(ds: &[Dist]) -> Dist {
    let n = ds.len().max(1) as f64;
    Dist {
        rel_mse: ds.iter().map(|d| d.rel_mse).sum::<f64>() / n,
        cos: ds.iter().map(|d| d.cos).sum::<f64>() / n,
        cos_p1: ds.iter().map(|d| d.cos_p1).fold(f64::INFINITY, f64::min),
    }
}

pub fn distortion_rows(
    c: &Capture,
    codecs: &[Codec],
    k_mean: &KMeanMode,
) -> Result<Vec<DistRow>, String> {
    let h = &c.header;
    let (dk, dv) = (h.head_k, h.head_v);
    let (rk, rv) = rot_dims(c)?;
    let pb = progress(h.n_layer as u64, "layers");
    let per: Vec<Vec<LayerDist>> = per_layer(h.n_layer, &pb, |l| {
        // what each key has taken off: m, or R_p mu in RoPE's frame (sub_mean takes both)
        let removed = layer_k_mean(c, l, k_mean).map(|m| m.get().removed(dk, c.k[l].len(), 0));
        let centred = removed.as_deref().map(|r| lab::sub_mean(&c.k[l], r));
        codecs
            .iter()
            .map(|&cd| {
                let y = lab::roundtrip_rows(cd, dk, rk, &c.k[l]);
                let (k_with, k_centred) = match (&removed, &centred) {
                    (Some(r), Some(kc)) => (
                        // what llama.cpp stores: k - m (k_p - R_p mu), for the types that remove it
                        cd.removes_k_mean()
                            .then(|| dist(kc, &lab::roundtrip_rows(cd, dk, rk, kc), dk)),
                        Some(dist(kc, &lab::sub_mean(&y, r), dk)),
                    ),
                    _ => (None, None),
                };
                LayerDist {
                    k: dist(&c.k[l], &y, dk),
                    k_with,
                    k_centred,
                    v: dist(&c.v[l], &lab::roundtrip_rows(cd, dv, rv, &c.v[l]), dv),
                }
            })
            .collect()
    });
    pb.finish_and_clear();
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
                lloyd_max: cd.index_bits().map(lab::lloyd_max_distortion),
                lower_bound: cd.index_bits().map(lab::lower_bound),
                k_layers: kl,
                k_with_k_mean_layers: kw,
                v_layers: vl,
            }
        })
        .collect())
}

pub fn distortion(o: DistortionOpts) -> Result<(), String> {
    let codecs = parse_codecs(&o.types)?;
    let c = load(&o.out)?;
    let mode = o.k_mean.mode(&c.header);
    let km = mode.frame != Frame::Off;
    let rows = distortion_rows(&c, &codecs, &mode)?;
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model,
        "method": "each head vector through the cache type as llama.cpp applies it: turbo after the seeded rotation, q8_0/q4_0 (Rust re-implementation of ggml's quantize_row_q*_0_ref, fp16 scale) after upstream's plain Hadamard rotation; K rotation size = largest power of 2 dividing head_k, V: 64. Means over all tokens, heads and layers; cos_p1 = worst layer's 1st percentile. k: k vs its reconstruction, no mean removal; k_with_k_mean (turbo, K mean removal on): k - m vs dequant(quant(k - m)); k_centred_without_k_mean: k - m vs k^ - m, the cache storing k, i.e. the error of the no-removal cache in the quantity attention sees",
        "k_mean": k_mean_json(&mode, &c.header),
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
                k_mean_words(&mode)
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

#[derive(Serialize, Clone)]
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

pub fn niah_cells(
    c: &Capture,
    o: &NiahOpts,
    codecs: &[Codec],
    k_mean: &KMeanMode,
) -> Result<Vec<NiahCell>, String> {
    let h = &c.header;
    let (rk, rv) = rot_dims(c)?;
    if !(o.needle_weight > 0.0 && o.needle_weight < 1.0) {
        return Err("--needle-weight must be in (0, 1)".into());
    }
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
    let total = 2 * o.trials * nl;
    let pb = progress(total as u64, "trials");
    let group = h.n_head / h.n_head_kv;
    let work: Vec<usize> = (0..plan.len()).filter(|&u| !plan[u].is_empty()).collect();
    let per_unit = parallel_map(work.len(), |wi| {
        let u = work[wi];
        let unit = if u < n_units_real {
            let (l, kh) = (u / h.n_head_kv, u % h.n_head_kv);
            let gather = |rows: &[f32], d| lab::one_head(rows, h.n_head_kv, kh, d);
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
                m: lab::k_mean(&unit.keys, 1, h.head_k, lab::K_MEAN_TOKENS),
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
            .map(|&cd| lab::roundtrip_rows(cd, h.head_v, rv, &unit.values))
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
            let r = lab::needle_trial(
                &pool,
                codecs,
                &q,
                o.lengths[li],
                o.needle_weight,
                scale,
                &mut trng,
            );
            out.push((src, li, r));
            pb.inc(1);
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
    pb.finish_and_clear();
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

pub fn niah(o: NiahOpts) -> Result<(), String> {
    let codecs = parse_codecs(&o.types)?;
    if o.lengths.is_empty() || o.lengths.iter().any(|&l| l < 2) || o.trials == 0 {
        return Err("--lengths must be at least 2 and --trials positive".into());
    }
    let c = load(&o.out)?;
    let mode = o.k_mean.mode(&c.header);
    let cells = niah_cells(&c, &o, &codecs, &mode)?;
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model,
        "definition": "haystack of L keys drawn with replacement from a pool (real: all captured post-RoPE keys of one (layer, KV head); synthetic: N(0,I) keys), query real (same layer, a query head of that group, random token) or N(0,I); needle at a random position p: k_p + alpha q/|q|^2 with exact attention weight needle_weight; metric top1 = fraction of trials where argmax_j q.k^_j after quantizing keys is the exact argmax (= p for needle_weight >= 0.5) (rotation included); out_cos = mean cosine of softmax(qK^/sqrt(d))V^ vs exact; with K mean removal, see k_mean.rule (pool key i at position i)",
        "k_mean": k_mean_json(&mode, &c.header),
        "needle_weight": o.needle_weight, "trials": o.trials, "synthetic_pool": o.synthetic_pool,
        "seed": o.seed, "cells": cells,
    });
    emit(&o.out, &json, || {
        println!("{}", header_line(&c));
        println!(
            "needle proxy: top-1 unchanged after quantizing K (fraction of {} trials), needle weight {}; attention-output cosine in parentheses; {}",
            o.trials, o.needle_weight, k_mean_words(&mode)
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
                k_mean_words(&mode)
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

#[derive(Serialize)]
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
/// captured queries over all earlier captured keys/values. With `k_mean`, turbo K caches
/// hold dequant(quant(k - m)), or dequant(quant(k_p - R_p mu)) + R_p mu in RoPE's frame (see
/// `KMeanOpt`), compared with exact attention over k.
pub fn pair_rows(
    c: &Capture,
    codecs: &[Codec],
    queries: usize,
    target: f64,
    k_mean: &KMeanMode,
) -> Result<Vec<PairRow>, String> {
    let h = &c.header;
    let (rk, rv) = rot_dims(c)?;
    let scale = 1.0 / (h.head_k as f32).sqrt();
    let group = h.n_head / h.n_head_kv;
    let t0 = h.n_tokens / 2;
    let nq = queries.clamp(1, h.n_tokens - t0);
    let positions: Vec<usize> = (0..nq).map(|i| t0 + (i * (h.n_tokens - t0)) / nq).collect();
    let nc = codecs.len();
    let pb = progress(h.n_layer as u64, "layers");
    // per layer: [kc][vc] mean cosine
    let per: Vec<Vec<f64>> = per_layer(h.n_layer, &pb, |l| {
        let m = layer_k_mean(c, l, k_mean);
        let kq: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&cd| LayerMean::roundtrip(&m, cd, h.head_k, rk, &c.k[l]))
            .collect();
        let vq: Vec<Vec<f32>> = codecs
            .iter()
            .map(|&cd| lab::roundtrip_rows(cd, h.head_v, rv, &c.v[l]))
            .collect();
        let mut sum = vec![0f64; nc * nc];
        let mut n = 0usize;
        let (dk, dv) = (h.head_k, h.head_v);
        let mut exact = vec![0f32; dv];
        let mut out = vec![0f32; dv];
        for kh in 0..h.n_head_kv {
            let gather = |rows: &[f32], d| lab::one_head(rows, h.n_head_kv, kh, d);
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
                            .map(|k| lab::dot(q, k) * scale)
                            .collect();
                        lab::softmax(&mut s);
                        s
                    };
                    let p = probs(&k_exact);
                    lab::weighted_sum(&p, &v_exact[..len * dv], dv, &mut exact);
                    for ki in 0..nc {
                        let pk = probs(&k_q[ki]);
                        for vi in 0..nc {
                            lab::weighted_sum(&pk, &v_q[vi][..len * dv], dv, &mut out);
                            sum[ki * nc + vi] += lab::cosine(&exact, &out);
                        }
                    }
                    n += 1;
                }
            }
        }
        sum.iter().map(|s| s / n as f64).collect()
    });
    pb.finish_and_clear();
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

pub fn recommend(o: RecommendOpts) -> Result<(), String> {
    let codecs = parse_codecs(&o.types)?;
    let c = load(&o.out)?;
    if c.header.n_tokens < 4 {
        return Err("the capture needs at least 4 tokens".into());
    }
    let mode = o.k_mean.mode(&c.header);
    let rows = pair_rows(&c, &codecs, o.queries, o.target, &mode)?;
    let norms = norm_rows(&c);
    let best = rows.iter().find(|r| r.meets_target);
    let best_sym = rows.iter().find(|r| r.meets_target && r.ctk == r.ctv);
    let flags = |r: &PairRow| {
        let fa = if r.ctv == "f16" { "" } else { " -fa on" };
        format!("-ctk {} -ctv {}{fa}", r.ctk, r.ctv)
    };
    let ratio_max = norms.iter().map(|r| r.ratio_mean).fold(0.0, f64::max);
    let ratio_med = lab::quantile(&norms.iter().map(|r| r.ratio_mean).collect::<Vec<_>>(), 0.5);
    let json = serde_json::json!({
        "capture": o.out.capture, "model": c.header.model, "target": o.target,
        "criterion": "every layer's mean attention-output cosine (softmax(qK^/sqrt(d))V^ vs exact, causal, captured queries at positions in the second half) >= target; least bits per value wins, ties to higher quality",
        "k_mean": k_mean_json(&mode, &c.header),
        "kv_norm_ratio": {"median": ratio_med, "max": ratio_max},
        "recommended": best.map(|r| serde_json::json!({"ctk": r.ctk, "ctv": r.ctv, "flags": flags(r), "bits_per_value": r.bits_per_value})),
        "recommended_symmetric": best_sym.map(|r| serde_json::json!({"ctk": r.ctk, "ctv": r.ctv, "flags": flags(r), "bits_per_value": r.bits_per_value})),
        "pairs": rows,
    });
    emit(&o.out, &json, || {
        println!("{}", header_line(&c));
        println!(
            "K/V norm ratio per layer: median {ratio_med:.1}, max {ratio_max:.1}; attention-output cosine per (K, V) cache pair, {} queries x {} heads per layer; {}",
            o.queries.min(c.header.n_tokens / 2), c.header.n_head, k_mean_words(&mode)
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
                k_mean_words(&mode)
            ),
            "average bits per value (K and V)",
            "1 - attention-output cosine, worst layer (log)",
            true,
            &series,
            &[(format!("target cos {}", o.target), 1.0 - o.target)],
        )
    })
}
