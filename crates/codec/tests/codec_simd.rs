//! Every SIMD path agrees with the scalar oracle: dequantize and mad bit for
//! bit, vec_dot within 1e-5 of the sum of |terms|.

use turboquant_codec::kernels::{self, available_levels, SimdLevel};
use turboquant_codec::testing::*;
use turboquant_codec::TqType;

const LENS: [usize; 6] = [64, 128, 192, 256, 1024, 4096];

fn cases(seed: u64) -> Vec<(TqType, usize, Vec<u8>, Vec<f32>)> {
    let mut rng = TRng::new(seed);
    let mut out = vec![];
    for ty in TqType::ALL {
        for n in LENS {
            // encoded gaussian data and raw random blocks
            let x = rng.gauss_vec(n);
            out.push((ty, n, encode(ty, &x), rng.gauss_vec(n)));
            out.push((ty, n, rng.blocks(ty, n / 64), rng.gauss_vec(n)));
        }
    }
    out
}

#[test]
fn levels_detected() {
    let l = available_levels();
    eprintln!("available: {l:?}, dispatch: {:?}", kernels::simd_level());
    assert_eq!(l[0], SimdLevel::Scalar);
    assert!(l.contains(&kernels::simd_level()));
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert!(l.contains(&SimdLevel::Avx2));
    }
}

#[test]
fn dequantize_bit_exact_on_every_level() {
    for (ty, n, x, _) in cases(1) {
        let mut want = vec![0f32; n];
        kernels::dequantize_row_at(SimdLevel::Scalar, ty, &x, &mut want);
        // the oracle itself: d * C[idx]
        let cb = ty.codebook();
        let bb = ty.block_bytes();
        for b in 0..n / 64 {
            let blk = &x[b * bb..(b + 1) * bb];
            let d = turboquant_codec::block::decode_scale(u16::from_ne_bytes([blk[0], blk[1]]));
            let mut idx = [0u8; 64];
            turboquant_codec::block::unpack_indices(ty, &blk[2..], &mut idx);
            for j in 0..64 {
                assert_eq!(
                    want[b * 64 + j].to_bits(),
                    (d * cb[idx[j] as usize]).to_bits()
                );
            }
        }
        for level in available_levels() {
            let mut got = vec![f32::NAN; n];
            kernels::dequantize_row_at(level, ty, &x, &mut got);
            for j in 0..n {
                assert_eq!(
                    got[j].to_bits(),
                    want[j].to_bits(),
                    "{level:?} {ty:?} n={n} j={j}"
                );
            }
        }
    }
}

#[test]
fn mad_bit_exact_on_every_level() {
    for (ty, n, x, y0) in cases(2) {
        for v in [0.7f32, -1.3, 0.0, 1e-3] {
            let mut want = y0.clone();
            kernels::mad_row_at(SimdLevel::Scalar, ty, &x, &mut want, v);
            // oracle: y + v * (d * C)
            let mut dec = vec![0f32; n];
            kernels::dequantize_row_at(SimdLevel::Scalar, ty, &x, &mut dec);
            for j in 0..n {
                assert_eq!(want[j].to_bits(), (y0[j] + v * dec[j]).to_bits());
            }
            for level in available_levels() {
                let mut got = y0.clone();
                kernels::mad_row_at(level, ty, &x, &mut got, v);
                for j in 0..n {
                    assert_eq!(
                        got[j].to_bits(),
                        want[j].to_bits(),
                        "{level:?} {ty:?} n={n} j={j} v={v}"
                    );
                }
            }
        }
    }
}

#[test]
fn vec_dot_matches_oracle_on_every_level() {
    for (ty, n, x, y) in cases(3) {
        let mut dec = vec![0f32; n];
        kernels::dequantize_row_at(SimdLevel::Scalar, ty, &x, &mut dec);
        let abs: f64 = dec
            .iter()
            .zip(&y)
            .map(|(&a, &b)| ((a * b) as f64).abs())
            .sum();
        let exact: f64 = dec.iter().zip(&y).map(|(&a, &b)| (a * b) as f64).sum();
        let want = kernels::vec_dot_row_at(SimdLevel::Scalar, ty, &x, &y);
        assert!(
            (want as f64 - exact).abs() <= 1e-6 * abs + 1e-30,
            "oracle off"
        );
        for level in available_levels() {
            let got = kernels::vec_dot_row_at(level, ty, &x, &y);
            let err = (got as f64 - want as f64).abs();
            assert!(
                err <= 1e-5 * abs + 1e-30,
                "{level:?} {ty:?} n={n}: {got} vs {want} (sum|t| {abs})"
            );
        }
    }
}

