//! Every derived file in the repository is exactly what its generator renders now.

#[test]
fn every_generated_file_is_fresh() {
    if cfg!(debug_assertions) {
        // Retraining the trellis tables takes minutes without optimisation.
        eprintln!("skipped in debug builds: run with --release");
        return;
    }
    let root = turboquant_gen::repo_root();
    let stale: Vec<&str> = turboquant_gen::all()
        .iter()
        .filter(|g| {
            std::fs::read_to_string(root.join(g.path)).ok().as_deref() != Some(g.text.as_str())
        })
        .map(|g| g.path)
        .collect();
    assert!(
        stale.is_empty(),
        "stale generated files (regenerate with `cargo run --release -p turboquant-gen`): {stale:?}"
    );
}
