//! Design study of the trellis-coded types: for each state size L and k = 3 / 2
//! bits per value, trains a table on seeded N(0,1) blocks, then measures on
//! held-out blocks (thread CPU time) the relative MSE (||x - x̂||² / ||x||², mean over blocks)
//! of several encoder variants, encode ns/block and decode GB/s (f32 output).
//!
//! `cargo run --release --no-default-features --example tcq_study -- [L...]`
//! Env: TCQ_EVAL (held-out blocks, 2000), TCQ_ITERS (8), TCQ_K ("3,2").

use turboquant_codec::tcq::codec::{
    dequantize_block_with, encode_states, quantize_block_with, EncodeOpts, ScaleRule, StartRule,
};
use turboquant_codec::tcq::train::{gaussian_blocks, train, Recipe};
use turboquant_codec::tcq::{Scratch, Trellis};

/// This thread's CPU time in seconds: the build machine is shared, so wall
/// time would count other processes' turns.
fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rel_mse(tr: &Trellis, data: &[f32], opts: EncodeOpts, sc: &mut Scratch) -> (f64, f64) {
    let mut rel = 0f64;
    let t0 = cpu_s();
    let nb = data.len() / 64;
    for x in data.chunks_exact(64) {
        let d = half::f16::from_bits(encode_states(tr, x, opts, sc)).to_f32();
        let (mut e, mut n) = (0f64, 0f64);
        for (&s, &v) in sc.states[..64].iter().zip(x) {
            let r = v as f64 - (d * tr.table[s as usize]) as f64;
            e += r * r;
            n += (v as f64) * (v as f64);
        }
        rel += e / n;
    }
    (rel / nb as f64, (cpu_s() - t0) * 1e9 / nb as f64)
}

/// The checked-in codec (`TCQ_CODEC=1`): held-out distortion statistics and
/// row-level speed.
fn codec_report() {
    use turboquant_codec::tcq::{codec, TcqType};
    let nb = env("TCQ_EVAL", 20000);
    let x = gaussian_blocks(nb, 0xC0DE_0001);
    println!("| type | L | mean rel.MSE | worst 256-block mean | worst block | encode ns/block | decode GB/s (f32 out) |");
    println!("|---|---|---|---|---|---|---|");
    for ty in TcqType::ALL {
        let mut sc = Scratch::new(ty.l(), ty.k(), 64);
        let mut enc = vec![0u8; nb * ty.block_bytes()];
        let t0 = cpu_s();
        codec::quantize(ty, &x, &mut enc, &mut sc).unwrap();
        let enc_ns = (cpu_s() - t0) * 1e9 / nb as f64;
        let mut y = vec![0f32; nb * 64];
        let t1 = cpu_s();
        let reps = 10;
        for _ in 0..reps {
            codec::dequantize(ty, std::hint::black_box(&enc), &mut y).unwrap();
        }
        let gbs = (reps * nb * 256) as f64 / (cpu_s() - t1) / 1e9;
        let rels: Vec<f64> = x
            .chunks_exact(64)
            .zip(y.chunks_exact(64))
            .map(|(a, b)| {
                let e: f64 = a
                    .iter()
                    .zip(b)
                    .map(|(&p, &q)| (p as f64 - q as f64).powi(2))
                    .sum();
                e / a.iter().map(|&p| (p as f64).powi(2)).sum::<f64>()
            })
            .collect();
        let mean = rels.iter().sum::<f64>() / nb as f64;
        let worst256 = rels
            .chunks(256)
            .map(|c| c.iter().sum::<f64>() / c.len() as f64)
            .fold(0f64, f64::max);
        let worst = rels.iter().copied().fold(0f64, f64::max);
        println!(
            "| {} | {} | {mean:.5} | {worst256:.5} | {worst:.4} | {enc_ns:.0} | {gbs:.2} |",
            ty.name(),
            ty.l()
        );
    }
    // the scalar-codebook types under the same conditions, for the ratio
    for sty in [
        turboquant_codec::TqType::Turbo3,
        turboquant_codec::TqType::Turbo2,
    ] {
        let mut enc = vec![0u8; nb * sty.block_bytes()];
        let t0 = cpu_s();
        turboquant_codec::quantize(sty, &x, &mut enc).unwrap();
        let enc_ns = (cpu_s() - t0) * 1e9 / nb as f64;
        let mut y = vec![0f32; nb * 64];
        let t1 = cpu_s();
        let reps = 10;
        for _ in 0..reps {
            turboquant_codec::dequantize(sty, std::hint::black_box(&enc), &mut y).unwrap();
        }
        let gbs = (reps * nb * 256) as f64 / (cpu_s() - t1) / 1e9;
        println!(
            "| {} (reference) | - | - | - | - | {enc_ns:.0} | {gbs:.2} |",
            sty.name()
        );
    }
}

