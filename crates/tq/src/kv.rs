//! KV-cache geometry of a GGUF model and the bytes each cache type needs.

use crate::gguf::{Metadata, Value};

use turboquant_codec::types;

/// A KV-cache element type as llama.cpp's `-ctk` / `-ctv` name it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheType {
    pub name: &'static str,
    /// values per block and bytes per block
    pub block: u64,
    pub bytes: u64,
}

impl CacheType {
    pub fn bits_per_value(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.block as f64
    }
    pub fn row_bytes(&self, n: u64) -> u64 {
        n.div_ceil(self.block) * self.bytes
    }
}

/// A turbo type's row, from the codec's type table.
const fn turbo(t: &types::TypeTraits) -> CacheType {
    CacheType {
        name: t.name,
        block: turboquant_codec::QK as u64,
        bytes: t.block_bytes() as u64,
    }
}

/// Every type llama-server accepts for the KV cache, with ours last.
pub const CACHE_TYPES: &[CacheType] = &[
    CacheType {
        name: "f32",
        block: 1,
        bytes: 4,
    },
    CacheType {
        name: "f16",
        block: 1,
        bytes: 2,
    },
    CacheType {
        name: "bf16",
        block: 1,
        bytes: 2,
    },
    CacheType {
        name: "q8_0",
        block: 32,
        bytes: 34,
    },
    CacheType {
        name: "q4_0",
        block: 32,
        bytes: 18,
    },
    CacheType {
        name: "q4_1",
        block: 32,
        bytes: 20,
    },
    CacheType {
        name: "iq4_nl",
        block: 32,
        bytes: 18,
    },
    CacheType {
        name: "q5_0",
        block: 32,
        bytes: 22,
    },
    CacheType {
        name: "q5_1",
        block: 32,
        bytes: 24,
    },
    turbo(&types::TURBO2),
    turbo(&types::TURBO3),
    turbo(&types::TURBO4),
    turbo(&types::TURBO3_TCQ),
    turbo(&types::TURBO2_TCQ),
];

pub fn cache_type(name: &str) -> Result<CacheType, String> {
    CACHE_TYPES
        .iter()
        .copied()
        .find(|t| t.name == name)
        .ok_or_else(|| {
            let valid: Vec<&str> = CACHE_TYPES.iter().map(|t| t.name).collect();
            format!("unknown cache type `{name}` (valid: {})", valid.join(", "))
        })
}

/// The memory llama.cpp allocates for a model's context, as this llama.cpp pin decides it
/// (vendor/llama.cpp/src: `llama_model::create_memory` in llama-model.cpp, the per-arch
/// `load_arch_hparams` in models/*.cpp, llama-kv-cache-iswa.cpp, llama-memory-recurrent.cpp
/// and `llama_context`'s n_ctx rules in llama-context.cpp).
///
/// Per layer: whether it holds K/V (and how wide its rows are), whether its cache is the
/// sliding-window one, whether it holds a recurrent state instead (hybrids).
#[derive(Debug, Clone)]
pub struct Geometry {
    pub arch: String,
    /// block_count (llama.cpp's n_layer_all, MTP/NextN layers included)
    pub n_layer: u64,
    pub n_ctx_train: u64,
    pub layers: Vec<Layer>,
    /// sliding window (tokens), when some layers use one
    pub swa: Option<Swa>,
    /// floats per sequence of a recurrent layer's R (conv / token-shift) and S (SSM) state
    pub n_embd_r: u64,
    pub n_embd_s: u64,
    /// head sizes of the full-attention layers (and of the sliding-window ones)
    pub head_k: u64,
    pub head_v: u64,
    pub head_k_swa: u64,
    pub head_v_swa: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Swa {
    pub n_swa: u64,
    /// llama4's chunked attention (the cache is sized the same way)
    pub chunked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Layer {
    /// K and V values per token (n_head_kv x head size); V is 0 for MLA's K-only cache
    pub k: u64,
    pub v: u64,
    /// holds a KV cache (attention layer, not filtered out, not sharing another's cache)
    pub kv: bool,
    /// its KV cache is the window-sized one
    pub swa: bool,
    /// holds a recurrent state (R and S rows per sequence)
    pub recurrent: bool,
}

/// The context parameters that size the memory, named as llama.cpp's flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CtxParams {
    /// `-c`: all sequences together (0: the model's training context)
    pub n_ctx: u64,
    /// `-np`: parallel sequences
    pub n_seq: u64,
    /// `-b`, `-ub`
    pub n_batch: u64,
    pub n_ubatch: u64,
    /// `-kvu`: one KV stream shared by all sequences
    pub kv_unified: bool,
    /// `--swa-full`: sliding-window layers get the full context
    pub swa_full: bool,
}

impl Default for CtxParams {
    fn default() -> Self {
        // common_params' defaults (common/common.h)
        CtxParams {
            n_ctx: 0,
            n_seq: 1,
            n_batch: 2048,
            n_ubatch: 512,
            kv_unified: false,
            swa_full: false,
        }
    }
}

/// One `llama_kv_cache`: `cells` per stream, one stream per sequence (or one when unified).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KvPart {
    pub cells: u64,
    pub streams: u64,
    /// K and V values per cell of each layer it holds
    pub k: Vec<u64>,
    pub v: Vec<u64>,
}

