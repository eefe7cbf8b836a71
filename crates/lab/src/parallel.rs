//! Work spread over the machine's cores, for the lab's per-layer and per-pool loops.
//!
//! Invariant: results come back in index order whatever the thread count, and each index
//! is computed exactly once, so a lab figure never depends on how many cores ran it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f(0..n)` on all cores (work-stealing by index); results in index order.
pub fn parallel_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(n.max(1));
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let results = Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = f(i);
                results.lock().unwrap()[i] = Some(r);
            });
        }
    });
    out.into_iter().map(|r| r.unwrap()).collect()
}

/// `f(layer)` for every layer on all cores, `tick()` once per finished layer (a progress
/// bar's step).
pub fn per_layer<T: Send>(
    n_layer: usize,
    tick: &(dyn Fn() + Sync),
    f: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    parallel_map(n_layer, |l| {
        let r = f(l);
        tick();
        r
    })
}
