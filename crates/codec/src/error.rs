//! Error type of the codec and its mapping onto the C ABI's error codes.

/// Errors returned by the codec's checked entry points.
///
/// Every variant maps onto one of the negative `TQ_ERR_*` codes of
/// `ggml-ext/abi/turboquant.h` (see [`TqError::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TqError {
    /// The type id is not 2, 3 or 4.
    #[error("unknown turbo type")]
    UnknownType,
    /// A length is negative, not a multiple of the block size / dimension, or a
    /// buffer is too small.
    #[error("bad length: not a multiple of the block size, or a buffer is too small")]
    BadLength,
    /// A required pointer was NULL (C ABI only).
    #[error("null pointer")]
    NullPointer,
    /// The rotation dimension is not a power of two in 2..=65536.
    #[error("bad dimension: must be a power of two in 2..=65536")]
    BadDim,
    /// A panic was caught at the C ABI boundary (a bug).
    #[error("internal panic caught at the C ABI boundary")]
    Panic,
}

/// `TQ_OK`.
pub const TQ_OK: i32 = 0;
/// `TQ_ERR_UNKNOWN_TYPE`.
pub const TQ_ERR_UNKNOWN_TYPE: i32 = -1;
/// `TQ_ERR_BAD_LENGTH`.
pub const TQ_ERR_BAD_LENGTH: i32 = -2;
/// `TQ_ERR_NULL_POINTER`.
pub const TQ_ERR_NULL_POINTER: i32 = -3;
/// `TQ_ERR_BAD_DIM`.
pub const TQ_ERR_BAD_DIM: i32 = -4;
/// `TQ_ERR_PANIC`.
pub const TQ_ERR_PANIC: i32 = -5;

impl TqError {
    /// The C error code (`TQ_ERR_*`, negative).
    pub const fn code(self) -> i32 {
        match self {
            TqError::UnknownType => TQ_ERR_UNKNOWN_TYPE,
            TqError::BadLength => TQ_ERR_BAD_LENGTH,
            TqError::NullPointer => TQ_ERR_NULL_POINTER,
            TqError::BadDim => TQ_ERR_BAD_DIM,
            TqError::Panic => TQ_ERR_PANIC,
        }
    }
}

/// Result alias of the codec.
pub type Result<T> = std::result::Result<T, TqError>;
