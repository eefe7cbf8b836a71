//! Properties of the trellis-coded codec: the Viterbi search is optimal
//! (brute force on tiny trellises), paths close (tail-biting), the byte format
//! decodes to the encoder's path, distortion on Gaussian rows stays within the
//! measured bounds (docs/TCQ.md), and bad input is handled like turbo types.

use proptest::prelude::*;
use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::tcq::block::{pack_symbols, state_at, unpack_symbols};
use turboquant_codec::tcq::codec::{self, encode_states, EncodeOpts};
use turboquant_codec::tcq::train::{gaussian_blocks, initial_table};
use turboquant_codec::tcq::viterbi::{path_symbols, symbol_states};
use turboquant_codec::tcq::{Scratch, TcqType, Trellis};
use turboquant_codec::TqError;

fn enc(ty: TcqType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / 64 * ty.block_bytes()];
    let mut sc = Scratch::new(ty.l(), ty.k(), 64);
    codec::quantize(ty, x, &mut out, &mut sc).unwrap();
    out
}

fn dec(ty: TcqType, b: &[u8]) -> Vec<f32> {
    let mut y = vec![0f32; b.len() / ty.block_bytes() * 64];
    codec::dequantize(ty, b, &mut y).unwrap();
    y
}

fn rel(x: &[f32], y: &[f32]) -> f64 {
    let (mut e, mut n) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        e += (a as f64 - b as f64).powi(2);
        n += (a as f64).powi(2);
    }
    e / n
}

/// Cost of the circular symbol string `c` (same f32 order as the Viterbi).
fn path_cost(tr: &Trellis, c: &[u8], u: &[f32]) -> f32 {
    let mut st = vec![0u32; c.len()];
    symbol_states(c, tr.k, tr.l, &mut st);
    let mut cost = 0f32;
    for (&s, &v) in st.iter().zip(u) {
        let e = v - tr.table[s as usize];
        cost += e * e;
    }
    cost
}

#[test]
fn viterbi_matches_brute_force_on_tiny_trellises() {
    let mut r = SplitMix64::new(7);
    for (l, k, n) in [
        (3, 1, 8),
        (4, 1, 9),
        (4, 2, 5),
        (5, 2, 5),
        (6, 2, 6),
        (5, 3, 4),
        (6, 3, 4),
    ] {
        let table = initial_table(l, 100 + l as u64);
        let tr = Trellis::new(l, k, &table);
        let mut sc = Scratch::new(l, k, n);
        for _ in 0..20 {
            let u: Vec<f32> = (0..n).map(|_| r.next_gaussian() as f32).collect();
            // brute force over every circular symbol string
            let mut best = f32::INFINITY;
            let mut c = vec![0u8; n];
            for code in 0u64..(1 << (n as u32 * k)) {
                for (t, ct) in c.iter_mut().enumerate() {
                    *ct = ((code >> (k as usize * t)) & ((1 << k) - 1)) as u8;
                }
                best = best.min(path_cost(&tr, &c, &u));
            }
            let exact = sc.viterbi_exact_tailbiting(&tr, &u);
            assert!(
                (exact - best).abs() <= 1e-5 * best.max(1.0),
                "L{l} k{k}: {exact} vs {best}"
            );
            // the path it returns closes and costs what it says
            path_symbols(&sc.states[..n], k, &mut c);
            let mut st = vec![0u32; n];
            symbol_states(&c, k, l, &mut st);
            assert_eq!(&st[..], &sc.states[..n]);
            assert!((path_cost(&tr, &c, &u) - exact).abs() <= 1e-5 * exact.max(1.0));
            // the 2-pass encoder search closes too and is never better than exact
            let two = sc.viterbi_tailbiting(&tr, &u);
            assert!(two >= exact - 1e-5 * exact.max(1.0));
            path_symbols(&sc.states[..n], k, &mut c);
            symbol_states(&c, k, l, &mut st);
            assert_eq!(&st[..], &sc.states[..n], "2-pass path does not close");
            // a free start/end is a relaxation: never worse than any closed path
            let free = sc.viterbi(&tr, &u, None, None);
            assert!(free <= exact + 1e-6 * exact.max(1.0));
        }
    }
}

#[test]
fn symbol_packing_and_random_access_states_agree() {
    let mut r = SplitMix64::new(3);
    for ty in TcqType::ALL {
        let (k, l) = (ty.k(), ty.l());
        for _ in 0..50 {
            let c: Vec<u8> = (0..64).map(|_| (r.next() & ((1 << k) - 1)) as u8).collect();
            let mut qs = vec![0u8; 8 * k as usize];
            pack_symbols(&c, k, &mut qs);
            let mut back = [0u8; 64];
            unpack_symbols(&qs, k, &mut back);
            assert_eq!(&back[..], &c[..]);
            let mut st = [0u32; 64];
            symbol_states(&c, k, l, &mut st);
            for (t, &s) in st.iter().enumerate() {
                assert_eq!(s, state_at(&qs, k, l, t), "{ty:?} t={t}");
            }
        }
    }
}

