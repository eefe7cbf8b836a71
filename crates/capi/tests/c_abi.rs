//! Compiles crates/capi/tests/c/abi_test.c with the system C compiler (found through the
//! `cc` crate), links it against the freshly built `libturboquant_capi.a`, runs it. Both
//! child processes run under a time limit (turboquant_test_support::run_for).

use std::path::{Path, PathBuf};
use std::process::Command;
use turboquant_test_support::run_for;

/// The newest `libturboquant*.a` next to this test executable (cargo builds the
/// staticlib together with the rlib the test links).
fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for dir in [deps, deps.parent().unwrap()] {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("libturboquant") && name.ends_with(".a") {
                let t = e.metadata().unwrap().modified().unwrap();
                if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                    best = Some((t, e.path()));
                }
            }
        }
    }
    best.expect("libturboquant_capi.a not found next to the test executable")
        .1
}

#[test]
fn c_program_links_and_round_trips() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("tq-c-abi-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let exe = out.join("abi_test");
    let target = if cfg!(target_arch = "x86_64") {
        "x86_64-unknown-linux-gnu"
    } else {
        "aarch64-unknown-linux-gnu"
    };
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .target(target)
        .host(target)
        .opt_level(1)
        .out_dir(&out)
        .get_compiler();
    let lib = staticlib();
    let cc = run_for(
        compiler
            .to_command()
            .arg("-std=c11")
            .arg("-Wall")
            .arg("-Werror")
            .arg("-I")
            .arg(root.join("../../ggml-ext/abi"))
            .arg(root.join("tests/c/abi_test.c"))
            .arg(&lib)
            .args(["-lpthread", "-ldl", "-lm", "-lrt", "-lutil", "-o"])
            .arg(&exe),
        300,
    );
    assert!(
        cc.status.success(),
        "compiling/linking abi_test.c against {} failed:\n{}",
        lib.display(),
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = run_for(&mut Command::new(&exe), 120);
    eprintln!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "abi_test failed: {:?}", run.status);
    assert!(String::from_utf8_lossy(&run.stdout).contains("abi_test ok"));
    let _ = std::fs::remove_dir_all(&out);
}

/// The limit has teeth: a child that outlives it is killed and fails the test, well before
/// the child itself would have ended.
#[test]
fn a_child_past_its_time_limit_is_killed() {
    let start = std::time::Instant::now();
    let r = std::panic::catch_unwind(|| run_for(Command::new("sleep").arg("30"), 1));
    let msg = r.expect_err("run_for returned for a child that outlived its limit");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("still running after 1 s, killed"), "{msg}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}