impl KvPart {
    pub fn layers(&self) -> usize {
        self.k.len()
    }
    /// (K bytes, V bytes): ggml_nbytes of each layer's [row, cells, streams] tensors.
    pub fn bytes(&self, kt: CacheType, vt: CacheType) -> (u64, u64) {
        let n = self.cells * self.streams;
        let k = self.k.iter().map(|&r| kt.row_bytes(r) * n).sum();
        let v = self
            .v
            .iter()
            .map(|&r| if r == 0 { 0 } else { vt.row_bytes(r) * n })
            .sum();
        (k, v)
    }
    pub fn total(&self, kt: CacheType, vt: CacheType) -> u64 {
        let (k, v) = self.bytes(kt, vt);
        k + v
    }
}

/// `llama_memory_recurrent`: per recurrent layer an R and an S tensor of f32, one row per
/// sequence; the cache types do not apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct State {
    pub layers: u64,
    /// rows per layer: max(1, n_seq) x (1 + n_rs_seq); n_rs_seq is 0 without speculative decoding
    pub rows: u64,
    pub r_bytes: u64,
    pub s_bytes: u64,
}

impl State {
    pub fn total(&self) -> u64 {
        self.r_bytes + self.s_bytes
    }
}

/// What one context allocates.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// n_ctx after llama.cpp's padding, and the cells of one sequence
    pub n_ctx: u64,
    pub n_ctx_seq: u64,
    pub n_ubatch: u64,
    /// the full-context cache (all attention layers when the model has no sliding window)
    pub global: KvPart,
    /// the sliding-window layers' cache (llama_kv_cache_iswa's second cache)
    pub swa: Option<KvPart>,
    pub state: Option<State>,
}

impl Layout {
    /// K + V bytes of every KV cache of the context for a K type and a V type.
    pub fn kv_bytes(&self, k: CacheType, v: CacheType) -> u64 {
        self.global.total(k, v) + self.swa.as_ref().map_or(0, |s| s.total(k, v))
    }
    pub fn state_bytes(&self) -> u64 {
        self.state.map_or(0, |s| s.total())
    }
}

const fn pad(x: u64, n: u64) -> u64 {
    x.div_ceil(n) * n
}

/// The architecture names this llama.cpp pin knows (LLM_ARCH_NAMES in llama-arch.cpp; a
/// unit test checks the list against the vendored source when it is there).
#[rustfmt::skip]
pub const KNOWN_ARCHS: &[&str] = &[
    "clip", "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt",
    "baichuan", "starcoder", "refact", "bert", "modern-bert", "nomic-bert",
    "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert", "bloom",
    "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3next",
    "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2", "phi3", "phimoe",
    "plamo", "plamo2", "plamo3", "codeshell", "orion", "internlm2", "minicpm", "minicpm3",
    "gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding",
    "starcoder2", "mamba", "mamba2", "maple", "jamba", "falcon-h1", "xverse", "command-r",
    "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe", "muse-glimmer", "openelm",
    "arctic", "deepseek", "deepseek2", "deepseek2-ocr", "deepseek32", "deepseek4",
    "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder", "jais", "jais2",
    "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6",
    "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid",
    "graniteswitch", "granite_swa", "chameleon", "wavtokenizer-dec", "plm", "bailingmoe",
    "bailingmoe2", "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe", "laguna",
    "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3",
    "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada",
    "llada-moe", "seed_oss", "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2",
    "minimax-m3", "cogvlm", "rnd1", "pangu-embedded", "mistral3", "eagle3", "dflash",
    "mistral4", "paddleocr", "mimo2", "step35", "spark2_5", "llama-embed", "maincoder",
    "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige", "qwen3tts",
    "pockettts",
];

/// Encoders and diffusion models: llama.cpp creates no memory for them.
#[rustfmt::skip]
const NO_MEMORY: &[&str] = &[
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert",
    "eurobert", "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada",
    "llada-moe", "rnd1", "clip",
];

/// Architectures whose memory is not the attention + recurrent scheme modelled here
/// (indexer caches, compressed caches, shared caches, looped layers, KDA / linear-attention
/// states): `tq memory` says so instead of printing a wrong number.
#[rustfmt::skip]
const NOT_MODELLED: &[&str] = &[
    "minimax-m3", "glm-dsa", "deepseek32", "glm5-next", "hy_v4", "dots3note", "deepseek4",
    "dflash", "gemma4-assistant", "qwen4exp", "kimi-linear", "kimi-k3", "bailingmoe3",
    "nanbeige", "graniteswitch", "minimax-01",
];

/// Pure recurrent architectures (llm_arch_is_recurrent).
const RECURRENT: &[&str] = &["mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"];

/// Hybrids modelled here (llm_arch_is_hybrid, less the NOT_MODELLED ones).
#[rustfmt::skip]
const HYBRID: &[&str] = &[
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "qwen3next", "qwen35", "qwen35moe",
];

/// How an architecture decides that it uses a sliding window (its load_arch_hparams).
#[derive(Clone, Copy)]
enum SwaWhen {
    /// always; `sliding_window` must be in the GGUF
    Required,
    /// always; the key overrides this default
    Default(u64),
    /// only when `sliding_window` is present and positive
    IfPositive,
    /// only when the key is present and positive; then the window is this, whatever the key says
    IfPositiveForced(u64),
    /// llama4: chunked unless the key is present and 0; the chunk is 8192, whatever the key says
    Llama4,
    /// exaone4: only with 64 layers (32B); window 4096 unless the key says otherwise
    Exaone4,
}

