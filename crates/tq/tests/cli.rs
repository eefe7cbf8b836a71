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
        // tq eval's options, before any model or tool is looked for
        (vec!["eval", "--device", "none"], "name a llama.cpp device"),
        (
            vec!["eval", "--ubatch", "0"],
            "--ubatch 0: must be between 1 and --ctx (512)",
        ),
        (vec!["eval", "-c", "128", "--ubatch", "200"], "--ubatch 200"),
        (
            vec!["eval", "-c", "128", "--chunks", "1"],
            "--ctx 128 --chunks 1 scores 63 tokens",
        ),
    ] {
        let out = tq(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(want), "{args:?}: {}", text(&out));
    }
}

#[test]
fn unknown_switch_values_are_refused_before_anything_runs() {
    for row in turboquant_codec::switches::ggml_rows() {
        let out = Command::new(env!("CARGO_BIN_EXE_tq"))
            .args(["kv-norms", "/nonexistent/kv.tqkv"])
            .env("TQ_CACHE_DIR", scratch("cache"))
            .env(&row.env, "bogus")
            .output()
            .expect("run tq");
        let want = format!("tq: error: {}", row.unknown(&row.env, "bogus"));
        assert_eq!(out.status.code(), Some(2), "{}: {}", row.env, text(&out));
        assert!(text(&out).contains(&want), "{}: {}", row.env, text(&out));
        assert!(!text(&out).contains("No such file"), "{}", text(&out));
    }
}

/// A GGUF with only metadata: (key, u32 value) pairs and general.architecture.
fn gguf_file(dir: &std::path::Path, name: &str, arch: &str, ints: &[(&str, u32)]) -> PathBuf {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend((1 + ints.len() as u64).to_le_bytes());
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, arch);
    for (k, v) in ints {
        s(&mut b, &format!("{arch}.{k}"));
        b.extend(4u32.to_le_bytes());
        b.extend(v.to_le_bytes());
    }
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    p
}

#[test]
fn memory_on_bad_metadata_is_a_named_error() {
    let dir = scratch("gguf");
    let full = [
        ("block_count", 2),
        ("embedding_length", 64),
        ("attention.head_count", 1),
    ];
    for (file, arch, ints, want) in [
        (
            "unknown.gguf",
            "no-such-arch",
            &full[..],
            "unknown architecture `no-such-arch`",
        ),
        ("nolayers.gguf", "llama", &full[1..], "llama.block_count"),
        (
            "noheads.gguf",
            "llama",
            &full[..2],
            "llama.attention.head_count",
        ),
        (
            "nowindow.gguf",
            "gpt-oss",
            &full[..],
            "gpt-oss.attention.sliding_window",
        ),
        (
            "nostate.gguf",
            "granitehybrid",
            &full[..],
            "recurrent state",
        ),
        ("dsv4.gguf", "deepseek4", &full[..], "does not size it"),
    ] {
        let p = gguf_file(&dir, file, arch, ints);
        let out = tq(&["memory", "-m", p.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", text(&out));
        assert!(text(&out).contains(want), "{file}: {}", text(&out));
        assert!(!text(&out).contains("panicked"), "{file}: {}", text(&out));
    }
    // a good one, for contrast: 2 layers x 1 head x 64 x (K + V) x f16 x 512 cells
    let p = gguf_file(&dir, "good.gguf", "llama", &full);
    let out = tq(&["memory", "-m", p.to_str().unwrap(), "-c", "512", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("\"bytes\": 262144"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
