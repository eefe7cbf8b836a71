//! Viterbi search over a tail-biting bitshift trellis.
//!
//! Invariant: a path is a sequence of `L`-bit states `s_0..s_{n-1}` with
//! `s_t >> k == s_{t-1} mod 2^(L-k)` (k new bits shifted in per value); its
//! cost is `Σ_t (u_t - table[s_t])²`, accumulated in f32 in order `t = 0..n`.
//! [`Scratch::viterbi`] returns a minimum-cost path, exactly (ties to the
//! lowest predecessor / final state), optionally with the tail-biting overlap
//! fixed. Nothing allocates after [`Scratch::new`].
//!
//! The forward pass folds every step's path costs into group minima
//! `m[j] = min_hi cost[hi * 2^(L-k) + j]` (the values the next step adds its
//! branch metrics to) with a strict `<` over `hi = 0, 1, ..`. The AVX2
//! passes also record the state each minimum came from (the survivor), so
//! the traceback is one load per step. The portable pass stores every row
//! of costs instead, and its traceback takes, per step, the lowest `hi`
//! whose cost equals the stored minimum (a branch-free mask and a
//! trailing-zero count; the `<` scan itself when no cost equals it, which
//! only NaN inputs can cause). Both are the predecessor the fold kept, so
//! the path does not depend on which forward pass ran.

/// A bitshift trellis: `L` state bits, `k` bits per value, `2^L` values.
#[derive(Clone, Copy, Debug)]
pub struct Trellis<'a> {
    /// State bits.
    pub l: u32,
    /// Bits shifted in per value.
    pub k: u32,
    /// Reconstruction value of every state.
    pub table: &'a [f32],
}

impl<'a> Trellis<'a> {
    /// A trellis; panics unless `0 < k < L <= 20`, `k <= 8` and the table
    /// has `2^L` entries.
    pub fn new(l: u32, k: u32, table: &'a [f32]) -> Trellis<'a> {
        assert!(
            k > 0 && k <= 8 && k < l && l <= 20,
            "bad trellis L={l} k={k}"
        );
        assert_eq!(table.len(), 1 << l, "table size");
        Trellis { l, k, table }
    }

    /// Number of states.
    pub const fn states(&self) -> usize {
        1 << self.l
    }

    /// Number of predecessor groups, `2^(L-k)` (also the overlap range).
    pub const fn groups(&self) -> usize {
        1 << (self.l - self.k)
    }
}

/// Working memory of the Viterbi search for one trellis shape and up to
/// `max_len` values per block.
#[derive(Clone, Debug)]
pub struct Scratch {
    l: u32,
    k: u32,
    max_len: usize,
    /// Path costs of every state after every step, `max_len * 2^L` (the
    /// portable forward pass fills every row; the fused AVX2 pass only the
    /// first and the last, the only ones read after it).
    costs: Vec<f32>,
    /// Group minima of every step's costs, `max_len * 2^(L-k)` (what the
    /// next step adds its branch metrics to).
    mins: Vec<f32>,
    /// Survivors: `pred[t * 2^(L-k) + j]` is the state at step `t` that
    /// group `j`'s successors at step `t + 1` extend (the state the group
    /// minimum came from), `max_len * 2^(L-k)`.
    pred: Vec<u32>,
    rot: Vec<f32>,
    /// The last path found (states), `max_len` entries.
    pub states: Vec<u32>,
}

impl Scratch {
    /// Scratch for trellises with `l` / `k` and blocks of up to `max_len` values.
    pub fn new(l: u32, k: u32, max_len: usize) -> Scratch {
        let ns = 1usize << l;
        let g = 1usize << (l - k);
        Scratch {
            l,
            k,
            max_len,
            costs: vec![0.0; ns * max_len],
            mins: vec![0.0; g * max_len],
            pred: vec![0; g * max_len],
            rot: vec![0.0; max_len],
            states: vec![0; max_len],
        }
    }