#[derive(Clone, Copy)]
enum SwaLayers {
    /// load_swa_pattern(n, dense_first): a `sliding_window_pattern` array, else its scalar
    /// (or this n) through set_swa_pattern
    Pattern(u64, bool),
    /// a `sliding_window_pattern` array is required
    Array,
    /// lfm2: every attention layer
    Attention,
}

fn swa_rule(arch: &str) -> Option<(SwaWhen, SwaLayers)> {
    use SwaLayers::*;
    use SwaWhen::*;
    Some(match arch {
        "gemma2" => (Default(4096), Pattern(2, false)),
        "gemma3" => (IfPositive, Pattern(6, false)),
        "gemma3n" => (Required, Pattern(5, false)),
        "gemma4" => (Required, Array),
        "cohere2" => (Required, Pattern(4, false)),
        "cohere2moe" => (Required, Pattern(4, true)),
        "exaone4" => (Exaone4, Pattern(4, false)),
        "exaone-moe" => (Required, Pattern(4, false)),
        "afmoe" | "olmo2" | "mellum" => (IfPositive, Pattern(4, false)),
        "laguna" => (IfPositive, Pattern(4, true)),
        "plamo3" => (IfPositive, Pattern(8, false)),
        "smallthinker" => (IfPositiveForced(4096), Pattern(4, true)),
        "llama4" => (Llama4, Pattern(4, false)),
        "gpt-oss" => (Required, Pattern(2, false)),
        "muse-glimmer" => (Required, Pattern(4, false)),
        "granite_swa" | "maple" | "mimo2" | "step35" | "spark2_5" => (Required, Array),
        "lfm2" => (IfPositive, Attention),
        _ => return None,
    })
}

struct Md<'a> {
    md: &'a Metadata,
    arch: &'a str,
}

impl Md<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.md.get(&format!("{}.{k}", self.arch))
    }
    fn name(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    /// An optional scalar count; a value of the wrong type is an error, not a default.
    fn opt(&self, k: &str) -> Result<Option<u64>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("GGUF key {} is not a non-negative integer", self.name(k))),
        }
    }
    fn req(&self, k: &str, why: &str) -> Result<u64, String> {
        self.opt(k)?.ok_or_else(|| {
            format!(
                "GGUF lacks {} ({why}); llama.cpp would refuse this model too",
                self.name(k)
            )
        })
    }
    /// llama.cpp's get_key_or_arr: a scalar for every layer, or an array of exactly n.
    fn per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<u64>>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                if a.len() != n {
                    return Err(format!(
                        "GGUF key {} has {} values for {n} layers",
                        self.name(k),
                        a.len()
                    ));
                }
                a.iter()
                    .map(|x| {
                        x.as_u64()
                            .ok_or_else(|| format!("GGUF key {} holds a non-integer", self.name(k)))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            }
            Some(v) => v
                .as_u64()
                .map(|x| Some(vec![x; n]))
                .ok_or_else(|| format!("GGUF key {} is not an integer", self.name(k))),
        }
    }
    /// llama.cpp's get_arr into a per-layer array (shorter arrays leave the rest false).
    fn flags(&self, k: &str, n: usize) -> Result<Option<Vec<bool>>, String> {
        match self.get(k) {
            Some(Value::Array(a)) => {
                if a.len() > n {
                    return Err(format!(
                        "GGUF key {} has {} values for {n} layers",
                        self.name(k),
                        a.len()
                    ));
                }
                let mut v = vec![false; n];
                for (i, x) in a.iter().enumerate() {
                    v[i] = x
                        .as_u64()
                        .ok_or_else(|| format!("GGUF key {} holds a non-integer", self.name(k)))?
                        != 0;
                }
                Ok(Some(v))
            }
            _ => Ok(None),
        }
    }
}

/// llama_hparams::set_swa_pattern over the first `n_eff` layers (the rest are not SWA).
fn swa_pattern(n: u64, dense_first: bool, n_eff: usize, n_all: usize) -> Vec<bool> {
    (0..n_all)
        .map(|il| {
            let il = il as u64;
            if il >= n_eff as u64 {
                false
            } else if n == 0 {
                true
            } else if dense_first {
                !il.is_multiple_of(n)
            } else {
                il % n < n - 1
            }
        })
        .collect()
}

