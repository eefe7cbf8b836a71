//! `ggml-rpc-server`: ggml's RPC server (tools/rpc), exposing this machine's CPU backend,
//! turbo types included, to `--rpc HOST:PORT` clients (thin main over its renamed `main`).

#[path = "shared/c_main.rs"]
mod c_main;

use std::ffi::{c_char, c_int};

extern "C" {
    // C++ linkage: tools/rpc/rpc-server.cpp's `int main(int, char **)`, compiled with
    // -Dmain=tq_rpc_server_main (ggml-ext/cmake/turboquant.cmake)
    #[link_name = "_Z18tq_rpc_server_mainiPPc"]
    fn tq_rpc_server_main(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

fn main() {
    c_main::run(tq_rpc_server_main)
}
