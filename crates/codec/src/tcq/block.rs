//! Block layouts of the trellis-coded types and the circular bit stream that
//! carries their trellis symbols (MSB-first, see the module invariant in
//! `crates/codec/src/tcq/mod.rs`).

use crate::error::{Result, TqError};
use crate::QK;

/// turbo3_tcq block: 3.25 bits per value (k = 3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockTurbo3Tcq {
    /// fp16 scale (raw bits).
    pub d: u16,
    /// 192 trellis bits, MSB-first.
    pub qs: [u8; crate::types::TURBO3_TCQ.payload_bytes()],
}

/// turbo2_tcq block: 2.25 bits per value (k = 2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockTurbo2Tcq {
    /// fp16 scale (raw bits).
    pub d: u16,
    /// 128 trellis bits, MSB-first.
    pub qs: [u8; crate::types::TURBO2_TCQ.payload_bytes()],
}

/// The two trellis-coded types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TcqType {
    /// 3 bits per value, 26-byte blocks.
    Turbo3Tcq,
    /// 2 bits per value, 18-byte blocks.
    Turbo2Tcq,
}

impl TcqType {
    /// Both types.
    pub const ALL: [TcqType; 2] = [TcqType::Turbo3Tcq, TcqType::Turbo2Tcq];

    /// Bits shifted into the state per value.
    pub const fn k(self) -> u32 {
        self.traits().bits
    }

    /// State bits `L` (the table has `2^L` entries).
    pub const fn l(self) -> u32 {
        match self {
            TcqType::Turbo3Tcq => crate::tcq::tables::TCQ3_L,
            TcqType::Turbo2Tcq => crate::tcq::tables::TCQ2_L,
        }
    }

    /// This type's row of the type table.
    pub const fn traits(self) -> &'static crate::types::TypeTraits {
        match self {
            TcqType::Turbo3Tcq => &crate::types::TURBO3_TCQ,
            TcqType::Turbo2Tcq => &crate::types::TURBO2_TCQ,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        self.traits().block_bytes()
    }

    /// Short lowercase name.
    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// The generated reconstruction table (`2^L` values).
    pub fn table(self) -> &'static [f32] {
        match self {
            TcqType::Turbo3Tcq => &crate::tcq::tables::TCQ3_TABLE,
            TcqType::Turbo2Tcq => &crate::tcq::tables::TCQ2_TABLE,
        }
    }

    /// The trellis of this type.
    pub fn trellis(self) -> crate::tcq::Trellis<'static> {
        crate::tcq::Trellis::new(self.l(), self.k(), self.table())
    }

    /// Number of whole blocks for `nvals` values in `nbytes` bytes, or
    /// `BadLength` when they do not describe the same whole blocks.
    pub fn checked_blocks(self, nvals: usize, nbytes: usize) -> Result<usize> {
        if !nvals.is_multiple_of(QK) || nbytes != nvals / QK * self.block_bytes() {
            return Err(TqError::BadLength);
        }
        Ok(nvals / QK)
    }
}

/// Writes the symbols `c[0..n]` (`k` bits each) MSB-first into `qs`
/// (`n k / 8` bytes, `n k` a multiple of 8).
pub fn pack_symbols(c: &[u8], k: u32, qs: &mut [u8]) {
    qs.fill(0);
    let mut pos = 0usize;
    for &sym in c {
        for b in (0..k).rev() {
            let bit = (sym >> b) & 1;
            qs[pos / 8] |= bit << (7 - pos % 8);
            pos += 1;
        }
    }
}

/// Reads the `n = qs.len() * 8 / k` symbols of `qs` (MSB-first) into `c`.
/// Fast paths for the two block sizes; byte-exact with [`pack_symbols`].
#[inline(always)]
pub fn unpack_symbols(qs: &[u8], k: u32, c: &mut [u8]) {
    match k {
        2 => {
            for (i, &b) in qs.iter().enumerate() {
                c[4 * i] = b >> 6;
                c[4 * i + 1] = (b >> 4) & 3;
                c[4 * i + 2] = (b >> 2) & 3;
                c[4 * i + 3] = b & 3;
            }
        }
        3 => {
            for (i, w) in qs.chunks_exact(3).enumerate() {
                let v = ((w[0] as u32) << 16) | ((w[1] as u32) << 8) | w[2] as u32;
                for j in 0..8 {
                    c[8 * i + j] = ((v >> (21 - 3 * j)) & 7) as u8;
                }
            }
        }
        _ => {
            let n = qs.len() * 8 / k as usize;
            for (t, dst) in c[..n].iter_mut().enumerate() {
                let mut v = 0u8;
                for b in 0..k as usize {
                    let pos = t * k as usize + b;
                    v = (v << 1) | ((qs[pos / 8] >> (7 - pos % 8)) & 1);
                }
                *dst = v;
            }
        }
    }
}

/// The state of value `t`: stream bits `[k t + k - L, k t + k)` modulo
/// `8 qs.len()`, MSB-first (random access; what a GPU lane would read).
pub fn state_at(qs: &[u8], k: u32, l: u32, t: usize) -> u32 {
    let nbits = qs.len() as i64 * 8;
    let end = (t as i64 + 1) * k as i64;
    let mut s = 0u32;
    for p in end - l as i64..end {
        let p = p.rem_euclid(nbits) as usize;
        s = (s << 1) | ((qs[p / 8] >> (7 - p % 8)) & 1) as u32;
    }
    s
}
