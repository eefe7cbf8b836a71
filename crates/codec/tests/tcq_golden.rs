//! Golden encodings of the trellis-coded types: the encoder's bytes are part
//! of the format (the CUDA port must reproduce them), so any change to them
//! (tables, tie rules, the tail-biting search, the scale) must be deliberate.
//! Input: a deterministic SplitMix64/Box-Muller stream (seed 1616) of 1024
//! blocks with per-block scales 2^-20 .. 2^20 and a few special blocks; the
//! pinned value is the FNV-1a 64 hash of the encoded bytes. Every dispatch
//! level must produce them.

use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::tcq::{codec, Scratch, TcqType};

fn input() -> Vec<f32> {
    let mut r = SplitMix64::new(1616);
    let mut x = Vec::with_capacity(1024 * 64);
    for b in 0..1024 {
        let scale = 2f32.powi(b % 41 - 20);
        for _ in 0..64 {
            x.push(r.next_gaussian() as f32 * scale);
        }
    }
    x[..64].fill(0.0);
    x[64 + 5] = f32::NAN;
    x[128 + 1] = f32::INFINITY;
    x[128 + 2] = f32::NEG_INFINITY;
    x[192..256].iter_mut().for_each(|v| *v *= 1e-40);
    x[256..320].fill(0.0);
    x[256 + 17] = 3.0;
    x
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

const GOLDEN: [u64; 2] = [0x63410920472a57a5, 0xc9702c9b35f99a6f];

#[test]
fn encodings_are_pinned_at_every_level() {
    use turboquant_codec::kernels::{available_levels, set_simd_level, simd_level};
    let x = input();
    let before = simd_level();
    for level in available_levels() {
        assert!(set_simd_level(level));
        let mut got = vec![];
        for ty in TcqType::ALL {
            let mut out = vec![0u8; x.len() / 64 * ty.block_bytes()];
            codec::quantize(ty, &x, &mut out, &mut Scratch::new(ty.l(), ty.k(), 64)).unwrap();
            eprintln!("{level:?} {}: {:#018x}", ty.name(), fnv1a(&out));
            got.push(fnv1a(&out));
        }
        assert_eq!(got, GOLDEN, "{level:?}: encoder output changed");
    }
    set_simd_level(before);
}
