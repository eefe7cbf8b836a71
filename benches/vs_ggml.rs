//! turbo vec_dot against ggml's own CPU vec_dot for q4_0 / q8_0 / f16, as flash attention
//! calls them: one key row of `n` values against the query in the K type's vec_dot_type.
//! Everything goes through ggml's CPU type traits, so the turbo numbers include the
//! C-to-Rust call.
//!
//! `cargo bench --bench vs_ggml` (needs the default `llama` feature: links ggml)

#[cfg(feature = "llama")]
mod inner {
    use criterion::{black_box, BenchmarkId, Criterion, Throughput};
    use std::ffi::{c_int, c_void};

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
        fn tq_ggml_row_size(t: c_int, n: i64) -> usize;
    }

    const TYPES: [(&str, c_int); 6] = [
        ("f16", 1),
        ("q8_0", 8),
        ("q4_0", 2),
        ("turbo4", 98),
        ("turbo3", 97),
        ("turbo2", 96),
    ];

    pub fn bench(c: &mut Criterion) {
        std::hint::black_box(turboquant_capi::link_anchor());
        for n in [64usize, 128, 256] {
            let mut g = c.benchmark_group(format!("ggml_vec_dot/{n}"));
            g.throughput(Throughput::Elements(n as u64));
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let y: Vec<f32> = (0..n)
                .map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5)
                .collect();
            for (name, t) in TYPES {
                let mut qx = vec![0u8; unsafe { tq_ggml_row_size(t, n as i64) }];
                let mut qy = vec![0u8; n * 4];
                let mut dot: Option<VecDot> = None;
                let rc = unsafe {
                    tq_ggml_prepare_vec_dot(
                        t,
                        x.as_ptr(),
                        y.as_ptr(),
                        n as i64,
                        qx.as_mut_ptr().cast(),
                        qy.as_mut_ptr().cast(),
                        &mut dot,
                    )
                };
                assert_eq!(rc, 0, "{name}");
                let dot = dot.unwrap();
                g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                    b.iter(|| {
                        let mut s = 0.0f32;
                        unsafe {
                            dot(
                                n as c_int,
                                &mut s,
                                0,
                                black_box(qx.as_ptr()).cast(),
                                0,
                                black_box(qy.as_ptr()).cast(),
                                0,
                                1,
                            )
                        };
                        black_box(s)
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
    eprintln!("vs_ggml needs the `llama` feature (default): it links ggml");
}
