//! What a test needs from the machine (chromium, npm, an embedded web UI, an opt-in): on a
//! developer's machine a missing one skips the test, which says so; under `CI=true` it
//! fails the test with the reason, unless CI names it in `TQ_CI_SKIP` (a comma-separated
//! list of prerequisite names: .ci/run leaves out what it does not run on purpose).
//!
//! libtest shows a skipped test as `ok` and hides what it printed, so every skip is also
//! appended to the file `TQ_TEST_REPORT` names, when it is set, as one line
//! `SKIPPED <test binary> <test>: <name>: <why>`; .ci/run counts them
//! (scripts/ci-summary.sh).

use std::io::Write;

/// Whether the test can go on: `present`, or else (not under CI) it returns false after
/// saying why; under `CI=true` a missing prerequisite panics with `why`.
pub fn prerequisite(name: &str, present: bool, why: &str) -> bool {
    if present {
        return true;
    }
    let allowed = std::env::var("TQ_CI_SKIP")
        .unwrap_or_default()
        .split(',')
        .any(|n| n.trim() == name);
    if on_ci() && !allowed {
        panic!(
            "prerequisite missing under CI=true: {name}: {why} (a developer's machine skips \
             this test; CI must provide it, or name it in TQ_CI_SKIP)"
        );
    }
    let line = format!("SKIPPED {} {}: {name}: {why}", binary(), test());
    eprintln!("{line}");
    report(&line);
    false
}

/// `CI=true` (or `1`), as CI services set it and .ci/run exports it.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The test binary's name as cargo prints it (`web_ui` for target/release/deps/web_ui-<hash>).
fn binary() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let stem = exe.file_stem().unwrap_or_default().to_string_lossy();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.into(),
        _ => stem.into_owned(),
    }
}

/// libtest runs each test on a thread named after it.
fn test() -> String {
    std::thread::current().name().unwrap_or("?").to_string()
}

fn report(line: &str) {
    let Some(path) = std::env::var_os("TQ_TEST_REPORT") else {
        return;
    };
    // one write of a whole line per call: tests of several binaries append to one file
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    if let Ok(mut f) = f {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}
