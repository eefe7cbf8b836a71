//! Configure and build the patched llama.cpp's libraries with cmake, then hand rustc the
//! exact link line cmake would have used for each tool's executable.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The tools we ship: (binary name, its `*-impl` target, the cmake dir of its executable).
pub const TOOLS: &[(&str, &str, &str)] = &[
    ("llama-server", "llama-server-impl", "tools/server"),
    ("llama-cli", "llama-cli-impl", "tools/cli"),
    ("llama-bench", "llama-bench-impl", "tools/llama-bench"),
    (
        "llama-perplexity",
        "llama-perplexity-impl",
        "tools/perplexity",
    ),
];

/// True when the crate is built with `--features cuda`.
pub fn cuda() -> bool {
    std::env::var_os("CARGO_FEATURE_CUDA").is_some()
}

/// True when the crate is built with `--features vulkan`.
pub fn vulkan() -> bool {
    std::env::var_os("CARGO_FEATURE_VULKAN").is_some()
}

/// One build directory per target dir and backend set, shared by every profile:
/// llama.cpp is always built in Release, and ccache makes rebuilds cheap. The CUDA and
/// Vulkan builds have their own directories (`llama.cpp-build-cuda`, `-vulkan`,
/// `-cuda-vulkan`), so switching features never reconfigures another.
pub fn build_dir(root: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=TQ_LLAMA_BUILD_DIR");
    if let Some(d) = std::env::var_os("TQ_LLAMA_BUILD_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        root.join(target)
    };
    let mut name = String::from("llama.cpp-build");
    if cuda() {
        name += "-cuda";
    }
    if vulkan() {
        name += "-vulkan";
    }
    target.join(name)
}

/// cmake arguments of the CUDA build (`--features cuda`): GGML_CUDA with our kernels
/// (ggml-ext/ggml-cuda, hooked in by the patch). TQ_CUDA_ROOT names a toolkit root (for example
/// the one scripts/cuda-toolkit.sh assembles from PyPI wheels); TQ_CUDA_ARCHS the
/// architectures (default: `native` when a GPU is visible, else 90, the H100/H200).
fn cuda_args() -> Vec<String> {
    // upstream's flash-attention pairs stay its default; ours come from turboquant-cuda.cmake
    let mut a = vec!["-DGGML_CUDA=ON".to_string()];
    let archs = std::env::var("TQ_CUDA_ARCHS").unwrap_or_else(|_| {
        let gpu = Command::new("nvidia-smi")
            .arg("-L")
            .output()
            .map(|o| o.status.success() && !o.stdout.is_empty())
            .unwrap_or(false);
        if gpu { "native" } else { "90" }.to_string()
    });
    println!("cargo:warning=turboquant: CUDA build for architectures {archs} (TQ_CUDA_ARCHS)");
    a.push(format!("-DCMAKE_CUDA_ARCHITECTURES={archs}"));
    if let Some(r) = std::env::var_os("TQ_CUDA_ROOT") {
        let r = PathBuf::from(r);
        a.push(format!("-DCUDAToolkit_ROOT={}", r.display()));
        a.push(format!(
            "-DCMAKE_CUDA_COMPILER={}",
            r.join("bin/nvcc").display()
        ));
    }
    a
}

/// cmake arguments of the Vulkan build (`--features vulkan`): ggml-vulkan, whose shaders
/// vulkan-shaders-gen compiles with glslc at build time. ggml-vulkan's CMakeLists test-compiles
/// one shader per optional GLSL extension (cooperative matrix 1/2, integer dot, bf16, fp8/fp4)
/// and turns each off when glslc says "extension not supported", as Debian 12's glslc 2023.2
/// does for all of them: only the scalar shader paths are built, which every device runs.
/// What the Vulkan device runs of ours, and refuses: ggml-ext/ggml-vulkan/tq-vulkan.h.
fn vulkan_args() -> Result<Vec<String>, String> {
    super::vendor::require_tool(
        "glslc",
        "Debian: apt-get install glslc libvulkan-dev spirv-headers",
    )?;
    let headers = [
        "/usr/include/vulkan/vulkan.hpp",
        "/usr/local/include/vulkan/vulkan.hpp",
    ];
    if std::env::var_os("VULKAN_SDK").is_none() && !headers.iter().any(|h| Path::new(h).exists()) {
        return Err("the vulkan feature needs the Vulkan headers and loader \
                    (Debian: apt-get install libvulkan-dev glslc spirv-headers), or VULKAN_SDK"
            .into());
    }
    println!("cargo:rerun-if-env-changed=VULKAN_SDK");
    Ok(vec!["-DGGML_VULKAN=ON".to_string()])
}

