//! Arbitrary bytes as turbo blocks: every decode path returns 0 and yields only
//! finite floats (a NaN / infinite / negative fp16 scale decodes as 0, and
//! tq_ggml_validate_row reports exactly those blocks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use turboquant_capi::*;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let t = 2 + (sel % 3) as i32;
    let bb = tq_block_bytes(t) as usize;
    let nb = rest.len() / bb;
    let x = &rest[..nb * bb];
    let n = (nb * 64) as i64;
    let mut y = vec![f32::NAN; nb * 64];
    let rc = unsafe { tq_dequantize(t, x.as_ptr().cast(), y.as_mut_ptr(), n) };
    assert_eq!(rc, 0);
    assert!(y.iter().all(|v| v.is_finite()));
    // the dot with ones and the mad stay finite too
    let ones = vec![1f32; nb * 64];
    let mut s = f32::NAN;
    assert_eq!(
        unsafe { tq_vec_dot_f32(t, x.as_ptr().cast(), ones.as_ptr(), n, &mut s) },
        0
    );
    assert!(s.is_finite());
    let mut acc = vec![0f32; nb * 64];
    assert_eq!(
        unsafe { tq_mad(t, x.as_ptr().cast(), acc.as_mut_ptr(), n, 1.0) },
        0
    );
    assert!(acc
        .iter()
        .zip(&y)
        .all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0)));
    // validate_row == "every scale finite and non-negative"
    let valid = x.chunks_exact(bb).all(|b| {
        let h = half::f16::from_bits(u16::from_ne_bytes([b[0], b[1]]));
        h.is_finite() && !(h.to_f32() < 0.0)
    });
    assert_eq!(
        unsafe { tq_ggml_validate_row(t, x.as_ptr().cast(), x.len()) },
        valid as i32
    );
    // a wrong length is an error, never a crash
    if n > 0 {
        assert_eq!(
            unsafe { tq_dequantize(t, x.as_ptr().cast(), y.as_mut_ptr(), n - 1) },
            -2
        );
    }
});
