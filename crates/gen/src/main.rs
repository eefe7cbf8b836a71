//! `tq-gen`: rewrite every derived file that is stale (`cargo run --release -p
//! turboquant-gen`), or with `--check` list the stale ones and exit 1; `--options` prints
//! the options table (ggml-ext/llama/tq-options.def, ending with
//! ggml-ext/ggml/tq-switches.def) as markdown.

use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some("--options") => {
            print!(
                "{}",
                turboquant_gen::options::markdown(&turboquant_gen::options::rows())
            );
            return ExitCode::SUCCESS;
        }
        Some(a) => {
            eprintln!("tq-gen: unknown argument {a:?} (usage: tq-gen [--check | --options])");
            return ExitCode::from(2);
        }
    };
    let root = turboquant_gen::repo_root();
    let mut stale = 0;
    for g in turboquant_gen::all() {
        let path = root.join(g.path);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(g.text.as_str()) {
            continue;
        }
        stale += 1;
        if check {
            println!("stale: {}", g.path);
        } else if let Err(e) = std::fs::write(&path, &g.text) {
            eprintln!("tq-gen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", g.path);
        }
    }
    if check && stale > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