impl Geometry {
    pub fn from_gguf(md: &Metadata) -> Result<Geometry, String> {
        let arch = md
            .str("general.architecture")
            .ok_or("GGUF lacks general.architecture")?
            .to_string();
        let a = arch.as_str();
        if !KNOWN_ARCHS.contains(&a) {
            return Err(format!(
                "unknown architecture `{arch}`: this llama.cpp build does not know it, so \
                 there is no KV cache to size"
            ));
        }
        if NO_MEMORY.contains(&a) {
            return Err(format!(
                "architecture `{arch}` keeps no KV cache in llama.cpp (an encoder or a \
                 diffusion model): nothing to size"
            ));
        }
        if NOT_MODELLED.contains(&a) {
            return Err(format!(
                "architecture `{arch}`: llama.cpp gives it its own memory type (indexer, \
                 shared or compressed caches, or a state tq does not model); tq memory does \
                 not size it rather than print a wrong number"
            ));
        }
        let g = Md { md, arch: a };
        let n_all = g.req("block_count", "the number of layers")?;
        if n_all == 0 || n_all > 512 {
            return Err(format!("GGUF says {arch}.block_count = {n_all}"));
        }
        let n = n_all as usize;
        let nextn = g.opt("nextn_predict_layers")?.unwrap_or(0);
        if nextn > n_all {
            return Err(format!(
                "GGUF says {arch}.nextn_predict_layers = {nextn} > block_count {n_all}"
            ));
        }
        let n_eff = (n_all - nextn) as usize; // llama_hparams::n_layer()
        let n_embd = g.req("embedding_length", "the model width")?;
        let n_ctx_train = g.opt("context_length")?.unwrap_or(0);
        let n_head = g
            .per_layer("attention.head_count", n)?
            .unwrap_or(vec![0; n]);
        let n_head_kv = g
            .per_layer("attention.head_count_kv", n)?
            .unwrap_or_else(|| n_head.clone());
        let n_ff = g.per_layer("feed_forward_length", n)?.unwrap_or(vec![0; n]);
        let recurrent_arch = RECURRENT.contains(&a);
        let hybrid = HYBRID.contains(&a);
        if n_head[0] == 0 && !recurrent_arch {
            return Err(format!(
                "GGUF lacks {arch}.attention.head_count (an attention model needs it)"
            ));
        }
        let default_head = n_embd.checked_div(n_head[0]).unwrap_or(0);
        let head_k = g.opt("attention.key_length")?.unwrap_or(default_head);
        let head_v = g.opt("attention.value_length")?.unwrap_or(default_head);
        let head_k_swa = g.opt("attention.key_length_swa")?.unwrap_or(head_k);
        let head_v_swa = g.opt("attention.value_length_swa")?.unwrap_or(head_v);
        // MLA (deepseek2 and kin): only K is cached (has_v = !is_mla)
        let mla = g.opt("attention.key_length_mla")?.unwrap_or(0) != 0
            && g.opt("attention.value_length_mla")?.unwrap_or(0) != 0;

        // recurrent layers (is_recr)
        let recr: Vec<bool> = if recurrent_arch || a == "falcon-h1" {
            vec![true; n]
        } else if matches!(a, "nemotron_h" | "nemotron_h_moe") {
            (0..n)
                .map(|i| i < n_eff && n_head_kv[i] == 0 && n_ff[i] == 0)
                .collect()
        } else if matches!(a, "qwen3next" | "qwen35" | "qwen35moe") {
            match g.per_layer("attention.recurrent_layers", n)? {
                Some(v) => v.iter().map(|&x| x != 0).collect(),
                None => {
                    let every = g.opt("full_attention_interval")?.unwrap_or(4);
                    if every == 0 {
                        return Err(format!("GGUF says {arch}.full_attention_interval = 0"));
                    }
                    (0..n)
                        .map(|i| i < n_eff && !(i as u64 + 1).is_multiple_of(every))
                        .collect()
                }
            }
        } else if hybrid {
            (0..n).map(|i| i < n_eff && n_head_kv[i] == 0).collect()
        } else {
            vec![false; n]
        };

        // sliding window
        let mut swa = None;
        let mut is_swa = vec![false; n];
        if let Some((when, layers)) = swa_rule(a) {
            let key = g.opt("attention.sliding_window")?;
            let n_swa = match when {
                SwaWhen::Required => Some(key.ok_or_else(|| {
                    format!("GGUF lacks {arch}.attention.sliding_window (required for {arch})")
                })?),
                SwaWhen::Default(d) => Some(key.unwrap_or(d)),
                SwaWhen::IfPositive => key.filter(|&w| w > 0),
                SwaWhen::IfPositiveForced(w) => key.filter(|&k| k > 0).map(|_| w),
                SwaWhen::Llama4 => (key != Some(0)).then_some(8192),
                SwaWhen::Exaone4 => (n_eff == 64).then(|| key.unwrap_or(4096)),
            };
            if let Some(n_swa) = n_swa {
                is_swa = match layers {
                    SwaLayers::Pattern(p, dense_first) => {
                        match g.flags("attention.sliding_window_pattern", n)? {
                            Some(v) => v,
                            None => {
                                let p = g.opt("attention.sliding_window_pattern")?.unwrap_or(p);
                                swa_pattern(p, dense_first, n_eff, n)
                            }
                        }
                    }
                    SwaLayers::Array => g
                        .flags("attention.sliding_window_pattern", n)?
                        .ok_or_else(|| {
                            format!(
                                "GGUF lacks the {arch}.attention.sliding_window_pattern array \
                                 (required for {arch})"
                            )
                        })?,
                    SwaLayers::Attention => (0..n).map(|i| i < n_eff && !recr[i]).collect(),
                };
                swa = Some(Swa {
                    n_swa,
                    chunked: a == "llama4",
                });
            }
        }

        // layers that have their own KV (llama_hparams::has_kv): the rest reuse earlier ones
        let kv_from_start = match a {
            "gemma3n" => Some(20),
            "gemma4" => Some(n_all - g.opt("attention.shared_kv_layers")?.unwrap_or(0).min(n_all)),
            _ => None,
        };
        let layers = (0..n)
            .map(|il| {
                let in_trunk = il < n_eff;
                // the attention filter of create_memory for this architecture
                let attn = match a {
                    _ if recurrent_arch => false,
                    "falcon-h1" => true,
                    "nemotron_h" | "nemotron_h_moe" => !recr[il] && n_ff[il] == 0,
                    "qwen3next" | "qwen35" | "qwen35moe" => in_trunk && !recr[il],
                    _ if hybrid => !recr[il],
                    // MTP/NextN layers belong to a draft context (router_layer unused here)
                    _ => nextn == 0 || in_trunk,
                };
                let has_kv = kv_from_start.is_none_or(|s| (il as u64) < s);
                let s = is_swa[il];
                let (hk, hv) = if s {
                    (head_k_swa, head_v_swa)
                } else {
                    (head_k, head_v)
                };
                // llama_memory_recurrent walks the trunk layers only
                let recurrent = in_trunk && recr[il];
                Layer {
                    k: hk * n_head_kv[il],
                    v: if mla { 0 } else { hv * n_head_kv[il] },
                    kv: attn && has_kv,
                    swa: s,
                    recurrent,
                }
            })
            .collect();

        // recurrent state widths (llama_hparams::n_embd_r / n_embd_s)
        let (n_embd_r, n_embd_s) = if recurrent_arch || hybrid {
            let wkv = g.opt("wkv.head_size")?.unwrap_or(0);
            let l_cache = g.opt("shortconv.l_cache")?.unwrap_or(0);
            let d_conv = g.opt("ssm.conv_kernel")?.unwrap_or(0);
            let d_inner = g.opt("ssm.inner_size")?.unwrap_or(0);
            let d_state = g.opt("ssm.state_size")?.unwrap_or(0);
            let n_group = g.opt("ssm.group_count")?.unwrap_or(0);
            let s = if wkv != 0 {
                n_embd * wkv
            } else {
                d_state * d_inner
            };
            let r = if wkv != 0 {
                g.opt("token_shift_count")?.unwrap_or(2) * n_embd
            } else if l_cache != 0 {
                n_embd * (l_cache - 1)
            } else {
                d_conv.saturating_sub(1) * (d_inner + 2 * n_group * d_state)
            };
            if matches!(a, "lfm2" | "lfm2moe") && l_cache == 0 {
                return Err(format!(
                    "GGUF lacks {arch}.shortconv.l_cache (required for {arch})"
                ));
            }
            if r == 0 && s == 0 {
                return Err(format!(
                    "GGUF lacks the recurrent state sizes of {arch} (ssm.conv_kernel, \
                     ssm.inner_size, ssm.state_size or wkv.head_size)"
                ));
            }
            (r, s)
        } else {
            (0, 0)
        };

        Ok(Geometry {
            arch,
            n_layer: n_all,
            n_ctx_train,
            layers,
            swa,
            n_embd_r,
            n_embd_s,
            head_k,
            head_v,
            head_k_swa,
            head_v_swa,
        })
    }

