//! The C hooks of the trellis-coded types do what the Rust codec does, from
//! any thread, and stay inside ggml's buffers.

use core::ffi::c_void;
use turboquant_capi::*;
use turboquant_codec::tcq::train::gaussian_blocks;
use turboquant_codec::tcq::{codec, Scratch, TcqType};

type Q = unsafe extern "C" fn(*const f32, *mut c_void, i64);
type Dq = unsafe extern "C" fn(*const c_void, *mut f32, i64);
type Dot =
    unsafe extern "C" fn(i32, *mut f32, usize, *const c_void, usize, *const c_void, usize, i32);
type Mad = unsafe extern "C" fn(*const c_void, *mut f32, i64, f32);

fn hooks(ty: TcqType) -> (Q, Dq, Dot, Mad) {
    match ty {
        TcqType::Turbo3Tcq => (
            tq_ggml_quantize_row_turbo3_tcq,
            tq_ggml_dequantize_row_turbo3_tcq,
            tq_ggml_vec_dot_turbo3_tcq_f32,
            tq_ggml_mad_turbo3_tcq,
        ),
        TcqType::Turbo2Tcq => (
            tq_ggml_quantize_row_turbo2_tcq,
            tq_ggml_dequantize_row_turbo2_tcq,
            tq_ggml_vec_dot_turbo2_tcq_f32,
            tq_ggml_mad_turbo2_tcq,
        ),
    }
}

#[test]
fn hooks_match_the_codec() {
    for ty in TcqType::ALL {
        let (q, dq, dot, mad) = hooks(ty);
        let nb = 9;
        let x = gaussian_blocks(nb, 42);
        let y = gaussian_blocks(nb, 43);
        let mut want = vec![0u8; nb * ty.block_bytes()];
        codec::quantize(ty, &x, &mut want, &mut Scratch::new(ty.l(), ty.k(), 64)).unwrap();
        // one guard byte past the end: a trailing partial block is ignored
        let mut got = vec![0xA5u8; nb * ty.block_bytes() + 1];
        unsafe {
            q(
                x.as_ptr(),
                got.as_mut_ptr() as *mut c_void,
                (nb * 64 + 10) as i64,
            )
        };
        assert_eq!(&got[..want.len()], &want[..], "{ty:?} quantize");
        assert_eq!(got[want.len()], 0xA5);
        let mut dec = vec![f32::NAN; nb * 64];
        codec::dequantize(ty, &want, &mut dec).unwrap();
        let mut hdec = vec![0f32; nb * 64 + 1];
        hdec[nb * 64] = 7.0;
        unsafe {
            dq(
                want.as_ptr() as *const c_void,
                hdec.as_mut_ptr(),
                (nb * 64) as i64,
            )
        };
        assert_eq!(&hdec[..nb * 64], &dec[..]);
        assert_eq!(hdec[nb * 64], 7.0);
        let mut s = 0f32;
        unsafe {
            dot(
                (nb * 64) as i32,
                &mut s,
                0,
                want.as_ptr() as *const c_void,
                0,
                y.as_ptr() as *const c_void,
                0,
                1,
            )
        };
        assert_eq!(s, codec::vec_dot(ty, &want, &y).unwrap());
        let mut acc = y.clone();
        unsafe {
            mad(
                want.as_ptr() as *const c_void,
                acc.as_mut_ptr(),
                (nb * 64) as i64,
                0.5,
            )
        };
        let mut acc2 = y.clone();
        codec::mad(ty, &want, &mut acc2, 0.5).unwrap();
        assert_eq!(acc, acc2);
        // k <= 0 writes nothing
        let mut none = vec![0x5Au8; 4];
        unsafe { q(x.as_ptr(), none.as_mut_ptr() as *mut c_void, 0) };
        unsafe { q(x.as_ptr(), none.as_mut_ptr() as *mut c_void, -64) };
        assert_eq!(none, [0x5A; 4]);
    }
}

