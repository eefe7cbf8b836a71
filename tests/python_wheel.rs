//! llama-cpp-python with turbo caches: scripts/python-wheel.sh builds the wheel, a fresh
//! virtualenv installs it, tests/python/wheel_check.py generates with turbo4 K / turbo3 V
//! and checks that turbo V without flash attention is a Python exception. The wheel build
//! compiles libllama and ggml as shared libraries (docs/ECOSYSTEM.md has the times), too
//! long for every CI run: it runs only with TQ_PYTHON_WHEEL=1.

mod support;
use support::prereq::prerequisite;
use support::run_limited;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
fn llama_cpp_python_wheel_generates_with_turbo_caches() {
    // an opt-in, not a tool: .ci/run names it in TQ_CI_SKIP (docs/CI.md)
    if !prerequisite(
        "TQ_PYTHON_WHEEL",
        std::env::var_os("TQ_PYTHON_WHEEL").is_some(),
        "set TQ_PYTHON_WHEEL=1 (builds llama.cpp as a wheel, minutes)",
    ) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run_limited(
        Command::new(root.join("scripts/python-wheel.sh")).arg(root.join("target/wheels")),
        Duration::from_secs(3600),
        "scripts/python-wheel.sh",
    );
    let wheel = out
        .lines()
        .last()
        .expect("the wheel's path")
        .trim()
        .to_string();
    let venv = root.join("target/wheel-venv");
    let _ = std::fs::remove_dir_all(&venv);
    run_limited(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        Duration::from_secs(120),
        "python3 -m venv",
    );
    let py = venv.join("bin/python");
    run_limited(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(&wheel),
        Duration::from_secs(600),
        "pip install of the wheel",
    );
    let seen = run_limited(
        Command::new(&py)
            .arg(root.join("tests/python/wheel_check.py"))
            .arg(support::model()),
        Duration::from_secs(300),
        "tests/python/wheel_check.py",
    );
    eprintln!("llama-cpp-python saw: {seen}");
    let v: serde_json::Value = serde_json::from_str(seen.lines().last().unwrap_or("")).unwrap();
    assert_eq!(v["version"], "0.3.36");
    assert!(v["refused"].as_str().is_some_and(|s| !s.is_empty()));
}
