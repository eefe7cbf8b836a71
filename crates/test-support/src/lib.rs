//! What the workspace's tests share, as a dev-dependency (no test borrows another
//! package's files by `#[path]`). Invariant: a child process a test starts through
//! [`run_for`] never outlives its time limit: a hang fails the test instead of using up
//! CI's time (the capi tests' C compiler, C test and nm; the llama tools of the root tests).

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion with its output captured; kills it and panics, with the tail
/// of what it wrote to stderr, when it is still running after `secs` seconds.
pub fn run_for(cmd: &mut Command, secs: u64) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // drained on threads: a chatty child never blocks on a full pipe
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            let e = err.join().unwrap_or_default();
            panic!(
                "{cmd:?} still running after {secs} s, killed; stderr tail:\n{}",
                String::from_utf8_lossy(&e[e.len().saturating_sub(4000)..])
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}