#[test]
fn decoded_bytes_follow_the_encoder_path() {
    for ty in TcqType::ALL {
        let tr = ty.trellis();
        let x = gaussian_blocks(64, 11);
        let mut sc = Scratch::new(ty.l(), ty.k(), 64);
        let b = enc(ty, &x);
        let y = dec(ty, &b);
        for (i, xb) in x.chunks_exact(64).enumerate() {
            let dh = encode_states(&tr, xb, EncodeOpts::CODEC, &mut sc);
            let d = half::f16::from_bits(dh).to_f32();
            for t in 0..64 {
                assert_eq!(y[64 * i + t], d * tr.table[sc.states[t] as usize]);
            }
        }
    }
}

/// Upper bounds on the mean relative MSE of 256 Gaussian blocks, and on any
/// single block: measured values (docs/TCQ.md) plus margin. Scales keep the
/// block rms inside fp16's normal range (the scale is about the rms; larger
/// blocks clamp at 65504 as for turbo types).
fn bounds(ty: TcqType) -> (f64, f64) {
    match ty {
        TcqType::Turbo3Tcq => (0.0225, 0.10),
        TcqType::Turbo2Tcq => (0.081, 0.20),
    }
}

#[test]
fn held_out_gaussian_distortion_meets_the_issue_targets() {
    // 4096 blocks never seen by the trainer; measured 0.0209 / 0.0771 on
    // 20000 (docs/TCQ.md), targets of issue #16: 0.022 / 0.080.
    for (ty, target) in [(TcqType::Turbo3Tcq, 0.022), (TcqType::Turbo2Tcq, 0.080)] {
        let x = gaussian_blocks(4096, 0x4E1D0_u64);
        let y = dec(ty, &enc(ty, &x));
        let mean: f64 = x
            .chunks_exact(64)
            .zip(y.chunks_exact(64))
            .map(|(a, b)| rel(a, b))
            .sum::<f64>()
            / 4096.0;
        assert!(mean < target, "{ty:?}: {mean}");
        // and the trellis beats the scalar codebook type of the same size
        let sty = if ty.k() == 3 {
            turboquant_codec::TqType::Turbo3
        } else {
            turboquant_codec::TqType::Turbo2
        };
        let mut sb = vec![0u8; turboquant_codec::encoded_len(sty, x.len()).unwrap()];
        turboquant_codec::quantize(sty, &x, &mut sb).unwrap();
        let mut sy = vec![0f32; x.len()];
        turboquant_codec::dequantize(sty, &sb, &mut sy).unwrap();
        let smean: f64 = x
            .chunks_exact(64)
            .zip(sy.chunks_exact(64))
            .map(|(a, b)| rel(a, b))
            .sum::<f64>()
            / 4096.0;
        assert!(mean < 0.75 * smean, "{ty:?}: {mean} vs scalar {smean}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn gaussian_rows_distortion_within_bounds(seed in any::<u64>(), scale_exp in -14i32..15) {
        let s = (2f32).powi(scale_exp);
        for ty in TcqType::ALL {
            let x: Vec<f32> = gaussian_blocks(256, seed).iter().map(|v| v * s).collect();
            let y = dec(ty, &enc(ty, &x));
            let (mean_b, max_b) = bounds(ty);
            let mut mean = 0f64;
            for (xb, yb) in x.chunks_exact(64).zip(y.chunks_exact(64)) {
                let r = rel(xb, yb);
                prop_assert!(r < max_b, "{:?} block rel {}", ty, r);
                mean += r / 256.0;
            }
            prop_assert!(mean < mean_b, "{:?} mean rel {}", ty, mean);
        }
    }

    #[test]
    fn negation_complements_the_bits(seed in any::<u64>()) {
        for ty in TcqType::ALL {
            let x = gaussian_blocks(4, seed);
            let nx: Vec<f32> = x.iter().map(|v| -v).collect();
            let (a, b) = (enc(ty, &x), enc(ty, &nx));
            for (ba, bb) in a.chunks_exact(ty.block_bytes()).zip(b.chunks_exact(ty.block_bytes())) {
                prop_assert_eq!(ba[..2].to_vec(), bb[..2].to_vec());
                let comp: Vec<u8> = ba[2..].iter().map(|v| !v).collect();
                prop_assert_eq!(comp, bb[2..].to_vec());
            }
        }
    }

    #[test]
    fn vec_dot_and_mad_match_dequantize(seed in any::<u64>(), v in -4f32..4.0) {
        for ty in TcqType::ALL {
            let x = gaussian_blocks(3, seed);
            let q = gaussian_blocks(3, seed ^ 1);
            let b = enc(ty, &x);
            let y = dec(ty, &b);
            let want: f64 = y.iter().zip(&q).map(|(&a, &c)| (a * c) as f64).sum();
            let got = codec::vec_dot(ty, &b, &q).unwrap();
            let mag: f64 = y.iter().zip(&q).map(|(&a, &c)| (a * c).abs() as f64).sum();
            // the dispatching vec_dot: the kernels' bound (tests/tcq_kernels.rs)
            prop_assert!((got as f64 - want).abs() <= 1e-5 * mag + 1e-30);
            let mut acc = q.clone();
            codec::mad(ty, &b, &mut acc, v).unwrap();
            for i in 0..acc.len() {
                prop_assert_eq!(acc[i], q[i] + v * y[i]);
            }
        }
    }
}

#[test]
fn bad_input_decodes_finite_and_spares_neighbours() {
    let mut r = SplitMix64::new(5);
    for ty in TcqType::ALL {
        let bb = ty.block_bytes();
        for kind in 0..7 {
            let mut bad: Vec<f32> = (0..64).map(|_| r.next_gaussian() as f32).collect();
            match kind {
                0 => bad[7] = f32::NAN,
                1 => bad[0] = f32::INFINITY,
                2 => bad.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                3 => bad.iter_mut().for_each(|v| *v = 0.0),
                4 => bad.iter_mut().for_each(|v| *v *= 1e-40),
                5 => bad
                    .iter_mut()
                    .for_each(|v| *v = if *v > 0.0 { f32::MAX } else { -f32::MAX }),
                _ => bad.iter_mut().for_each(|v| *v = f32::NAN),
            }
            let left = gaussian_blocks(1, 100 + kind);
            let right = gaussian_blocks(1, 200 + kind);
            let row: Vec<f32> = left.iter().chain(&bad).chain(&right).copied().collect();
            let e = enc(ty, &row);
            assert_eq!(&e[..bb], &enc(ty, &left)[..], "{ty:?} kind {kind}");
            assert_eq!(&e[2 * bb..], &enc(ty, &right)[..], "{ty:?} kind {kind}");
            let y = dec(ty, &e);
            assert!(y.iter().all(|v| v.is_finite()), "{ty:?} kind {kind}");
            if kind == 3 || kind == 6 {
                assert_eq!(&e[bb..bb + 2], &[0, 0], "zero / all-NaN block has scale 0");
                assert!(y[64..128].iter().all(|&v| v == 0.0));
            }
        }
        // corrupted scales (NaN, Inf, negative) decode to zeros
        let mut b = enc(ty, &gaussian_blocks(1, 9));
        for h in [0x7e00u16, 0x7c00, 0xbc00] {
            b[..2].copy_from_slice(&h.to_ne_bytes());
            assert!(dec(ty, &b).iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn bad_lengths_are_rejected() {
    for ty in TcqType::ALL {
        let mut sc = Scratch::new(ty.l(), ty.k(), 64);
        let bb = ty.block_bytes();
        let x = vec![1f32; 128];
        assert_eq!(
            codec::quantize(ty, &x[..100], &mut vec![0; bb * 2], &mut sc),
            Err(TqError::BadLength)
        );
        assert_eq!(
            codec::quantize(ty, &x, &mut vec![0; bb], &mut sc),
            Err(TqError::BadLength)
        );
        assert_eq!(
            codec::dequantize(ty, &vec![0; bb + 1], &mut vec![0.0; 64]),
            Err(TqError::BadLength)
        );
        assert_eq!(
            codec::vec_dot(ty, &vec![0; bb], &x),
            Err(TqError::BadLength)
        );
        assert_eq!(
            codec::mad(ty, &vec![0; bb * 2], &mut vec![0.0; 64], 1.0),
            Err(TqError::BadLength)
        );
        assert_eq!(ty.block_bytes(), if ty.k() == 3 { 26 } else { 18 });
    }
}

#[test]
fn simd_search_gives_the_scalar_bytes() {
    use turboquant_codec::kernels::{available_levels, set_simd_level, SimdLevel};
    let x = gaussian_blocks(200, 21);
    for ty in TcqType::ALL {
        let mut per_level = Vec::new();
        for level in available_levels() {
            assert!(set_simd_level(level));
            per_level.push((level, enc(ty, &x)));
        }
        set_simd_level(SimdLevel::Scalar);
        let reference = enc(ty, &x);
        for (level, bytes) in per_level {
            assert!(bytes == reference, "{ty:?}: {level:?} differs from scalar");
        }
    }
    let best = available_levels().into_iter().max().unwrap();
    set_simd_level(best);
}