/// Compiler flags that keep upstream's AMX matmul out of the build. GGML_NATIVE compiles
/// ggml-cpu with -march=native, which on an AMX Xeon defines __AMX_INT8__ and turns on
/// ggml's AMX weight-repack path (ggml-cpu/amx/); that path crashes at the first decode of
/// the pinned llama.cpp (issue 12; upstream's report was closed without a fix). -mno-amx-*
/// wins over -march whatever their order, so every other native instruction set (AVX-512,
/// VNNI, and ggml's AVX-512 repack) stays on. The tools say so at start-up
/// (src/bin/shared/c_main.rs) and tests/no_amx.rs checks the build holds no AMX code.
/// An explicit CFLAGS/CXXFLAGS from the environment is kept in front.
pub const NO_AMX_FLAGS: &str = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";

fn no_amx_args() -> Vec<String> {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return Vec::new();
    }
    println!("cargo:rerun-if-env-changed=CFLAGS");
    println!("cargo:rerun-if-env-changed=CXXFLAGS");
    let with = |var: &str| {
        let user = std::env::var(var).unwrap_or_default();
        format!("{user} {NO_AMX_FLAGS}").trim().to_string()
    };
    vec![
        format!("-DCMAKE_C_FLAGS={}", with("CFLAGS")),
        format!("-DCMAKE_CXX_FLAGS={}", with("CXXFLAGS")),
    ]
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        let tail = |b: &[u8]| {
            let s = String::from_utf8_lossy(b).into_owned();
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(60)..].join("\n")
        };
        return Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        ));
    }
    Ok(())
}

pub fn build(root: &Path, src: &Path, build_dir: &Path) -> Result<(), String> {
    super::vendor::require_tool("cmake", "Debian: apt-get install cmake")?;
    super::vendor::require_tool("c++", "Debian: apt-get install g++")?;
    super::vendor::require_tool("make", "Debian: apt-get install make")?;
    std::fs::create_dir_all(build_dir)
        .map_err(|e| format!("cannot create {}: {e}", build_dir.display()))?;

    let ext = root.join("ggml-ext");
    let mut cfg = Command::new("cmake");
    cfg.arg("-S").arg(src).arg("-B").arg(build_dir).args([
        "-G",
        "Unix Makefiles",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DGGML_OPENMP=OFF",
        "-DGGML_CCACHE=ON",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DTQ_BUILD_TESTS=ON",
        // ggml's RPC backend (`--rpc HOST:PORT` in every tool) and ggml-rpc-server
        "-DGGML_RPC=ON",
        "-DGGML_RPC_RDMA=OFF",
        "-DTQ_BUILD_RPC_SERVER=ON",
    ]);
    cfg.arg(format!("-DTQ_EXT_DIR={}", ext.display()));
    cfg.args(no_amx_args());
    if cuda() {
        cfg.args(cuda_args());
    }
    if vulkan() {
        cfg.args(vulkan_args()?);
    }
    run(&mut cfg, "cmake configure of llama.cpp")?;
    // a fresh build directory takes ggml-vulkan's generated shaders from the cache (a cache
    // that fails is only a slower build)
    let shader_cache = |r: Result<(), String>| {
        if let Err(e) = r {
            println!("cargo:warning=turboquant: Vulkan shader cache: {e}");
        }
    };
    if vulkan() {
        shader_cache(super::vulkan_shaders::restore(src, build_dir));
    }

    let jobs = std::env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    let mut b = Command::new("cmake");
    b.arg("--build")
        .arg(build_dir)
        .args(["--config", "Release", "-j", &jobs, "--target"]);
    for (_, imp, _) in TOOLS {
        b.arg(imp);
    }
    b.arg("tq-ggml-tests").arg("tq-rpc-server-impl");
    run(&mut b, "cmake build of llama.cpp")?;
    if vulkan() {
        shader_cache(super::vulkan_shaders::store(src, build_dir));
    }
    Ok(())
}

