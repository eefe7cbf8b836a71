//! Every checked-in file that is derived rather than written: the codebook and trellis
//! tables (Rust and C), the C type table and the options tables in README.md and
//! docs/OPTIONS.md (from ggml-ext/llama/tq-options.def). [`all`] renders them from the codec crate,
//! the single source of each fact; `tq-gen` writes them, `tests/fresh.rs` fails when a
//! checked-in copy differs.

pub mod codebooks;
pub mod options;
pub mod tcq_tables;
pub mod types_header;

use std::path::PathBuf;

/// One derived file: its path from the repository root and its full text.
pub struct Generated {
    pub path: &'static str,
    pub text: String,
}

/// The repository root (this crate lives in crates/gen).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Renders every derived file. Training the trellis tables takes seconds in a release
/// build and minutes in a debug one.
pub fn all() -> Vec<Generated> {
    let (t3, _) =
        turboquant_codec::tcq::train::train(turboquant_codec::tcq::train::CODEC_RECIPES[0]);
    let (t2, _) =
        turboquant_codec::tcq::train::train(turboquant_codec::tcq::train::CODEC_RECIPES[1]);
    let mut all = vec![
        Generated {
            path: "crates/codec/src/tables.rs",
            text: codebooks::render_rust_tables(),
        },
        Generated {
            path: "ggml-ext/abi/turboquant_tables.h",
            text: codebooks::render_c_tables(),
        },
        Generated {
            path: "crates/codec/src/tcq/tables.rs",
            text: tcq_tables::render_rust_tables(&t3, &t2),
        },
        Generated {
            path: "ggml-ext/abi/turboquant_tcq_tables.h",
            text: tcq_tables::render_c_tables(&t3, &t2),
        },
        Generated {
            path: "ggml-ext/abi/turboquant_types.h",
            text: types_header::render(),
        },
    ];
    all.extend(options::generated(&repo_root()));
    all
}

/// `v` as the shortest literal that reads back to the same f32, always with a `.`
/// or an exponent so C and Rust parse it as floating point.
pub fn fmt_f32(v: f32) -> String {
    let s = format!("{v}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}