/// First-pass window of the tail-biting search (`TCQ_WINDOW=1`).
fn window_report() {
    use turboquant_codec::tcq::TcqType;
    let nb = env("TCQ_EVAL", 4000);
    let x = gaussian_blocks(nb, 0xC0DE_0002);
    println!("| type | first-pass window | rel.MSE | encode ns/block |");
    println!("|---|---|---|---|");
    for ty in TcqType::ALL {
        let tr = ty.trellis();
        let mut sc = Scratch::new(ty.l(), ty.k(), 64);
        for w in [64usize, 32, 24, 16, 8] {
            let o = EncodeOpts {
                start: StartRule::TailBitingWindow(w),
                ..EncodeOpts::CODEC
            };
            let (r, ns) = rel_mse(&tr, &x, o, &mut sc);
            println!("| {} | {w} | {r:.5} | {ns:.0} |", ty.name());
        }
        let o = EncodeOpts {
            start: StartRule::ZeroStart,
            ..EncodeOpts::CODEC
        };
        let (r, ns) = rel_mse(&tr, &x, o, &mut sc);
        println!(
            "| {} | none (zero start, 1 pass) | {r:.5} | {ns:.0} |",
            ty.name()
        );
    }
}

fn main() {
    if std::env::var_os("TCQ_CODEC").is_some() {
        return codec_report();
    }
    if std::env::var_os("TCQ_WINDOW").is_some() {
        return window_report();
    }
    let ls: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ls = if ls.is_empty() { vec![8, 10, 12] } else { ls };
    let neval = env("TCQ_EVAL", 2000);
    let iters = env("TCQ_ITERS", 8);
    let ks: Vec<u32> = std::env::var("TCQ_K")
        .unwrap_or_else(|_| "3,2".into())
        .split(',')
        .filter_map(|v| v.parse().ok())
        .collect();
    let eval = gaussian_blocks(neval, 0xE7A1_0001);
    println!("| k | L | train blocks | train s | train rel.MSE | TB+LS | TB+NR | TB+LS+refit | zero-start+LS | exact TB+LS | enc ns/blk TB | enc ns/blk 1-pass | dec GB/s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &k in &ks {
        for &l in &ls {
            let blocks = env("TCQ_TRAIN", ((1usize << l) / 4).max(1024));
            let t0 = cpu_s();
            let (table, hist) = train(Recipe {
                l,
                k,
                blocks,
                iters,
                seed: 0x5443_5100 + k as u64,
            });
            let train_s = cpu_s() - t0;
            eprintln!("k={k} L={l}: train history {hist:?}");
            let tr = Trellis::new(l, k, &table);
            let mut sc = Scratch::new(l, k, 64);
            let o = |scale, start, refits| EncodeOpts {
                scale,
                start,
                refits,
            };
            let (a, ns_tb) = rel_mse(
                &tr,
                &eval,
                o(ScaleRule::LeastSquares, StartRule::TailBiting, 0),
                &mut sc,
            );
            let (b, _) = rel_mse(
                &tr,
                &eval,
                o(ScaleRule::NormRestoring, StartRule::TailBiting, 0),
                &mut sc,
            );
            let (c, _) = rel_mse(
                &tr,
                &eval,
                o(ScaleRule::LeastSquares, StartRule::TailBiting, 1),
                &mut sc,
            );
            let (z, ns_1) = rel_mse(
                &tr,
                &eval,
                o(ScaleRule::LeastSquares, StartRule::ZeroStart, 0),
                &mut sc,
            );
            let exact = if l - k <= 7 {
                let sub = &eval[..64 * 200.min(neval)];
                let (e, _) = rel_mse(
                    &tr,
                    sub,
                    o(ScaleRule::LeastSquares, StartRule::TailBitingExact, 0),
                    &mut sc,
                );
                let (e_tb, _) = rel_mse(
                    &tr,
                    sub,
                    o(ScaleRule::LeastSquares, StartRule::TailBiting, 0),
                    &mut sc,
                );
                format!("{e:.5} (2-pass {e_tb:.5}, 200 blk)")
            } else {
                "-".into()
            };
            // decode throughput on the codec's byte format
            let bb = 2 + 8 * k as usize;
            let mut enc = vec![0u8; neval * bb];
            for (x, ob) in eval.chunks_exact(64).zip(enc.chunks_exact_mut(bb)) {
                quantize_block_with(&tr, x, &mut sc, ob);
            }
            let mut y = vec![0f32; neval * 64];
            let reps = 20;
            let t1 = cpu_s();
            for _ in 0..reps {
                for (b, yb) in enc.chunks_exact(bb).zip(y.chunks_exact_mut(64)) {
                    dequantize_block_with(&tr, std::hint::black_box(b), yb);
                }
                std::hint::black_box(&mut y);
            }
            let gbs = (reps * neval * 64 * 4) as f64 / (cpu_s() - t1) / 1e9;
            println!(
                "| {k} | {l} | {blocks} | {train_s:.1} | {:.5} | {a:.5} | {b:.5} | {c:.5} | {z:.5} | {exact} | {ns_tb:.0} | {ns_1:.0} | {gbs:.2} |",
                hist.last().copied().unwrap_or(f64::NAN)
            );
        }
    }
}
