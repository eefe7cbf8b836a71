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