#[test]
fn corrupt_scales_decode_to_zero_on_every_level() {
    // NaN, +Inf, -Inf, negative normal, negative subnormal: all decode to 0.
    for bits in [0x7e00u16, 0x7c00, 0xfc00, 0xbc00, 0x8001] {
        for ty in TqType::ALL {
            let mut rng = TRng::new(bits as u64);
            let mut x = rng.blocks(ty, 3);
            x[ty.block_bytes()..ty.block_bytes() + 2].copy_from_slice(&bits.to_ne_bytes());
            for level in available_levels() {
                let mut y = vec![0f32; 192];
                kernels::dequantize_row_at(level, ty, &x, &mut y);
                assert!(y.iter().all(|v| v.is_finite()));
                assert!(
                    y[64..128].iter().all(|&v| v == 0.0),
                    "{level:?} {ty:?} {bits:#x}"
                );
                let mut acc = vec![1f32; 192];
                kernels::mad_row_at(level, ty, &x, &mut acc, 2.0);
                assert!(acc[64..128].iter().all(|&v| v == 1.0));
                let ones = vec![1f32; 192];
                assert!(kernels::vec_dot_row_at(level, ty, &x, &ones).is_finite());
            }
        }
    }
}

#[test]
fn dispatching_api_uses_a_supported_level() {
    let mut rng = TRng::new(9);
    for ty in TqType::ALL {
        let x = rng.blocks(ty, 2);
        let y = rng.gauss_vec(128);
        let a = turboquant_codec::vec_dot(ty, &x, &y).unwrap();
        let b = kernels::vec_dot_row_at(kernels::simd_level(), ty, &x, &y);
        assert_eq!(a.to_bits(), b.to_bits());
    }
}

/// Every level this build compiles either ran in the tests above (they loop over
/// `available_levels()`) or is named as unrun: printed, and appended to the file
/// `TQ_TEST_REPORT` names (the summary of .ci/run, scripts/ci-summary.sh). Under `CI=true`
/// a compiled level the CPU lacks fails, except AVX-512: CI machines without it are
/// common and there is no emulator at hand (Intel SDE is not installable there), so it
/// stays a named line (docs/CI.md).
#[test]
fn every_compiled_level_runs_or_is_named_unrun() {
    let compiled: &[SimdLevel] = if cfg!(target_arch = "x86_64") {
        &[SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
    } else {
        &[SimdLevel::Scalar]
    };
    let ran = available_levels();
    let names = |v: &[SimdLevel]| v.iter().map(|l| l.name()).collect::<Vec<_>>().join(" ");
    report(&format!("SIMD ran {}", names(&ran)));
    let on_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    for &level in compiled.iter().filter(|l| !ran.contains(l)) {
        let why = format!("this CPU lacks {}", missing_features(level).join(", "));
        assert!(
            !on_ci || level == SimdLevel::Avx512,
            "CI=true: the build compiles the {} kernels but {why}: they were not tested",
            level.name()
        );
        report(&format!("SIMD unrun {}: {why}", level.name()));
    }
}

/// The CPU features `level` needs that this CPU does not have.
fn missing_features(level: SimdLevel) -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            _ => false,
        };
        let need: &[&'static str] = match level {
            SimdLevel::Scalar => &[],
            SimdLevel::Avx2 => &["avx2", "fma"],
            SimdLevel::Avx512 => &["avx512f", "avx512bw", "avx512vl"],
        };
        need.iter().copied().filter(|f| !has(f)).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        vec!["x86-64"]
    }
}

/// One line to stderr and, when `TQ_TEST_REPORT` is set, to that file.
fn report(line: &str) {
    use std::io::Write;
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TQ_TEST_REPORT") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}
