//! Row kernels of the turbo types, structured like candle's `k_quants`: a
//! scalar reference (the test oracle, and the only encoder) and SIMD paths
//! side by side, selected once at run time.
//!
//! * `from_float` (quantize) is scalar code only, so its bytes are reproducible
//!   everywhere (see [`scalar::quantize_block`] for the exact rule); the same
//!   code is compiled a second time with AVX2 / AVX-512 enabled, which changes
//!   the speed, never the bytes.
//! * `to_float` (dequantize) on every path computes `d * C[idx]` with one f32
//!   multiply and is bit-exact with the scalar oracle.
//! * `mad` (`y += v * decode(x)`) computes `v * (d * C[idx])` then adds, on
//!   every path: also bit-exact.
//! * `vec_dot` sums `(d * C[idx]) * y` in a different order per path (the
//!   scalar oracle accumulates in f64); paths agree within `1e-5 * Σ|terms|`.
//! * `dot_rows` / `mad_rows` (flash-attention decode tiles, [`x86::rows`]):
//!   `vec_dot` over many rows a byte stride apart (same tolerance), and `mad`
//!   over many rows with one weight each (bit-exact with row-by-row `mad`).
//!
//! Dispatch: the best level is detected on first use (`is_x86_feature_detected!`)
//! and cached in an atomic; a per-call dispatch is one relaxed load and a match.
//! `TQ_SIMD=scalar|avx2|avx512` in the environment caps the level (read once; a row of the
//! switches table, [`crate::switches`]: any other value stops the process with its message).
//! No function here allocates.

pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use crate::block::{TqType, TurboBlock, QK};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// An instruction-set level a kernel can run at.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable scalar reference.
    Scalar = 0,
    /// x86-64 AVX2 + FMA.
    Avx2 = 1,
    /// x86-64 AVX-512 (F, BW, VL).
    Avx512 = 2,
}

impl SimdLevel {
    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    fn from_u8(v: u8) -> SimdLevel {
        match v {
            2 => SimdLevel::Avx512,
            1 => SimdLevel::Avx2,
            _ => SimdLevel::Scalar,
        }
    }
}

/// Every level this CPU supports, scalar first.
pub fn available_levels() -> Vec<SimdLevel> {
    [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| l.is_supported())
        .collect()
}

const UNSET: u8 = 0xff;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

#[cold]
fn detect() -> SimdLevel {
    let mut best = SimdLevel::Scalar;
    for l in [SimdLevel::Avx2, SimdLevel::Avx512] {
        if l.is_supported() {
            best = l;
        }
    }
    // TQ_SIMD, a row of the switches table: auto|scalar|avx2|avx512, in that order (a value
    // the row does not know stops the process with the table's message)
    static CAP: OnceLock<Option<SimdLevel>> = OnceLock::new();
    let cap = *CAP.get_or_init(|| match crate::switches::get("TQ_SIMD") {
        0 => None,
        1 => Some(SimdLevel::Scalar),
        2 => Some(SimdLevel::Avx2),
        _ => Some(SimdLevel::Avx512),
    });
    if let Some(c) = cap {
        best = best.min(c);
    }
    LEVEL.store(best as u8, Ordering::Relaxed);
    best
}

/// The level the dispatching kernels use (detected once, then cached).
#[inline(always)]
pub fn simd_level() -> SimdLevel {
    let v = LEVEL.load(Ordering::Relaxed);
    if v == UNSET {
        detect()
    } else {
        SimdLevel::from_u8(v)
    }
}

/// Forces the dispatch level (for benchmarks and tests). Returns false, and
/// changes nothing, if the CPU does not support `level`.
pub fn set_simd_level(level: SimdLevel) -> bool {
    if !level.is_supported() {
        return false;
    }
    LEVEL.store(level as u8, Ordering::Relaxed);
    true
}

// --------------------------------------------------------- raw dispatch ---

