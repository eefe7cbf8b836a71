//! `tq capture`: run a GGUF model through this build's llama.cpp (libllama, linked into
//! `tq`) over a text, with an f16 KV cache (no turbo, no rotation), and save every layer's
//! K, V and Q for the lab subcommands.
//!
//! The tensors come from llama.cpp's graph eval callback (`cb_eval`): the graph names
//! `Kcur-<il>`, `Vcur-<il>`, `Qcur-<il>`; a name can occur more than once in a layer (before
//! and after RoPE, and after q/k norms), and the last one computed is the one attention
//! uses (post-RoPE K and Q). One decode call per micro-batch, so each callback sees one
//! micro-batch of tokens. `TQ_TRACE_CAPTURE=1` prints layer 0's matches in graph order
//! (SmolLM2: Kcur-0 = MUL_MAT, RESHAPE, ROPE; the ROPE one is kept).

use crate::progress::progress;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use turboquant_lab::{Capture, CaptureHeader, RopeInfo};

use turboquant::llama_sys as sys;

extern "C" {
    /// ggml-ext/llama/tq-llama-kv-cache.cpp (part of libllama): the RoPE frequencies per
    /// channel pair of layer `il` that the turbo K mean's position map uses.
    fn tq_llama_rope_freqs(
        model: *const sys::llama_model,
        il: i32,
        n_pos: u32,
        w: *mut f64,
        cap: i32,
        neox: *mut i32,
    ) -> i32;
}

