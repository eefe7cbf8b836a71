//! Build script: with the `llama` feature (the default) it materialises the pinned
//! llama.cpp (vendor/llama.cpp.pin), applies ggml-ext/patches, builds the libraries with
//! cmake and tells rustc how to link llama-server / llama-cli / llama-bench /
//! llama-perplexity and the ggml-level tests. Without the feature it does nothing, so the
//! codec builds and tests with no C++ toolchain at all.
//!
//! Cargo drives: the C++ side is only libraries; every executable is a thin Rust `main`
//! linked with this crate, which provides the `tq_*` symbols ggml calls.

#[path = "build/bindings.rs"]
mod bindings;
use turboquant_cache_dir as cache_dir;
#[path = "build/cmake.rs"]
mod cmake;
#[path = "build/ui.rs"]
mod ui;
#[path = "build/vendor.rs"]
mod vendor;
#[path = "build/vulkan_shaders.rs"]
mod vulkan_shaders;

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build");
    if std::env::var_os("CARGO_FEATURE_LLAMA").is_none() {
        return;
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    if let Err(e) = run(&root) {
        // A panic prints the message without a backtrace wall; keep it readable.
        panic!("\n\nturboquant: {e}\n\n");
    }
}

fn run(root: &std::path::Path) -> Result<(), String> {
    for p in [
        "vendor/llama.cpp.pin",
        "ggml-ext/patches",
        "ggml-ext/abi",
        "ggml-ext/ggml",
        "ggml-ext/ggml-cpu",
        "ggml-ext/llama",
        "ggml-ext/tools",
        "ggml-ext/cmake",
        "ggml-ext/tests",
        "ggml-ext/ggml-cuda",
        "ggml-ext/ggml-vulkan",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=LLAMA_CPP_DIR");
    println!("cargo:rerun-if-env-changed=TQ_CACHE_DIR");
    println!("cargo:rerun-if-env-changed=TQ_CUDA_ROOT");
    println!("cargo:rerun-if-env-changed=TQ_CUDA_ARCHS");

    let src = vendor::materialise(root)?;
    let pin = vendor::Pin::read(root)?;
    let web_ui = ui::provide(&src, pin.get("sha256")?)?;
    println!("cargo:rustc-env=TQ_WEB_UI_STATE={web_ui}");
    // and to `tq` (crates/tq), which serves it: `links` metadata, DEP_LLAMA_WEB_UI_STATE there
    println!("cargo:web_ui_state={web_ui}");
    let build_dir = cmake::build_dir(root);
    cmake::build(root, &src, &build_dir)?;
    cmake::emit_link_args(&build_dir)?;
    bindings::generate(&src)?;
    Ok(())
}
