//! Trellis-coded types vs the scalar-codebook turbo types of the same size
//! (turbo3_tcq vs turbo3, turbo2_tcq vs turbo2), per kernel and SIMD level.
//!
//! `cargo bench -p turboquant-codec --bench tcq -- --warm-up-time 0.3 --measurement-time 1`
//! (a filter such as `decode/` or `/avx2` narrows it).
//!
//! Groups (benchmark ids `<type>/<level>/<len>`):
//! * `encode`: quantize 64 blocks (4096 values); time / 64 = ns per block;
//! * `decode`: dequantize 4096 values to f32; throughput in bytes of f32 output;
//! * `vec_dot`: one row of 128 values (2 blocks, a head of 128) and 4096;
//! * `mad`: `y += v * decode(x)` over 4096 values;
//! * `dot_rows` / `mad_rows`: a flash-attention tile of 64 rows of 128 values.
//!
//! Levels run: every level this CPU supports (scalar is the oracle).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use turboquant_codec::kernels::{self, SimdLevel};
use turboquant_codec::tcq::train::gaussian_blocks;
use turboquant_codec::tcq::{codec, kernels as tk, Scratch, TcqType};
use turboquant_codec::TqType;

/// A type under test: a trellis type or the turbo type it is compared with.
#[derive(Clone, Copy)]
enum Ty {
    Tcq(TcqType),
    Turbo(TqType),
}

impl Ty {
    fn all() -> [Ty; 4] {
        [
            Ty::Tcq(TcqType::Turbo3Tcq),
            Ty::Turbo(TqType::Turbo3),
            Ty::Tcq(TcqType::Turbo2Tcq),
            Ty::Turbo(TqType::Turbo2),
        ]
    }
    fn name(self) -> &'static str {
        match self {
            Ty::Tcq(t) => t.name(),
            Ty::Turbo(TqType::Turbo2) => "turbo2",
            Ty::Turbo(TqType::Turbo3) => "turbo3",
            Ty::Turbo(TqType::Turbo4) => "turbo4",
        }
    }
    fn bb(self) -> usize {
        match self {
            Ty::Tcq(t) => t.block_bytes(),
            Ty::Turbo(t) => t.block_bytes(),
        }
    }
    fn encode(self, x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / 64 * self.bb()];
        match self {
            Ty::Tcq(t) => {
                codec::quantize(t, x, &mut out, &mut Scratch::new(t.l(), t.k(), 64)).unwrap()
            }
            Ty::Turbo(t) => turboquant_codec::quantize(t, x, &mut out).unwrap(),
        }
        out
    }
    fn deq(self, l: SimdLevel, x: &[u8], y: &mut [f32]) {
        match self {
            Ty::Tcq(t) => tk::dequantize_row_at(l, t, x, y),
            Ty::Turbo(t) => kernels::dequantize_row_at(l, t, x, y),
        }
    }
    fn dot(self, l: SimdLevel, x: &[u8], q: &[f32]) -> f32 {
        match self {
            Ty::Tcq(t) => tk::vec_dot_row_at(l, t, x, q),
            Ty::Turbo(t) => kernels::vec_dot_row_at(l, t, x, q),
        }
    }
    fn mad(self, l: SimdLevel, x: &[u8], y: &mut [f32], v: f32) {
        match self {
            Ty::Tcq(t) => tk::mad_row_at(l, t, x, y, v),
            Ty::Turbo(t) => kernels::mad_row_at(l, t, x, y, v),
        }
    }
    fn dot_rows(self, l: SimdLevel, x: &[u8], stride: usize, q: &[f32], out: &mut [f32]) {
        match self {
            Ty::Tcq(t) => tk::dot_rows_at(l, t, x, stride, q, out),
            Ty::Turbo(t) => kernels::dot_rows_at(l, t, x, stride, q, out),
        }
    }
    fn mad_rows(self, l: SimdLevel, x: &[u8], stride: usize, w: &[f32], y: &mut [f32]) {
        match self {
            Ty::Tcq(t) => tk::mad_rows_at(l, t, x, stride, w, y),
            Ty::Turbo(t) => kernels::mad_rows_at(l, t, x, stride, w, y),
        }
    }
}

