//! `tq` on bad input, without a model: every mistake is exit code 2 with a message that
//! names it. This file is also why `cargo test` at the workspace root builds the `tq`
//! binary that the root package's integration tests run: cargo builds a package's binaries
//! only for that package's own integration tests.

use std::path::PathBuf;
use std::process::{Command, Output};

fn tq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .env("TQ_CACHE_DIR", scratch("cache"))
        .output()
        .expect("run tq")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tq-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn bad_files_are_named_errors() {
    let dir = scratch("files");
    let bad = dir.join("bad.bin");
    std::fs::write(&bad, b"not a gguf nor a capture").unwrap();
    let bad = bad.to_str().unwrap();
    for (args, want) in [
        (
            vec!["capture", "-m", "/nonexistent/model.gguf"],
            "no model file",
        ),
        (vec!["capture", "-m", bad], "not a GGUF"),
        (vec!["kv-norms", "/nonexistent/kv.tqkv"], "No such file"),
        (vec!["distortion", bad], "not a tq capture file"),
        (vec!["memory", "-m", bad], "not a GGUF"),
    ] {
        let out = tq(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(want), "{args:?}: {}", text(&out));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_names_are_refused_before_anything_runs() {
    for (args, want) in [
        (vec!["fetch", "no-such-model"], "no-such-model"),
        (vec!["serve", "--ctk", "turbo9"], "turbo9"),
        (vec!["serve", "--ctv", "q4_7"], "q4_7"),
    ] {
        let out = tq(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(want), "{args:?}: {}", text(&out));
    }
}
