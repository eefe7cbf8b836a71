//! Encoder and scalar reference decoders of the trellis-coded types.
//!
//! Encoding rule of one block `x[0..64]` (deterministic; a port reproduces it):
//! 1. sanitize (NaN -> 0, ±Inf -> ±65504), `n = sqrt(Σ x_j²)` in f64, sequential;
//! 2. `n == 0`: `d = 0`, every payload bit 0;
//! 3. else `u_j = f32(x_j / (n / 8))` (unit mean square), the path is
//!    [`Scratch::viterbi_tailbiting`] on `u`, `t_j = TABLE[s_j]`;
//! 4. the scale: least squares `d = Σ x_j t_j / Σ t_j²` (f64, sequential), or
//!    `n / sqrt(Σ t_j²)` (norm-restoring) if that is not positive;
//!    `f16(f32(d))` round to nearest even, an overflow clamped to 65504.
//!
//! Decoding: `y_t = decode_scale(d) * TABLE[s_t]`, one f32 multiply, so a
//! corrupted scale (NaN, Inf, negative) decodes to zeros as for turbo types.

use super::block::{pack_symbols, unpack_symbols, TcqType};
use super::kernels;
use super::viterbi::{path_symbols, symbol_states, Scratch, Trellis};
use crate::block::decode_scale;
use crate::error::Result;
use crate::kernels::scalar::sanitize;
use crate::kernels::simd_level;
use crate::QK;
use half::f16;

/// How the block scale is fitted (the study compares them; the codec uses
/// [`EncodeOpts::CODEC`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleRule {
    /// `d = <x, t> / <t, t>`.
    LeastSquares,
    /// `d = ||x|| / ||t||`.
    NormRestoring,
}

/// How the start of the trellis is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartRule {
    /// Tail-biting, two Viterbi passes (the codec).
    TailBiting,
    /// Tail-biting, the first pass over only this many values around the
    /// wrap point (study only).
    TailBitingWindow(usize),
    /// Exact tail-biting, `2^(L-k)` passes (reference only).
    TailBitingExact,
    /// `s_{-1} = 0`, one pass (a different decoder: study only).
    ZeroStart,
}

/// Encoder options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOpts {
    /// Scale rule.
    pub scale: ScaleRule,
    /// Start rule.
    pub start: StartRule,
    /// Extra passes that re-run the search on `x / d` with the fitted scale.
    pub refits: u32,
}

impl EncodeOpts {
    /// What `turbo3_tcq` / `turbo2_tcq` encode with.
    pub const CODEC: EncodeOpts = EncodeOpts {
        scale: ScaleRule::LeastSquares,
        start: StartRule::TailBiting,
        refits: 0,
    };
}

/// Encodes one block into `scratch.states[..64]` and returns the stored scale
/// (fp16 bits). `x.len() == 64`.
pub fn encode_states(tr: &Trellis, x: &[f32], opts: EncodeOpts, scratch: &mut Scratch) -> u16 {
    let x = &x[..QK];
    let mut xs = [0f64; QK];
    let mut ss = 0f64;
    for (dst, &v) in xs.iter_mut().zip(x) {
        let v = sanitize(v) as f64;
        *dst = v;
        ss += v * v;
    }
    let n = ss.sqrt();
    if n == 0.0 || !n.is_finite() {
        scratch.states[..QK].fill(0);
        return 0;
    }
    let mut u = [0f32; QK];
    let mut r = n / 8.0;
    let mut d = 0f64;
    for pass in 0..=opts.refits {
        if pass > 0 {
            r = d;
        }
        for (dst, &v) in u.iter_mut().zip(&xs) {
            *dst = (v / r) as f32;
        }
        search(tr, &u, opts.start, scratch);
        let (mut xt, mut tt) = (0f64, 0f64);
        for (&s, &v) in scratch.states[..QK].iter().zip(&xs) {
            let t = tr.table[s as usize] as f64;
            xt += v * t;
            tt += t * t;
        }
        d = match opts.scale {
            ScaleRule::LeastSquares if xt > 0.0 => xt / tt,
            _ if tt > 0.0 => n / tt.sqrt(),
            _ => 0.0,
        };
        if d <= 0.0 {
            break;
        }
    }
    let h = f16::from_f32(d as f32);
    if h.is_infinite() {
        0x7bff
    } else {
        h.to_bits()
    }
}

fn search(tr: &Trellis, u: &[f32], start: StartRule, scratch: &mut Scratch) {
    match start {
        StartRule::TailBiting => scratch.viterbi_tailbiting(tr, u),
        StartRule::TailBitingWindow(w) => scratch.viterbi_tailbiting_window(tr, u, w),
        StartRule::TailBitingExact => scratch.viterbi_exact_tailbiting(tr, u),
        StartRule::ZeroStart => scratch.viterbi(tr, u, Some(0), None),
    };
}