fn levels() -> Vec<SimdLevel> {
    kernels::available_levels()
}

fn bench(c: &mut Criterion) {
    let n = 4096;
    let x = gaussian_blocks(n / 64, 1);
    let q = gaussian_blocks(n / 64, 2);

    // the encoder: the dispatching path (the scratch is reused, as in the hooks)
    let mut g = c.benchmark_group("encode");
    g.sample_size(10);
    g.throughput(Throughput::Elements((n / 64) as u64));
    for ty in Ty::all() {
        let mut out = vec![0u8; n / 64 * ty.bb()];
        let id = BenchmarkId::new(ty.name(), n);
        match ty {
            Ty::Tcq(t) => {
                let mut sc = Scratch::new(t.l(), t.k(), 64);
                g.bench_with_input(id, &n, |b, _| {
                    b.iter(|| codec::quantize(t, black_box(&x), &mut out, &mut sc).unwrap())
                });
            }
            Ty::Turbo(t) => {
                g.bench_with_input(id, &n, |b, _| {
                    b.iter(|| turboquant_codec::quantize(t, black_box(&x), &mut out).unwrap())
                });
            }
        }
    }
    g.finish();

    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Bytes((n * 4) as u64));
    for ty in Ty::all() {
        let enc = ty.encode(&x);
        let mut y = vec![0f32; n];
        for l in levels() {
            let id = BenchmarkId::new(format!("{}/{}", ty.name(), l.name()), n);
            g.bench_with_input(id, &n, |b, _| {
                b.iter(|| ty.deq(l, black_box(&enc), black_box(&mut y)))
            });
        }
    }
    g.finish();

    let mut g = c.benchmark_group("vec_dot");
    for len in [128usize, n] {
        g.throughput(Throughput::Elements((len / 64) as u64));
        for ty in Ty::all() {
            let enc = ty.encode(&x[..len]);
            for l in levels() {
                let id = BenchmarkId::new(format!("{}/{}", ty.name(), l.name()), len);
                g.bench_with_input(id, &len, |b, _| {
                    b.iter(|| ty.dot(l, black_box(&enc), black_box(&q[..len])))
                });
            }
        }
    }
    g.finish();

    let mut g = c.benchmark_group("mad");
    g.throughput(Throughput::Elements((n / 64) as u64));
    for ty in Ty::all() {
        let enc = ty.encode(&x);
        let mut y = q.clone();
        for l in levels() {
            let id = BenchmarkId::new(format!("{}/{}", ty.name(), l.name()), n);
            g.bench_with_input(id, &n, |b, _| {
                b.iter(|| ty.mad(l, black_box(&enc), black_box(&mut y), 1e-3))
            });
        }
    }
    g.finish();

    // a flash-attention tile: 64 rows of one 128-wide head
    let (rows, len) = (64usize, 128usize);
    let xt = gaussian_blocks(rows * len / 64, 3);
    let mut g = c.benchmark_group("tiles");
    g.throughput(Throughput::Elements((rows * len / 64) as u64));
    for ty in Ty::all() {
        let enc = ty.encode(&xt);
        let stride = len / 64 * ty.bb();
        let w: Vec<f32> = (0..rows).map(|i| 1.0 / (1 + i) as f32).collect();
        let mut out = vec![0f32; rows];
        let mut y = vec![0f32; len];
        for l in levels() {
            let id = BenchmarkId::new(format!("dot_rows/{}/{}", ty.name(), l.name()), rows);
            g.bench_with_input(id, &rows, |b, _| {
                b.iter(|| ty.dot_rows(l, black_box(&enc), stride, &q[..len], &mut out))
            });
            let id = BenchmarkId::new(format!("mad_rows/{}/{}", ty.name(), l.name()), rows);
            g.bench_with_input(id, &rows, |b, _| {
                b.iter(|| ty.mad_rows(l, black_box(&enc), stride, &w, &mut y))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
