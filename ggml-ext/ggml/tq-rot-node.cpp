// tq-rot-node.cpp - tq_rot_op, the one definition of the rotation node's function
// (tq-rot-node.h), built into ggml-base so that llama's graph and every backend see one address.

#include "tq-rot-node.h"

#include "ggml-impl.h"

void tq_rot_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const ggml_tensor * rot = dst->src[0], * x = dst->src[1];
    const int64_t n = rot->ne[0], rows = x->ne[1];
    const float * r = (const float *) rot->data;
    for (int64_t j = ith; j < rows; j += nth) {
        const float * xr = (const float *) ((const char *) x->data + j * x->nb[1]);
        float * yr = (float *) ((char *) dst->data + j * dst->nb[1]);
        for (int64_t i = 0; i < n; ++i) {
            yr[i] = tq_rot_dot(r + i, xr, n);
        }
    }
}
