//! A real OpenAI client against llama-server with turbo caches: the `openai` Python package
//! (pinned, from PyPI, in a virtualenv kept in the turboquant cache) runs
//! tests/openai/client_check.py. docs/ECOSYSTEM.md shows its output.

mod support;
use support::run_limited;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::server::Server;

const OPENAI: &str = "openai==3.57.0";
const CTX: u32 = 512;

/// A virtualenv with the pinned client, made once per version in the cache.
fn venv() -> PathBuf {
    support::venv(&OPENAI.replace("==", "-"), &[OPENAI])
}

#[test]
fn openai_python_client_chats_streams_lists_models_and_sees_overflow_as_an_error() {
    let py = venv();
    let ctx = CTX.to_string();
    let srv = Server::start(&[
        "-ctk", "turbo4", "-ctv", "turbo3", "-fa", "on", "-c", &ctx, "-np", "1",
    ]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai/client_check.py");
    let out = run_limited(
        Command::new(&py)
            .arg(&script)
            .arg(format!("http://127.0.0.1:{}/v1", srv.port))
            .arg(&ctx)
            .stdin(Stdio::null()),
        Duration::from_secs(600),
        "tests/openai/client_check.py",
    );
    let seen: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("openai client saw: {seen:#}");
    // the script asserts the details; here: every part ran and reported
    for part in ["models", "chat", "stream", "overflow"] {
        assert!(!seen[part].is_null(), "{part} missing: {seen}");
    }
    assert_eq!(seen["overflow"]["type"], "BadRequestError", "{seen}");
    srv.stop();
}
