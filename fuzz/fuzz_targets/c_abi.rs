//! Every C ABI entry point with arbitrary type ids, lengths, dimensions,
//! capacities, error codes and NULL pointers: each returns exactly the
//! documented code (checks in the order type/dim, pointers, lengths), never
//! reads or writes outside the buffers it was given (ASan checks that), and the
//! unchecked `tq_ggml_*` hooks agree bit for bit with the checked functions,
//! ignoring a trailing partial block and doing nothing for k <= 0.
//!
//! Input: op byte, type byte (as i8), flags byte, an i64 length/dim, payload.
#![no_main]

use core::ffi::{c_int, c_void, CStr};
use libfuzzer_sys::fuzz_target;
use turboquant_capi::*;

const OK: c_int = 0;
const UNKNOWN_TYPE: c_int = -1;
const BAD_LENGTH: c_int = -2;
const NULL: c_int = -3;
const BAD_DIM: c_int = -4;

struct Input<'a> {
    op: u8,
    t: c_int,
    flags: u8,
    n: i64,
    payload: &'a [u8],
}

fn parse(data: &[u8]) -> Option<Input<'_>> {
    if data.len() < 11 {
        return None;
    }
    Some(Input {
        op: data[0],
        t: data[1] as i8 as c_int,
        flags: data[2],
        n: i64::from_le_bytes(data[3..11].try_into().unwrap()),
        payload: &data[11..],
    })
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The type ids the checked functions take: turbo2..4 and the trellis types.
fn valid_type(t: c_int) -> bool {
    (2..=4).contains(&t) || t == TQ_TURBO2_TCQ || t == TQ_TURBO3_TCQ
}

/// Block bytes of a valid type id, from its bits (2 scale bytes + 64 x bits / 8).
fn block_bytes_of(t: c_int) -> i64 {
    let bits = if t > 4 { t - 10 } else { t };
    2 + 8 * bits as i64
}

/// The code a checked (type, pointers..., n) function must return, or None when
/// the call is valid.
fn expected(t: c_int, nulls: bool, n: i64) -> Option<c_int> {
    if !valid_type(t) {
        Some(UNKNOWN_TYPE)
    } else if nulls {
        Some(NULL)
    } else if n < 0 || n % 64 != 0 {
        Some(BAD_LENGTH)
    } else {
        None
    }
}

/// A length to call with: the raw `n` when the call must be refused before any
/// read (so any value is safe), else `n` folded into what the buffer holds.
fn length(t: c_int, nulls: bool, n: i64, cap_values: usize) -> i64 {
    if expected(t, nulls, n).is_some() {
        n
    } else {
        let blocks = (cap_values / 64) as i64;
        (n / 64).rem_euclid(blocks + 1) * 64
    }
}

fn ptr_or_null<T>(p: *const T, null: bool) -> *const T {
    if null {
        core::ptr::null()
    } else {
        p
    }
}

fn mut_or_null<T>(p: *mut T, null: bool) -> *mut T {
    if null {
        core::ptr::null_mut()
    } else {
        p
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(inp) = parse(data) else {
        return;
    };
    let (t, f) = (inp.t, inp.flags);
    let (null_a, null_b, null_c) = (f & 1 != 0, f & 2 != 0, f & 4 != 0);
    match inp.op % 9 {
        0 => quantize(t, null_a, null_b, inp.n, inp.payload),
        1 => decode_ops(t, f, inp.n, inp.payload),
        2 => vec_dot(t, null_a, null_b, null_c, inp.n, inp.payload),
        3 => rotate(null_a, inp.n, f, inp.payload),
        4 => rotation_matrix(null_a, inp.n),
        5 => codebook(t, null_a, inp.n),
        6 => misc(t, inp.n),
        7 => validate_row(t, null_a, inp.n, inp.payload),
        _ => ggml_hooks(t, inp.n, inp.payload),
    }
});

fn quantize(t: c_int, null_x: bool, null_out: bool, n: i64, payload: &[u8]) {
    let x = floats(payload);
    let n = length(t, null_x || null_out, n, x.len());
    let mut out = vec![0xA5u8; (x.len() / 64) * 34];
    let rc = unsafe {
        tq_quantize(
            t,
            ptr_or_null(x.as_ptr(), null_x),
            mut_or_null(out.as_mut_ptr(), null_out).cast(),
            n,
        )
    };
    match expected(t, null_x || null_out, n) {
        Some(e) => {
            assert_eq!(rc, e);
            assert!(out.iter().all(|&b| b == 0xA5), "refused call wrote");
        }
        None => {
            assert_eq!(rc, OK);
            let bytes = (n / 64) as usize * tq_block_bytes(t) as usize;
            assert!(out[bytes..].iter().all(|&b| b == 0xA5), "wrote past n");
            assert_eq!(
                unsafe { tq_ggml_validate_row(t, out.as_ptr().cast(), bytes) },
                1
            );
        }
    }
}

