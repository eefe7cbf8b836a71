//! The CUDA side's lists agree with each other and with the patch, without a CUDA toolkit.
//! (The CUDA code itself is compiled and its codec checked bit for bit against this crate by
//! scripts/cuda-check.sh in CI, and on a GPU by scripts/gpu-check.sh.)

use std::collections::BTreeSet;
use std::path::Path;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

const KV_TYPES: [&str; 5] = ["turbo2", "turbo3", "turbo4", "q8_0", "f16"];

/// Every ordered pair of the flash-attention K/V types with at least one turbo side.
fn expected_pairs() -> BTreeSet<(String, String)> {
    let mut s = BTreeSet::new();
    for k in KV_TYPES {
        for v in KV_TYPES {
            if k.starts_with("turbo") || v.starts_with("turbo") {
                s.insert((k.to_string(), v.to_string()));
            }
        }
    }
    s
}

/// `X(K, V)` entries of TQ_FATTN_FOR_EACH_PAIR in tq-fattn.cuh.
fn header_pairs() -> BTreeSet<(String, String)> {
    let src = read("ggml-ext/cuda/tq-fattn.cuh");
    let start = src
        .find("#define TQ_FATTN_FOR_EACH_PAIR(X)")
        .expect("TQ_FATTN_FOR_EACH_PAIR");
    let body: String = src[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.trim_end().ends_with('\\') || l.contains("X("))
        .collect::<Vec<_>>()
        .join(" ");
    body.split("X(")
        .skip(1)
        .map(|e| {
            let inner = &e[..e.find(')').expect(")")];
            let (k, v) = inner.split_once(',').expect(",");
            (k.trim().to_lowercase(), v.trim().to_lowercase())
        })
        .collect()
}

/// TQ_CUDA_FA_PAIRS of turboquant-cuda.cmake (which generates one instance file per pair).
fn cmake_pairs() -> BTreeSet<(String, String)> {
    let src = read("ggml-ext/cmake/turboquant-cuda.cmake");
    let start = src.find("set(TQ_CUDA_FA_PAIRS").expect("TQ_CUDA_FA_PAIRS");
    let body = &src[start + "set(TQ_CUDA_FA_PAIRS".len()..];
    let body = &body[..body.find(')').unwrap()];
    body.split_whitespace()
        .map(|p| {
            let (k, v) = p.split_once('-').expect("K-V");
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn flash_attention_pairs_agree() {
    let want = expected_pairs();
    assert_eq!(want.len(), 21);
    assert_eq!(header_pairs(), want, "tq-fattn.cuh TQ_FATTN_FOR_EACH_PAIR");
    assert_eq!(
        cmake_pairs(),
        want,
        "turboquant-cuda.cmake TQ_CUDA_FA_PAIRS"
    );
}

#[test]
fn backend_tests_cover_every_pair_type() {
    let src = read("ggml-ext/tests/tq-backend-ops.inc");
    let line = src
        .lines()
        .find(|l| l.contains("const ggml_type kv_types[]"))
        .expect("kv_types");
    for t in KV_TYPES {
        assert!(
            line.contains(&format!("GGML_TYPE_{}", t.to_uppercase())),
            "{t} missing from the backend tests' K/V types"
        );
    }
}

#[test]
fn patch_hooks_every_cuda_table() {
    // One hook per dispatch table: if upstream moves a table, refreshing the patch drops the
    // hook and this names the one that is gone.
    let patch = read("ggml-ext/patches/llama.cpp.patch");
    let hooks = [
        ("ggml/src/ggml-cuda/CMakeLists.txt", "turboquant-cuda.cmake"),
        ("ggml/src/ggml-cuda/fattn-common.cuh", "tq_get_vec_dot_KQ"),
        ("ggml/src/ggml-cuda/fattn-common.cuh", "tq_get_dequantize_V"),
        (
            "ggml/src/ggml-cuda/fattn-vec.cuh",
            "TQ_FATTN_EXTERN_DECL_CASES",
        ),
        (
            "ggml/src/ggml-cuda/fattn-vec.cuh",
            "!TQ_GGML_IS_TURBO(type_K)",
        ),
        ("ggml/src/ggml-cuda/fattn.cu", "TQ_FATTN_VEC_CASES"),
        ("ggml/src/ggml-cuda/fattn.cu", "TQ_GGML_CASES"),
        ("ggml/src/ggml-cuda/convert.cu", "TQ_CUDA_CONVERT_CASES"),
        ("ggml/src/ggml-cuda/getrows.cu", "TQ_CUDA_GET_ROWS_CASES"),
        ("ggml/src/ggml-cuda/set-rows.cu", "TQ_CUDA_SET_ROWS_ARMS"),
        ("ggml/src/ggml-cuda/cpy.cu", "TQ_CUDA_CPY_ARMS"),
        (
            "ggml/src/ggml-cuda/ggml-cuda.cu",
            "TQ_CUDA_SET_ROWS_SUPPORTED",
        ),
        ("ggml/src/ggml-cuda/ggml-cuda.cu", "TQ_CUDA_CPY_SUPPORTED"),
        (
            "ggml/src/ggml-cuda/ggml-cuda.cu",
            "TQ_CUDA_MUL_MAT_SUPPORTED",
        ),
        (
            "tests/test-backend-ops.cpp",
            "tq_make_test_cases(test_cases)",
        ),
    ];
    for (file, hook) in hooks {
        let section = patch
            .split("\ndiff ")
            .find(|s| s.contains(&format!("+++ b/{file}\n")))
            .unwrap_or_else(|| panic!("the patch does not touch {file}"));
        assert!(
            section
                .lines()
                .any(|l| l.starts_with('+') && l.contains(hook)),
            "{file}: hook {hook} missing from the patch"
        );
    }
    // All six to_fp16/fp32/bf16 getters of convert.cu, contiguous and not.
    let convert = patch
        .split("\ndiff ")
        .find(|s| s.contains("+++ b/ggml/src/ggml-cuda/convert.cu\n"))
        .unwrap();
    let n = |t: &str| {
        convert
            .lines()
            .filter(|l| l.starts_with('+') && l.contains(&format!("TQ_CUDA_CONVERT_CASES({t})")))
            .count()
    };
    // MUL_MAT goes to cuBLAS: both mmvq entries (plain and fused) must turn turbo away.
    let cuda = patch
        .split("\ndiff ")
        .find(|s| s.contains("+++ b/ggml/src/ggml-cuda/ggml-cuda.cu\n"))
        .unwrap();
    let via = cuda
        .lines()
        .filter(|l| l.starts_with('+') && l.contains("TQ_CUDA_MUL_MAT_VIA_CUBLAS(src0->type)"))
        .count();
    assert_eq!(
        via, 2,
        "ggml-cuda.cu: mul_mat and the mmvq fusion check both need the hook"
    );
    assert_eq!(n("dequantize_block_cont_cuda"), 3);
    assert_eq!(n("dequantize_block_cuda"), 3);
}
