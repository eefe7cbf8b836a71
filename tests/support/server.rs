//! A real llama-server on loopback for the reliability tests: start on a free port in
//! 18000-18999, wait for /health, plain HTTP/1.1 (Content-Length or chunked, SSE
//! streams that can be cut off mid-stream), resident memory, clean SIGTERM stop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{bin, model};

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A port in 18000-18999 nobody listens on right now (random start, then linear).
pub fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    for i in 0..1000u64 {
        let port = 18000 + ((seed.wrapping_mul(2654435761) + i * 7) % 1000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 18000-18999");
}

pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    /// llama-server on the default model with `args` added (cache types etc.).
    pub fn start(args: &[&str]) -> Server {
        Server::start_env(args, &[])
    }

    /// The same with `env` set for this server only (a test's threads share the process's).
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_model(&model(), args, env)
    }

    /// llama-server on the GGUF `m` with `args` added and `env` set.
    pub fn start_model(m: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        for _ in 0..3 {
            let port = free_port();
            let log = std::env::temp_dir().join(format!("tq-rel-server-{port}.log"));
            let child = Command::new(bin("llama-server"))
                .arg("-m")
                .arg(m)
                .args([
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    // one thread: a spinning 2-thread barrier collapses when the cores
                    // are shared with other jobs (0.2 tok/s measured)
                    "-t",
                    "1",
                ])
                .args(args)
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()) // nobody drains a pipe
                .spawn()
                .expect("start llama-server");
            let mut s = Server { child, port, log };
            let t = Instant::now();
            loop {
                if let Ok(r) = s.request("GET", "/health", "") {
                    if r.code == 200 {
                        return s;
                    }
                }
                if let Some(st) = s.child.try_wait().unwrap() {
                    let log = s.log_text();
                    if log.contains("bind") && log.contains("port") {
                        break; // lost a port race: try another one
                    }
                    panic!("llama-server {args:?} exited early ({st}):\n{log}");
                }
                assert!(
                    t.elapsed() < Duration::from_secs(120),
                    "llama-server not healthy after 120 s"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        panic!("llama-server could not bind a port");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let l = self.log_text();
        l[l.len().saturating_sub(4000)..].to_string()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Resident set size in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    pub fn request(&self, method: &str, path: &str, body: &str) -> Result<Response, String> {
        request(self.port, method, path, body)
    }

    /// POST a JSON body, expect 200, parse the answer.
    pub fn post_ok(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let r = self.request("POST", path, &body.to_string()).unwrap();
        assert_eq!(r.code, 200, "{path} {body}: {}", r.body);
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.body))
    }

    /// SIGTERM; the server must exit by itself with status 0. Returns its log.
    pub fn stop(mut self) -> String {
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let t = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "llama-server did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = self.log_text();
        assert!(
            status.success(),
            "llama-server exit {status}:\n{}",
            &log[log.len().saturating_sub(4000)..]
        );
        let _ = std::fs::remove_file(&self.log);
        log
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub struct Response {
    pub code: u16,
    pub body: String,
}

fn send(port: u16, method: &str, path: &str, body: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    // generous: a starved 2-core machine can take minutes per request; a hang still ends
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    Ok(s)
}

/// Status code and headers (lower-cased names).
fn head(r: &mut impl BufRead) -> Result<(u16, Vec<(String, String)>), String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok((code, headers))
}

fn is_chunked(h: &[(String, String)]) -> bool {
    h.iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
}

/// One chunk of a chunked body; None at the terminating zero chunk.
fn next_chunk(r: &mut impl BufRead) -> Result<Option<Vec<u8>>, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        .map_err(|_| format!("bad chunk size line {line:?}"))?;
    let mut buf = vec![0u8; size + 2];
    r.read_exact(&mut buf).map_err(|e| e.to_string())?;
    buf.truncate(size);
    Ok((size > 0).then_some(buf))
}

pub fn request(port: u16, method: &str, path: &str, body: &str) -> Result<Response, String> {
    let s = send(port, method, path, body)?;
    let mut r = BufReader::new(s);
    let (code, headers) = head(&mut r)?;
    let mut out = Vec::new();
    if is_chunked(&headers) {
        while let Some(c) = next_chunk(&mut r)? {
            out.extend(c);
        }
    } else {
        r.read_to_end(&mut out).map_err(|e| e.to_string())?;
    }
    Ok(Response {
        code,
        body: String::from_utf8_lossy(&out).into_owned(),
    })
}

/// What a streamed (SSE) request returned.
pub struct Stream {
    pub code: u16,
    /// Every `data:` payload except `[DONE]`, parsed.
    pub events: Vec<serde_json::Value>,
    /// `data: [DONE]` arrived.
    pub done: bool,
    /// The body when the status was not 200.
    pub error: String,
}

/// POSTs with `"stream": true` and reads events; after `cancel_after` events it closes
/// the connection (a client going away mid-stream).
pub fn stream(
    port: u16,
    path: &str,
    body: &str,
    cancel_after: Option<usize>,
) -> Result<Stream, String> {
    let s = send(port, "POST", path, body)?;
    let raw = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let (code, headers) = head(&mut r)?;
    let mut st = Stream {
        code,
        events: Vec::new(),
        done: false,
        error: String::new(),
    };
    let chunked = is_chunked(&headers);
    let mut pending = Vec::<u8>::new();
    loop {
        let piece = if chunked {
            match next_chunk(&mut r)? {
                Some(c) => c,
                None => break,
            }
        } else {
            let mut b = vec![0u8; 4096];
            let n = r.read(&mut b).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            b.truncate(n);
            b
        };
        pending.extend(piece);
        while let Some(i) = pending.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = pending.drain(..i + 2).collect();
            let ev = String::from_utf8_lossy(&ev);
            for line in ev.lines() {
                let Some(d) = line.strip_prefix("data: ") else {
                    continue;
                };
                if d.trim() == "[DONE]" {
                    st.done = true;
                } else {
                    st.events
                        .push(serde_json::from_str(d).map_err(|e| format!("{e}: {d}"))?);
                }
            }
        }
        if cancel_after.is_some_and(|n| st.events.len() >= n) {
            let _ = raw.shutdown(Shutdown::Both);
            return Ok(st);
        }
    }
    if code != 200 {
        st.error = String::from_utf8_lossy(&pending).into_owned();
    }
    Ok(st)
}