    /// Minimum-cost path for `u` (its states land in `self.states[..u.len()]`);
    /// returns the cost. `start = Some(o)` admits only `s_0 >> k == o`,
    /// `end = Some(o)` only `s_{n-1} mod 2^(L-k) == o`; both with the same `o`
    /// is the tail-biting condition for overlap `o`.
    pub fn viterbi(
        &mut self,
        tr: &Trellis,
        u: &[f32],
        start: Option<u32>,
        end: Option<u32>,
    ) -> f32 {
        self.viterbi_down_to(tr, u, start, end, 0)
    }

    /// [`Scratch::viterbi`] whose traceback stops at value `stop`:
    /// `self.states[stop..n]` is the path, `self.states[..stop]` is stale.
    fn viterbi_down_to(
        &mut self,
        tr: &Trellis,
        u: &[f32],
        start: Option<u32>,
        end: Option<u32>,
        stop: usize,
    ) -> f32 {
        let (l, k) = (tr.l, tr.k);
        assert!(l == self.l && k == self.k && !u.is_empty() && u.len() <= self.max_len);
        let n = u.len();
        let ns = tr.states();
        let g = tr.groups();
        let table = &tr.table[..ns];
        let costs = &mut self.costs[..ns * n];
        let mins = &mut self.mins[..g * n];
        let pred = &mut self.pred[..g * n];
        // t = 0: every state, or only those whose top L-k bits are the overlap.
        for (c, &v) in costs[..ns].iter_mut().zip(table) {
            let e = u[0] - v;
            *c = e * e;
        }
        if let Some(o) = start {
            // admitted: s >> k == o, one run of 2^k states
            let lo = ((o as usize) << k).min(ns);
            let hi = ((o as usize + 1) << k).min(ns);
            costs[..lo].fill(f32::INFINITY);
            costs[hi..ns].fill(f32::INFINITY);
        }
        // the AVX2 passes record survivors; the portable one stores every
        // row of costs and the traceback finds each predecessor among them
        // (cheaper without blends, and the same predecessor: see the module
        // documentation)
        #[cfg(target_arch = "x86_64")]
        let survivors = if crate::kernels::simd_level() >= crate::kernels::SimdLevel::Avx2 {
            // SAFETY: AVX2 was detected; the same exactly rounded IEEE
            // operations as the portable build, so the same costs.
            unsafe { forward_avx2(costs, mins, pred, table, u, k, stop) }
        } else {
            forward(costs, mins, table, u, k);
            false
        };
        #[cfg(not(target_arch = "x86_64"))]
        let survivors = {
            forward(costs, mins, table, u, k);
            false
        };
        let last = &costs[(n - 1) * ns..n * ns];
        let best = match end {
            // the admitted states (s mod 2^(L-k) == o), in ascending order
            Some(o) => {
                first_min((0..1usize << k).map(|h| (h * g + o as usize, last[h * g + o as usize])))
            }
            None => first_min_of(last),
        };
        let states = &mut self.states[..n];
        states[n - 1] = best as u32;
        if survivors {
            // per step one load: no search on the way back
            let mut s = best as u32;
            for t in (stop + 1..n).rev() {
                s = pred[(t - 1) * g + (s >> k) as usize];
                states[t - 1] = s;
            }
        } else {
            match k {
                2 => traceback::<4>(costs, mins, states, stop, l, k, g),
                3 => traceback::<8>(costs, mins, states, stop, l, k, g),
                _ => traceback::<0>(costs, mins, states, stop, l, k, g),
            }
        }
        last[best]
    }

    /// The encoder's search: a free pass over `u` rotated by `n / 2` crosses
    /// the block's wrap point in its middle, where its path is decided by
    /// the values on both sides; the low `L-k` bits of its state at value
    /// `n - 1` fix the overlap, and a second pass finds the best path that
    /// closes with it. Not always the exact tail-biting optimum (that takes
    /// `2^(L-k)` passes, [`Scratch::viterbi_exact_tailbiting`]); docs/TCQ.md
    /// gives the measured gap.
    pub fn viterbi_tailbiting(&mut self, tr: &Trellis, u: &[f32]) -> f32 {
        self.viterbi_tailbiting_window(tr, u, u.len())
    }

