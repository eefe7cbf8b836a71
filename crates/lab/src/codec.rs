//! The cache types as the lab simulates them (reference codecs): f16, ggml's reference
//! q8_0 / q4_0 quantizers re-implemented in Rust, and the turbo and trellis-coded types
//! through the shipped encoder, each behind the rotation llama.cpp gives it.
//!
//! Invariant: `Codec::roundtrip` is what a cache of that type gives back for a row:
//! rotate, quantize, dequantize, rotate back; the q8_0/q4_0 rounding is ggml's
//! (`quantize_row_q*_0_ref`, fp16 scale; pinned by tests/lab_metrics.rs), the turbo bytes
//! are the codec crate's.

use crate::rotation::{apply_rotation, Rotation};
use half::f16;
use turboquant_codec::tcq::TcqType;
use turboquant_codec::TqType;

/// A KV-cache type as the lab simulates it: f16 (the reference; the captured values are
/// already f16, so it is the identity on them), ggml's reference q8_0 / q4_0 quantizers
/// re-implemented in Rust (`quantize_row_q8_0_ref` / `quantize_row_q4_0_ref` of
/// ggml-quants.c, fp16 scale), and the turbo types through this crate's encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// no quantization at all (for tests and as a sanity row)
    Identity,
    F16,
    Q8_0,
    Q4_0,
    Turbo(TqType),
    /// the trellis-coded types (turbo3_tcq, turbo2_tcq)
    Tcq(TcqType),
}

impl Codec {
    pub const ALL: [Codec; 8] = [
        Codec::F16,
        Codec::Q8_0,
        Codec::Q4_0,
        Codec::Turbo(TqType::Turbo4),
        Codec::Turbo(TqType::Turbo3),
        Codec::Turbo(TqType::Turbo2),
        Codec::Tcq(TcqType::Turbo3Tcq),
        Codec::Tcq(TcqType::Turbo2Tcq),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Codec::Identity => "identity",
            Codec::F16 => "f16",
            Codec::Q8_0 => "q8_0",
            Codec::Q4_0 => "q4_0",
            Codec::Turbo(t) => t.name(),
            Codec::Tcq(t) => t.name(),
        }
    }

    pub fn parse(s: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == s)
    }

    /// A comma-separated list of type names (`--types`), or the unknown one with the valid ones.
    pub fn parse_list(s: &str) -> Result<Vec<Codec>, String> {
        s.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                Codec::parse(t).ok_or_else(|| {
                    format!(
                        "unknown type `{t}` (one of: {})",
                        Codec::ALL.map(Codec::name).join(", ")
                    )
                })
            })
            .collect()
    }

    pub fn bits_per_value(self) -> f64 {
        match self {
            Codec::Identity => 32.0,
            Codec::F16 => 16.0,
            Codec::Q8_0 => 8.5,
            Codec::Q4_0 => 4.5,
            Codec::Turbo(t) => t.traits().bits_per_value(),
            Codec::Tcq(t) => t.traits().bits_per_value(),
        }
    }

    /// Index bits (2/3/4 for turbo; for the 4^-b bound and the Lloyd-Max optimum).
    pub fn index_bits(self) -> Option<u32> {
        match self {
            Codec::Turbo(t) => Some(t.bits()),
            _ => None,
        }
    }

    /// The rotation llama.cpp applies before this cache type (none for f16).
    pub fn rotation(self) -> Rotation {
        match self {
            Codec::Identity | Codec::F16 => Rotation::None,
            Codec::Q8_0 | Codec::Q4_0 => Rotation::Plain,
            Codec::Turbo(_) | Codec::Tcq(_) => Rotation::Seeded,
        }
    }

    /// Quantize + dequantize `x` (whole rows, rotated first with `rot_dim`, rotated back
    /// after, as the cache sees them) into `out`.
    pub fn roundtrip(self, rot_dim: usize, x: &[f32], out: &mut [f32]) {
        out.copy_from_slice(x);
        let rot = self.rotation();
        apply_rotation(rot, rot_dim, out);
        match self {
            Codec::Identity => {}
            Codec::F16 => out.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32()),
            Codec::Q8_0 => out.chunks_exact_mut(32).for_each(q8_0_roundtrip),
            Codec::Q4_0 => out.chunks_exact_mut(32).for_each(q4_0_roundtrip),
            Codec::Turbo(t) => {
                let mut bytes = vec![0u8; out.len() / 64 * t.block_bytes()];
                turboquant_codec::quantize(t, out, &mut bytes).expect("whole blocks");
                turboquant_codec::dequantize(t, &bytes, out).expect("whole blocks");
            }
            Codec::Tcq(t) => {
                let mut bytes = vec![0u8; out.len() / 64 * t.block_bytes()];
                turboquant_codec::tcq::codec::quantize_thread_scratch(t, out, &mut bytes)
                    .expect("whole blocks");
                turboquant_codec::tcq::codec::dequantize(t, &bytes, out).expect("whole blocks");
            }
        }
        apply_rotation(rot, rot_dim, out);
    }
}

fn fp16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// ggml's `quantize_row_q8_0_ref` + `dequantize_row_q8_0` on one block of 32.
pub fn q8_0_roundtrip(x: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let dh = fp16_round(d);
    for v in x.iter_mut() {
        let q = (*v * id).round() as i8; // C roundf: half away from zero, like f32::round
        *v = q as f32 * dh;
    }
}

/// ggml's `quantize_row_q4_0_ref` + `dequantize_row_q4_0` on one block of 32.
pub fn q4_0_roundtrip(x: &mut [f32]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x.iter() {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let dh = fp16_round(d);
    for v in x.iter_mut() {
        let q = ((*v * id + 8.5) as i8).min(15); // C: MIN(15, (int8_t)(x + 8.5f))
        *v = (q as i32 - 8) as f32 * dh;
    }
}

/// The codec rounds every row of `rows` (each `dim` long) with rotation size `rot_dim`.
pub fn roundtrip_rows(codec: Codec, dim: usize, rot_dim: usize, rows: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; rows.len()];
    for (x, y) in rows.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        codec.roundtrip(rot_dim, x, y);
    }
    out
}
