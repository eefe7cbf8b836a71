#!/usr/bin/env python3
"""Which K-side statistics hold at long context? A simulation on a `tq capture` file.

For every layer and KV head, keys are stored as x = s*k - m plus isotropic Gaussian noise of
relative energy D (what the codec's error looks like after the random rotation: 0.0307 for
turbo3, 0.111 for turbo2, 0.0081 for turbo4), queries attend with q/s, and the score is the
mean KL divergence between exact and noisy attention rows of queries in the second half of
the capture (positions T/2..T, every --stride-th). Any fixed m and s leave attention exact,
so only the noise differs between the variants:

  none        m = 0, s = 1
  plain       m = mean of the first B keys (B = llama.cpp's first ubatch, 512)
  fitted      m = F * that mean, F the per-RoPE-pair map of tq-kmean.h for a cache of T
              positions (llama.cpp's default since issue 13)
  oracle      m = mean of all T keys: the best fixed m, with hindsight
  rope-frame  key p stores k_p - R_p mu, mu the pre-RoPE mean of the first B keys
              (R_p^-1 k_p averaged), the per-key term q.R_p mu added back exactly
  +bal        the same m with llama.cpp's K/Q balancing s from the first B tokens
              (for rope-frame: the same formula on the residual k_p - R_p mu)
  +ubal       rope-frame only: balancing with every key weighted alike (the first version
              of this script, which made rope-frame+bal look worse than rope-frame)
  +bal-all    balancing statistics from all T tokens (hindsight)
  /sinkN      any of the above with the first N keys stored exactly (no noise): what keeping
              the attention-sink tokens at full precision would buy

    python3 scripts/kmean_long_sim.py smol8k.tqkv [--tokens 4096] [--distortion 0.0307]

Needs numpy and a capture that recorded the RoPE frequencies (tq capture of this tree).
"""
import argparse, json, struct, sys
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("capture")
ap.add_argument("--tokens", type=int, default=0, help="use the first N tokens (default: all)")
ap.add_argument("--distortion", type=float, default=0.0307)
ap.add_argument("--first", type=int, default=512, help="tokens of the first ubatch")
ap.add_argument("--stride", type=int, default=128)
ap.add_argument("--layers", default="", help="comma-separated layers (default: all)")
ap.add_argument("--seed", type=int, default=0, help="noise draw")
ap.add_argument("--variants", default="none,plain,fitted,oracle,rope-frame,fitted+bal,fitted+bal-all")
a = ap.parse_args()

f = open(a.capture, "rb")
if f.read(8) != b"TQKVCAP1":
    sys.exit("not a tq capture file")
h = json.loads(f.read(struct.unpack("<I", f.read(4))[0]))
T0, L, nh, nkv, d, dv = h["n_tokens"], h["n_layer"], h["n_head"], h["n_head_kv"], h["head_k"], h["head_v"]
if not h.get("rope"):
    sys.exit("this capture has no RoPE frequencies: make it again with this tree's tq capture")
neox, freqs = h["rope"]["neox"], h["rope"]["freqs"]
T = min(T0, a.tokens) if a.tokens else T0
B, g = min(a.first, T), nh // nkv
layers = [int(x) for x in a.layers.split(",")] if a.layers else list(range(L))
variants = a.variants.split(",")
rng = np.random.default_rng(a.seed)
pos = np.arange(T)


