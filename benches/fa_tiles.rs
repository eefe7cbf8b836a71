//! Per-key cost of flash-attention decode over a turbo cache: a tile of 32 key rows
//! scored one call per row (the vec_dot hook, as ggml's per-key loop calls it) against
//! one `tq_ggml_dot_rows_*` call, and the V side (`tq_ggml_mad_*` per row against one
//! `tq_ggml_mad_rows_*` call). ggml's f16 vec_dot over the same 32 rows is the yardstick.
//! Divide the times by 32 for ns per key.
//!
//! `cargo bench --bench fa_tiles` (needs the default `llama` feature: links ggml)

#[cfg(feature = "llama")]
mod inner {
    use criterion::{black_box, BenchmarkId, Criterion};
    use std::ffi::{c_int, c_void};
    use turboquant_capi::*;

    type VecDot = unsafe extern "C" fn(
        c_int,
        *mut f32,
        usize,
        *const c_void,
        usize,
        *const c_void,
        usize,
        c_int,
    );
    type DotRows = unsafe extern "C" fn(*const c_void, usize, i64, *const f32, i64, *mut f32);
    type Mad = unsafe extern "C" fn(*const c_void, *mut f32, i64, f32);
    type MadRows = unsafe extern "C" fn(*const c_void, usize, i64, *const f32, *mut f32, i64);

    extern "C" {
        fn tq_ggml_prepare_vec_dot(
            t: c_int,
            x: *const f32,
            y: *const f32,
            n: i64,
            qx: *mut c_void,
            qy: *mut c_void,
            dot: *mut Option<VecDot>,
        ) -> c_int;
    }

    const ROWS: usize = 32;

    #[allow(clippy::type_complexity)]
    const TURBO: [(&str, i32, VecDot, DotRows, Mad, MadRows); 3] = [
        (
            "turbo4",
            4,
            tq_ggml_vec_dot_turbo4_f32,
            tq_ggml_dot_rows_turbo4,
            tq_ggml_mad_turbo4,
            tq_ggml_mad_rows_turbo4,
        ),
        (
            "turbo3",
            3,
            tq_ggml_vec_dot_turbo3_f32,
            tq_ggml_dot_rows_turbo3,
            tq_ggml_mad_turbo3,
            tq_ggml_mad_rows_turbo3,
        ),
        (
            "turbo2",
            2,
            tq_ggml_vec_dot_turbo2_f32,
            tq_ggml_dot_rows_turbo2,
            tq_ggml_mad_turbo2,
            tq_ggml_mad_rows_turbo2,
        ),
    ];

    fn data(n: usize, k: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * k) % 97) as f32 / 97.0 - 0.5).collect()
    }

    pub fn bench(c: &mut Criterion) {
        std::hint::black_box(link_anchor());
        for d in [64usize, 128] {
            let mut g = c.benchmark_group(format!("fa_tile32/{d}"));
            let q = data(d, 104729);
            let w: Vec<f32> = (0..ROWS).map(|r| 1.0 / (1 + r) as f32).collect();
            let mut out = vec![0f32; ROWS];
            let mut acc = vec![0f32; d];

            // f16 reference: ggml's own vec_dot, one call per row (rows contiguous)
            let row16 = d * 2;
            let mut k16 = vec![0u8; ROWS * row16];
            let mut q16 = vec![0u8; d * 4];
            let mut dot16: Option<VecDot> = None;
            for r in 0..ROWS {
                let x = data(d, 7919 + r);
                let rc = unsafe {
                    tq_ggml_prepare_vec_dot(
                        1,
                        x.as_ptr(),
                        q.as_ptr(),
                        d as i64,
                        k16[r * row16..].as_mut_ptr().cast(),
                        q16.as_mut_ptr().cast(),
                        &mut dot16,
                    )
                };
                assert_eq!(rc, 0);
            }
            let dot16 = dot16.unwrap();
            g.bench_function(BenchmarkId::new("f16_vec_dot_per_row", d), |b| {
                b.iter(|| {
                    for r in 0..ROWS {
                        unsafe {
                            dot16(
                                d as c_int,
                                &mut out[r],
                                0,
                                black_box(k16[r * row16..].as_ptr()).cast(),
                                0,
                                q16.as_ptr().cast(),
                                0,
                                1,
                            )
                        };
                    }
                    black_box(out[ROWS - 1])
                })
            });

            for (name, t, vec_dot, dot_rows, mad, mad_rows) in TURBO {
                let row = (d / 64) as i64 * tq_block_bytes(t);
                let row = row as usize;
                let mut x = vec![0u8; ROWS * row];
                for r in 0..ROWS {
                    let v = data(d, 7919 + r);
                    assert_eq!(
                        unsafe {
                            tq_quantize(t, v.as_ptr(), x[r * row..].as_mut_ptr().cast(), d as i64)
                        },
                        0
                    );
                }
                let (xp, n) = (x.as_ptr(), d as i64);
                g.bench_function(
                    BenchmarkId::new(format!("{name}_vec_dot_per_row"), d),
                    |b| {
                        b.iter(|| {
                            for (r, o) in out.iter_mut().enumerate() {
                                unsafe {
                                    vec_dot(
                                        n as c_int,
                                        o,
                                        0,
                                        black_box(xp.add(r * row)).cast(),
                                        0,
                                        q.as_ptr().cast(),
                                        0,
                                        1,
                                    )
                                };
                            }
                            black_box(out[ROWS - 1])
                        })
                    },
                );
                g.bench_function(BenchmarkId::new(format!("{name}_dot_rows"), d), |b| {
                    b.iter(|| {
                        unsafe {
                            dot_rows(
                                black_box(xp).cast(),
                                row,
                                ROWS as i64,
                                q.as_ptr(),
                                n,
                                out.as_mut_ptr(),
                            )
                        };
                        black_box(out[ROWS - 1])
                    })
                });
                g.bench_function(BenchmarkId::new(format!("{name}_mad_per_row"), d), |b| {
                    b.iter(|| {
                        for (r, &wr) in w.iter().enumerate() {
                            unsafe {
                                mad(black_box(xp.add(r * row)).cast(), acc.as_mut_ptr(), n, wr)
                            };
                        }
                        black_box(acc[0])
                    })
                });
                g.bench_function(BenchmarkId::new(format!("{name}_mad_rows"), d), |b| {
                    b.iter(|| {
                        unsafe {
                            mad_rows(
                                black_box(xp).cast(),
                                row,
                                ROWS as i64,
                                w.as_ptr(),
                                acc.as_mut_ptr(),
                                n,
                            )
                        };
                        black_box(acc[0])
                    })
                });
            }
            g.finish();
        }
    }
}

#[cfg(feature = "llama")]
criterion::criterion_group!(benches, inner::bench);
#[cfg(feature = "llama")]
criterion::criterion_main!(benches);

#[cfg(not(feature = "llama"))]
fn main() {
    eprintln!("fa_tiles needs the `llama` feature (default): it links ggml");
}