/// tq_dequantize and tq_mad on arbitrary bytes: same codes, same values.
fn decode_ops(t: c_int, f: u8, n: i64, payload: &[u8]) {
    let (null_x, null_y, use_mad) = (f & 1 != 0, f & 2 != 0, f & 8 != 0);
    let bb = if valid_type(t) {
        tq_block_bytes(t) as usize
    } else {
        34
    };
    let cap = payload.len() / bb * 64;
    let n = length(t, null_x || null_y, n, cap);
    let mut y = vec![f32::from_bits(0x7fc0_1234); cap];
    let rc = unsafe {
        if use_mad {
            tq_mad(
                t,
                ptr_or_null(payload.as_ptr(), null_x).cast(),
                mut_or_null(y.as_mut_ptr(), null_y),
                n,
                0.5,
            )
        } else {
            tq_dequantize(
                t,
                ptr_or_null(payload.as_ptr(), null_x).cast(),
                mut_or_null(y.as_mut_ptr(), null_y),
                n,
            )
        }
    };
    let untouched = |v: &[f32]| v.iter().all(|x| x.to_bits() == 0x7fc0_1234);
    match expected(t, null_x || null_y, n) {
        Some(e) => {
            assert_eq!(rc, e);
            assert!(untouched(&y), "refused call wrote");
        }
        None => {
            assert_eq!(rc, OK);
            let n = n as usize;
            assert!(untouched(&y[n..]), "wrote past n");
            if !use_mad {
                assert!(y[..n].iter().all(|v| v.is_finite()));
            }
        }
    }
}

fn vec_dot(t: c_int, null_x: bool, null_y: bool, null_out: bool, n: i64, payload: &[u8]) {
    let bb = if valid_type(t) {
        tq_block_bytes(t) as usize
    } else {
        34
    };
    let nb = payload.len() / bb;
    let y: Vec<f32> = (0..nb * 64).map(|i| ((i % 7) as f32) - 3.0).collect();
    let nulls = null_x || null_y || null_out;
    let n = length(t, nulls, n, nb * 64);
    let mut s = f32::from_bits(0x7fc0_1234);
    let rc = unsafe {
        tq_vec_dot_f32(
            t,
            ptr_or_null(payload.as_ptr(), null_x).cast(),
            ptr_or_null(y.as_ptr(), null_y),
            n,
            mut_or_null(&mut s, null_out),
        )
    };
    match expected(t, nulls, n) {
        Some(e) => {
            assert_eq!(rc, e);
            assert_eq!(s.to_bits(), 0x7fc0_1234, "refused call wrote");
        }
        None => {
            assert_eq!(rc, OK);
            assert!(s.is_finite());
            // the ggml hook computes the same bits
            let mut h = f32::NAN;
            unsafe {
                (hooks(t).vec_dot)(
                    n as c_int,
                    &mut h,
                    0,
                    payload.as_ptr().cast(),
                    0,
                    y.as_ptr().cast(),
                    0,
                    1,
                )
            };
            assert_eq!(h.to_bits(), s.to_bits());
        }
    }
}

fn dim_error(dim: i64) -> bool {
    !(2..=65536).contains(&dim) || !(dim as u64).is_power_of_two()
}

fn rotate(null_x: bool, dim: i64, f: u8, payload: &[u8]) {
    let mut x = floats(payload);
    let before = x.clone();
    // the length: a multiple of dim that fits, or (flag) something arbitrary
    let n = if f & 16 != 0 || dim_error(dim) || null_x {
        let raw = i64::from(f) * 37 - 1000;
        let accepted = !dim_error(dim) && !null_x && raw >= 0 && raw % dim == 0;
        if accepted && raw as usize > x.len() {
            raw + 1 // refused (dim >= 2), never read past x
        } else {
            raw
        }
    } else {
        (x.len() as i64 / dim) * dim
    };
    let rc = unsafe { tq_rotate(dim, 7, mut_or_null(x.as_mut_ptr(), null_x), n) };
    let want = if dim_error(dim) {
        BAD_DIM
    } else if null_x {
        NULL
    } else if n < 0 || n % dim != 0 {
        BAD_LENGTH
    } else {
        OK
    };
    assert_eq!(rc, want);
    let n = if rc == OK { n as usize } else { 0 };
    assert!(
        x[n..]
            .iter()
            .zip(&before[n..])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "rotate wrote outside its n values"
    );
    if rc == OK && n > 0 {
        // its own inverse (up to rounding) for finite input of sane size
        let finite = before[..n].iter().all(|v| v.is_finite() && v.abs() < 1e18);
        assert_eq!(unsafe { tq_rotate(dim, 7, x.as_mut_ptr(), n as i64) }, OK);
        if finite {
            // rounding error is relative to each vector's norm, not to each value
            let d = dim as usize;
            for (xa, xb) in x[..n].chunks(d).zip(before[..n].chunks(d)) {
                let norm = xb.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
                for (a, b) in xa.iter().zip(xb) {
                    let err = (f64::from(*a) - f64::from(*b)).abs();
                    assert!(err <= 1e-5 * norm + 1e-30, "{a} vs {b} (norm {norm})");
                }
            }
        }
    }
}