/// What llama.cpp's K mean uses of the model's RoPE, per layer (for the lab's K mean).
fn rope_info(
    model: *mut sys::llama_model,
    n_layer: usize,
    n_pos: usize,
    head_k: usize,
) -> Result<RopeInfo, String> {
    let mut freqs = Vec::with_capacity(n_layer);
    let mut neox = 0i32;
    for il in 0..n_layer {
        let mut w = vec![0f64; head_k / 2];
        // SAFETY: a loaded model, a buffer of `cap` doubles and an i32 out-parameter.
        let n = unsafe {
            tq_llama_rope_freqs(
                model,
                il as i32,
                n_pos as u32,
                w.as_mut_ptr(),
                w.len() as i32,
                &mut neox,
            )
        };
        if n < 0 {
            return Err(format!(
                "layer {il}: llama.cpp refused the RoPE frequency query (head {head_k})"
            ));
        }
        w.truncate(n as usize);
        freqs.push(w);
    }
    Ok(RopeInfo {
        neox: neox != 0,
        freqs,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    K = 0,
    V = 1,
    Q = 2,
}

fn parse_name(name: &str) -> Option<(Kind, usize)> {
    let (kind, il) = name.split_once('-')?;
    let kind = match kind {
        "Kcur" => Kind::K,
        "Vcur" => Kind::V,
        "Qcur" => Kind::Q,
        _ => return None,
    };
    Some((kind, il.parse().ok()?))
}

/// What the callback collects during one decode call: the last tensor of each (kind,
/// layer), as f32 in logical order, with its element count.
struct Grab {
    latest: Vec<[Option<Vec<f32>>; 3]>,
    error: Option<String>,
}

unsafe extern "C" fn eval_cb(t: *mut sys::ggml_tensor, ask: bool, ud: *mut c_void) -> bool {
    // SAFETY: llama.cpp passes a valid tensor and our user data pointer back.
    let grab = unsafe { &mut *(ud as *mut Grab) };
    let name = unsafe { CStr::from_ptr(sys::ggml_get_name(t)) }.to_string_lossy();
    let Some((kind, il)) = parse_name(&name) else {
        return !ask; // not asked for; keep computing
    };
    if il >= grab.latest.len() {
        return !ask;
    }
    if ask {
        return true;
    }
    let t = unsafe { &*t };
    if std::env::var_os("TQ_TRACE_CAPTURE").is_some() && il == 0 {
        let op = unsafe { CStr::from_ptr(sys::ggml_op_desc(t)) }.to_string_lossy();
        eprintln!("tq capture: layer 0 {name} = {op} {:?}", t.ne);
    }
    if t.type_ != sys::GGML_TYPE_F32 {
        grab.error = Some(format!(
            "{name} has type {} (expected f32)",
            unsafe { CStr::from_ptr(sys::ggml_type_name(t.type_)) }.to_string_lossy()
        ));
        return false;
    }
    let n = unsafe { sys::ggml_nelements(t) } as usize;
    let mut out = vec![0f32; n];
    if unsafe { sys::ggml_is_contiguous(t) } {
        // SAFETY: a computed, contiguous f32 tensor of n elements; tensor_get copies it from
        // whatever backend holds it.
        unsafe {
            sys::ggml_backend_tensor_get(t, out.as_mut_ptr() as *mut c_void, 0, 4 * n);
        }
    } else {
        if t.buffer.is_null() || !unsafe { sys::ggml_backend_buffer_is_host(t.buffer) } {
            grab.error = Some(format!("{name} is a strided tensor off the host"));
            return false;
        }
        let (ne, nb) = (t.ne, t.nb);
        let mut i = 0;
        for i3 in 0..ne[3] as usize {
            for i2 in 0..ne[2] as usize {
                for i1 in 0..ne[1] as usize {
                    for i0 in 0..ne[0] as usize {
                        let off = i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                        // SAFETY: in bounds of the tensor's host data by its strides.
                        out[i] = unsafe { *((t.data as *const u8).add(off) as *const f32) };
                        i += 1;
                    }
                }
            }
        }
    }
    grab.latest[il][kind as usize] = Some(out);
    true
}

/// llama.cpp's log: errors only, everything with TQ_VERBOSE set (also `tq batch-check`'s).
pub(crate) unsafe extern "C" fn log_cb(
    level: sys::ggml_log_level,
    text: *const c_char,
    _: *mut c_void,
) {
    if level == sys::GGML_LOG_LEVEL_ERROR || std::env::var_os("TQ_VERBOSE").is_some() {
        eprint!("{}", unsafe { CStr::from_ptr(text) }.to_string_lossy());
    }
}

/// The model's tokens for `text`, BOS as the model wants it (also `tq batch-check`'s).
pub(crate) fn tokenize(model: *mut sys::llama_model, text: &CStr) -> Result<Vec<i32>, String> {
    let vocab = unsafe { sys::llama_model_get_vocab(model) };
    let len = text.to_bytes().len();
    let mut toks = vec![0i32; len + 16];
    // SAFETY: a valid vocab, a NUL-terminated text of len bytes, toks of toks.len() entries.
    let n = unsafe {
        sys::llama_tokenize(
            vocab,
            text.as_ptr(),
            len as i32,
            toks.as_mut_ptr(),
            toks.len() as i32,
            true,
            false,
        )
    };
    if n < 0 {
        return Err(String::from("tokenization failed"));
    }
    toks.truncate(n as usize);
    Ok(toks)
}

pub struct Options<'a> {
    pub model: &'a Path,
    pub text: &'a Path,
    pub out: &'a Path,
    pub tokens: usize,
    pub ubatch: usize,
    pub threads: usize,
}

pub fn run(o: &Options) -> Result<CaptureHeader, String> {
    let text =
        std::fs::read(o.text).map_err(|e| format!("cannot read text {}: {e}", o.text.display()))?;
    let ctext = CString::new(
        text.iter()
            .copied()
            .filter(|&b| b != 0)
            .collect::<Vec<u8>>(),
    )
    .expect("NULs removed");
    let cpath = CString::new(o.model.as_os_str().as_encoded_bytes())
        .map_err(|_| String::from("model path contains a NUL byte"))?;

    unsafe {
        sys::llama_log_set(Some(log_cb), std::ptr::null_mut());
        sys::llama_backend_init();
    }
    let mut mp = unsafe { sys::llama_model_default_params() };
    mp.n_gpu_layers = 0;
    let model = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), mp) };
    if model.is_null() {
        return Err(format!(
            "llama.cpp cannot load the model {} (not a GGUF it supports; TQ_VERBOSE=1 shows its log)",
            o.model.display()
        ));
    }
    let res = capture_with(model, o, &ctext);
    unsafe { sys::llama_model_free(model) };
    res
}

