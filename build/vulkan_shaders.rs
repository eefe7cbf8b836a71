//! ggml-vulkan's generated shaders (`--features vulkan`), cached by a hash of their sources.
//!
//! ggml-vulkan's build runs vulkan-shaders-gen, which compiles every shader variant with glslc
//! (over a thousand SPIR-V modules) and writes them as C++ arrays, one `<shader>.comp.cpp` per
//! source, plus `ggml-vulkan-shaders.hpp`. ccache covers the C++ compile of those files, not
//! glslc: in a fresh build directory the generation takes about two minutes on 2 cores even
//! with a warm ccache (docs/VULKAN.md). So, like the web UI (build/ui.rs), the generated files
//! are kept in `<cache>/vulkan-shaders/<key>.tar.gz`, where the key hashes every file of
//! `ggml/src/ggml-vulkan/vulkan-shaders` (the .comp/.glsl sources and the generator), of our
//! shaders and the generated tables they include (`ggml-ext/ggml-vulkan/shaders`,
//! `ggml-ext/abi`: upstream's flash attention shaders include our turbo decode) and
//! `glslc --version` (which decides the optional GLSL extensions, and so the variants).
//!
//! `restore` runs after cmake's configure step: a build directory without the generated files
//! gets them from the cache, stamped now, so make finds them newer than their sources and
//! skips glslc; ccache then hits on their C++. Their dependency files (the .glsl each shader
//! includes) come along, rewritten to this tree's paths, so a later edit of an included file
//! still regenerates what includes it. `store` runs after a successful build and keeps the
//! files of a key not yet cached (and only the newest `KEEP` keys). `TQ_VULKAN_SHADER_CACHE=off`
//! turns both off.

use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Cached keys kept (one per shader-source version and glslc; older ones are removed).
const KEEP: usize = 3;
/// Bumped when what is cached, or how, changes.
const FORMAT: &str = "turboquant vulkan-shaders cache v2";
/// Placeholders for the two trees' paths in the cached dependency files.
const SRC_MARK: &str = "@TQ_VULKAN_SHADERS_SRC@";
const OUT_MARK: &str = "@TQ_VULKAN_SHADERS_OUT@";
const EXT_MARK: &str = "@TQ_GGML_EXT@";

/// Our `ggml-ext` folder, whose shaders and tables upstream's shaders include.
fn ext_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ggml-ext")
}

fn enabled() -> bool {
    println!("cargo:rerun-if-env-changed=TQ_VULKAN_SHADER_CACHE");
    std::env::var("TQ_VULKAN_SHADER_CACHE").map_or(true, |v| v != "off")
}

