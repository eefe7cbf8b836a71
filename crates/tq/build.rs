//! `tq capture` calls libllama: link `tq` with the libraries the root package's build
//! script built, whose link line it hands over as `links` metadata (build/cmake.rs).
//! It also takes the web UI state (`TQ_WEB_UI_STATE`) that `tq serve` reports. Without the
//! `llama` feature there is nothing to link and no web UI.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_LINK_ARGS_FILE");
    if std::env::var_os("CARGO_FEATURE_LLAMA").is_none() {
        return;
    }
    let Some(file) = std::env::var_os("DEP_LLAMA_LINK_ARGS_FILE") else {
        panic!("turboquant (root package) did not report libllama's link line");
    };
    println!("cargo:rerun-if-changed={}", file.to_string_lossy());
    // what `tq serve` says about llama-server's web UI: embedded, or why not (build/ui.rs)
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_WEB_UI_STATE");
    if let Some(state) = std::env::var_os("DEP_LLAMA_WEB_UI_STATE") {
        println!(
            "cargo:rustc-env=TQ_WEB_UI_STATE={}",
            state.to_string_lossy()
        );
    }
    let args = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.to_string_lossy()));
    for a in args.lines().filter(|l| !l.is_empty()) {
        println!("cargo:rustc-link-arg-bins={a}");
    }
}
