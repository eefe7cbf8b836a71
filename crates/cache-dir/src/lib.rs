//! Where turboquant caches downloads (the pinned llama.cpp sdist, models, ccache, the Python
//! environment of the GGUF scripts) across builds and fresh clones: `$TQ_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/turboquant`, else `~/.cache/turboquant`. One definition for the root package's build script (a
//! build-dependency: it materialises llama.cpp there), its library (re-exported as
//! `turboquant::cache_dir`), `tq` and the tests.

use std::path::PathBuf;

pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TQ_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache"))
        .join("turboquant")
}

/// The Python that vendor/llama.cpp/gguf-py needs (numpy, pyyaml), for the scripts that
/// write GGUF files (scripts/transform_gguf.py, random_gguf.py): a virtualenv made once under
/// `<cache>/venv/`, its versions pinned, marked complete only after pip succeeded. Used by
/// `tq fetch` for derived models and by the tests for their random ones.
pub const GGUF_PY_VENV: &str = "gguf-numpy-2.2.6-pyyaml-6.0.2";
pub const GGUF_PY_PKGS: &[&str] = &["numpy==2.2.6", "pyyaml==6.0.2"];

/// A virtualenv `<cache>/venv/<tag>` with `pkgs` (pinned `name==version`); returns its python.
/// Made under a name of this process and renamed into place once pip is done, so processes
/// that make it at once (parallel tests, two `tq fetch`) never use or clobber a half-made one.
pub fn python_venv(tag: &str, pkgs: &[&str]) -> Result<PathBuf, String> {
    let root = cache_dir().join("venv");
    let dir = root.join(tag);
    let py = dir.join("bin/python");
    if py.exists() && dir.join(".complete").exists() {
        return Ok(py);
    }
    let tmp = root.join(format!(".{tag}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let made = run_tool(
        std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&tmp),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    )
    .and_then(|_| {
        run_tool(
            std::process::Command::new(tmp.join("bin/python"))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(pkgs),
            &format!("pip install {}", pkgs.join(" ")),
        )
    })
    .and_then(|_| {
        std::fs::write(tmp.join(".complete"), pkgs.join("\n")).map_err(|e| e.to_string())
    });
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // an unfinished one from an interrupted run goes; a finished one from another process stays
    if dir.exists() && !dir.join(".complete").exists() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if py.exists() && dir.join(".complete").exists() {
        Ok(py)
    } else {
        Err(format!("{} is not a finished virtualenv", dir.display()))
    }
}

/// Runs `cmd` to the end; an error names `what` and carries its stderr. For the downloads and
/// scripts that fill the cache (python_venv here, `tq fetch`).
pub fn run_tool(cmd: &mut std::process::Command, what: &str) -> Result<(), String> {
    let o = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", cmd.get_program()))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}
