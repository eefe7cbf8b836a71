//! Golden encodings: the encoder's bytes are part of the format (the CUDA port
//! must reproduce them), so any change to them must be deliberate. The input is
//! a deterministic SplitMix64/Box-Muller stream (seed 2504) of 4096 blocks with
//! per-block scales 2^-20 .. 2^20 and a few special blocks; the pinned value is
//! the FNV-1a 64 hash of the encoded bytes.

use turboquant_codec::rotation::SplitMix64;
use turboquant_codec::TqType;

fn input() -> Vec<f32> {
    let mut r = SplitMix64::new(2504);
    let mut x = Vec::with_capacity(4096 * 64);
    for b in 0..4096 {
        let scale = 2f32.powi(b % 41 - 20);
        for _ in 0..64 {
            x.push(r.next_gaussian() as f32 * scale);
        }
    }
    // special blocks: zeros, a NaN, infinities, subnormals, a one-hot
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

#[test]
fn encodings_are_pinned() {
    let x = input();
    let mut got = vec![];
    for ty in TqType::ALL {
        let mut out = vec![0u8; turboquant_codec::encoded_len(ty, x.len()).unwrap()];
        turboquant_codec::quantize(ty, &x, &mut out).unwrap();
        got.push(fnv1a(&out));
        eprintln!("{}: {:#018x}", ty.name(), fnv1a(&out));
    }
    assert_eq!(got, GOLDEN, "encoder output changed");
}

// Re-pinned when the encoder gained its gain search (crates/codec/src/gain.rs).
const GOLDEN: [u64; 3] = [0xc1dd03bc76bd1c9e, 0xb5def2fff4623aa7, 0x5d59ab9afc4b6051];

#[test]
fn every_level_encodes_identically() {
    use turboquant_codec::kernels::{available_levels, scalar, set_simd_level, simd_level};
    let x = input();
    let before = simd_level();
    for ty in TqType::ALL {
        let mut want = vec![0u8; turboquant_codec::encoded_len(ty, x.len()).unwrap()];
        scalar::quantize_row_generic(ty, &x, &mut want);
        for level in available_levels() {
            assert!(set_simd_level(level));
            let mut got = vec![0u8; want.len()];
            scalar::quantize_row(ty, &x, &mut got);
            assert!(
                got == want,
                "{level:?} {ty:?}: encoder bytes differ from the portable build"
            );
        }
    }
    set_simd_level(before);
}
