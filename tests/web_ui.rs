//! The chat page at the URL `tq serve` prints: llama.cpp's own web UI, embedded by the
//! build (build/ui.rs), served next to the API with turbo caches, and used from a real
//! headless chromium (tests/browser/chat.mjs, playwright-core driving Debian's
//! /usr/bin/chromium). docs/ECOSYSTEM.md has the figures.
#![cfg(feature = "llama")]

mod support;
use support::prereq::prerequisite;
use support::run_limited;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::server::{free_port, request};

/// `embedded`, or `api-only: why` (set by build.rs).
const WEB_UI: &str = env!("TQ_WEB_UI_STATE");

/// `tq serve` on a free port with turbo caches and one thread (the cores are shared);
/// `--alias` puts the cache types where the page shows the model name (/props, no fork).
struct TqServe {
    child: Child,
    port: u16,
    out: PathBuf,
    err: PathBuf,
}

impl TqServe {
    fn start() -> TqServe {
        let model = support::model();
        for _ in 0..3 {
            let port = free_port();
            let out = std::env::temp_dir().join(format!("tq-serve-{port}.out"));
            let err = std::env::temp_dir().join(format!("tq-serve-{port}.err"));
            let child = Command::new(support::bin("tq"))
                .arg("serve")
                .arg("-m")
                .arg(&model)
                .args([
                    "--ctk",
                    "turbo4",
                    "--ctv",
                    "turbo3",
                    "--port",
                    &port.to_string(),
                ])
                .args([
                    "-c",
                    "2048",
                    "--",
                    "-t",
                    "1",
                    "--alias",
                    "SmolLM2-135M · KV cache turbo4 K + turbo3 V",
                ])
                .stdout(std::fs::File::create(&out).unwrap())
                .stderr(std::fs::File::create(&err).unwrap())
                .spawn()
                .expect("start tq serve");
            let mut s = TqServe {
                child,
                port,
                out,
                err,
            };
            let t = Instant::now();
            loop {
                if request(port, "GET", "/health", "").is_ok_and(|r| r.code == 200) {
                    return s;
                }
                if let Some(st) = s.child.try_wait().unwrap() {
                    let log = std::fs::read_to_string(&s.err).unwrap_or_default();
                    if log.contains("bind") {
                        break; // lost a port race
                    }
                    panic!("tq serve exited early ({st}):\n{log}");
                }
                assert!(
                    t.elapsed() < Duration::from_secs(120),
                    "tq serve not healthy after 120 s"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        panic!("tq serve could not bind a port");
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for TqServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.err);
    }
}

/// GET as a browser would (the embedded assets are gzip and refused without
/// `Accept-Encoding: gzip`): status, lower-cased header block, body bytes.
fn browser_get(port: u16, path: &str) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap();
    (code, head, raw[end + 4..].to_vec())
}

#[test]
fn tq_serve_prints_the_url_of_the_chat_page_and_serves_it() {
    let s = TqServe::start();
    let out = s.stdout();
    let url = format!("http://127.0.0.1:{}", s.port);
    let line = out
        .lines()
        .find(|l| l.starts_with("serving"))
        .expect("a serving line");
    let (code, head, body) = browser_get(s.port, "/");
    if WEB_UI == "embedded" {
        assert!(line.contains(&url) && line.contains("chat page"), "{out}");
        assert_eq!(code, 200, "GET / of a build with the web UI: {head}");
        assert!(head.contains("content-type: text/html"), "{head}");
        assert!(
            head.contains("content-encoding: gzip") && body.starts_with(&[0x1f, 0x8b]),
            "{head}"
        );
        assert_eq!(
            browser_get(s.port, "/sw.js").0,
            200,
            "the UI's service worker"
        );
    } else {
        // API-only: the output says where the page would be and how to get it
        assert!(line.contains(&format!("{url}/v1")), "{out}");
        assert!(out.contains("TQ_WEB_UI=on cargo build --release"), "{out}");
        assert_eq!(code, 404, "GET / of an API-only build: {head}");
    }
    // the API is there either way, with the turbo caches tq serve reports
    assert_eq!(request(s.port, "GET", "/v1/models", "").unwrap().code, 200);
    // the KV line of tq serve: the cache types and the cells llama.cpp allocates (docs/MEMORY.md)
    assert!(
        out.contains("(turbo4 K / turbo3 V, 30 layers x 2048 cells)"),
        "{out}"
    );
    // A supervisor stops `tq serve` by its PID: the server must go with it, not stay
    // behind holding the port (it did while tq ran it as a child).
    let port = s.port;
    drop(s); // SIGKILL to the PID tq serve started as
    let t = Instant::now();
    while request(port, "GET", "/health", "").is_ok() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "llama-server still answers on {port} after tq serve was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn chat_page_answers_in_headless_chromium_with_turbo_caches() {
    let chromium = std::env::var("TQ_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    // .ci/run installs chromium and npm, and so builds the UI; a bare checkout may lack
    // any of them (skipped there; under CI=true a failure with the reason)
    let ready = prerequisite(
        "web UI",
        WEB_UI == "embedded",
        &format!("llama-server was built without its web UI ({WEB_UI}), see build/ui.rs"),
    ) && prerequisite(
        "chromium",
        Path::new(&chromium).exists(),
        &format!("no {chromium} (Debian: apt-get install chromium; or set TQ_CHROMIUM)"),
    ) && prerequisite(
        "npm",
        have("npm"),
        "no npm on PATH (Debian: apt-get install npm): tests/browser needs playwright-core",
    );
    if !ready {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    if !dir.join("node_modules/playwright-core").exists() {
        run_limited(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
                .current_dir(&dir),
            Duration::from_secs(300),
            "npm ci in tests/browser",
        );
    }
    let s = TqServe::start();
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/web-ui-chat.png");
    let message = "Name three colours of the rainbow.";
    let out = run_limited(
        Command::new("node")
            .arg(dir.join("chat.mjs"))
            .arg(format!("http://127.0.0.1:{}/", s.port))
            .arg(&shot)
            .arg(message)
            .env("TQ_CHROMIUM", &chromium),
        Duration::from_secs(420),
        "the browser test (node chat.mjs)",
    );
    let seen: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("browser saw: {seen}");
    assert_eq!(seen["page_status"], 200, "{seen}");
    assert_eq!(seen["chat_request_has_message"], true, "{seen}");
    assert_eq!(seen["chat_status"], 200, "{seen}");
    assert_eq!(seen["user_message_shown"], true, "{seen}");
    assert_eq!(
        seen["answer_stable"], true,
        "the answer kept changing: {seen}"
    );
    let answer = seen["answer"].as_str().unwrap_or("");
    assert!(
        answer.split_whitespace().count() >= 2,
        "no answer on the page: {seen}"
    );
    // the message footer names the model: the alias that carries the cache types
    assert!(answer.contains("KV cache turbo4 K + turbo3 V"), "{seen}");
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "screenshot too small"
    );
    // TQ_SCREENSHOT=1 refreshes the README's picture (kept out of normal runs: the model's
    // answer differs each time and would dirty the tree).
    if std::env::var_os("TQ_SCREENSHOT").is_some() {
        let dst = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img/web-ui-chat.png");
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&shot, &dst).unwrap();
    }
}