fn capture_with(
    model: *mut sys::llama_model,
    o: &Options,
    text: &CStr,
) -> Result<CaptureHeader, String> {
    let (n_layer, n_head, n_head_kv, n_ctx_train) = unsafe {
        (
            sys::llama_model_n_layer(model) as usize,
            sys::llama_model_n_head(model) as usize,
            sys::llama_model_n_head_kv(model) as usize,
            sys::llama_model_n_ctx_train(model) as usize,
        )
    };
    let mut desc = vec![0u8; 256];
    let n = unsafe { sys::llama_model_desc(model, desc.as_mut_ptr() as *mut c_char, desc.len()) };
    desc.truncate(n.max(0) as usize);
    let desc = String::from_utf8_lossy(&desc).into_owned();
    if n_head_kv == 0 || n_head == 0 {
        return Err(format!(
            "{desc}: no attention heads reported (n_head {n_head}, n_head_kv {n_head_kv})"
        ));
    }

    let mut toks = tokenize(model, text)?;
    if toks.len() < o.tokens {
        return Err(format!(
            "{} has only {} tokens for this model; asked for --tokens {}",
            o.text.display(),
            toks.len(),
            o.tokens
        ));
    }
    toks.truncate(o.tokens);
    if o.tokens > n_ctx_train {
        eprintln!(
            "tq: warning: --tokens {} exceeds the model's training context {n_ctx_train}",
            o.tokens
        );
    }

    let mut cp = unsafe { sys::llama_context_default_params() };
    let ub = o.ubatch.min(o.tokens) as u32;
    cp.n_ctx = o.tokens as u32;
    cp.n_batch = ub;
    cp.n_ubatch = ub;
    cp.n_seq_max = 1;
    cp.n_threads = o.threads as i32;
    cp.n_threads_batch = o.threads as i32;
    cp.type_k = sys::GGML_TYPE_F16;
    cp.type_v = sys::GGML_TYPE_F16;
    let mut grab = Box::new(Grab {
        latest: (0..n_layer).map(|_| [None, None, None]).collect(),
        error: None,
    });
    cp.cb_eval = Some(eval_cb);
    cp.cb_eval_user_data = &mut *grab as *mut Grab as *mut c_void;
    let ctx = unsafe { sys::llama_init_from_model(model, cp) };
    if ctx.is_null() {
        return Err(format!(
            "llama.cpp cannot create a context of {} tokens for {desc}",
            o.tokens
        ));
    }

    let mut k: Vec<Vec<f32>> = vec![Vec::new(); n_layer];
    let mut v: Vec<Vec<f32>> = vec![Vec::new(); n_layer];
    let mut q: Vec<Vec<f32>> = vec![Vec::new(); n_layer];
    let (mut head_k, mut head_v) = (0usize, 0usize);
    let pb = progress(toks.len() as u64, "tokens");
    let mut result = Ok(());
    for chunk in toks.chunks_mut(ub as usize) {
        let batch = unsafe { sys::llama_batch_get_one(chunk.as_mut_ptr(), chunk.len() as i32) };
        let rc = unsafe { sys::llama_decode(ctx, batch) };
        if let Some(e) = grab.error.take() {
            result = Err(format!("capture: {e}"));
            break;
        }
        if rc != 0 {
            result = Err(format!("llama_decode failed ({rc})"));
            break;
        }
        let nt = chunk.len();
        for il in 0..n_layer {
            let [gk, gv, gq] = std::mem::take(&mut grab.latest[il]);
            let (Some(gk), Some(gv), Some(gq)) = (gk, gv, gq) else {
                result = Err(format!(
                    "{desc}: layer {il} has no Kcur/Vcur/Qcur tensor in llama.cpp's graph \
                     (architecture not supported by tq capture)"
                ));
                break;
            };
            let (hk, hv, hq) = (
                gk.len() / (nt * n_head_kv),
                gv.len() / (nt * n_head_kv),
                gq.len() / (nt * n_head),
            );
            if gk.len() != hk * nt * n_head_kv || gv.len() != hv * nt * n_head_kv || hq != hk {
                result = Err(format!(
                    "{desc}: layer {il}: unexpected shapes K {} V {} Q {} for {nt} tokens, \
                     {n_head}/{n_head_kv} heads (per-layer head counts are not supported)",
                    gk.len(),
                    gv.len(),
                    gq.len()
                ));
                break;
            }
            if head_k == 0 {
                (head_k, head_v) = (hk, hv);
            } else if (hk, hv) != (head_k, head_v) {
                result = Err(format!(
                    "{desc}: layer {il} has head {hk}/{hv}, layer 0 {head_k}/{head_v} \
                     (per-layer head sizes are not supported)"
                ));
                break;
            }
            k[il].extend_from_slice(&gk);
            v[il].extend_from_slice(&gv);
            q[il].extend_from_slice(&gq);
        }
        if result.is_err() {
            break;
        }
        pb.inc(nt as u64);
    }
    pb.finish_and_clear();
    unsafe { sys::llama_free(ctx) };
    result?;

    let rope = rope_info(model, n_layer, n_ctx_train.max(toks.len()), head_k)?;
    let header = CaptureHeader {
        version: 1,
        model: o.model.display().to_string(),
        desc,
        text: o.text.display().to_string(),
        n_tokens: toks.len(),
        n_layer,
        n_head,
        n_head_kv,
        head_k,
        head_v,
        dtype: "f16".into(),
        note: "K, Q: last Kcur-<il>/Qcur-<il> of llama.cpp's graph (post-RoPE); V: Vcur-<il>; \
               f16 KV cache, no rotation"
            .into(),
        rope: Some(rope),
    };
    let cap = Capture { header, k, v, q };
    cap.write(o.out)
        .map_err(|e| format!("cannot write the capture: {e}"))?;
    Ok(cap.header)
}
