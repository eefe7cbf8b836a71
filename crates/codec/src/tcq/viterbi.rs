//! Viterbi search over a tail-biting bitshift trellis.
//!
//! Invariant: a path is a sequence of `L`-bit states `s_0..s_{n-1}` with
//! `s_t >> k == s_{t-1} mod 2^(L-k)` (k new bits shifted in per value); its
//! cost is `Σ_t (u_t - table[s_t])²`, accumulated in f32 in order `t = 0..n`.
//! [`Scratch::viterbi`] returns a minimum-cost path, exactly (ties to the
//! lowest predecessor / final state), optionally with the tail-biting overlap
//! fixed. Nothing allocates after [`Scratch::new`].
//!
//! The forward pass stores every step's path costs and every step's group
//! minima `m[j] = min_hi cost[hi * 2^(L-k) + j]` (the values it adds the
//! branch metrics to); the traceback takes, per step, the lowest `hi` whose
//! cost equals the stored minimum (a branch-free mask and a trailing-zero
//! count; the scan the forward pass would make if no cost equals it, which
//! only NaN inputs can cause). That is the predecessor a strict `<` scan
//! picks, so the path does not depend on which forward pass ran.

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
    /// Path costs of every state after every step, `max_len * 2^L`
    /// (traceback recomputes each argmin from them: no back-pointers to
    /// track in the forward pass).
    costs: Vec<f32>,
    /// Group minima of every step's costs, `max_len * 2^(L-k)`.
    mins: Vec<f32>,
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
        // t = 0: every state, or only those whose top L-k bits are the overlap.
        for (s, (c, &v)) in costs[..ns].iter_mut().zip(table).enumerate() {
            let e = u[0] - v;
            *c = match start {
                Some(o) if (s >> k) as u32 != o => f32::INFINITY,
                _ => e * e,
            };
        }
        #[cfg(target_arch = "x86_64")]
        {
            if crate::kernels::simd_level() >= crate::kernels::SimdLevel::Avx2 {
                // SAFETY: AVX2 was detected; the same exactly rounded IEEE
                // operations as the portable build, so the same costs.
                unsafe { forward_avx2(costs, mins, table, u, k) };
            } else {
                forward(costs, mins, table, u, k);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        forward(costs, mins, table, u, k);
        let last = &costs[(n - 1) * ns..n * ns];
        let mut best = u32::MAX;
        let mut best_cost = f32::INFINITY;
        let mut consider = |s: usize| {
            let c = last[s];
            if c < best_cost || best == u32::MAX {
                best = s as u32;
                best_cost = c;
            }
        };
        match end {
            // the admitted states (s mod 2^(L-k) == o), in ascending order
            Some(o) => {
                for h in 0..1usize << k {
                    consider(h * g + o as usize);
                }
            }
            None => (0..ns).for_each(&mut consider),
        }
        let states = &mut self.states[..n];
        states[n - 1] = best;
        match k {
            2 => traceback::<4>(costs, mins, states, stop, l, k, g),
            3 => traceback::<8>(costs, mins, states, stop, l, k, g),
            _ => traceback::<0>(costs, mins, states, stop, l, k, g),
        }
        best_cost
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
unsafe fn forward_avx2(costs: &mut [f32], mins: &mut [f32], table: &[f32], u: &[f32], k: u32) {
    let ns = table.len();
    let g = ns >> k;
    match (k, g) {
        (3, 32) => return forward_fused_avx2::<3, 4>(costs, mins, table, u),
        (2, 64) => return forward_fused_avx2::<2, 8>(costs, mins, table, u),
        _ => {}
    }
    if !(k == 2 || k == 3) || !g.is_multiple_of(8) {
        return forward(costs, mins, table, u, k);
    }
    for (t, &ut) in u.iter().enumerate().skip(1) {
        let (done, rest) = costs.split_at_mut(t * ns);
        let (cur, nxt) = (&done[(t - 1) * ns..], &mut rest[..ns]);
        step_avx2(cur, nxt, &mut mins[(t - 1) * g..t * g], table, ut, k);
    }
}

/// The forward pass for k = 2 / 3 with `MG = 2^(L-k) / 8` group-minimum
/// vectors kept in registers: each step writes its costs and folds them into
/// the next step's group minima as it goes (cost vector `v` holds states
/// `8v..8v+8`, whose groups are the lanes of minimum vector `v mod MG` and
/// whose `hi` is `v / MG`, so the `vminps(c, m)` sequence per group runs
/// over `hi = 0, 1, ..` exactly as [`step_avx2`]'s does: the same bits,
/// without reading the costs back).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_fused_avx2<const K: u32, const MG: usize>(
    costs: &mut [f32],
    mins: &mut [f32],
    table: &[f32],
    u: &[f32],
) {
    use core::arch::x86_64::*;
    let n = u.len();
    let g = 8 * MG;
    let ns = g << K;
    assert!(table.len() == ns && costs.len() >= n * ns && mins.len() >= n * g);
    // group minima of row 0
    let (cp, mp, tp) = (costs.as_mut_ptr(), mins.as_mut_ptr(), table.as_ptr());
    for a in 0..MG {
        let mut mv = _mm256_loadu_ps(cp.add(8 * a));
        for hi in 1..1usize << K {
            mv = _mm256_min_ps(_mm256_loadu_ps(cp.add(hi * g + 8 * a)), mv);
        }
        _mm256_storeu_ps(mp.add(8 * a), mv);
    }
    for (t, &ut) in u.iter().enumerate().skip(1) {
        let uv = _mm256_set1_ps(ut);
        let mprev = mp.add((t - 1) * g);
        let np = cp.add(t * ns);
        let mut acc = [_mm256_setzero_ps(); MG];
        // v = hi * MG + a: the inner loop has a constant trip count, so the
        // MG minima stay in registers
        for hi in 0..1usize << K {
            for (a, m) in acc.iter_mut().enumerate() {
                let v = hi * MG + a;
                let e = _mm256_sub_ps(uv, _mm256_loadu_ps(tp.add(8 * v)));
                let mb = if K == 3 {
                    _mm256_broadcast_ss(&*mprev.add(v))
                } else {
                    // [m[2v], m[2v+1]] in every 64 bits, then [a a a a | b b b b]
                    let pair = (mprev.add(2 * v) as *const f64).read_unaligned();
                    let p = _mm256_castpd_ps(_mm256_set1_pd(pair));
                    _mm256_permutevar_ps(p, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1))
                };
                let c = _mm256_add_ps(mb, _mm256_mul_ps(e, e));
                _mm256_storeu_ps(np.add(8 * v), c);
                *m = if hi == 0 { c } else { _mm256_min_ps(c, *m) };
            }
        }
        let mnext = mp.add(t * g);
        for (a, m) in acc.iter().enumerate() {
            _mm256_storeu_ps(mnext.add(8 * a), *m);
        }
    }
}

/// [`step`] for k = 2 / 3 with explicit 8-wide vectors: `vminps(c, m)` is
/// `c < m ? c : m`, and `m + (u - T)²` is computed in the same order, so the
/// costs are bit-identical to the portable step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn step_avx2(cur: &[f32], nxt: &mut [f32], m: &mut [f32], table: &[f32], u: f32, k: u32) {
    use core::arch::x86_64::*;
    let g = m.len();
    let nh = 1usize << k;
    assert!(cur.len() >= nh * g && nxt.len() >= nh * g && table.len() >= nh * g);
    let (cp, mp) = (cur.as_ptr(), m.as_mut_ptr());
    for jb in (0..g).step_by(8) {
        let mut mv = _mm256_loadu_ps(cp.add(jb));
        for hi in 1..nh {
            mv = _mm256_min_ps(_mm256_loadu_ps(cp.add(hi * g + jb)), mv);
        }
        _mm256_storeu_ps(mp.add(jb), mv);
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
