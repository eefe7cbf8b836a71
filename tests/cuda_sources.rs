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
/// The trellis types' vector-kernel pairs: a trellis K with any of these V, or these K with
/// a trellis V (docs/CUDA.md; pairs with a scalar turbo type convert to f16).
const TCQ_KV_TYPES: [&str; 4] = ["turbo3_tcq", "turbo2_tcq", "q8_0", "f16"];

/// Every ordered pair of the flash-attention K/V types with at least one turbo side, and
/// the trellis pairs.
fn expected_pairs() -> BTreeSet<(String, String)> {
    let mut s = BTreeSet::new();
    for k in KV_TYPES {
        for v in KV_TYPES {
            if k.starts_with("turbo") || v.starts_with("turbo") {
                s.insert((k.to_string(), v.to_string()));
            }
        }
    }
    for k in TCQ_KV_TYPES {
        for v in TCQ_KV_TYPES {
            if k.ends_with("_tcq") || v.ends_with("_tcq") {
                s.insert((k.to_string(), v.to_string()));
            }
        }
    }
    s
}

/// `X(K, V)` entries of TQ_FATTN_FOR_EACH_PAIR in tq-fattn.cuh and
/// TQ_TCQ_FATTN_FOR_EACH_PAIR in tq-tcq-fattn.cuh.
fn header_pairs() -> BTreeSet<(String, String)> {
    let mut all = macro_pairs("ggml-ext/ggml-cuda/tq-fattn.cuh", "TQ_FATTN_FOR_EACH_PAIR");
    all.extend(macro_pairs(
        "ggml-ext/ggml-cuda/tq-tcq-fattn.cuh",
        "TQ_TCQ_FATTN_FOR_EACH_PAIR",
    ));
    all
}

fn macro_pairs(file: &str, name: &str) -> BTreeSet<(String, String)> {
    let src = read(file);
    let start = src
        .find(&format!("#define {name}(X)"))
        .unwrap_or_else(|| panic!("{name} in {file}"));
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
    assert_eq!(want.len(), 21 + 12);
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
    let line = src
        .lines()
        .find(|l| l.contains("const ggml_type tcq_kv_types[]"))
        .expect("tcq_kv_types");
    for t in TCQ_KV_TYPES {
        assert!(
            line.contains(&format!("GGML_TYPE_{}", t.to_uppercase())),
            "{t} missing from the backend tests' trellis K/V types"
        );
    }
    // SET_ROWS, GET_ROWS, CPY and MUL_MAT run over all five types
    let line = src
        .lines()
        .find(|l| l.contains("const ggml_type turbo[]"))
        .expect("turbo[]");
    for t in ["TURBO2", "TURBO3", "TURBO4", "TURBO3_TCQ", "TURBO2_TCQ"] {
        assert!(
            line.contains(&format!("GGML_TYPE_{t},")) || line.contains(&format!("GGML_TYPE_{t}}}")),
            "{t} missing from the backend tests' turbo types"
        );
    }
}

