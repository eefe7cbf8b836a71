#!/usr/bin/env python3
"""Write a small random-weight GGUF of any head size, for `tq capture` on shapes no real
model on the registries has (head 128, other GQA ratios), and for `tq memory`'s checks on
hybrid architectures (attention layers plus recurrent layers that hold a state, not a KV
cache):

    --arch llama          (default) every layer is attention
    --arch lfm2           LFM2: short-convolution layers (recurrent state R only) and
                          attention layers; --swa N makes the attention layers sliding-window
    --arch granitehybrid  Granite-4.0-H: Mamba-2 layers (conv state R and SSM state S) and
                          attention layers

and for the attention variants of the model families (tests/model_families.rs,
docs/FAMILIES.md):

    --arch gemma2         attention logit soft-capping (50, final 30), every other layer a
                          sliding window (--swa, default 4096), Gemma's post-norms
    --arch gpt-oss        learned attention sinks (blk.N.attn_sinks, one logit per head),
                          a sliding window on every other layer, a small MoE feed-forward
    --arch stablelm       partial RoPE: --rot channels of each head rotate (default head/4)
    --arch deepseek2      MLA: q_lora / kv_lora compression (--q-lora, --kv-lora), the cache
                          holds kv_lora + --rot channels per token and no V; --head is the
                          per-head K/V size after decompression
    --arch llama --head 512  512-wide heads

    PYTHONPATH=vendor/llama.cpp/gguf-py python3 scripts/random_gguf.py \
        --tokenizer-from SmolLM2.gguf --head 128 -o rand-h128.gguf
    ... --arch lfm2 --n-layer 6 --attn-every 3 -o rand-lfm2.gguf

gguf-py of the pinned llama.cpp tree (vendor/llama.cpp/gguf-py) needs numpy and pyyaml;
the PyPI `gguf` package works too where it knows the architecture.

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
    ap.add_argument("--arch", choices=["llama", "lfm2", "granitehybrid", "gemma2", "gpt-oss",
                                       "stablelm", "deepseek2"], default="llama")
    ap.add_argument("--rot", type=int, default=0,
                    help="RoPE channels per head (default: all; stablelm head/4; deepseek2 64)")
    ap.add_argument("--q-lora", type=int, default=128, help="deepseek2: q_lora_rank")
    ap.add_argument("--kv-lora", type=int, default=256, help="deepseek2: kv_lora_rank")
    ap.add_argument("--n-expert", type=int, default=4, help="gpt-oss: experts (2 used)")
    ap.add_argument("--sink", type=float, default=2.0, help="gpt-oss: mean of the sink logits")
    ap.add_argument("--attn-every", type=int, default=3,
                    help="hybrids: layer i is attention iff (i + 1) %% N == 0, else recurrent")
    ap.add_argument("--swa", type=int, default=0,
                    help="lfm2, gemma2, gpt-oss: sliding window of the (window) attention layers")
    ap.add_argument("--l-cache", type=int, default=3, help="lfm2: short-convolution length")
    ap.add_argument("--d-conv", type=int, default=4, help="granitehybrid: Mamba-2 conv kernel")
    ap.add_argument("--d-state", type=int, default=64, help="granitehybrid: Mamba-2 state size")
    ap.add_argument("--ssm-heads", type=int, default=8, help="granitehybrid: Mamba-2 heads")
    ap.add_argument("--ssm-groups", type=int, default=1, help="granitehybrid: Mamba-2 groups")
    ap.add_argument("--k-bias", type=float, default=0.0,
                    help="family archs but deepseek2: attn_k.bias ~ N(0, B^2) per channel, a common "
                         "key component (what the turbo K mean takes out; 0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()

    src = gguf.GGUFReader(a.tokenizer_from)
    w = gguf.GGUFWriter(a.out, a.arch)
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
    w.add_name(f"random-{a.arch}-h{a.head}")
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(a.n_head)
    if a.arch in ("gemma2", "gpt-oss", "stablelm", "deepseek2"):
        return families(a, w, vocab, n_embd, n_ff)
    hybrid = a.arch != "llama"
    attn = [not hybrid or (i + 1) % a.attn_every == 0 for i in range(a.n_layer)]
    # hybrids: a recurrent layer is one with 0 KV heads (llama.cpp's is_recr rule)
    w.add_head_count_kv([a.n_head_kv if x else 0 for x in attn] if hybrid else a.n_head_kv)
    w.add_key_length(a.head)
    w.add_value_length(a.head)
    w.add_rope_dimension_count(a.head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    d_inner = 2 * n_embd  # granitehybrid: llama.cpp supports an expansion factor of 2 only
    if a.arch == "lfm2":
        w.add_shortconv_l_cache(a.l_cache)
        if a.swa:
            w.add_sliding_window(a.swa)
    elif a.arch == "granitehybrid":
        w.add_ssm_conv_kernel(a.d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(a.d_state)
        w.add_ssm_time_step_rank(a.ssm_heads)
        w.add_ssm_group_count(a.ssm_groups)

    rng = np.random.default_rng(a.seed)

    def t(name, *shape):
        # numpy shape is ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))

    def ones(name, *shape):
        w.add_tensor(name, np.ones(shape, dtype=np.float32))

    t("token_embd.weight", vocab, n_embd)
    # LFM2's final norm is stored under token_embd_norm (llama.cpp's OUTPUT_NORM_LFM2)
    ones("token_embd_norm.weight" if a.arch == "lfm2" else "output_norm.weight", n_embd)
    kv = a.head * a.n_head_kv
    for i in range(a.n_layer):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", n_embd)
        if attn[i]:
            if a.arch == "lfm2":
                ones(p + "attn_q_norm.weight", a.head)
                ones(p + "attn_k_norm.weight", a.head)
            t(p + "attn_q.weight", n_embd, n_embd)
            t(p + "attn_k.weight", kv, n_embd)
            if a.k_bias:
                t(p + "attn_k.bias", kv, scale=a.k_bias, dtype=np.float32)
            t(p + "attn_v.weight", kv, n_embd)
            t(p + "attn_output.weight", n_embd, n_embd)
        elif a.arch == "lfm2":
            # ggml shapes {l_cache, n_embd}, {n_embd, 3 n_embd}, {n_embd, n_embd}
            w.add_tensor(p + "shortconv.conv.weight",
                         (rng.standard_normal((n_embd, a.l_cache)) * 0.02).astype(np.float32))
            t(p + "shortconv.in_proj.weight", 3 * n_embd, n_embd)
            t(p + "shortconv.out_proj.weight", n_embd, n_embd)
        else:  # granitehybrid: Mamba-2 mixer
            ng, ds, nh = a.ssm_groups, a.d_state, a.ssm_heads
            conv_ch = d_inner + 2 * ng * ds
            t(p + "ssm_in.weight", 2 * d_inner + 2 * ng * ds + nh, n_embd)
            w.add_tensor(p + "ssm_conv1d.weight",
                         (rng.standard_normal((conv_ch, a.d_conv)) * 0.02).astype(np.float32))
            w.add_tensor(p + "ssm_conv1d.bias", np.zeros(conv_ch, dtype=np.float32))
            w.add_tensor(p + "ssm_dt.bias", np.zeros(nh, dtype=np.float32))
            w.add_tensor(p + "ssm_a", -np.ones((nh, 1), dtype=np.float32))  # A = -exp(A_log)
            ones(p + "ssm_d", nh, 1)
            ones(p + "ssm_norm.weight", ng, d_inner // ng)
            t(p + "ssm_out.weight", n_embd, d_inner)
        ones(p + "ffn_norm.weight", n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def families(a, w, vocab, n_embd, n_ff):
    """The attention variants: every layer attention, f16 weights N(0, 0.02^2), norms 1."""
    arch, hd = a.arch, a.head
    rot = a.rot or {"stablelm": hd // 4, "deepseek2": 64}.get(arch, hd)
    mla = arch == "deepseek2"
    # MLA caches one latent "head" per token: kv_lora + the RoPE part as K, kv_lora as V
    w.add_head_count_kv(1 if mla else a.n_head_kv)
    w.add_key_length(a.kv_lora + rot if mla else hd)
    w.add_value_length(a.kv_lora if mla else hd)
    w.add_rope_dimension_count(rot)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if arch == "gemma2":
        w.add_sliding_window(a.swa or 4096)
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    elif arch == "gpt-oss":
        w.add_sliding_window(a.swa or 128)
        w.add_expert_count(a.n_expert)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(n_ff)
    elif arch == "stablelm":
        w.add_layer_norm_eps(1e-5)
    elif mla:
        w.add_q_lora_rank(a.q_lora)
        w.add_kv_lora_rank(a.kv_lora)
        w.add_key_length_mla(hd)  # nope + rope
        w.add_value_length_mla(hd)
        w.add_leading_dense_block_count(a.n_layer)  # every layer dense: no MoE needed
        w.add_expert_feed_forward_length(n_ff)
        w.add_expert_shared_count(1)
        assert hd > rot, "deepseek2: --head (nope + rope) must exceed --rot"

    rng = np.random.default_rng(a.seed)

    def t(name, *shape, scale=0.02, dtype=np.float16):
        # numpy shape is ggml's ne reversed
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(dtype))

    def ones(name, *shape):
        w.add_tensor(name, np.ones(shape, dtype=np.float32))

    def zeros(name, *shape):
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))

    t("token_embd.weight", vocab, n_embd)
    ones("output_norm.weight", n_embd)
    if arch == "stablelm":
        zeros("output_norm.bias", n_embd)
    if arch != "gemma2":  # gemma2 ties the output to token_embd
        t("output.weight", vocab, n_embd)
    nh, kv = a.n_head, hd * a.n_head_kv
    for i in range(a.n_layer):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", n_embd)
        if arch == "stablelm":
            zeros(p + "attn_norm.bias", n_embd)
        if mla:
            ones(p + "attn_q_a_norm.weight", a.q_lora)
            ones(p + "attn_kv_a_norm.weight", a.kv_lora)
            t(p + "attn_q_a.weight", a.q_lora, n_embd)
            t(p + "attn_q_b.weight", nh * hd, a.q_lora)
            t(p + "attn_kv_a_mqa.weight", a.kv_lora + rot, n_embd)
            # ggml {nope, kv_lora, n_head} and {kv_lora, v, n_head}
            t(p + "attn_k_b.weight", nh, a.kv_lora, hd - rot)
            t(p + "attn_v_b.weight", nh, hd, a.kv_lora)
            t(p + "attn_output.weight", n_embd, nh * hd)
        else:
            t(p + "attn_q.weight", nh * hd, n_embd)
            t(p + "attn_k.weight", kv, n_embd)
            if a.k_bias:
                t(p + "attn_k.bias", kv, scale=a.k_bias, dtype=np.float32)
            t(p + "attn_v.weight", kv, n_embd)
            t(p + "attn_output.weight", n_embd, nh * hd)
        if arch in ("gemma2", "gpt-oss"):
            ones(p + "post_attention_norm.weight", n_embd)
        if arch == "gpt-oss":
            zeros(p + "attn_output.bias", n_embd)
            # the learned sink: one logit per head, against keys whose logits are ~0 here
            w.add_tensor(p + "attn_sinks.weight",
                         (a.sink + rng.standard_normal(nh) * 0.5).astype(np.float32))
            ne = a.n_expert
            t(p + "ffn_gate_inp.weight", ne, n_embd, dtype=np.float32)
            zeros(p + "ffn_gate_inp.bias", ne)
            t(p + "ffn_gate_exps.weight", ne, n_ff, n_embd)
            t(p + "ffn_up_exps.weight", ne, n_ff, n_embd)
            t(p + "ffn_down_exps.weight", ne, n_embd, n_ff)
            zeros(p + "ffn_gate_exps.bias", ne, n_ff)
            zeros(p + "ffn_up_exps.bias", ne, n_ff)
            zeros(p + "ffn_down_exps.bias", ne, n_embd)
            continue
        ones(p + "ffn_norm.weight", n_embd)
        if arch == "stablelm":
            zeros(p + "ffn_norm.bias", n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
        if arch == "gemma2":
            ones(p + "post_ffw_norm.weight", n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
