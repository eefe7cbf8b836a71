//! The progress bar every long `tq` subcommand shows (capture, lab).

use std::time::Duration;

/// A bar of `total` steps named `what`, ticking on its own while a step runs.
pub fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {what} {{msg}}"
        ))
        .unwrap(),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}
