// tq-llama-graph.h - the calls the patch adds to llama's attention graph (llama-graph.cpp);
// the bodies and the reasoning are in tq-llama-graph.cpp, a translation unit of libllama.
//
// Both build_attn overloads call tq_llama_attn_k on the roped K before the cache's rotation
// and tq_llama_attn_kq once the mask and the cache's views are known; build_attn_mha calls
// tq_llama_prefill_decode before flash attention and tq_llama_fa_k_terms right after it.
#pragma once

#include <cstdint>

struct ggml_context;
struct ggml_cgraph;
struct ggml_tensor;
class llm_graph_result;
struct llama_cparams;
class llama_kv_cache_context;

// K mean removal and K/Q balancing where they keep attention exact (the cache decides; not
// while training; with learned sinks only in RoPE's frame). Returns the K to store; may
// replace *q_cur (balanced queries).
ggml_tensor * tq_llama_attn_k(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res,
                              const llama_cparams & cparams, const ggml_tensor * sinks, ggml_tensor ** q_cur,
                              ggml_tensor * k_cur, const llama_kv_cache_context * mctx, int il, float kq_scale,
                              int rope_type);

// With the mean in RoPE's frame: the per-key term and the exact first keys, as the turbo K
// terms of flash attention, their lowered form (a per-head mask) or keys decoded to f32 for a
// prefill. May replace *kq_mask and *k. q: the queries flash attention gets.
void tq_llama_attn_kq(ggml_context * ctx, llm_graph_result * res, ggml_tensor ** kq_mask, ggml_tensor ** k,
                      const ggml_tensor * v, bool flash_attn, const llama_kv_cache_context * mctx, int il,
                      float kq_scale, ggml_tensor * rot, int rope_type, ggml_tensor * k_cur, ggml_tensor * q);

// The turbo K terms tq_llama_attn_kq chose for layer il, as sources of the flash attention fa.
void tq_llama_fa_k_terms(llm_graph_result * res, ggml_tensor * fa, int il);

// K and V decoded to f32 for a CPU prefill over a turbo cache (tq_ggml_decode_for_prefill).
void tq_llama_prefill_decode(ggml_context * ctx, ggml_tensor ** k, ggml_tensor ** v, int64_t n_tokens);
