//! Hostile HTTP input to llama-server with turbo caches: malformed JSON, wrong field
//! types, a prompt longer than the context (context shift off), out-of-range slot ids,
//! `../` in slot file names, concurrent save/restore of one slot, a stream cancelled
//! mid-generation. Each gets a 4xx or a clean answer, the server stays healthy, and the
//! other slot's greedy answer is byte-identical before and after. Figures in
//! docs/RELIABILITY.md.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::server::{stream, Server};
use support::slots::*;

const PROMPT: &str = "Write a short note about the history of bread, from the first flat \
    loaves baked on hot stones to the village bakeries of today, and say why";

/// A 2-slot turbo server with a slot save directory and slot 1's reference answer.
struct Harness {
    srv: Server,
    dir: std::path::PathBuf,
    reference: Completion,
    prompt: Vec<u64>,
}

impl Harness {
    fn start(tag: &str) -> Harness {
        let dir = slot_dir(tag);
        let srv = slot_server(&dir, 2, &["--no-context-shift", "--slots"]);
        let prompt = tokens(&srv, PROMPT);
        let reference = complete(&srv, 1, &prompt, 16);
        Harness {
            srv,
            dir,
            reference,
            prompt,
        }
    }

    fn post(&self, path: &str, body: &str) -> (u16, String) {
        let r = self.srv.request("POST", path, body).unwrap_or_else(|e| {
            panic!("{path} {body:?}: no answer ({e}):\n{}", self.srv.log_tail())
        });
        (r.code, r.body)
    }

    /// The server is alive and healthy, slot 1 answers as before, it stops cleanly.
    fn finish(mut self) {
        assert!(
            self.srv.alive(),
            "llama-server died:\n{}",
            self.srv.log_tail()
        );
        let h = self.srv.request("GET", "/health", "").unwrap();
        assert_eq!(h.code, 200, "/health: {}", h.body);
        let again = complete(&self.srv, 1, &self.prompt, 16);
        assert_eq!(
            again.tokens, self.reference.tokens,
            "slot 1's answer changed"
        );
        assert_eq!(again.content, self.reference.content);
        self.srv.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client error (4xx) with a JSON error body, or a complete 200 answer.
fn client_error_or_clean(name: &str, code: u16, body: &str) {
    if code == 200 {
        let v: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{name}: 200 but {e}: {body}"));
        assert!(v.get("error").is_none(), "{name}: {body}");
        eprintln!("{name}: 200 (clean answer)");
        return;
    }
    assert!((400..500).contains(&code), "{name}: HTTP {code}: {body}");
    let v: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{name}: {code} but {e}: {body}"));
    assert!(v["error"]["message"].is_string(), "{name}: {body}");
    eprintln!("{name}: {code} {}", v["error"]["message"]);
}

/// Malformed JSON bodies, and mistyped values that reach a JSON accessor unchecked, are
/// the client's error: 400. Upstream answered 500; our patch maps common_json_error and
/// "Failed to parse messages" to 400 (tools/server/server.cpp, common/chat.cpp).
#[test]
fn malformed_json_is_a_client_error() {
    let h = Harness::start("json");
    // mistyped values that reach a JSON accessor unchecked
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": 7, "content": "hi"}], "max_tokens": 4}),
        ),
        ("/detokenize", json!({"tokens": ["a"]})),
    ] {
        let (code, text) = h.post(path, &body.to_string());
        assert!(
            (400..500).contains(&code),
            "{path} {body}: HTTP {code}: {text}"
        );
    }
    for path in [
        "/completion",
        "/v1/chat/completions",
        "/tokenize",
        "/v1/completions",
    ] {
        for body in [
            "{",
            "{\"prompt\": \"hi\",",
            "not json",
            "",
            "[1, 2",
            "{\"messages\": [}",
            "\u{0}\u{1}\u{2}",
        ] {
            let (code, text) = h.post(path, body);
            assert!(
                (400..500).contains(&code),
                "{path} {body:?}: HTTP {code}: {text}"
            );
        }
    }
    h.finish();
}

#[test]
fn wrong_field_types_are_client_errors_or_clean_answers() {
    let h = Harness::start("types");
    let cases = [
        ("/completion", json!({"prompt": 42, "n_predict": 4})),
        ("/completion", json!({"prompt": "hi", "n_predict": "many"})),
        (
            "/completion",
            json!({"prompt": "hi", "n_predict": 4, "temperature": "hot"}),
        ),
        (
            "/completion",
            json!({"prompt": {"text": "hi"}, "n_predict": 4}),
        ),
        ("/completion", json!({"prompt": [1e30, -5], "n_predict": 4})),
        (
            "/completion",
            json!({"prompt": "hi", "n_predict": 4, "id_slot": "zero"}),
        ),
        (
            "/completion",
            json!({"prompt": "hi", "n_predict": 4, "logit_bias": "none"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi", "max_tokens": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 7}], "max_tokens": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": "yes"}),
        ),
        ("/tokenize", json!({"content": ["a", 1]})),
    ];
    for (path, body) in cases {
        let (code, text) = h.post(path, &body.to_string());
        client_error_or_clean(&format!("{path} {body}"), code, &text);
    }
    h.finish();
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_without_context_shift() {
    let h = Harness::start("long");
    let long = "the history of bread ".repeat(600); // ~2400 tokens, the slot has 1024
    for (path, body) in [
        (
            "/completion",
            json!({"prompt": long, "n_predict": 8, "id_slot": 0}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}], "max_tokens": 8}),
        ),
    ] {
        let (code, text) = h.post(path, &body.to_string());
        assert!((400..500).contains(&code), "{path}: HTTP {code}: {text}");
        eprintln!("{path}: {code} {}", &text[..text.len().min(200)]);
    }
    h.finish();
}