/// The kernels of one type at one level as function pointers: one row of [`KERNELS`],
/// so adding a type or a level is one table row, not an arm in every dispatcher.
///
/// Every function's safety contract: `x` points to `nb` readable blocks per row (rows
/// `stride` bytes apart), the float pointers to `nb * 64` values (`nrows` for `out` and
/// `w`), and the CPU supports the level.
#[derive(Clone, Copy)]
pub struct RowKernels {
    pub dequantize: unsafe fn(*const u8, *mut f32, usize),
    pub vec_dot: unsafe fn(*const u8, *const f32, usize) -> f32,
    pub mad: unsafe fn(*const u8, *mut f32, usize, f32),
    /// `(x, stride, nrows, q, nb, out)`
    pub dot_rows: unsafe fn(*const u8, usize, usize, *const f32, usize, *mut f32),
    /// `(x, stride, nrows, w, y, nb)`
    pub mad_rows: unsafe fn(*const u8, usize, usize, *const f32, *mut f32, usize),
}

/// Raw-pointer entry points of the scalar oracles, one set per type; `$scalar` is the
/// module of the type family's oracles (`dequantize_row`, `vec_dot_row`, `mad_row`,
/// `dot_rows`, `mad_rows` on slices).
macro_rules! scalar_row_kernels {
    ($scalar:path, $ty:expr) => {{
        use $scalar as scalar;
        unsafe fn deq(x: *const u8, y: *mut f32, nb: usize) {
            let xs = core::slice::from_raw_parts(x, nb * $ty.block_bytes());
            scalar::dequantize_row($ty, xs, core::slice::from_raw_parts_mut(y, nb * QK))
        }
        unsafe fn dot(x: *const u8, y: *const f32, nb: usize) -> f32 {
            let xs = core::slice::from_raw_parts(x, nb * $ty.block_bytes());
            scalar::vec_dot_row($ty, xs, core::slice::from_raw_parts(y, nb * QK))
        }
        unsafe fn mad(x: *const u8, y: *mut f32, nb: usize, v: f32) {
            let xs = core::slice::from_raw_parts(x, nb * $ty.block_bytes());
            scalar::mad_row($ty, xs, core::slice::from_raw_parts_mut(y, nb * QK), v)
        }
        unsafe fn dot_rows(
            x: *const u8,
            stride: usize,
            nrows: usize,
            q: *const f32,
            nb: usize,
            out: *mut f32,
        ) {
            let xs = core::slice::from_raw_parts(x, (nrows - 1) * stride + nb * $ty.block_bytes());
            let qs = core::slice::from_raw_parts(q, nb * QK);
            scalar::dot_rows(
                $ty,
                xs,
                stride,
                qs,
                core::slice::from_raw_parts_mut(out, nrows),
            )
        }
        unsafe fn mad_rows(
            x: *const u8,
            stride: usize,
            nrows: usize,
            w: *const f32,
            y: *mut f32,
            nb: usize,
        ) {
            let xs = core::slice::from_raw_parts(x, (nrows - 1) * stride + nb * $ty.block_bytes());
            let ws = core::slice::from_raw_parts(w, nrows);
            scalar::mad_rows(
                $ty,
                xs,
                stride,
                ws,
                core::slice::from_raw_parts_mut(y, nb * QK),
            )
        }
        $crate::kernels::RowKernels {
            dequantize: deq,
            vec_dot: dot,
            mad,
            dot_rows,
            mad_rows,
        }
    }};
}
pub(crate) use scalar_row_kernels;

#[cfg(target_arch = "x86_64")]
macro_rules! x86_row_kernels {
    ($deq:ident, $dot:ident, $mad:ident, $dot_rows:ident, $mad_rows:ident) => {
        RowKernels {
            dequantize: x86::$deq,
            vec_dot: x86::$dot,
            mad: x86::$mad,
            dot_rows: x86::rows::$dot_rows,
            mad_rows: x86::rows::$mad_rows,
        }
    };
}

const SCALAR_ROW: [RowKernels; 3] = [
    scalar_row_kernels!(self::scalar, TqType::Turbo2),
    scalar_row_kernels!(self::scalar, TqType::Turbo3),
    scalar_row_kernels!(self::scalar, TqType::Turbo4),
];

