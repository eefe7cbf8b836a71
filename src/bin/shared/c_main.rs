//! Shared by the thin llama.cpp tool mains: hand the process arguments to a C++
//! `int tool(int argc, char **argv)` entry point and exit with its status.

use std::ffi::{c_char, c_int, CString};
use std::os::unix::ffi::OsStringExt;

pub type CMain = unsafe extern "C" fn(c_int, *mut *mut c_char) -> c_int;

pub fn run(entry: CMain) -> ! {
    // ggml (a static C++ archive, linked after this crate) calls the codec's tq_* symbols;
    // referencing them here makes the linker keep them.
    std::hint::black_box(turboquant::capi::link_anchor());
    log_amx_choice();

    let args: Vec<CString> = std::env::args_os()
        .map(|a| CString::new(a.into_vec()).expect("argument contains a NUL byte"))
        .collect();
    let mut argv: Vec<*mut c_char> = args.iter().map(|a| a.as_ptr() as *mut c_char).collect();
    argv.push(std::ptr::null_mut());
    // SAFETY: argv holds argc valid NUL-terminated strings plus a terminating NULL, and
    // outlives the call; the entry point has the C signature declared above.
    let code = unsafe { entry(args.len() as c_int, argv.as_mut_ptr()) };
    std::process::exit(code)
}

/// Upstream's AMX matmul is compiled out of this build (build/cmake.rs, NO_AMX_FLAGS): on an
/// AMX Xeon it crashed at the first decode. Say so once, so a user of such a machine knows
/// which path their matmuls take.
fn log_amx_choice() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let has_amx = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.split_whitespace().any(|f| f == "amx_int8"))
        .unwrap_or(false);
    eprintln!(
        "turboquant: upstream's AMX matmul is compiled out (it crashes on AMX CPUs); \
         this CPU has AMX: {}; matmuls use ggml's AVX-512/AVX2 kernels and repack",
        if has_amx { "yes" } else { "no" }
    );
}
