// tq-tcq-encode.cuh - the trellis encoder (turbo3_tcq / turbo2_tcq) on the GPU: one 64-value
// block per warp, the bit-exact port of the Rust codec's encoder (crates/codec/src/tcq/codec.rs
// and viterbi.rs; the rule is docs/TCQ.md, "Encoding rule").
//
// Lane layout: lane l holds the path costs of states s = 32 i + l, i = 0..7. With
// G = 2^(8-k) groups, the predecessors of group j (states hi G + j, hi = 0 .. 2^k - 1) all
// live in lane j mod 32, slots hi G/32 + j/32: every lane forms the minima of its own
// G/32 groups (k = 3: one, k = 2: two) in registers, over hi = 0, 1, .. with a strict `<`
// (ties to the lowest hi), exactly the portable Rust step. The new cost of state 32 i + l
// needs the minimum of group (32 i + l) >> k, which sits in lane ((32 i + l) >> k) mod 32,
// register (32 i >> k) / 32 (the same for every lane): eight shuffles per step with a fixed
// source pattern. The forward pass records each group's argmin (the traceback's choice in
// Rust: the lowest hi whose cost equals the group minimum) in shared memory; the traceback
// then follows them, identically in every lane.
//
// Arithmetic: the path costs in f32 as `m + e * e`, `e = u - T` with __fsub_rn / __fmul_rn /
// __fadd_rn (never contracted into FMA under ggml's -use_fast_math), the norm, u = x / (n/8)
// and the scale fit in f64 with explicitly rounded intrinsics, sums sequential in value order
// as in Rust. Flush-to-zero cannot change a result: |u| <= 8 and every table entry has
// |T| >= 0.025, so a subnormal u gives u - T == -T either way, and a nonzero e is at least
// an ulp of T, whose square is a normal f32.
//
// Host build: the same source runs with the 32 lanes emulated in lockstep (tq_lane<T> is
// one register on the device, an array of 32 on the host; TQ_LANES(l) is the current lane
// on the device, a loop over the lanes on the host). Each TQ_LANES section reads shuffled
// values only of variables written in an earlier section, so the host loop sees what the
// warp would. tq-parity.cu --host runs it against the Rust codec.
#pragma once

#include "tq-tcq.cuh"

// The parity test counts the exact ties the group minima resolve (host build only).
#ifndef TQ_TCQ_ON_TIE
#define TQ_TCQ_ON_TIE(cost)
#endif

#ifdef __CUDA_ARCH__
template <typename T> struct tq_lane {
    T v;
    __device__ __forceinline__ T & operator[](int) { return v; }
    __device__ __forceinline__ const T & operator[](int) const { return v; }
};
#define TQ_LANES(l) for (int l = (int) (threadIdx.x % 32), l##_once = 1; l##_once; l##_once = 0)
// Lane src's value of x (every lane of the warp calls it, as __shfl_sync requires).
template <typename T> static __device__ __forceinline__ T tq_lane_get(const tq_lane<T> & x, const int src) {
    return __shfl_sync(0xffffffffu, x.v, src, 32);
}
#define TQ_WARP_SYNC() __syncwarp()
#else
template <typename T> struct tq_lane {
    T v[32];
    T & operator[](int l) { return v[l]; }
    const T & operator[](int l) const { return v[l]; }
};
#define TQ_LANES(l) for (int l = 0; l < 32; ++l)
template <typename T> static inline T tq_lane_get(const tq_lane<T> & x, const int src) {
    return x.v[src];
}
#define TQ_WARP_SYNC()
#endif

// Per-warp working memory (shared memory on the device): each step's group argmins
// (one byte per group) and the final path's states.
template <int K> struct tq_tcq_scratch {
    uint8_t bp[TQ_BLOCK_VALUES - 1][256 >> K];
    uint8_t st[TQ_BLOCK_VALUES];
};

