//! The export list (generated from turboquant.h by build.rs) is complete: every `tq_*`
//! function the staticlib defines is declared in the header, so a Rust export that C
//! cannot see fails here. (A declared function Rust lacks fails to compile.)

use std::process::Command;

/// The newest staticlib of this crate next to this test executable: `deps/` holds it as
/// `libturboquant_capi-<hash>.a` after any build, the profile directory as
/// `libturboquant_capi.a` only after a build of this crate itself.
fn staticlib() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().flatten())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.ends_with(".a")
                && (n == "libturboquant_capi.a" || n.starts_with("libturboquant_capi-"))
        })
        .max_by_key(|e| e.metadata().unwrap().modified().unwrap())
        .expect("libturboquant_capi.a not found next to the test executable")
        .path()
}

#[test]
fn every_defined_tq_symbol_is_in_the_header() {
    let lib = staticlib();
    let out = turboquant_test_support::run_for(
        Command::new("nm")
            .args(["--defined-only", "--extern-only", "--format=posix"])
            .arg(&lib),
        120,
    );
    assert!(out.status.success(), "nm failed on {}", lib.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let defined: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, kind) = (f.next()?, f.next()?);
            (kind == "T" && name.starts_with("tq_")).then_some(name)
        })
        .collect();
    // The check has teeth only if nm saw the functions at all.
    assert!(
        defined.len() >= 30,
        "only {} tq_* functions in {}",
        defined.len(),
        lib.display()
    );
    let missing: Vec<&&str> = defined
        .iter()
        .filter(|n| !turboquant_capi::EXPORTED_SYMBOLS.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "defined in Rust but not declared in turboquant.h: {missing:?}"
    );
    for s in turboquant_capi::EXPORTED_SYMBOLS {
        assert!(
            defined.contains(&s),
            "{s} is declared but not defined in {}",
            lib.display()
        );
    }
}
