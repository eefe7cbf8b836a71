//! KV-cache geometry of a GGUF model and the bytes each cache type needs.

use crate::gguf::{Metadata, Value};

use turboquant_codec::types;

/// A KV-cache element type as llama.cpp's `-ctk` / `-ctv` name it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheType {
    pub name: &'static str,
    /// values per block and bytes per block
    pub block: u64,
    pub bytes: u64,
}

impl CacheType {
    pub fn bits_per_value(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.block as f64
    }
    pub fn row_bytes(&self, n: u64) -> u64 {
        n.div_ceil(self.block) * self.bytes
    }
}

/// A turbo type's row, from the codec's type table.
const fn turbo(t: &types::TypeTraits) -> CacheType {
    CacheType {
        name: t.name,
        block: turboquant_codec::QK as u64,
        bytes: t.block_bytes() as u64,
    }
}

/// Every type llama-server accepts for the KV cache, with ours last.
pub const CACHE_TYPES: &[CacheType] = &[
    CacheType {
        name: "f32",
        block: 1,
        bytes: 4,
    },
    CacheType {
        name: "f16",
        block: 1,
        bytes: 2,
    },
    CacheType {
        name: "bf16",
        block: 1,
        bytes: 2,
    },
    CacheType {
        name: "q8_0",
        block: 32,
        bytes: 34,
    },
    CacheType {
        name: "q4_0",
        block: 32,
        bytes: 18,
    },
    CacheType {
        name: "q4_1",
        block: 32,
        bytes: 20,
    },
    CacheType {
        name: "iq4_nl",
        block: 32,
        bytes: 18,
    },
    CacheType {
        name: "q5_0",
        block: 32,
        bytes: 22,
    },
    CacheType {
        name: "q5_1",
        block: 32,
        bytes: 24,
    },
    turbo(&types::TURBO2),
    turbo(&types::TURBO3),
    turbo(&types::TURBO4),
    turbo(&types::TURBO3_TCQ),
    turbo(&types::TURBO2_TCQ),
];

pub fn cache_type(name: &str) -> Result<CacheType, String> {
    CACHE_TYPES
        .iter()
        .copied()
        .find(|t| t.name == name)
        .ok_or_else(|| {
            let valid: Vec<&str> = CACHE_TYPES.iter().map(|t| t.name).collect();
            format!("unknown cache type `{name}` (valid: {})", valid.join(", "))
        })
}

/// What the KV cache of one model stores per token.
#[derive(Debug, Clone)]
pub struct Geometry {
    pub arch: String,
    pub n_layer: u64,
    /// KV heads of each layer
    pub n_head_kv: Vec<u64>,
    pub head_k: u64,
    pub head_v: u64,
}

impl Geometry {
    pub fn from_gguf(md: &Metadata) -> Result<Geometry, String> {
        let arch = md
            .str("general.architecture")
            .ok_or("GGUF lacks general.architecture")?
            .to_string();
        let int = |k: &str| md.get(&format!("{arch}.{k}")).and_then(Value::as_i64);
        let n_layer =
            int("block_count").ok_or_else(|| format!("GGUF lacks {arch}.block_count"))? as u64;
        let n_embd = int("embedding_length")
            .ok_or_else(|| format!("GGUF lacks {arch}.embedding_length"))?
            as u64;
        let n_head = int("attention.head_count")
            .ok_or_else(|| format!("GGUF lacks {arch}.attention.head_count"))?
            as u64;
        let n_head_kv = match md.get(&format!("{arch}.attention.head_count_kv")) {
            Some(Value::Array(v)) => v.iter().map(|x| x.as_i64().unwrap_or(0) as u64).collect(),
            Some(v) => vec![v.as_i64().unwrap_or(n_head as i64) as u64; n_layer as usize],
            None => vec![n_head; n_layer as usize],
        };
        let head_k = int("attention.key_length")
            .map(|v| v as u64)
            .unwrap_or(n_embd / n_head.max(1));
        let head_v = int("attention.value_length")
            .map(|v| v as u64)
            .unwrap_or(head_k);
        Ok(Geometry {
            arch,
            n_layer,
            n_head_kv,
            head_k,
            head_v,
        })
    }

    /// Bytes per token of context for a K type and a V type (all layers, one sequence).
    pub fn bytes_per_token(&self, k: CacheType, v: CacheType) -> u64 {
        self.n_head_kv
            .iter()
            .map(|&h| h * (k.row_bytes(self.head_k) + v.row_bytes(self.head_v)))
            .sum()
    }

    /// Whether every head can use the turbo types (whole 64-value blocks per head).
    pub fn turbo_ok(&self) -> bool {
        self.head_k.is_multiple_of(64) && self.head_v.is_multiple_of(64)
    }
}

pub fn human_bytes(b: f64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < U.len() {
        x /= 1024.0;
        i += 1;
    }
    format!("{x:.2} {}", U[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_per_value_match_the_block_formats() {
        let b = |n| cache_type(n).unwrap().bits_per_value();
        assert_eq!(b("turbo2"), 2.25);
        assert_eq!(b("turbo3"), 3.25);
        assert_eq!(b("turbo4"), 4.25);
        assert_eq!(b("q4_0"), 4.5);
        assert_eq!(b("q8_0"), 8.5);
        assert_eq!(b("f16"), 16.0);
    }

    #[test]
    fn unknown_type_names_the_valid_ones() {
        let e = cache_type("turbo9").unwrap_err();
        assert!(
            e.contains("turbo9") && e.contains("turbo4") && e.contains("q8_0"),
            "{e}"
        );
    }

    #[test]
    fn llama3_8b_bytes_per_token() {
        // Llama-3-8B: 32 layers, 8 KV heads, head 128: f16 = 128 KiB per token.
        let g = Geometry {
            arch: "llama".into(),
            n_layer: 32,
            n_head_kv: vec![8; 32],
            head_k: 128,
            head_v: 128,
        };
        let f16 = cache_type("f16").unwrap();
        assert_eq!(g.bytes_per_token(f16, f16), 131072);
        let t4 = cache_type("turbo4").unwrap();
        assert_eq!(g.bytes_per_token(t4, t4), 32 * 8 * 2 * 2 * 34);
    }
}