// One Viterbi pass over 64 values (value t in lane t mod 32 of ua for t < 32, of ub after).
// TB: only start states with s >> k == o and end states with s mod G == o (the tail-biting
// pass); else any start, any end. Traces back from the best end state down to value stop
// (writing sc.st[stop..63] when store) and returns the state at value stop.
template <int K, bool TB, bool store>
static TQ_HD uint32_t tq_tcq_pass(const tq_lane<float> & ua, const tq_lane<float> & ub, const tq_lane<float> (&tab)[8],
                                  const uint32_t o, tq_tcq_scratch<K> & sc, const int stop) {
    static_assert(K == 2 || K == 3, "k = 2 or 3");
    constexpr int G  = 256 >> K;    // groups (also the overlap range)
    constexpr int R  = G / 32;      // groups per lane
    constexpr int NH = 1 << K;      // predecessors per group
    tq_lane<float> c[8];

    const float u0 = tq_lane_get(ua, 0);
    TQ_LANES(l) {
TQ_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t s = 32*i + l;
            const float e = tq_fsub(u0, tab[i][l]);
            c[i][l] = (TB && (s >> K) != o) ? INFINITY : tq_fmul(e, e);
        }
    }
    for (int t = 1; t < TQ_BLOCK_VALUES; ++t) {
        tq_lane<float> m[R];
        tq_lane<float> ucur;
        TQ_LANES(l) {
TQ_UNROLL
            for (int r = 0; r < R; ++r) {
                float mv = c[r][l];
                int a = 0;
TQ_UNROLL
                for (int hi = 1; hi < NH; ++hi) {
                    const float cc = c[hi*R + r][l];
                    if (cc < mv) {
                        mv = cc;
                        a = hi;
                    } else if (cc == mv) {
                        TQ_TCQ_ON_TIE(cc);
                    }
                }
                m[r][l] = mv;
                sc.bp[t - 1][32*r + l] = (uint8_t) a;
            }
            ucur[l] = t < 32 ? ua[l] : ub[l];
        }
        const float ut = tq_lane_get(ucur, t % 32);
        TQ_LANES(l) {
TQ_UNROLL
            for (int i = 0; i < 8; ++i) {
                const int src = ((32*i + l) >> K) % 32;
                const float mm = tq_lane_get(m[(32*i >> K) / 32], src);
                const float e = tq_fsub(ut, tab[i][l]);
                c[i][l] = tq_fadd(mm, tq_fmul(e, e));
            }
        }
    }
    TQ_WARP_SYNC(); // the argmins of every lane, for the traceback

    // The best end state: the lowest-numbered minimum (free end), or the first admitted state
    // s = h G + o (ascending h) unless a later one costs strictly less (tail-biting end).
    tq_lane<float> bc;
    tq_lane<int> bs;
    if constexpr (TB) {
        TQ_LANES(l) {
            float b = 0.0f;
            int bsi = -1;
TQ_UNROLL
            for (int i = 0; i < 8; ++i) {
                if ((int) (o & 31) == l && i % R == (int) (o >> 5) && (bsi < 0 || c[i][l] < b)) {
                    b = c[i][l];
                    bsi = 32*i + l;
                }
            }
            bs[l] = bsi;
        }
    } else {
        TQ_LANES(l) {
            float b = c[0][l];
            int bsi = l;
TQ_UNROLL
            for (int i = 1; i < 8; ++i) {
                if (c[i][l] < b) {
                    b = c[i][l];
                    bsi = 32*i + l;
                }
            }
            bc[l] = b;
            bs[l] = bsi;
        }
        // butterfly: the minimum cost, ties to the lower state (a total order: costs are
        // never NaN), so every lane ends with the same pair
TQ_UNROLL
        for (int off = 16; off > 0; off /= 2) {
            tq_lane<float> oc;
            tq_lane<int> os;
            TQ_LANES(l) {
                oc[l] = tq_lane_get(bc, l ^ off);
                os[l] = tq_lane_get(bs, l ^ off);
            }
            TQ_LANES(l) {
                if (oc[l] < bc[l] || (oc[l] == bc[l] && os[l] < bs[l])) {
                    bc[l] = oc[l];
                    bs[l] = os[l];
                }
            }
        }
    }
    uint32_t s = (uint32_t) tq_lane_get(bs, TB ? (int) (o & 31) : 0);

    // Traceback (the same in every lane): the predecessor of s at step t is
    // (argmin of group s >> k at step t - 1) << (8 - k) | s >> k.
    if (store) {
        sc.st[TQ_BLOCK_VALUES - 1] = (uint8_t) s;
    }
    for (int t = TQ_BLOCK_VALUES - 1; t > stop; --t) {
        const uint32_t gi = s >> K;
        s = ((uint32_t) sc.bp[t - 1][gi] << (8 - K)) | gi;
        if (store) {
            sc.st[t - 1] = (uint8_t) s;
        }
    }
    TQ_WARP_SYNC(); // every lane is done with the argmins before the next pass writes them
    return s;
}

