//! Bad input never produces NaN/Inf, never leaks into neighbouring blocks,
//! and the C ABI reports errors instead of crashing.

use std::ffi::CStr;
use turboquant_capi::*;
use turboquant_codec::testing::*;
use turboquant_codec::TqType;

const BAD_ROWS: [f32; 6] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    1e-45,
    f32::MAX,
];

fn bad_block(kind: usize, rng: &mut TRng) -> Vec<f32> {
    let mut x = rng.gauss_vec(64);
    match kind {
        0 => x[7] = f32::NAN,
        1 => x[0] = f32::INFINITY,
        2 => x.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
        3 => x.iter_mut().for_each(|v| *v = 0.0),
        4 => x.iter_mut().for_each(|v| *v *= 1e-40), // subnormal f32
        5 => x
            .iter_mut()
            .for_each(|v| *v = if *v > 0.0 { f32::MAX } else { -f32::MAX }),
        6 => x.iter_mut().for_each(|v| *v = f32::NAN),
        7 => x[3] = -0.0_f32 * 0.0 + 1e-38, // tiny normal
        _ => unreachable!(),
    }
    x
}

#[test]
fn bad_rows_decode_finite_and_neighbours_are_unaffected() {
    let _ = BAD_ROWS;
    let mut rng = TRng::new(1);
    for ty in TqType::ALL {
        for kind in 0..8 {
            let left = rng.gauss_vec(64);
            let right = rng.gauss_vec(64);
            let bad = bad_block(kind, &mut rng);
            let row: Vec<f32> = left.iter().chain(&bad).chain(&right).copied().collect();
            let enc = encode(ty, &row);
            let bb = ty.block_bytes();
            assert_eq!(
                &enc[..bb],
                &encode(ty, &left)[..],
                "{ty:?} kind {kind}: left neighbour changed"
            );
            assert_eq!(
                &enc[2 * bb..],
                &encode(ty, &right)[..],
                "{ty:?} kind {kind}: right neighbour changed"
            );
            let y = decode(ty, &enc);
            assert!(
                y.iter().all(|v| v.is_finite()),
                "{ty:?} kind {kind}: non-finite output"
            );
            let d = u16::from_ne_bytes([enc[bb], enc[bb + 1]]);
            assert!(turboquant_codec::block::scale_is_valid(d));
            let ok = unsafe { tq_ggml_validate_row(ty as i32, enc.as_ptr().cast(), enc.len()) };
            assert_eq!(ok, 1);
        }
    }
}

#[test]
fn special_blocks_follow_the_documented_rule() {
    for ty in TqType::ALL {
        // zero block: d = 0, every index 2^(b-1)
        let enc = encode(ty, &[0.0; 64]);
        assert_eq!(u16::from_ne_bytes([enc[0], enc[1]]), 0);
        let mut idx = [0u8; 64];
        turboquant_codec::block::unpack_indices(ty, &enc[2..], &mut idx);
        assert!(idx.iter().all(|&k| k as usize == ty.levels() / 2));
        // all-NaN block == zero block
        assert_eq!(encode(ty, &[f32::NAN; 64]), enc);
        // +Inf is +65504, and the resulting scale saturates at the largest fp16
        let mut x = [0.0f32; 64];
        x[9] = f32::INFINITY;
        let mut y = [0.0f32; 64];
        y[9] = 65504.0;
        assert_eq!(encode(ty, &x), encode(ty, &y));
        let e = encode(ty, &[f32::MAX; 64]);
        assert_eq!(u16::from_ne_bytes([e[0], e[1]]), 0x7bff, "clamped to 65504");
        // a block whose scale underflows fp16 decodes to zeros, not garbage
        let tiny = encode(ty, &[1e-30; 64]);
        assert!(decode(ty, &tiny).iter().all(|&v| v == 0.0));
    }
}