#[test]
fn out_of_range_slot_ids_are_refused_or_wrap() {
    let h = Harness::start("ids");
    for path in [
        "/slots/abc?action=save",
        "/slots/99999999999?action=erase",
        "/slots/0?action=explode",
    ] {
        let (code, text) = h.post(path, &json!({"filename": "x.bin"}).to_string());
        assert!((400..500).contains(&code), "{path}: HTTP {code}: {text}");
    }
    // upstream wraps a slot id modulo -np (as an unsigned value: -1 is the last slot)
    for path in ["/slots/-1?action=save", "/slots/7?action=save"] {
        let (code, text) = h.post(path, &json!({"filename": "x.bin"}).to_string());
        client_error_or_clean(path, code, &text);
    }
    // a completion's id_slot past the slots (upstream wraps it modulo -np) or negative
    for id in [2, 99, -7, i64::from(i32::MAX) + 1] {
        let body = json!({"prompt": "hi", "n_predict": 4, "id_slot": id});
        let (code, text) = h.post("/completion", &body.to_string());
        client_error_or_clean(&format!("id_slot {id}"), code, &text);
    }
    h.finish();
}

#[test]
fn slot_file_names_cannot_leave_the_save_directory() {
    let h = Harness::start("path");
    let outside = h.dir.parent().unwrap().join("tq-escape.bin");
    let _ = std::fs::remove_file(&outside);
    for action in ["save", "restore"] {
        for name in [
            "../tq-escape.bin",
            "../../tmp/tq-escape.bin",
            "/tmp/tq-escape.bin",
            "a/../../tq-escape.bin",
            "..",
            "",
        ] {
            let (code, text) = h.post(
                &format!("/slots/0?action={action}"),
                &json!({"filename": name}).to_string(),
            );
            assert!(
                (400..500).contains(&code),
                "{action} {name:?}: HTTP {code}: {text}"
            );
        }
    }
    assert!(
        !outside.exists(),
        "a slot file was written outside the save directory"
    );
    h.finish();
}

/// Saves and restores of slot 0 from four threads at once: each 200 or a 4xx, and
/// afterwards the slot (restored from the file every save wrote) continues as before.
#[test]
fn concurrent_save_and_restore_of_one_slot() {
    let h = Harness::start("conc");
    let first = complete(&h.srv, 0, &h.prompt, 8);
    slot_ok(&h.srv, 0, "save", "s.bin");
    let port = h.srv.port;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                for i in 0..6 {
                    let action = if (t + i) % 2 == 0 { "save" } else { "restore" };
                    let r = support::server::request(
                        port,
                        "POST",
                        &format!("/slots/0?action={action}"),
                        &json!({"filename": "s.bin"}).to_string(),
                    )
                    .expect("no answer");
                    codes.push((action, r.code, r.body));
                }
                codes
            })
        })
        .collect();
    let mut ok = 0;
    for t in threads {
        for (action, code, body) in t.join().unwrap() {
            assert!(
                code == 200 || (400..500).contains(&code),
                "{action}: HTTP {code}: {body}"
            );
            ok += (code == 200) as usize;
        }
    }
    eprintln!("{ok}/24 concurrent saves/restores answered 200");
    slot_ok(&h.srv, 0, "restore", "s.bin");
    let p: Vec<u64> = h.prompt.iter().chain(&first.tokens).copied().collect();
    let next = complete(&h.srv, 0, &p, 8);
    assert!(
        next.prompt_n < 4,
        "restored cache not used ({})",
        next.prompt_n
    );
    h.finish();
}

fn slot0(srv: &Server) -> Value {
    let r = srv.request("GET", "/slots", "").unwrap();
    assert_eq!(r.code, 200, "/slots: {}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == 0)
        .unwrap()
        .clone()
}

/// A streamed request for 800 tokens whose client goes away after 3 events: slot 0 goes
/// idle in under a quarter of the time the 800 tokens would take at the decode speed
/// measured on the reference answer, and reports far fewer than 800 decoded.
#[test]
fn a_cancelled_stream_frees_its_slot() {
    let h = Harness::start("cancel");
    let body = json!({"prompt": PROMPT, "n_predict": 800, "temperature": 0, "ignore_eos": true,
                      "id_slot": 0, "stream": true});
    let s = stream(h.srv.port, "/completion", &body.to_string(), Some(3)).unwrap();
    assert_eq!(s.code, 200);
    assert!(s.events.len() >= 3);
    let t = Instant::now();
    let st = loop {
        let st = slot0(&h.srv);
        if st["is_processing"] == false {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "slot 0 still busy 60 s after the cancel: {st}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let idle = t.elapsed().as_secs_f64();
    let n = st["next_token"][0]["n_decoded"]
        .as_u64()
        .expect("n_decoded");
    // what the whole 800 tokens would take at this server's measured decode speed (the
    // reference answer: 16 tokens); a slot that kept generating is idle only after that
    let full = 800.0 * h.reference.predicted_ms / 16.0 / 1000.0;
    eprintln!("cancelled after 3 events: slot idle after {idle:.2} s (800 tokens: ~{full:.1} s), n_decoded {n}");
    assert!(full > 0.0, "no decode timing");
    assert!(
        idle < full / 4.0,
        "slot 0 busy for {idle:.1} s after its client left (800 tokens take ~{full:.1} s)"
    );
    assert!(
        n < 200,
        "the slot decoded {n} of 800 tokens after its client left"
    );
    h.finish();
}