/// ggml-vulkan's folder in the llama.cpp tree and in the build directory.
fn dirs(src: &Path, build_dir: &Path) -> (PathBuf, PathBuf) {
    (
        src.join("ggml/src/ggml-vulkan"),
        build_dir.join("ggml/src/ggml-vulkan"),
    )
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let rd = fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

/// The cache key: the shader sources (upstream's and ours), the generator and glslc's version.
fn key(vk_src: &Path) -> Result<String, String> {
    let ext = ext_dir();
    let mut h = Sha256::new();
    h.update(FORMAT.as_bytes());
    for (label, dir) in [
        ("upstream", vk_src.join("vulkan-shaders")),
        ("ext-shaders", ext.join("ggml-vulkan/shaders")),
        ("ext-abi", ext.join("abi")),
    ] {
        let mut files = Vec::new();
        files_under(&dir, &mut files)?;
        files.sort();
        for f in &files {
            let rel = f.strip_prefix(&dir).unwrap().to_string_lossy().into_owned();
            let body = fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            h.update(label.as_bytes());
            h.update(rel.as_bytes());
            h.update([0]);
            h.update((body.len() as u64).to_le_bytes());
            h.update(&body);
        }
    }
    let glslc = Command::new("glslc")
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run glslc --version: {e}"))?;
    h.update(&glslc.stdout);
    Ok(format!("{:x}", h.finalize())[..24].to_string())
}

fn cache() -> PathBuf {
    super::cache_dir::cache_dir().join("vulkan-shaders")
}

/// The generated files in the build directory: every `*.comp.cpp`, its `.d`, and the header.
fn generated(vk_out: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(vk_out)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".comp.cpp") || n.ends_with(".comp.cpp.d"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.push("ggml-vulkan-shaders.hpp".into());
    v
}

fn sh(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Rewrites every dependency file in `dir` from one set of tree paths to the other.
fn rewrite_deps(
    dir: &Path,
    names: &[String],
    from: [&str; 3],
    to: [&str; 3],
) -> Result<(), String> {
    for n in names.iter().filter(|n| n.ends_with(".d")) {
        let p = dir.join(n);
        let text =
            fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let text = text
            .replace(from[0], to[0])
            .replace(from[1], to[1])
            .replace(from[2], to[2]);
        fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Before the build: a build directory without the generated shaders gets them from the cache.
pub fn restore(src: &Path, build_dir: &Path) -> Result<(), String> {
    if !enabled() {
        return Ok(());
    }
    let (vk_src, vk_out) = dirs(src, build_dir);
    if vk_out.join("ggml-vulkan-shaders.hpp").exists() || !vk_out.is_dir() {
        return Ok(()); // generated here already (make keeps them current), or not configured
    }
    let key = key(&vk_src)?;
    let archive = cache().join(format!("{key}.tar.gz"));
    if !archive.exists() {
        return Ok(());
    }
    let t = std::time::Instant::now();
    // used now: the newest for prune()
    if let Ok(f) = fs::File::options().append(true).open(&archive) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
    // --touch: stamped now, newer than every source, so make takes them as they are
    sh(
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("--touch")
            .arg("-C")
            .arg(&vk_out),
        "restoring the cached Vulkan shaders",
    )?;
    let names = generated(&vk_out);
    rewrite_deps(
        &vk_out,
        &names,
        [SRC_MARK, OUT_MARK, EXT_MARK],
        [
            &vk_src.to_string_lossy(),
            &vk_out.to_string_lossy(),
            &ext_dir().to_string_lossy(),
        ],
    )?;
    println!(
        "cargo:warning=turboquant: ggml-vulkan's generated shaders restored from {} in {:.1} s \
         (no glslc run; TQ_VULKAN_SHADER_CACHE=off regenerates them)",
        archive.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// After a successful build: keep the generated shaders of a key not cached yet.
pub fn store(src: &Path, build_dir: &Path) -> Result<(), String> {
    if !enabled() {
        return Ok(());
    }
    let (vk_src, vk_out) = dirs(src, build_dir);
    if !vk_out.join("ggml-vulkan-shaders.hpp").exists() {
        return Ok(());
    }
    let key = key(&vk_src)?;
    let dir = cache();
    let archive = dir.join(format!("{key}.tar.gz"));
    if archive.exists() {
        return Ok(());
    }
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // a private copy of the dependency files with the trees' paths made neutral
    let stage = dir.join(format!("stage-{}", std::process::id()));
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&stage).map_err(|e| format!("cannot create {}: {e}", stage.display()))?;
    let names = generated(&vk_out);
    let res = (|| {
        for n in names.iter().filter(|n| n.ends_with(".d")) {
            fs::copy(vk_out.join(n), stage.join(n)).map_err(|e| format!("cannot copy {n}: {e}"))?;
        }
        rewrite_deps(
            &stage,
            &names,
            [
                &vk_src.to_string_lossy(),
                &vk_out.to_string_lossy(),
                &ext_dir().to_string_lossy(),
            ],
            [SRC_MARK, OUT_MARK, EXT_MARK],
        )?;
        let tmp = dir.join(format!(".{key}.tar.gz.{}", std::process::id()));
        let mut tar = Command::new("tar");
        tar.arg("-czf").arg(&tmp);
        tar.arg("-C").arg(&vk_out);
        tar.args(names.iter().filter(|n| !n.ends_with(".d")));
        tar.arg("-C").arg(&stage);
        tar.args(names.iter().filter(|n| n.ends_with(".d")));
        let made = sh(&mut tar, "caching the Vulkan shaders");
        let made = made.and_then(|_| {
            fs::rename(&tmp, &archive)
                .map_err(|e| format!("cannot keep {}: {e}", archive.display()))
        });
        let _ = fs::remove_file(&tmp);
        made
    })();
    let _ = fs::remove_dir_all(&stage);
    res?;
    prune(&dir);
    Ok(())
}

/// Only the newest `KEEP` archives stay.
fn prune(dir: &Path) {
    let mut v: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
                .filter_map(|p| Some((fs::metadata(&p).ok()?.modified().ok()?, p)))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.reverse();
    for (_, p) in v.into_iter().skip(KEEP) {
        let _ = fs::remove_file(p);
    }
}
