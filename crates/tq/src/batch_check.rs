//! `tq batch-check`: does a backend compute a token inside a batch of queries bit for bit as
//! it computes the same token decoded alone? Speculative decoding relies on it: the target
//! verifies a draft as one batch, and at temperature 0 its answer is plain decoding's only
//! where each op gives a batch's first row the bits a one-token graph gives it. A turbo cache
//! turns any difference into other codes for the next layers (docs/SPECULATIVE.md).
//!
//! Two contexts decode the same prefix; then one decodes the next token alone, the other that
//! token with the following ones as one batch. llama.cpp's graph eval callback copies every
//! f32 node of the two last graphs to the host, and each node of the batch is cut to its first
//! token (the one dimension where the batch has `n` and the lone graph 1) and compared with the
//! lone graph's node of the same name and occurrence. The report lists nodes in graph order
//! with their largest difference, and names the first of the token's nodes that differs. A
//! node without a token dimension (the cells' tables and masks) is shown but not counted: in
//! the batch's graph it also holds the other tokens' cells. Asking the callback for every node
//! makes the scheduler run one node per graph, so backends do not fuse ops here.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use turboquant::llama_sys as sys;

/// Every f32 node of one graph run: (name, occurrence) in order, shape, values.
#[derive(Default)]
struct Nodes {
    list: Vec<Node>,
    seen: HashMap<String, usize>,
    skipped: usize,
}

struct Node {
    key: String,
    op: String,
    /// the names of its first two sources, to place a node that has no name of its own
    srcs: String,
    ne: [i64; 4],
    data: Vec<f32>,
}

unsafe extern "C" fn eval_cb(t: *mut sys::ggml_tensor, ask: bool, ud: *mut c_void) -> bool {
    if ask {
        return true; // every node: the scheduler then stops after each one
    }
    // SAFETY: llama.cpp passes a valid, computed tensor and our user data pointer back.
    let nodes = unsafe { &mut *(ud as *mut Nodes) };
    let t = unsafe { &*t };
    let name = unsafe { CStr::from_ptr(sys::ggml_get_name(t)) }
        .to_string_lossy()
        .into_owned();
    let n = nodes.seen.entry(name.clone()).or_insert(0);
    let key = format!("{name}#{n}");
    *n += 1;
    if t.type_ != sys::GGML_TYPE_F32 || !unsafe { sys::ggml_is_contiguous(t) } {
        nodes.skipped += 1;
        return true;
    }
    let count = unsafe { sys::ggml_nelements(t) } as usize;
    let mut data = vec![0f32; count];
    // SAFETY: a computed, contiguous f32 tensor of `count` elements, on whatever backend.
    unsafe { sys::ggml_backend_tensor_get(t, data.as_mut_ptr() as *mut c_void, 0, 4 * count) };
    let op = unsafe { CStr::from_ptr(sys::ggml_op_desc(t)) }
        .to_string_lossy()
        .into_owned();
    let srcs = t.src[..2]
        .iter()
        .filter(|s| !s.is_null())
        .map(|&s| {
            unsafe { CStr::from_ptr(sys::ggml_get_name(s)) }
                .to_string_lossy()
                .into_owned()
        })
        .collect::<Vec<_>>()
        .join(", ");
    nodes.list.push(Node {
        key,
        op,
        srcs,
        ne: t.ne,
        data,
    });
    true
}

pub struct Options<'a> {
    pub model: &'a Path,
    pub prompt: &'a str,
    pub batch: usize,
    pub ctk: &'a str,
    pub ctv: &'a str,
    pub device: Option<&'a str>,
    pub threads: usize,
}

/// A ggml type by its name as `-ctk` takes it.
fn ggml_type(name: &str) -> Result<sys::ggml_type, String> {
    for t in 0..sys::GGML_TYPE_COUNT {
        let p = unsafe { sys::ggml_type_name(t) };
        if !p.is_null() && unsafe { CStr::from_ptr(p) }.to_bytes() == name.as_bytes() {
            return Ok(t);
        }
    }
    Err(format!("unknown cache type `{name}`"))
}

