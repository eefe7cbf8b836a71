//! `tq results`: one fixed, named matrix of measurements (quality, speed, memory) from the
//! default build, kept in `docs/results.json` and rendered into `docs/RESULTS.md` and the
//! README's results block. The measurements go through `tq eval`'s runner (eval.rs); a
//! partial run (`--only`, `--models`, `--ctx`, `--texts`) replaces only the entries it
//! measured, keyed by (section, model, text, ctx, pair, test, depth), and keeps the rest.
//! Every number carries the run that made it (date, commit, machine, load) and the exact
//! command line of the tool that printed it.

use crate::eval::{self, Pair};
use crate::results::Row;
use crate::{corpus, gguf, kv, models};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

// ---------------------------------------------------------------- the matrix

/// The models (name `tq fetch` knows, the name tables show).
pub const MODELS: &[(&str, &str)] = &[
    ("smollm2-135m", "SmolLM2-135M"),
    ("gemma3-270m", "Gemma-3-270M"),
];
/// Models measured for quality only, where a turbo cache meets what breaks other caches
/// (tq fetch makes them from a model above: models::DERIVED). Not in the README's table or
/// the speed and memory sections: the same network as their base, so the same speed and size.
pub const STRESS_MODELS: &[(&str, &str)] = &[(
    "smollm2-135m-k100b",
    "SmolLM2-135M with massive K channels (x100 and a K bias)",
)];
/// Every model of the quality section, the matrix's first.
fn quality_models() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    MODELS.iter().chain(STRESS_MODELS)
}
/// The texts: the docs text the tests use, and a held-out one from the same pinned tree.
pub const TEXTS: &[(&str, &str)] = &[
    (
        "docs",
        "every *.md under vendor/llama.cpp/docs, sorted by path (the default of `tq eval` and the text the tests use)",
    ),
    (
        "tools",
        "held out: every vendor/llama.cpp/tools/*/README.md, sorted by path (upstream's tool manuals; no setting here was chosen on it)",
    ),
];
/// The text the README's quality table shows.
pub const README_TEXT: &str = "tools";
pub const QUALITY_PAIRS: &str = "f16,q8_0,q4_0,turbo4,turbo4/turbo3,turbo3,turbo2,turbo3_tcq";
/// The quality contexts.
pub const CTXS: &[u64] = &[512, 4096, 8192];
/// Context per chunk and chunks of the text, per model: SmolLM2 4096 tokens at 512 and 8192
/// at 4096 and 8192; Gemma, about twice the compute per token (its 262k-token vocabulary),
/// half as many at 512 and 4096, so that the matrix stays near two hours on 2 cores. The
/// massive-K SmolLM2 at the two contexts (issue 38: 512 and 4096), as its base.
pub const CTX_CHUNKS: &[(&str, &[(u64, u64)])] = &[
    ("smollm2-135m", &[(512, 8), (4096, 2), (8192, 1)]),
    ("gemma3-270m", &[(512, 4), (4096, 1), (8192, 1)]),
    ("smollm2-135m-k100b", &[(512, 8), (4096, 2)]),
];

fn ctx_chunks(model: &str) -> &'static [(u64, u64)] {
    CTX_CHUNKS
        .iter()
        .find(|c| c.0 == model)
        .map_or(&[], |c| c.1)
}
pub const SPEED_PAIRS: &str = "f16,q8_0,turbo4/turbo3,turbo3";
/// llama-bench depths; 16384 is left out: its prefill before every test costs minutes per
/// pair on 2 cores.
pub const SPEED_DEPTHS: &[u64] = &[0, 4096];
pub const BENCH_PP: u64 = 512;
pub const BENCH_TG: u64 = 128;
pub const MEMORY_CTX: u64 = 32768;
pub const THREADS: u32 = 2;

pub const JSON_PATH: &str = "docs/results.json";
pub const MD_PATH: &str = "docs/RESULTS.md";
pub const README_PATH: &str = "README.md";
pub const BEGIN: &str = "<!-- results:begin -->";
pub const END: &str = "<!-- results:end -->";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Section {
    Quality,
    Speed,
    Memory,
}

impl Section {
    fn name(self) -> &'static str {
        match self {
            Section::Quality => "quality",
            Section::Speed => "speed",
            Section::Memory => "memory",
        }
    }
}

// ---------------------------------------------------------------- the file

/// One invocation of `tq results` that measured something.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// the start time, UTC (also the run's key)
    pub id: String,
    pub command: String,
    pub commit: String,
    /// tracked files other than the results differed from the commit
    pub dirty: bool,
    pub cpu: String,
    pub cores: usize,
    pub load_start: f64,
    pub load_end: Option<f64>,
    /// how the tools were built
    pub build: String,
    /// llama.cpp's `system_info` line (the ggml CPU features compiled in)
    pub system_info: Option<String>,
    /// the Rust codec's SIMD level
    pub codec_simd: String,
    pub sections: Vec<String>,
    pub wall_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    pub model: String,
    pub text: String,
    pub ctx: u64,
    pub chunks: u64,
    pub pair: String,
    pub bits_per_value: f64,
    pub ppl: Option<f64>,
    pub ppl_err: Option<f64>,
    /// PPL / PPL of f16 on the same model, text and ctx
    pub ppl_ratio: Option<f64>,
    pub kld: Option<f64>,
    pub kld_err: Option<f64>,
    pub same_top_pct: Option<f64>,
    pub same_top_err: Option<f64>,
    pub error: Option<String>,
    pub how: String,
    pub run: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Speed {
    pub model: String,
    pub pair: String,
    /// "pp512", "tg128"; "*" for a failed llama-bench run
    pub test: String,
    pub depth: u64,
    pub t_s: Option<f64>,
    pub error: Option<String>,
    pub how: String,
    pub run: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub model: String,
    pub ctx: u64,
    pub pair: String,
    /// each `llama_kv_cache: size = X MiB` llama.cpp logged (full-context, then window cache)
    pub caches_mib: Vec<f64>,
    pub mib: Option<f64>,
    /// what `tq memory` computes for the same context, MiB
    pub tq_memory_mib: Option<f64>,
    pub error: Option<String>,
    pub how: String,
    pub run: String,
}

/// Wall time of one group of runs (one model, text and ctx; one model's memory or speed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub key: String,
    pub wall_s: f64,
    pub run: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Doc {
    pub runs: Vec<RunInfo>,
    pub quality: Vec<Quality>,
    pub speed: Vec<Speed>,
    pub memory: Vec<Memory>,
    pub timings: Vec<Timing>,
    /// per section: why it holds no numbers of this revision
    pub notes: BTreeMap<String, String>,
    /// docs/CI.md's timings table, copied when the file was last written
    pub ci_table: Vec<String>,
}

fn pos<T: PartialEq>(list: impl IntoIterator<Item = T>, x: T) -> usize {
    list.into_iter().position(|y| y == x).unwrap_or(usize::MAX)
}
fn model_pos(m: &str) -> usize {
    pos(quality_models().map(|m| m.0), m)
}
fn text_pos(t: &str) -> usize {
    pos(TEXTS.iter().map(|t| t.0), t)
}
fn pair_labels(spec: &str) -> Vec<String> {
    eval::parse_pairs(spec)
        .expect("the matrix's pairs parse")
        .iter()
        .map(Pair::label)
        .collect()
}
fn pair_pos(spec: &str, p: &str) -> usize {
    pos(pair_labels(spec).iter().map(String::as_str), p)
}
fn model_title(m: &str) -> &str {
    quality_models().find(|x| x.0 == m).map_or(m, |x| x.1)
}

