//! `tq eval`: KV-cache quality and speed of every cache pair on one or more models.
//!
//! For each model: llama-perplexity at f16 saves the base logits, then every pair runs with
//! `--kl-divergence` against them (PPL, mean KLD, same-top-token rate); optionally
//! llama-bench gives pp/tg t/s at several depths. Results go to `results.md`,
//! `results.json` and PNG plots in the output directory. A run that fails is an error row,
//! never dropped, and makes the exit status non-zero.

use crate::results::{BenchPoint, KldStats, ModelResults, Row};
use crate::{corpus, gguf, kv, models, plot};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

/// The pairs the issue asks for, in this order (f16 is the base run itself).
pub const DEFAULT_PAIRS: &str =
    "f16,q8_0,q4_0,q4_0-norot,turbo4,turbo3,turbo2,turbo4/turbo3,turbo4/turbo2,q8_0/turbo3";

/// Env var that turns llama.cpp's attention rotation off (the `-norot` pairs).
const ROT_DISABLE_ENV: &str = "LLAMA_ATTN_ROT_DISABLE";

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair {
    pub k: kv::CacheType,
    pub v: kv::CacheType,
    /// run with LLAMA_ATTN_ROT_DISABLE=1
    pub norot: bool,
}

impl Pair {
    pub fn label(&self) -> String {
        let base = if self.k.name == self.v.name {
            self.k.name.to_string()
        } else {
            format!("{}/{}", self.k.name, self.v.name)
        };
        if self.norot {
            format!("{base}-norot")
        } else {
            base
        }
    }
    pub fn is_f16(&self) -> bool {
        self.k.name == "f16" && self.v.name == "f16" && !self.norot
    }
    pub fn is_turbo(&self) -> bool {
        self.k.name.starts_with("turbo") || self.v.name.starts_with("turbo")
    }
    fn env(&self) -> Vec<(&'static str, &'static str)> {
        if self.norot {
            vec![(ROT_DISABLE_ENV, "1")]
        } else {
            vec![]
        }
    }
}

