//! Upstream's AMX matmul stays out of everything we ship (issue 12): on an AMX Xeon the
//! pinned llama.cpp crashed at the first decode inside `ggml_backend_amx_mul_mat`, so the
//! build compiles ggml with `-mno-amx-*` after `-march=native` (build/cmake.rs,
//! NO_AMX_FLAGS). These checks fail on any machine when that is undone, not only on an
//! AMX one: the third compiles with ggml-cpu's real flags for an AMX target.
#![cfg(feature = "llama")]

mod support;

use std::path::PathBuf;
use std::process::Command;
use support::*;

extern "C" {
    fn ggml_cpu_has_amx_int8() -> std::ffi::c_int;
}

fn build_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TQ_LLAMA_BUILD_DIR") {
        return PathBuf::from(d);
    }
    // target/<profile>/deps/<test> -> target/llama.cpp-build
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().join("llama.cpp-build")
}

#[test]
fn linked_ggml_reports_no_amx() {
    // ggml (linked after this crate) calls the codec's tq_* symbols: keep them
    std::hint::black_box(turboquant_capi::link_anchor());
    // SAFETY: a plain query of compile-time features, no arguments.
    assert_eq!(unsafe { ggml_cpu_has_amx_int8() }, 0);
}

#[test]
fn shipped_tools_hold_no_amx_kernel() {
    for tool in [
        "llama-server",
        "llama-cli",
        "llama-bench",
        "llama-perplexity",
        "ggml-rpc-server",
        "tq",
    ] {
        let bytes = std::fs::read(bin(tool)).unwrap_or_else(|e| panic!("{tool}: {e}"));
        // the sanity check that the scan can see symbols at all
        assert!(
            contains(&bytes, b"ggml_backend_cpu_init"),
            "{tool}: no ggml symbol names to check (stripped binary?)"
        );
        for sym in [
            &b"ggml_backend_amx_mul_mat"[..],
            b"ggml_backend_amx_buffer_type",
        ] {
            assert!(
                !contains(&bytes, sym),
                "{tool} contains {}",
                String::from_utf8_lossy(sym)
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn ggml_cpu_flags_disable_amx_even_for_an_amx_target() {
    let flags_make = build_dir().join("ggml/src/CMakeFiles/ggml-cpu.dir/flags.make");
    let text = std::fs::read_to_string(&flags_make)
        .unwrap_or_else(|e| panic!("{}: {e}", flags_make.display()));
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {}", flags_make.display()))
            .trim()
            .to_string()
    };
    let flags = line("CXX_FLAGS = ");
    assert!(
        flags.contains("-march=native"),
        "ggml-cpu is no longer built with -march=native: {flags}"
    );
    // the same flags as if this machine were a Sapphire Rapids Xeon (AMX-INT8, AVX512-VNNI)
    let flags = flags.replace("-march=native", "-march=sapphirerapids");
    let out = Command::new("c++")
        .args(flags.split_whitespace())
        .args(line("CXX_DEFINES = ").split_whitespace())
        .args(["-dM", "-E", "-x", "c++", "/dev/null"])
        .output()
        .expect("run c++");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let macros = String::from_utf8_lossy(&out.stdout);
    assert!(
        macros.contains("#define __AVX512VNNI__ 1"),
        "the compiler does not target Sapphire Rapids"
    );
    assert!(
        !macros.contains("__AMX_INT8__"),
        "ggml-cpu's flags would compile upstream's AMX matmul on an AMX CPU"
    );
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
