//! The type table: one row per block type with the facts every layer reads, in the
//! manner of ggml's `type_traits[]`. `TqType` / `TcqType`, the block structs' sizes,
//! the SIMD kernel macros, the C header `turboquant_types.h` (rendered from this table
//! by crates/gen, with static asserts that C, C++ and CUDA all compile) and `tq memory`
//! take block bytes, bits and names from here; a new type is one row plus its kernels.
//!
//! Invariant: a block is an fp16 scale followed by `QK * bits / 8` payload bytes, so
//! `block_bytes = 2 + 8 * bits`; the structs are asserted against it below and in C.

use crate::QK;

/// How a type turns payload bits into values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// One Lloyd-Max codebook index of `bits` bits per value.
    Scalar,
    /// A tail-biting bitshift trellis, `bits` bits shifted in per value.
    Trellis,
}

/// The facts of one block type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeTraits {
    /// Lowercase name, as `-ctk` / `-ctv` and ggml spell it.
    pub name: &'static str,
    /// The upper-case stem of C identifiers (`TQ_<STEM>_BLOCK_BYTES`).
    pub c_stem: &'static str,
    pub family: Family,
    /// Payload bits per value (scale excluded).
    pub bits: u32,
    /// Its `enum ggml_type` value in the patched ggml.h (0101-ggml-core.patch); the Vulkan
    /// shaders, which cannot include ggml.h, read it from turboquant_types.h.
    pub ggml_type: u32,
}

impl TypeTraits {
    /// Payload bytes of a block (`qs`).
    pub const fn payload_bytes(&self) -> usize {
        QK * self.bits as usize / 8
    }
    /// Bytes per block: the fp16 scale and the payload.
    pub const fn block_bytes(&self) -> usize {
        2 + self.payload_bytes()
    }
    /// Bits per value, scale included (`block_bytes * 8 / 64`, e.g. 3.25).
    pub fn bits_per_value(&self) -> f64 {
        self.block_bytes() as f64 * 8.0 / QK as f64
    }
}

pub const TURBO2: TypeTraits = TypeTraits {
    name: "turbo2",
    c_stem: "TURBO2",
    family: Family::Scalar,
    bits: 2,
    ggml_type: 96,
};
pub const TURBO3: TypeTraits = TypeTraits {
    name: "turbo3",
    c_stem: "TURBO3",
    family: Family::Scalar,
    bits: 3,
    ggml_type: 97,
};
pub const TURBO4: TypeTraits = TypeTraits {
    name: "turbo4",
    c_stem: "TURBO4",
    family: Family::Scalar,
    bits: 4,
    ggml_type: 98,
};
pub const TURBO3_TCQ: TypeTraits = TypeTraits {
    name: "turbo3_tcq",
    c_stem: "TURBO3_TCQ",
    family: Family::Trellis,
    bits: 3,
    ggml_type: 99,
};
pub const TURBO2_TCQ: TypeTraits = TypeTraits {
    name: "turbo2_tcq",
    c_stem: "TURBO2_TCQ",
    family: Family::Trellis,
    bits: 2,
    ggml_type: 100,
};

/// Every type, in the order of the generated C list.
pub const TYPES: [TypeTraits; 5] = [TURBO2, TURBO3, TURBO4, TURBO3_TCQ, TURBO2_TCQ];

/// The row named `name` (`"turbo4"`), if any.
pub fn by_name(name: &str) -> Option<&'static TypeTraits> {
    TYPES.iter().find(|t| t.name == name)
}

// The structs are laid out from the table (`qs: [u8; X.payload_bytes()]`); these pin
// the result, alignment and offset included, as the C static asserts do.
macro_rules! assert_block {
    ($t:ty, $row:expr) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $row.block_bytes());
        const _: () = assert!(core::mem::align_of::<$t>() == 2);
        const _: () = assert!(core::mem::offset_of!($t, qs) == 2);
    };
}
assert_block!(crate::block::BlockTurbo2, TURBO2);
assert_block!(crate::block::BlockTurbo3, TURBO3);
assert_block!(crate::block::BlockTurbo4, TURBO4);
assert_block!(crate::tcq::BlockTurbo3Tcq, TURBO3_TCQ);
assert_block!(crate::tcq::BlockTurbo2Tcq, TURBO2_TCQ);