/// `turbo4` = turbo4/turbo4, `turbo4/turbo3` = K/V, a `-norot` suffix turns the rotation off.
pub fn parse_pairs(spec: &str) -> Result<Vec<Pair>, String> {
    let valid = || {
        kv::CACHE_TYPES
            .iter()
            .map(|t| t.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out: Vec<Pair> = Vec::new();
    for item in spec.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!(
                "empty pair in `{spec}` (expected a comma-separated list like turbo4,turbo4/turbo3,q4_0-norot)"
            ));
        }
        let (body, norot) = match item.strip_suffix("-norot") {
            Some(b) => (b, true),
            None => (item, false),
        };
        let parts: Vec<&str> = body.split('/').collect();
        let (k, v) = match parts.as_slice() {
            [t] => (*t, *t),
            [k, v] => (*k, *v),
            _ => {
                return Err(format!(
                    "bad pair `{item}`: expected TYPE or K/V (optionally with a -norot suffix), \
                     e.g. turbo4 or turbo4/turbo3; valid types: {}",
                    valid()
                ))
            }
        };
        let ty = |n: &str| kv::cache_type(n.trim()).map_err(|e| format!("bad pair `{item}`: {e}"));
        let p = Pair {
            k: ty(k)?,
            v: ty(v)?,
            norot,
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- output parsers

/// Whitespace-normalised lines, so "Mean    KLD:" matches "Mean KLD:".
fn norm_lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn parse_num(s: &str) -> Result<f64, String> {
    let s = s.trim().trim_end_matches('%').trim();
    let x: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if x.is_finite() {
        Ok(x)
    } else {
        Err(format!("non-finite value `{s}`"))
    }
}

/// "X ± Y" / "X +/- Y" (a trailing % allowed) into (X, Y).
fn parse_pm(s: &str) -> Result<(f64, f64), String> {
    let s = s.trim().trim_end_matches('%');
    let (a, b) = s
        .split_once('±')
        .or_else(|| s.split_once("+/-"))
        .ok_or_else(|| format!("`{s}` is not `X ± Y`"))?;
    Ok((parse_num(a)?, parse_num(b)?))
}

/// The value after `key` on the first line starting with it.
fn field(text: &str, key: &str) -> Result<(f64, f64), String> {
    let key_n = key.split_whitespace().collect::<Vec<_>>().join(" ");
    for l in norm_lines(text) {
        // The llama.cpp log prefix ("0.16.836.012 I ") may precede the key.
        if let Some(i) = l.find(&key_n) {
            return parse_pm(&l[i + key_n.len()..]).map_err(|e| format!("`{key}`: {e}"));
        }
    }
    Err(format!("no `{key}` line in the output"))
}

/// PPL ± err from a base run ("Final estimate: PPL = X +/- Y").
pub fn parse_base(text: &str) -> Result<(f64, f64), String> {
    field(text, "Final estimate: PPL =")
}

/// The summary of a `--kl-divergence` run.
pub fn parse_kld(text: &str) -> Result<KldStats, String> {
    let (ppl, ppl_err) = field(text, "Mean PPL(Q) :")?;
    let (kld, kld_err) = field(text, "Mean KLD:")?;
    let (same_top_pct, same_top_err) = field(text, "Same top p:")?;
    Ok(KldStats {
        ppl,
        ppl_err,
        kld,
        kld_err,
        same_top_pct,
        same_top_err,
    })
}

/// llama-bench `-o json`: one point per test (avg_ts).
pub fn parse_bench(json: &str) -> Result<Vec<BenchPoint>, String> {
    // llama-bench prints only the JSON on stdout, but be lenient about text before it.
    let start = json
        .find('[')
        .ok_or("no JSON array in llama-bench output")?;
    let v: serde_json::Value =
        serde_json::from_str(json[start..].trim()).map_err(|e| format!("llama-bench JSON: {e}"))?;
    let arr = v.as_array().ok_or("llama-bench JSON is not an array")?;
    let mut out = Vec::new();
    for e in arr {
        let int = |k: &str| {
            e.get(k)
                .and_then(|x| x.as_u64())
                .ok_or_else(|| format!("llama-bench JSON entry lacks `{k}`"))
        };
        let (np, ng, depth) = (int("n_prompt")?, int("n_gen")?, int("n_depth")?);
        let t_s = e
            .get("avg_ts")
            .and_then(|x| x.as_f64())
            .ok_or("llama-bench JSON entry lacks `avg_ts`")?;
        if !t_s.is_finite() || t_s <= 0.0 {
            return Err(format!("llama-bench reported {t_s} t/s"));
        }
        let test = match (np, ng) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        };
        out.push(BenchPoint { test, depth, t_s });
    }
    if out.is_empty() {
        return Err("llama-bench returned no results".into());
    }
    Ok(out)
}

/// The line to show for a failed run: the first that looks like an error, else the last
/// non-empty one.
pub fn first_error_line(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let pat = [
        "error",
        "failed",
        "abort",
        "exception",
        "unsupported",
        "cannot",
        "terminate",
    ];
    lines
        .iter()
        .find(|l| {
            // llama.cpp's log level column: "0.00.410.783 E perplexity: ..."
            let mut w = l.split_whitespace();
            let level_e = w.next().is_some_and(|t| t.contains('.')) && w.next() == Some("E");
            let low = l.to_ascii_lowercase();
            level_e || pat.iter().any(|p| low.contains(p))
        })
        .or(lines.last())
        .map(|l| l.chars().take(300).collect())
}

/// What a finished tool run turns into: its parsed value, or the error row's message.
pub fn outcome<T>(
    code: Option<i32>,
    text: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, String> {
    let detail = || first_error_line(text).unwrap_or_else(|| "no output".into());
    match code {
        Some(0) => parse(text).map_err(|e| format!("{e}; output: {}", detail())),
        Some(c) => Err(format!("exit status {c}: {}", detail())),
        None => Err(format!("killed by a signal: {}", detail())),
    }
}

impl Row {
    pub(crate) fn new(p: &Pair, geo: &kv::Geometry) -> Row {
        let bytes = geo.bytes_per_token(p.k, p.v);
        let values = geo.values_per_token();
        Row {
            pair: p.label(),
            k: p.k.name.into(),
            v: p.v.name.into(),
            rotation_disabled: p.norot,
            turbo: p.is_turbo(),
            bits_per_value: bytes as f64 * 8.0 / values.max(1) as f64,
            kv_bytes_per_token: bytes,
            ppl: None,
            ppl_err: None,
            dppl_pct: None,
            kld: None,
            error: None,
            bench: vec![],
            bench_error: None,
            ppl_cmd: None,
            bench_cmd: None,
        }
    }
}

// ---------------------------------------------------------------- running

#[derive(clap::Args, Clone)]
pub struct Options {
    /// .gguf path or known model name; repeat for several (default: smollm2-135m)
    #[arg(short = 'm', long = "model")]
    pub models: Vec<String>,
    /// text file (default: every *.md of vendor/llama.cpp/docs, sorted, concatenated)
    #[arg(short = 'f', long = "file")]
    pub text: Option<PathBuf>,
    /// comma-separated cache pairs: TYPE (K=V), K/V, with -norot to set
    /// LLAMA_ATTN_ROT_DISABLE=1 for that run; f16 is always run first as the base
    #[arg(long, default_value = DEFAULT_PAIRS)]
    pub pairs: String,
    /// context per perplexity chunk
    #[arg(short, long, default_value_t = 512)]
    pub ctx: u64,
    /// chunks of the text to evaluate (default: all; the base logits take about
    /// ctx/2 x n_vocab x 2 bytes per chunk on disk while it runs)
    #[arg(long)]
    pub chunks: Option<u64>,
    #[arg(short, long, default_value_t = 2)]
    pub threads: u32,
    /// also run llama-bench (pp/tg t/s at each depth, CPU) for every pair
    #[arg(long)]
    pub bench: bool,
    /// llama-bench depths (tokens already in the cache)
    #[arg(long, value_delimiter = ',', default_value = "0,4096")]
    pub bench_depths: Vec<u64>,
    /// llama-bench prompt tokens (pp test)
    #[arg(long, default_value_t = 512)]
    pub bench_pp: u64,
    /// llama-bench generated tokens (tg test)
    #[arg(long, default_value_t = 128)]
    pub bench_tg: u64,
    /// small llama-bench sizes for a smoke test: pp64 / tg16
    #[arg(long)]
    pub quick: bool,
    /// output directory (default: results/eval-<model stem>; with several models,
    /// one subdirectory per model)
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// print the JSON on stdout instead of the markdown table
    #[arg(long)]
    pub json: bool,
    /// run every pair but the base on this llama.cpp device (`-ngl 99 --device DEV -lv 4`, e.g.
    /// Vulkan0 or CUDA0, as `llama-perplexity --list-devices` names them); the f16 base stays
    /// on the CPU, so each KLD compares the device's cache with the CPU's f16 one, and an f16
    /// pair in --pairs runs on the device too. llama-bench runs every pair on the device.
    #[arg(long)]
    pub device: Option<String>,
    /// physical batch (`-ub`) of every pair but the base: below 64 each graph is a decode's,
    /// the path a generating server takes (the rotation as one node, the K terms inside flash
    /// attention), where the default batch measures the prefill's
    #[arg(long)]
    pub ubatch: Option<u64>,
}

/// Runs a llama.cpp tool, retrying briefly when the binary is missing or busy (being
/// relinked). Returns the exit code and stdout + stderr.
fn find_tool(name: &str) -> Result<PathBuf, String> {
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(2));
        }
        match models::sibling_tool(name) {
            Ok(p) => return Ok(p),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The command line `run_tool` runs, as a shell would take it (environment first).
pub(crate) fn command_line(name: &str, args: &[OsString], env: &[(&str, &str)]) -> String {
    let exe = models::sibling_tool(name).unwrap_or_else(|_| PathBuf::from(name));
    let quote = |s: &str| {
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./,=:+@%~".contains(c))
        {
            s.to_string()
        } else {
            format!("'{}'", s.replace('\'', "'\\''"))
        }
    };
    env.iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .chain(std::iter::once(quote(&exe.to_string_lossy())))
        .chain(args.iter().map(|a| quote(&a.to_string_lossy())))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn run_tool(
    name: &str,
    args: &[OsString],
    env: &[(&str, &str)],
) -> Result<(Option<i32>, String, String), String> {
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(2));
        }
        let exe = find_tool(name)?;
        let mut cmd = Command::new(&exe);
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        match cmd.output() {
            Ok(o) => {
                return Ok((
                    o.status.code(),
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                ))
            }
            // ENOENT, or ETXTBSY while the linker writes it
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(26) => {
                last = format!("cannot run {}: {e}", exe.display());
            }
            Err(e) => return Err(format!("cannot run {}: {e}", exe.display())),
        }
    }
    Err(last)
}

