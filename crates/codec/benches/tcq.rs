//! Trellis-coded codec throughput, in bytes of f32 input (or output) per second.
//!
//! `cargo bench --no-default-features --bench tcq`
//! Groups: `<op>/<type>`, benchmarks by row length.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use turboquant_codec::tcq::train::gaussian_blocks;
use turboquant_codec::tcq::{codec, Scratch, TcqType};

const LENS: [usize; 2] = [128, 4096];

fn bench(c: &mut Criterion) {
    for ty in TcqType::ALL {
        let mut sc = Scratch::new(ty.l(), ty.k(), 64);
        let mut g = c.benchmark_group(format!("quantize/{}", ty.name()));
        g.sample_size(10);
        for n in LENS {
            let x = gaussian_blocks(n / 64, 1);
            let mut out = vec![0u8; n / 64 * ty.block_bytes()];
            g.throughput(Throughput::Bytes((n * 4) as u64));
            g.bench_with_input(BenchmarkId::new("scalar", n), &n, |b, _| {
                b.iter(|| codec::quantize(ty, black_box(&x), black_box(&mut out), &mut sc).unwrap())
            });
        }
        g.finish();
        let mut g = c.benchmark_group(format!("dequantize/{}", ty.name()));
        for n in LENS {
            let x = gaussian_blocks(n / 64, 2);
            let mut enc = vec![0u8; n / 64 * ty.block_bytes()];
            codec::quantize(ty, &x, &mut enc, &mut sc).unwrap();
            let mut y = vec![0f32; n];
            g.throughput(Throughput::Bytes((n * 4) as u64));
            g.bench_with_input(BenchmarkId::new("scalar", n), &n, |b, _| {
                b.iter(|| codec::dequantize(ty, black_box(&enc), black_box(&mut y)).unwrap())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