impl Quality {
    fn key(&self) -> (usize, usize, u64, usize, String) {
        (
            model_pos(&self.model),
            text_pos(&self.text),
            self.ctx,
            pair_pos(QUALITY_PAIRS, &self.pair),
            format!("{}|{}|{}", self.model, self.text, self.pair),
        )
    }
}
impl Speed {
    fn key(&self) -> (usize, usize, String, u64, String) {
        (
            model_pos(&self.model),
            pair_pos(SPEED_PAIRS, &self.pair),
            self.test.clone(),
            self.depth,
            format!("{}|{}", self.model, self.pair),
        )
    }
}
impl Memory {
    fn key(&self) -> (usize, u64, usize, String) {
        (
            model_pos(&self.model),
            self.ctx,
            pair_pos(QUALITY_PAIRS, &self.pair),
            format!("{}|{}", self.model, self.pair),
        )
    }
}

/// `old` with every entry whose key is in `new` replaced, sorted in the matrix's order.
fn merge_list<T: Clone, K: Ord>(old: &[T], new: &[T], key: impl Fn(&T) -> K) -> Vec<T> {
    let mut out: Vec<T> = old
        .iter()
        .filter(|o| !new.iter().any(|n| key(n) == key(o)))
        .cloned()
        .collect();
    out.extend(new.iter().cloned());
    out.sort_by_key(|x| key(x));
    out
}

impl Doc {
    /// Merges a (partial) run into this file: entries with the same key are replaced, a
    /// section the run measured loses its note, a note the run made replaces the old one,
    /// and runs no entry refers to any more are dropped.
    pub fn merge(&mut self, new: &Doc) {
        self.quality = merge_list(&self.quality, &new.quality, Quality::key);
        // a (model, pair) llama-bench run replaces every figure (or error) of the old one
        self.speed.retain(|o| {
            !new.speed
                .iter()
                .any(|n| n.model == o.model && n.pair == o.pair)
        });
        self.speed = merge_list(&self.speed, &new.speed, Speed::key);
        self.memory = merge_list(&self.memory, &new.memory, Memory::key);
        self.timings = merge_list(&self.timings, &new.timings, |t| t.key.clone());
        for (s, present) in [
            ("quality", !new.quality.is_empty()),
            ("speed", !new.speed.is_empty()),
            ("memory", !new.memory.is_empty()),
        ] {
            if present {
                self.notes.remove(s);
            }
        }
        for (k, v) in &new.notes {
            self.notes.insert(k.clone(), v.clone());
        }
        for r in &new.runs {
            self.runs.retain(|o| o.id != r.id);
            self.runs.push(r.clone());
        }
        if !new.ci_table.is_empty() {
            self.ci_table = new.ci_table.clone();
        }
        let used: Vec<&str> = self
            .quality
            .iter()
            .map(|q| q.run.as_str())
            .chain(self.speed.iter().map(|s| s.run.as_str()))
            .chain(self.memory.iter().map(|m| m.run.as_str()))
            .chain(self.timings.iter().map(|t| t.run.as_str()))
            .collect();
        let noted: Vec<&str> = new.runs.iter().map(|r| r.id.as_str()).collect();
        self.runs
            .retain(|r| used.contains(&r.id.as_str()) || noted.contains(&r.id.as_str()));
        self.runs.sort_by(|a, b| a.id.cmp(&b.id));
    }

    /// The cells of the matrix this file has no number for.
    pub fn unmeasured(&self) -> Vec<String> {
        let mut out = Vec::new();
        let qpairs = pair_labels(QUALITY_PAIRS);
        for (m, _) in quality_models() {
            for (t, _) in TEXTS {
                for (ctx, _) in ctx_chunks(m) {
                    let have = qpairs
                        .iter()
                        .filter(|p| {
                            self.quality.iter().any(|q| {
                                q.model == *m
                                    && q.text == *t
                                    && q.ctx == *ctx
                                    && &q.pair == *p
                                    && q.error.is_none()
                            })
                        })
                        .count();
                    if have < qpairs.len() {
                        out.push(format!(
                            "quality: {m}, {t} text, ctx {ctx} ({} of {} pairs measured)",
                            have,
                            qpairs.len()
                        ));
                    }
                }
            }
        }
        let spairs = pair_labels(SPEED_PAIRS);
        for (m, _) in MODELS {
            let want = spairs.len() * SPEED_DEPTHS.len() * 2;
            let have = self
                .speed
                .iter()
                .filter(|s| s.model == *m && s.t_s.is_some())
                .count();
            if have < want {
                out.push(format!(
                    "speed: {m} ({have} of {want} llama-bench figures){}",
                    self.notes
                        .get("speed")
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default()
                ));
            }
        }
        for (m, _) in MODELS {
            let have = qpairs
                .iter()
                .filter(|p| {
                    self.memory
                        .iter()
                        .any(|x| x.model == *m && &x.pair == *p && x.mib.is_some())
                })
                .count();
            if have < qpairs.len() {
                out.push(format!(
                    "memory: {m}, ctx {MEMORY_CTX} ({have} of {} pairs measured)",
                    qpairs.len()
                ));
            }
        }
        out
    }
}

// ---------------------------------------------------------------- rendering

fn f(x: Option<f64>, prec: usize) -> String {
    x.map_or("—".into(), |v| format!("{v:.prec$}"))
}

fn cell_escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn run_short(doc: &Doc, id: &str) -> String {
    match doc.runs.iter().position(|r| r.id == id) {
        Some(i) => format!("R{}", i + 1),
        None => "?".into(),
    }
}