#[test]
fn per_thread_scratch_gives_the_same_bytes() {
    let x = gaussian_blocks(32, 7);
    for ty in TcqType::ALL {
        let (q, ..) = hooks(ty);
        let mut want = vec![0u8; 32 * ty.block_bytes()];
        codec::quantize(ty, &x, &mut want, &mut Scratch::new(ty.l(), ty.k(), 64)).unwrap();
        let outs: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut o = vec![0u8; 32 * ty.block_bytes()];
                        for _ in 0..3 {
                            unsafe { q(x.as_ptr(), o.as_mut_ptr() as *mut c_void, 32 * 64) };
                        }
                        o
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for o in outs {
            assert_eq!(o, want, "{ty:?}");
        }
    }
}

// ------------- the checked functions (crates/capi/src/lib.rs) with trellis ids, and the tiles ---

use turboquant_codec::error::{TQ_ERR_BAD_LENGTH, TQ_ERR_NULL_POINTER, TQ_ERR_UNKNOWN_TYPE, TQ_OK};
use turboquant_codec::tcq::kernels as tk;

fn id(ty: TcqType) -> i32 {
    match ty {
        TcqType::Turbo3Tcq => TQ_TURBO3_TCQ,
        TcqType::Turbo2Tcq => TQ_TURBO2_TCQ,
    }
}

#[test]
fn checked_functions_match_the_codec() {
    for ty in TcqType::ALL {
        let t = id(ty);
        assert_eq!(tq_block_bytes(t), ty.block_bytes() as i64);
        assert_eq!(tq_block_values(t), 64);
        // a trellis type has no codebook: refused before anything is written
        let mut cb = [f32::NAN; 16];
        assert_eq!(
            unsafe { tq_codebook(t, cb.as_mut_ptr(), 16) },
            TQ_ERR_UNKNOWN_TYPE
        );
        assert!(cb.iter().all(|v| v.is_nan()));
        let nb = 5;
        let mut x = gaussian_blocks(nb, 11);
        x[3] = f32::NAN;
        x[70] = f32::INFINITY;
        x[140] = f32::NEG_INFINITY;
        x[200] = 1e30;
        let q = gaussian_blocks(nb, 12);
        let mut want = vec![0u8; nb * ty.block_bytes()];
        codec::quantize(ty, &x, &mut want, &mut Scratch::new(ty.l(), ty.k(), 64)).unwrap();
        let mut got = vec![0u8; want.len()];
        let n = (nb * 64) as i64;
        unsafe {
            assert_eq!(
                tq_quantize(t, x.as_ptr(), got.as_mut_ptr() as *mut c_void, n),
                TQ_OK
            );
        }
        assert_eq!(got, want);
        let mut y = vec![0f32; nb * 64];
        unsafe {
            assert_eq!(
                tq_dequantize(t, got.as_ptr() as *const c_void, y.as_mut_ptr(), n),
                TQ_OK
            );
        }
        let mut yw = vec![0f32; nb * 64];
        codec::dequantize(ty, &want, &mut yw).unwrap();
        assert_eq!(y, yw);
        assert!(y.iter().all(|v| v.is_finite()));
        let mut s = f32::NAN;
        unsafe {
            assert_eq!(
                tq_vec_dot_f32(t, got.as_ptr() as *const c_void, q.as_ptr(), n, &mut s),
                TQ_OK
            );
        }
        assert_eq!(s, codec::vec_dot(ty, &want, &q).unwrap());
        let mut acc = q.clone();
        unsafe {
            assert_eq!(
                tq_mad(t, got.as_ptr() as *const c_void, acc.as_mut_ptr(), n, -0.25),
                TQ_OK
            );
        }
        let mut acc2 = q.clone();
        codec::mad(ty, &want, &mut acc2, -0.25).unwrap();
        assert_eq!(acc, acc2);
        unsafe {
            assert_eq!(
                tq_ggml_validate_row(t, got.as_ptr() as *const c_void, got.len()),
                1
            );
            assert_eq!(
                tq_ggml_validate_row(t, got.as_ptr() as *const c_void, got.len() - 1),
                0
            );
            assert_eq!(tq_ggml_validate_row(t, core::ptr::null(), 0), 1);
            assert_eq!(tq_ggml_validate_row(t, core::ptr::null(), got.len()), 0);
            let mut bad = got.clone();
            bad[ty.block_bytes()..ty.block_bytes() + 2].copy_from_slice(&0x7e00u16.to_ne_bytes());
            assert_eq!(
                tq_ggml_validate_row(t, bad.as_ptr() as *const c_void, bad.len()),
                0
            );
        }
    }
}

