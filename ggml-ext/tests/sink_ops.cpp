// ggml-level test of the exact first keys (tq-sink.h), called from tests/ggml_ops.rs: the
// slots written the way llama writes them (ggml_set_rows into f32 and into K's type), then
// read by every flash-attention path over turbo K and V, by the prefill path and by the
// lowered form a device without the turbo K terms gets (a per-head mask, keys plus a
// correction), against f32 attention over the keys the match rule says each path must see.

#include "tq-kmean-rope.h"
#include "tq-sink.h"
#include "tq-ggml.h"
#include "tq-test-util.h"

#include <cmath>
#include <vector>

using namespace tq_test;

namespace {

// head size hd, 2 KV heads of 3 query heads each, nt cells (more than one tile), 2 queries.
// Cells 0, 5, 9 and 20 hold position 0 (four sequences of one cache), each with its slot:
// cell 0's keys are in slot 0 (both heads match), cell 5's head 0 in slot 2 (its head 1 there
// is another key, so only head 0 matches), cell 9's slot is the last, write-only row (none),
// and cell 20 holds cell 0's key but its own slot 1 another: it keeps its decoded key though
// slot 0 has its bytes (two sequences' first keys can quantize alike and still differ).
// Cell 0's key is large and the queries lean on it, as on a real attention sink.
int sink_case(Err & err, int64_t hd, ggml_type kt, ggml_type vt) {
    const int64_t nkv = 2, g = 3, nq = nkv * g, nt = 40, nqt = 2, n = hd * nkv, n_slots = 3;
    Ctx c(64 + (size_t) (hd / 64) * 16);
    std::vector<float> kx = gaussian(n * nt, 11), vx = gaussian(n * nt, 12), qx = gaussian(hd * nqt * nq, 13);
    // a few logits above the rest (q.k0 / sqrt(hd) about 3-5), not all of the weight
    const float lean = 1.2f / std::sqrt((float) hd);
    for (int64_t d = 0; d < n; ++d) kx[d] *= 2.0f;
    memcpy(&kx[20 * n], &kx[0], n * sizeof(float));
    for (int64_t h = 0; h < nq; ++h)
        for (int64_t t = 0; t < nqt; ++t)
            for (int64_t d = 0; d < hd; ++d) qx[(h * nqt + t) * hd + d] += lean * kx[(h / g) * hd + d];

    // the cache and the slots, through ggml_set_rows as llama fills them
    ggml_tensor * kc = ggml_new_tensor_2d(c.ctx, kt, n, nt), * vc = ggml_new_tensor_2d(c.ctx, vt, n, nt);
    ggml_tensor * src = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, nt), * vsrc = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, nt);
    ggml_tensor * idx = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I64, nt);
    fill(src, kx);
    fill(vsrc, vx);
    for (int64_t i = 0; i < nt; ++i) ((int64_t *) idx->data)[i] = i;
    compute(c.ctx, ggml_set_rows(c.ctx, kc, src, idx));
    compute(c.ctx, ggml_set_rows(c.ctx, vc, vsrc, idx));
    std::vector<float> slot_src(n * (n_slots + 1));
    const std::vector<float> other = gaussian(n * 2, 14);
    memcpy(&slot_src[0 * n], &kx[0 * n], n * sizeof(float));
    memcpy(&slot_src[1 * n], &other[0], n * sizeof(float));
    memcpy(&slot_src[2 * n], &kx[5 * n], hd * sizeof(float));
    memcpy(&slot_src[2 * n + hd], &other[n], hd * sizeof(float));
    memcpy(&slot_src[3 * n], &kx[9 * n], n * sizeof(float));
    ggml_tensor * ks = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, n_slots + 1);
    ggml_tensor * rows = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, n_slots + 1);
    ggml_tensor * rq = ggml_new_tensor_2d(c.ctx, kt, n, n_slots + 1);
    ggml_tensor * sidx = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I64, n_slots + 1);
    fill(ks, slot_src);
    for (int64_t i = 0; i <= n_slots; ++i) ((int64_t *) sidx->data)[i] = i;
    ggml_tensor * rows_w, * rq_w;
    tq_sink_write(c.ctx, ks, sidx, rows, rq, &rows_w, &rq_w);
    compute(c.ctx, rows_w);
    compute(c.ctx, rq_w);

    // what each path must see: decoded keys, exact where the rule matches
    std::vector<float> kdec = decode(kc), kref = kdec;
    memcpy(&kref[0 * n], &kx[0 * n], n * sizeof(float));
    memcpy(&kref[5 * n], &kx[5 * n], hd * sizeof(float));
    ggml_tensor * P = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt), * S = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
    for (int64_t i = 0; i < nt; ++i) {
        const bool first = i == 0 || i == 5 || i == 9 || i == 20;
        ((int32_t *) P->data)[i] = first ? 0 : (int32_t) i;
        ((int32_t *) S->data)[i] = i == 0 ? 0 : i == 5 ? 2 : i == 9 ? 3 : i == 20 ? 1 : -1;
    }

    // (1) prefill: the cache's view [hd, nkv, n_kv, 1] decoded, the matching rows replaced
    ggml_tensor * kview = ggml_view_4d(c.ctx, kc, hd, nkv, nt, 1, ggml_row_size(kt, hd), kc->nb[1], kc->nb[1] * nt, 0);
    ggml_tensor * k32 = tq_sink_keys(c.ctx, ggml_cast(c.ctx, kview, GGML_TYPE_F32), kview, S, rows_w, rq_w);
    compute(c.ctx, k32);
    const std::vector<float> pre = decode(k32);
    if (memcmp(pre.data(), kref.data(), kref.size() * sizeof(float)) != 0) {
        for (size_t i = 0; i < kref.size(); ++i) {
            if (pre[i] != kref[i]) {
                return err.fail("sink prefill (hd %lld): value %zu (cell %zu, head %zu) is %g, want %g", (long long) hd, i,
                                i / n, (i % n) / hd, pre[i], kref[i]);
            }
        }
    }

    // (2) flash attention over the cache (permuted as llama's build_attn_mha does)
    auto fa_view = [&](ggml_tensor * t, ggml_type ty) {
        return ggml_view_3d(c.ctx, t, hd, nt, nkv, t->nb[1], ggml_row_size(ty, hd), 0);
    };
    ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nqt, nq);
    fill(q, qx);
    ggml_tensor * mask = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F16, nt, nqt);
    for (int64_t i = 0; i < nt * nqt; ++i) ((ggml_fp16_t *) mask->data)[i] = ggml_fp32_to_fp16(0.0f);
    // a zero per-key term (A = 0), so that the tiles' only change is the sink
    ggml_tensor * A = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, nqt), * T = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, nt);
    ggml_tensor * U = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, TQ_FA_TERM_STEPS);
    memset(A->data, 0, ggml_nbytes(A));
    memset(T->data, 0, ggml_nbytes(T));
    memset(U->data, 0, ggml_nbytes(U));
    const float scale = 1.0f / std::sqrt((float) hd);
    // sink: the exact first keys as sources too (else only the zero term)
    auto attn = [&](ggml_tensor * kk, ggml_tensor * vv, ggml_tensor * mm, int terms = 0, bool sink = false) {
        ggml_tensor * o = ggml_flash_attn_ext(c.ctx, q, kk, vv, mm, scale, 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
        if (terms) set_k_terms(c.ctx, o, A, T, P, U, sink ? rows_w : nullptr, sink ? rq_w : nullptr, sink ? S : nullptr);
        compute(c.ctx, o);
        return decode(o);
    };
    ggml_tensor * kr = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, nt), * vr = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, nt);
    fill(kr, kref);
    fill(vr, decode(vc));
    const std::vector<float> ref = attn(fa_view(kr, GGML_TYPE_F32), fa_view(vr, GGML_TYPE_F32), mask);
    auto off = [&](const std::vector<float> & got) {
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
            worst = std::isfinite(got[i]) ? std::fmax(worst, std::fabs(got[i] - ref[i]) / (1.0 + std::fabs(ref[i]))) : INFINITY;
        }
        return worst;
    };
    const int was_tile = tq_ggml_fa_tile();
    tq_ggml_set_fa_tile(2);
    const double off_plain = off(attn(fa_view(kc, kt), fa_view(vc, vt), mask, 1));
    for (int tile : { 2, 1, 0 }) { // shared GQA tiles (or the fused row past their head size), per head, per key
        tq_ggml_set_fa_tile(tile);
        const double worst = off(attn(fa_view(kc, kt), fa_view(vc, vt), mask, 1, true));
        // measured (hd 64 / 128 / 512): at most 3.3e-7 / 6.6e-7 / 1.0e-6 with the slots, and
        // 0.18 / 0.30 / 0.30 without them
        if (worst > 5e-6 || off_plain < 0.05) {
            tq_ggml_set_fa_tile(was_tile);
            return err.fail("sink FA (tile %d, hd %lld): vs f32 keys with the matched rows exact %g (want <= 5e-6); "
                            "without the slots %g (want >= 0.05)", tile, (long long) hd, worst, off_plain);
        }
    }
    tq_ggml_set_fa_tile(was_tile);

    // (3) the lowered form (a device whose flash attention does not take the terms): the
    // cells with a slot as tq_sink_fill_select lists them (cell 9's slot is none, so it is not
    // listed), then a padding entry that names cell 9 and the write-only row, whose bytes do
    // match: the one-hot map must keep it out
    const int64_t n_sel = 5;
    ggml_tensor * sel = ggml_new_tensor_2d(c.ctx, GGML_TYPE_I32, n_sel, 1), * sel_slot = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, n_sel);
    ggml_tensor * onehot = ggml_new_tensor_4d(c.ctx, GGML_TYPE_F32, n_sel, nt, 1, 1);
    const int32_t sel_c[n_sel] = { 0, 5, 20, 9, 0 }, sel_s[n_sel] = { 0, 2, 1, (int32_t) n_slots, (int32_t) n_slots };
    memset(onehot->data, 0, ggml_nbytes(onehot));
    for (int64_t i = 0; i < n_sel; ++i) {
        ((int32_t *) sel->data)[i] = sel_c[i];
        ((int32_t *) sel_slot->data)[i] = sel_s[i];
        if (i < 3) ((float *) onehot->data)[sel_c[i] * n_sel + i] = 1.0f;
    }
    ggml_tensor * d = tq_sink_delta(c.ctx, kview, sel, sel_slot, rows_w, rq_w);
    // prefill: decoded keys plus D equal the rule's keys up to one rounding of k + (R - k)
    ggml_tensor * k32l = ggml_add(c.ctx, ggml_cast(c.ctx, kview, GGML_TYPE_F32), tq_sink_keys_delta(c.ctx, d, onehot));
    compute(c.ctx, k32l);
    const std::vector<float> prel = decode(k32l);
    for (size_t i = 0; i < kref.size(); ++i) {
        if (!(std::fabs(prel[i] - kref[i]) <= 1e-6f * (1.0f + std::fabs(kref[i])))) {
            return err.fail("lowered sink prefill (hd %lld): value %zu (cell %zu, head %zu) is %g, want %g", (long long) hd,
                            i, i / n, (i % n) / hd, prel[i], kref[i]);
        }
    }
    // decode: flash attention without the terms, over a per-head mask that carries q.D
    ggml_tensor * qc = ggml_cont(c.ctx, ggml_permute(c.ctx, q, 0, 2, 1, 3)); // llama's q: [hd, nq, tokens]
    ggml_tensor * mask4 = ggml_reshape_4d(c.ctx, mask, nt, nqt, 1, 1);
    ggml_tensor * mh = tq_rf_mask(c.ctx, mask4, A, T, scale, tq_sink_mask_delta(c.ctx, qc, d, onehot));
    const double off_low = off(attn(fa_view(kc, kt), fa_view(vc, vt), mh));
    const double off_mask = off(attn(fa_view(kc, kt), fa_view(vc, vt), tq_rf_mask(c.ctx, mask4, A, T, scale)));
    // measured (hd 64 / 512 / 128): 4.2e-5 / 1.0e-4 / 9.0e-5, the f16 mask's rounding of
    // scale q.D; without the corrections 0.24 / 0.40 / 0.78
    if (off_low > 3e-4 || off_mask < 0.05) {
        return err.fail("lowered sink FA (hd %lld): vs f32 keys with the matched rows exact %g (want <= 3e-4); without "
                        "the corrections %g (want >= 0.05)", (long long) hd, off_low, off_mask);
    }
    return 0;
}

} // namespace

extern "C" int tq_test_sink(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    for (int64_t hd : { 64, 512 }) {
        if (sink_case(err, hd, GGML_TYPE_TURBO3, GGML_TYPE_TURBO3)) return 1;
    }
    return sink_case(err, 128, GGML_TYPE_TURBO2, GGML_TYPE_TURBO4);
}
