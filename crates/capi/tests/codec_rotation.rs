//! The seeded rotation R = D H D / sqrt(dim): orthogonal, symmetric,
//! involutory; fast transform == dense matrix; seeds matter.

use turboquant_capi::{tq_rotate, tq_rotation_matrix};
use turboquant_codec::rotation::*;
use turboquant_codec::testing::*;

const SEED: u64 = 0x5475726271756174; // TQ_DEFAULT_SEED

fn matmul(a: &[f32], b: &[f32], n: usize) -> Vec<f64> {
    let mut c = vec![0f64; n * n];
    for i in 0..n {
        for k in 0..n {
            let aik = a[i * n + k] as f64;
            for j in 0..n {
                c[i * n + j] += aik * b[k * n + j] as f64;
            }
        }
    }
    c
}

#[test]
fn orthogonal_symmetric_involutory() {
    for dim in [2usize, 4, 32, 64, 128, 256, 512] {
        let r = rotation_matrix(dim, SEED).unwrap();
        for i in 0..dim {
            for j in 0..dim {
                assert_eq!(r[i * dim + j], r[j * dim + i], "symmetric");
            }
        }
        // R R^T = I and (R symmetric) R R = I
        let p = matmul(&r, &r, dim);
        for i in 0..dim {
            for j in 0..dim {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!(
                    (p[i * dim + j] - want).abs() < 1e-5,
                    "dim {dim} ({i},{j}) = {}",
                    p[i * dim + j]
                );
            }
        }
    }
}

#[test]
fn matches_definition() {
    // R[i][j] = s_i s_j (-1)^popcount(i&j) / sqrt(dim), s from SplitMix64(seed ^ dim*golden)
    let dim = 64;
    let r = rotation_matrix(dim, 42).unwrap();
    let mut sm = SplitMix64::new(42 ^ (dim as u64).wrapping_mul(0x9E3779B97F4A7C15));
    let s: Vec<f64> = (0..dim)
        .map(|_| if sm.next() >> 63 == 0 { 1.0 } else { -1.0 })
        .collect();
    for i in 0..dim {
        for j in 0..dim {
            let h = if (i & j).count_ones() % 2 == 0 {
                1.0
            } else {
                -1.0
            };
            assert_eq!(r[i * dim + j] as f64, s[i] * s[j] * h / 8.0);
        }
    }
    // SplitMix64 reference values (seed 0): Vigna's splitmix64.c
    let mut z = SplitMix64::new(0);
    assert_eq!(z.next(), 0xe220a8397b1dcdaf);
    assert_eq!(z.next(), 0x6e789e6aa1b965f4);
    // both signs occur
    assert!(s.iter().any(|&v| v > 0.0) && s.iter().any(|&v| v < 0.0));
}

#[test]
fn fast_transform_equals_dense_product_and_round_trips() {
    let mut rng = TRng::new(8);
    for dim in [32usize, 64, 128, 256, 1024] {
        let r = rotation_matrix(dim, SEED).unwrap();
        let x = rng.gauss_vec(dim);
        let mut y = x.clone();
        rotate_in_place(&mut y, SEED).unwrap();
        for i in 0..dim {
            let want: f64 = (0..dim).map(|j| r[i * dim + j] as f64 * x[j] as f64).sum();
            assert!(
                (y[i] as f64 - want).abs() < 1e-5 * (dim as f64).sqrt(),
                "dim {dim} i {i}"
            );
        }
        // norm preserved, applying twice undoes it
        let n0: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
        let n1: f64 = y.iter().map(|&v| (v as f64).powi(2)).sum();
        assert!((n0 - n1).abs() < 1e-5 * n0);
        rotate_in_place(&mut y, SEED).unwrap();
        for i in 0..dim {
            assert!((y[i] - x[i]).abs() < 1e-5, "round trip dim {dim}");
        }
    }
}

#[test]
fn head_of_several_blocks_via_abi() {
    let mut rng = TRng::new(9);
    let dim = 128;
    let k = 5;
    let x = rng.gauss_vec(dim * k);
    let mut y = x.clone();
    assert_eq!(
        unsafe { tq_rotate(dim as i64, SEED, y.as_mut_ptr(), (dim * k) as i64) },
        0
    );
    let mut m = vec![0f32; dim * dim];
    assert_eq!(
        unsafe { tq_rotation_matrix(dim as i64, SEED, m.as_mut_ptr()) },
        0
    );
    assert_eq!(m, rotation_matrix(dim, SEED).unwrap());
    for v in 0..k {
        let mut one = x[v * dim..(v + 1) * dim].to_vec();
        rotate_in_place(&mut one, SEED).unwrap();
        assert_eq!(&y[v * dim..(v + 1) * dim], &one[..], "vector {v}");
    }
}

#[test]
fn seeds_determine_the_map() {
    for dim in [32usize, 64, 128, 256] {
        let a = rotation_matrix(dim, 1).unwrap();
        assert_eq!(a, rotation_matrix(dim, 1).unwrap(), "same seed, same map");
        let b = rotation_matrix(dim, 2).unwrap();
        assert_ne!(a, b, "different seeds, different maps");
        // R(seed) differs from the unsigned Hadamard matrix
        let mut h = vec![0f32; dim * dim];
        let f = 1.0 / (dim as f32).sqrt();
        for i in 0..dim {
            for j in 0..dim {
                h[i * dim + j] = if (i & j).count_ones() % 2 == 0 { f } else { -f };
            }
        }
        assert_ne!(a, h);
    }
    // the signs depend on dim as well as on the seed
    let s64 = signs(64, 7);
    let s128 = signs(128, 7);
    assert_ne!(&s64[..], &s128[..64]);
}

#[test]
fn rotation_gaussianizes_spiky_vectors() {
    // a one-hot vector becomes flat: every coordinate has magnitude 1/sqrt(dim)
    let dim = 256;
    let mut x = vec![0f32; dim];
    x[17] = 1.0;
    rotate_in_place(&mut x, SEED).unwrap();
    assert!(x.iter().all(|&v| (v.abs() - 1.0 / 16.0).abs() < 1e-7));
}