    /// The pre-SWA reading: every layer holds K/V of head_count_kv heads. Only for callers
    /// that need a per-token figure on architectures `from_gguf` refuses (`tq eval`).
    pub fn plain(md: &Metadata) -> Result<Geometry, String> {
        let arch = md
            .str("general.architecture")
            .ok_or("GGUF lacks general.architecture")?;
        let g = Md { md, arch };
        let n = g.req("block_count", "the number of layers")?.min(512) as usize;
        let n_embd = g.req("embedding_length", "the model width")?;
        let n_head = g
            .per_layer("attention.head_count", n)?
            .unwrap_or(vec![0; n]);
        let n_head_kv = g
            .per_layer("attention.head_count_kv", n)?
            .unwrap_or_else(|| n_head.clone());
        let d = n_embd / n_head.first().copied().unwrap_or(0).max(1);
        let head_k = g.opt("attention.key_length")?.unwrap_or(d);
        let head_v = g.opt("attention.value_length")?.unwrap_or(head_k);
        Ok(Geometry::uniform(arch, &n_head_kv, head_k, head_v))
    }

    /// Every layer full attention with these KV heads.
    pub fn uniform(arch: &str, n_head_kv: &[u64], head_k: u64, head_v: u64) -> Geometry {
        Geometry {
            arch: arch.into(),
            n_layer: n_head_kv.len() as u64,
            n_ctx_train: 0,
            layers: n_head_kv
                .iter()
                .map(|&h| Layer {
                    k: h * head_k,
                    v: h * head_v,
                    kv: true,
                    ..Layer::default()
                })
                .collect(),
            swa: None,
            n_embd_r: 0,
            n_embd_s: 0,
            head_k,
            head_v,
            head_k_swa: head_k,
            head_v_swa: head_v,
        }
    }

    /// K + V bytes one token costs in every layer that holds KV (as if all were global).
    pub fn bytes_per_token(&self, k: CacheType, v: CacheType) -> u64 {
        self.layers
            .iter()
            .filter(|l| l.kv)
            .map(|l| k.row_bytes(l.k) + if l.v == 0 { 0 } else { v.row_bytes(l.v) })
            .sum()
    }

