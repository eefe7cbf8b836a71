//! Helpers shared by the tests of every crate: seeded Gaussian rows, random blocks with
//! valid scales, encode/decode wrappers. Not part of the codec's API.

use crate::rotation::SplitMix64;
use crate::TqType;

pub struct TRng(pub SplitMix64);

impl TRng {
    pub fn new(seed: u64) -> TRng {
        TRng(SplitMix64::new(seed))
    }
    pub fn gauss(&mut self) -> f32 {
        self.0.next_gaussian() as f32
    }
    pub fn gauss_vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.gauss()).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.next() % n
    }
    pub fn u8(&mut self) -> u8 {
        self.0.next() as u8
    }
    /// Random bytes for `nb` blocks with random indices and a random finite,
    /// non-negative fp16 scale.
    pub fn blocks(&mut self, ty: TqType, nb: usize) -> Vec<u8> {
        let bb = ty.block_bytes();
        let mut v: Vec<u8> = (0..nb * bb).map(|_| self.u8()).collect();
        for b in 0..nb {
            let d = half::f16::from_f32((self.0.next_f64() * 4.0) as f32).to_bits();
            v[b * bb..b * bb + 2].copy_from_slice(&d.to_ne_bytes());
        }
        v
    }
}

pub fn encode(ty: TqType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; crate::encoded_len(ty, x.len()).unwrap()];
    crate::quantize(ty, x, &mut out).unwrap();
    out
}

pub fn decode(ty: TqType, x: &[u8]) -> Vec<f32> {
    let mut y = vec![0f32; x.len() / ty.block_bytes() * 64];
    crate::dequantize(ty, x, &mut y).unwrap();
    y
}
