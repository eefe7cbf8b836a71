//! The C hook ggml calls for K·Q (dispatch and catch_unwind included), head_dim 128:
//! the overhead over the codec kernel it wraps (crates/codec/benches/codec.rs).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use turboquant_codec::testing::{encode, TRng};
use turboquant_codec::{kernels, TqType};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ggml_hook_vec_dot/turbo4");
    let mut r = TRng::new(4);
    let x = encode(TqType::Turbo4, &r.gauss_vec(128));
    let y = r.gauss_vec(128);
    g.throughput(Throughput::Bytes(128 * 4));
    g.bench_function(BenchmarkId::new(kernels::simd_level().name(), 128), |b| {
        b.iter(|| {
            let mut s = 0f32;
            unsafe {
                turboquant_capi::tq_ggml_vec_dot_turbo4_f32(
                    128,
                    &mut s,
                    0,
                    black_box(x.as_ptr()).cast(),
                    0,
                    black_box(y.as_ptr()).cast(),
                    0,
                    1,
                )
            };
            s
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
