//! A short run of scripts/load_test.py (the long load test) in CI, so that the script
//! itself keeps working and keeps failing when it should: a small mix must pass, and the
//! same script with an impossible resident-memory bound must exit non-zero.

mod support;

use std::process::Command;
use support::{bin, model, run_for, text};

fn load_test(more: &[&str]) -> (bool, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut cmd = Command::new("python3");
    cmd.arg(format!("{root}/scripts/load_test.py"))
        .arg("--server")
        .arg(bin("llama-server"))
        .arg("-m")
        .arg(model())
        .args(["--np", "4", "-c", "4096", "-t", "1", "--clients", "4"])
        .args(more);
    let o = run_for(&mut cmd, 900);
    (o.status.success(), text(&o))
}

#[test]
fn load_test_script_passes_a_short_mix_and_fails_on_an_impossible_bound() {
    let (ok, out) = load_test(&["--requests", "12", "--compare", "4"]);
    eprintln!("{out}");
    assert!(ok, "load_test.py failed:\n{out}");
    assert!(
        out.contains("completed") && out.contains("batched == alone"),
        "{out}"
    );

    // a negative growth allowance: resident memory "grows" by definition
    let (ok, out) = load_test(&["--requests", "2", "--compare", "1", "--rss-slack", "-1"]);
    assert!(
        !ok,
        "load_test.py passed with an impossible RSS bound:\n{out}"
    );
    assert!(out.contains("FAIL resident memory grew"), "{out}");
}
