// tq-rf-keep.cpp - tq_rf_keep_op, the one definition of the fused K side's function
// (tq-rf-keep.h), built into ggml-base so that llama's graph and every backend see one address.

#include "tq-rf-keep.h"

#include "ggml-impl.h"

#include <cstddef>

// tq_rf_keep_is and tq_rf_keep_flags read the custom op's parameters by these offsets
static_assert(offsetof(ggml_custom_op_params, fun) == 0, "ggml_custom_op_params: fun is no longer first");
static_assert(offsetof(ggml_custom_op_params, userdata) == sizeof(ggml_custom_op_t) + sizeof(void *),
              "ggml_custom_op_params: userdata moved");

void tq_rf_keep_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const tq_rf_pairs pr = tq_rf_pairs_of(userdata);
    const bool bal = ((uintptr_t) userdata & TQ_RF_KEEP_BAL) != 0;
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * km = dst->src[2], * T = dst->src[3];
    const int64_t hd = k->ne[0], nkv = k->ne[1], nt = k->ne[2], nq = q->ne[1], g = nq / nkv, per = nt / km->ne[1];
    float * kd = (float *) dst->data, * qd = kd + hd * nkv * nt, * ad = qd + hd * nq * nt;
    for (int64_t r = ith; r < nkv * nt; r += nth) {
        const int64_t h = r % nkv, t = r / nkv;
        const float * mu = (const float *) ((const char *) km->data + (t / per) * km->nb[1]);
        const float * m = mu + h * hd, * d = bal ? mu + hd * nkv + h * hd : nullptr;
        const float * kx = (const float *) ((const char *) k->data + h * k->nb[1] + t * k->nb[2]);
        float * ko = kd + (t * nkv + h) * hd;
        float rm[TQ_RF_HD_MAX];
        if (T) {
            tq_rf_rotate_row(pr, hd, (const float *) ((const char *) T->data + t * T->nb[1]), m, rm);
        } else {
            memcpy(rm, m, hd * sizeof(float));
        }
        for (int64_t c = 0; c < hd; ++c) {
            ko[c] = (d ? kx[c] * (1.0f + d[c]) : kx[c]) - rm[c];
        }
        for (int64_t j = h * g; j < (h + 1) * g; ++j) {
            const float * qx = (const float *) ((const char *) q->data + j * q->nb[1] + t * q->nb[2]);
            float * qo = qd + (t * nq + j) * hd, * ao = ad + (t * nq + j) * hd;
            for (int64_t c = 0; c < hd; ++c) {
                qo[c] = d ? qx[c] / (1.0f + d[c]) : qx[c];
            }
            tq_rf_coeffs_row(pr, hd, qo, m, ao);
        }
    }
}
