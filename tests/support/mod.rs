//! Helpers for the tests that drive the real llama.cpp tools built by this crate.
#![allow(dead_code)]

pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn bin(name: &str) -> PathBuf {
    // Cargo builds every binary of the package before the integration tests.
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join(name)
}

/// The default model (SmolLM2-135M), fetched once through `tq fetch`.
pub fn model() -> PathBuf {
    static M: OnceLock<PathBuf> = OnceLock::new();
    M.get_or_init(|| {
        let out = Command::new(bin("tq"))
            .arg("fetch")
            .output()
            .expect("run tq fetch");
        assert!(
            out.status.success(),
            "tq fetch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
    .clone()
}

/// Evaluation text nobody here wrote: the llama.cpp tree's docs, concatenated in a
/// fixed order.
pub fn corpus() -> PathBuf {
    static C: OnceLock<PathBuf> = OnceLock::new();
    C.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        let mut stack = vec![root.join("vendor/llama.cpp/docs")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "md") {
                    files.push(p);
                }
            }
        }
        files.sort();
        let text: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default() + "\n")
            .collect();
        let out = root.join("target/test-corpus-llama-docs.txt");
        std::fs::write(&out, text).unwrap();
        out
    })
    .clone()
}

/// llama-perplexity on the default model over `text`; callers add the run's own flags.
pub fn perplexity_cmd(text: &Path) -> Command {
    let mut cmd = Command::new(bin("llama-perplexity"));
    cmd.arg("-m").arg(model()).arg("-f").arg(text);
    cmd
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// The number after `label` on the first line that contains it.
pub fn number_after(out: &str, label: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains(label))?;
    let rest = &line[line.find(label)? + label.len()..];
    rest.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .find(|s| !s.is_empty() && s.parse::<f64>().is_ok())
        .and_then(|s| s.parse().ok())
}
