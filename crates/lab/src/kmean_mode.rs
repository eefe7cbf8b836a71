//! Which K mean the lab models for a capture (`--no-k-mean`, `--k-mean-frame`) and one
//! layer's mean in that mode: off, the plain first-ubatch mean (a capture without RoPE
//! frequencies), tq-kmean.h's fitted mean, or tq-kmean-rope.h's mean in RoPE's frame.
//!
//! Invariant: the mode a capture gets is the one asked for unless the capture cannot model
//! it (no RoPE frequencies, or a layer without full RoPE, where llama.cpp too keeps the
//! fitted mean); then `fallback` says why, and every JSON and caption says which mean ran.

use crate::capture::{Capture, CaptureHeader};
use crate::codec::{roundtrip_rows, Codec};
use crate::kmean::{k_mean, rope_fit_mean, K_MEAN_MIN_TOKENS, K_MEAN_TOKENS};
use crate::kmean_rope::{unrope_mean, KMean, RopeFrame};

/// `--k-mean-frame`: which of llama.cpp's two K mean frames to model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KMeanFrame {
    Rope,
    Fitted,
}

/// The K mean the lab applies to one capture, once the capture's RoPE info is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// --no-k-mean
    Off,
    /// the first-ubatch mean as it is (a capture without RoPE frequencies)
    Plain,
    /// tq-kmean.h's fitted mean
    Fitted,
    /// tq-kmean-rope.h's mean in RoPE's frame
    Rope,
}

impl Frame {
    pub fn name(self) -> &'static str {
        match self {
            Frame::Off => "none",
            Frame::Plain => "plain",
            Frame::Fitted => "fitted",
            Frame::Rope => "rope",
        }
    }

    /// For titles and table captions.
    pub fn words(self) -> &'static str {
        match self {
            Frame::Off => "no K mean removal",
            Frame::Plain => "turbo K mean removed (plain first-ubatch mean)",
            Frame::Fitted => "turbo K mean removed (fitted mean)",
            Frame::Rope => "turbo K mean removed (RoPE frame)",
        }
    }
}

/// What was asked for and what this capture gets (`fallback`: why they differ).
#[derive(Clone, Debug)]
pub struct KMeanMode {
    pub frame: Frame,
    pub asked: Option<KMeanFrame>,
    pub fallback: Option<String>,
}

impl KMeanMode {
    /// The mode for the capture of header `h` with the K mean `on` (or not) in frame
    /// `asked`; a RoPE frame that cannot be modelled falls back to the fixed mean.
    pub fn new(on: bool, asked: KMeanFrame, h: &CaptureHeader) -> KMeanMode {
        let fixed = if h.rope.is_some() {
            Frame::Fitted
        } else {
            Frame::Plain
        };
        let (frame, fallback) = match (on, asked) {
            (false, _) => (Frame::Off, None),
            (true, KMeanFrame::Fitted) => (fixed, None),
            (true, KMeanFrame::Rope) => match rope_frame_missing(h) {
                None => (Frame::Rope, None),
                Some(why) => (fixed, Some(why)),
            },
        };
        KMeanMode {
            frame,
            asked: on.then_some(asked),
            fallback,
        }
    }

    /// The line to tell the user when the asked frame fell back (none otherwise).
    pub fn fallback_message(&self) -> Option<String> {
        self.fallback.as_ref().map(|why| {
            format!(
                "the K mean in RoPE's frame is not modelled for this capture ({why}); using the {} mean instead",
                if self.frame == Frame::Fitted { "fitted" } else { "plain first-ubatch" }
            )
        })
    }

    /// For titles and table captions.
    pub fn words(&self) -> &'static str {
        self.frame.words()
    }

    /// The JSON `k_mean` object of distortion, niah and recommend.
    pub fn json(&self, h: &CaptureHeader) -> serde_json::Value {
        let map = if h.rope.is_some() {
            "then mapped per RoPE pair by F = a_N conj(a_B) / max(|a_B|^2, |a_N| |a_B|) to a cache of n_tokens positions, as llama.cpp does (frequencies recorded by tq capture)"
        } else {
            "not mapped to later positions (this capture predates the recorded RoPE frequencies: llama.cpp's RoPE-fitted mean is not modelled; capture again)"
        };
        let first = format!(
            "the first min({}, n_tokens) captured keys (llama.cpp's first ubatch at its default -ub {}), none if that is under {} tokens",
            K_MEAN_TOKENS, K_MEAN_TOKENS, K_MEAN_MIN_TOKENS
        );
        let rule = match self.frame {
            Frame::Off => "none (--no-k-mean: turbo K caches store k, as llama.cpp with --tq-k-mean off)".to_string(),
            Frame::Rope => format!("turbo K caches keep the mean in RoPE's frame (llama.cpp's default with the model on the CPU, tq-kmean-rope.h; the capture is one sequence): mu per layer and KV head = mean of R_p^-1 k_p over {first}, p = token index; key p stores k_p - R_p mu and attention adds q.R_p mu back, so k^_p = dequant(quant(k_p - R_p mu)) + R_p mu (the needle at the position of the key it replaces); q8_0/q4_0/f16 K and V unchanged"),
            Frame::Fitted | Frame::Plain => format!("turbo K caches store k - m (llama.cpp's K mean removal, tq-kmean.h); m per layer and KV head = mean of {first}, {map}; q8_0/q4_0/f16 K and V unchanged"),
        };
        serde_json::json!({
            "removed": self.frame != Frame::Off,
            "frame": self.frame.name(),
            "frame_asked": self.asked.map(|a| if a == KMeanFrame::Rope { "rope" } else { "fitted" }),
            "fallback": self.fallback,
            "rule": rule,
        })
    }
}

