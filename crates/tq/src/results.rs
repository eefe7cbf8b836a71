//! What `tq eval` produces: one row per cache pair (quality, size, speed) per model, and
//! its Markdown table. The runner (eval.rs) fills it, the plots (plot.rs) draw it.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KldStats {
    pub ppl: f64,
    pub ppl_err: f64,
    pub kld: f64,
    pub kld_err: f64,
    pub same_top_pct: f64,
    pub same_top_err: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchPoint {
    /// "pp512" or "tg128"
    pub test: String,
    pub depth: u64,
    pub t_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub pair: String,
    pub k: String,
    pub v: String,
    pub rotation_disabled: bool,
    pub turbo: bool,
    pub bits_per_value: f64,
    pub kv_bytes_per_token: u64,
    /// perplexity quality; None for the f16 base row's KLD fields
    pub ppl: Option<f64>,
    pub ppl_err: Option<f64>,
    pub dppl_pct: Option<f64>,
    pub kld: Option<KldStats>,
    pub error: Option<String>,
    pub bench: Vec<BenchPoint>,
    pub bench_error: Option<String>,
    /// the llama-perplexity and llama-bench command lines that made this row
    pub ppl_cmd: Option<String>,
    pub bench_cmd: Option<String>,
}

impl Row {
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.bench_error.is_some()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelResults {
    pub model: PathBuf,
    pub arch: String,
    pub text: String,
    pub ctx: u64,
    pub chunks: Option<u64>,
    pub threads: u32,
    pub bench_depths: Vec<u64>,
    pub bench_pp: u64,
    pub bench_tg: u64,
    /// `tq eval --device`: the device every row but the base ran on (the base: the CPU)
    pub device: Option<String>,
    /// `tq eval --ubatch`: the physical batch of every row but the base
    pub ubatch: Option<u64>,
    /// rows[0] is f16/f16, the base run
    pub rows: Vec<Row>,
}

fn fmt_opt(x: Option<f64>, prec: usize) -> String {
    x.map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "—".into())
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

impl ModelResults {
    fn bench_ref(&self, test: &str, depth: u64) -> Option<f64> {
        self.rows
            .first()?
            .bench
            .iter()
            .find(|b| b.test == test && b.depth == depth)
            .map(|b| b.t_s)
    }

    fn bench_tests(&self) -> Vec<(String, u64)> {
        let mut cols = Vec::new();
        for &d in &self.bench_depths {
            for t in [
                format!("pp{}", self.bench_pp),
                format!("tg{}", self.bench_tg),
            ] {
                cols.push((t, d));
            }
        }
        cols
    }

    pub fn markdown(&self) -> String {
        let bench = !self.bench_depths.is_empty();
        let mut s = format!(
            "## {} — ctx {}, {} chunks, {} threads{}{}\n\ntext: {}\n\n",
            self.model.display(),
            self.ctx,
            self.chunks.map_or("all".into(), |c| c.to_string()),
            self.threads,
            self.device.as_ref().map_or(String::new(), |d| format!(
                ", pairs on {d} (the f16 base on the CPU)"
            )),
            self.ubatch
                .map_or(String::new(), |u| format!(", pairs at -ub {u}")),
            self.text
        );
        s += "| pair | bits/value | KV bytes/token | PPL | ΔPPL vs f16 | mean KLD | same top % |";
        let cols = self.bench_tests();
        if bench {
            for (t, d) in &cols {
                s += &format!(" {t} @{d} t/s |");
            }
        }
        s += "\n|---|---:|---:|---:|---:|---:|---:|";
        if bench {
            s += &"---:|".repeat(cols.len());
        }
        s += "\n";
        for (i, r) in self.rows.iter().enumerate() {
            s += &format!(
                "| {}{} | {:.2} | {} |",
                r.pair,
                if i == 0 { " (base)" } else { "" },
                r.bits_per_value,
                r.kv_bytes_per_token
            );
            if let Some(e) = &r.error {
                s += &format!(" **ERROR**: {} | | | |", md_escape(e));
            } else {
                s += &format!(
                    " {} ± {} | {} | {} | {} |",
                    fmt_opt(r.ppl, 4),
                    fmt_opt(r.ppl_err, 4),
                    r.dppl_pct
                        .map(|d| format!("{d:+.2}%"))
                        .unwrap_or_else(|| "—".into()),
                    r.kld
                        .map(|k| format!("{:.6} ± {:.6}", k.kld, k.kld_err))
                        .unwrap_or_else(|| "— (reference)".into()),
                    r.kld
                        .map(|k| format!("{:.2} ± {:.2}", k.same_top_pct, k.same_top_err))
                        .unwrap_or_else(|| "—".into()),
                );
            }
            if bench {
                if let Some(e) = &r.bench_error {
                    s += &format!(" **BENCH ERROR**: {} |", md_escape(e));
                    s += &" |".repeat(cols.len().saturating_sub(1));
                } else {
                    for (t, d) in &cols {
                        let cell = r
                            .bench
                            .iter()
                            .find(|b| &b.test == t && b.depth == *d)
                            .map(|b| match self.bench_ref(t, *d) {
                                Some(f) => format!("{:.2} ({:.2}x)", b.t_s, b.t_s / f),
                                None => format!("{:.2}", b.t_s),
                            })
                            .unwrap_or_else(|| "—".into());
                        s += &format!(" {cell} |");
                    }
                }
            }
            s += "\n";
        }
        s
    }
}
