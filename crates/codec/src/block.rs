//! Block layouts of the three turbo types and the exact bit packing of their
//! codebook indices.
//!
//! Every block holds [`QK`] = 64 values: an fp16 scale `d` (raw IEEE binary16
//! bits, native endian) followed by the packed indices `qs`. Index `k` selects
//! the `k`-th centroid of the type's codebook in ascending order.
//!
//! Packing of `idx[j]`, `j in 0..64`:
//!
//! * turbo4: `qs[i]` low nibble = `idx[i]`, high nibble = `idx[i + 32]`, `i in 0..32`.
//! * turbo2: `qs[i]`, `i in 0..16`: bits 0-1 = `idx[i]`, bits 2-3 = `idx[i + 16]`,
//!   bits 4-5 = `idx[i + 32]`, bits 6-7 = `idx[i + 48]`.
//! * turbo3: `qs[0..16]` hold the low two bits of every index in exactly the
//!   turbo2 layout; `qs[16..24]` hold the high bit: bit `j % 8` of
//!   `qs[16 + j / 8]` is `idx[j] >> 2`.

use crate::error::{Result, TqError};

/// Values per block, shared by every turbo type (`TQ_BLOCK_VALUES`).
pub const QK: usize = 64;

/// turbo2 block: 2.25 bits per value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockTurbo2 {
    /// fp16 scale (raw bits).
    pub d: u16,
    /// 64 two-bit indices.
    pub qs: [u8; crate::types::TURBO2.payload_bytes()],
}

/// turbo3 block: 3.25 bits per value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockTurbo3 {
    /// fp16 scale (raw bits).
    pub d: u16,
    /// 16 bytes of low two bits (turbo2 layout) + 8 bytes of high bits.
    pub qs: [u8; crate::types::TURBO3.payload_bytes()],
}

/// turbo4 block: 4.25 bits per value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockTurbo4 {
    /// fp16 scale (raw bits).
    pub d: u16,
    /// 64 four-bit indices.
    pub qs: [u8; crate::types::TURBO4.payload_bytes()],
}

/// The three turbo types. The discriminant is the C `tq_type` value, which is
/// also the number of bits per index.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TqType {
    /// 2-bit indices, 18-byte blocks.
    Turbo2 = 2,
    /// 3-bit indices, 26-byte blocks.
    Turbo3 = 3,
    /// 4-bit indices, 34-byte blocks.
    Turbo4 = 4,
}

impl TqType {
    /// All types, by increasing bit width.
    pub const ALL: [TqType; 3] = [TqType::Turbo2, TqType::Turbo3, TqType::Turbo4];

    /// Maps a C `tq_type` value onto the enum.
    pub fn from_i32(t: i32) -> Result<TqType> {
        match t {
            2 => Ok(TqType::Turbo2),
            3 => Ok(TqType::Turbo3),
            4 => Ok(TqType::Turbo4),
            _ => Err(TqError::UnknownType),
        }
    }

    /// Bits per index.
    pub const fn bits(self) -> u32 {
        self as u32
    }

    /// Number of centroids, `2^bits`.
    pub const fn levels(self) -> usize {
        1 << (self as u32)
    }

    /// This type's row of the type table.
    pub const fn traits(self) -> &'static crate::types::TypeTraits {
        match self {
            TqType::Turbo2 => &crate::types::TURBO2,
            TqType::Turbo3 => &crate::types::TURBO3,
            TqType::Turbo4 => &crate::types::TURBO4,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        self.traits().block_bytes()
    }

    /// Short lowercase name (`"turbo4"`).
    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// The ascending codebook this type decodes with (the exact-density d = 64
    /// Lloyd-Max codebook, see [`crate::tables`]).
    pub fn codebook(self) -> &'static [f32] {
        match self {
            TqType::Turbo2 => &crate::tables::CODEBOOK_2BIT,
            TqType::Turbo3 => &crate::tables::CODEBOOK_3BIT,
            TqType::Turbo4 => &crate::tables::CODEBOOK_4BIT,
        }
    }

    /// The ascending decision thresholds (midpoints of consecutive centroids).
    pub fn thresholds(self) -> &'static [f32] {
        match self {
            TqType::Turbo2 => &crate::tables::THRESHOLDS_2BIT,
            TqType::Turbo3 => &crate::tables::THRESHOLDS_3BIT,
            TqType::Turbo4 => &crate::tables::THRESHOLDS_4BIT,
        }
    }
}

/// Packs 64 indices into `qs` (`qs.len() == 16, 24 or 32` for 2/3/4 bits).
/// Index bits above the type's width are ignored.
pub fn pack_indices(ty: TqType, idx: &[u8; QK], qs: &mut [u8]) {
    match ty {
        TqType::Turbo4 => {
            let qs = &mut qs[..32];
            for i in 0..32 {
                qs[i] = (idx[i] & 15) | ((idx[i + 32] & 15) << 4);
            }
        }
        TqType::Turbo2 => pack_low2(idx, &mut qs[..16]),
        TqType::Turbo3 => {
            let (lo, hi) = qs[..24].split_at_mut(16);
            pack_low2(idx, lo);
            for (b, h) in hi.iter_mut().enumerate() {
                let mut byte = 0u8;
                for bit in 0..8 {
                    byte |= ((idx[8 * b + bit] >> 2) & 1) << bit;
                }
                *h = byte;
            }
        }
    }
}

