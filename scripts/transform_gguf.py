#!/usr/bin/env python3
"""Give a real llama-arch GGUF (SmolLM2) massive K channels while it stays the same model.

In every layer and every KV head a few RoPE pairs of K are multiplied by c and the matching
pairs of every query head that reads that KV head by 1/c: each q.k product, hence every
attention logit, is unchanged (up to rounding), but the cache now holds K channels c times
larger than the rest, the case a quantized K cache finds hardest.

    PYTHONPATH=vendor/llama.cpp/gguf-py python3 scripts/transform_gguf.py \
        SmolLM2.gguf -o smollm2-k100.gguf --scale 100 [--k-bias 4]

Layout: llama.cpp's convert_hf_to_gguf.py permutes the HF rows of attn_q / attn_k of the
llama arch (LlamaModel.permute: per head, HF rows j and j + d/2, the halves that HF's
rotate_half pairs, become GGUF rows 2j and 2j + 1), and llama.cpp ropes the llama arch with
LLAMA_ROPE_TYPE_NORM, which rotates rows (2j, 2j + 1). So RoPE pair j of a head is GGUF rows
2j and 2j + 1 of it, turning at theta_j = freq_base^(-2j/d) per position; both rows of a
pair are scaled by the same c, which commutes with the rotation.

--k-bias B adds attn_k.bias (llama arch loads it: llama_model_base::create_tensor_qkv) with
c * B on both rows of the --bias-pairs (default: the lowest-frequency pair). A key bias is
softmax-invariant only where RoPE leaves it still (q.b is then the same for every key); on
a rotated pair q.R(n - m)b changes with distance, by at most |q_j| |B| theta_j (n - m): on
SmolLM2's lowest pair (freq_base 1e5, theta = 1.4e-5) that is 6 % of q.b over 4096 tokens,
and the f16 PPL shows how much it moves (docs/FAMILIES.md).

The Q4_1 attn_q / attn_k of SmolLM2 are dequantized (gguf.quants) and written as F32 (the
scaled rows exact); every other tensor is copied as stored. --scale 1 gives the control: the
same dequantized F32 attn_q / attn_k without any scaling (F32 weights skip the Q8_1
activations of a Q4_1 matmul, so the control, not the original, is the file whose f16
logits the transformed ones should reproduce to the last rounding).
"""
import argparse

import numpy as np
import gguf


def pairs_arg(s):
    return [int(x) for x in s.split(",") if x != ""]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="llama-arch GGUF (SmolLM2)")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--scale", type=float, default=100.0, help="c: K pairs x c, Q pairs x 1/c")
    ap.add_argument("--pairs", type=pairs_arg, default=None,
                    help="RoPE pairs j (0 = highest frequency) scaled in every KV head; "
                         "default: the lowest-frequency pair and the middle one (d/2 - 1, d/4)")
    ap.add_argument("--k-bias", type=float, default=0.0,
                    help="B: attn_k.bias = c * B on both rows of each --bias-pairs pair")
    ap.add_argument("--bias-pairs", type=pairs_arg, default=None,
                    help="pairs that get the bias (default: the lowest-frequency pair, d/2 - 1)")
    a = ap.parse_args()

    r = gguf.GGUFReader(a.model)
    arch = r.fields["general.architecture"].contents()
    assert arch == "llama", f"{arch}: only the llama arch's row layout (NORM RoPE) is handled"

    def kv(key):
        return r.fields[f"{arch}.{key}"].contents()

    n_head, n_head_kv = kv("attention.head_count"), kv("attention.head_count_kv")
    n_embd = kv("embedding_length")
    d = n_embd // n_head
    if f"{arch}.attention.key_length" in r.fields:
        d = kv("attention.key_length")
    n_rot = kv("rope.dimension_count") if f"{arch}.rope.dimension_count" in r.fields else d
    assert n_rot == d, "partial RoPE: the pairs would not all rotate"
    pairs = a.pairs if a.pairs is not None else [d // 2 - 1, d // 4]
    bias_pairs = a.bias_pairs if a.bias_pairs is not None else [d // 2 - 1]
    assert all(0 <= j < d // 2 for j in pairs + bias_pairs), "a pair outside the head"
    group = n_head // n_head_kv
    c = a.scale

    # rows (within a head) of the scaled pairs, and of the biased ones
    rows = np.array([r_ for j in pairs for r_ in (2 * j, 2 * j + 1)])
    brows = np.array([r_ for j in bias_pairs for r_ in (2 * j, 2 * j + 1)])
    k_rows = np.concatenate([h * d + rows for h in range(n_head_kv)])
    q_rows = np.concatenate([h * d + rows for h in range(n_head)])
    assert all(h // group < n_head_kv for h in range(n_head))

    w = gguf.GGUFWriter(a.out, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), vt)
    w.add_string("general.transform",
                 f"K pairs {pairs} x {c:g}, Q x 1/{c:g}; K bias {a.k_bias:g} x {c:g} on {bias_pairs}")

    n_k = 0
    for t in r.tensors:
        parts = t.name.split(".")
        kind = parts[2] if len(parts) == 4 and parts[0] == "blk" else None
        if kind in ("attn_q", "attn_k") and parts[3] == "weight":
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            x = x.reshape(-1, n_embd).copy()  # rows = output channels
            if kind == "attn_k":
                assert x.shape[0] == n_head_kv * d, (t.name, x.shape)
                x[k_rows] *= c
                n_k += 1
            else:
                assert x.shape[0] == n_head * d, (t.name, x.shape)
                x[q_rows] /= c
            w.add_tensor(t.name, x)
            if kind == "attn_k" and a.k_bias != 0.0:
                b = np.zeros(n_head_kv * d, dtype=np.float32)
                for h in range(n_head_kv):
                    b[h * d + brows] = c * a.k_bias
                w.add_tensor(f"blk.{parts[1]}.attn_k.bias", b)
        else:
            # quantized data comes as bytes (rows, row bytes): the writer maps it back
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    assert n_k > 0, "no attn_k.weight found"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
