#!/usr/bin/env python3
"""Simulate K/Q channel balancing (ggml-ext/llama/tq-kmean.h) on a `tq capture` file.

For every layer and KV head: s from the first 512 tokens (as llama.cpp takes it from the
first ubatch), keys stored as s*k - m plus isotropic Gaussian noise of relative energy D
(the codec's distortion after the random rotation: 0.0095 turbo4, 0.0345 turbo3), queries
q/s; reports the mean KL divergence between exact and noisy attention rows for queries of
the second half of the capture, against the same with s = 1.

    python3 scripts/kbal_sim.py smol.tqkv --rope norm --weight attn
    python3 scripts/kbal_sim.py gemma.tqkv --rope neox --weight mean

--weight mean: key energy per channel averaged over keys; attn: weighted by the causal
attention each key gets from the calibration queries (what llama.cpp does).
"""
import argparse, json, struct
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("capture")
ap.add_argument("--rope", choices=["norm", "neox"], required=True)
ap.add_argument("--weight", choices=["mean", "attn"], default="attn")
ap.add_argument("--distortion", type=float, default=0.0345)
ap.add_argument("--calib", type=int, default=512)
a = ap.parse_args()

f = open(a.capture, "rb")
f.read(8)
h = json.loads(f.read(struct.unpack("<I", f.read(4))[0]))
T, L, nh, nkv, d, dv = h["n_tokens"], h["n_layer"], h["n_head"], h["n_head_kv"], h["head_k"], h["head_v"]
g, cal = nh // nkv, a.calib
rng = np.random.default_rng(0)


def tie(x):  # equal on every RoPE pair
    if a.rope == "neox":
        return np.tile(x.reshape(2, -1).mean(0), 2)
    return x.reshape(-1, 2).mean(1).repeat(2)


def attn_kl(x, xq, q, scale):
    kl = []
    for t in range(T // 2, T, 64):
        for j in range(q.shape[1]):
            qq = q[t, j] * scale
            l0, l1 = x[: t + 1] @ qq, xq[: t + 1] @ qq
            p = np.exp(l0 - l0.max()); p /= p.sum()
            lq = l1 - l1.max(); lq -= np.log(np.exp(lq).sum())
            kl.append((p * (np.log(p + 1e-300) - lq)).sum())
    return np.mean(kl)


res = {"s=1": [], "balanced": []}
for l in range(L):
    K = np.frombuffer(f.read(T * nkv * d * 2), dtype="<f2").astype(np.float64).reshape(T, nkv, d)
    f.read(T * nkv * dv * 2)
    Q = np.frombuffer(f.read(T * nh * d * 2), dtype="<f2").astype(np.float64).reshape(T, nh, d)
    for hk in range(nkv):
        k, q = K[:, hk], Q[:, hk * g:(hk + 1) * g]
        kc = k[:cal] - k[:cal].mean(0)
        if a.weight == "attn":
            w = np.zeros(cal)
            for j in range(g):
                A = q[:cal, j] @ k[:cal].T / np.sqrt(d) + np.triu(np.full((cal, cal), -np.inf), 1)
                A = np.exp(A - A.max(1, keepdims=True)); A /= A.sum(1, keepdims=True)
                w += A.mean(0) / g
        else:
            w = np.full(cal, 1.0 / cal)
        rk = tie(np.maximum((w[:, None] * kc**2).sum(0), 1e-20))
        rq = tie(np.maximum((q[:cal] ** 2).mean((0, 1)), 1e-20))
        s = np.clip(rq / rk, 1e-12, 1e12) ** 0.25
        s = np.clip(s * np.sqrt(rk.sum() / (s * s * rk).sum()), 1 / 8, 8)
        for name, sc in (("s=1", np.ones(d)), ("balanced", s)):
            ks = k * sc
            x = ks - ks[:cal].mean(0)
            noise = rng.standard_normal(x.shape) * np.sqrt(a.distortion * (x**2).sum(1, keepdims=True) / d)
            res[name].append(attn_kl(x, x + noise, q / sc, 1 / np.sqrt(d)))
    print(f"layer {l:2d}: attention KL s=1 {res['s=1'][-1]:.5f}  balanced {res['balanced'][-1]:.5f}", flush=True)
print(f"mean attention KL: s=1 {np.mean(res['s=1']):.5f}  balanced {np.mean(res['balanced']):.5f}")
