//! ggml-level tests: real ggml graphs on the CPU backend of the patched llama.cpp
//! (ggml-ext/tests/ggml_ops.cpp), checked against the Rust codec. Needs the `llama`
//! feature, which builds and links ggml.
#![cfg(feature = "llama")]

use std::ffi::{c_char, c_int, CStr};

extern "C" {
    fn tq_test_type_traits(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_set_get_rows(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_mul_mat(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_rot_node(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_kmean(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_kbal(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_kmean_rope(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_kmean_rope_node(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_kmean_stat_w(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_kmean_streams(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_sink(err: *mut c_char, cap: usize) -> c_int;
    fn tq_test_fa_contract(err: *mut c_char, cap: usize, n_devices: *mut c_int) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn tq_test_flash_attn_tiles(
        k_type: c_int,
        v_type: c_int,
        d: i64,
        n_q: i64,
        softcap: f32,
        sinks: c_int,
        max_bias: f32,
        mask_heads: i64,
        err: *mut c_char,
        cap: usize,
    ) -> c_int;
    fn tq_test_flash_attn(
        k_type: c_int,
        v_type: c_int,
        d: i64,
        gqa: i64,
        n_q: i64,
        err: *mut c_char,
        cap: usize,
    ) -> c_int;
}

// ggml type ids (ggml.h at the pin, plus ours from ggml-ext/ggml/tq-ggml.h).
const F16: c_int = 1;
const Q8_0: c_int = 8;
const TURBO2: c_int = 96;
const TURBO3: c_int = 97;
const TURBO4: c_int = 98;
const TURBO3_TCQ: c_int = 99;
const TURBO2_TCQ: c_int = 100;

/// One test at a time: several set the process-wide tile switch (tq_ggml_set_fa_tile) for a
/// while, and a test running beside them would compute with the other test's setting (the
/// lone-against-batched bit checks then fail on a path they did not choose).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check(f: impl FnOnce(*mut c_char, usize) -> c_int) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::hint::black_box(turboquant_capi::link_anchor());
    let mut buf = [0 as c_char; 512];
    let rc = f(buf.as_mut_ptr(), buf.len());
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    assert_eq!(rc, 0, "{msg}");
}

#[test]
fn type_traits_match_the_codec() {
    check(|e, n| unsafe { tq_test_type_traits(e, n) });
}

#[test]
fn set_rows_then_get_rows_and_cpy_equal_the_rust_codec_bit_for_bit() {
    check(|e, n| unsafe { tq_test_set_get_rows(e, n) });
}

#[test]
fn mul_mat_with_turbo_keys_equals_f32_of_decoded_keys() {
    check(|e, n| unsafe { tq_test_mul_mat(e, n) });
}

#[test]
fn rotation_node_equals_mul_mat_and_is_row_invariant() {
    check(|e, n| unsafe { tq_test_rot_node(e, n) });
}

#[test]
fn flash_attn_turbo_pairs_equal_f32_reference_for_every_head_size_and_gqa() {
    let turbo = [TURBO2, TURBO3, TURBO4, TURBO3_TCQ, TURBO2_TCQ];
    for &k in &turbo {
        for &v in &turbo {
            for d in [64, 128, 256] {
                for gqa in [1, 3, 8] {
                    check(|e, n| unsafe { tq_test_flash_attn(k, v, d, gqa, 3, e, n) });
                }
            }
        }
    }
}

#[test]
fn flash_attn_decode_split_kv_equals_f32_reference() {
    for (k, v) in [
        (TURBO4, TURBO4),
        (TURBO2, TURBO3),
        (Q8_0, TURBO3),
        (TURBO3, F16),
        (TURBO3_TCQ, TURBO3_TCQ),
        (TURBO4, TURBO2_TCQ),
    ] {
        for d in [64, 256] {
            check(|e, n| unsafe { tq_test_flash_attn(k, v, d, 8, 1, e, n) });
        }
    }
}

#[test]
fn flash_attn_prefill_batch_equals_tiled_f32_reference() {
    for (k, v) in [(TURBO4, TURBO4), (TURBO3, TURBO2)] {
        for d in [64, 128] {
            check(|e, n| unsafe { tq_test_flash_attn(k, v, d, 3, 80, e, n) });
        }
    }
}

#[test]
fn flash_attn_mixed_pairs_equal_f32_reference() {
    for (k, v) in [
        (TURBO4, TURBO2),
        (Q8_0, TURBO3),
        (TURBO3, F16),
        (TURBO4, Q8_0),
    ] {
        for d in [64, 128, 256] {
            check(|e, n| unsafe { tq_test_flash_attn(k, v, d, 3, 3, e, n) });
        }
    }
}

/// The tiled turbo decode path (tq-ggml-fa.h) equals ggml's per-key loop and the f32
/// reference: holes in the mask, ALiBi, softcap, sinks, split-KV and plain decode, with one
/// mask for all heads and with a mask per head.
#[test]
fn flash_attn_tiled_decode_equals_per_key_loop() {
    for (k, v) in [
        (TURBO4, TURBO4),
        (TURBO3, TURBO3),
        (TURBO2, TURBO4),
        (TURBO3_TCQ, TURBO2_TCQ),
    ] {
        for d in [64, 128] {
            for (n_q, softcap, sinks, max_bias) in [
                (1, 0.0, 0, 0.0),
                (1, 30.0, 1, 0.0),
                (3, 0.0, 1, 8.0),
                (2, 20.0, 0, 0.0),
                (8, 0.0, 0, 0.0),
                // prefill chunks: the decoded key windows (tq-fa-window.h)
                (80, 0.0, 1, 8.0),
                (80, 20.0, 0, 0.0),
            ] {
                // one mask row for all heads, then one per head (the K mean in RoPE's frame)
                for mask_heads in [1, 6] {
                    check(|e, n| unsafe {
                        tq_test_flash_attn_tiles(
                            k, v, d, n_q, softcap, sinks, max_bias, mask_heads, e, n,
                        )
                    });
                }
            }
        }
    }
}

/// K mean removal (ggml-ext/llama/tq-kmean.h): the three modes, attention unchanged by
/// the shift, and the K-shift correction (re-roping stored k - m gives rope(k) - m).
#[test]
fn k_mean_removal_modes_invariance_and_k_shift() {
    check(|e, n| unsafe { tq_test_kmean(e, n) });
}

/// K/Q channel balancing (ggml-ext/llama/tq-kmean.h): logits exact in every mode, s tied
/// on RoPE pairs, energy-preserving, the Cauchy-Schwarz optimum, commuting with RoPE (full
/// and partial: n_rot 16 of a 64-wide head, both pairings).
#[test]
fn k_q_channel_balancing_is_logit_exact_and_rope_tied() {
    check(|e, n| unsafe { tq_test_kbal(e, n) });
}

/// The K mean in RoPE's frame (ggml-ext/llama/tq-kmean-rope.h): every logit exact per key
/// through the per-head mask and through the f32 keys, SET and KEEP, with and without
/// balancing, both RoPE layouts; SET takes the roped common component out at every position.
/// Partial RoPE too (head 64, n_rot 16 and 32, NEOX and normal, keys roped by ggml_rope_ext):
/// the roped channels in RoPE's frame, the rest a plain mean, and the turbo flash attention
/// with the term (with soft cap, with sinks) equal to attention over f32 keys.
#[test]
fn k_mean_in_rope_frame_is_logit_exact_per_key() {
    check(|e, n| unsafe { tq_test_kmean_rope(e, n) });
}

/// The lowered terms with the layer's own rope node (tq_rf_rope_of): the stored keys, the
/// cells' table and R_p mu' equal the host table's within ggml's f32 angles, and the logits
/// through the stored keys plus the rope table's mask equal q.k.
#[test]
fn k_mean_through_the_layers_rope_matches_the_table() {
    check(|e, n| unsafe { tq_test_kmean_rope_node(e, n) });
}

/// The SET statistics' token weights (tq_kmean_stat_weights in ggml-ext/llama/tq-kmean.h):
/// position 0 counts nothing where the first keys are exact, and then an outlier key there
/// leaves the stored pre-RoPE mean at the other tokens' mean, which equal weights do not.
#[test]
fn k_statistics_leave_out_the_exact_first_key() {
    check(|e, n| unsafe { tq_test_kmean_stat_w(e, n) });
}

/// Statistics per stream (tq_kmean_rf_streams in ggml-ext/llama/tq-kmean.h): a block of a
/// ubatch gets the bits it would get alone (keys, queries, coefficients, its stream's stored
/// column), a stream that starts in a busy cache inherits the shared column, one too small
/// to set statistics runs plain, and the kept streams run on their stored columns.
#[test]
fn k_statistics_per_stream_are_each_streams_own() {
    check(|e, n| unsafe { tq_test_kmean_streams(e, n) });
}

/// The exact first keys (ggml-ext/llama/tq-sink.h): slots written as llama writes them;
/// the prefill path, every flash-attention tile path over turbo K/V and the lowered form
/// (per-head mask, corrected keys: a device without the terms) read a slot's exact
/// row exactly where a cell at position 0 matches it byte for byte, per KV head, and never
/// the write-only last row.
#[test]
fn first_keys_exact_where_the_bytes_match() {
    check(|e, n| unsafe { tq_test_sink(e, n) });
}

/// The turbo K terms of flash attention (ggml-ext/ggml/tq-fa-contract.h) are an explicit
/// contract: every device of this build answers ggml's supports_op for an op that carries
/// them, and only the ones that compute them say yes (the CPU over turbo K and V); a device
/// without them refuses, so the scheduler never hands it an op whose logits it would change.
#[test]
fn flash_attn_k_terms_run_or_are_refused_on_every_device() {
    let mut n: c_int = 0;
    check(|e, c| unsafe { tq_test_fa_contract(e, c, &mut n) });
    assert!(n >= 1, "no ggml device registered");
}
