//! Arbitrary f32 bit patterns: quantize returns 0, is deterministic, writes
//! only valid scales, keeps blocks independent, and decodes to finite floats.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turboquant_capi::*;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let t = 2 + (sel % 3) as i32;
    let bb = tq_block_bytes(t) as usize;
    let x: Vec<f32> = rest
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let nb = x.len() / 64;
    let x = &x[..nb * 64];
    let n = x.len() as i64;
    let mut a = vec![0u8; nb * bb];
    let mut b = vec![0u8; nb * bb];
    assert_eq!(
        unsafe { tq_quantize(t, x.as_ptr(), a.as_mut_ptr().cast(), n) },
        0
    );
    assert_eq!(
        unsafe { tq_quantize(t, x.as_ptr(), b.as_mut_ptr().cast(), n) },
        0
    );
    assert_eq!(a, b);
    assert_eq!(
        unsafe { tq_ggml_validate_row(t, a.as_ptr().cast(), a.len()) },
        1
    );
    // block independence: the last block alone encodes identically
    if nb > 1 {
        let mut one = vec![0u8; bb];
        let last = &x[(nb - 1) * 64..];
        assert_eq!(
            unsafe { tq_quantize(t, last.as_ptr(), one.as_mut_ptr().cast(), 64) },
            0
        );
        assert_eq!(&a[(nb - 1) * bb..], &one[..]);
    }
    let mut y = vec![f32::NAN; x.len()];
    assert_eq!(
        unsafe { tq_dequantize(t, a.as_ptr().cast(), y.as_mut_ptr(), n) },
        0
    );
    assert!(y.iter().all(|v| v.is_finite()));
});
