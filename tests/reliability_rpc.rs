//! Scale-out: ggml's RPC backend carries the turbo types. ggml-rpc-server (built by cargo,
//! src/bin/ggml_rpc_server.rs) serves this machine's CPU backend on 127.0.0.1, and
//! llama-perplexity offloads every layer and the KV cache to it through
//! `--rpc 127.0.0.1:PORT -ngl 99`.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

struct RpcServer {
    child: Child,
    endpoint: String,
}

impl RpcServer {
    fn start() -> RpcServer {
        let port = server::free_port();
        let mut child = Command::new(bin("ggml-rpc-server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ggml-rpc-server");
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "ggml-rpc-server exited early"
            );
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "ggml-rpc-server not listening"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RpcServer {
            child,
            endpoint: format!("127.0.0.1:{port}"),
        }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// PPL over 4 chunks of 128 tokens, locally or (`rpc`) with everything on the RPC device.
fn ppl(ctk: &str, ctv: &str, rpc: Option<&str>, env: &[(&str, &str)]) -> f64 {
    let mut cmd = perplexity_cmd(&corpus());
    cmd.args([
        "-c", "128", "--chunks", "4", "-b", "128", "-t", "1", "-fa", "on",
    ])
    .args(["-ctk", ctk, "-ctv", ctv, "-lv", "4"])
    .envs(env.iter().copied());
    if let Some(ep) = rpc {
        cmd.args(["--rpc", ep, "-ngl", "99"]);
    }
    let o = run(&mut cmd);
    let out = text(&o);
    assert!(
        o.status.success(),
        "llama-perplexity {ctk}/{ctv} rpc {rpc:?} failed:\n{out}"
    );
    if rpc.is_some() {
        assert!(
            out.contains("RPC0[") && out.contains("KV buffer size"),
            "the KV cache is not on the RPC device:\n{out}"
        );
    }
    if ctk.starts_with("turbo") {
        assert!(
            out.contains(&format!("K ({ctk})")),
            "no {ctk} cache:\n{out}"
        );
    }
    number_after(&out, "Final estimate: PPL = ")
        .unwrap_or_else(|| panic!("no final estimate in:\n{out}"))
}

/// Every cache type gives bit-identical perplexity through RPC: the same CPU kernels run on
/// the other side. For turbo caches the local reference runs with `TQ_PREFILL_DECODE=0`:
/// on a host-memory cache llama's graph decodes turbo K/V to f32 for prompt batches and
/// uses ggml's tiled flash-attention kernel (ggml-ext/ggml/tq-ggml.h), a shortcut it
/// cannot take on a remote buffer, where the per-row kernel reads the turbo blocks directly.
/// The two kernels agree to rounding (tests/ggml_ops.rs), but a rounding-level difference
/// in one layer flips a few borderline codebook indices in the next layer's cache, so the
/// quantization noise is a different draw and PPL moves by the size of that noise (local
/// with the shortcut 22.0043, without it and through RPC 21.5079). With the same kernel on
/// both sides the results must be identical, with and without K mean removal. The K mean in
/// RoPE's frame runs only where the model has no device but the CPU, so an RPC run keeps the
/// fitted mean (its log says so) and the local reference is asked for the same.
#[test]
fn perplexity_through_rpc_server_is_bit_identical() {
    let mut srv = RpcServer::start();
    let ep = srv.endpoint.clone();
    for t in ["f16", "q8_0"] {
        let (local, remote) = (ppl(t, t, None, &[]), ppl(t, t, Some(&ep), &[]));
        eprintln!("{t}: local {local}, through RPC {remote}");
        assert_eq!(local, remote, "{t}: PPL through RPC differs");
    }
    for kmean in ["1", "0"] {
        let env = [
            ("TQ_PREFILL_DECODE", "0"),
            ("TQ_K_MEAN", kmean),
            ("TQ_K_MEAN_FRAME", "fitted"),
        ];
        let local = ppl("turbo4", "turbo3", None, &env);
        let remote = ppl("turbo4", "turbo3", Some(&ep), &env);
        eprintln!("turbo4/turbo3 (TQ_K_MEAN={kmean}): local {local}, through RPC {remote}");
        assert_eq!(
            local, remote,
            "turbo4/turbo3 TQ_K_MEAN={kmean}: PPL through RPC differs"
        );
    }
    assert!(srv.alive(), "ggml-rpc-server died");
}