    /// K + V values one token has in every layer that holds KV.
    pub fn values_per_token(&self) -> u64 {
        self.layers.iter().filter(|l| l.kv).map(|l| l.k + l.v).sum()
    }

    /// Layers holding KV in the full-context cache, in the window cache, and recurrent ones.
    pub fn counts(&self) -> (usize, usize, usize) {
        let kv = |w: bool| {
            self.layers
                .iter()
                .filter(|l| l.kv && (self.swa.is_some() && l.swa) == w)
                .count()
        };
        let r = self.layers.iter().filter(|l| l.recurrent).count();
        (kv(false), kv(true), r)
    }

    /// What llama.cpp allocates for a context with these parameters.
    pub fn layout(&self, p: &CtxParams) -> Result<Layout, String> {
        if p.n_seq == 0 || p.n_seq > 256 {
            return Err(format!(
                "--np {} (llama.cpp takes 1 to 256 sequences)",
                p.n_seq
            ));
        }
        if p.n_batch == 0 || p.n_ubatch == 0 {
            return Err("batch sizes must be positive".into());
        }
        // llama_context's constructor
        let n_ctx = if p.n_ctx == 0 {
            if self.n_ctx_train == 0 {
                return Err(format!(
                    "-c 0 means the training context, and the GGUF lacks {}.context_length",
                    self.arch
                ));
            }
            self.n_ctx_train
        } else {
            p.n_ctx
        };
        let n_batch = p.n_batch.min(n_ctx); // causal attention
        let n_ubatch = n_batch.min(p.n_ubatch);
        let mut n_ctx = pad(n_ctx, 256);
        let n_ctx_seq = if p.kv_unified {
            n_ctx
        } else {
            let s = pad(n_ctx / p.n_seq, 256);
            if s == 0 {
                return Err("n_ctx_seq == 0".into());
            }
            n_ctx = s * p.n_seq;
            s
        };
        let streams = if p.kv_unified { 1 } else { p.n_seq };
        let part = |cells: u64, want_swa: Option<bool>| KvPart {
            cells,
            streams,
            k: self
                .layers
                .iter()
                .filter(|l| l.kv && want_swa.is_none_or(|w| l.swa == w))
                .map(|l| l.k)
                .collect(),
            v: self
                .layers
                .iter()
                .filter(|l| l.kv && want_swa.is_none_or(|w| l.swa == w))
                .map(|l| l.v)
                .collect(),
        };
        let (global, swa) = match self.swa {
            // llama_kv_cache_iswa: the window cache is always padded to 256
            Some(w) => {
                let mut cells = pad(
                    n_ctx_seq.min(w.n_swa * if p.kv_unified { p.n_seq } else { 1 } + n_ubatch),
                    256,
                );
                if p.swa_full {
                    cells = n_ctx_seq;
                }
                (part(n_ctx_seq, Some(false)), Some(part(cells, Some(true))))
            }
            None => (part(n_ctx_seq, None), None),
        };
        let n_recr = self.layers.iter().filter(|l| l.recurrent).count() as u64;
        let state = (n_recr > 0).then(|| {
            let rows = p.n_seq.max(1);
            State {
                layers: n_recr,
                rows,
                r_bytes: 4 * self.n_embd_r * rows * n_recr,
                s_bytes: 4 * self.n_embd_s * rows * n_recr,
            }
        });
        Ok(Layout {
            n_ctx,
            n_ctx_seq,
            n_ubatch,
            global,
            swa,
            state,
        })
    }

    /// Whether every KV layer's heads can use the turbo types (whole 64-value blocks per head).
    pub fn turbo_ok(&self) -> bool {
        let swa = self.layers.iter().any(|l| l.kv && l.swa);
        let full = self.layers.iter().any(|l| l.kv && !l.swa);
        (!full || (self.head_k.is_multiple_of(64) && self.head_v.is_multiple_of(64)))
            && (!swa || (self.head_k_swa.is_multiple_of(64) && self.head_v_swa.is_multiple_of(64)))
    }
}