/// `KERNELS[level][bits - 2]`. A level this build has no code for repeats the scalar row
/// ([`SimdLevel::is_supported`] keeps it from being selected anyway).
static KERNELS: [[RowKernels; 3]; 3] = [
    SCALAR_ROW,
    #[cfg(target_arch = "x86_64")]
    [
        x86_row_kernels!(
            avx2_dequantize_t2,
            avx2_vec_dot_t2,
            avx2_mad_t2,
            avx2_dot_rows_t2,
            avx2_mad_rows_t2
        ),
        x86_row_kernels!(
            avx2_dequantize_t3,
            avx2_vec_dot_t3,
            avx2_mad_t3,
            avx2_dot_rows_t3,
            avx2_mad_rows_t3
        ),
        x86_row_kernels!(
            avx2_dequantize_t4,
            avx2_vec_dot_t4,
            avx2_mad_t4,
            avx2_dot_rows_t4,
            avx2_mad_rows_t4
        ),
    ],
    #[cfg(target_arch = "x86_64")]
    [
        x86_row_kernels!(
            avx512_dequantize_t2,
            avx512_vec_dot_t2,
            avx512_mad_t2,
            avx512_dot_rows_t2,
            avx512_mad_rows_t2
        ),
        x86_row_kernels!(
            avx512_dequantize_t3,
            avx512_vec_dot_t3,
            avx512_mad_t3,
            avx512_dot_rows_t3,
            avx512_mad_rows_t3
        ),
        x86_row_kernels!(
            avx512_dequantize_t4,
            avx512_vec_dot_t4,
            avx512_mad_t4,
            avx512_dot_rows_t4,
            avx512_mad_rows_t4
        ),
    ],
    #[cfg(not(target_arch = "x86_64"))]
    SCALAR_ROW,
    #[cfg(not(target_arch = "x86_64"))]
    SCALAR_ROW,
];

/// The kernels of `ty` at `level`.
#[inline(always)]
pub fn row_kernels(level: SimdLevel, ty: TqType) -> &'static RowKernels {
    &KERNELS[level as usize][ty as usize - 2]
}

/// A block type with a [`RowKernels`] set per level: the turbo types here, the trellis
/// types in `crate::tcq::kernels`. The raw dispatchers and the safe row API below are
/// written once for both.
pub trait RowType: Copy {
    /// Bytes of one block of 64 values.
    fn block_bytes(self) -> usize;
    /// The type's kernels at `level` (a level the family has no code for maps to its best
    /// lower one).
    fn kernels(self, level: SimdLevel) -> &'static RowKernels;
}

impl RowType for TqType {
    #[inline(always)]
    fn block_bytes(self) -> usize {
        TqType::block_bytes(self)
    }
    #[inline(always)]
    fn kernels(self, level: SimdLevel) -> &'static RowKernels {
        row_kernels(level, self)
    }
}

/// Dequantizes `nb` blocks at `level`.
///
/// # Safety
/// `x` points to `nb * ty.block_bytes()` readable bytes, `y` to `nb * 64`
/// writable floats, and the CPU supports `level`.
#[inline(always)]
pub unsafe fn dequantize_raw<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: *const u8,
    y: *mut f32,
    nb: usize,
) {
    (ty.kernels(level).dequantize)(x, y, nb)
}

/// Dot product of `nb` blocks with `nb * 64` floats at `level`.
///
/// # Safety
/// As [`dequantize_raw`], with `y` readable.
#[inline(always)]
pub unsafe fn vec_dot_raw<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: *const u8,
    y: *const f32,
    nb: usize,
) -> f32 {
    (ty.kernels(level).vec_dot)(x, y, nb)
}

/// `y += v * decode(x)` over `nb` blocks at `level`.
///
/// # Safety
/// As [`dequantize_raw`].
#[inline(always)]
pub unsafe fn mad_raw<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: *const u8,
    y: *mut f32,
    nb: usize,
    v: f32,
) {
    (ty.kernels(level).mad)(x, y, nb, v)
}

/// `out[r] = dot(decode(row r), q)` for `nrows` rows `stride` bytes apart,
/// each `nb` blocks (a flash-attention key tile against one query).
///
/// # Safety
/// `x` points to `(nrows - 1) * stride + nb * ty.block_bytes()` readable bytes
/// (nothing when `nrows == 0`), `q` to `nb * 64` floats, `out` to `nrows`
/// writable floats, and the CPU supports `level`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn dot_rows_raw<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: *const u8,
    stride: usize,
    nrows: usize,
    q: *const f32,
    nb: usize,
    out: *mut f32,
) {
    if nrows > 0 {
        (ty.kernels(level).dot_rows)(x, stride, nrows, q, nb, out)
    }
}