#[test]
fn checked_functions_report_errors_in_order_and_write_nothing() {
    let x = gaussian_blocks(2, 1);
    let null_f = core::ptr::null::<f32>();
    for ty in TcqType::ALL {
        let t = id(ty);
        let mut out = vec![0x5Au8; 2 * ty.block_bytes()];
        let o = out.as_mut_ptr() as *mut c_void;
        let mut y = vec![7f32; 128];
        let mut s = 7f32;
        unsafe {
            // the type first, even with NULL pointers and a bad length
            for bad_t in [0, 1, 5, 11, 14, -1] {
                assert_eq!(
                    tq_quantize(bad_t, null_f, core::ptr::null_mut(), -1),
                    TQ_ERR_UNKNOWN_TYPE
                );
                assert_eq!(tq_block_bytes(bad_t), -1);
            }
            // then pointers (NULL is an error even when n == 0)
            assert_eq!(tq_quantize(t, null_f, o, 0), TQ_ERR_NULL_POINTER);
            assert_eq!(
                tq_quantize(t, x.as_ptr(), core::ptr::null_mut(), 64),
                TQ_ERR_NULL_POINTER
            );
            assert_eq!(
                tq_dequantize(t, core::ptr::null(), y.as_mut_ptr(), 64),
                TQ_ERR_NULL_POINTER
            );
            assert_eq!(
                tq_dequantize(t, o, core::ptr::null_mut(), -5),
                TQ_ERR_NULL_POINTER
            );
            assert_eq!(
                tq_vec_dot_f32(t, o, x.as_ptr(), 64, core::ptr::null_mut()),
                TQ_ERR_NULL_POINTER
            );
            assert_eq!(
                tq_vec_dot_f32(t, o, null_f, 64, &mut s),
                TQ_ERR_NULL_POINTER
            );
            assert_eq!(
                tq_mad(t, core::ptr::null(), y.as_mut_ptr(), 64, 1.0),
                TQ_ERR_NULL_POINTER
            );
            // then lengths: negative or not a multiple of 64
            for n in [-64i64, -1, 1, 63, 65, 100, 127] {
                assert_eq!(tq_quantize(t, x.as_ptr(), o, n), TQ_ERR_BAD_LENGTH);
                assert_eq!(tq_dequantize(t, o, y.as_mut_ptr(), n), TQ_ERR_BAD_LENGTH);
                assert_eq!(
                    tq_vec_dot_f32(t, o, x.as_ptr(), n, &mut s),
                    TQ_ERR_BAD_LENGTH
                );
                assert_eq!(tq_mad(t, o, y.as_mut_ptr(), n, 1.0), TQ_ERR_BAD_LENGTH);
            }
            // n == 0 with valid pointers is fine and writes nothing
            assert_eq!(tq_quantize(t, x.as_ptr(), o, 0), TQ_OK);
        }
        assert!(out.iter().all(|&b| b == 0x5A));
        assert!(y.iter().all(|&v| v == 7.0));
        assert_eq!(s, 7.0);
    }
}

type Rows = unsafe extern "C" fn(*const c_void, usize, i64, *const f32, i64, *mut f32);
type MadRows = unsafe extern "C" fn(*const c_void, usize, i64, *const f32, *mut f32, i64);

fn tile_hooks(ty: TcqType) -> (Rows, MadRows) {
    match ty {
        TcqType::Turbo3Tcq => (tq_ggml_dot_rows_turbo3_tcq, tq_ggml_mad_rows_turbo3_tcq),
        TcqType::Turbo2Tcq => (tq_ggml_dot_rows_turbo2_tcq, tq_ggml_mad_rows_turbo2_tcq),
    }
}

