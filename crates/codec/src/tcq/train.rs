//! Reconstruction tables, derived rather than typed: seeded N(0,1) blocks,
//! then alternate Viterbi encoding and centroid updates (generalized Lloyd).
//!
//! Invariant: the table is antisymmetric under complementing the state
//! (`T[!s] = -T[s]`), so `encode(-x)` is the bitwise complement of
//! `encode(x)`; every update keeps it (the two cells are pooled). The
//! trainer is deterministic (SplitMix64, f64 sums in a fixed order); `crates/gen`
//! renders its output into the checked-in `crates/codec/src/tcq/tables.rs` and
//! `ggml-ext/abi/turboquant_tcq_tables.h` (its test retrains and compares).

use super::codec::{encode_states, EncodeOpts};
use super::viterbi::{Scratch, Trellis};
use crate::rotation::SplitMix64;
use crate::QK;

/// Training recipe of one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recipe {
    /// State bits.
    pub l: u32,
    /// Bits per value.
    pub k: u32,
    /// Training blocks of 64 N(0,1) values.
    pub blocks: usize,
    /// Lloyd iterations (encode all, update centroids).
    pub iters: usize,
    /// Seed of the data and of the initial table.
    pub seed: u64,
}

/// The recipes of the checked-in tables: (turbo3_tcq, turbo2_tcq).
pub const CODEC_RECIPES: [Recipe; 2] = [
    Recipe {
        l: 8,
        k: 3,
        blocks: 8192,
        iters: 40,
        seed: 0x5443_5133,
    }, // "TCQ3"
    Recipe {
        l: 8,
        k: 2,
        blocks: 8192,
        iters: 40,
        seed: 0x5443_5132,
    }, // "TCQ2"
];

/// `nblocks * 64` N(0,1) values from `seed`.
pub fn gaussian_blocks(nblocks: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..nblocks * QK)
        .map(|_| r.next_gaussian() as f32)
        .collect()
}

/// The initial table: N(0,1) draws for states below `2^(L-1)`, negated
/// for their complements.
pub fn initial_table(l: u32, seed: u64) -> Vec<f32> {
    let ns = 1usize << l;
    let mut r = SplitMix64::new(seed ^ 0x494E_4954); // "INIT"
    let mut t = vec![0f32; ns];
    for s in 0..ns / 2 {
        let v = r.next_gaussian() as f32;
        t[s] = v;
        t[!s & (ns - 1)] = -v;
    }
    t
}

/// One Lloyd iteration: encode `data` with `table` (codec options), move
/// each complement pair of cells to the antisymmetric least-squares centroid
/// of what they received, in units of each block's fitted scale. Returns the
/// mean relative MSE of the encoding done with the old table.
pub fn lloyd_step(l: u32, k: u32, table: &mut [f32], data: &[f32], scratch: &mut Scratch) -> f64 {
    let ns = 1usize << l;
    let mut num = vec![0f64; ns];
    let mut den = vec![0f64; ns];
    let mut rel = 0f64;
    let nb = data.len() / QK;
    {
        let tr = Trellis::new(l, k, table);
        for x in data.chunks_exact(QK) {
            let dh = encode_states(&tr, x, EncodeOpts::CODEC, scratch);
            let d = half::f16::from_bits(dh).to_f32() as f64;
            let (mut err, mut nn) = (0f64, 0f64);
            for (&s, &v) in scratch.states[..QK].iter().zip(x) {
                let v = v as f64;
                let e = v - d * tr.table[s as usize] as f64;
                err += e * e;
                nn += v * v;
                // x ≈ d T[s]: the LS centroid is Σ d x / Σ d².
                num[s as usize] += d * v;
                den[s as usize] += d * d;
            }
            rel += err / nn;
        }
    }
    for s in 0..ns / 2 {
        let c = !s & (ns - 1);
        let dn = den[s] + den[c];
        if dn > 0.0 {
            let v = ((num[s] - num[c]) / dn) as f32;
            table[s] = v;
            table[c] = -v;
        }
    }
    rel / nb as f64
}

/// Trains a table by `recipe`; returns it and the relative MSE of each
/// iteration on the training data.
pub fn train(recipe: Recipe) -> (Vec<f32>, Vec<f64>) {
    let data = gaussian_blocks(recipe.blocks, recipe.seed);
    let mut table = initial_table(recipe.l, recipe.seed);
    let mut scratch = Scratch::new(recipe.l, recipe.k, QK);
    let mut hist = Vec::with_capacity(recipe.iters);
    for _ in 0..recipe.iters {
        hist.push(lloyd_step(
            recipe.l,
            recipe.k,
            &mut table,
            &data,
            &mut scratch,
        ));
    }
    (table, hist)
}
