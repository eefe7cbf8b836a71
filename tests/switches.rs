//! ggml's own switches (ggml-ext/ggml/tq-switches.def, the last rows of the one options table)
//! as their readers take them, outside llama: the C parser (`tq_switch_get`, which ggml-cpu's
//! SET_ROWS thread count, the prefill decode and ggml-cuda's decode kernel choice call) and
//! the Rust one (`turboquant_codec::switches`, which `TQ_SIMD` and `TQ_FA_TILE` go through).
//! Each reader runs in a child process (this binary again, one test) with the variable set:
//! a value of the row gives its index, an unset or empty one the default, and a value the row
//! does not know stops the child with the table's message, printed once, and a failure status.
//! (Under llama a context refuses these values first: tests/options.rs.)
#![cfg(feature = "llama")]

use std::ffi::c_int;
use std::process::Command;
use turboquant_codec::switches::{ggml_row, ggml_rows};

extern "C" {
    fn tq_test_switch_read(reader: c_int, id: c_int) -> c_int;
}

const CHILD: &str = "TQ_SWITCHES_TEST_READER";

/// The readers: (name, the environment variable it reads, how it is called). C reader 0 is
/// the parser every C reader calls, given the row's index in the table.
fn readers() -> Vec<(String, String)> {
    let mut r: Vec<(String, String)> = ggml_rows()
        .iter()
        .enumerate()
        .map(|(i, row)| (format!("c:{i}"), row.env.clone()))
        .collect();
    r.extend(
        [
            ("rows_threads", "TQ_ROWS_THREADS"),
            ("prefill_decode", "TQ_PREFILL_DECODE"),
            ("fa_tile", "TQ_FA_TILE"),
            ("simd", "TQ_SIMD"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
    );
    r
}

/// In the child: run reader `which` and print what it took.
fn read(which: &str) -> i64 {
    use turboquant_codec::kernels::{simd_level, SimdLevel};
    match which {
        "rows_threads" => unsafe { tq_test_switch_read(1, 0) as i64 },
        "prefill_decode" => unsafe { tq_test_switch_read(2, 0) as i64 },
        "fa_tile" => turboquant_capi::tq_ggml_fa_tile() as i64,
        // the level the codec dispatches to: capped by the value (a CPU without AVX-512
        // reads avx512 as avx2, so the test only asks for a cap the CPU has)
        "simd" => match simd_level() {
            SimdLevel::Scalar => 0,
            SimdLevel::Avx2 => 1,
            SimdLevel::Avx512 => 2,
        },
        c => {
            let id: c_int = c.strip_prefix("c:").unwrap().parse().unwrap();
            unsafe { tq_test_switch_read(0, id) as i64 }
        }
    }
}

#[test]
fn child_reader() {
    if let Ok(which) = std::env::var(CHILD) {
        // on a line of its own: libtest has printed "test child_reader ... " before it
        println!("\nread={}", read(&which));
    }
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(which: &str, env: &str, value: Option<&str>) -> Run {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_reader", "--nocapture", "--test-threads=1"])
        .env(CHILD, which)
        // ggml's abort would attach gdb for a backtrace: not wanted here
        .env("GGML_NO_BACKTRACE", "1");
    for r in ggml_rows() {
        cmd.env_remove(&r.env);
    }
    if let Some(v) = value {
        cmd.env(env, v);
    }
    let o = cmd.output().unwrap();
    Run {
        ok: o.status.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn value_read(r: &Run) -> Option<i64> {
    r.stdout
        .lines()
        .find_map(|l| l.strip_prefix("read="))
        .map(|v| v.trim().parse().unwrap())
}

#[test]
fn every_reader_refuses_an_unknown_value_with_the_tables_message() {
    for (which, env) in readers() {
        let row = ggml_row(&env);
        for bad in ["bogus", "ON", " 1"] {
            let r = run(&which, &env, Some(bad));
            let msg = row.unknown(&env, bad);
            assert!(
                !r.ok && value_read(&r).is_none(),
                "{which} {env}={bad:?}: not refused:\n{}\n{}",
                r.stdout,
                r.stderr
            );
            assert_eq!(
                r.stderr.matches(&msg).count(),
                1,
                "{which} {env}={bad:?}: the message {msg:?} once in:\n{}",
                r.stderr
            );
        }
    }
    // the message itself, spelled out once
    assert_eq!(
        ggml_row("TQ_SIMD").unknown("TQ_SIMD", "avx3"),
        "turboquant: TQ_SIMD=avx3: unknown value; valid: auto, scalar, avx2, avx512, none, 0"
    );
}

#[test]
fn every_reader_takes_the_rows_values_and_its_default() {
    let avx512 = turboquant_codec::kernels::SimdLevel::Avx512.is_supported();
    for (which, env) in readers() {
        let row = ggml_row(&env);
        // the value the reader reports for value index i of the row
        let want = |i: usize| -> Option<i64> {
            match which.as_str() {
                "simd" => match i {
                    // auto: the best the CPU has
                    0 => None,
                    1 => Some(0),
                    2 => Some(1),
                    _ => avx512.then_some(2),
                },
                _ => Some(i as i64),
            }
        };
        for (i, spellings) in row.values.iter().enumerate() {
            for s in spellings {
                let r = run(&which, &env, Some(s));
                assert!(r.ok, "{which} {env}={s}: {}\n{}", r.stdout, r.stderr);
                if let Some(w) = want(i) {
                    assert_eq!(value_read(&r), Some(w), "{which} {env}={s}");
                }
            }
        }
        let def = want(row.default_index());
        for unset in [None, Some("")] {
            let r = run(&which, &env, unset);
            assert!(r.ok, "{which} {env}={unset:?}: {}\n{}", r.stdout, r.stderr);
            if let Some(w) = def {
                assert_eq!(value_read(&r), Some(w), "{which} {env}={unset:?}");
            }
        }
    }
}