/// docs/RESULTS.md, entirely from the JSON.
pub fn render_md(doc: &Doc) -> String {
    let mut s = String::new();
    s += "# Results\n\n";
    s += &format!("<!-- generated from {JSON_PATH} by `tq results`: do not edit; re-measure with `tq results [--only quality|speed|memory] [--models ...] [--ctx ...]`, re-render with `tq results --readme` -->\n\n");
    s += "Every headline number of the project, measured by one command from the default build \
          (`cargo build --release`; `tq results`, crates/tq/src/results_file.rs) and merged into \
          `docs/results.json` by section and key, so a part can be re-measured on its own. Each \
          number names the run that made it (R1, R2, ... below: date, commit, machine, load) and \
          its exact tool command is under [How](#how). The hand-written, dated history is \
          [JOURNAL.md](JOURNAL.md).\n\n";

    s += "## Runs\n\n";
    if doc.runs.is_empty() {
        s += "None yet.\n\n";
    } else {
        s += "| run | date (UTC) | commit | CPU | cores | load start → end | sections | wall |\n|---|---|---|---|---:|---|---|---:|\n";
        for (i, r) in doc.runs.iter().enumerate() {
            s += &format!(
                "| R{} | {} | {}{} | {} | {} | {:.2} → {} | {} | {} |\n",
                i + 1,
                r.id,
                r.commit,
                if r.dirty {
                    " (+ uncommitted changes)"
                } else {
                    ""
                },
                cell_escape(&r.cpu),
                r.cores,
                r.load_start,
                f(r.load_end, 2),
                r.sections.join(", "),
                r.wall_s
                    .map_or("unfinished".into(), |w| format!("{:.0} min", w / 60.0)),
            );
        }
        s += "\n";
        for (i, r) in doc.runs.iter().enumerate() {
            s += &format!(
                "- R{}: `{}`; build: {}; codec SIMD: {}; llama.cpp system_info: {}\n",
                i + 1,
                r.command,
                r.build,
                r.codec_simd,
                r.system_info.as_deref().unwrap_or("not logged")
            );
        }
        s += "\n";
    }

    s += "## The matrix\n\n";
    s += &format!(
        "- Models: {}. For quality only: {}, made by `tq fetch` from its base with \
         scripts/transform_gguf.py (every q.k unchanged; [FAMILIES.md](FAMILIES.md)).\n",
        MODELS
            .iter()
            .map(|(n, t)| format!("{t} (`{n}`)"))
            .collect::<Vec<_>>()
            .join(", "),
        STRESS_MODELS
            .iter()
            .map(|(n, t)| format!("{t} (`{n}`)"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (n, d) in TEXTS {
        s += &format!("- Text `{n}`: {d}.\n");
    }
    s += &format!(
        "- Quality: llama-perplexity, {THREADS} threads, flash attention on, one sequence per \
         batch (`-b` = ctx); f16 saves the base logits, every other pair runs \
         `--kl-divergence` against them. Pairs (K/V; one name: K = V): {}. Context × chunks \
         (the text's first chunks): {}.\n",
        pair_labels(QUALITY_PAIRS).join(", "),
        CTX_CHUNKS
            .iter()
            .map(|(m, cs)| format!(
                "{} {}",
                model_title(m),
                cs.iter()
                    .map(|(c, n)| format!("{c} × {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    s += &format!(
        "- Speed: llama-bench pp{BENCH_PP} and tg{BENCH_TG} at depths {}, {THREADS} threads, \
         `-fa 1`, one repetition, pairs {}. Depth 16384 is not in the matrix (its prefill before \
         each test costs minutes per pair on 2 cores).\n",
        SPEED_DEPTHS
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        pair_labels(SPEED_PAIRS).join(", ")
    );
    s += &format!(
        "- Memory: the `llama_kv_cache: size = ...` lines llama-perplexity logs for `-c \
         {MEMORY_CTX}` (it stops after allocating: the text is one line), every quality pair, \
         next to `tq memory`'s figure.\n"
    );
    let (np, nt) = (pair_labels(QUALITY_PAIRS).len(), TEXTS.len());
    let per_model: Vec<(&str, u64, usize)> = quality_models()
        .map(|(m, _)| {
            let cs = ctx_chunks(m);
            (
                model_title(m),
                cs.iter().map(|(c, n)| c * n).sum::<u64>(),
                cs.len(),
            )
        })
        .collect();
    let runs: usize = per_model.iter().map(|x| np * nt * x.2).sum();
    let tokens: u64 = per_model.iter().map(|x| (np * nt) as u64 * x.1).sum();
    s += &format!(
        "- The full matrix is {runs} llama-perplexity runs ({}k tokens through the models: {np} \
         pairs × {nt} texts × {}), {} llama-bench and {} memory runs. The chunk counts aim at \
         about 2 hours on 2 idle cores for the first two models, an estimate: SmolLM2's 4096 × \
         2 runs took about a minute each in an earlier measurement ([JOURNAL.md](JOURNAL.md): \
         5m37s for five), 512 × 8 about half that, 8192 × 1 about as long as 4096 × 2 plus its \
         longer attention, and Gemma costs about twice as much a token. Measured wall times per \
         group (they include the machine's other load: see the runs' load):",
        tokens / 1000,
        per_model
            .iter()
            .map(|(t, n, _)| format!("{n} tokens on {t}"))
            .collect::<Vec<_>>()
            .join(", "),
        pair_labels(SPEED_PAIRS).len() * MODELS.len(),
        np * MODELS.len()
    );
    if doc.timings.is_empty() {
        s += " none yet.\n\n";
    } else {
        s += "\n\n| group | wall | run |\n|---|---:|---|\n";
        for t in &doc.timings {
            s += &format!(
                "| {} | {:.1} min | {} |\n",
                t.key,
                t.wall_s / 60.0,
                run_short(doc, &t.run)
            );
        }
        s += "\n";
    }

    s += "## Unmeasured in this revision\n\n";
    let un = doc.unmeasured();
    if un.is_empty() {
        s += "Nothing: every cell of the matrix has a number.\n\n";
    } else {
        for u in &un {
            s += &format!("- {u}\n");
        }
        s += "\n";
    }

    s += "## Quality\n\n";
    if let Some(n) = doc.notes.get("quality") {
        s += &format!("{n}\n\n");
    }
    s += "Mean KLD against the f16 cache's logits (± its standard error), PPL and its ratio to \
          f16's, and how often the top token is f16's. CPU.\n\n";
    let mut groups: Vec<(&str, &str, u64, u64)> = doc
        .quality
        .iter()
        .map(|q| (q.model.as_str(), q.text.as_str(), q.ctx, q.chunks))
        .collect();
    groups.dedup();
    for (m, t, ctx, chunks) in &groups {
        s += &format!(
            "### {}, `{t}` text, ctx {ctx} × {chunks} chunks\n\n",
            model_title(m)
        );
        s += "| cache K/V | bits/value | PPL | PPL / f16 | mean KLD | same top % | run |\n|---|---:|---:|---:|---:|---:|---|\n";
        for q in doc
            .quality
            .iter()
            .filter(|q| q.model == *m && q.text == *t && q.ctx == *ctx)
        {
            if let Some(e) = &q.error {
                s += &format!(
                    "| {} | {:.2} | **error**: {} | | | | {} |\n",
                    q.pair,
                    q.bits_per_value,
                    cell_escape(e),
                    run_short(doc, &q.run)
                );
                continue;
            }
            s += &format!(
                "| {} | {:.2} | {} ± {} | {} | {} | {} | {} |\n",
                q.pair,
                q.bits_per_value,
                f(q.ppl, 4),
                f(q.ppl_err, 4),
                f(q.ppl_ratio, 4),
                match (q.kld, q.kld_err) {
                    (Some(k), Some(e)) => format!("{k:.5} ± {e:.5}"),
                    _ => "— (base)".into(),
                },
                match (q.same_top_pct, q.same_top_err) {
                    (Some(p), Some(e)) => format!("{p:.2} ± {e:.2}"),
                    _ => "—".into(),
                },
                run_short(doc, &q.run)
            );
        }
        s += "\n";
    }

    s += "## Speed\n\n";
    if let Some(n) = doc.notes.get("speed") {
        s += &format!("{n}\n\n");
    } else if doc.speed.is_empty() {
        s += "Not measured yet.\n\n";
    }
    let mut models: Vec<&str> = doc.speed.iter().map(|x| x.model.as_str()).collect();
    models.dedup();
    for m in models {
        s += &speed_table(
            doc,
            m,
            &format!(
                "### {}, CPU, {THREADS} threads\n\nt/s (× f16's at the same test and depth)",
                model_title(m)
            ),
        );
    }

    s += "## Memory\n\n";
    if let Some(n) = doc.notes.get("memory") {
        s += &format!("{n}\n\n");
    }
    let mut models: Vec<&str> = doc.memory.iter().map(|x| x.model.as_str()).collect();
    models.dedup();
    if !models.is_empty() {
        s += &format!(
            "KV cache at `-c {MEMORY_CTX}`, one sequence, as llama.cpp logs it (MiB; a \
             sliding-window model logs the full-context cache and the window cache), its ratio \
             to f16, and `tq memory`'s figure.\n\n| cache K/V |"
        );
        for m in &models {
            s += &format!(" {} | × f16 | tq memory |", model_title(m));
        }
        s += "\n|---|";
        s += &"---:|---:|---:|".repeat(models.len());
        s += "\n";
        for p in pair_labels(QUALITY_PAIRS) {
            if !doc.memory.iter().any(|x| x.pair == p) {
                continue;
            }
            s += &format!("| {p} |");
            for m in &models {
                let x = doc.memory.iter().find(|x| x.model == *m && x.pair == p);
                let base = doc
                    .memory
                    .iter()
                    .find(|x| x.model == *m && x.pair == "f16")
                    .and_then(|x| x.mib);
                match x {
                    Some(x) if x.error.is_none() => {
                        let parts = if x.caches_mib.len() > 1 {
                            format!(
                                " ({})",
                                x.caches_mib
                                    .iter()
                                    .map(|c| format!("{c:.2}"))
                                    .collect::<Vec<_>>()
                                    .join(" + ")
                            )
                        } else {
                            String::new()
                        };
                        s += &format!(
                            " {}{parts} | {} | {} |",
                            f(x.mib, 2),
                            match (x.mib, base) {
                                (Some(a), Some(b)) => format!("{:.3}", a / b),
                                _ => "—".into(),
                            },
                            f(x.tq_memory_mib, 2)
                        );
                    }
                    Some(x) => {
                        s += &format!(
                            " **error**: {} | | |",
                            cell_escape(x.error.as_deref().unwrap_or(""))
                        )
                    }
                    None => s += " — | | |",
                }
            }
            s += "\n";
        }
        s += "\n";
    }

    s += "## Build and CI time\n\n";
    if doc.ci_table.is_empty() {
        s += "Not recorded: docs/CI.md has no timings table.\n\n";
    } else {
        s += "Copied from [CI.md](CI.md)'s timings table when this file was written (not measured by `tq results`):\n\n";
        for l in &doc.ci_table {
            s += l;
            s += "\n";
        }
        s += "\n";
    }

    s += "## How\n\nEach number's tool command, as run (paths relative to the repository, `~` \
          the home directory). Under target/results-work/, `text-docs.txt` and `text-tools.txt` are the \
          two texts as described above, `one-line.txt` holds `The quick brown fox.` and each \
          group's `kld-base.bin` (the f16 logits) is deleted after the group.\n\n";
    for (m, t, ctx, _) in &groups {
        s += &format!("Quality, {m}, `{t}`, ctx {ctx}:\n\n");
        for q in doc
            .quality
            .iter()
            .filter(|q| q.model == *m && q.text == *t && q.ctx == *ctx)
        {
            s += &format!("    {}\n", q.how);
        }
        s += "\n";
    }
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for x in &doc.speed {
        if !seen.contains(&(x.model.as_str(), x.pair.as_str())) {
            if seen.is_empty() {
                s += "Speed:\n\n";
            }
            seen.push((&x.model, &x.pair));
            s += &format!("    {}\n", x.how);
        }
    }
    if !seen.is_empty() {
        s += "\n";
    }
    if !doc.memory.is_empty() {
        s += &format!(
            "Memory (the `tq memory` column is what `tq memory -m MODEL -c {MEMORY_CTX}` \
             computes from the GGUF's metadata, in the same process):\n\n"
        );
        for x in &doc.memory {
            s += &format!("    {}\n", x.how);
        }
        s += "\n";
    }
    s
}

fn speed_table(doc: &Doc, m: &str, title: &str) -> String {
    let mut cols: Vec<(String, u64)> = Vec::new();
    for t in [format!("tg{BENCH_TG}"), format!("pp{BENCH_PP}")] {
        for &d in SPEED_DEPTHS {
            cols.push((t.clone(), d));
        }
    }
    for x in doc.speed.iter().filter(|x| x.model == m && x.test != "*") {
        if !cols.contains(&(x.test.clone(), x.depth)) {
            cols.push((x.test.clone(), x.depth));
        }
    }
    let mut s = format!("{title}:\n\n| cache K/V |");
    for (t, d) in &cols {
        s += &format!(" {t} @ {d} |");
    }
    s += "\n|---|";
    s += &"---:|".repeat(cols.len());
    s += "\n";
    let mut pairs: Vec<&str> = doc
        .speed
        .iter()
        .filter(|x| x.model == m)
        .map(|x| x.pair.as_str())
        .collect();
    pairs.dedup();
    for p in pairs {
        s += &format!("| {p} |");
        if let Some(e) = doc
            .speed
            .iter()
            .find(|x| x.model == m && x.pair == p && x.test == "*")
        {
            s += &format!(
                " **error**: {} |{}\n",
                cell_escape(e.error.as_deref().unwrap_or("")),
                " |".repeat(cols.len() - 1)
            );
            continue;
        }
        for (t, d) in &cols {
            let get = |pair: &str| {
                doc.speed
                    .iter()
                    .find(|x| x.model == m && x.pair == pair && &x.test == t && x.depth == *d)
                    .and_then(|x| x.t_s)
            };
            s += &match (get(p), get("f16")) {
                (Some(v), Some(b)) => format!(" {v:.2} ({:.2}x) |", v / b),
                (Some(v), None) => format!(" {v:.2} |"),
                _ => " — |".into(),
            };
        }
        s += "\n";
    }
    s + "\n"
}

/// The README's results block (between BEGIN and END), from the JSON.
pub fn render_readme(doc: &Doc) -> String {
    let mut s = format!("{BEGIN}\n<!-- generated from {JSON_PATH} by `tq results --readme` (measured by `tq results`): edit crates/tq/src/results_file.rs, not this block -->\n");
    let text = README_TEXT;
    let mut cols: Vec<(&str, u64)> = Vec::new();
    for (m, _) in MODELS {
        for ctx in CTXS {
            if doc
                .quality
                .iter()
                .any(|q| q.model == *m && q.text == text && q.ctx == *ctx && q.error.is_none())
            {
                cols.push((m, *ctx));
            }
        }
    }
    let runs = |ids: Vec<&str>| {
        let mut r: Vec<String> = doc
            .runs
            .iter()
            .filter(|r| ids.contains(&r.id.as_str()))
            .map(|r| format!("{} at {}", &r.id[..r.id.len().min(10)], r.commit))
            .collect();
        r.dedup();
        r.join(", ")
    };
    if cols.is_empty() {
        s += "**Quality.** Not measured in this revision ([docs/RESULTS.md](docs/RESULTS.md)).\n\n";
    } else {
        let used: Vec<&str> = doc
            .quality
            .iter()
            .filter(|q| q.text == text)
            .map(|q| q.run.as_str())
            .collect();
        s += &format!(
            "**Quality.** Mean KLD against an f16 cache (PPL ratio to f16), CPU, flash attention, the held-out \
             text (llama.cpp's tools/*/README.md); {} ([docs/RESULTS.md](docs/RESULTS.md): \
             both texts, ± errors, commands):\n\n| cache K/V | bits/value |",
            runs(used)
        );
        for (m, ctx) in &cols {
            s += &format!(" {}, {ctx} |", model_title(m));
        }
        s += "\n|---|---:|";
        s += &"---:|".repeat(cols.len());
        s += "\n";
        for p in pair_labels(QUALITY_PAIRS) {
            let find = |m: &str, ctx: u64| {
                doc.quality
                    .iter()
                    .find(|q| q.model == m && q.text == text && q.ctx == ctx && q.pair == p)
            };
            let Some(bits) = cols
                .iter()
                .find_map(|(m, c)| find(m, *c))
                .map(|q| q.bits_per_value)
            else {
                continue;
            };
            let name = if p.starts_with("turbo") {
                format!("**{p}**")
            } else {
                p.clone()
            };
            s += &format!("| {name} | {bits:.2} |");
            for (m, ctx) in &cols {
                s += &match find(m, *ctx) {
                    Some(q) if q.error.is_some() => " error |".into(),
                    Some(q) => match (q.kld, q.ppl_ratio, q.ppl) {
                        (Some(k), Some(r), _) => format!(" {k:.4} (×{r:.3}) |"),
                        (None, _, Some(ppl)) => format!(" PPL {ppl:.2} |"),
                        _ => " — |".into(),
                    },
                    None => " — |".into(),
                };
            }
            s += "\n";
        }
        s += "\n";
    }
    let m = MODELS[0].0;
    if doc.speed.iter().any(|x| x.model == m && x.t_s.is_some()) {
        let used: Vec<&str> = doc
            .speed
            .iter()
            .filter(|x| x.model == m)
            .map(|x| x.run.as_str())
            .collect();
        s += &speed_table(
            doc,
            m,
            &format!(
                "**Speed.** llama-bench t/s (× f16), {}, CPU, {THREADS} threads; {}",
                model_title(m),
                runs(used)
            ),
        );
    } else {
        s += &format!(
            "**Speed.** {} ([docs/RESULTS.md](docs/RESULTS.md)).\n\n",
            doc.notes
                .get("speed")
                .map_or("Not measured in this revision", |n| n.trim_end_matches('.'))
        );
    }
    s += END;
    s
}

/// `readme` with its results block replaced by `block`.
pub fn splice(readme: &str, block: &str) -> Result<String, String> {
    let a = readme
        .find(BEGIN)
        .ok_or_else(|| format!("{README_PATH} has no {BEGIN} line"))?;
    let b = readme[a..]
        .find(END)
        .map(|i| a + i + END.len())
        .ok_or_else(|| format!("{README_PATH} has no {END} line after {BEGIN}"))?;
    Ok(format!("{}{block}{}", &readme[..a], &readme[b..]))
}

/// docs/CI.md's timings table: the `|` lines after `## Timings`.
pub fn ci_table(ci_md: &str) -> Vec<String> {
    let Some(at) = ci_md.find("## Timings") else {
        return vec![];
    };
    ci_md[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------- running

#[derive(clap::Args)]
pub struct Options {
    /// measure only these sections (comma-separated; default: all)
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// models of the matrix to measure (comma-separated; default: smollm2-135m,gemma3-270m and,
    /// for quality only, smollm2-135m-k100b)
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// quality contexts to measure (comma-separated; default: 512,4096,8192)
    #[arg(long, value_delimiter = ',')]
    pub ctx: Vec<u64>,
    /// quality texts to measure (comma-separated; default: docs,tools)
    #[arg(long, value_delimiter = ',')]
    pub texts: Vec<String>,
    /// leave the speed section unmeasured (with a note naming the load) when the 1-minute
    /// load average is above this
    #[arg(long, default_value_t = 2.5)]
    pub max_load: f64,
    /// measure nothing: render docs/RESULTS.md and the README's block from docs/results.json
    #[arg(long)]
    pub readme: bool,
    /// repository root (default: the repository of this executable)
    #[arg(long)]
    pub root: Option<PathBuf>,
}

fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn git(root: &Path, args: &[&str]) -> Option<(bool, String)> {
    let o = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    Some((
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).trim().to_string(),
    ))
}

/// UTC "YYYY-MM-DDTHH:MM:SSZ" (days to civil date: Howard Hinnant's algorithm).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Paths in a command line relative to the repository, the home directory as `~`.
fn tidy(cmd: &str, root: &Path) -> String {
    let mut s = cmd.to_string();
    if let Ok(r) = root.canonicalize() {
        s = s.replace(&format!("{}/", r.display()), "");
    }
    s = s.replace(&format!("{}/", root.display()), "");
    if let Some(h) = std::env::var_os("HOME") {
        let h = h.to_string_lossy();
        if !h.is_empty() && h != "/" {
            s = s.replace(h.as_ref(), "~");
        }
    }
    s
}

fn system_info(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        l.split_once("system_info: ")
            .map(|(_, v)| v.trim().to_string())
    })
}

struct Ctx<'a> {
    root: &'a Path,
    work: PathBuf,
    run: RunInfo,
    /// everything this run measured so far
    mine: Doc,
    /// the file as last written
    doc: Doc,
}

impl Ctx<'_> {
    /// Merges `new` and everything this run measured before into the file as it is on disk
    /// now (another `tq results` may have written it meanwhile: parts can be measured in
    /// parallel), and writes the JSON, RESULTS.md and the README block.
    fn commit(&mut self, new: Doc) -> Result<(), String> {
        self.mine.merge(&new);
        self.mine.runs = vec![self.run.clone()];
        self.mine.ci_table =
            ci_table(&std::fs::read_to_string(self.root.join("docs/CI.md")).unwrap_or_default());
        if let Ok(now) = read_doc(self.root) {
            self.doc = now;
        }
        self.doc.merge(&self.mine);
        write_all(self.root, &self.doc)
    }
}

fn read_doc(root: &Path) -> Result<Doc, String> {
    let p = root.join(JSON_PATH);
    match std::fs::read_to_string(&p) {
        Ok(s) => serde_json::from_str(&s).map_err(|e| format!("{}: {e}", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Doc::default()),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

fn write_all(root: &Path, doc: &Doc) -> Result<(), String> {
    let w = |p: &str, s: &str| {
        std::fs::write(root.join(p), s).map_err(|e| format!("cannot write {p}: {e}"))
    };
    // the JSON through a rename: a parallel run never reads half a file
    let tmp = format!("{JSON_PATH}.{}.tmp", std::process::id());
    w(&tmp, &(serde_json::to_string_pretty(doc).unwrap() + "\n"))?;
    std::fs::rename(root.join(&tmp), root.join(JSON_PATH))
        .map_err(|e| format!("cannot write {JSON_PATH}: {e}"))?;
    w(MD_PATH, &render_md(doc))?;
    let readme = std::fs::read_to_string(root.join(README_PATH))
        .map_err(|e| format!("cannot read {README_PATH}: {e}"))?;
    w(README_PATH, &splice(&readme, &render_readme(doc))?)
}

pub fn run(o: Options) -> Result<ExitCode, String> {
    let root = match &o.root {
        Some(r) => r.clone(),
        None => corpus::repo_root().ok_or("cannot find the repository (pass --root)")?,
    };
    let doc = read_doc(&root)?;
    if o.readme {
        write_all(&root, &doc)?;
        eprintln!("tq: wrote {MD_PATH} and the results block of {README_PATH} from {JSON_PATH}");
        return Ok(ExitCode::SUCCESS);
    }
    for m in &o.models {
        if model_pos(m) == usize::MAX {
            return Err(format!(
                "--models: `{m}` is not in the matrix (valid: {})",
                quality_models().map(|m| m.0).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    for t in &o.texts {
        if text_pos(t) == usize::MAX {
            return Err(format!(
                "--texts: `{t}` is not in the matrix (valid: docs, tools)"
            ));
        }
    }
    for c in &o.ctx {
        if !CTXS.contains(c) {
            return Err(format!(
                "--ctx: {c} is not in the matrix (valid: 512, 4096, 8192)"
            ));
        }
    }
    let sections: Vec<Section> = if o.only.is_empty() {
        vec![Section::Quality, Section::Memory, Section::Speed]
    } else {
        let mut s = o.only.clone();
        s.sort();
        s.dedup();
        s
    };
    let pick = |m: &&str| o.models.is_empty() || o.models.iter().any(|x| x == m);
    let models: Vec<&str> = MODELS.iter().map(|m| m.0).filter(pick).collect();
    // the stress models too, for quality only
    let quality_only: Vec<&str> = quality_models().map(|m| m.0).filter(pick).collect();
    let (ok, commit) = git(&root, &["rev-parse", "--short=10", "HEAD"]).unwrap_or_default();
    let dirty = git(
        &root,
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!docs/RESULTS.md",
            ":!docs/results.json",
            ":!README.md",
        ],
    )
    .is_some_and(|(ok, out)| ok && !out.is_empty());
    let run = RunInfo {
        id: utc_now(),
        command: std::iter::once("tq".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        commit: if ok { commit } else { "unknown".into() },
        dirty,
        cpu: cpu_model(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_start: load_avg(),
        load_end: None,
        build: format!(
            "cargo --release, default features; llama.cpp CMake Release, GGML_NATIVE=ON \
             (-march=native) without AMX (-mno-amx-*), CPU backend{}",
            if cfg!(feature = "llama") {
                ""
            } else {
                " (tq without the llama feature)"
            }
        ),
        system_info: None,
        codec_simd: format!("{:?}", turboquant_codec::kernels::simd_level()).to_lowercase(),
        sections: sections.iter().map(|s| s.name().to_string()).collect(),
        wall_s: None,
    };
    // one scratch directory per run, so that runs can go in parallel
    let work = root
        .join("target/results-work")
        .join(run.id.replace(':', ""));
    std::fs::create_dir_all(work.join("logs"))
        .map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let mut cx = Ctx {
        root: &root,
        work,
        run,
        mine: Doc::default(),
        doc,
    };
    let t0 = Instant::now();
    cx.commit(Doc::default())?;
    let mut failed = false;
    for s in &sections {
        failed |= match s {
            Section::Quality => quality(&mut cx, &quality_only, &o)?,
            Section::Memory => memory(&mut cx, &models)?,
            Section::Speed => speed(&mut cx, &models, o.max_load)?,
        };
    }
    cx.run.load_end = Some(load_avg());
    cx.run.wall_s = Some(t0.elapsed().as_secs_f64());
    cx.commit(Doc::default())?;
    for u in cx.doc.unmeasured() {
        eprintln!("tq: unmeasured: {u}");
    }
    eprintln!("tq: wrote {JSON_PATH}, {MD_PATH} and the results block of {README_PATH}");
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub(crate) fn eval_options(ctx: u64, chunks: u64, text: Option<PathBuf>) -> eval::Options {
    eval::Options {
        models: vec![],
        text,
        pairs: QUALITY_PAIRS.into(),
        ctx,
        chunks: Some(chunks),
        threads: THREADS,
        bench: false,
        bench_depths: SPEED_DEPTHS.to_vec(),
        bench_pp: BENCH_PP,
        bench_tg: BENCH_TG,
        quick: false,
        out: None,
        json: false,
        device: None,
        ubatch: None,
    }
}

fn quality(cx: &mut Ctx, models: &[&str], o: &Options) -> Result<bool, String> {
    let pairs = eval::parse_pairs(QUALITY_PAIRS)?;
    let mut failed = false;
    for m in models {
        let path = models::resolve(Some(m))?;
        for (t, _) in TEXTS
            .iter()
            .filter(|t| o.texts.is_empty() || o.texts.iter().any(|x| x == t.0))
        {
            let text = cx.work.join(format!("text-{t}.txt"));
            match *t {
                "docs" => corpus::docs_corpus(&text)?,
                _ => corpus::tools_corpus(&text)?,
            };
            for &(ctx, chunks) in ctx_chunks(m)
                .iter()
                .filter(|c| o.ctx.is_empty() || o.ctx.contains(&c.0))
            {
                let t0 = Instant::now();
                let out = cx.work.join(format!("{m}-{t}-{ctx}"));
                std::fs::create_dir_all(out.join("logs")).map_err(|e| e.to_string())?;
                let eo = eval_options(ctx, chunks, Some(text.clone()));
                let res = eval::eval_model(&eo, &pairs, &path, &out)?;
                if cx.run.system_info.is_none() {
                    cx.run.system_info = std::fs::read_to_string(out.join("logs/ppl-f16.log"))
                        .ok()
                        .and_then(|l| system_info(&l));
                }
                let base = res.rows.first().and_then(|r| r.ppl);
                let mut new = Doc::default();
                for r in &res.rows {
                    failed |= r.failed();
                    new.quality
                        .push(quality_entry(cx, m, t, ctx, chunks, r, base));
                }
                new.timings.push(Timing {
                    key: format!("quality {m} {t} {ctx}"),
                    wall_s: t0.elapsed().as_secs_f64(),
                    run: cx.run.id.clone(),
                });
                cx.commit(new)?;
                eprintln!(
                    "tq: quality {m} {t} ctx {ctx}: {:.1} min, merged into {JSON_PATH}",
                    t0.elapsed().as_secs_f64() / 60.0
                );
            }
        }
    }
    Ok(failed)
}

fn quality_entry(
    cx: &Ctx,
    m: &str,
    t: &str,
    ctx: u64,
    chunks: u64,
    r: &Row,
    base: Option<f64>,
) -> Quality {
    Quality {
        model: m.into(),
        text: t.into(),
        ctx,
        chunks,
        pair: r.pair.clone(),
        bits_per_value: r.bits_per_value,
        ppl: r.ppl,
        ppl_err: r.ppl_err,
        ppl_ratio: r.ppl.zip(base).map(|(p, b)| p / b),
        kld: r.kld.map(|k| k.kld),
        kld_err: r.kld.map(|k| k.kld_err),
        same_top_pct: r.kld.map(|k| k.same_top_pct),
        same_top_err: r.kld.map(|k| k.same_top_err),
        error: r.error.clone(),
        how: tidy(r.ppl_cmd.as_deref().unwrap_or("not run"), cx.root),
        run: cx.run.id.clone(),
    }
}

/// The MiB of each `llama_kv_cache: size = X MiB ...` line.
pub fn kv_cache_mib(log: &str) -> Vec<f64> {
    log.lines()
        .filter_map(|l| l.split_once("llama_kv_cache: size =").map(|x| x.1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

fn memory(cx: &mut Ctx, models: &[&str]) -> Result<bool, String> {
    let pairs = eval::parse_pairs(QUALITY_PAIRS)?;
    let one_line = cx.work.join("one-line.txt");
    std::fs::write(&one_line, "The quick brown fox.\n").map_err(|e| e.to_string())?;
    let mut failed = false;
    for m in models {
        let t0 = Instant::now();
        let path = models::resolve(Some(m))?;
        let md = gguf::Metadata::read(&path).map_err(|e| e.to_string())?;
        let lay = kv::Geometry::from_gguf(&md).and_then(|g| {
            g.layout(&kv::CtxParams {
                n_ctx: MEMORY_CTX,
                ..Default::default()
            })
        });
        let mut new = Doc::default();
        for p in &pairs {
            let mut args: Vec<OsString> = vec!["-m".into(), path.clone().into()];
            args.push("-f".into());
            args.push(one_line.clone().into());
            let ctx = MEMORY_CTX.to_string();
            let threads = THREADS.to_string();
            for a in [
                "-c", &ctx, "-t", &threads, "-fa", "on", "-fit", "off", "-v", "-ctk", p.k.name,
                "-ctv", p.v.name,
            ] {
                args.push(a.into());
            }
            let how = tidy(&eval::command_line("llama-perplexity", &args, &[]), cx.root);
            let (mib, caches, error) = match eval::run_tool("llama-perplexity", &args, &[]) {
                Ok((_, so, se)) => {
                    let log = format!("{so}{se}");
                    let _ = std::fs::write(
                        cx.work
                            .join("logs")
                            .join(format!("memory-{m}-{}.log", p.label().replace('/', "_"))),
                        &log,
                    );
                    if cx.run.system_info.is_none() {
                        cx.run.system_info = system_info(&log);
                    }
                    let c = kv_cache_mib(&log);
                    if c.is_empty() {
                        let e = eval::first_error_line(&log).unwrap_or_else(|| "no output".into());
                        (None, c, Some(format!("no llama_kv_cache size line: {e}")))
                    } else {
                        (Some(c.iter().sum::<f64>()), c, None)
                    }
                }
                Err(e) => (None, vec![], Some(e)),
            };
            failed |= error.is_some();
            eprintln!(
                "tq: memory {m} {}: {}",
                p.label(),
                mib.map_or_else(
                    || error.clone().unwrap_or_default(),
                    |x| format!("{x:.2} MiB")
                )
            );
            new.memory.push(Memory {
                model: m.to_string(),
                ctx: MEMORY_CTX,
                pair: p.label(),
                caches_mib: caches,
                mib,
                tq_memory_mib: lay
                    .as_ref()
                    .ok()
                    .map(|l| l.kv_bytes(p.k, p.v) as f64 / (1024.0 * 1024.0)),
                error,
                how,
                run: cx.run.id.clone(),
            });
        }
        new.timings.push(Timing {
            key: format!("memory {m} {MEMORY_CTX}"),
            wall_s: t0.elapsed().as_secs_f64(),
            run: cx.run.id.clone(),
        });
        cx.commit(new)?;
    }
    Ok(failed)
}

fn speed(cx: &mut Ctx, models: &[&str], max_load: f64) -> Result<bool, String> {
    let load = load_avg();
    if load.is_nan() || load > max_load {
        let mut new = Doc::default();
        new.notes.insert(
            "speed".into(),
            format!(
                "Not measured in this revision: machine loaded (load {load:.2}, above {max_load})."
            ),
        );
        cx.commit(new)?;
        eprintln!("tq: speed not measured: load {load:.2} is above --max-load {max_load}");
        return Ok(false);
    }
    let pairs = eval::parse_pairs(SPEED_PAIRS)?;
    let mut failed = false;
    for m in models {
        let t0 = Instant::now();
        let path = models::resolve(Some(m))?;
        let out = cx.work.join(format!("{m}-speed"));
        std::fs::create_dir_all(out.join("logs")).map_err(|e| e.to_string())?;
        let eo = eval_options(512, 1, None);
        let res = eval::bench_model(&eo, &pairs, &path, &out)?;
        let mut new = Doc::default();
        for r in &res.rows {
            let how = tidy(r.bench_cmd.as_deref().unwrap_or("not run"), cx.root);
            if let Some(e) = &r.bench_error {
                failed = true;
                new.speed.push(Speed {
                    model: m.to_string(),
                    pair: r.pair.clone(),
                    test: "*".into(),
                    depth: 0,
                    t_s: None,
                    error: Some(e.clone()),
                    how: how.clone(),
                    run: cx.run.id.clone(),
                });
            }
            for b in &r.bench {
                new.speed.push(Speed {
                    model: m.to_string(),
                    pair: r.pair.clone(),
                    test: b.test.clone(),
                    depth: b.depth,
                    t_s: Some(b.t_s),
                    error: None,
                    how: how.clone(),
                    run: cx.run.id.clone(),
                });
            }
        }
        new.timings.push(Timing {
            key: format!("speed {m}"),
            wall_s: t0.elapsed().as_secs_f64(),
            run: cx.run.id.clone(),
        });
        cx.commit(new)?;
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str) -> RunInfo {
        RunInfo {
            id: id.into(),
            command: "tq results".into(),
            commit: "abc1234567".into(),
            dirty: false,
            cpu: "Some CPU @ 2.80GHz".into(),
            cores: 2,
            load_start: 1.5,
            load_end: Some(2.0),
            build: "release".into(),
            system_info: Some("CPU : AVX2 = 1".into()),
            codec_simd: "avx2".into(),
            sections: vec!["quality".into()],
            wall_s: Some(600.0),
        }
    }

    fn q(model: &str, text: &str, ctx: u64, pair: &str, kld: Option<f64>, run: &str) -> Quality {
        Quality {
            model: model.into(),
            text: text.into(),
            ctx,
            chunks: 8,
            pair: pair.into(),
            bits_per_value: if pair == "f16" { 16.0 } else { 4.25 },
            ppl: Some(10.0),
            ppl_err: Some(0.5),
            ppl_ratio: Some(if kld.is_some() { 1.01 } else { 1.0 }),
            kld,
            kld_err: kld.map(|_| 0.001),
            same_top_pct: kld.map(|_| 95.0),
            same_top_err: kld.map(|_| 0.5),
            error: None,
            how: format!("target/release/llama-perplexity -c {ctx} -ctk {pair}"),
            run: run.into(),
        }
    }

    fn doc_with(quality: Vec<Quality>, run_id: &str) -> Doc {
        Doc {
            runs: vec![run(run_id)],
            quality,
            ..Doc::default()
        }
    }

    #[test]
    fn merge_replaces_by_key_and_keeps_the_rest() {
        let r1 = "2026-12-05T10:00:00Z";
        let r2 = "2026-12-06T10:00:00Z";
        let mut d = doc_with(
            vec![
                q("smollm2-135m", "docs", 512, "f16", None, r1),
                q("smollm2-135m", "docs", 512, "turbo4", Some(0.02), r1),
                q("smollm2-135m", "tools", 512, "turbo4", Some(0.03), r1),
            ],
            r1,
        );
        d.notes.insert("speed".into(), "not measured".into());
        // a partial re-run of one cell, out of the matrix's order
        let new = doc_with(
            vec![
                q("smollm2-135m", "docs", 512, "turbo4", Some(0.01), r2),
                q("gemma3-270m", "docs", 512, "f16", None, r2),
                q("smollm2-135m", "docs", 4096, "q8_0", Some(0.001), r2),
            ],
            r2,
        );
        d.merge(&new);
        let got: Vec<(&str, &str, u64, &str, Option<f64>)> = d
            .quality
            .iter()
            .map(|q| {
                (
                    q.model.as_str(),
                    q.text.as_str(),
                    q.ctx,
                    q.pair.as_str(),
                    q.kld,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("smollm2-135m", "docs", 512, "f16", None),
                ("smollm2-135m", "docs", 512, "turbo4", Some(0.01)),
                ("smollm2-135m", "docs", 4096, "q8_0", Some(0.001)),
                ("smollm2-135m", "tools", 512, "turbo4", Some(0.03)),
                ("gemma3-270m", "docs", 512, "f16", None),
            ]
        );
        // both runs still made numbers; the speed note stays (no speed measured)
        assert_eq!(
            d.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            [r1, r2]
        );
        assert_eq!(d.notes["speed"], "not measured");
        // merging is idempotent
        let once = d.clone();
        d.merge(&new);
        assert_eq!(d, once);

        // a run whose numbers are all replaced goes; a measured section loses its note
        let r3 = "2026-12-07T10:00:00Z";
        let mut all = once.clone();
        let mut new = doc_with(
            once.quality
                .iter()
                .map(|x| Quality {
                    run: r3.into(),
                    ..x.clone()
                })
                .collect(),
            r3,
        );
        new.speed.push(Speed {
            model: "smollm2-135m".into(),
            pair: "f16".into(),
            test: "tg128".into(),
            depth: 0,
            t_s: Some(50.0),
            error: None,
            how: "llama-bench".into(),
            run: r3.into(),
        });
        all.merge(&new);
        assert_eq!(all.runs.len(), 1);
        assert_eq!(all.runs[0].id, r3);
        assert!(all.notes.is_empty());
        assert_eq!(all.quality.len(), 5);
    }

    #[test]
    fn speed_merge_replaces_a_failed_pair_run() {
        let r1 = "2026-12-05T10:00:00Z";
        let sp = |test: &str, t_s: Option<f64>| Speed {
            model: "smollm2-135m".into(),
            pair: "turbo3".into(),
            test: test.into(),
            depth: 0,
            t_s,
            error: t_s.is_none().then(|| "boom".to_string()),
            how: "llama-bench".into(),
            run: r1.into(),
        };
        let mut d = Doc {
            runs: vec![run(r1)],
            speed: vec![sp("*", None)],
            ..Doc::default()
        };
        d.merge(&Doc {
            runs: vec![run(r1)],
            speed: vec![sp("pp512", Some(100.0)), sp("tg128", Some(20.0))],
            ..Doc::default()
        });
        let tests: Vec<&str> = d.speed.iter().map(|s| s.test.as_str()).collect();
        assert_eq!(tests, ["pp512", "tg128"]);
    }

    fn sample() -> Doc {
        let r1 = "2026-12-05T10:00:00Z";
        let mut d = Doc::default();
        let mut new = doc_with(
            vec![
                q("smollm2-135m", "tools", 512, "f16", None, r1),
                q("smollm2-135m", "tools", 512, "q4_0", Some(0.07), r1),
                q("smollm2-135m", "tools", 512, "turbo4", Some(0.02), r1),
                q("smollm2-135m", "tools", 4096, "turbo4", Some(0.025), r1),
                q("smollm2-135m", "docs", 512, "turbo4", Some(0.03), r1),
            ],
            r1,
        );
        new.notes.insert(
            "speed".into(),
            "Not measured in this revision: machine loaded (load 5.00, above 2.5).".into(),
        );
        new.memory.push(Memory {
            model: "gemma3-270m".into(),
            ctx: MEMORY_CTX,
            pair: "f16".into(),
            caches_mib: vec![96.0, 15.0],
            mib: Some(111.0),
            tq_memory_mib: Some(111.0),
            error: None,
            how: "target/release/llama-perplexity -c 32768".into(),
            run: r1.into(),
        });
        new.ci_table = vec![
            "| run | total |".into(),
            "|---|---|".into(),
            "| x | 1 s |".into(),
        ];
        d.merge(&new);
        d
    }

    #[test]
    fn renders_the_markdown_and_the_readme_block() {
        let d = sample();
        let md = render_md(&d);
        assert!(md.contains("| R1 | 2026-12-05T10:00:00Z | abc1234567 | Some CPU @ 2.80GHz | 2 | 1.50 → 2.00 | quality | 10 min |"), "{md}");
        assert!(
            md.contains("### SmolLM2-135M, `tools` text, ctx 512 × 8 chunks"),
            "{md}"
        );
        assert!(
            md.contains("| turbo4 | 4.25 | 10.0000 ± 0.5000 | 1.0100 | 0.02000 ± 0.00100 | 95.00 ± 0.50 | R1 |"),
            "{md}"
        );
        assert!(
            md.contains("| f16 | 16.00 | 10.0000 ± 0.5000 | 1.0000 | — (base) | — | R1 |"),
            "{md}"
        );
        assert!(md.contains("machine loaded (load 5.00"), "{md}");
        assert!(
            md.contains("| f16 | 111.00 (96.00 + 15.00) | 1.000 | 111.00 |"),
            "{md}"
        );
        assert!(md.contains("| x | 1 s |"), "{md}");
        assert!(
            md.contains("    target/release/llama-perplexity -c 4096 -ctk turbo4"),
            "{md}"
        );
        // what is missing is named
        assert!(
            md.contains("- quality: gemma3-270m, docs text, ctx 8192 (0 of 8 pairs measured)"),
            "{md}"
        );
        assert!(
            md.contains("- quality: smollm2-135m, tools text, ctx 512 (3 of 8 pairs measured)"),
            "{md}"
        );
        assert!(
            md.contains("- speed: smollm2-135m (0 of 16 llama-bench figures): Not measured"),
            "{md}"
        );
        assert!(
            md.contains("- memory: gemma3-270m, ctx 32768 (1 of 8 pairs measured)"),
            "{md}"
        );

        let b = render_readme(&d);
        assert!(b.starts_with(BEGIN) && b.ends_with(END), "{b}");
        let rows: Vec<&str> = b.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows[0],
            "| cache K/V | bits/value | SmolLM2-135M, 512 | SmolLM2-135M, 4096 |"
        );
        assert_eq!(rows[2], "| f16 | 16.00 | PPL 10.00 | — |");
        assert_eq!(rows[3], "| q4_0 | 4.25 | 0.0700 (×1.010) | — |");
        assert_eq!(
            rows[4],
            "| **turbo4** | 4.25 | 0.0200 (×1.010) | 0.0250 (×1.010) |"
        );
        assert_eq!(rows.len(), 5, "{b}");
        assert!(b.contains("Not measured in this revision: machine loaded (load 5.00, above 2.5) ([docs/RESULTS.md]"), "{b}");
        // splicing replaces exactly the block
        let readme = format!("# x\n\n{BEGIN}\nold\n{END}\n\nafter\n");
        let new = splice(&readme, &b).unwrap();
        assert_eq!(new, format!("# x\n\n{b}\n\nafter\n"));
        assert_eq!(splice(&new, &b).unwrap(), new);
        assert!(splice("no block", &b).is_err());

        // an empty file renders too, naming everything as unmeasured
        let e = Doc::default();
        assert!(render_md(&e)
            .contains("- quality: smollm2-135m, docs text, ctx 512 (0 of 8 pairs measured)"));
        assert!(render_readme(&e).contains("Not measured in this revision"));
    }

    #[test]
    fn speed_table_ratios() {
        let r1 = "2026-12-05T10:00:00Z";
        let sp = |pair: &str, test: &str, depth: u64, t_s: f64| Speed {
            model: "smollm2-135m".into(),
            pair: pair.into(),
            test: test.into(),
            depth,
            t_s: Some(t_s),
            error: None,
            how: format!("llama-bench -ctk {pair}"),
            run: r1.into(),
        };
        let mut d = Doc::default();
        d.merge(&Doc {
            runs: vec![run(r1)],
            speed: vec![
                sp("f16", "tg128", 0, 40.0),
                sp("f16", "tg128", 4096, 20.0),
                sp("f16", "pp512", 0, 400.0),
                sp("f16", "pp512", 4096, 200.0),
                sp("turbo3", "tg128", 4096, 30.0),
                sp("turbo3", "pp512", 0, 380.0),
            ],
            ..Doc::default()
        });
        let b = render_readme(&d);
        let rows: Vec<&str> = b.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows[0],
            "| cache K/V | tg128 @ 0 | tg128 @ 4096 | pp512 @ 0 | pp512 @ 4096 |"
        );
        assert_eq!(
            rows[2],
            "| f16 | 40.00 (1.00x) | 20.00 (1.00x) | 400.00 (1.00x) | 200.00 (1.00x) |"
        );
        assert_eq!(
            rows[3],
            "| turbo3 | — | 30.00 (1.50x) | 380.00 (0.95x) | — |"
        );
    }

    #[test]
    fn parses_logs_and_ci_table() {
        let log = "0.00.48 I llama_kv_cache: size =   96.00 MiB ( 32768 cells,   3 layers,  1/1 seqs), K (f16):   48.00 MiB, V (f16):   48.00 MiB\n\
                   0.00.49 I llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB\n\
                   0.00.50 I system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX2 = 1 |\n";
        assert_eq!(kv_cache_mib(log), [96.0, 15.0]);
        assert_eq!(
            system_info(log).as_deref(),
            Some("n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX2 = 1 |")
        );
        let ci = "# CI\n\n## Timings\n\nTargets: ...\n\n| run | total |\n|---|---|\n| a | 1 s |\n\nafter\n| not this |\n";
        assert_eq!(
            ci_table(ci),
            ["| run | total |", "|---|---|", "| a | 1 s |"]
        );
        assert!(ci_table("no table").is_empty());
        let now = utc_now();
        assert_eq!(now.len(), 20, "{now}");
        assert!(
            now.starts_with("20") && now.ends_with('Z') && &now[10..11] == "T",
            "{now}"
        );
        let root = Path::new("/repo");
        assert_eq!(
            tidy(
                "LLAMA=1 /repo/target/release/llama-bench -m /repo/x.gguf",
                root
            ),
            "LLAMA=1 target/release/llama-bench -m x.gguf"
        );
    }

    /// The README's results block is what docs/results.json renders now (regenerate with
    /// `tq results --readme`), and so is docs/RESULTS.md.
    #[test]
    fn readme_block_and_results_md_agree_with_results_json() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let doc = read_doc(&root).unwrap();
        assert!(
            root.join(JSON_PATH).is_file(),
            "{JSON_PATH} is missing: run `tq results`"
        );
        let readme = std::fs::read_to_string(root.join(README_PATH)).unwrap();
        let want = splice(&readme, &render_readme(&doc)).unwrap();
        assert!(
            readme == want,
            "{README_PATH}'s results block is stale: run `tq results --readme`"
        );
        let md = std::fs::read_to_string(root.join(MD_PATH)).unwrap();
        assert!(
            md == render_md(&doc),
            "{MD_PATH} is stale: run `tq results --readme`"
        );
    }
}