#[inline(always)]
fn pack_low2(idx: &[u8; QK], qs: &mut [u8]) {
    for i in 0..16 {
        qs[i] = (idx[i] & 3)
            | ((idx[i + 16] & 3) << 2)
            | ((idx[i + 32] & 3) << 4)
            | ((idx[i + 48] & 3) << 6);
    }
}

/// Unpacks the 64 indices of one block's `qs`.
#[inline(always)]
pub fn unpack_indices(ty: TqType, qs: &[u8], idx: &mut [u8; QK]) {
    match ty {
        TqType::Turbo4 => {
            let qs = &qs[..32];
            for i in 0..32 {
                idx[i] = qs[i] & 15;
                idx[i + 32] = qs[i] >> 4;
            }
        }
        TqType::Turbo2 => unpack_low2(&qs[..16], idx),
        TqType::Turbo3 => {
            let qs = &qs[..24];
            unpack_low2(&qs[..16], idx);
            for (j, v) in idx.iter_mut().enumerate() {
                *v |= ((qs[16 + j / 8] >> (j % 8)) & 1) << 2;
            }
        }
    }
}

#[inline(always)]
fn unpack_low2(qs: &[u8], idx: &mut [u8; QK]) {
    for i in 0..16 {
        let q = qs[i];
        idx[i] = q & 3;
        idx[i + 16] = (q >> 2) & 3;
        idx[i + 32] = (q >> 4) & 3;
        idx[i + 48] = q >> 6;
    }
}

/// Exact IEEE binary16 -> binary32 conversion of raw bits (no tables, no FPU
/// denormal handling involved). Agrees with `half::f16::to_f32` on all inputs,
/// NaN payloads aside.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0 {
        // zero or subnormal: man * 2^-24 is exactly representable as a normal f32.
        let v = man as f32 * (1.0 / 16_777_216.0);
        f32::from_bits(v.to_bits() | sign)
    } else if exp == 0x1f {
        f32::from_bits(sign | 0x7f80_0000 | (man << 13))
    } else {
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
    }
}

/// The scale a decoder uses for a block whose stored scale bits are `h`:
/// the fp16 value itself when it is finite and not negative, else `0.0`.
///
/// A valid encoder never writes a negative, infinite or NaN scale; a corrupted
/// block therefore decodes to zeros instead of NaN/Inf (and
/// `tq_ggml_validate_row` reports it). `-0.0` is kept (it decodes to signed zeros).
#[inline(always)]
pub fn decode_scale(h: u16) -> f32 {
    // exponent all ones (Inf/NaN) or sign set with a non-zero magnitude -> 0.
    if (h & 0x7c00) == 0x7c00 || (h > 0x8000) {
        0.0
    } else {
        f16_bits_to_f32(h)
    }
}

/// True if the scale bits are a finite, non-negative fp16 (what
/// `tq_ggml_validate_row` checks).
#[inline(always)]
pub fn scale_is_valid(h: u16) -> bool {
    (h & 0x7c00) != 0x7c00 && h <= 0x8000
}

/// A block type: its layout constants and the typed view of a row.
pub trait TurboBlock: Copy + Default + 'static {
    /// The turbo type.
    const TYPE: TqType;
    /// Bits per index.
    const BITS: u32;
    /// Bytes per block.
    const BYTES: usize;

    /// The raw bytes of a row of blocks.
    fn as_bytes(xs: &[Self]) -> &[u8] {
        // SAFETY: repr(C) structs of u16 + u8 arrays without padding (sizes
        // asserted above), so every byte is initialized.
        unsafe { core::slice::from_raw_parts(xs.as_ptr() as *const u8, core::mem::size_of_val(xs)) }
    }

    /// The raw bytes of a mutable row of blocks.
    fn as_bytes_mut(xs: &mut [Self]) -> &mut [u8] {
        // SAFETY: as above; every bit pattern is a valid block.
        unsafe {
            core::slice::from_raw_parts_mut(xs.as_mut_ptr() as *mut u8, core::mem::size_of_val(xs))
        }
    }

    /// Unpacks this block's 64 indices.
    fn indices(&self) -> [u8; QK] {
        let mut idx = [0u8; QK];
        let bytes = Self::as_bytes(core::slice::from_ref(self));
        unpack_indices(Self::TYPE, &bytes[2..], &mut idx);
        idx
    }

    /// Builds a block from a scale and 64 indices.
    fn from_parts(d: u16, idx: &[u8; QK]) -> Self {
        let mut b = Self::default();
        let bytes = Self::as_bytes_mut(core::slice::from_mut(&mut b));
        bytes[..2].copy_from_slice(&d.to_ne_bytes());
        pack_indices(Self::TYPE, idx, &mut bytes[2..]);
        b
    }
}

impl TurboBlock for BlockTurbo2 {
    const TYPE: TqType = TqType::Turbo2;
    const BITS: u32 = 2;
    const BYTES: usize = 18;
}
impl TurboBlock for BlockTurbo3 {
    const TYPE: TqType = TqType::Turbo3;
    const BITS: u32 = 3;
    const BYTES: usize = 26;
}
impl TurboBlock for BlockTurbo4 {
    const TYPE: TqType = TqType::Turbo4;
    const BITS: u32 = 4;
    const BYTES: usize = 34;
}
