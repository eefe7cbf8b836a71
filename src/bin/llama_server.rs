//! `llama-server`: llama.cpp's HTTP server, built with the turbo KV-cache types (thin main over `llama_server`).

#[path = "shared/c_main.rs"]
mod c_main;

use std::ffi::{c_char, c_int};

extern "C" {
    // C++ linkage: `int llama_server(int argc, char ** argv)` in tools/server/server.cpp
    #[link_name = "_Z12llama_serveriPPc"]
    fn llama_server(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

fn main() {
    c_main::run(llama_server)
}