#[test]
fn lengths_not_a_multiple_of_64_are_rejected() {
    let x = vec![1.0f32; 200];
    let mut out = vec![0u8; 1000];
    let mut y = vec![0f32; 200];
    let mut s = 0f32;
    for t in [2, 3, 4] {
        for n in [1i64, 63, 65, 100, 127, -64, -1] {
            unsafe {
                assert_eq!(tq_quantize(t, x.as_ptr(), out.as_mut_ptr().cast(), n), -2);
                assert_eq!(tq_dequantize(t, out.as_ptr().cast(), y.as_mut_ptr(), n), -2);
                assert_eq!(
                    tq_vec_dot_f32(t, out.as_ptr().cast(), x.as_ptr(), n, &mut s),
                    -2
                );
                assert_eq!(tq_mad(t, out.as_ptr().cast(), y.as_mut_ptr(), n, 1.0), -2);
            }
        }
        unsafe {
            assert_eq!(tq_quantize(t, x.as_ptr(), out.as_mut_ptr().cast(), 0), 0);
            assert_eq!(tq_quantize(t, x.as_ptr(), out.as_mut_ptr().cast(), 128), 0);
        }
    }
    // Rust API too
    let ty = TqType::Turbo4;
    assert_eq!(
        turboquant_codec::quantize(ty, &x[..100], &mut out[..34]),
        Err(turboquant_codec::TqError::BadLength)
    );
    assert_eq!(
        turboquant_codec::quantize(ty, &x[..64], &mut out[..33]),
        Err(turboquant_codec::TqError::BadLength)
    );
    assert_eq!(
        turboquant_codec::dequantize(ty, &out[..34], &mut y[..65]),
        Err(turboquant_codec::TqError::BadLength)
    );
}

#[test]
fn null_pointers_are_rejected() {
    let x = vec![1.0f32; 64];
    let mut out = vec![0u8; 64];
    let mut y = vec![0f32; 64];
    let mut s = 0f32;
    let nf: *const f32 = std::ptr::null();
    let nfm: *mut f32 = std::ptr::null_mut();
    unsafe {
        for t in [2, 3, 4] {
            assert_eq!(tq_quantize(t, nf, out.as_mut_ptr().cast(), 64), -3);
            assert_eq!(tq_quantize(t, x.as_ptr(), std::ptr::null_mut(), 64), -3);
            assert_eq!(tq_dequantize(t, std::ptr::null(), y.as_mut_ptr(), 64), -3);
            assert_eq!(tq_dequantize(t, out.as_ptr().cast(), nfm, 64), -3);
            assert_eq!(
                tq_vec_dot_f32(t, std::ptr::null(), x.as_ptr(), 64, &mut s),
                -3
            );
            assert_eq!(tq_vec_dot_f32(t, out.as_ptr().cast(), nf, 64, &mut s), -3);
            assert_eq!(
                tq_vec_dot_f32(t, out.as_ptr().cast(), x.as_ptr(), 64, nfm),
                -3
            );
            assert_eq!(tq_mad(t, std::ptr::null(), y.as_mut_ptr(), 64, 1.0), -3);
            assert_eq!(tq_codebook(t, nfm, 16), -3);
            assert_eq!(
                tq_quantize(t, nf, out.as_mut_ptr().cast(), 0),
                -3,
                "null is an error even for n = 0"
            );
            assert_eq!(tq_ggml_validate_row(t, std::ptr::null(), 34 * 26 * 18), 0);
            assert_eq!(tq_ggml_validate_row(t, std::ptr::null(), 0), 1);
        }
        assert_eq!(tq_rotation_matrix(64, 1, nfm), -3);
        assert_eq!(tq_rotate(64, 1, nfm, 64), -3);
    }
}

#[test]
fn unknown_types_are_rejected() {
    let x = vec![1.0f32; 64];
    let mut out = vec![0u8; 64];
    let mut y = vec![0f32; 64];
    let mut s = 0f32;
    let mut cb = [0f32; 32];
    for t in [7, 0, 1, 5, -1, i32::MIN, i32::MAX] {
        assert_eq!(tq_block_values(t), -1);
        assert_eq!(tq_block_bytes(t), -1);
        unsafe {
            assert_eq!(tq_quantize(t, x.as_ptr(), out.as_mut_ptr().cast(), 64), -1);
            assert_eq!(
                tq_dequantize(t, out.as_ptr().cast(), y.as_mut_ptr(), 64),
                -1
            );
            assert_eq!(
                tq_vec_dot_f32(t, out.as_ptr().cast(), x.as_ptr(), 64, &mut s),
                -1
            );
            assert_eq!(tq_mad(t, out.as_ptr().cast(), y.as_mut_ptr(), 64, 1.0), -1);
            assert_eq!(tq_codebook(t, cb.as_mut_ptr(), 32), -1);
            assert_eq!(tq_ggml_validate_row(t, out.as_ptr().cast(), 34), 0);
            // type is checked before pointers
            assert_eq!(
                tq_quantize(t, std::ptr::null(), std::ptr::null_mut(), 3),
                -1
            );
        }
    }
    assert_eq!(
        (tq_block_values(2), tq_block_values(3), tq_block_values(4)),
        (64, 64, 64)
    );
    assert_eq!(
        (tq_block_bytes(2), tq_block_bytes(3), tq_block_bytes(4)),
        (18, 26, 34)
    );
}

