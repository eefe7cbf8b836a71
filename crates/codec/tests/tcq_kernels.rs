//! The trellis-coded row kernels (src/tcq/kernels.rs, src/tcq/x86.rs) against
//! their scalar oracles, at every SIMD level this CPU has:
//! * dequantize, mad and mad_rows are bit-exact;
//! * vec_dot and dot_rows are within `1e-5 * Σ|terms|` (+ 1e-30) of the f64
//!   oracle, the turbo types' bound (the measured worst is printed by
//!   `dot_error_is_small`);
//! * the window-based scalar decoder equals the codec's serial state
//!   recursion and `state_at` on arbitrary bytes;
//! * the encoder's forward pass / traceback equal a plain reference Viterbi
//!   (the algorithm as first written: separate min pass, `<`-scan traceback)
//!   on random, tied and non-finite inputs, at every level (fewer cases in
//!   debug builds: release ~2 s, debug ~10 s);
//! * lengths that are not whole blocks are rejected.

use proptest::prelude::*;
use turboquant_codec::kernels::{available_levels, set_simd_level, simd_level, SimdLevel};
use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::tcq::block::state_at;
use turboquant_codec::tcq::codec::{self, dequantize_block};
use turboquant_codec::tcq::kernels::{self as tk, scalar};
use turboquant_codec::tcq::train::gaussian_blocks;
use turboquant_codec::tcq::{Scratch, TcqType, Trellis};
use turboquant_codec::TqError;

fn simd_levels() -> Vec<SimdLevel> {
    available_levels()
        .into_iter()
        .filter(|&l| l != SimdLevel::Scalar)
        .collect()
}

fn enc(ty: TcqType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / 64 * ty.block_bytes()];
    codec::quantize(ty, x, &mut out, &mut Scratch::new(ty.l(), ty.k(), 64)).unwrap();
    out
}

/// Random payload bytes with scales drawn from finite, zero, subnormal, max,
/// negative, NaN and Inf fp16 patterns.
fn random_blocks(ty: TcqType, nb: usize, seed: u64) -> Vec<u8> {
    let mut r = SplitMix64::new(seed);
    let mut b = vec![0u8; nb * ty.block_bytes()];
    for v in b.iter_mut() {
        *v = r.next() as u8;
    }
    const SPECIAL: [u16; 8] = [0, 0x0001, 0x03ff, 0x7bff, 0x8000, 0xbc00, 0x7c00, 0x7e00];
    for (i, blk) in b.chunks_exact_mut(ty.block_bytes()).enumerate() {
        let d: u16 = match r.next() % 4 {
            0 => SPECIAL[i % SPECIAL.len()],
            // finite positive scales 2^-14 .. 2^15
            _ => (r.next() % 0x7bff) as u16,
        };
        blk[..2].copy_from_slice(&d.to_ne_bytes());
    }
    b
}