/// The first token's slice of a batch node, when it differs from the lone node in exactly one
/// dimension, where it is `n` times as long: tokens are that dimension's outer index (the
/// layout of ggml's activations, also where a reshape merged heads and tokens), so the first
/// token is its first `lone` rows. Never dimension 0: a flat node of several tensors packed one
/// after another (a custom op's output that its views cut up) is not comparable.
fn first_token(b: &Node, lone: &Node, n: i64) -> Option<Vec<f32>> {
    let diff: Vec<usize> = (0..4).filter(|&d| b.ne[d] != lone.ne[d]).collect();
    match diff[..] {
        [] => Some(b.data.clone()),
        [d] if d > 0 && b.ne[d] == n * lone.ne[d] => {
            let inner: i64 = b.ne[..d].iter().product::<i64>() * lone.ne[d];
            let outer: i64 = b.ne[d + 1..].iter().product();
            let mut out = Vec::with_capacity((inner * outer) as usize);
            for o in 0..outer {
                let at = (o * n * inner) as usize;
                out.extend_from_slice(&b.data[at..at + inner as usize]);
            }
            Some(out)
        }
        _ => None,
    }
}

pub fn run(o: &Options) -> Result<bool, String> {
    if o.batch < 2 {
        return Err("--batch must be at least 2 (a batch against a lone token)".into());
    }
    let (tk, tv) = (ggml_type(o.ctk)?, ggml_type(o.ctv)?);
    let cpath = CString::new(o.model.as_os_str().as_encoded_bytes())
        .map_err(|_| String::from("model path contains a NUL byte"))?;
    unsafe {
        sys::llama_log_set(Some(crate::capture::log_cb), std::ptr::null_mut());
        sys::llama_backend_init();
    }
    let mut devs: Vec<sys::ggml_backend_dev_t> = Vec::new();
    let mut mp = unsafe { sys::llama_model_default_params() };
    mp.n_gpu_layers = 0;
    if let Some(d) = o.device {
        let cd = CString::new(d).map_err(|_| String::from("device name contains a NUL byte"))?;
        let dev = unsafe { sys::ggml_backend_dev_by_name(cd.as_ptr()) };
        if dev.is_null() {
            let names: Vec<String> = (0..unsafe { sys::ggml_backend_dev_count() })
                .map(|i| {
                    let p = unsafe { sys::ggml_backend_dev_name(sys::ggml_backend_dev_get(i)) };
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                })
                .collect();
            return Err(format!(
                "no device `{d}` in this build (devices: {})",
                names.join(", ")
            ));
        }
        devs.push(dev);
        devs.push(std::ptr::null_mut());
        mp.devices = devs.as_mut_ptr();
        mp.n_gpu_layers = 999;
    }
    let model = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), mp) };
    if model.is_null() {
        return Err(format!(
            "llama.cpp cannot load the model {} (TQ_VERBOSE=1 shows its log)",
            o.model.display()
        ));
    }
    let res = compare(model, o, tk, tv);
    unsafe { sys::llama_model_free(model) };
    res
}

/// Decode `toks` at positions from `pos`, every token an output, in one batch.
fn decode(ctx: *mut sys::llama_context, toks: &[i32], pos: usize) -> Result<(), String> {
    let n = toks.len();
    let mut b = unsafe { sys::llama_batch_init(n as i32, 0, 1) };
    for (i, &t) in toks.iter().enumerate() {
        // SAFETY: llama_batch_init allocated n entries of each array, one seq id each.
        unsafe {
            *b.token.add(i) = t;
            *b.pos.add(i) = (pos + i) as i32;
            *b.n_seq_id.add(i) = 1;
            **b.seq_id.add(i) = 0;
            *b.logits.add(i) = 1;
        }
    }
    b.n_tokens = n as i32;
    let rc = unsafe { sys::llama_decode(ctx, b) };
    unsafe { sys::llama_batch_free(b) };
    if rc != 0 {
        return Err(format!("llama_decode failed ({rc}) on {n} tokens at {pos}"));
    }
    Ok(())
}