/// `y += Σ_r w[r] * decode(row r)` over `nrows` rows `stride` bytes apart,
/// each `nb` blocks, rows in order: bit-exact with `nrows` calls of
/// [`mad_raw`] (a flash-attention value tile).
///
/// # Safety
/// As [`dot_rows_raw`], with `w` pointing to `nrows` floats and `y` to
/// `nb * 64` writable floats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn mad_rows_raw<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: *const u8,
    stride: usize,
    nrows: usize,
    w: *const f32,
    y: *mut f32,
    nb: usize,
) {
    if nrows > 0 {
        (ty.kernels(level).mad_rows)(x, stride, nrows, w, y, nb)
    }
}

// ------------------------------------------------------ safe row API ---

/// Blocks per row of `nvals` values in `nbytes` bytes of `block_bytes`-byte blocks; panics
/// on a mismatch (the safe row API of every block type).
pub(crate) fn check_rows(block_bytes: usize, nbytes: usize, nvals: usize) -> usize {
    assert!(
        nvals.is_multiple_of(QK),
        "row length {nvals} is not a multiple of {QK}"
    );
    let nb = nvals / QK;
    assert!(
        nbytes == nb * block_bytes,
        "encoded length {nbytes} does not match {nb} blocks"
    );
    nb
}

pub(crate) fn check_level(level: SimdLevel) {
    assert!(
        level.is_supported(),
        "SIMD level {level:?} is not supported by this CPU"
    );
}

/// Encodes `x` (a multiple of 64 values) into `out` (`x.len()/64` blocks). Scalar.
pub fn quantize_row(ty: TqType, x: &[f32], out: &mut [u8]) {
    check_rows(ty.block_bytes(), out.len(), x.len());
    scalar::quantize_row(ty, x, out)
}

/// Decodes `x` into `y` at an explicit level (panics if unsupported or on a
/// length mismatch).
pub fn dequantize_row_at<T: RowType>(level: SimdLevel, ty: T, x: &[u8], y: &mut [f32]) {
    check_level(level);
    let nb = check_rows(ty.block_bytes(), x.len(), y.len());
    unsafe { dequantize_raw(level, ty, x.as_ptr(), y.as_mut_ptr(), nb) }
}

/// Decodes with the fastest level.
pub fn dequantize_row<T: RowType>(ty: T, x: &[u8], y: &mut [f32]) {
    let nb = check_rows(ty.block_bytes(), x.len(), y.len());
    unsafe { dequantize_raw(simd_level(), ty, x.as_ptr(), y.as_mut_ptr(), nb) }
}

/// Dot product of encoded `x` with `y` at an explicit level.
pub fn vec_dot_row_at<T: RowType>(level: SimdLevel, ty: T, x: &[u8], y: &[f32]) -> f32 {
    check_level(level);
    let nb = check_rows(ty.block_bytes(), x.len(), y.len());
    unsafe { vec_dot_raw(level, ty, x.as_ptr(), y.as_ptr(), nb) }
}

/// Dot product with the fastest level.
pub fn vec_dot_row<T: RowType>(ty: T, x: &[u8], y: &[f32]) -> f32 {
    let nb = check_rows(ty.block_bytes(), x.len(), y.len());
    unsafe { vec_dot_raw(simd_level(), ty, x.as_ptr(), y.as_ptr(), nb) }
}

/// `y += v * decode(x)` at an explicit level.
pub fn mad_row_at<T: RowType>(level: SimdLevel, ty: T, x: &[u8], y: &mut [f32], v: f32) {
    check_level(level);
    let nb = check_rows(ty.block_bytes(), x.len(), y.len());
    unsafe { mad_raw(level, ty, x.as_ptr(), y.as_mut_ptr(), nb, v) }
}

/// `y += v * decode(x)` with the fastest level.
pub fn mad_row<T: RowType>(ty: T, x: &[u8], y: &mut [f32], v: f32) {
    let nb = check_rows(ty.block_bytes(), x.len(), y.len());
    unsafe { mad_raw(simd_level(), ty, x.as_ptr(), y.as_mut_ptr(), nb, v) }
}

