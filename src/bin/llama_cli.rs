//! `llama-cli`: llama.cpp's interactive CLI, built with the turbo KV-cache types (thin main over `llama_cli`).

#[path = "shared/c_main.rs"]
mod c_main;

use std::ffi::{c_char, c_int};

extern "C" {
    // C++ linkage: `int llama_cli(int argc, char ** argv)` in tools/cli/cli.cpp
    #[link_name = "_Z9llama_cliiPPc"]
    fn llama_cli(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

fn main() {
    c_main::run(llama_cli)
}
