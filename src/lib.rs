//! The llama.cpp layer of turboquant: what build.rs built (the pinned, patched llama.cpp)
//! seen from Rust. The tool mains in `src/bin` are thin `main`s over llama.cpp's C++
//! entry points; the `tq_*` symbols ggml's turbo types call come from
//! [`turboquant_capi`], re-exported here as [`capi`] so every binary links it.
//!
//! The codec itself is `turboquant-codec` (crates/codec), with no C++ and two
//! dependencies; this crate adds nothing to it.

pub use turboquant_capi as capi;

/// Where downloads and build caches live (`TQ_CACHE_DIR`, else the XDG cache): the
/// `turboquant-cache-dir` crate (crates/cache-dir), which build.rs uses too to
/// materialise llama.cpp there.
pub use turboquant_cache_dir as cache_dir;

/// Rust declarations of llama.cpp's C API as built (bindgen over `include/llama.h`, see
/// build/bindings.rs), for `tq capture`.
#[cfg(feature = "llama")]
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]
pub mod llama_sys {
    include!(concat!(env!("OUT_DIR"), "/llama_sys.rs"));
}