/// Checks a tile of `nrows` rows of `nvals` values, `stride` bytes apart, in
/// `nbytes` bytes; returns blocks per row.
pub(crate) fn check_tile(
    block_bytes: usize,
    nbytes: usize,
    stride: usize,
    nrows: usize,
    nvals: usize,
) -> usize {
    assert!(
        nvals.is_multiple_of(QK),
        "row length {nvals} is not a multiple of {QK}"
    );
    let nb = nvals / QK;
    let row = nb * block_bytes;
    assert!(
        nrows <= 1 || stride >= row,
        "stride {stride} < row bytes {row}"
    );
    let need = if nrows == 0 {
        0
    } else {
        (nrows - 1) * stride + row
    };
    assert!(nbytes >= need, "tile needs {need} bytes, got {nbytes}");
    nb
}

/// `out[r] = dot(decode(row r), q)` for `out.len()` rows of `q.len()` values,
/// `stride` bytes apart in `x`, at an explicit level.
pub fn dot_rows_at<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: &[u8],
    stride: usize,
    q: &[f32],
    out: &mut [f32],
) {
    check_level(level);
    let nb = check_tile(ty.block_bytes(), x.len(), stride, out.len(), q.len());
    unsafe {
        dot_rows_raw(
            level,
            ty,
            x.as_ptr(),
            stride,
            out.len(),
            q.as_ptr(),
            nb,
            out.as_mut_ptr(),
        )
    }
}

/// `y += Σ_r w[r] * decode(row r)` for `w.len()` rows of `y.len()` values,
/// `stride` bytes apart in `x`, at an explicit level.
pub fn mad_rows_at<T: RowType>(
    level: SimdLevel,
    ty: T,
    x: &[u8],
    stride: usize,
    w: &[f32],
    y: &mut [f32],
) {
    check_level(level);
    let nb = check_tile(ty.block_bytes(), x.len(), stride, w.len(), y.len());
    unsafe {
        mad_rows_raw(
            level,
            ty,
            x.as_ptr(),
            stride,
            w.len(),
            w.as_ptr(),
            y.as_mut_ptr(),
            nb,
        )
    }
}

// ------------------------------------------------------ typed API ---

/// Typed kernels of a block type (candle-style): `from_float` / `to_float` /
/// `vec_dot` / `mad`, dispatching to the fastest path, plus the scalar oracles.
/// Blanket-implemented for the three block structs.
pub trait TurboKernels: TurboBlock {
    /// Encodes `xs` (`64 * ys.len()` values).
    fn from_float(xs: &[f32], ys: &mut [Self]) {
        quantize_row(Self::TYPE, xs, Self::as_bytes_mut(ys))
    }
    /// Decodes into `ys` (`64 * xs.len()` values).
    fn to_float(xs: &[Self], ys: &mut [f32]) {
        dequantize_row(Self::TYPE, Self::as_bytes(xs), ys)
    }
    /// Scalar decoding oracle.
    fn to_float_scalar(xs: &[Self], ys: &mut [f32]) {
        dequantize_row_at(SimdLevel::Scalar, Self::TYPE, Self::as_bytes(xs), ys)
    }
    /// `Σ decode(xs) * ys`.
    fn vec_dot(xs: &[Self], ys: &[f32]) -> f32 {
        vec_dot_row(Self::TYPE, Self::as_bytes(xs), ys)
    }
    /// Scalar dot oracle (f64 accumulation).
    fn vec_dot_scalar(xs: &[Self], ys: &[f32]) -> f32 {
        vec_dot_row_at(SimdLevel::Scalar, Self::TYPE, Self::as_bytes(xs), ys)
    }
    /// `ys += v * decode(xs)`.
    fn mad(xs: &[Self], ys: &mut [f32], v: f32) {
        mad_row(Self::TYPE, Self::as_bytes(xs), ys, v)
    }
    /// Scalar mad oracle.
    fn mad_scalar(xs: &[Self], ys: &mut [f32], v: f32) {
        mad_row_at(SimdLevel::Scalar, Self::TYPE, Self::as_bytes(xs), ys, v)
    }
}

impl<B: TurboBlock> TurboKernels for B {}
