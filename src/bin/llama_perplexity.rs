//! `llama-perplexity`: llama.cpp's perplexity / KL-divergence tool, built with the turbo KV-cache types (thin main over `llama_perplexity`).

#[path = "shared/c_main.rs"]
mod c_main;

use std::ffi::{c_char, c_int};

extern "C" {
    // C++ linkage: `int llama_perplexity(int argc, char ** argv)` in tools/perplexity/perplexity.cpp
    #[link_name = "_Z16llama_perplexityiPPc"]
    fn llama_perplexity(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

fn main() {
    c_main::run(llama_perplexity)
}