#[test]
fn cuda_backend_claims_and_implements_the_trellis_types() {
    // every op the CUDA backend claims for a turbo type, it claims for all five: no
    // supports_op hook (ggml-cuda.cu) nor the FA type list (fattn.cu) may name the
    // scalar-only macros any more
    let patch = read("ggml-ext/patches/0103-ggml-cuda.patch");
    for file in ["ggml-cuda.cu", "fattn.cu"] {
        let section = patch
            .split("\ndiff ")
            .find(|s| s.contains(&format!("+++ b/ggml/src/ggml-cuda/{file}\n")))
            .unwrap_or_else(|| panic!("the patch does not touch {file}"));
        for l in section.lines().filter(|l| l.starts_with('+')) {
            assert!(
                !l.contains("TQ_GGML_IS_TURBO_SCALAR") && !l.contains("TQ_GGML_SCALAR_CASES"),
                "{file}: a CUDA hook still leaves the trellis types out: {l}"
            );
        }
    }
    let glue = read("ggml-ext/ggml-cuda/tq-cuda-ggml.cuh");
    assert!(
        !glue.contains("TQ_GGML_IS_TURBO_SCALAR"),
        "tq-cuda-ggml.cuh"
    );
    assert!(glue.contains("TQ_TCQ_CONVERT_CASES(TEMPLATE)"));
    assert!(glue.contains("TQ_TCQ_GET_ROWS_CASES"));
    // the encoders and decoders each dispatch table needs
    for (file, want) in [
        (
            "ggml-ext/ggml-cuda/tq-cuda-set-rows.cuh",
            "tq_tcq_set_rows_launch<idx_t, 3>",
        ),
        (
            "ggml-ext/ggml-cuda/tq-cuda-set-rows.cuh",
            "tq_tcq_set_rows_launch<idx_t, 2>",
        ),
        (
            "ggml-ext/ggml-cuda/tq-cuda-cpy.cuh",
            "tq_tcq_cpy_f32_launch<3>",
        ),
        (
            "ggml-ext/ggml-cuda/tq-cuda-cpy.cuh",
            "tq_tcq_cpy_f32_launch<2>",
        ),
        (
            "ggml-ext/ggml-cuda/tq-cuda-cpy.cuh",
            "tq_cuda_dequantize_turbo3_tcq",
        ),
        (
            "ggml-ext/ggml-cuda/tq-cuda-cpy.cuh",
            "tq_cuda_dequantize_turbo2_tcq",
        ),
        ("ggml-ext/ggml-cuda/tq-fattn.cuh", "tq_tcq_vec_dot_KQ<"),
        ("ggml-ext/ggml-cuda/tq-fattn.cuh", "tq_tcq_dequantize_V<"),
        ("ggml-ext/ggml-cuda/tq-parity.cu", "check_tcq<3>"),
        ("ggml-ext/ggml-cuda/tq-parity.cu", "check_tcq<2>"),
    ] {
        assert!(read(file).contains(want), "{file} lacks {want}");
    }
}

#[test]
fn trellis_cuda_sources_follow_the_encoding_rule() {
    // One source for the tables: the CUDA side includes the generated header and never
    // carries a copy of its numbers.
    let tables = read("ggml-ext/abi/turboquant_tcq_tables.h");
    let first_values: Vec<&str> = ["TQ_TCQ3_TABLE[256] = {", "TQ_TCQ2_TABLE[256] = {"]
        .iter()
        .map(|head| {
            let at = tables.find(head).expect(head) + head.len();
            tables[at..].split(',').next().unwrap().trim()
        })
        .collect();
    let tcq = read("ggml-ext/ggml-cuda/tq-tcq.cuh");
    assert!(tcq.contains("#include \"turboquant_tcq_tables.h\""));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ggml-ext/ggml-cuda");
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let src = read(&format!("ggml-ext/ggml-cuda/{name}"));
        for v in &first_values {
            assert!(
                !src.contains(v),
                "{name} copies a trellis table value ({v})"
            );
        }
    }
    // The path costs: `m + e * e`, `e = u - T`, exactly rounded and never contracted into an
    // FMA under ggml's -use_fast_math; ties to the lowest hi (strict <); the scale fit in f64.
    let enc = read("ggml-ext/ggml-cuda/tq-tcq-encode.cuh");
    for want in [
        "tq_fadd(mm, tq_fmul(e, e))",
        "tq_fsub(ut, tab[i][l])",
        "tq_fsub(u0, tab[i][l])",
        "if (cc < mv) {",
        "tq_ddiv(tq_cuda_widen(x[l]), r)",
        "xt = tq_dadd(xt, tq_dmul(v, t));",
        "tt = tq_dadd(tt, tq_dmul(t, t));",
        "tq_tcq_pass<K, false, false>(uhi, ulo, tab, 0, sc, 31)",
        "tq_tcq_pass<K, true, true>(ulo, uhi, tab, o, sc, 0)",
    ] {
        assert!(enc.contains(want), "tq-tcq-encode.cuh lacks {want}");
    }
    let shims = read("ggml-ext/ggml-cuda/tq-cuda.cuh") + &tcq;
    for want in [
        "__fadd_rn(a, b)",
        "__fsub_rn(a, b)",
        "__fmul_rn(a, b)",
        "__dadd_rn(a, b)",
        "__dmul_rn(a, b)",
    ] {
        assert!(shims.contains(want), "the device shims lack {want}");
    }
}