pub fn human_bytes(b: f64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < U.len() {
        x /= 1024.0;
        i += 1;
    }
    format!("{x:.2} {}", U[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_per_value_match_the_block_formats() {
        let b = |n| cache_type(n).unwrap().bits_per_value();
        assert_eq!(b("turbo2"), 2.25);
        assert_eq!(b("turbo3"), 3.25);
        assert_eq!(b("turbo4"), 4.25);
        assert_eq!(b("q4_0"), 4.5);
        assert_eq!(b("q8_0"), 8.5);
        assert_eq!(b("f16"), 16.0);
    }

    #[test]
    fn unknown_type_names_the_valid_ones() {
        let e = cache_type("turbo9").unwrap_err();
        assert!(
            e.contains("turbo9") && e.contains("turbo4") && e.contains("q8_0"),
            "{e}"
        );
    }

    fn md(arch: &str, kv: &[(&str, Value)]) -> Metadata {
        let mut m = std::collections::BTreeMap::new();
        m.insert("general.architecture".into(), Value::Str(arch.into()));
        for (k, v) in kv {
            m.insert(format!("{arch}.{k}"), v.clone());
        }
        Metadata(m)
    }

    fn int(v: i64) -> Value {
        Value::Int(v)
    }

    fn ctx(n_ctx: u64) -> CtxParams {
        CtxParams {
            n_ctx,
            ..CtxParams::default()
        }
    }

    #[test]
    fn llama3_8b_bytes() {
        // Llama-3-8B: 32 layers, 8 KV heads, head 128: f16 = 128 KiB per token.
        let m = md(
            "llama",
            &[
                ("block_count", int(32)),
                ("embedding_length", int(4096)),
                ("attention.head_count", int(32)),
                ("attention.head_count_kv", int(8)),
            ],
        );
        let g = Geometry::from_gguf(&m).unwrap();
        let l = g.layout(&ctx(8192)).unwrap();
        let f16 = cache_type("f16").unwrap();
        assert_eq!(l.kv_bytes(f16, f16), 131072 * 8192);
        assert!(l.swa.is_none() && l.state.is_none());
        let t4 = cache_type("turbo4").unwrap();
        assert_eq!(l.kv_bytes(t4, t4), 32 * 8 * 2 * 2 * 34 * 8192);
        // -c is padded to 256 and split between sequences, each padded again
        let l = g
            .layout(&CtxParams {
                n_ctx: 1000,
                n_seq: 3,
                ..CtxParams::default()
            })
            .unwrap();
        assert_eq!((l.n_ctx_seq, l.global.streams, l.n_ctx), (512, 3, 1536));
    }

    fn gemma3_270m() -> Geometry {
        // the metadata of gemma-3-270m-q4_k_m.gguf
        Geometry::from_gguf(&md(
            "gemma3",
            &[
                ("context_length", int(32768)),
                ("embedding_length", int(640)),
                ("block_count", int(18)),
                ("attention.head_count", int(4)),
                ("attention.head_count_kv", int(1)),
                ("attention.key_length", int(256)),
                ("attention.value_length", int(256)),
                ("attention.sliding_window", int(512)),
            ],
        ))
        .unwrap()
    }

    #[test]
    fn gemma3_sliding_window_layers_get_a_window_sized_cache() {
        let g = gemma3_270m();
        // pattern 6: layers 5, 11, 17 are global
        assert_eq!(g.counts(), (3, 15, 0));
        let f16 = cache_type("f16").unwrap();
        let l = g.layout(&ctx(32768)).unwrap();
        // llama.cpp's log: 32768 cells x 3 layers = 96 MiB, 1024 cells x 15 layers = 15 MiB
        assert_eq!(l.swa.as_ref().unwrap().cells, 1024);
        assert_eq!(l.global.total(f16, f16), 96 << 20);
        assert_eq!(l.swa.as_ref().unwrap().total(f16, f16), 15 << 20);
        // --swa-full, -ub 100, unified with 4 sequences
        let full = CtxParams {
            swa_full: true,
            ..ctx(32768)
        };
        assert_eq!(g.layout(&full).unwrap().swa.unwrap().cells, 32768);
        let ub = CtxParams {
            n_ubatch: 100,
            ..ctx(32768)
        };
        assert_eq!(g.layout(&ub).unwrap().swa.unwrap().cells, 768);
        let uni = CtxParams {
            n_seq: 4,
            kv_unified: true,
            ..ctx(32768)
        };
        let l = g.layout(&uni).unwrap();
        assert_eq!((l.global.cells, l.global.streams), (32768, 1));
        assert_eq!(l.swa.unwrap().cells, 2560); // 512 x 4 + 512
                                                // a window larger than the context: the context, padded
        assert_eq!(g.layout(&ctx(300)).unwrap().swa.unwrap().cells, 512);
    }

    #[test]
    fn gemma3_without_a_window_key_is_all_global() {
        let m = md(
            "gemma3",
            &[
                ("embedding_length", int(640)),
                ("block_count", int(18)),
                ("attention.head_count", int(4)),
            ],
        );
        let g = Geometry::from_gguf(&m).unwrap();
        assert_eq!(g.counts(), (18, 0, 0));
        assert!(g.swa.is_none());
    }

    #[test]
    fn pattern_arrays_and_scalars_override_the_default() {
        let base = [
            ("embedding_length", int(256)),
            ("block_count", int(4)),
            ("attention.head_count", int(4)),
            ("attention.sliding_window", int(128)),
        ];
        let mut kv = base.to_vec();
        kv.push((
            "attention.sliding_window_pattern",
            Value::Array(vec![
                Value::Bool(true),
                Value::Bool(false),
                Value::Bool(true),
                Value::Bool(true),
            ]),
        ));
        let g = Geometry::from_gguf(&md("gemma3", &kv)).unwrap();
        assert_eq!(g.counts(), (1, 3, 0));
        let mut kv = base.to_vec();
        kv.push(("attention.sliding_window_pattern", int(2)));
        let g = Geometry::from_gguf(&md("gemma3", &kv)).unwrap();
        assert_eq!(g.counts(), (2, 2, 0));
        // granite_swa needs the array
        let e = Geometry::from_gguf(&md("granite_swa", &base)).unwrap_err();
        assert!(e.contains("sliding_window_pattern"), "{e}");
    }

    #[test]
    fn granite_hybrid_state_and_kv() {
        // scripts/random_gguf.py --arch granitehybrid --head 64 --n-head 4 --n-head-kv 2
        // --n-layer 6: layers 2 and 5 attention, the rest Mamba-2
        let hkv: Vec<Value> = [0, 0, 2, 0, 0, 2].iter().map(|&x| int(x)).collect();
        let g = Geometry::from_gguf(&md(
            "granitehybrid",
            &[
                ("embedding_length", int(256)),
                ("block_count", int(6)),
                ("attention.head_count", int(4)),
                ("attention.head_count_kv", Value::Array(hkv)),
                ("ssm.conv_kernel", int(4)),
                ("ssm.inner_size", int(512)),
                ("ssm.state_size", int(64)),
                ("ssm.group_count", int(1)),
                ("ssm.time_step_rank", int(8)),
            ],
        ))
        .unwrap();
        assert_eq!(g.counts(), (2, 0, 4));
        let l = g
            .layout(&CtxParams {
                n_seq: 2,
                ..ctx(4096)
            })
            .unwrap();
        let st = l.state.unwrap();
        // R: (4 - 1) x (512 + 2 x 64) floats, S: 64 x 512 floats, per layer and sequence
        assert_eq!(st.r_bytes, 4 * 3 * 640 * 2 * 4);
        assert_eq!(st.s_bytes, 4 * 64 * 512 * 2 * 4);
        let f16 = cache_type("f16").unwrap();
        assert_eq!(l.global.total(f16, f16), 2 * 2048 * 2 * 128 * 2 * 2);
    }

    #[test]
    fn lfm2_with_a_window_puts_its_attention_layers_in_the_window_cache() {
        let hkv: Vec<Value> = [0, 0, 2, 0, 0, 2].iter().map(|&x| int(x)).collect();
        let g = Geometry::from_gguf(&md(
            "lfm2",
            &[
                ("embedding_length", int(256)),
                ("block_count", int(6)),
                ("attention.head_count", int(4)),
                ("attention.head_count_kv", Value::Array(hkv)),
                ("shortconv.l_cache", int(3)),
                ("attention.sliding_window", int(256)),
            ],
        ))
        .unwrap();
        assert_eq!(g.counts(), (0, 2, 4));
        let l = g.layout(&ctx(4096)).unwrap();
        assert_eq!(l.swa.as_ref().unwrap().cells, 768);
        assert_eq!(l.state.unwrap().r_bytes, 4 * 256 * 2 * 4);
        assert_eq!(l.state.unwrap().s_bytes, 0);
    }

    #[test]
    fn bad_metadata_is_an_error_not_a_panic() {
        let e = Geometry::from_gguf(&md("no-such-arch", &[])).unwrap_err();
        assert!(e.contains("unknown architecture"), "{e}");
        let e = Geometry::from_gguf(&md("llama", &[("embedding_length", int(64))])).unwrap_err();
        assert!(e.contains("block_count"), "{e}");
        let e = Geometry::from_gguf(&md("llama", &[("block_count", int(2))])).unwrap_err();
        assert!(e.contains("embedding_length"), "{e}");
        let e = Geometry::from_gguf(&md(
            "llama",
            &[("block_count", int(2)), ("embedding_length", int(64))],
        ))
        .unwrap_err();
        assert!(e.contains("head_count"), "{e}");
        let e = Geometry::from_gguf(&md(
            "llama",
            &[
                ("block_count", int(2)),
                ("embedding_length", int(64)),
                ("attention.head_count", Value::Array(vec![int(1)])),
            ],
        ))
        .unwrap_err();
        assert!(e.contains("1 values for 2 layers"), "{e}");
        let e = Geometry::from_gguf(&md(
            "llama",
            &[
                ("block_count", Value::Str("x".into())),
                ("embedding_length", int(64)),
            ],
        ))
        .unwrap_err();
        assert!(e.contains("not a non-negative integer"), "{e}");
        for arch in ["bert", "deepseek4"] {
            let e = Geometry::from_gguf(&md(arch, &[])).unwrap_err();
            assert!(e.contains(arch), "{e}");
        }
        let e = Geometry::from_gguf(&md(
            "mamba2",
            &[("block_count", int(2)), ("embedding_length", int(64))],
        ))
        .unwrap_err();
        assert!(e.contains("recurrent state"), "{e}");
        let g = gemma3_270m();
        let e = g
            .layout(&CtxParams {
                n_seq: 0,
                ..ctx(512)
            })
            .unwrap_err();
        assert!(e.contains("--np"), "{e}");
    }

    /// KNOWN_ARCHS is LLM_ARCH_NAMES of the vendored llama.cpp (when it is materialised).
    #[test]
    fn known_archs_match_the_vendored_llama_cpp() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../vendor/llama.cpp/src/llama-arch.cpp");
        let Ok(text) = std::fs::read_to_string(&src) else {
            eprintln!("skipped: {} is not there", src.display());
            return;
        };
        let start = text.find("LLM_ARCH_NAMES = {").expect("LLM_ARCH_NAMES");
        let end = start + text[start..].find("};").unwrap();
        let names: Vec<&str> = text[start..end]
            .lines()
            .filter_map(|l| l.split('"').nth(1))
            .filter(|n| *n != "(unknown)")
            .collect();
        assert_eq!(
            names,
            KNOWN_ARCHS,
            "update KNOWN_ARCHS from {}",
            src.display()
        );
    }
}