// Encodes the 64 values at x into *y; every lane of the warp calls it with the same x, y
// and sc (the host build: once, emulating the warp). The rule of docs/TCQ.md, step by step.
template <int K>
static TQ_HD void tq_tcq_quantize_warp(const float * __restrict__ x, typename tq_tcq_type<K>::block * __restrict__ y,
                                       tq_tcq_scratch<K> & sc) {
    constexpr int nqs = 8*K;
    const float * T = tq_tcq_type<K>::table();

    // 1. sanitize, norm in f64, sequential (every lane the same)
    double ss = 0.0;
    for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
        const double v = tq_cuda_widen(x[j]);
        ss = tq_dadd(ss, tq_dmul(v, v));
    }
    const double n = tq_dsqrt(ss);

    // 2. a zero block: scale 0, every payload bit 0
    if (n == 0.0 || !isfinite(n)) {
        TQ_LANES(l) {
            if (l == 0) {
                y->d = 0;
            }
            if (l < nqs) {
                y->qs[l] = 0;
            }
        }
        return;
    }

    // 3. u_j = f32(x_j / (n / 8)); lane l holds u_l and u_{l+32}, and its states' table values
    const double r = tq_ddiv(n, 8.0);
    tq_lane<float> ulo, uhi;
    tq_lane<float> tab[8];
    TQ_LANES(l) {
        ulo[l] = tq_d2f(tq_ddiv(tq_cuda_widen(x[l]), r));
        uhi[l] = tq_d2f(tq_ddiv(tq_cuda_widen(x[l + 32]), r));
TQ_UNROLL
        for (int i = 0; i < 8; ++i) {
            tab[i][l] = T[32*i + l];
        }
    }

    // 4. tail-biting search: a free pass over u rotated by 32 (its value 31 is u_63) fixes the
    // overlap o, then the pass that starts and ends with it
    const uint32_t s63 = tq_tcq_pass<K, false, false>(uhi, ulo, tab, 0, sc, 31);
    const uint32_t o = s63 & ((256u >> K) - 1);
    tq_tcq_pass<K, true, true>(ulo, uhi, tab, o, sc, 0);

    // 5. least-squares scale (f64, sequential), norm-restoring if that is not positive
    double xt = 0.0, tt = 0.0;
    for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
        const double v = tq_cuda_widen(x[j]);
        const double t = (double) T[sc.st[j]];
        xt = tq_dadd(xt, tq_dmul(v, t));
        tt = tq_dadd(tt, tq_dmul(t, t));
    }
    const double d = xt > 0.0 ? tq_ddiv(xt, tt) : tt > 0.0 ? tq_ddiv(n, tq_dsqrt(tt)) : 0.0;
    uint16_t dh = __half_as_ushort(__float2half_rn(tq_d2f(d)));
    if ((dh & 0x7fffu) == 0x7c00u) {
        dh = 0x7bffu; // overflow to infinity: the largest finite fp16
    }

    // 6. symbols c_t = s_t mod 2^k, MSB-first: lane b writes payload byte b
    TQ_LANES(l) {
        if (l == 0) {
            y->d = dh;
        }
        if (l < nqs) {
            uint32_t byte = 0;
TQ_UNROLL
            for (int b = 0; b < 8; ++b) {
                const int p = 8*l + b;
                byte |= (((uint32_t) sc.st[p / K] >> (K - 1 - p % K)) & 1u) << (7 - b);
            }
            y->qs[l] = (uint8_t) byte;
        }
    }
    TQ_WARP_SYNC(); // sc.st is read by every lane before a next block overwrites it
}
