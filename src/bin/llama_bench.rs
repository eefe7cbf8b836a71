//! `llama-bench`: llama.cpp's benchmark, built with the turbo KV-cache types (thin main over `llama_bench`).

#[path = "shared/c_main.rs"]
mod c_main;

use std::ffi::{c_char, c_int};

extern "C" {
    // C++ linkage: `int llama_bench(int argc, char ** argv)` in tools/llama-bench/llama-bench.cpp
    #[link_name = "_Z11llama_benchiPPc"]
    fn llama_bench(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

fn main() {
    c_main::run(llama_bench)
}