    /// [`Scratch::viterbi_tailbiting`] with a first pass over only the `w`
    /// values around the wrap point (`w / 2` on each side; `w >= 2` and at
    /// most `u.len()`): cheaper, the overlap is decided by fewer values.
    pub fn viterbi_tailbiting_window(&mut self, tr: &Trellis, u: &[f32], w: usize) -> f32 {
        let n = u.len();
        let w = w.clamp(2, n);
        let h = w / 2;
        let mut rot = core::mem::take(&mut self.rot);
        rot[..h].copy_from_slice(&u[n - h..]);
        rot[h..w].copy_from_slice(&u[..w - h]);
        // only the state at h - 1 is needed from this pass
        self.viterbi_down_to(tr, &rot[..w], None, None, h - 1);
        self.rot = rot;
        let o = self.states[h - 1] & (tr.groups() as u32 - 1);
        self.viterbi(tr, u, Some(o), Some(o))
    }

    /// The exact tail-biting optimum: one constrained pass per overlap
    /// (for tests and small trellises).
    pub fn viterbi_exact_tailbiting(&mut self, tr: &Trellis, u: &[f32]) -> f32 {
        let n = u.len();
        let mut best_cost = f32::INFINITY;
        let mut best = vec![0u32; n];
        for o in 0..tr.groups() as u32 {
            let c = self.viterbi(tr, u, Some(o), Some(o));
            if c < best_cost {
                best_cost = c;
                best.copy_from_slice(&self.states[..n]);
            }
        }
        self.states[..n].copy_from_slice(&best);
        best_cost
    }
}

/// The first of `(index, cost)` in order under a strict `<` scan: the first
/// candidate, replaced only by a strictly smaller cost (so a NaN first
/// candidate stays, later NaNs are never taken).
#[inline]
fn first_min(cands: impl Iterator<Item = (usize, f32)>) -> usize {
    let mut best = usize::MAX;
    let mut best_cost = f32::INFINITY;
    for (s, c) in cands {
        if best == usize::MAX || c < best_cost {
            best = s;
            best_cost = c;
        }
    }
    best
}

/// [`first_min`] over all of `c` (non-empty): the minimum by a vector fold,
/// then the first index holding it, which is the strict `<` scan's answer
/// when no cost is NaN; with a NaN anywhere, the scan itself.
#[inline]
fn first_min_of(c: &[f32]) -> usize {
    if c.len().is_multiple_of(8) {
        let mut m = [f32::INFINITY; 8];
        let mut nan = false;
        for ch in c.chunks_exact(8) {
            for i in 0..8 {
                nan |= ch[i].is_nan();
                m[i] = if ch[i] < m[i] { ch[i] } else { m[i] };
            }
        }
        if !nan {
            let mv = m
                .iter()
                .fold(f32::INFINITY, |a, &b| if b < a { b } else { a });
            // eight at a time: a mask per chunk, the first set bit
            for (ci, ch) in c.chunks_exact(8).enumerate() {
                let mut mask = 0u32;
                for (i, &v) in ch.iter().enumerate() {
                    mask |= ((v == mv) as u32) << i;
                }
                if mask != 0 {
                    return 8 * ci + mask.trailing_zeros() as usize;
                }
            }
        }
    }
    first_min(c.iter().copied().enumerate())
}

/// Fills `states[stop..n-1]` back from `states[n-1]`: per step the lowest `hi`
/// whose cost equals the stored group minimum (a mask and a trailing-zero
/// count: no data-dependent branch), or, if none does (NaN costs), the strict
/// `<` scan. `NH` = `2^k` when known at compile time (else 0).
#[inline(always)]
fn traceback<const NH: usize>(
    costs: &[f32],
    mins: &[f32],
    states: &mut [u32],
    stop: usize,
    l: u32,
    k: u32,
    g: usize,
) {
    let nh = if NH > 0 { NH } else { 1usize << k };
    let ns = nh * g;
    let n = states.len();
    for t in (stop + 1..n).rev() {
        let gi = (states[t] >> k) as usize;
        // the costs of group gi's predecessors: prev[h * g]
        let prev = &costs[(t - 1) * ns + gi..(t - 1) * ns + gi + (nh - 1) * g + 1];
        let mv = mins[(t - 1) * g + gi];
        let mut mask = 0u64;
        if nh <= 64 {
            for h in 0..nh {
                mask |= ((prev[h * g] == mv) as u64) << h;
            }
        }
        let hi = if mask != 0 {
            mask.trailing_zeros() as usize
        } else {
            let mut hi = 0usize;
            for h in 1..nh {
                if prev[h * g] < prev[hi * g] {
                    hi = h;
                }
            }
            hi
        };
        states[t - 1] = ((hi << (l - k)) | gi) as u32;
    }
}

/// Steps `t = 1..n`: `costs[t]` from `costs[t - 1]` (rows of `2^L`), and
/// `mins[t - 1]` (rows of `2^(L-k)`) the group minima of `costs[t - 1]`.
#[inline(always)]
fn forward(costs: &mut [f32], mins: &mut [f32], table: &[f32], u: &[f32], k: u32) {
    let ns = table.len();
    let g = ns >> k;
    for (t, &ut) in u.iter().enumerate().skip(1) {
        let (done, rest) = costs.split_at_mut(t * ns);
        let (cur, nxt) = (&done[(t - 1) * ns..], &mut rest[..ns]);
        let m = &mut mins[(t - 1) * g..t * g];
        match k {
            1 => step::<2>(cur, nxt, m, table, ut),
            2 => step::<4>(cur, nxt, m, table, ut),
            3 => step::<8>(cur, nxt, m, table, ut),
            4 => step::<16>(cur, nxt, m, table, ut),
            5 => step::<32>(cur, nxt, m, table, ut),
            6 => step::<64>(cur, nxt, m, table, ut),
            7 => step::<128>(cur, nxt, m, table, ut),
            _ => step::<256>(cur, nxt, m, table, ut),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_avx2(
    costs: &mut [f32],
    mins: &mut [f32],
    pred: &mut [u32],
    table: &[f32],
    u: &[f32],
    k: u32,
    from: usize,
) -> bool {
    let ns = table.len();
    let g = ns >> k;
    match (k, g) {
        (3, 32) => {
            forward_fused_avx2::<3, 4>(costs, mins, pred, table, u, from);
            return true;
        }
        (2, 64) => {
            forward_fused_avx2::<2, 8>(costs, mins, pred, table, u, from);
            return true;
        }
        _ => {}
    }
    if !(k == 2 || k == 3) || !g.is_multiple_of(8) {
        forward(costs, mins, table, u, k);
        return false;
    }
    for (t, &ut) in u.iter().enumerate().skip(1) {
        let (done, rest) = costs.split_at_mut(t * ns);
        let (cur, nxt) = (&done[(t - 1) * ns..], &mut rest[..ns]);
        let (m, p) = (&mut mins[(t - 1) * g..t * g], &mut pred[(t - 1) * g..t * g]);
        step_avx2(cur, nxt, m, p, table, ut, k);
    }
    true
}

/// Group minima and survivors of one row of costs in registers, the fold
/// over `hi = 0, 1, ..` of [`step`]: `m = vminps(c, m)` (`c < m ? c : m`)
/// and the survivor's `hi` taken exactly when `c < m`, so it is the state
/// the minimum's bits came from.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fold_avx2(
    c: core::arch::x86_64::__m256,
    m: &mut core::arch::x86_64::__m256,
    p: &mut core::arch::x86_64::__m256,
    hi_bits: core::arch::x86_64::__m256,
) {
    use core::arch::x86_64::*;
    let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(c, *m);
    *m = _mm256_min_ps(c, *m);
    *p = _mm256_blendv_ps(*p, hi_bits, lt);
}

/// `hi << sh` in every lane, as float bits (for the blend).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hi_bits(hi: usize, sh: u32) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    _mm256_castsi256_ps(_mm256_set1_epi32((hi << sh) as i32))
}

/// Stores survivors: the `hi << sh` bits in `p` or-ed with the group
/// numbers `j0..j0 + 8`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_pred(dst: *mut u32, p: core::arch::x86_64::__m256, j0: usize) {
    use core::arch::x86_64::*;
    let lanes = _mm256_add_epi32(
        _mm256_set1_epi32(j0 as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let v = _mm256_or_si256(_mm256_castps_si256(p), lanes);
    _mm256_storeu_si256(dst as *mut __m256i, v);
}

/// The forward pass for k = 2 / 3 at L = 8 (`MG = 2^(L-k) / 8` group
/// vectors): each step computes its costs and folds them straight into its
/// group minima and survivors in registers (cost vector `v` holds states
/// `8v..8v+8`, whose groups are the lanes of minimum vector `v mod MG` and
/// whose `hi` is `v / MG`; per group the fold runs over `hi = 0, 1, ..`
/// exactly as [`step`]'s does: the same bits). The costs are never stored
/// or read back except the last row (the final-state choice). Survivors
/// are recorded from row `from` on (the rows a traceback down to `from`
/// reads; row 0's always).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_fused_avx2<const K: u32, const MG: usize>(
    costs: &mut [f32],
    mins: &mut [f32],
    pred: &mut [u32],
    table: &[f32],
    u: &[f32],
    from: usize,
) {
    use core::arch::x86_64::*;
    let n = u.len();
    let g = 8 * MG;
    let ns = g << K;
    let sh = g.trailing_zeros();
    assert!(table.len() == ns && costs.len() >= n * ns && mins.len() >= n * g);
    assert!(pred.len() >= n * g);
    let (cp, mp, pp) = (costs.as_mut_ptr(), mins.as_mut_ptr(), pred.as_mut_ptr());
    // the table in the fold's lane order (a copy per search: the trainer
    // changes the table between searches)
    let mut ordered = [0f32; 256];
    let tp = if K == 2 {
        for v in 0..ns / 8 {
            let t = _mm256_loadu_ps(table.as_ptr().add(8 * v));
            _mm256_storeu_ps(ordered.as_mut_ptr().add(8 * v), permute(t, &K2_ORDER));
        }
        ordered.as_ptr()
    } else {
        table.as_ptr()
    };
    if n > 1 {
        // group minima and survivors of row 0
        for a in 0..MG {
            let mut mv = _mm256_loadu_ps(cp.add(8 * a));
            let mut pv = _mm256_setzero_ps();
            for hi in 1..1usize << K {
                let c = _mm256_loadu_ps(cp.add(hi * g + 8 * a));
                fold_avx2(c, &mut mv, &mut pv, hi_bits(hi, sh));
            }
            _mm256_storeu_ps(mp.add(8 * a), mv);
            store_pred(pp.add(8 * a), pv, 8 * a);
        }
    }
    for t in 1..n.saturating_sub(1) {
        let (mprev, ut) = (mp.add((t - 1) * g), *u.get_unchecked(t));
        let (mnext, pnext) = (mp.add(t * g), pp.add(t * g));
        if t >= from {
            fused_step::<K, MG, true>(tp, mprev, ut, mnext, pnext);
        } else {
            fused_step::<K, MG, false>(tp, mprev, ut, mnext, pnext);
        }
    }
    if n > 1 {
        // the last step: its costs are the output, no minima needed
        let t = n - 1;
        for v in 0..ns / 8 {
            let c = fused_cost::<K>(tp, mp.add((t - 1) * g), *u.get_unchecked(t), v);
            _mm256_storeu_ps(cp.add(t * ns + 8 * v), natural::<K>(c));
        }
    }
}

/// At K = 2 a cost vector's 8 states have two predecessor groups. Lane `i`
/// of cost vector `v` holds state `8v + K2_ORDER[i]`, whose group is
/// `2v + (i & 1)`, so one 64-bit broadcast of `[m[2v], m[2v+1]]` (a plain
/// load) gives every lane its minimum; the minima and survivors come out of
/// the fold in the same order and are put back into natural order once per
/// group vector (`K2_NATURAL`), not once per cost vector.
#[cfg(target_arch = "x86_64")]
const K2_ORDER: [i32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
/// The inverse of [`K2_ORDER`]: natural lane `q` is lane `K2_NATURAL[q]`.
#[cfg(target_arch = "x86_64")]
const K2_NATURAL: [i32; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Lane `q` of the result = lane `idx[q]` of `v`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn permute(v: core::arch::x86_64::__m256, idx: &[i32; 8]) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    _mm256_permutevar8x32_ps(v, _mm256_loadu_si256(idx.as_ptr() as *const __m256i))
}

/// Natural order of a vector in the fold's lane order (K = 2; K = 3 is
/// already natural).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn natural<const K: u32>(v: core::arch::x86_64::__m256) -> core::arch::x86_64::__m256 {
    if K == 2 {
        permute(v, &K2_NATURAL)
    } else {
        v
    }
}

/// One step of [`forward_fused_avx2`] (not the last): the group minima of
/// the step's costs into `mnext`, and with `DEC` their survivors into
/// `pnext` (rows whose survivors no traceback reads skip them: two of the
/// six vector operations per cost vector).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fused_step<const K: u32, const MG: usize, const DEC: bool>(
    tp: *const f32,
    mprev: *const f32,
    ut: f32,
    mnext: *mut f32,
    pnext: *mut u32,
) {
    use core::arch::x86_64::*;
    let sh = (8 * MG).trailing_zeros();
    // four group vectors at a time (minima and survivors in registers:
    // 8 + 8 would not fit at k = 2); v = hi * MG + a, hi ascending
    for a0 in (0..MG).step_by(4) {
        let mut m = [_mm256_setzero_ps(); 4];
        let mut p = [_mm256_setzero_ps(); 4];
        for hi in 0..1usize << K {
            let hb = hi_bits(hi, sh);
            for j in 0..4 {
                let c = fused_cost::<K>(tp, mprev, ut, hi * MG + a0 + j);
                if hi == 0 {
                    m[j] = c;
                } else if DEC {
                    fold_avx2(c, &mut m[j], &mut p[j], hb);
                } else {
                    m[j] = _mm256_min_ps(c, m[j]);
                }
            }
        }
        for j in 0..4 {
            let a = a0 + j;
            _mm256_storeu_ps(mnext.add(8 * a), natural::<K>(m[j]));
            if DEC {
                // the survivors' hi bits, put in natural order, then the groups
                store_pred(pnext.add(8 * a), natural::<K>(p[j]), 8 * a);
            }
        }
    }
}

/// The costs of cost vector `v` at a step with value `ut` from the previous
/// row's group minima `mprev` (natural order): `m + (u - T)²`, the portable
/// step's operations. `tp` is the table in lane order: states `8v..8v+8`
/// in order for K = 3, in [`K2_ORDER`] for K = 2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fused_cost<const K: u32>(
    tp: *const f32,
    mprev: *const f32,
    ut: f32,
    v: usize,
) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    let e = _mm256_sub_ps(_mm256_set1_ps(ut), _mm256_loadu_ps(tp.add(8 * v)));
    let mb = if K == 3 {
        _mm256_broadcast_ss(&*mprev.add(v))
    } else {
        // [m[2v], m[2v+1]] repeated: lanes in the K = 2 order (`K2_ORDER`)
        _mm256_castpd_ps(_mm256_broadcast_sd(&*(mprev.add(2 * v) as *const f64)))
    };
    _mm256_add_ps(mb, _mm256_mul_ps(e, e))
}