#[test]
fn patch_hooks_every_cuda_table() {
    // One hook per dispatch table: if upstream moves a table, refreshing the patch drops the
    // hook and this names the one that is gone.
    // the whole series (docs/PATCHES.md), in the order it applies
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ggml-ext/patches");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".patch"))
        .collect();
    names.sort();
    let patch: String = names
        .iter()
        .map(|n| read(&format!("ggml-ext/patches/{n}")))
        .collect();
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
        (
            "ggml/src/ggml-cuda/fattn-vec.cuh",
            "tq_fattn_vec_prologue<type_K, type_V>()",
        ),
        ("ggml/src/ggml-cuda/fattn.cu", "TQ_FATTN_VEC_CASES"),
        ("ggml/src/ggml-cuda/fattn.cu", "TQ_GGML_CASES"),
        (
            "ggml/src/ggml-cuda/fattn.cu",
            "tq_cuda_fa_route(Q, K, V, mask)",
        ),
        ("ggml/src/ggml-cuda/convert.cu", "TQ_CUDA_CONVERT_CASES"),
        ("ggml/src/ggml-cuda/getrows.cu", "TQ_CUDA_GET_ROWS_CASES"),
        (
            "ggml/src/ggml-cuda/set-rows.cu",
            "tq_cuda_set_rows<src_t, idx_t>",
        ),
        (
            "ggml/src/ggml-cuda/cpy.cu",
            "tq_cuda_cpy(src0, src1, main_stream)",
        ),
        (
            "ggml/src/ggml-cuda/ggml-cuda.cu",
            "TQ_CUDA_SET_ROWS_SUPPORTED",
        ),
        ("ggml/src/ggml-cuda/ggml-cuda.cu", "TQ_CUDA_CPY_SUPPORTED"),
        (
            "ggml/src/ggml-cuda/ggml-cuda.cu",
            "TQ_CUDA_MUL_MAT_SUPPORTED",
        ),
        // the fused K side's node: claimed by supports_op, run by compute_forward
        ("ggml/src/ggml-cuda/ggml-cuda.cu", "tq_cuda_rf_keep_ok(op)"),
        (
            "ggml/src/ggml-cuda/ggml-cuda.cu",
            "tq_cuda_rf_keep(dst, ctx.stream())",
        ),
        (
            "tests/test-backend-ops.cpp",
            "tq_make_test_cases(test_cases)",
        ),
        (
            "tests/test-backend-ops.cpp",
            "tq_make_perf_cases(test_cases)",
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

/// The decode-kernel selector (TQ_CUDA_FA in tq-fattn.cuh): read in one place, once per
/// process (a function-local static) through the switches table's parser (an unknown value
/// stops the process with the table's message), both kernels handed out by the one lookup the
/// patch hooks, and the GQA kernel instantiated for every
/// pair and head size the vector kernel is.
#[test]
fn decode_kernel_selector() {
    let fattn = read("ggml-ext/ggml-cuda/tq-fattn.cuh");
    let gqa = read("ggml-ext/ggml-cuda/tq-fattn-gqa.cuh");
    let cmake = read("ggml-ext/cmake/turboquant-cuda.cmake");
    let all: String = [
        "tq-fattn.cuh",
        "tq-fattn-gqa.cuh",
        "tq-fattn-gqa-decode.cuh",
        "tq-cuda-ggml.cuh",
        "tq-cuda.cuh",
    ]
    .iter()
    .map(|f| read(&format!("ggml-ext/ggml-cuda/{f}")))
    .collect();
    // TQ_CUDA_FA is a row of the switches table (ggml-ext/ggml/tq-switches.def), read by
    // the table's parser, which stops the process with the table's message on a value it
    // does not know (tests/switches.rs runs that parser on every row)
    assert_eq!(
        all.matches("tq_switch_get(TQ_SW_CUDA_FA)").count(),
        1,
        "TQ_CUDA_FA is read in one place, through the table's parser"
    );
    assert!(
        !all.contains("getenv(\"TQ_CUDA_FA\")"),
        "no reader of its own"
    );
    let sel = &fattn[fattn
        .find("inline tq_cuda_fa_kernel tq_cuda_fa_selected()")
        .expect("tq_cuda_fa_selected")..];
    let sel = &sel[..sel.find("\n}\n").unwrap()];
    assert!(sel.contains("static const tq_cuda_fa_kernel kernel = [")
        && sel.contains("tq_switch_get(TQ_SW_CUDA_FA)")
        && sel.contains("GGML_LOG_INFO(\"turboquant: CUDA flash-attention decode kernel for turbo K/V: %s"),
        "read once (function-local static) and logged once, in the form the GPU scripts grep for:\n{sel}");
    // the enum follows the row's value order ("gqa|vec")
    assert!(
        fattn.contains("enum tq_cuda_fa_kernel { TQ_CUDA_FA_GQA = 0, TQ_CUDA_FA_VEC = 1 };"),
        "tq_cuda_fa_kernel's values are the row's indices"
    );
    let row = turboquant_codec::switches::ggml_row("TQ_CUDA_FA");
    assert_eq!(
        row.values,
        [vec!["gqa".to_string()], vec!["vec".to_string()]]
    );
    let case = &fattn[fattn
        .find("#define TQ_FATTN_VEC_CASE_D(D, K, V)")
        .expect("TQ_FATTN_VEC_CASE_D")..];
    let case = &case[..case.find("\n\n").unwrap()];
    assert!(
        case.contains("return tq_fattn_turbo_case<D, GGML_TYPE_##K, GGML_TYPE_##V>;"),
        "TQ_FATTN_VEC_CASE_D hands out the selecting wrapper:\n{case}"
    );
    let wrap = &fattn[fattn
        .find("static void tq_fattn_turbo_case(")
        .expect("tq_fattn_turbo_case")..];
    let wrap = &wrap[..wrap.find("\n}\n").unwrap()];
    for want in [
        "tq_cuda_fa_selected() == TQ_CUDA_FA_GQA",
        "tq_fattn_gqa_case<D, type_K, type_V>",
        "ggml_cuda_flash_attn_ext_vec_case<D, type_K, type_V>",
        "!tq_cuda_fa_needs_gqa(dst)",
    ] {
        assert!(
            wrap.contains(want),
            "tq_fattn_turbo_case lacks {want}:\n{wrap}"
        );
    }
    // a mask per head (the lowered turbo K terms) and more than 2 queries are read by the GQA
    // kernel only: it reads the head's mask row and takes queries in tiles
    assert!(
        gqa.contains("int64_t(nb32)*(vec_head(my_v) % ne32)"),
        "the GQA kernel reads the mask row of its head"
    );
    assert!(
        gqa.contains("KV_max && ne32 <= 1"),
        "head 0's KV_max is not taken for a mask per head"
    );
    for d in ["64", "128", "256"] {
        assert!(
            fattn.contains(&format!(
                "extern template void tq_fattn_gqa_case<{d:>3}, GGML_TYPE_##K, GGML_TYPE_##V>"
            )),
            "extern declaration of the GQA instances at head size {d}"
        );
    }
    assert!(gqa.contains("#define TQ_DECL_FATTN_GQA_CASE(D, type_K, type_V)"));
    // One generated GQA instance file per pair, inside the loop over TQ_CUDA_FA_PAIRS, with a
    // case per compiled head size.
    let lp = &cmake[cmake
        .find("foreach (PAIR IN LISTS TQ_CUDA_FA_PAIRS)")
        .expect("pair loop")..];
    let lp = &lp[..lp.find("endforeach()\ntarget_sources").expect("loop end")];
    for want in [
        "fattn-gqa-instance-${PAIR}.cu",
        "string(REPLACE \"DECL_FATTN_VEC_CASE\" \"TQ_DECL_FATTN_GQA_CASE\" CASES \"${CASES}\")",
        "#include \\\"tq-fattn-gqa.cuh\\\"",
        "list(APPEND TQ_CUDA_FA_SRCS \"${SRC}\")",
    ] {
        assert!(
            lp.contains(want),
            "turboquant-cuda.cmake pair loop lacks {want}:\n{lp}"
        );
    }
    // The parity test runs the GQA kernel's row decode on the host (and on the device).
    let parity = read("ggml-ext/ggml-cuda/tq-parity.cu");
    assert!(
        parity.contains("#include \"tq-fattn-gqa-decode.cuh\"")
            && parity.contains("host_gqa_dequantize<bits>")
            && parity.contains("gqa_dequantize_kernel<bits><<<")
    );
}

// The GPU scripts (scripts/gpu-check.sh, scripts/gpu-bench.sh) run on a machine this test
// never sees; their control flow, parsing and exit status are checked here against stand-in
// tools (TQ_GPU_PREBUILT=1 skips the build and uses TQ_GPU_BUILD/bin).
mod gpu_scripts {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tq-gpu-scripts-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("bin")).unwrap();
        d
    }

    fn tool(dir: &Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Runs a script under `timeout 120` with the stand-ins; returns (exit code, summary.txt).
    fn run(script: &str, d: &Path, envs: &[(&str, String)]) -> (i32, String) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = d.join("out");
        let path = format!(
            "{}:{}",
            d.join("bin").display(),
            std::env::var("PATH").unwrap()
        );
        let mut c = Command::new("timeout");
        c.arg("120").arg(root.join(script)).arg(&out);
        c.env("PATH", path)
            .env("TQ_GPU_PREBUILT", "1")
            .env("TQ_GPU_BUILD", d);
        c.env("TQ_GPU_WORK", d.join("work")).env_remove("OUT");
        for (k, v) in envs {
            c.env(k, v);
        }
        let st = c.output().expect("run script");
        assert_ne!(st.status.code(), Some(124), "{script} timed out");
        let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap_or_default();
        (st.status.code().unwrap_or(-1), summary)
    }

    // The quality step's runs (ubatch 32): CUDA0 logs the lowered terms (unless NOT_LOWERED)
    // and gives CUDA_KLD, the CPU 0.0127 native and 0.0119 lowered (the measured values).
    const PERPLEXITY: &str = r#"kv=; for a in "$@"; do [ "$prev" = -ctk ] && kv=$a; prev=$a; done
if [[ " $* " == *" -ub 32 "* && " $* " == *" --kl-divergence "* ]]; then
  m=0.012700; [ "$TQ_K_TERMS" = lowered ] && m=0.011900
  if [[ " $* " == *" -ngl 99 "* ]]; then m=${CUDA_KLD:-0.012000}
    [ -n "$NOT_LOWERED" ] || echo "llama_kv_cache: turbo K terms: 10 layer(s) on CUDA0, whose flash attention does not take them (tq-fa-contract.h), take them as a mask per head"; fi
  printf 'Mean    KLD:   %s ±   0.000500\n' $m
elif [[ " $* " == *" --kl-divergence "* ]]; then
  m=0.000000; [ "$kv" = "$RACY" ] && m=0.012345
  printf 'Mean    KLD:   %s ±   0.000000\nMaximum KLD:   %s\nSame top p: 100.000 ± 0.000 %%\n' $m $m
else echo "Final estimate: PPL = 51234.5678 +/- 12.34567"; fi"#;

    const BENCH: &str = r#"kv=; for a in "$@"; do [ "$prev" = -ctk ] && kv=$a; prev=$a; done
for d in 0 32768; do for t in "512 0" "0 128"; do set -- $t
  echo "{\"type_k\": \"$kv\", \"type_v\": \"$kv\", \"n_prompt\": $1, \"n_gen\": $2, \"n_depth\": $d, \"avg_ts\": 100.0, \"stddev_ts\": 1.0}"
done; done"#;

    // Logs the decode kernel as the real one does (WRONG_KERNEL: a build that ignores
    // TQ_CUDA_FA).
    const BACKEND_OPS: &str = r#"echo "turboquant: CUDA flash-attention decode kernel for turbo K/V: ${WRONG_KERNEL:-${TQ_CUDA_FA:-gqa}} (TQ_CUDA_FA)" >&2
if [ "$1" = perf ]; then
  echo "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,1],kv=32768,nb=1,type_K=turbo4,type_V=turbo4): 100 runs - 12.00 us/run - 17000 kB/run - 1400.00 GB/s"
  exit 0; fi
for i in 1 2 3 4 5; do echo "  FLASH_ATTN_EXT(hsk=128,type_K=turbo4,type_V=turbo4,case=$i): OK"; done
[ -n "$UNSUPPORTED" ] && echo "  MUL_MAT(type_a=turbo2,prec=f32): not supported [CUDA0]"
exit 0"#;

    fn stand_ins(d: &Path) {
        let bin = d.join("bin");
        tool(&bin, "llama-perplexity", PERPLEXITY);
        tool(&bin, "llama-bench", BENCH);
        tool(&bin, "test-backend-ops", BACKEND_OPS);
        tool(
            &bin,
            "nvcc",
            r#"[ "$1" = --version ] && { echo "release 13.0 (stand-in)"; exit 0; }
o=; for a in "$@"; do [ "$prev" = -o ] && o=$a; prev=$a; done
printf '#!/bin/sh\necho "parity: identical (stand-in)"\n' > "$o"; chmod +x "$o""#,
        );
        tool(
            &bin,
            "compute-sanitizer",
            r#"[ -n "$SANITIZER_REFUSED" ] && { echo "Error: Device not supported"; exit 1; }
shift 4; "$@"; echo "========= ERROR SUMMARY: 0 errors""#,
        );
        std::fs::write(d.join("model.gguf"), b"stand-in").unwrap();
    }

    #[test]
    fn gpu_check_passes_and_fails_as_its_checks_do() {
        let d = scratch("check");
        stand_ins(&d);
        let (code, s) = run("scripts/gpu-check.sh", &d, &[]);
        assert_eq!(code, 0, "{s}");
        assert_eq!(s.matches("PASS compute-sanitizer").count(), 4, "{s}");
        // the GQA run also takes the fused K side's CUSTOM cases
        for (ops, fa) in [("FLASH_ATTN_EXT,CUSTOM", "gqa"), ("FLASH_ATTN_EXT", "vec")] {
            assert!(
                s.contains(&format!("{ops} turbo, TQ_CUDA_FA={fa}: 5 cases OK")),
                "{s}"
            );
        }
        let (code, s) = run(
            "scripts/gpu-check.sh",
            &d,
            &[("WRONG_KERNEL", "vec".into())],
        );
        assert_eq!(code, 1, "a run on the wrong decode kernel must fail: {s}");
        assert!(
            s.contains("TQ_CUDA_FA=gqa: rc=0, 5 OK, 0 failed or unsupported, kernel logged: vec"),
            "{s}"
        );
        // past the soft time limit the vec kernel's memcheck is skipped, and says so
        let (code, s) = run(
            "scripts/gpu-check.sh",
            &d,
            &[("TQ_GPU_SOFT_LIMIT_S", "-1".into())],
        );
        assert_eq!(code, 0, "{s}");
        assert_eq!(s.matches("PASS compute-sanitizer").count(), 3, "{s}");
        assert!(
            s.contains("SKIP compute-sanitizer memcheck, TQ_CUDA_FA=vec: past -1 s"),
            "{s}"
        );
        let (code, s) = run("scripts/gpu-check.sh", &d, &[("UNSUPPORTED", "1".into())]);
        assert_eq!(code, 1, "a turbo case the backend declines must fail: {s}");
        let (code, s) = run(
            "scripts/gpu-check.sh",
            &d,
            &[("SANITIZER_REFUSED", "1".into())],
        );
        assert_eq!(code, 0, "{s}");
        assert!(s.contains("SKIP compute-sanitizer refused"), "{s}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The tools built elsewhere (scripts/gpu-prebuild.sh): unpacked and used, without a
    /// build, when they were built from the packed sources; built there (here: a failing
    /// cmake on stand-in sources) when not.
    #[test]
    fn gpu_check_takes_prebuilt_tools_only_from_the_same_sources() {
        let d = scratch("prebuilt");
        stand_ins(&d);
        let pack = d.join("pack");
        std::fs::create_dir_all(&pack).unwrap();
        std::fs::write(pack.join("llama-src.tar.xz"), b"sources").unwrap();
        std::fs::write(pack.join("libturboquant_capi.a.xz"), b"codec").unwrap();
        // the archive: the stand-in tools plus tq-parity and the stamp, md5("sourcescodec")
        let stage = d.join("stage/bin");
        std::fs::create_dir_all(&stage).unwrap();
        for t in ["llama-perplexity", "llama-bench", "test-backend-ops"] {
            std::fs::copy(d.join("bin").join(t), stage.join(t)).unwrap();
        }
        tool(
            &stage,
            "tq-parity",
            r#"echo "parity: identical (prebuilt stand-in)""#,
        );
        let md5 = |s: &str| {
            let o = Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s '{s}' | md5sum | cut -d' ' -f1"))
                .output()
                .unwrap();
            String::from_utf8(o.stdout).unwrap()
        };
        let pack_archive = |stamp: &str| {
            std::fs::write(stage.join(".pack"), stamp).unwrap();
            let st = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "tar -C {} -cf - bin | xz > {}",
                    d.join("stage").display(),
                    pack.join("prebuilt-sm90.tar.xz").display()
                ))
                .status()
                .unwrap();
            assert!(st.success());
        };
        let build = d.join("build");
        let envs = |b: &Path| {
            vec![
                ("TQ_GPU_PACK", pack.display().to_string()),
                ("TQ_GPU_PREBUILT", "0".to_string()),
                ("TQ_GPU_BUILD", b.display().to_string()),
            ]
        };
        pack_archive(&md5("sourcescodec"));
        let (code, s) = run("scripts/gpu-check.sh", &d, &envs(&build));
        assert_eq!(code, 0, "{s}");
        assert!(
            s.contains("PASS build: prebuilt for sm_90 elsewhere"),
            "{s}"
        );
        assert!(
            s.contains("PASS tq-parity: parity: identical (prebuilt stand-in)"),
            "{s}"
        );
        // the check's own call carries only the archive and the recorded stamp (the sources do
        // not fit beside it): taken on a fresh machine, and a later call on the warm machine
        // (nothing of .gpu carried) uses what the first unpacked
        let srcs = [
            pack.join("llama-src.tar.xz"),
            pack.join("libturboquant_capi.a.xz"),
        ];
        for f in &srcs {
            std::fs::remove_file(f).unwrap();
        }
        std::fs::write(pack.join("sources.md5"), md5("sourcescodec")).unwrap();
        let (code, s) = run("scripts/gpu-check.sh", &d, &envs(&d.join("build-pre")));
        assert_eq!(code, 0, "{s}");
        assert!(
            s.contains("PASS build: prebuilt for sm_90 elsewhere (.gpu/prebuilt-sm90.tar.xz"),
            "{s}"
        );
        std::fs::remove_file(pack.join("prebuilt-sm90.tar.xz")).unwrap();
        let (code, s) = run("scripts/gpu-check.sh", &d, &envs(&d.join("build-pre")));
        assert_eq!(code, 0, "{s}");
        assert!(s.contains("unpacked by an earlier call"), "{s}");
        // no archive, no unpacked tools, no sources: a failed build that says what to carry
        let (code, s) = run("scripts/gpu-check.sh", &d, &envs(&d.join("build-none")));
        assert_eq!(code, 1, "{s}");
        assert!(s.contains("no sources to build"), "{s}");
        std::fs::remove_file(pack.join("sources.md5")).unwrap();
        std::fs::write(&srcs[0], b"sources").unwrap();
        std::fs::write(&srcs[1], b"codec").unwrap();
        // built from other sources: not taken
        pack_archive(&md5("other sources"));
        let (code, s) = run("scripts/gpu-check.sh", &d, &envs(&d.join("build2")));
        assert_eq!(code, 1, "{s}");
        assert!(
            s.contains("is from other sources than .gpu/llama-src.tar.xz; building here"),
            "{s}"
        );
        assert!(!s.contains("PASS build"), "{s}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn gpu_bench_detects_a_race_and_reports_targets() {
        let d = scratch("bench");
        stand_ins(&d);
        let model = ("TQ_GPU_MODEL", d.join("model.gguf").display().to_string());
        let no_q = (
            "TQ_GPU_QUALITY_MODEL",
            d.join("none.gguf").display().to_string(),
        );
        let (code, s) = run("scripts/gpu-bench.sh", &d, &[model.clone(), no_q.clone()]);
        assert_eq!(code, 0, "{s}");
        assert!(s.contains("SKIP quality: no "), "{s}");
        // the quality step: CUDA0 against the CPU's lowered form, within 1.15x
        let qm = d.join("q.gguf");
        std::fs::write(&qm, b"GGUF").unwrap();
        let q = ("TQ_GPU_QUALITY_MODEL", qm.display().to_string());
        let (code, s) = run("scripts/gpu-bench.sh", &d, &[model.clone(), q.clone()]);
        assert_eq!(code, 0, "{s}");
        assert!(
            s.contains("PASS quality turbo4/turbo3, ctx 4096: KLD CUDA0 0.012000, CPU lowered 0.011900, CPU native 0.012700 (0.945x the native)"),
            "{s}"
        );
        // the fitted mean's KLD (what CUDA ran before the lowering) fails, so does a log
        // without the lowered terms
        let (code, s) = run(
            "scripts/gpu-bench.sh",
            &d,
            &[model.clone(), q.clone(), ("CUDA_KLD", "0.015300".into())],
        );
        assert_eq!(code, 1, "{s}");
        assert!(
            s.contains("FAIL quality turbo4/turbo4, ctx 4096: KLD CUDA0 0.015300"),
            "{s}"
        );
        let (code, s) = run(
            "scripts/gpu-bench.sh",
            &d,
            &[model.clone(), q, ("NOT_LOWERED", "1".into())],
        );
        assert_eq!(code, 1, "{s}");
        assert!(
            s.contains("the log does not show the turbo K terms lowered on CUDA0"),
            "{s}"
        );
        assert!(
            s.contains("PASS race turbo4") && s.contains("PASS race turbo3"),
            "{s}"
        );
        assert!(s.contains("| turbo4 | 100.0 ± 1.0 |"), "{s}");
        assert!(
            s.contains("TARGET tg128 @ d32768 turbo4 / q8_0: 1.000x (target >= 1.2x): MISSED"),
            "{s}"
        );
        assert!(
            s.contains("gqa kv=32768 K=turbo4 V=turbo4: 100 runs"),
            "{s}"
        );
        assert!(
            s.contains("vec kv=32768 K=turbo4 V=turbo4: 100 runs"),
            "{s}"
        );
        let (code, s) = run(
            "scripts/gpu-bench.sh",
            &d,
            &[model.clone(), no_q.clone(), ("WRONG_KERNEL", "gqa".into())],
        );
        assert_eq!(code, 1, "timing the wrong decode kernel must fail: {s}");
        assert!(s.contains("TQ_CUDA_FA=vec (kernel logged: gqa)"), "{s}");
        let (code, s) = run(
            "scripts/gpu-bench.sh",
            &d,
            &[model, no_q, ("RACY", "turbo3".into())],
        );
        assert_eq!(code, 1, "{s}");
        assert!(s.contains("FAIL race turbo3: max KLD 0.012345"), "{s}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn gpu_check_dry_run_builds_the_reduced_instance_set() {
        let d = scratch("dry");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = d.join("out");
        let st = Command::new("timeout")
            .arg("60")
            .arg(root.join("scripts/gpu-check.sh"))
            .arg("--dry-run")
            .arg(&out)
            .env_remove("OUT")
            .env("TQ_GPU_BUILD", &d)
            .env("TQ_GPU_WORK", d.join("work"))
            .output()
            .unwrap();
        assert_eq!(st.status.code(), Some(0));
        let cmds = std::fs::read_to_string(out.join("dry-run.txt")).unwrap();
        for want in [
            "-DCMAKE_CUDA_ARCHITECTURES=90",
            "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0",
            "-DTQ_CUDA_FA_HEAD_SIZES=64;128",
            "--target test-backend-ops llama-bench llama-perplexity",
            "-o SET_ROWS,GET_ROWS,CPY,MUL_MAT,FLASH_ATTN_EXT,CUSTOM -p turbo|tq_rf_keep=1",
            "--tool memcheck",
            "--tool synccheck",
        ] {
            assert!(cmds.contains(want), "dry run lacks {want}:\n{cmds}");
        }
        // FLASH_ATTN_EXT correctness with both decode kernels
        for fa in ["gqa", "vec"] {
            assert!(
                cmds.lines()
                    .any(|l| l.starts_with(&format!("+ TQ_CUDA_FA={fa} "))
                        && l.contains("test-backend-ops test -b CUDA0 -o")
                        && l.contains("FLASH_ATTN_EXT")
                        && l.contains(" -p turbo")),
                "dry run lacks the FA cases with TQ_CUDA_FA={fa}:\n{cmds}"
            );
        }
        for (fa, tool) in [
            ("gqa", "memcheck"),
            ("gqa", "synccheck"),
            ("vec", "memcheck"),
        ] {
            assert!(
                cmds.lines()
                    .any(|l| l.starts_with(&format!("+ TQ_CUDA_FA={fa} "))
                        && l.contains(&format!("compute-sanitizer --tool {tool} "))),
                "dry run lacks {tool} with TQ_CUDA_FA={fa}:\n{cmds}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// Programmatic dependent launch (Hopper) lets a kernel start while the previous one still
/// writes its inputs, so a kernel's pointer parameters must not be `__restrict__`: upstream
/// removed it from its flash-attention kernels for that race and takes restrict-qualified
/// locals through `GGML_CUDA_RESTRICT` (common.cuh), which is empty where PDL runs (in the
/// device pass only, so it cannot qualify a parameter: host and device stubs would differ).
/// Ours follow the same rule: no `__global__` signature in ggml-ext/ggml-cuda carries either.
#[test]
fn cuda_kernel_parameters_are_not_restrict_under_pdl() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ggml-ext/ggml-cuda");
    let mut kernels = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let src = std::fs::read_to_string(e.path()).unwrap();
        let mut rest = src.as_str();
        while let Some(at) = rest.find("__global__") {
            let sig = &rest[at..];
            let end = sig.find('{').expect("a kernel body");
            assert!(
                !sig[..end].contains("__restrict__") && !sig[..end].contains("GGML_CUDA_RESTRICT"),
                "{}: a kernel's parameters are __restrict__ (use GGML_CUDA_RESTRICT locals):\n{}",
                e.path().display(),
                &sig[..end]
            );
            kernels += 1;
            rest = &sig[end..];
        }
    }
    assert!(
        kernels >= 1,
        "no __global__ kernel found under {}",
        dir.display()
    );
}