/// The last graph's nodes after decoding the prefix (unrecorded) and then `step`.
fn run_graph(
    model: *mut sys::llama_model,
    o: &Options,
    tk: sys::ggml_type,
    tv: sys::ggml_type,
    prefix: &[i32],
    step: &[i32],
) -> Result<Nodes, String> {
    let mut nodes = Box::new(Nodes::default());
    let mut cp = unsafe { sys::llama_context_default_params() };
    cp.n_ctx = (prefix.len() + step.len()).next_multiple_of(256) as u32;
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = o.threads as i32;
    cp.n_threads_batch = o.threads as i32;
    cp.type_k = tk;
    cp.type_v = tv;
    cp.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.cb_eval = Some(eval_cb);
    cp.cb_eval_user_data = &mut *nodes as *mut Nodes as *mut c_void;
    let ctx = unsafe { sys::llama_init_from_model(model, cp) };
    if ctx.is_null() {
        return Err(format!(
            "llama.cpp cannot create a context with K {} and V {}",
            o.ctk, o.ctv
        ));
    }
    let r = decode(ctx, prefix, 0).and_then(|_| {
        *nodes = Nodes::default();
        decode(ctx, step, prefix.len())
    });
    unsafe { sys::llama_free(ctx) };
    r.map(|_| *nodes)
}

fn compare(
    model: *mut sys::llama_model,
    o: &Options,
    tk: sys::ggml_type,
    tv: sys::ggml_type,
) -> Result<bool, String> {
    let prompt =
        CString::new(o.prompt).map_err(|_| String::from("the prompt contains a NUL byte"))?;
    let toks = crate::capture::tokenize(model, &prompt)?;
    if toks.len() < o.batch + 2 {
        return Err(format!(
            "the prompt has {} tokens; --batch {} needs at least {}",
            toks.len(),
            o.batch,
            o.batch + 2
        ));
    }
    let split = toks.len() - o.batch;
    let (prefix, rest) = toks.split_at(split);
    let lone = run_graph(model, o, tk, tv, prefix, &rest[..1])?;
    let batch = run_graph(model, o, tk, tv, prefix, rest)?;
    let by_key: HashMap<&str, &Node> = lone.list.iter().map(|n| (n.key.as_str(), n)).collect();
    println!(
        "token {split} alone and first of a batch of {} ({} prefix tokens, K {} V {}, {}):",
        o.batch,
        prefix.len(),
        o.ctk,
        o.ctv,
        o.device.unwrap_or("CPU")
    );
    // A node with the same shape in both graphs has no token dimension: the cache's cells,
    // their tables and masks, which in the batch's graph also hold the batch's other tokens,
    // so it may differ without the token's own values differing. The verdict counts the
    // token's nodes only (those cut to its slice).
    let (mut first, mut same, mut differ, mut cells_differ, mut unmatched) = (None, 0, 0, 0, 0);
    for b in &batch.list {
        let Some(l) = by_key.get(b.key.as_str()) else {
            println!("{:<28} {:<14} not in the lone graph", b.key, b.op);
            unmatched += 1;
            continue;
        };
        let Some(bt) = first_token(b, l, o.batch as i64).filter(|t| t.len() == l.data.len()) else {
            println!(
                "{:<28} {:<14} not comparable: {:?} in the batch, {:?} alone",
                b.key, b.op, b.ne, l.ne
            );
            unmatched += 1;
            continue;
        };
        let per_token = b.ne != l.ne;
        let bits = bt
            .iter()
            .zip(&l.data)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        let max = bt
            .iter()
            .zip(&l.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let scale = l.data.iter().map(|x| x.abs()).fold(0f32, f32::max);
        if bits == 0 {
            same += 1;
        } else if per_token {
            differ += 1;
            first.get_or_insert_with(|| b.key.clone());
        } else {
            cells_differ += 1;
        }
        println!(
            "{:<28} {:<14} {:>7} of {:>7} differ, max |diff| {:.3e} (max |x| {:.3e}){} <- {}",
            b.key,
            b.op,
            bits,
            bt.len(),
            max,
            scale,
            if per_token { "" } else { " [cells]" },
            b.srcs
        );
    }
    println!(
        "{same} nodes bit-identical, {differ} of the token's nodes differ, {cells_differ} \
         cell-wide nodes differ (they hold the batch's other tokens), {unmatched} not comparable \
         ({} + {} non-f32 or strided nodes not copied)",
        lone.skipped, batch.skipped
    );
    match first {
        Some(k) => println!("first node of the token that differs: {k}"),
        None => println!("batch-invariant: every node of the token has the same bits"),
    }
    Ok(differ == 0)
}