/// Layer `l`'s RoPE as recorded by `tq capture` (frequencies empty when it recorded none).
pub fn rope_frame(h: &CaptureHeader, l: usize) -> Option<RopeFrame<'_>> {
    h.rope.as_ref().map(|r| RopeFrame {
        w: r.freqs.get(l).map_or(&[][..], |f| &f[..]),
        neox: r.neox,
    })
}

/// Why the mean in RoPE's frame cannot be modelled on this capture, if it cannot: no RoPE
/// info, or a layer without full RoPE (where llama.cpp too keeps the fitted mean).
pub fn rope_frame_missing(h: &CaptureHeader) -> Option<String> {
    if h.rope.is_none() {
        return Some(
            "the capture has no RoPE frequencies: it predates their recording by tq capture; capture again"
                .into(),
        );
    }
    (0..h.n_layer).find_map(|l| {
        let r = rope_frame(h, l)?;
        (!r.full(h.head_k)).then(|| {
            format!(
                "layer {l} has {} RoPE frequencies recorded for {} channel pairs, where llama.cpp keeps the fitted mean too",
                r.w.len(),
                h.head_k / 2
            )
        })
    })
}

/// One layer's K mean, owned: `[n_head_kv][head_k]` values (`m`, or `mu` in RoPE's frame)
/// and, in RoPE's frame, the layer's RoPE; `get` lends it as a [`KMean`].
pub struct LayerMean<'c> {
    pub m: Vec<f32>,
    pub rope: Option<RopeFrame<'c>>,
}

impl<'c> LayerMean<'c> {
    pub fn get(&self) -> KMean<'_> {
        match self.rope {
            Some(rope) => KMean::Rope { mu: &self.m, rope },
            None => KMean::Fixed(&self.m),
        }
    }

    /// KV head `kh` alone (a needle pool is one head).
    pub fn head(self, kh: usize, d: usize) -> LayerMean<'c> {
        LayerMean {
            m: self.m[kh * d..(kh + 1) * d].to_vec(),
            rope: self.rope,
        }
    }

    /// What the cache of type `cd` gives back for the layer's keys `rows` (positions from
    /// 0); `lm` `None`: no mean removal.
    pub fn roundtrip(
        lm: &Option<Self>,
        cd: Codec,
        dim: usize,
        rot_dim: usize,
        rows: &[f32],
    ) -> Vec<f32> {
        match lm {
            Some(m) => m.get().roundtrip(cd, dim, rot_dim, rows, 0),
            None => roundtrip_rows(cd, dim, rot_dim, rows),
        }
    }
}

/// Layer `l`'s K mean in `mode`, `None` for no removal.
pub fn layer_k_mean<'c>(c: &'c Capture, l: usize, mode: &KMeanMode) -> Option<LayerMean<'c>> {
    let h = &c.header;
    let (nh, d) = (h.n_head_kv, h.head_k);
    match mode.frame {
        Frame::Off => None,
        Frame::Rope => {
            let rope = rope_frame(h, l).expect("KMeanMode::new checked the RoPE info");
            Some(LayerMean {
                m: unrope_mean(&c.k[l], nh, d, rope, K_MEAN_TOKENS),
                rope: Some(rope),
            })
        }
        Frame::Plain | Frame::Fitted => {
            let mut m = k_mean(&c.k[l], nh, d, K_MEAN_TOKENS);
            if let Some(r) = rope_frame(h, l) {
                // the cache holds every captured position, as a context of n_tokens would
                rope_fit_mean(&mut m, d, r.w, r.neox, K_MEAN_TOKENS, h.n_tokens);
            }
            Some(LayerMean { m, rope: None })
        }
    }
}
