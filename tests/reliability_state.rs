//! Saved turbo state that would poison a cache is refused before anything is adopted.
//! A state carries each layer's K mean m and K/Q balancing scale s (as s - 1); s divides
//! every query, and a NaN m survives even an emptied cache (the modes multiply it by 0).
//! The restore path (tq-llama-kv-cache.cpp) refuses non-finite values, an s outside the
//! writer's clamp [1/64, 64] (TQ_KBAL_MAX), an unknown tag, and a mean that differs from the one a busy
//! cache uses; llama-server answers 400 and the cache keeps answering as before.
//! Each sequence's exact first key (tq-sink.h) follows it through a restore into another
//! slot and through `seq_cp` (llama-server's `n_cmpl` children).
//! Figures in docs/RELIABILITY.md.

mod support;

use std::path::Path;
use support::server::Server;
use support::slots::*;

const PROMPT_A: &str = "The lighthouse keeper climbed the stairs every evening. He counted the \
    steps, lit the lamp and watched the ships pass through the narrow channel between the \
    rocks. One night a storm came from the west and";
const PROMPT_B: &str = "Quarterly report: revenue grew in every region, costs fell for the \
    third year in a row, the new factory opened on time, and after a long discussion about \
    the dividend the board finally approved";

/// A short prompt whose first token is neither A's nor B's.
const PROMPT_C: &str = "Dear committee, thank you for the invitation to speak";