#[test]
fn tile_hooks_match_the_row_hooks() {
    for ty in TcqType::ALL {
        let (dot_rows, mad_rows) = tile_hooks(ty);
        let (_, _, dot, mad) = hooks(ty);
        let (nrows, len) = (11usize, 192usize);
        let row = len / 64 * ty.block_bytes();
        let stride = row + 6;
        let x = gaussian_blocks(nrows * len / 64, 5);
        let mut tile = vec![0u8; nrows * stride];
        for r in 0..nrows {
            let mut sc = Scratch::new(ty.l(), ty.k(), 64);
            codec::quantize(
                ty,
                &x[r * len..(r + 1) * len],
                &mut tile[r * stride..r * stride + row],
                &mut sc,
            )
            .unwrap();
        }
        let q = gaussian_blocks(len / 64, 6);
        let w: Vec<f32> = (0..nrows).map(|r| 0.1 * r as f32 - 0.3).collect();
        let mut scores = vec![f32::NAN; nrows + 1];
        scores[nrows] = 9.0;
        let mut y = gaussian_blocks(len / 64, 7);
        let mut y_seq = y.clone();
        unsafe {
            dot_rows(
                tile.as_ptr() as *const c_void,
                stride,
                nrows as i64,
                q.as_ptr(),
                len as i64,
                scores.as_mut_ptr(),
            );
            mad_rows(
                tile.as_ptr() as *const c_void,
                stride,
                nrows as i64,
                w.as_ptr(),
                y.as_mut_ptr(),
                len as i64,
            );
            for r in 0..nrows {
                let p = tile.as_ptr().add(r * stride) as *const c_void;
                let mut s = 0f32;
                dot(
                    len as i32,
                    &mut s,
                    0,
                    p,
                    0,
                    q.as_ptr() as *const c_void,
                    0,
                    1,
                );
                let mag: f32 = {
                    let mut d = vec![0f32; len];
                    codec::dequantize(ty, &tile[r * stride..r * stride + row], &mut d).unwrap();
                    d.iter().zip(&q).map(|(a, b)| (a * b).abs()).sum()
                };
                assert!(
                    (scores[r] - s).abs() <= 1e-5 * mag,
                    "{ty:?} row {r}: {} vs {s}",
                    scores[r]
                );
                mad(p, y_seq.as_mut_ptr(), len as i64, w[r]);
            }
        }
        assert_eq!(scores[nrows], 9.0);
        assert_eq!(
            y, y_seq,
            "{ty:?} mad_rows is not bit-exact with sequential mads"
        );
        // the hooks are the dispatching kernels
        let mut s2 = vec![0f32; nrows];
        tk::dot_rows_at(
            turboquant_codec::kernels::simd_level(),
            ty,
            &tile[..(nrows - 1) * stride + row],
            stride,
            &q,
            &mut s2,
        );
        assert_eq!(&scores[..nrows], &s2[..]);
        // nrows <= 0 and k <= 0 do nothing
        let mut none = vec![3f32; 4];
        unsafe {
            dot_rows(
                tile.as_ptr() as *const c_void,
                stride,
                0,
                q.as_ptr(),
                len as i64,
                none.as_mut_ptr(),
            );
            dot_rows(
                tile.as_ptr() as *const c_void,
                stride,
                -2,
                q.as_ptr(),
                len as i64,
                none.as_mut_ptr(),
            );
            mad_rows(
                tile.as_ptr() as *const c_void,
                stride,
                -1,
                w.as_ptr(),
                none.as_mut_ptr(),
                128,
            );
            mad_rows(
                tile.as_ptr() as *const c_void,
                stride,
                3,
                w.as_ptr(),
                none.as_mut_ptr(),
                0,
            );
        }
        assert_eq!(none, [3.0; 4]);
    }
}

#[test]
fn header_defines_the_trellis_type_ids() {
    // (every declared function is checked by crates/capi/tests/exports.rs)
    let h = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ggml-ext/abi/turboquant.h"
    ))
    .unwrap();
    assert!(h.contains(&format!("TQ_TURBO3_TCQ = {TQ_TURBO3_TCQ}")));
    assert!(h.contains(&format!("TQ_TURBO2_TCQ = {TQ_TURBO2_TCQ}")));
}
