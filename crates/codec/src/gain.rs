//! The encoder's gain search: which scaled copies of the decision thresholds it tries.
//!
//! Invariant: the rule is these constants and their order, nothing else. Candidate `g`
//! classifies `u = x / |x|` against `T[k] · f` with `f = g · GAIN_STEP` (both products in
//! f64); candidates are tried in the order plain, coarse, then each refinement around the
//! best so far, and one replaces the best only on a strictly larger score. The C header
//! `turboquant_tables.h` carries the same constants (generated from these), which the CUDA
//! encoder reads, so the two encoders agree byte for byte.
//!
//! Why a search: the codebook is optimal for the *distribution* of a coordinate, but a
//! single block of 64 is a sample of it; the gain that best fits one block's codes is not 1.
//! Scoring a candidate by ⟨x, c⟩² / |c|² keeps the codes whose direction is closest to x,
//! which is what the norm-restoring scale needs (its error is 2|x|²(1 − cos)). Measured
//! gains are in docs/CODEC.md.

/// One gain unit: `f = g * GAIN_STEP`.
pub const GAIN_STEP: f64 = 0.025;
/// The plain codes (`f = 1`), tried first so a tie keeps them.
pub const GAIN_PLAIN: i32 = 40;
/// The coarse round over `f` in [0.8, 1.2].
pub const GAIN_COARSE: [i32; 4] = [32, 36, 44, 48];
/// The refinements: `best ± step` for each step, around the best after the round before.
pub const GAIN_REFINE: [i32; 2] = [2, 1];