/// [`step`] for k = 2 / 3 with explicit 8-wide vectors: `vminps(c, m)` is
/// `c < m ? c : m`, and `m + (u - T)²` is computed in the same order, so the
/// costs are bit-identical to the portable step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn step_avx2(
    cur: &[f32],
    nxt: &mut [f32],
    m: &mut [f32],
    pred: &mut [u32],
    table: &[f32],
    u: f32,
    k: u32,
) {
    use core::arch::x86_64::*;
    let g = m.len();
    let nh = 1usize << k;
    let sh = g.trailing_zeros();
    assert!(cur.len() >= nh * g && nxt.len() >= nh * g && table.len() >= nh * g);
    assert!(pred.len() >= g && g.is_power_of_two());
    let (cp, mp, pp) = (cur.as_ptr(), m.as_mut_ptr(), pred.as_mut_ptr());
    for jb in (0..g).step_by(8) {
        let mut mv = _mm256_loadu_ps(cp.add(jb));
        let mut pv = _mm256_setzero_ps();
        for hi in 1..nh {
            let c = _mm256_loadu_ps(cp.add(hi * g + jb));
            fold_avx2(c, &mut mv, &mut pv, hi_bits(hi, sh));
        }
        _mm256_storeu_ps(mp.add(jb), mv);
        store_pred(pp.add(jb), pv, jb);
    }
    let uv = _mm256_set1_ps(u);
    let (tp, np) = (table.as_ptr(), nxt.as_mut_ptr());
    if k == 3 {
        for j in 0..g {
            let e = _mm256_sub_ps(uv, _mm256_loadu_ps(tp.add(8 * j)));
            let v = _mm256_add_ps(_mm256_set1_ps(*mp.add(j)), _mm256_mul_ps(e, e));
            _mm256_storeu_ps(np.add(8 * j), v);
        }
    } else {
        for j in (0..g).step_by(2) {
            let mj = _mm256_set_m128(_mm_set1_ps(*mp.add(j + 1)), _mm_set1_ps(*mp.add(j)));
            let e = _mm256_sub_ps(uv, _mm256_loadu_ps(tp.add(4 * j)));
            _mm256_storeu_ps(np.add(4 * j), _mm256_add_ps(mj, _mm256_mul_ps(e, e)));
        }
    }
}

