//! Codec kernel throughput, in bytes of f32 input (or output) per second.
//!
//! `cargo bench --no-default-features --bench codec`
//! Groups: `<op>/<type>`, benchmarks `<level>/<row length>`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use turboquant_codec::kernels::{self, available_levels, SimdLevel};
use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::TqType;

const LENS: [usize; 2] = [128, 4096];

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.next_gaussian() as f32).collect()
}

fn encode(ty: TqType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / 64 * ty.block_bytes()];
    kernels::quantize_row(ty, x, &mut out);
    out
}

fn bench(c: &mut Criterion) {
    for ty in TqType::ALL {
        let mut g = c.benchmark_group(format!("quantize/{}", ty.name()));
        for n in LENS {
            let x = data(n, 1);
            let mut out = vec![0u8; n / 64 * ty.block_bytes()];
            g.throughput(Throughput::Bytes((n * 4) as u64));
            g.bench_with_input(BenchmarkId::new("scalar", n), &n, |b, _| {
                b.iter(|| kernels::quantize_row(ty, black_box(&x), black_box(&mut out)))
            });
        }
        g.finish();
        for op in ["dequantize", "vec_dot", "mad"] {
            let mut g = c.benchmark_group(format!("{op}/{}", ty.name()));
            for n in LENS {
                let x = encode(ty, &data(n, 2));
                let y = data(n, 3);
                let mut acc = vec![0f32; n];
                g.throughput(Throughput::Bytes((n * 4) as u64));
                for level in available_levels() {
                    let id = BenchmarkId::new(level.name(), n);
                    match op {
                        "dequantize" => g.bench_with_input(id, &n, |b, _| {
                            b.iter(|| {
                                kernels::dequantize_row_at(
                                    level,
                                    ty,
                                    black_box(&x),
                                    black_box(&mut acc),
                                )
                            })
                        }),
                        "vec_dot" => g.bench_with_input(id, &n, |b, _| {
                            b.iter(|| {
                                kernels::vec_dot_row_at(level, ty, black_box(&x), black_box(&y))
                            })
                        }),
                        _ => g.bench_with_input(id, &n, |b, _| {
                            b.iter(|| {
                                kernels::mad_row_at(
                                    level,
                                    ty,
                                    black_box(&x),
                                    black_box(&mut acc),
                                    0.5,
                                )
                            })
                        }),
                    };
                }
            }
            g.finish();
        }
    }
    let _ = SimdLevel::Scalar;
}

criterion_group!(benches, bench);
criterion_main!(benches);