def pairs(w):
    """channel indices (a, b) of each RoPE pair"""
    n = len(w)
    i = np.arange(n)
    return (i, i + d // 2) if neox else (2 * i, 2 * i + 1)


def rot(x, w, p, sign=1.0):
    """RoPE x [T, d] by angle sign * p * w per pair (channels past the pairs unchanged)"""
    y = x.copy()
    if len(w) == 0:
        return y
    ia, ib = pairs(w)
    ang = sign * np.outer(p, w)
    c, s = np.cos(ang), np.sin(ang)
    y[:, ia] = c * x[:, ia] - s * x[:, ib]
    y[:, ib] = s * x[:, ia] + c * x[:, ib]
    return y


def fit_map(m, w, b, n):
    """tq-kmean.h's F applied to the mean m [d]"""
    y = m.copy()
    if len(w) == 0:
        return y
    ia, ib = pairs(w)
    ab = np.exp(1j * np.outer(np.arange(b), w)).mean(0)
    an = np.exp(1j * np.outer(np.arange(n), w)).mean(0)
    den = np.maximum(np.abs(ab) ** 2, np.abs(an) * np.abs(ab))
    F = np.where(den > 0, an * np.conj(ab) / np.where(den > 0, den, 1), 0)
    z = F * (m[ia] + 1j * m[ib])
    y[ia], y[ib] = z.real, z.imag
    return y


def tie(x, w):
    y = x.copy()
    if len(w):
        ia, ib = pairs(w)
        y[ia] = y[ib] = 0.5 * (x[ia] + x[ib])
    return y


def attn_weights(k, q, n_tok):
    """attention each of the first n_tok keys gets from the last 64 of those queries, averaged
    over them and the query heads (tq-kmean.h's balancing weights)"""
    nql = min(n_tok, 64)
    wt = np.zeros(n_tok)
    for j in range(g):
        A = q[n_tok - nql:n_tok, j] @ k[:n_tok].T / np.sqrt(d)
        A += np.triu(np.full((nql, n_tok), -np.inf), n_tok - nql + 1)
        A = np.exp(A - A.max(1, keepdims=True))
        A /= A.sum(1, keepdims=True)
        wt += A.mean(0) / g
    return wt


def balance(k, q, m, w, n_tok):
    """llama.cpp's s (tq-kmean.h) from the first n_tok tokens: attention weights of the last
    64 queries, key energy left after m, query energy over tokens and heads"""
    wt = attn_weights(k, q, n_tok)
    # energy left after m at the cache's T positions, estimated as llama.cpp does:
    # sum_j w_j k_j^2 - 2 m (F kbar_w) + m^2, F the position map from n_tok to T positions
    kw = (wt[:, None] * k[:n_tok]).sum(0)
    rk = (wt[:, None] * k[:n_tok] ** 2).sum(0) - 2 * m * fit_map(kw, w, n_tok, T) + m ** 2
    rk = np.maximum(tie(rk, w), 1e-20)
    rq = np.maximum(tie((q[:n_tok] ** 2).mean((0, 1)), w), 1e-20)
    s = np.clip(rq / rk, 1e-12, 1e12) ** 0.25
    return np.clip(s * np.sqrt(rk.sum() / (s * s * rk).sum()), 1 / 8, 8)


def attn_kl(k, noise, q, corr=None):
    """mean KL(exact || noisy) of causal attention rows; logits q.k vs q.(k + noise)"""
    kl = []
    for t in range(T // 2, T, a.stride):
        for j in range(q.shape[1]):
            qq = q[t, j] / np.sqrt(d)
            l0 = k[: t + 1] @ qq
            l1 = l0 + noise[: t + 1] @ qq
            p = np.exp(l0 - l0.max()); p /= p.sum()
            lq = l1 - l1.max(); lq -= np.log(np.exp(lq).sum())
            kl.append((p * (np.log(p + 1e-300) - lq)).sum())
    return float(np.mean(kl))


res = {v: [] for v in variants}
for l in range(L):
    K = np.frombuffer(f.read(T0 * nkv * d * 2), dtype="<f2").astype(np.float64).reshape(T0, nkv, d)[:T]
    f.read(T0 * nkv * dv * 2)
    Q = np.frombuffer(f.read(T0 * nh * d * 2), dtype="<f2").astype(np.float64).reshape(T0, nh, d)[:T]
    if l not in layers:
        continue
    w = np.array(freqs[l], dtype=np.float64)
    out = {}
    for hk in range(nkv):
        k, q = K[:, hk], Q[:, hk * g:(hk + 1) * g]
        kbar = k[:B].mean(0)
        means = {
            "none": np.zeros(d),
            "plain": kbar,
            "fitted": fit_map(kbar, w, B, T),
            "oracle": k.mean(0),
        }
        for v in variants:
            spec, _, sink = v.partition("/")
            base, _, bal = spec.partition("+")
            z = rng.standard_normal(k.shape)
            if base.startswith("rope-frame"):
                mu = rot(k[:B], w, pos[:B], -1.0).mean(0)
                r = int(base.partition(":")[2] or len(w))
                ia, ib = pairs(w)
                # the r pairs whose mean a fixed vector follows worst: energy of mu on the pair
                # times the part of it RoPE spins away over the cache's T positions
                spin = 1 - np.abs(np.exp(1j * np.outer(pos, w)).mean(0)) ** 2
                sel = np.argsort(-(mu[ia] ** 2 + mu[ib] ** 2) * spin)[:r]
                keep = np.zeros(len(w), bool); keep[sel] = True
                mu_s = mu.copy(); mu_s[ia[~keep]] = 0; mu_s[ib[~keep]] = 0
                m = fit_map(kbar, w, B, T)  # the fixed fitted mean on every other channel
                m[ia[keep]] = 0; m[ib[keep]] = 0
                x = k - rot(np.tile(mu_s, (T, 1)), w, pos) - m
                s = np.ones(d)
                if bal:
                    # llama.cpp's formula on the residual, its key energy weighted by the
                    # attention the first ubatch's last queries give each key (+ubal: every
                    # key alike). Per pair the residual's energy does not depend on position,
                    # so the first B tokens estimate it for all T.
                    wt = attn_weights(k, q, B) if bal == "bal" else np.full(B, 1.0 / B)
                    rk = np.maximum(tie((wt[:, None] * x[:B] ** 2).sum(0), w), 1e-20)
                    rq = np.maximum(tie((q[:B] ** 2).mean((0, 1)), w), 1e-20)
                    s = np.clip(rq / rk, 1e-12, 1e12) ** 0.25
                    s = np.clip(s * np.sqrt(rk.sum() / (s * s * rk).sum()), 1 / 8, 8)
                    x = s * x
            else:
                m = means[base]
                s = np.ones(d)
                if bal:
                    s = balance(k, q, m, w, T if bal == "bal-all" else B)
                x = s * k - s * m
            # noise on the stored vector, seen by the query q / s
            noise = z * np.sqrt(a.distortion * (x ** 2).sum(1, keepdims=True) / d) / s
            if sink:
                noise[: int(sink.removeprefix("sink"))] = 0
            out.setdefault(v, []).append(attn_kl(k, noise, q))
    for v in variants:
        res[v].append(np.mean(out[v]))
    print(f"layer {l:2d}: " + "  ".join(f"{v} {res[v][-1]:.5f}" for v in variants), flush=True)
print(f"T = {T}, first ubatch {B}, distortion {a.distortion}; mean attention KL over layers:")
for v in variants:
    print(f"  {v:16s} {np.mean(res[v]):.5f}  ({np.mean(res[v]) / np.mean(res['fitted']):.3f}x fitted)"
          if "fitted" in res else f"  {v:16s} {np.mean(res[v]):.5f}")
