#!/usr/bin/env python3
"""Write a small random-weight llama-architecture GGUF of any head size, for `tq capture`
on shapes no real model on the registries has (head 128, other GQA ratios).

    python3 -m pip install gguf
    python3 scripts/random_gguf.py --tokenizer-from SmolLM2.gguf --head 128 -o rand-h128.gguf

The tokenizer (every tokenizer.* key) is copied from an existing GGUF so that llama.cpp
can tokenize text; the weights are seeded N(0, 0.02^2) (norms 1), f16. K/V statistics of a
random model are not those of a trained one: this checks shapes and plumbing, and gives a
baseline of "structure-free" keys.
"""
import argparse

import numpy as np
import gguf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-from", required=True, help="GGUF whose tokenizer is copied")
    ap.add_argument("--head", type=int, default=128, help="head size")
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-ff", type=int, default=0, help="feed-forward size (default 4 x n_embd)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()

    src = gguf.GGUFReader(a.tokenizer_from)
    w = gguf.GGUFWriter(a.out, "llama")
    n_embd = a.head * a.n_head
    n_ff = a.n_ff or 4 * n_embd
    vocab = None
    for name, f in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vt = f.types[0]
        val = f.contents()
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, val, vt, sub_type=f.types[-1])
            if name == "tokenizer.ggml.tokens":
                vocab = len(val)
        else:
            w.add_key_value(name, val, vt)
    assert vocab, "no tokenizer.ggml.tokens in the source GGUF"
    w.add_name(f"random-llama-h{a.head}")
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_key_length(a.head)
    w.add_value_length(a.head)
    w.add_rope_dimension_count(a.head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    rng = np.random.default_rng(a.seed)

    def t(name, *shape):
        # numpy shape is ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))

    t("token_embd.weight", vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    kv = a.head * a.n_head_kv
    for i in range(a.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(p + "attn_q.weight", n_embd, n_embd)
        t(p + "attn_k.weight", kv, n_embd)
        t(p + "attn_v.weight", kv, n_embd)
        t(p + "attn_output.weight", n_embd, n_embd)
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
