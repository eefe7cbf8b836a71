//! `tq capture` on the real default model (SmolLM2-135M: 30 layers, 9 heads, 3 KV heads,
//! head 64) through libllama, and every lab subcommand's JSON on that capture.
#![cfg(feature = "llama")]

mod support;

use std::path::Path;
use std::process::Command;
use support::*;
use turboquant_lab::Capture;

fn tq(args: &[&str], capture: &Path) -> serde_json::Value {
    let out = run(Command::new(bin("tq"))
        .args(args)
        .arg(capture)
        .arg("--json"));
    assert!(out.status.success(), "tq {args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tq {args:?}: not JSON ({e}): {}", text(&out)))
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn capture_smollm2_and_run_the_lab() {
    let dir = std::env::temp_dir().join(format!("tq-lab-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("smol.tqkv");
    let out = run(Command::new(bin("tq"))
        .arg("capture")
        .arg("-m")
        .arg(model())
        .arg("-f")
        .arg(corpus())
        .arg("-o")
        .arg(&cap)
        .args(["--tokens", "200", "--ubatch", "64"]));
    assert!(out.status.success(), "{}", text(&out));

    let c = Capture::read(&cap).unwrap();
    let h = &c.header;
    assert_eq!(
        (
            h.n_layer,
            h.n_head,
            h.n_head_kv,
            h.head_k,
            h.head_v,
            h.n_tokens
        ),
        (30, 9, 3, 64, 64, 200)
    );
    for l in 0..30 {
        assert_eq!(c.k[l].len(), 200 * 3 * 64);
        assert_eq!(c.v[l].len(), 200 * 3 * 64);
        assert_eq!(c.q[l].len(), 200 * 9 * 64);
        for t in [&c.k[l], &c.v[l], &c.q[l]] {
            assert!(
                t.iter().all(|x| x.is_finite()),
                "layer {l}: non-finite value"
            );
            assert!(t.iter().any(|&x| x != 0.0), "layer {l}: all zero");
        }
    }
    // the micro-batches join in token order: token 70 (second micro-batch) differs from
    // token 6, and no two consecutive tokens of a head are identical
    assert_ne!(c.key(5, 70, 1), c.key(5, 6, 1));
    assert!((1..200).all(|t| c.key(3, t, 0) != c.key(3, t - 1, 0)));

    // kv-norms: layer 0's keys are the known outlier (K/V norm ratio ~29, DESIGN.md §5b)
    let j = tq(&["kv-norms"], &cap);
    let layers = j["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 30);
    assert!(f(&layers[0]["ratio_mean"]) > 10.0, "{}", layers[0]);
    assert!(j["outlier_layers"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!(0)));

    // rotation-stats: the rotation brings K's kurtosis down towards 3
    let j = tq(&["rotation-stats"], &cap);
    let all = &j["all_layers"];
    assert!(f(&all["k_before"]["kurtosis"]) > 5.0, "{all}");
    assert!(
        (2.0..3.5).contains(&f(&all["k_after"]["kurtosis"])),
        "{all}"
    );

    // distortion: more bits, less error; turbo near its codebook's optimum
    let j = tq(&["distortion"], &cap);
    let cos = |name: &str| {
        let r = j["types"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["codec"] == name)
            .unwrap();
        f(&r["k"]["cos"])
    };
    assert!(cos("q8_0") > cos("turbo4") && cos("turbo4") > cos("turbo3"));
    assert!(cos("turbo3") > cos("turbo2") && cos("turbo2") > 0.9);

    // niah: trials add up, q8_0 keeps the needle
    let j = tq(&["niah", "--trials", "8", "--lengths", "512,2048"], &cap);
    let cells = j["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2 * 2 * 5);
    for c in cells {
        assert_eq!(c["trials"], 8);
        if c["codec"] == "q8_0" {
            assert!(f(&c["top1"]) >= 0.99, "{c}");
        }
    }

    // recommend: a pair is chosen and printed as flags
    let j = tq(&["recommend", "--queries", "4"], &cap);
    assert_eq!(j["pairs"].as_array().unwrap().len(), 36);
    let flags = j["recommended"]["flags"].as_str().unwrap();
    assert!(flags.starts_with("-ctk "), "{flags}");

    let _ = std::fs::remove_dir_all(&dir);
}