fn query(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    gaussian_blocks(n / 64, seed)
        .into_iter()
        .map(|v| v * scale)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn window_decoder_equals_the_serial_recursion() {
    for ty in TcqType::ALL {
        let tab = ty.table();
        for seed in 0..200u64 {
            let b = random_blocks(ty, 4, seed);
            let mut want = vec![0f32; 4 * 64];
            for (blk, y) in b
                .chunks_exact(ty.block_bytes())
                .zip(want.chunks_exact_mut(64))
            {
                dequantize_block(ty, blk, y);
                for (t, yt) in y.iter().enumerate() {
                    let s = state_at(&blk[2..], ty.k(), ty.l(), t);
                    let d =
                        turboquant_codec::block::decode_scale(u16::from_ne_bytes([blk[0], blk[1]]));
                    assert_eq!(yt.to_bits(), (d * tab[s as usize]).to_bits());
                }
            }
            for level in available_levels() {
                let mut got = vec![0f32; 4 * 64];
                tk::dequantize_row_at(level, ty, &b, &mut got);
                assert_eq!(bits(&got), bits(&want), "{ty:?} {level:?} seed {seed}");
            }
        }
    }
}

/// All-zero / all-one payloads and single set bits (every window position).
#[test]
fn edge_payloads_decode_identically() {
    for ty in TcqType::ALL {
        let bb = ty.block_bytes();
        let mut cases: Vec<Vec<u8>> = vec![vec![0u8; bb], vec![0xffu8; bb]];
        for bit in 0..(bb - 2) * 8 {
            let mut b = vec![0u8; bb];
            b[..2].copy_from_slice(&0x3c00u16.to_ne_bytes());
            b[2 + bit / 8] = 0x80 >> (bit % 8);
            cases.push(b.clone());
            b.iter_mut().skip(2).for_each(|v| *v = !*v);
            cases.push(b);
        }
        for b in cases {
            let mut want = vec![0f32; 64];
            dequantize_block(ty, &b, &mut want);
            for level in available_levels() {
                let mut got = vec![0f32; 64];
                tk::dequantize_row_at(level, ty, &b, &mut got);
                assert_eq!(bits(&got), bits(&want), "{ty:?} {level:?} {b:?}");
            }
        }
    }
}

/// `|got - want| <= 1e-5 Σ|terms| + 1e-30`; returns the error in units of Σ|terms|.
fn check_dot(got: f32, ty: TcqType, x: &[u8], q: &[f32]) -> f64 {
    let want = scalar::vec_dot_row(ty, x, q);
    let mut dec = vec![0f32; q.len()];
    scalar::dequantize_row(ty, x, &mut dec);
    let mag: f64 = dec.iter().zip(q).map(|(&a, &b)| (a * b).abs() as f64).sum();
    if !mag.is_finite() || !want.is_finite() {
        // the oracle overflowed or met Inf / NaN: the same class of result
        assert_eq!(got.is_nan(), want.is_nan(), "{got} vs {want}");
        return 0.0;
    }
    let err = (got as f64 - want as f64).abs();
    assert!(
        err <= 1e-5 * mag + 1e-30,
        "{ty:?}: {got} vs {want} (Σ|terms| {mag})"
    );
    if mag > 0.0 {
        err / mag
    } else {
        0.0
    }
}

#[test]
fn dot_error_is_small() {
    let mut worst = 0f64;
    for ty in TcqType::ALL {
        let seeds = if cfg!(debug_assertions) { 30 } else { 300u64 };
        for seed in 0..seeds {
            let nb = 1 + (seed as usize % 64);
            let x = if seed % 2 == 0 {
                random_blocks(ty, nb, seed)
            } else {
                enc(ty, &query(nb * 64, seed, 1.0))
            };
            let q = query(nb * 64, seed ^ 0xabc, 2f32.powi(seed as i32 % 20 - 10));
            for level in simd_levels() {
                let got = tk::vec_dot_row_at(level, ty, &x, &q);
                worst = worst.max(check_dot(got, ty, &x, &q));
            }
        }
    }
    eprintln!("worst |simd - oracle| / Σ|terms| = {worst:.3e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn simd_equals_the_oracle(seed in any::<u64>(), nb in 1usize..12, v in -8f32..8.0,
                              qscale in -30i32..30) {
        for ty in TcqType::ALL {
            let x = random_blocks(ty, nb, seed);
            let q = query(nb * 64, seed ^ 1, 2f32.powi(qscale));
            let mut want = vec![0f32; nb * 64];
            scalar::dequantize_row(ty, &x, &mut want);
            let mut want_mad = q.clone();
            scalar::mad_row(ty, &x, &mut want_mad, v);
            for level in simd_levels() {
                let mut got = vec![0f32; nb * 64];
                tk::dequantize_row_at(level, ty, &x, &mut got);
                prop_assert_eq!(bits(&got), bits(&want));
                let mut acc = q.clone();
                tk::mad_row_at(level, ty, &x, &mut acc, v);
                prop_assert_eq!(bits(&acc), bits(&want_mad));
                check_dot(tk::vec_dot_row_at(level, ty, &x, &q), ty, &x, &q);
            }
        }
    }

    #[test]
    fn tiles_equal_row_by_row(seed in any::<u64>(), nrows in 1usize..19, nb in 1usize..5,
                              pad in 0usize..40) {
        for ty in TcqType::ALL {
            let row = nb * ty.block_bytes();
            let stride = row + pad;
            let x = random_blocks(ty, (nrows * stride).div_ceil(ty.block_bytes()) + 1, seed);
            let x = &x[..(nrows - 1) * stride + row];
            let q = query(nb * 64, seed ^ 2, 1.0);
            let w: Vec<f32> = query(64, seed ^ 3, 1.0)[..nrows].to_vec();
            let y0 = query(nb * 64, seed ^ 4, 1.0);
            let mut want_y = y0.clone();
            for (r, &wr) in w.iter().enumerate() {
                scalar::mad_row(ty, &x[r * stride..r * stride + row], &mut want_y, wr);
            }
            for level in available_levels() {
                // guard values past the tile must survive
                let mut out = vec![f32::MAX; nrows + 3];
                tk::dot_rows_at(level, ty, x, stride, &q, &mut out[..nrows]);
                prop_assert!(out[nrows..].iter().all(|&v| v == f32::MAX));
                for r in 0..nrows {
                    check_dot(out[r], ty, &x[r * stride..r * stride + row], &q);
                }
                let mut y = y0.clone();
                tk::mad_rows_at(level, ty, x, stride, &w, &mut y);
                prop_assert_eq!(bits(&y), bits(&want_y));
            }
        }
    }

    /// Encoded blocks of any magnitude, zero, NaN / Inf / huge inputs decode
    /// finite, and identically at every level.
    #[test]
    fn encoded_bad_input_decodes_finite_everywhere(seed in any::<u64>(), e in -40i32..40,
                                                    poison in 0usize..64) {
        for ty in TcqType::ALL {
            let mut x = query(4 * 64, seed, 2f32.powi(e));
            x[poison] = f32::NAN;
            x[64 + poison] = f32::INFINITY;
            x[128..192].fill(0.0);
            x[192 + poison] = f32::MAX;
            x[192 + (poison + 1) % 64] = f32::NEG_INFINITY;
            let b = enc(ty, &x);
            let mut want = vec![0f32; x.len()];
            scalar::dequantize_row(ty, &b, &mut want);
            prop_assert!(want.iter().all(|v| v.is_finite()));
            prop_assert!(want[128..192].iter().all(|&v| v == 0.0));
            for level in simd_levels() {
                let mut got = vec![0f32; x.len()];
                tk::dequantize_row_at(level, ty, &b, &mut got);
                prop_assert_eq!(bits(&got), bits(&want));
            }
        }
    }
}

#[test]
fn codec_rows_reject_partial_blocks() {
    for ty in TcqType::ALL {
        let bb = ty.block_bytes();
        for n in [1usize, 63, 65, 100, 127] {
            let x = vec![0f32; n];
            let mut y = vec![0f32; n];
            let nb = n.div_ceil(64);
            assert_eq!(
                codec::dequantize(ty, &vec![0; nb * bb], &mut y),
                Err(TqError::BadLength)
            );
            assert_eq!(
                codec::vec_dot(ty, &vec![0; nb * bb], &x),
                Err(TqError::BadLength)
            );
            assert_eq!(
                codec::mad(ty, &vec![0; nb * bb], &mut y, 1.0),
                Err(TqError::BadLength)
            );
            let mut out = vec![0u8; nb * bb];
            let mut sc = Scratch::new(ty.l(), ty.k(), 64);
            assert_eq!(
                codec::quantize(ty, &x, &mut out, &mut sc),
                Err(TqError::BadLength)
            );
            assert_eq!(
                codec::quantize_thread_scratch(ty, &x, &mut out),
                Err(TqError::BadLength)
            );
        }
    }
}

#[test]
#[should_panic(expected = "not a multiple of 64")]
fn safe_api_panics_on_partial_blocks() {
    let mut y = vec![0f32; 100];
    tk::dequantize_row_at(SimdLevel::Scalar, TcqType::Turbo3Tcq, &[0; 52], &mut y);
}

#[test]
#[should_panic(expected = "does not match")]
fn safe_api_panics_on_byte_mismatch() {
    tk::vec_dot_row_at(SimdLevel::Scalar, TcqType::Turbo2Tcq, &[0; 17], &[0.0; 64]);
}

// ------------------------------------------------------------ encoder ---

/// The Viterbi search as first written (separate group-minimum pass per step,
/// strict `<` scans), the reference the optimized passes must equal.
fn ref_viterbi(tr: &Trellis, u: &[f32], start: Option<u32>, end: Option<u32>) -> (f32, Vec<u32>) {
    let (ns, g, k, l) = (tr.states(), tr.groups(), tr.k, tr.l);
    let nh = 1usize << k;
    let n = u.len();
    let mut costs = vec![0f32; ns * n];
    for (s, c) in costs[..ns].iter_mut().enumerate() {
        let e = u[0] - tr.table[s];
        *c = match start {
            Some(o) if (s >> k) as u32 != o => f32::INFINITY,
            _ => e * e,
        };
    }
    for t in 1..n {
        for j in 0..g {
            let mut m = costs[(t - 1) * ns + j];
            for hi in 1..nh {
                let c = costs[(t - 1) * ns + hi * g + j];
                m = if c < m { c } else { m };
            }
            for c in 0..nh {
                let e = u[t] - tr.table[j * nh + c];
                costs[t * ns + j * nh + c] = m + e * e;
            }
        }
    }
    let last = &costs[(n - 1) * ns..];
    let (mut best, mut best_cost) = (u32::MAX, f32::INFINITY);
    for (s, &c) in last.iter().enumerate() {
        let ok = end.is_none_or(|o| (s & (g - 1)) as u32 == o);
        if ok && (c < best_cost || best == u32::MAX) {
            best = s as u32;
            best_cost = c;
        }
    }
    let mut states = vec![0u32; n];
    states[n - 1] = best;
    for t in (1..n).rev() {
        let gi = (states[t] >> k) as usize;
        let prev = &costs[(t - 1) * ns..t * ns];
        let mut hi = 0usize;
        for h in 1..nh {
            if prev[h * g + gi] < prev[hi * g + gi] {
                hi = h;
            }
        }
        states[t - 1] = ((hi << (l - k)) | gi) as u32;
    }
    (best_cost, states)
}

fn ref_tailbiting(tr: &Trellis, u: &[f32]) -> (f32, Vec<u32>) {
    let n = u.len();
    let h = n / 2;
    let rot: Vec<f32> = u[n - h..].iter().chain(&u[..n - h]).copied().collect();
    let (_, st) = ref_viterbi(tr, &rot, None, None);
    let o = st[h - 1] & (tr.groups() as u32 - 1);
    ref_viterbi(tr, u, Some(o), Some(o))
}

/// Inputs that stress ties and non-finite values as well as typical blocks.
fn encoder_inputs(seed: u64) -> Vec<Vec<f32>> {
    let mut r = SplitMix64::new(seed);
    let mut v: Vec<Vec<f32>> = (0..40)
        .map(|i| {
            let s = 2f32.powi(i % 7 - 3);
            (0..64).map(|_| r.next_gaussian() as f32 * s).collect()
        })
        .collect();
    v.push(vec![0.0; 64]);
    v.push(vec![1.0; 64]);
    v.push(vec![-8.0; 64]);
    v.push((0..64).map(|i| (i % 3) as f32 - 1.0).collect());
    // values on a coarse grid: many exactly equal path costs
    v.push((0..64).map(|_| (r.next() % 5) as f32 * 0.5 - 1.0).collect());
    let mut nan: Vec<f32> = (0..64).map(|_| r.next_gaussian() as f32).collect();
    nan[7] = f32::NAN;
    nan[40] = f32::NAN;
    v.push(nan);
    let mut inf: Vec<f32> = (0..64).map(|_| r.next_gaussian() as f32).collect();
    inf[3] = f32::INFINITY;
    inf[50] = f32::NEG_INFINITY;
    v.push(inf);
    v.push(vec![f32::NAN; 64]);
    v
}

fn same(a: (f32, &[u32]), b: (f32, &[u32])) -> bool {
    a.0.to_bits() == b.0.to_bits() && a.1 == b.1
}

#[test]
fn encoder_search_equals_the_reference() {
    let before = simd_level();
    for level in available_levels() {
        assert!(set_simd_level(level));
        for ty in TcqType::ALL {
            let tr = ty.trellis();
            let mut sc = Scratch::new(ty.l(), ty.k(), 64);
            // a table with repeated values forces ties between predecessors
            let coarse: Vec<f32> = tr.table.iter().map(|v| (v * 2.0).round() / 2.0).collect();
            let trc = Trellis::new(ty.l(), ty.k(), &coarse);
            // debug builds: one seed (the search is ~50x slower unoptimized)
            let seeds = if cfg!(debug_assertions) { 1 } else { 6u64 };
            for seed in 0..seeds {
                for u in encoder_inputs(seed) {
                    for t in [&tr, &trc] {
                        let (c, st) = ref_tailbiting(t, &u);
                        let got = sc.viterbi_tailbiting(t, &u);
                        assert!(
                            same((got, &sc.states[..64]), (c, &st)),
                            "{level:?} {ty:?} tail-biting {u:?}"
                        );
                        for (start, end) in [(None, None), (Some(5), Some(5)), (Some(0), None)] {
                            let (c, st) = ref_viterbi(t, &u, start, end);
                            let got = sc.viterbi(t, &u, start, end);
                            assert!(same((got, &sc.states[..64]), (c, &st)), "{level:?} {ty:?}");
                        }
                        // shorter blocks (the study's windows)
                        let (c, st) = ref_viterbi(t, &u[..17], None, None);
                        let got = sc.viterbi(t, &u[..17], None, None);
                        assert!(same((got, &sc.states[..17]), (c, &st)), "{level:?} {ty:?}");
                    }
                }
            }
        }
    }
    set_simd_level(before);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(debug_assertions) { 6 } else { 48 }))]

    /// Whole-codec bytes at every level equal the bytes the reference search gives.
    #[test]
    fn encoder_bytes_equal_the_reference(seed in any::<u64>(), e in -20i32..20) {
        let before = simd_level();
        for ty in TcqType::ALL {
            let x = query(3 * 64, seed, 2f32.powi(e));
            let mut want: Option<Vec<u8>> = None;
            for level in available_levels() {
                set_simd_level(level);
                let b = enc(ty, &x);
                if let Some(w) = &want {
                    prop_assert_eq!(&b, w);
                } else {
                    want = Some(b);
                }
            }
            // and the search on the normalized block equals the reference
            let tr = ty.trellis();
            let mut sc = Scratch::new(ty.l(), ty.k(), 64);
            for xb in x.chunks_exact(64) {
                let n = xb.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt();
                if n == 0.0 {
                    continue;
                }
                let u: Vec<f32> = xb.iter().map(|&v| (v as f64 / (n / 8.0)) as f32).collect();
                let (c, st) = ref_tailbiting(&tr, &u);
                let got = sc.viterbi_tailbiting(&tr, &u);
                prop_assert!(same((got, &sc.states[..64]), (c, &st)));
            }
        }
        set_simd_level(before);
    }
}
