//! A fetched model is the pinned one on every use: `tq fetch` refuses a cached GGUF whose
//! sha256 differs from the pin (a corrupted or swapped file) instead of running with it.

mod support;

use std::process::Command;
use support::{bin, run_for, text};

#[test]
fn a_cached_model_with_another_sha256_is_refused() {
    let cache = std::env::temp_dir().join(format!("tq-rel-models-{}", std::process::id()));
    let models = cache.join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(
        models.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        b"GGUF not the model",
    )
    .unwrap();
    let o = run_for(
        Command::new(bin("tq"))
            .arg("fetch")
            .env("TQ_CACHE_DIR", &cache),
        60,
    );
    let t = text(&o);
    assert!(
        !o.status.success(),
        "tq fetch accepted a swapped model: {t}"
    );
    assert!(t.contains("pinned to b179c952"), "unclear error: {t}");
    let _ = std::fs::remove_dir_all(&cache);
}
