//! Interleaved best-of timings of the trellis types against the turbo types of
//! the same size: encoder ns/block and flash-attention tile ns/key.
//!
//! `cargo run --release -p turboquant-codec --example tcq_speed -- [rounds] [head]`
//! (defaults 15 and 64). On a shared machine criterion's medians move with the
//! neighbours' load; the minimum over interleaved rounds is the steadier
//! figure, and every kernel of a round runs within milliseconds of the others,
//! so ratios within this report are fair. `TQ_SIMD` caps the level as for the
//! kernels.

use std::hint::black_box;
use std::time::Instant;
use turboquant_codec::kernels::{self, simd_level};
use turboquant_codec::tcq::train::gaussian_blocks;
use turboquant_codec::tcq::{codec, kernels as tk, Scratch, TcqType};
use turboquant_codec::TqType;

#[derive(Clone, Copy)]
enum Ty {
    Tcq(TcqType),
    Turbo(TqType),
}

impl Ty {
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
}

const TYPES: [Ty; 4] = [
    Ty::Tcq(TcqType::Turbo3Tcq),
    Ty::Turbo(TqType::Turbo3),
    Ty::Tcq(TcqType::Turbo2Tcq),
    Ty::Turbo(TqType::Turbo2),
];

/// Best of `reps` samples of `inner` calls of `f`, in ns per call.
fn best_of(reps: usize, inner: usize, mut f: impl FnMut()) -> f64 {
    let mut b = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..inner {
            f();
        }
        b = b.min(t.elapsed().as_nanos() as f64 / inner as f64);
    }
    b
}

/// Best of `reps` single calls of `f`, in ns per call.
fn best(reps: usize, f: impl FnMut()) -> f64 {
    best_of(reps, 1, f)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(15);
    let head: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let nblk = 64;
    let x = gaussian_blocks(nblk, 1);
    let rows = 32;
    let xt = gaussian_blocks(rows * head / 64, 3);
    let q = gaussian_blocks(head / 64, 2);
    let w: Vec<f32> = (0..rows).map(|i| 1.0 / (1 + i) as f32).collect();
    let level = simd_level();

    let mut enc = [f64::INFINITY; 4];
    let mut dot = [f64::INFINITY; 4];
    let mut mad = [f64::INFINITY; 4];
    let encoded: Vec<Vec<u8>> = TYPES
        .iter()
        .map(|&ty| {
            let mut o = vec![0u8; xt.len() / 64 * ty.bb()];
            match ty {
                Ty::Tcq(t) => {
                    codec::quantize(t, &xt, &mut o, &mut Scratch::new(t.l(), t.k(), 64)).unwrap()
                }
                Ty::Turbo(t) => turboquant_codec::quantize(t, &xt, &mut o).unwrap(),
            }
            o
        })
        .collect();
    let mut scratch = [
        Scratch::new(8, TcqType::Turbo3Tcq.k(), 64),
        Scratch::new(8, TcqType::Turbo2Tcq.k(), 64),
    ];
    for _ in 0..rounds {
        for (i, &ty) in TYPES.iter().enumerate() {
            let mut out = vec![0u8; nblk * ty.bb()];
            let e = match ty {
                Ty::Tcq(t) => {
                    let sc = &mut scratch[(t == TcqType::Turbo2Tcq) as usize];
                    best(5, || {
                        codec::quantize(t, black_box(&x), &mut out, sc).unwrap()
                    })
                }
                Ty::Turbo(t) => best(5, || {
                    turboquant_codec::quantize(t, black_box(&x), &mut out).unwrap()
                }),
            };
            enc[i] = enc[i].min(e / nblk as f64);
            let stride = head / 64 * ty.bb();
            let mut o = vec![0f32; rows];
            let mut y = vec![0f32; head];
            // a tile call is ~0.4 us: 16 calls per sample, past the clock's granularity
            let (reps, inner) = (40, 16);
            let (d, m) = match ty {
                Ty::Tcq(t) => (
                    best_of(reps, inner, || {
                        tk::dot_rows_at(level, t, black_box(&encoded[i]), stride, &q, &mut o)
                    }),
                    best_of(reps, inner, || {
                        tk::mad_rows_at(level, t, black_box(&encoded[i]), stride, &w, &mut y)
                    }),
                ),
                Ty::Turbo(t) => (
                    best_of(reps, inner, || {
                        kernels::dot_rows_at(level, t, black_box(&encoded[i]), stride, &q, &mut o)
                    }),
                    best_of(reps, inner, || {
                        kernels::mad_rows_at(level, t, black_box(&encoded[i]), stride, &w, &mut y)
                    }),
                ),
            };
            dot[i] = dot[i].min(d / rows as f64);
            mad[i] = mad[i].min(m / rows as f64);
        }
    }
    println!(
        "level {}, {rounds} rounds, head {head}, tiles of {rows} keys",
        level.name()
    );
    println!("| type | encode ns/block | dot_rows ns/key | mad_rows ns/key |");
    println!("|---|---:|---:|---:|");
    for (i, ty) in TYPES.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} |",
            ty.name(),
            enc[i],
            dot[i],
            mad[i]
        );
    }
    println!(
        "ratios tcq/turbo: turbo3_tcq encode {:.1}x dot {:.2}x mad {:.2}x; turbo2_tcq encode {:.1}x dot {:.2}x mad {:.2}x",
        enc[0] / enc[1],
        dot[0] / dot[1],
        mad[0] / mad[1],
        enc[2] / enc[3],
        dot[2] / dot[3],
        mad[2] / mad[3]
    );
}