/// The default text: every *.md under vendor/llama.cpp/docs, sorted by path, joined by "\n".
fn model_stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

pub fn run(mut o: Options) -> Result<ExitCode, String> {
    if o.quick {
        (o.bench_pp, o.bench_tg) = (64, 16);
    }
    let pairs = parse_pairs(&o.pairs)?;
    if o.ctx < 16 {
        return Err("--ctx must be at least 16".into());
    }
    if let Some(n) = o.chunks {
        // llama-perplexity scores the second half of each chunk (ctx/2 - 1 tokens) and prints
        // no KLD summary below 100 scored tokens
        let scored = n * (o.ctx / 2 - 1);
        if scored < 100 {
            return Err(format!(
                "--ctx {} --chunks {n} scores {scored} tokens; llama-perplexity summarizes the \
                 KLD from 100 on: raise --chunks or --ctx",
                o.ctx
            ));
        }
    }
    if let Some(d) = o.device.as_deref().filter(|d| d.is_empty() || *d == "none") {
        return Err(format!(
            "--device {d:?}: name a llama.cpp device such as Vulkan0 or CUDA0 \
             (without --device every run takes llama.cpp's default placement)"
        ));
    }
    if let Some(ub) = o.ubatch {
        if ub == 0 || ub > o.ctx {
            return Err(format!(
                "--ubatch {ub}: must be between 1 and --ctx ({})",
                o.ctx
            ));
        }
    }
    let specs: Vec<Option<&str>> = if o.models.is_empty() {
        vec![None]
    } else {
        o.models.iter().map(|m| Some(m.as_str())).collect()
    };
    find_tool("llama-perplexity")?;
    if o.bench {
        find_tool("llama-bench")?;
    }
    if let Some(d) = &o.device {
        check_device(d)?;
    }
    let paths = specs
        .iter()
        .map(|s| models::resolve(*s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut any_failed = false;
    for path in &paths {
        let stem = model_stem(path);
        let out = match (&o.out, paths.len()) {
            (Some(d), 1) => d.clone(),
            (Some(d), _) => d.join(&stem),
            (None, _) => PathBuf::from("results").join(format!("eval-{stem}")),
        };
        std::fs::create_dir_all(out.join("logs"))
            .map_err(|e| format!("cannot create {}: {e}", out.display()))?;
        let res = eval_model(&o, &pairs, path, &out)?;
        any_failed |= res.rows.iter().any(Row::failed);
        let md = res.markdown();
        let json = serde_json::to_string_pretty(&res).unwrap();
        std::fs::write(out.join("results.md"), &md).map_err(|e| e.to_string())?;
        std::fs::write(out.join("results.json"), &json).map_err(|e| e.to_string())?;
        let plots = plot::write_plots(&res, &out);
        if o.json {
            println!("{json}");
        } else {
            println!("{md}");
        }
        match plots {
            Ok(files) => eprintln!(
                "tq: wrote {}/results.md, results.json{}",
                out.display(),
                files.iter().map(|f| format!(", {f}")).collect::<String>()
            ),
            Err(e) => eprintln!(
                "tq: wrote {}/results.md, results.json; plots skipped: {e}",
                out.display()
            ),
        }
    }
    if any_failed {
        eprintln!("tq: some runs failed (error rows above; logs in <out>/logs/)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The device names in `llama-perplexity --list-devices`' output ("  Vulkan0: llvmpipe ...").
pub fn parse_devices(list: &str) -> Vec<String> {
    list.lines()
        .skip_while(|l| !l.starts_with("Available devices:"))
        .skip(1)
        .filter_map(|l| {
            let name = l.strip_prefix("  ")?.split(": ").next()?.trim();
            // "(none)" where the build has no device
            let ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            ok.then(|| name.to_string())
        })
        .collect()
}

/// `--device DEV` names a device this build of llama.cpp has: said before any run, with what
/// the build lists, rather than as the same error on every row.
fn check_device(dev: &str) -> Result<(), String> {
    let (code, so, se) = run_tool("llama-perplexity", &["--list-devices".into()], &[])?;
    let devs = parse_devices(&so);
    if code != Some(0) || !devs.iter().any(|d| d == dev) {
        return Err(format!(
            "--device {dev}: this build's llama-perplexity lists {}; a Vulkan or CUDA device \
             needs a build with that backend (`cargo build --release --features vulkan`, \
             docs/VULKAN.md; lavapipe also needs GGML_VK_VISIBLE_DEVICES){}",
            if devs.is_empty() {
                "no device".to_string()
            } else {
                devs.join(", ")
            },
            match code {
                Some(0) => String::new(),
                _ => first_error_line(&se)
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default(),
            }
        ));
    }
    Ok(())
}

fn log_name(label: &str) -> String {
    label.replace('/', "_")
}

/// Perplexity and KLD of every pair (f16 first, as the base), then llama-bench when
/// `o.bench` is set.
pub(crate) fn eval_model(
    o: &Options,
    pairs: &[Pair],
    path: &Path,
    out: &Path,
) -> Result<ModelResults, String> {
    run_model(o, pairs, path, out, true)
}

/// llama-bench alone for every pair (f16 first), as `tq eval --bench` runs it.
pub(crate) fn bench_model(
    o: &Options,
    pairs: &[Pair],
    path: &Path,
    out: &Path,
) -> Result<ModelResults, String> {
    run_model(
        &Options {
            bench: true,
            ..o.clone()
        },
        pairs,
        path,
        out,
        false,
    )
}

/// llama-perplexity's arguments for pair `p` (`base`: the f16 run that saves the logits).
/// With `--device` the base runs on the CPU and every other pair on the device; `--ubatch`
/// applies to the pairs, not the base.
fn ppl_args(
    o: &Options,
    model: &Path,
    text: &Path,
    logits: &Path,
    p: &Pair,
    base: bool,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["-m".into(), model.into(), "-f".into(), text.into()];
    for s in [
        "-c".to_string(),
        o.ctx.to_string(),
        "-fa".into(),
        "on".into(),
        "-t".into(),
        o.threads.to_string(),
        // one sequence per batch: the cache serves one sequence, as llama-cli and a
        // one-slot server use it (and the K mean's default frame follows the sequence
        // count, docs/RELIABILITY.md)
        "-b".into(),
        o.ctx.to_string(),
        "-ctk".into(),
        p.k.name.into(),
        "-ctv".into(),
        p.v.name.into(),
    ] {
        a.push(s.into());
    }
    if let Some(n) = o.chunks {
        a.push("--chunks".into());
        a.push(n.to_string().into());
    }
    match (&o.device, base) {
        (Some(_), true) => a.extend(["--device".into(), "none".into()]),
        // -lv 4: the log then says where the cache went and which turbo paths ran there
        (Some(d), false) => a.extend(["-ngl", "99", "--device", d, "-lv", "4"].map(OsString::from)),
        (None, _) => {}
    }
    if let (Some(ub), false) = (o.ubatch, base) {
        a.extend(["-ub".into(), ub.to_string().into()]);
    }
    a.push("--kl-divergence-base".into());
    a.push(logits.into());
    a
}

fn run_model(
    o: &Options,
    pairs: &[Pair],
    path: &Path,
    out: &Path,
    perplexity: bool,
) -> Result<ModelResults, String> {
    let md = gguf::Metadata::read(path).map_err(|e| e.to_string())?;
    // bits per value and bytes per token only: an architecture whose cache `tq memory`
    // does not size still gets the per-layer reading
    let geo = kv::Geometry::from_gguf(&md).or_else(|_| kv::Geometry::plain(&md))?;
    let (text, text_desc) = match &o.text {
        _ if !perplexity => (PathBuf::new(), String::new()),
        Some(t) => {
            if !t.is_file() {
                return Err(format!("no text file {}", t.display()));
            }
            (t.clone(), t.display().to_string())
        }
        None => corpus::docs_corpus(&out.join("corpus.txt"))?,
    };
    let f16 = kv::cache_type("f16")?;
    let base_pair = Pair {
        k: f16,
        v: f16,
        norot: false,
    };
    // f16 is always first (the base run); the others keep the order asked for.
    let mut all = vec![base_pair];
    all.extend(
        pairs
            .iter()
            .filter(|p| !p.is_f16() || o.device.is_some())
            .copied(),
    );
    let mut rows: Vec<Row> = all.iter().map(|p| Row::new(p, &geo)).collect();
    if let Some(d) = &o.device {
        // the base row stays "f16" (the CPU's); the device's rows say where they ran
        for r in rows.iter_mut().skip(1) {
            r.pair = format!("{}@{d}", r.pair);
        }
    }

    let total = all.len() as u64 * (u64::from(perplexity) + u64::from(o.bench));
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
        )
        .unwrap(),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    let stem = model_stem(path);
    let logits = out.join("kld-base.bin");

    let mut base_ppl = None;
    for (i, p) in all.iter().enumerate().filter(|_| perplexity) {
        let label = rows[i].pair.clone();
        pb.set_message(format!("{stem}: perplexity {label}"));
        let mut args = ppl_args(o, path, &text, &logits, p, i == 0);
        if i > 0 {
            args.push("--kl-divergence".into());
        }
        let row = &mut rows[i];
        row.ppl_cmd = Some(command_line("llama-perplexity", &args, &p.env()));
        let res = run_tool("llama-perplexity", &args, &p.env()).and_then(|(code, so, se)| {
            let text = format!("{so}{se}");
            let _ = std::fs::write(
                out.join("logs")
                    .join(format!("ppl-{}.log", log_name(&label))),
                &text,
            );
            if i == 0 {
                outcome(code, &text, parse_base).map(|(ppl, err)| (ppl, err, None))
            } else {
                outcome(code, &text, parse_kld).map(|k| (k.ppl, k.ppl_err, Some(k)))
            }
        });
        match res {
            Ok((ppl, err, kld)) => {
                row.ppl = Some(ppl);
                row.ppl_err = Some(err);
                row.kld = kld;
                if i == 0 {
                    base_ppl = Some(ppl);
                }
                row.dppl_pct = base_ppl.map(|b| (ppl / b - 1.0) * 100.0);
            }
            Err(e) => {
                if i == 0 {
                    // Without base logits no KLD run can work: say so on every row.
                    pb.finish_and_clear();
                    let _ = std::fs::remove_file(&logits);
                    for r in rows.iter_mut() {
                        r.error = Some(format!("base f16 run failed: {e}"));
                    }
                    return Ok(results(o, path, &geo, text_desc, rows));
                }
                row.error = Some(e);
            }
        }
        let r = &rows[i];
        pb.suspend(|| match (&r.error, &r.kld) {
            (Some(e), _) => eprintln!("tq: {stem} {label}: FAILED: {e}"),
            (None, Some(k)) => eprintln!(
                "tq: {stem} {label}: PPL {:.4}, KLD {:.6}, same top {:.2}%",
                k.ppl, k.kld, k.same_top_pct
            ),
            (None, None) => eprintln!(
                "tq: {stem} {label}: PPL {:.4} (base)",
                r.ppl.unwrap_or(f64::NAN)
            ),
        });
        pb.inc(1);
    }
    let _ = std::fs::remove_file(&logits);

    if o.bench {
        let depths = o
            .bench_depths
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        for (i, p) in all.iter().enumerate() {
            let label = rows[i].pair.clone();
            pb.set_message(format!("{stem}: llama-bench {label}"));
            let mut args: Vec<OsString> = vec!["-m".into(), path.into()];
            for s in [
                "-ctk",
                p.k.name,
                "-ctv",
                p.v.name,
                "-fa",
                "1",
                "-t",
                &o.threads.to_string(),
                "-p",
                &o.bench_pp.to_string(),
                "-n",
                &o.bench_tg.to_string(),
                "-d",
                &depths,
                "-r",
                "1",
                "-o",
                "json",
            ] {
                args.push(s.into());
            }
            if let Some(d) = &o.device {
                // every row on the device, the base too: its t/s is what the ratios divide by
                args.extend(["-ngl".into(), "99".into(), "-dev".into(), d.into()]);
            }
            rows[i].bench_cmd = Some(command_line("llama-bench", &args, &p.env()));
            let res = run_tool("llama-bench", &args, &p.env()).and_then(|(code, so, se)| {
                let _ = std::fs::write(
                    out.join("logs")
                        .join(format!("bench-{}.log", log_name(&label))),
                    format!("{so}\n--- stderr ---\n{se}"),
                );
                // the JSON is on stdout; errors are on stderr
                match code {
                    Some(0) => parse_bench(&so).map_err(|e| {
                        format!(
                            "{e}; output: {}",
                            first_error_line(&se).unwrap_or_else(|| "no output".into())
                        )
                    }),
                    _ => outcome(code, &format!("{se}{so}"), parse_bench),
                }
            });
            match res {
                Ok(b) => rows[i].bench = b,
                Err(e) => rows[i].bench_error = Some(e),
            }
            let r = &rows[i];
            pb.suspend(|| match &r.bench_error {
                Some(e) => eprintln!("tq: {stem} {label} bench: FAILED: {e}"),
                None => eprintln!(
                    "tq: {stem} {label} bench: {}",
                    r.bench
                        .iter()
                        .map(|b| format!("{}@{} {:.2} t/s", b.test, b.depth, b.t_s))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(results(o, path, &geo, text_desc, rows))
}

fn results(
    o: &Options,
    path: &Path,
    geo: &kv::Geometry,
    text: String,
    rows: Vec<Row>,
) -> ModelResults {
    ModelResults {
        model: path.to_path_buf(),
        arch: geo.arch.clone(),
        text,
        ctx: o.ctx,
        chunks: o.chunks,
        threads: o.threads,
        bench_depths: if o.bench {
            o.bench_depths.clone()
        } else {
            vec![]
        },
        bench_pp: o.bench_pp,
        bench_tg: o.bench_tg,
        device: o.device.clone(),
        ubatch: o.ubatch,
        rows,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // Captured from `llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f <docs corpus>
    // -c 512 --chunks 2 -fa on -t 2 -b 2048 -ctk f16 -ctv f16 --kl-divergence-base base.bin`.
    const BASE_OUT: &str = "\
0.03.969.309 I perplexity: saving all logits to /tmp/tqe/base.bin
0.03.969.347 I perplexity: tokenizing the input ..
0.04.288.631 I perplexity: tokenization took 319.275 ms
0.04.288.819 I perplexity: calculating perplexity over 2 chunks, n_ctx=512, batch_size=2048, n_seq=4
0.16.393.453 I perplexity: 12.08 seconds per pass - ETA 0.10 minutes
[1]20.1373,[2]19.0639,
0.16.836.012 I Final estimate: PPL = 19.0639 +/- 2.55973


";

    // The same with `-ctk turbo4 -ctv turbo4 --kl-divergence` (summary part).
    const KLD_OUT: &str = "\
0.04.926.597 I kl_divergence: computing over 2 chunks, n_ctx=512, batch_size=2048, n_seq=4
0.24.948.593 I kl_divergence: 20.02 seconds per pass - ETA 0.17 minutes

chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      20.7792 ±    4.1875       0.03138 ±    0.02637       0.06399 ±    0.00564     6.607 ±  0.613 %    85.490 ±  2.210 %
   2      19.9534 ±    2.6605       0.04560 ±    0.02021       0.06520 ±    0.00490     6.742 ±  0.566 %    84.314 ±  1.612 %

====== Perplexity statistics ======
Mean PPL(Q)                   :  19.953420 ±   2.660540
Mean PPL(base)                :  19.063943 ±   2.559727
Cor(ln(PPL(Q)), ln(PPL(base))):  98.86%
Mean ln(PPL(Q)/PPL(base))     :   0.045602 ±   0.020213
Mean PPL(Q)/PPL(base)         :   1.046658 ±   0.021156
Mean PPL(Q)-PPL(base)         :   0.889477 ±   0.406509

====== KL divergence statistics ======
Mean    KLD:   0.065200 ±   0.004899
Maximum KLD:   1.340338
99.9%   KLD:   1.092886
Median  KLD:   0.033715
Minimum KLD:   0.000011

====== Token probability statistics ======
Mean    Δp: -1.274 ± 0.293 %
Maximum Δp: 25.850%
Median  Δp: -0.041%
Minimum Δp: -43.163%
RMS Δp    :  6.742 ± 0.566 %
Same top p: 84.314 ± 1.612 %
";

    // `llama-perplexity ... -ctk turbo9 -ctv turbo4` (exit status 1), first lines.
    const BAD_TYPE_OUT: &str = "\
error while handling argument \"-ctk\": Unsupported cache type: turbo9 (valid: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, turbo2, turbo3, turbo4)

usage:
-ctk,  --cache-type-k TYPE              KV cache data type for K
";

    // `llama-bench -m SmolLM2 -ctk turbo4 -ctv turbo4 -fa 1 -t 2 -p 64 -n 16 -d 0,128 -r 1
    // -o json`: the depth-0 pp entry and the depth-128 tg entry, verbatim.
    const BENCH_JSON: &str = r#"[
  {
    "build_commit": "3287d47",
    "build_number": 7,
    "cpu_info": "Intel(R) Xeon(R) Processor @ 2.80GHz",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/root/.cache/turboquant/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "turbo4",
    "type_v": "turbo4",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": 1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 64,
    "n_gen": 0,
    "n_depth": 0,
    "test_time": "2026-11-29T13:08:28Z",
    "avg_ns": 1351875394,
    "stddev_ns": 0,
    "avg_ts": 47.341641,
    "stddev_ts": 0.000000,
    "samples_ns": [ 1351875394 ],
    "samples_ts": [ 47.3416 ]
  },
  {
    "build_commit": "3287d47",
    "build_number": 7,
    "cpu_info": "Intel(R) Xeon(R) Processor @ 2.80GHz",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/root/.cache/turboquant/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "turbo4",
    "type_v": "turbo4",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": 1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 0,
    "n_gen": 16,
    "n_depth": 128,
    "test_time": "2026-11-29T13:08:45Z",
    "avg_ns": 40888110526,
    "stddev_ns": 0,
    "avg_ts": 0.391312,
    "stddev_ts": 0.000000,
    "samples_ns": [ 40888110526 ],
    "samples_ts": [ 0.391312 ]
  }
]
"#;

    #[test]
    fn parses_base_ppl() {
        assert_eq!(parse_base(BASE_OUT).unwrap(), (19.0639, 2.55973));
    }

    #[test]
    fn parses_kld_summary() {
        let k = parse_kld(KLD_OUT).unwrap();
        assert_eq!(
            k,
            KldStats {
                ppl: 19.953420,
                ppl_err: 2.660540,
                kld: 0.065200,
                kld_err: 0.004899,
                same_top_pct: 84.314,
                same_top_err: 1.612,
            }
        );
    }

    #[test]
    fn kld_parse_failures_are_errors() {
        // a base-run output has no KLD summary
        let e = parse_kld(BASE_OUT).unwrap_err();
        assert!(e.contains("Mean PPL(Q)"), "{e}");
        // NaN is a failure, not a number
        let nan = KLD_OUT.replace("0.065200 ±", "nan ±");
        let e = parse_kld(&nan).unwrap_err();
        assert!(e.contains("non-finite") && e.contains("KLD"), "{e}");
        let e = parse_base("Final estimate: PPL = nan +/- nan").unwrap_err();
        assert!(e.contains("non-finite"), "{e}");
    }

    #[test]
    fn parses_bench_json() {
        let b = parse_bench(BENCH_JSON).unwrap();
        assert_eq!(
            b,
            vec![
                BenchPoint {
                    test: "pp64".into(),
                    depth: 0,
                    t_s: 47.341641
                },
                BenchPoint {
                    test: "tg16".into(),
                    depth: 128,
                    t_s: 0.391312
                },
            ]
        );
        assert!(parse_bench("[]").is_err());
        assert!(parse_bench("not json").is_err());
    }

    #[test]
    fn pair_specs() {
        let p = parse_pairs(DEFAULT_PAIRS).unwrap();
        let labels: Vec<String> = p.iter().map(Pair::label).collect();
        assert_eq!(
            labels,
            [
                "f16",
                "q8_0",
                "q4_0",
                "q4_0-norot",
                "turbo4",
                "turbo3",
                "turbo2",
                "turbo4/turbo3",
                "turbo4/turbo2",
                "q8_0/turbo3"
            ]
        );
        assert!(p[0].is_f16() && !p[2].norot && p[3].norot);
        assert_eq!(p[3].env(), vec![("LLAMA_ATTN_ROT_DISABLE", "1")]);
        assert!(p[2].env().is_empty());
        let q = parse_pairs(" turbo4/turbo2 , turbo4/turbo2,q8_0/turbo3-norot").unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!((q[0].k.name, q[0].v.name), ("turbo4", "turbo2"));
        assert!(q[1].norot && q[1].is_turbo() && q[1].label() == "q8_0/turbo3-norot");
    }

    #[test]
    fn bad_pair_specs_name_the_valid_types() {
        for bad in [
            "turbo9",
            "turbo4/turbo9",
            "a/b/c",
            "turbo4,,q8_0",
            "f16-rot",
        ] {
            let e = parse_pairs(bad).unwrap_err();
            if bad.contains(",,") {
                assert!(e.contains("empty pair"), "{e}");
                continue;
            }
            assert!(
                e.contains("turbo2") && e.contains("turbo4") && e.contains("q8_0"),
                "{bad}: {e}"
            );
        }
        let e = parse_pairs("a/b/c").unwrap_err();
        assert!(e.contains("`a/b/c`") && e.contains("K/V"), "{e}");
        let e = parse_pairs("turbo9").unwrap_err();
        assert!(e.contains("`turbo9`"), "{e}");
    }

    #[test]
    fn failed_runs_become_error_rows_with_the_first_error_line() {
        // non-zero exit: the first error-looking line
        let e = outcome(Some(1), BAD_TYPE_OUT, parse_kld).unwrap_err();
        assert!(
            e.starts_with("exit status 1: error while handling argument \"-ctk\": Unsupported cache type: turbo9"),
            "{e}"
        );
        // exit 0 but nothing to parse
        let e = outcome(Some(0), "loading model\nsomething odd", parse_kld).unwrap_err();
        assert!(
            e.contains("Mean PPL(Q)") && e.contains("something odd"),
            "{e}"
        );
        // no output at all (e.g. not a GGUF)
        let e = outcome(Some(1), "", parse_base).unwrap_err();
        assert_eq!(e, "exit status 1: no output");
        // llama.cpp can exit 0 after an error log line ("E" level)
        let e = outcome(
            Some(0),
            "0.00.395.738 I cmn          init: llama threadpool init, n_threads = 2\n\
             0.00.410.783 E perplexity: the data file you provided tokenizes to only 2 tokens\n\
             0.00.410.790 I done\n",
            parse_base,
        )
        .unwrap_err();
        assert!(e.ends_with("output: 0.00.410.783 E perplexity: the data file you provided tokenizes to only 2 tokens"), "{e}");
        let e = outcome(None, "Segmentation fault", parse_base).unwrap_err();
        assert!(e.contains("signal") && e.contains("Segmentation"), "{e}");
        assert!(outcome(Some(0), KLD_OUT, parse_kld).is_ok());
    }

    fn geo() -> kv::Geometry {
        // SmolLM2-135M: 30 layers, 3 KV heads, head 64
        kv::Geometry::uniform("llama", &[3; 30], 64, 64)
    }

    pub(crate) fn sample(bench: bool) -> ModelResults {
        let pairs = parse_pairs("f16,turbo4").unwrap();
        let g = geo();
        let mut rows: Vec<Row> = pairs.iter().map(|p| Row::new(p, &g)).collect();
        rows[0].ppl = Some(19.0639);
        rows[0].ppl_err = Some(2.55973);
        rows[0].dppl_pct = Some(0.0);
        let k = parse_kld(KLD_OUT).unwrap();
        rows[1].ppl = Some(k.ppl);
        rows[1].ppl_err = Some(k.ppl_err);
        rows[1].dppl_pct = Some((k.ppl / 19.0639 - 1.0) * 100.0);
        rows[1].kld = Some(k);
        let mut failed = Row::new(&parse_pairs("q4_0-norot").unwrap()[0], &g);
        failed.error = Some(outcome(Some(1), BAD_TYPE_OUT, parse_kld).unwrap_err());
        rows.push(failed);
        if bench {
            rows[0].bench = vec![
                BenchPoint {
                    test: "pp512".into(),
                    depth: 0,
                    t_s: 100.0,
                },
                BenchPoint {
                    test: "tg128".into(),
                    depth: 0,
                    t_s: 20.0,
                },
            ];
            rows[1].bench = vec![
                BenchPoint {
                    test: "pp512".into(),
                    depth: 0,
                    t_s: 90.0,
                },
                BenchPoint {
                    test: "tg128".into(),
                    depth: 0,
                    t_s: 19.0,
                },
            ];
            rows[2].bench_error = Some("exit status 1: boom | pipe".into());
        }
        ModelResults {
            model: "m.gguf".into(),
            arch: "llama".into(),
            text: "t.txt".into(),
            ctx: 512,
            chunks: Some(2),
            threads: 2,
            bench_depths: if bench { vec![0] } else { vec![] },
            bench_pp: 512,
            bench_tg: 128,
            device: None,
            ubatch: None,
            rows,
        }
    }

    /// `llama-perplexity --list-devices` of a Vulkan build on lavapipe, and of a CPU build.
    #[test]
    fn parses_device_lists() {
        let vk = "Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (24105 MiB, 18143 MiB free)\n";
        assert_eq!(parse_devices(vk), vec!["Vulkan0".to_string()]);
        let two = "noise\nAvailable devices:\n  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80500 MiB free)\n  \
                   RPC0: 127.0.0.1:50052 (1000 MiB, 900 MiB free)\n";
        assert_eq!(
            parse_devices(two),
            vec!["CUDA0".to_string(), "RPC0".to_string()]
        );
        assert!(parse_devices("Available devices:\n  (none)\n").is_empty());
        assert!(parse_devices("").is_empty());
    }

    /// The base on the CPU, every other pair on the device at the asked -ub; nothing of
    /// either without the options.
    #[test]
    fn device_and_ubatch_go_to_the_pairs_not_the_base() {
        // the results matrix's options (ctx 512, 2 chunks), neither option set
        let mut o = crate::results_file::eval_options(512, 2, None);
        let pairs = parse_pairs("f16,turbo4/turbo3").unwrap();
        let args = |o: &Options, p: &Pair, base: bool| {
            ppl_args(
                o,
                Path::new("m.gguf"),
                Path::new("t.txt"),
                Path::new("b.bin"),
                p,
                base,
            )
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
        };
        let plain = args(&o, &pairs[1], false);
        assert!(
            !plain.contains("--device") && !plain.contains("-ub") && !plain.contains("-ngl"),
            "{plain}"
        );
        o.device = Some("Vulkan0".into());
        o.ubatch = Some(8);
        let base = args(&o, &pairs[0], true);
        assert!(
            base.contains(" --device none ") && !base.contains("-ub") && !base.contains("-ngl"),
            "{base}"
        );
        let pair = args(&o, &pairs[1], false);
        assert!(pair.contains(" -ctk turbo4 -ctv turbo3 "), "{pair}");
        assert!(
            pair.contains(" -ngl 99 --device Vulkan0 -lv 4 -ub 8 --kl-divergence-base b.bin"),
            "{pair}"
        );
    }

    #[test]
    fn markdown_names_the_device_and_ubatch() {
        let mut r = sample(false);
        assert!(r
            .markdown()
            .lines()
            .next()
            .unwrap()
            .ends_with("2 chunks, 2 threads"));
        r.device = Some("Vulkan0".into());
        r.ubatch = Some(8);
        r.rows[1].pair = "turbo4@Vulkan0".into();
        let md = r.markdown();
        assert!(
            md.starts_with("## m.gguf — ctx 512, 2 chunks, 2 threads, pairs on Vulkan0 (the f16 base on the CPU), pairs at -ub 8\n"),
            "{md}"
        );
        assert!(
            md.contains("\n| f16 (base) |") && md.contains("\n| turbo4@Vulkan0 |"),
            "{md}"
        );
    }

    #[test]
    fn markdown_keeps_error_rows() {
        let r = sample(false);
        let md = r.markdown();
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(lines.len(), 2 + 3, "{md}");
        assert!(
            lines[2].starts_with("| f16 (base) | 16.00 | 23040 |"),
            "{md}"
        );
        assert!(lines[3].starts_with("| turbo4 | 4.25 | 6120 | 19.9534 ± 2.6605 | +4.67% | 0.065200 ± 0.004899 | 84.31 ± 1.61 |"), "{md}");
        assert!(
            lines[4].contains("q4_0-norot")
                && lines[4].contains("**ERROR**: exit status 1: error while handling argument"),
            "{md}"
        );
        // every row has the header's column count
        let n = lines[0].split('|').count();
        assert!(lines.iter().all(|l| l.split('|').count() == n), "{md}");
        assert!(r.rows.iter().any(Row::failed));
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["rows"][2]["error"]
            .as_str()
            .unwrap()
            .contains("turbo9"));
    }

    #[test]
    fn markdown_bench_columns_and_ratios() {
        let md = sample(true).markdown();
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert!(
            lines[0].ends_with("| pp512 @0 t/s | tg128 @0 t/s |"),
            "{md}"
        );
        assert!(
            lines[3].ends_with("| 90.00 (0.90x) | 19.00 (0.95x) |"),
            "{md}"
        );
        assert!(
            lines[4].contains("**BENCH ERROR**: exit status 1: boom \\| pipe"),
            "{md}"
        );
        // escaped pipes aside, every row has the header's column count
        let n = lines[0].split('|').count();
        assert!(
            lines
                .iter()
                .all(|l| l.replace("\\|", "").split('|').count() == n),
            "{md}"
        );
    }
}