/// Turns cmake's link command for `exe` (link.txt of the Makefile generator) into the
/// archives and system libraries rustc must add, in cmake's order.
fn link_inputs(build_dir: &Path, dir: &str, exe: &str) -> Result<Vec<String>, String> {
    let base = build_dir.join(dir);
    let path = base.join(format!("CMakeFiles/{exe}.dir/link.txt"));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for tok in text.split_whitespace().skip(1) {
        let shared = tok.ends_with(".so") || tok.contains(".so.");
        if tok.ends_with(".a") || shared {
            let p = base.join(tok);
            let p = p
                .canonicalize()
                .map_err(|e| format!("{} (from {}): {e}", p.display(), path.display()))?;
            if shared {
                // CUDA runtime, cuBLAS, driver: found at run time where they were at link time
                if let Some(dir) = Path::new(tok).parent().filter(|d| d.is_absolute()) {
                    out.push(format!("-Wl,-rpath,{}", dir.display()));
                }
            }
            out.push(p.display().to_string());
        } else if tok.starts_with("-l")
            || tok.starts_with("-L")
            || tok == "-pthread"
            || tok == "-fopenmp"
        {
            out.push(tok.to_string());
        }
    }
    Ok(out)
}

/// System libraries every C++ executable of llama.cpp needs.
const SYS: [&str; 4] = ["-lstdc++", "-lm", "-ldl", "-lpthread"];

pub fn emit_link_args(build_dir: &Path) -> Result<(), String> {
    for (bin, _, dir) in TOOLS {
        for a in link_inputs(build_dir, dir, bin)?
            .iter()
            .map(String::as_str)
            .chain(SYS)
        {
            println!("cargo:rustc-link-arg-bin={bin}={a}");
        }
    }
    // `tq` (crates/tq) calls libllama itself (`tq capture`): llama-perplexity's link line
    // without the tool's own `*-impl` archive is exactly libllama + ggml + what they need.
    // Link arguments do not pass to dependents, so they go to tq's build script through
    // this package's `links` metadata (DEP_LLAMA_LINK_ARGS_FILE), one argument per line.
    let libllama: Vec<String> = link_inputs(build_dir, "tools/perplexity", "llama-perplexity")?
        .into_iter()
        .filter(|a| !a.ends_with("-impl.a"))
        .chain(SYS.map(String::from))
        .collect();
    let file = Path::new(&std::env::var("OUT_DIR").unwrap()).join("libllama-link-args.txt");
    std::fs::write(&file, libllama.join("\n"))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    println!("cargo:link_args_file={}", file.display());
    // ggml-rpc-server: upstream's tools/rpc/rpc-server.cpp built as a library whose `main`
    // is renamed (ggml-ext/cmake/turboquant.cmake), linked with ggml and this crate.
    for a in ggml_link(build_dir, "libtq-rpc-server-impl.a")? {
        println!("cargo:rustc-link-arg-bin=ggml-rpc-server={a}");
    }
    // Tests and benches: our ggml-level test library and ggml itself.
    for a in ggml_link(build_dir, "libtq-ggml-tests.a")? {
        println!("cargo:rustc-link-arg-tests={a}");
        println!("cargo:rustc-link-arg-benches={a}");
    }
    Ok(())
}

/// `first` (an archive of ggml/src) followed by what a llama.cpp tool links (ggml, its
/// backends, CUDA's libraries when built with them), in link order; the archive must exist.
fn ggml_link(build_dir: &Path, first: &str) -> Result<Vec<String>, String> {
    let p = build_dir.join("ggml/src").join(first);
    if !p.exists() {
        return Err(format!("expected {} after the cmake build", p.display()));
    }
    let mut out = vec![p.display().to_string()];
    out.extend(
        link_inputs(build_dir, "tools/perplexity", "llama-perplexity")?
            .into_iter()
            .filter(|a| !a.ends_with("-impl.a")),
    );
    out.extend(SYS.map(String::from));
    Ok(out)
}