fn set_f32(f: &mut [u8], o: usize, v: f32) {
    f[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// Restores `file` into `slot`; must be refused with 400 and `log_says` in the server log.
fn refused(srv: &mut Server, slot: usize, name: &str, file: &str, log_says: &str) {
    let before = srv.log_text().len();
    let r = slot_action(srv, slot, "restore", file);
    assert!(
        srv.alive(),
        "{name}: llama-server died:\n{}",
        srv.log_tail()
    );
    assert_eq!(
        r.code, 400,
        "{name}: expected a refusal, got {}: {}",
        r.code, r.body
    );
    assert!(
        r.body.contains("Unable to restore slot"),
        "{name}: {}",
        r.body
    );
    // llama's log is written by a thread of its own: give the line a moment to land
    let t = std::time::Instant::now();
    let mut log = srv.log_text();
    while !log[before..].contains(log_says) && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        log = srv.log_text();
    }
    assert!(
        log[before..].contains(log_says),
        "{name}: the log does not say {log_says:?}:\n{}",
        &log[before..]
    );
    eprintln!("{name}: 400, log: {log_says:?}");
}

/// NaN mean (first and last layer), s = 0, s = 1e30, s = NaN, s = 65 (past the clamp), an
/// unknown tag, the tag of the other mode, a NaN exact first key, an unknown tag or an
/// impossible entry count where the exact first keys (tq-sink.h) should be, an exact key
/// for a cell that is not at position 0, and a file cut
/// inside the tag: each refused with
/// 400 and its own log line, the server alive, and the slot then answers exactly as before
/// (a poisoned mean would change or NaN every answer). s = 64, the clamp's edge, is taken.
#[test]
fn restore_refuses_non_finite_or_out_of_range_k_mean_and_balancing_scale() {
    let dir = slot_dir("poison");
    // the exact first keys are on by default; set here too, since this test walks their state
    let mut srv = slot_server_env(&dir, 1, &[], &[("TQ_K_SINK", "1")]);
    let p = tokens(&srv, PROMPT_A);
    assert!(
        p.len() >= 32,
        "the prompt sets the mean (>= 32 tokens): {}",
        p.len()
    );
    let good_answer = complete(&srv, 0, &p, 12);
    slot_ok(&srv, 0, "save", "good.bin");
    let good = std::fs::read(dir.join("good.bin")).unwrap();
    let st = turbo_state_layout(&good);
    assert_eq!(st.tags.len(), 30, "SmolLM2-135M has 30 layers");
    assert_eq!(
        &good[st.tags[0]..st.tags[0] + 4],
        b"TQBF",
        "balancing on and the mean in RoPE's frame by default (a CPU-only model)"
    );
    let n = st.n_values / 2;
    let m0 = st.tags[0] + 4; // layer 0's m[0]
    let s0 = m0 + 4 * n; // layer 0's s[0] - 1
    let last = *st.tags.last().unwrap();

    let cases: Vec<(&str, Vec<u8>, &str)> = {
        let with = |o: usize, v: f32| {
            let mut f = good.clone();
            set_f32(&mut f, o, v);
            f
        };
        let mut tag = good.clone();
        tag[st.tags[3]..st.tags[3] + 4].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        let mut other = good.clone();
        other[st.tags[0]..st.tags[0] + 4].copy_from_slice(b"TQMF");
        let mut fitted = good.clone();
        fitted[st.tags[5]..st.tags[5] + 4].copy_from_slice(b"TQB2");
        assert_eq!(st.sinks.len(), 30, "the exact first keys, every layer");
        let (k0, k7) = (st.sinks[0], st.sinks[7]);
        let mut no_sink = good.clone();
        no_sink[k7..k7 + 4].copy_from_slice(b"TQS0");
        assert_eq!(
            u32_at(&good, k0 + 4),
            1,
            "one exact first key: the slot's cell 0"
        );
        let mut many = good.clone();
        many[k0 + 4..k0 + 8].copy_from_slice(&100_000u32.to_le_bytes());
        let mut not_first = good.clone();
        not_first[k0 + 16..k0 + 20].copy_from_slice(&1u32.to_le_bytes());
        vec![
            (
                "NaN exact first key, layer 0",
                with(k0 + 20 + 4 * 3, f32::NAN),
                "exact first key 0 is not finite",
            ),
            (
                "unknown exact-first-keys tag, layer 7",
                no_sink,
                "expected the turbo exact first keys",
            ),
            (
                "exact first keys for 100000 cells",
                many,
                "exact first keys for 100000 cells",
            ),
            (
                "an exact first key for a cell past position 0",
                not_first,
                "not at position 0",
            ),
            (
                "NaN mean, layer 0",
                with(m0 + 4 * 5, f32::NAN),
                "K mean is not finite",
            ),
            (
                "+inf mean, last layer",
                with(last + 4 + 4 * 7, f32::INFINITY),
                "K mean is not finite",
            ),
            ("s = 0", with(s0, -1.0), "balancing scale 0 is 0"),
            (
                "s = 1e30",
                with(s0 + 4 * 9, 1e30),
                "balancing scale 9 is 1e+30",
            ),
            ("s = NaN", with(s0, f32::NAN), "balancing scale 0 is nan"),
            ("s = 65", with(s0, 64.0), "balancing scale 0 is 65"),
            (
                "unknown tag, layer 3",
                tag,
                "unknown turbo K mean tag 0x12345678",
            ),
            (
                "mean-only tag in a balancing cache",
                other,
                "does not match this cache's",
            ),
            (
                "fitted-mean tag in a RoPE-frame cache, layer 5",
                fitted,
                "does not match this cache's",
            ),
            (
                "cut inside the tag",
                good[..st.tags[0] + 2].to_vec(),
                "failed to restore kv cache",
            ),
        ]
    };
    for (i, (name, bytes, log_says)) in cases.iter().enumerate() {
        let file = format!("bad{i}.bin");
        std::fs::write(dir.join(&file), bytes).unwrap();
        refused(&mut srv, 0, name, &file, log_says);
        let again = complete(&srv, 0, &p, 12);
        assert_eq!(
            again.tokens, good_answer.tokens,
            "{name}: answer changed after the refusal"
        );
        assert_eq!(again.content, good_answer.content);
    }

    // the edge of the clamp is what the writer can produce: adopted
    let mut edge = good.clone();
    set_f32(&mut edge, s0, 63.0);
    std::fs::write(dir.join("edge.bin"), &edge).unwrap();
    let r = slot_action(&srv, 0, "restore", "edge.bin");
    assert_eq!(r.code, 200, "s = 64 refused: {}", r.body);
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A saved cell at a position that removing its sequence cannot reach: a negative one, or
/// i32::MAX (`llama_memory_seq_rm(seq, -1, -1)` removes [0, i32::MAX)). Upstream's reader
/// took such a state, and the cell then outlived every erase of the slot (the state fuzzer's
/// orphan-cells finding, docs/RELIABILITY.md); patch 0004 refuses it. Each is refused with
/// 400 and the log names the cell, the server stays up, and the slot then answers exactly
/// as before; the unmodified file still restores.
#[test]
fn restore_refuses_a_cell_at_a_position_that_erasing_the_slot_cannot_reach() {
    let dir = slot_dir("positions");
    let mut srv = slot_server(&dir, 1, &[]);
    let p = tokens(&srv, PROMPT_A);
    let good_answer = complete(&srv, 0, &p, 12);
    slot_ok(&srv, 0, "save", "good.bin");
    let good = std::fs::read(dir.join("good.bin")).unwrap();
    // server token header, then llama's state: stream count, cell count, cells of 12 bytes
    // (position, sequence count, sequence id)
    let kv = 12 + 4 * u32_at(&good, 8);
    let n_cells = u32_at(&good, kv + 4);
    assert!(
        (p.len()..=p.len() + 12).contains(&n_cells),
        "{n_cells} cells for a {}-token prompt and 12 generated tokens",
        p.len()
    );
    let cell = |i: usize| kv + 8 + 12 * i;
    for i in 0..n_cells {
        assert_eq!(
            i32::from_le_bytes(good[cell(i)..cell(i) + 4].try_into().unwrap()),
            i as i32,
            "cell {i}'s position"
        );
    }
    let at = |i: usize, pos: i32| {
        let mut f = good.clone();
        f[cell(i)..cell(i) + 4].copy_from_slice(&pos.to_le_bytes());
        f
    };
    let last = n_cells - 1;
    let cases = [
        (
            "cell 0 at -1",
            at(0, -1),
            "cell 0 has position -1,".to_string(),
        ),
        (
            "last cell at i32::MIN",
            at(last, i32::MIN),
            format!("cell {last} has position -2147483648,"),
        ),
        (
            "cell 5 at i32::MAX",
            at(5, i32::MAX),
            "cell 5 has position 2147483647,".to_string(),
        ),
    ];
    for (i, (name, bytes, log_says)) in cases.iter().enumerate() {
        let file = format!("pos{i}.bin");
        std::fs::write(dir.join(&file), bytes).unwrap();
        refused(&mut srv, 0, name, &file, log_says);
        let again = complete(&srv, 0, &p, 12);
        assert_eq!(
            (again.tokens, again.content),
            (good_answer.tokens.clone(), good_answer.content.clone()),
            "{name}: answer changed after the refusal"
        );
    }
    let r = slot_action(&srv, 0, "restore", "good.bin");
    assert_eq!(r.code, 200, "the unmodified file: {}", r.body);
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Slot 1's greedy answers to PROMPT_B (prompt, then a continuation from its cache), with
/// or without a restore of `file` into slot 0 in between.
fn live_slot_run(srv: &mut Server, file: Option<&str>) -> (Completion, Completion) {
    let b = tokens(srv, PROMPT_B);
    let first = complete(srv, 1, &b, 16);
    if let Some(f) = file {
        refused(
            srv,
            0,
            "restore into a busy cache",
            f,
            "differs from the one this cache's other sequences use",
        );
    }
    let bb: Vec<u64> = b.iter().chain(&first.tokens).copied().collect();
    let next = complete(srv, 1, &bb, 16);
    assert!(
        next.prompt_n < 4,
        "slot 1's cache was not reused ({} evaluated)",
        next.prompt_n
    );
    (first, next)
}

/// Slot 1's answers `first` and `next` equal a fresh server's (`more` its extra flags) that
/// ran PROMPT_B in slot 1 with nothing restored: `what` did not touch the live slot.
fn same_as_untouched_server(
    dir: &Path,
    more: &[&str],
    first: &Completion,
    next: &Completion,
    what: &str,
) {
    let mut reference = slot_server(dir, 2, more);
    let (rfirst, rnext) = live_slot_run(&mut reference, None);
    reference.stop();
    assert_eq!(first.content, rfirst.content);
    assert_eq!(
        (&next.tokens, &next.content),
        (&rnext.tokens, &rnext.content),
        "slot 1's continuation changed by {what}"
    );
}

/// `-np 2 -kvu` (one stream for both slots, so one set of K statistics): a state saved from
/// slot 0 (mean of prompt A) restored into slot 0 while slot 1 is live with the mean of prompt
/// B: refused (the cache's other keys were stored with another mean), slot 1's continuation
/// byte-identical to a server where no restore was tried; after slot 1 is erased the same file
/// restores.
#[test]
fn restore_into_a_busy_unified_cache_with_another_mean_is_refused_and_the_live_slot_is_untouched() {
    let dir = slot_dir("busy");
    let mut srv = slot_server(&dir, 2, &["-kvu"]);
    let a = tokens(&srv, PROMPT_A);
    complete(&srv, 0, &a, 8);
    slot_ok(&srv, 0, "save", "a.bin");
    slot_ok(&srv, 0, "erase", "");
    let (first, next) = live_slot_run(&mut srv, Some("a.bin"));
    slot_ok(&srv, 1, "erase", "");
    let r = slot_action(&srv, 0, "restore", "a.bin");
    assert_eq!(r.code, 200, "restore into the emptied cache: {}", r.body);
    srv.stop();

    same_as_untouched_server(&dir, &["-kvu"], &first, &next, "the refused restore");
    eprintln!("live slot continuation: {:?}", next.content);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-np 2` (a stream per slot, each with its own K statistics): the same state restored into
/// slot 0 while slot 1 is live with another mean is taken, since slot 0's stream holds only the
/// restored cells; slot 0 then continues as the server that saved it did (its cache reused,
/// the same tokens), and slot 1's continuation is byte-identical to a server where nothing
/// was restored.
#[test]
fn restore_into_an_empty_stream_of_a_busy_cache_keeps_its_own_mean() {
    let dir = slot_dir("stream");
    let srv = slot_server(&dir, 2, &[]);
    let a = tokens(&srv, PROMPT_A);
    let a0 = complete(&srv, 0, &a, 8);
    slot_ok(&srv, 0, "save", "a.bin");
    let aa: Vec<u64> = a.iter().chain(&a0.tokens).copied().collect();
    let saved_next = complete(&srv, 0, &aa, 8);
    slot_ok(&srv, 0, "erase", "");
    let b = tokens(&srv, PROMPT_B);
    let first = complete(&srv, 1, &b, 16);
    slot_ok(&srv, 0, "restore", "a.bin");
    let restored_next = complete(&srv, 0, &aa, 8);
    assert!(
        restored_next.prompt_n < 4,
        "slot 0's restored cache was not reused ({} evaluated)",
        restored_next.prompt_n
    );
    assert_eq!(
        (restored_next.tokens.clone(), restored_next.content.clone()),
        (saved_next.tokens, saved_next.content),
        "slot 0 continues otherwise after the restore into a busy cache"
    );
    let bb: Vec<u64> = b.iter().chain(&first.tokens).copied().collect();
    let next = complete(&srv, 1, &bb, 16);
    srv.stop();

    same_as_untouched_server(&dir, &[], &first, &next, "the restore into slot 0");
    eprintln!("restored slot continuation: {:?}", restored_next.content);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The options that change what a turbo K cache stores, and so the saved format: a state
/// saved with the defaults (mean and balancing on) is refused by a server started with
/// `--tq-k-balance off` (its cache expects the mean-only tag) or `--tq-k-mean off` (no tag
/// at all); each server logs what turned the option off. A value other than on/off, as an
/// option or through the environment alias (TQ_K_MEAN, TQ_K_BALANCE), stops llama-server
/// with a message naming it.
#[test]
fn restore_refuses_a_state_saved_with_other_k_mean_or_balance_options() {
    let dir = slot_dir("options");
    // -lv 4: llama's own info lines (the cache's choices) in the server log
    let srv = slot_server(&dir, 1, &["-lv", "4"]);
    let p = tokens(&srv, PROMPT_A);
    complete(&srv, 0, &p, 8);
    slot_ok(&srv, 0, "save", "default.bin");
    let log = srv.stop();
    assert!(
        log.contains("turbo K mean removal: on (default;")
            && log.contains("turbo K/Q channel balancing: on (default;"),
        "defaults not logged:\n{log}"
    );

    for (option, log_off, log_says) in [
        (
            "--tq-k-balance",
            "turbo K/Q channel balancing: off (turned off: option tq_k_balance)",
            "does not match this cache's",
        ),
        (
            "--tq-k-mean",
            "turbo K mean removal: off (turned off: option tq_k_mean)",
            "failed to",
        ),
    ] {
        let mut srv = slot_server(&dir, 1, &[option, "off", "-lv", "4"]);
        assert!(
            srv.log_text().contains(log_off),
            "{option} off: the log does not say {log_off:?}:\n{}",
            srv.log_text()
        );
        refused(
            &mut srv,
            0,
            &format!("{option} off"),
            "default.bin",
            log_says,
        );
        srv.stop();
    }

    for (args, env) in [
        (&["--tq-k-mean", "maybe"][..], None),
        (&[][..], Some(("TQ_K_BALANCE", "maybe"))),
    ] {
        let mut cmd = std::process::Command::new(support::bin("llama-server"));
        cmd.arg("-m").arg(support::model()).args(TURBO).args(args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("start llama-server");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} {env:?}: llama-server accepted it"
        );
        assert!(
            err.contains("=maybe: unknown value; valid: off, on"),
            "{args:?} {env:?}: no clear error:\n{err}"
        );
        eprintln!("{args:?} {env:?}: refused at start-up");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The exact first key (tq-sink.h) travels with its sequence: slot 0 saved, both slots then
/// given other prompts (other first tokens: no slot of the exact first keys is free), the
/// file restored into slot 1 continues exactly as slot 0 did right after the save, and
/// still does after slot 0 takes yet another prompt. A restore that dropped the key, or put
/// it in a slot another sequence writes, would continue with the decoded first key.
#[test]
fn a_slot_restored_into_another_slot_continues_as_the_saved_one() {
    let dir = slot_dir("cross");
    let srv = slot_server_env(&dir, 2, &[], &[("TQ_K_SINK", "1")]);
    let p = tokens(&srv, PROMPT_A);
    let b = tokens(&srv, PROMPT_B);
    let c = tokens(&srv, PROMPT_C);
    assert!(
        p[0] != b[0] && p[0] != c[0] && b[0] != c[0],
        "three first tokens"
    );
    let first = complete(&srv, 0, &p, 8);
    // slot 1 stays busy from here on: the cache never empties, so the K mean slot 0's
    // prompt set stays (a restore into a busy cache needs the same mean)
    complete(&srv, 1, &c, 4);
    slot_ok(&srv, 0, "save", "a.bin");
    let cont: Vec<u64> = p.iter().chain(&first.tokens).copied().collect();
    let want = complete(&srv, 0, &cont, 12);
    assert!(
        want.prompt_n < 4,
        "slot 0 reused its cache ({})",
        want.prompt_n
    );
    complete(&srv, 0, &b, 4);
    slot_ok(&srv, 1, "restore", "a.bin");
    for when in ["after the restore", "after slot 0 took another prompt"] {
        let got = complete(&srv, 1, &cont, 12);
        assert!(
            got.prompt_n < 4,
            "{when}: restored cache not used ({})",
            got.prompt_n
        );
        assert_eq!(
            got.tokens, want.tokens,
            "{when}: slot 1 does not continue as slot 0 did"
        );
        complete(&srv, 0, &c, 4);
    }
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n_cmpl` children get their parent's cells through `seq_cp`, and with them its exact first
/// key (tq-sink.h: the copy goes to the child's slot). After both slots held another prompt,
/// a request for two greedy completions answers twice what a lone request answered; a child
/// that kept its slot's stale key would attend with its decoded first key.
#[test]
fn n_cmpl_children_answer_as_a_lone_request() {
    let dir = slot_dir("ncmpl");
    let srv = slot_server_env(&dir, 2, &[], &[("TQ_K_SINK", "1")]);
    let p = tokens(&srv, PROMPT_A);
    let alone = complete(&srv, 0, &p, 16);
    // both slots take another prompt, slot 1 first: the cache never empties, so the K mean
    // that the first prompt set stays
    let c = tokens(&srv, PROMPT_C);
    complete(&srv, 1, &c, 4);
    complete(&srv, 0, &c, 4);
    let body = serde_json::json!({"prompt": p, "n_predict": 16, "temperature": 0, "n_cmpl": 2,
                                  "ignore_eos": true, "return_tokens": true, "cache_prompt": false});
    let v = srv.post_ok("/completion", &body);
    let all = v.as_array().expect("n_cmpl 2: an array of two completions");
    assert_eq!(all.len(), 2, "{v}");
    for x in all {
        assert_eq!(
            token_ids(&x["tokens"]),
            alone.tokens,
            "completion {}: not the lone answer",
            x["index"]
        );
    }
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