fn rotation_matrix(null_out: bool, dim: i64) {
    // valid dims above 256 are only called with NULL (refused before any write)
    let big = !dim_error(dim) && dim > 256;
    let null_out = null_out || big;
    let mut m = vec![
        0f32;
        if null_out || dim_error(dim) {
            1
        } else {
            (dim * dim) as usize
        }
    ];
    let rc = unsafe { tq_rotation_matrix(dim, 1, mut_or_null(m.as_mut_ptr(), null_out)) };
    let want = if dim_error(dim) {
        BAD_DIM
    } else if null_out {
        NULL
    } else {
        OK
    };
    assert_eq!(rc, want);
    if rc == OK {
        let d = dim as usize;
        // symmetric, entries +-1/sqrt(d)
        let e = 1.0 / (d as f32).sqrt();
        for i in 0..d {
            for j in 0..d {
                assert_eq!(m[i * d + j], m[j * d + i]);
                assert!((m[i * d + j].abs() - e).abs() < 1e-6);
            }
        }
    }
}

fn codebook(t: c_int, null_out: bool, capacity: i64) {
    let mut cb = [f32::NAN; 17];
    let rc = unsafe { tq_codebook(t, mut_or_null(cb.as_mut_ptr(), null_out), capacity) };
    // a trellis type has no codebook
    let want = if !(2..=4).contains(&t) {
        UNKNOWN_TYPE
    } else if null_out {
        NULL
    } else if capacity < (1 << t) {
        BAD_LENGTH
    } else {
        OK
    };
    assert_eq!(rc, want);
    let k = if rc == OK { 1usize << t } else { 0 };
    assert!(cb[..k].windows(2).all(|w| w[0] < w[1]), "{cb:?}");
    assert!(cb[k..].iter().all(|v| v.is_nan()), "wrote past 2^bits");
}

fn misc(t: c_int, code: i64) {
    let (v, b) = (tq_block_values(t), tq_block_bytes(t));
    if valid_type(t) {
        assert_eq!(v, 64);
        assert_eq!(b, block_bytes_of(t));
    } else {
        assert_eq!((v, b), (-1, -1));
    }
    let s = unsafe { CStr::from_ptr(tq_error_string(code as c_int)) };
    let s = s.to_str().unwrap();
    assert!(!s.is_empty());
    if !(-5..=0).contains(&(code as c_int)) {
        assert_eq!(s, "unknown error code");
    }
    let simd = unsafe { CStr::from_ptr(tq_simd_name()) }.to_str().unwrap();
    assert!(["scalar", "avx2", "avx512"].contains(&simd));
}

fn validate_row(t: c_int, null_x: bool, nbytes: i64, payload: &[u8]) {
    let nbytes = if null_x {
        nbytes as usize
    } else {
        nbytes.rem_euclid(payload.len() as i64 + 1) as usize
    };
    let r =
        unsafe { tq_ggml_validate_row(t, ptr_or_null(payload.as_ptr(), null_x).cast(), nbytes) };
    let want = if !valid_type(t) {
        0
    } else {
        let bb = tq_block_bytes(t) as usize;
        if nbytes % bb != 0 {
            0
        } else if nbytes == 0 {
            1
        } else if null_x {
            0
        } else {
            payload[..nbytes].chunks_exact(bb).all(|b| {
                let h = half::f16::from_bits(u16::from_ne_bytes([b[0], b[1]]));
                h.is_finite() && !(h.to_f32() < 0.0)
            }) as c_int
        }
    };
    assert_eq!(r, want);
}

type QuantizeHook = unsafe extern "C" fn(*const f32, *mut c_void, i64);
type DequantizeHook = unsafe extern "C" fn(*const c_void, *mut f32, i64);
type DotHook =
    unsafe extern "C" fn(c_int, *mut f32, usize, *const c_void, usize, *const c_void, usize, c_int);
type MadHook = unsafe extern "C" fn(*const c_void, *mut f32, i64, f32);

/// The four ggml hooks of type id `t` (2, 3, 4 or a trellis id).
struct Hooks {
    quantize: QuantizeHook,
    dequantize: DequantizeHook,
    vec_dot: DotHook,
    mad: MadHook,
}

