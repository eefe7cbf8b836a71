//! Where turboquant caches downloads (the pinned llama.cpp sdist, models, ccache) across
//! builds and fresh clones: `$TQ_CACHE_DIR`, else `$XDG_CACHE_HOME/turboquant`, else
//! `~/.cache/turboquant`. One definition for the root package's build script (a
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
