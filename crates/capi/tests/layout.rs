//! The C header's structs and constants, as bindgen reads them, match the Rust
//! structs and constants.

use std::path::Path;
use turboquant_codec::{BlockTurbo2, BlockTurbo3, BlockTurbo4};

fn bindings() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    bindgen::Builder::default()
        .header(root.join("ggml-ext/abi/turboquant.h").to_string_lossy())
        .header(
            root.join("ggml-ext/abi/turboquant_tables.h")
                .to_string_lossy(),
        )
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on turboquant.h")
        .to_string()
}

fn compact(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn header_struct_layouts_match_rust() {
    let b = compact(&bindings());
    for (name, size, align, qs_off) in [
        (
            "tq_block_turbo2",
            size_of::<BlockTurbo2>(),
            align_of::<BlockTurbo2>(),
            core::mem::offset_of!(BlockTurbo2, qs),
        ),
        (
            "tq_block_turbo3",
            size_of::<BlockTurbo3>(),
            align_of::<BlockTurbo3>(),
            core::mem::offset_of!(BlockTurbo3, qs),
        ),
        (
            "tq_block_turbo4",
            size_of::<BlockTurbo4>(),
            align_of::<BlockTurbo4>(),
            core::mem::offset_of!(BlockTurbo4, qs),
        ),
        (
            "tq_block_turbo3_tcq",
            size_of::<turboquant_codec::tcq::BlockTurbo3Tcq>(),
            align_of::<turboquant_codec::tcq::BlockTurbo3Tcq>(),
            core::mem::offset_of!(turboquant_codec::tcq::BlockTurbo3Tcq, qs),
        ),
        (
            "tq_block_turbo2_tcq",
            size_of::<turboquant_codec::tcq::BlockTurbo2Tcq>(),
            align_of::<turboquant_codec::tcq::BlockTurbo2Tcq>(),
            core::mem::offset_of!(turboquant_codec::tcq::BlockTurbo2Tcq, qs),
        ),
    ] {
        let want_size = format!("[\"Sizeof{name}\"][::std::mem::size_of::<{name}>()-{size}usize]");
        let want_align =
            format!("[\"Alignmentof{name}\"][::std::mem::align_of::<{name}>()-{align}usize]");
        let want_d =
            format!("[\"Offsetoffield:{name}::d\"][::std::mem::offset_of!({name},d)-0usize]");
        let want_qs = format!(
            "[\"Offsetoffield:{name}::qs\"][::std::mem::offset_of!({name},qs)-{qs_off}usize]"
        );
        for w in [want_size, want_align, want_d, want_qs] {
            assert!(b.contains(&w), "bindgen output lacks {w}");
        }
        let qs_len = size - 2;
        assert!(
            b.contains(&format!("pubqs:[u8;{qs_len}usize]")),
            "{name}.qs is not u8[{qs_len}]"
        );
    }
}

#[test]
fn header_constants_match_rust() {
    let b = compact(&bindings());
    use turboquant_codec::error::*;
    for (name, v) in [
        ("TQ_OK", TQ_OK),
        ("TQ_ERR_UNKNOWN_TYPE", TQ_ERR_UNKNOWN_TYPE),
        ("TQ_ERR_BAD_LENGTH", TQ_ERR_BAD_LENGTH),
        ("TQ_ERR_NULL_POINTER", TQ_ERR_NULL_POINTER),
        ("TQ_ERR_BAD_DIM", TQ_ERR_BAD_DIM),
        ("TQ_ERR_PANIC", TQ_ERR_PANIC),
    ] {
        let ok = ["i32", "u32"]
            .iter()
            .any(|t| b.contains(&format!("pubconst{name}:{t}={v};")));
        assert!(ok, "{name} != {v}");
    }
    assert!(b.contains(&format!(
        "pubconstTQ_BLOCK_VALUES:u32={};",
        turboquant_codec::QK
    )));
    assert!(b.contains(&format!(
        "pubconstTQ_DEFAULT_SEED:u64={};",
        turboquant_codec::rotation::DEFAULT_SEED
    )));
    for (name, n) in [("2BIT", 4), ("3BIT", 8), ("4BIT", 16)] {
        assert!(b.contains(&format!("pubstaticTQ_CODEBOOK_{name}:[f32;{n}usize];")));
        assert!(b.contains(&format!(
            "pubstaticTQ_THRESHOLDS_{name}:[f32;{}usize];",
            n - 1
        )));
    }
    assert!(b.contains("pubconsttq_type_TQ_TURBO2:tq_type=2;"));
    assert!(b.contains("pubconsttq_type_TQ_TURBO3:tq_type=3;"));
    assert!(b.contains("pubconsttq_type_TQ_TURBO4:tq_type=4;"));
}