/// Encodes one block of `ty` into `out` (`ty.block_bytes()` bytes).
pub fn quantize_block(ty: TcqType, x: &[f32], scratch: &mut Scratch, out: &mut [u8]) {
    quantize_block_with(&ty.trellis(), x, scratch, out);
}

/// Encodes one block with any trellis into `out[..2 + 8 k]` (codec options).
pub fn quantize_block_with(tr: &Trellis, x: &[f32], scratch: &mut Scratch, out: &mut [u8]) {
    let d = encode_states(tr, x, EncodeOpts::CODEC, scratch);
    let mut c = [0u8; QK];
    path_symbols(&scratch.states[..QK], tr.k, &mut c);
    out[..2].copy_from_slice(&d.to_ne_bytes());
    pack_symbols(&c, tr.k, &mut out[2..2 + 8 * tr.k as usize]);
}

/// Decodes one block of `ty` into `y[..64]`.
#[inline(always)]
pub fn dequantize_block(ty: TcqType, b: &[u8], y: &mut [f32]) {
    dequantize_block_with(&ty.trellis(), b, y);
}

/// Decodes one block (`2 + 8 k` bytes) of any trellis into `y[..64]`.
#[inline(always)]
pub fn dequantize_block_with(tr: &Trellis, b: &[u8], y: &mut [f32]) {
    let (k, l, table) = (tr.k, tr.l, tr.table);
    let d = decode_scale(u16::from_ne_bytes([b[0], b[1]]));
    let mut c = [0u8; QK];
    unpack_symbols(&b[2..2 + 8 * k as usize], k, &mut c);
    let mut st = [0u32; QK];
    symbol_states(&c, k, l, &mut st);
    for (dst, &s) in y[..QK].iter_mut().zip(&st) {
        *dst = d * table[s as usize];
    }
}

/// Encodes `x` (a multiple of 64 values) into exactly `x.len() / 64` blocks.
/// `scratch` must be `Scratch::new(ty.l(), ty.k(), 64)` (reused across calls;
/// nothing is allocated here).
pub fn quantize(ty: TcqType, x: &[f32], out: &mut [u8], scratch: &mut Scratch) -> Result<()> {
    ty.checked_blocks(x.len(), out.len())?;
    let bb = ty.block_bytes();
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
        quantize_block(ty, xb, scratch, ob);
    }
    Ok(())
}

thread_local! {
    static THREAD_SCRATCH: core::cell::RefCell<[Option<Scratch>; 2]> =
        const { core::cell::RefCell::new([None, None]) };
}

/// [`quantize`] with a per-thread, per-type [`Scratch`] made on the thread's
/// first call (what the checked C ABI uses; no allocation after that).
pub fn quantize_thread_scratch(ty: TcqType, x: &[f32], out: &mut [u8]) -> Result<()> {
    ty.checked_blocks(x.len(), out.len())?;
    let slot = (ty == TcqType::Turbo2Tcq) as usize;
    THREAD_SCRATCH.with(|c| {
        let mut c = c.borrow_mut();
        let sc = c[slot].get_or_insert_with(|| Scratch::new(ty.l(), ty.k(), QK));
        quantize(ty, x, out, sc)
    })
}

/// Decodes whole blocks of `ty` into `y` (64 values per block), on the
/// fastest kernel path (bit-exact with [`kernels::scalar::dequantize_row`]
/// and [`dequantize_block`] on every path).
pub fn dequantize(ty: TcqType, x: &[u8], y: &mut [f32]) -> Result<()> {
    let nb = ty.checked_blocks(y.len(), x.len())?;
    // SAFETY: lengths checked; the dispatch level is one the CPU supports.
    unsafe { kernels::dequantize_raw(simd_level(), ty, x.as_ptr(), y.as_mut_ptr(), nb) };
    Ok(())
}

/// `Σ decode(x)_j * y_j` on the fastest kernel path: within
/// `1e-5 * Σ_j |decode(x)_j * y_j|` of the scalar oracle
/// [`kernels::scalar::vec_dot_row`] (f32 terms summed in f64), which is
/// what `TQ_SIMD=scalar` runs.
pub fn vec_dot(ty: TcqType, x: &[u8], y: &[f32]) -> Result<f32> {
    let nb = ty.checked_blocks(y.len(), x.len())?;
    // SAFETY: as in `dequantize`.
    Ok(unsafe { kernels::vec_dot_raw(simd_level(), ty, x.as_ptr(), y.as_ptr(), nb) })
}

/// `y_j += v * decode(x)_j` (`v * (d * TABLE[s])`, then the add) on the
/// fastest kernel path; bit-exact with the scalar oracle.
pub fn mad(ty: TcqType, x: &[u8], y: &mut [f32], v: f32) -> Result<()> {
    let nb = ty.checked_blocks(y.len(), x.len())?;
    // SAFETY: as in `dequantize`.
    unsafe { kernels::mad_raw(simd_level(), ty, x.as_ptr(), y.as_mut_ptr(), nb, v) };
    Ok(())
}