fn hooks(t: c_int) -> Hooks {
    macro_rules! h {
        ($q:ident, $dq:ident, $dot:ident, $mad:ident) => {
            Hooks {
                quantize: $q,
                dequantize: $dq,
                vec_dot: $dot,
                mad: $mad,
            }
        };
    }
    match t {
        2 => h!(
            tq_ggml_quantize_row_turbo2,
            tq_ggml_dequantize_row_turbo2,
            tq_ggml_vec_dot_turbo2_f32,
            tq_ggml_mad_turbo2
        ),
        3 => h!(
            tq_ggml_quantize_row_turbo3,
            tq_ggml_dequantize_row_turbo3,
            tq_ggml_vec_dot_turbo3_f32,
            tq_ggml_mad_turbo3
        ),
        4 => h!(
            tq_ggml_quantize_row_turbo4,
            tq_ggml_dequantize_row_turbo4,
            tq_ggml_vec_dot_turbo4_f32,
            tq_ggml_mad_turbo4
        ),
        TQ_TURBO2_TCQ => h!(
            tq_ggml_quantize_row_turbo2_tcq,
            tq_ggml_dequantize_row_turbo2_tcq,
            tq_ggml_vec_dot_turbo2_tcq_f32,
            tq_ggml_mad_turbo2_tcq
        ),
        _ => h!(
            tq_ggml_quantize_row_turbo3_tcq,
            tq_ggml_dequantize_row_turbo3_tcq,
            tq_ggml_vec_dot_turbo3_tcq_f32,
            tq_ggml_mad_turbo3_tcq
        ),
    }
}

/// The unchecked hooks with k = whole blocks that fit + an arbitrary partial
/// block (or k <= 0): they touch only whole blocks and match the checked calls.
fn ggml_hooks(t: c_int, k: i64, payload: &[u8]) {
    let t = [2, 3, 4, TQ_TURBO2_TCQ, TQ_TURBO3_TCQ][t.rem_euclid(5) as usize];
    let bb = tq_block_bytes(t) as usize;
    let x = floats(payload);
    let nb_cap = x.len() / 64;
    let k = if k <= 0 {
        k
    } else {
        (k / 64).rem_euclid(nb_cap as i64 + 1) * 64 + k % 64
    };
    let nb = if k <= 0 { 0 } else { (k / 64) as usize };
    let sentinel = 0x5Au8;
    let mut q = vec![sentinel; nb_cap * bb + 1];
    unsafe { (hooks(t).quantize)(x.as_ptr(), q.as_mut_ptr().cast(), k) };
    assert!(
        q[nb * bb..].iter().all(|&b| b == sentinel),
        "hook wrote past k"
    );
    let mut q2 = vec![0u8; nb * bb];
    assert_eq!(
        unsafe { tq_quantize(t, x.as_ptr(), q2.as_mut_ptr().cast(), (nb * 64) as i64) },
        OK
    );
    assert_eq!(&q[..nb * bb], &q2[..]);

    let mark = f32::from_bits(0x7fc0_4321);
    let mut y = vec![mark; nb_cap * 64 + 1];
    unsafe { (hooks(t).dequantize)(q.as_ptr().cast(), y.as_mut_ptr(), k) };
    assert!(
        y[nb * 64..].iter().all(|v| v.to_bits() == mark.to_bits()),
        "hook wrote past k"
    );
    let mut y2 = vec![0f32; nb * 64];
    assert_eq!(
        unsafe { tq_dequantize(t, q.as_ptr().cast(), y2.as_mut_ptr(), (nb * 64) as i64) },
        OK
    );
    assert!(y[..nb * 64]
        .iter()
        .zip(&y2)
        .all(|(a, b)| a.to_bits() == b.to_bits()));

    let mut acc = vec![0f32; nb_cap * 64 + 1];
    acc[nb * 64] = mark;
    unsafe { (hooks(t).mad)(q.as_ptr().cast(), acc.as_mut_ptr(), k, -2.0) };
    assert_eq!(acc[nb * 64].to_bits(), mark.to_bits(), "mad wrote past k");
    assert!(
        acc[nb * 64 + 1..].iter().all(|&v| v == 0.0),
        "mad wrote past k"
    );

    let mut s = f32::NAN;
    let kk = k.clamp(i64::from(c_int::MIN), i64::from(c_int::MAX)) as c_int;
    unsafe { (hooks(t).vec_dot)(kk, &mut s, 0, q.as_ptr().cast(), 0, y.as_ptr().cast(), 0, 1) };
    if nb == 0 {
        assert_eq!(s, 0.0);
    } else {
        assert!(!s.is_nan());
    }
}