#[test]
fn error_strings_are_never_null() {
    for code in -100..100 {
        let p = tq_error_string(code);
        assert!(!p.is_null());
        let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap();
        assert!(!s.is_empty());
    }
    let msg = |c| {
        unsafe { CStr::from_ptr(tq_error_string(c)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert!(msg(-3).contains("null"));
    assert_ne!(msg(-1), msg(-2));
    assert!(!tq_simd_name().is_null());
}

#[test]
fn rotation_and_codebook_argument_errors() {
    let mut m = vec![0f32; 64 * 64];
    unsafe {
        for dim in [0i64, 1, 3, 48, 100, 131072, -64] {
            assert_eq!(tq_rotation_matrix(dim, 1, m.as_mut_ptr()), -4, "dim {dim}");
            assert_eq!(tq_rotate(dim, 1, m.as_mut_ptr(), 64), -4, "dim {dim}");
        }
        assert_eq!(tq_rotate(64, 1, m.as_mut_ptr(), 96), -2);
        assert_eq!(tq_rotate(64, 1, m.as_mut_ptr(), -64), -2);
        assert_eq!(tq_rotate(64, 1, m.as_mut_ptr(), 0), 0);
        let mut cb = [0f32; 16];
        assert_eq!(tq_codebook(4, cb.as_mut_ptr(), 15), -2);
        assert_eq!(tq_codebook(4, cb.as_mut_ptr(), 16), 0);
        assert_eq!(&cb[..], TqType::Turbo4.codebook());
        assert_eq!(tq_codebook(2, cb.as_mut_ptr(), 16), 0);
        assert_eq!(&cb[..4], TqType::Turbo2.codebook());
    }
}

#[test]
fn validate_row_rejects_corrupt_scales() {
    let mut rng = TRng::new(3);
    for ty in TqType::ALL {
        let bb = ty.block_bytes();
        let good = encode(ty, &rng.gauss_vec(256));
        unsafe {
            assert_eq!(
                tq_ggml_validate_row(ty as i32, good.as_ptr().cast(), good.len()),
                1
            );
            assert_eq!(
                tq_ggml_validate_row(ty as i32, good.as_ptr().cast(), good.len() - 1),
                0
            );
        }
        for bits in [0x7c00u16, 0xfc00, 0x7e01, 0xbc00, 0x8001] {
            let mut bad = good.clone();
            bad[2 * bb..2 * bb + 2].copy_from_slice(&bits.to_ne_bytes());
            unsafe {
                assert_eq!(
                    tq_ggml_validate_row(ty as i32, bad.as_ptr().cast(), bad.len()),
                    0,
                    "{bits:#x}"
                )
            };
            // and decoding it stays finite: the corrupt block decodes to zeros
            let y = decode(ty, &bad);
            assert!(y.iter().all(|v| v.is_finite()));
            assert!(y[128..192].iter().all(|&v| v == 0.0));
        }
        let mut negzero = good.clone();
        negzero[..2].copy_from_slice(&0x8000u16.to_ne_bytes());
        unsafe {
            assert_eq!(
                tq_ggml_validate_row(ty as i32, negzero.as_ptr().cast(), negzero.len()),
                1
            )
        };
    }
}

#[test]
fn ggml_hooks_ignore_partial_trailing_blocks() {
    let mut rng = TRng::new(4);
    let x = rng.gauss_vec(128);
    let enc = encode(TqType::Turbo4, &x);
    let mut y = vec![7f32; 128];
    unsafe { tq_ggml_dequantize_row_turbo4(enc.as_ptr().cast(), y.as_mut_ptr(), 100) };
    assert!(y[64..].iter().all(|&v| v == 7.0));
    unsafe { tq_ggml_dequantize_row_turbo4(enc.as_ptr().cast(), y.as_mut_ptr(), -5) };
}