/// One trellis step with `NH = 2^k` predecessors per group:
/// `m[j] = min_hi cur[hi * g + j]`, then
/// `nxt[j * NH + c] = m[j] + (u - table[j * NH + c])²`.
#[inline(always)]
fn step<const NH: usize>(cur: &[f32], nxt: &mut [f32], m: &mut [f32], table: &[f32], u: f32) {
    let g = m.len();
    if g.is_multiple_of(8) {
        // fixed 8-wide tiles: no loop tails (masked moves are slow on some CPUs)
        for (jb, mt) in m.chunks_exact_mut(8).enumerate() {
            let mut mv: [f32; 8] = cur[8 * jb..8 * jb + 8].try_into().unwrap();
            for hi in 1..NH {
                let c: &[f32; 8] = cur[hi * g + 8 * jb..hi * g + 8 * jb + 8]
                    .try_into()
                    .unwrap();
                for i in 0..8 {
                    mv[i] = if c[i] < mv[i] { c[i] } else { mv[i] };
                }
            }
            mt.copy_from_slice(&mv);
        }
    } else {
        m.copy_from_slice(&cur[..g]);
        for hi in 1..NH {
            let c = &cur[hi * g..(hi + 1) * g];
            for (mj, &cj) in m.iter_mut().zip(c) {
                *mj = if cj < *mj { cj } else { *mj };
            }
        }
    }
    for ((chunk, tv), &mj) in nxt
        .chunks_exact_mut(NH)
        .zip(table.chunks_exact(NH))
        .zip(m.iter())
    {
        let chunk: &mut [f32; NH] = chunk.try_into().unwrap();
        let tv: &[f32; NH] = tv.try_into().unwrap();
        for c in 0..NH {
            let e = u - tv[c];
            chunk[c] = mj + e * e;
        }
    }
}

/// The symbols of a closed path: `c_t = s_t mod 2^k`.
pub fn path_symbols(states: &[u32], k: u32, c: &mut [u8]) {
    for (dst, &s) in c.iter_mut().zip(states) {
        *dst = (s & ((1 << k) - 1)) as u8;
    }
}

/// The states of the circular symbol string `c` (`s_{-1} = s_{n-1}`).
pub fn symbol_states(c: &[u8], k: u32, l: u32, states: &mut [u32]) {
    let mask = (1u32 << l) - 1;
    let n = c.len();
    // s_{n-1} is the last ceil(L/k) symbols shifted in.
    let mut s = 0u32;
    let m = (l as usize).div_ceil(k as usize);
    for j in 0..m {
        s = ((s << k) | c[(n * m + n - m + j) % n] as u32) & mask;
    }
    for (dst, &ct) in states.iter_mut().zip(c) {
        s = ((s << k) | ct as u32) & mask;
        *dst = s;
    }
}
