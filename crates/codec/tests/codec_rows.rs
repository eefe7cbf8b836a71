//! The flash-attention tile kernels on every SIMD level: `dot_rows` equals the
//! per-row scalar oracle within 1e-5 of each row's Σ|terms|, `mad_rows` equals
//! `nrows` sequential scalar `mad` calls bit for bit. Tiles cover every row
//! count around the 4-row passes, head sizes 64..256, strides with gaps
//! between rows, and rows with corrupt scales.

use turboquant_codec::kernels::{self, available_levels, SimdLevel};
use turboquant_codec::testing::*;
use turboquant_codec::TqType;

/// A tile of `nrows` rows of `n` values, `stride` bytes apart (`gap` junk bytes
/// between rows, as a K cache row holding several heads has).
fn tile(rng: &mut TRng, ty: TqType, n: usize, nrows: usize, gap: usize) -> (Vec<u8>, usize) {
    let row = n / 64 * ty.block_bytes();
    let stride = row + gap;
    let mut x = vec![0u8; nrows * stride];
    for r in 0..nrows {
        let enc = if r % 3 == 2 {
            rng.blocks(ty, n / 64) // raw random bytes: any index, any scale
        } else {
            encode(ty, &rng.gauss_vec(n))
        };
        x[r * stride..r * stride + row].copy_from_slice(&enc);
        if r % 5 == 4 {
            // a NaN scale: the row decodes as zeros
            x[r * stride..r * stride + 2].copy_from_slice(&0x7e00u16.to_ne_bytes());
        }
        for b in &mut x[r * stride + row..(r + 1) * stride] {
            *b = rng.u8();
        }
    }
    (x, stride)
}

const SHAPES: [(usize, usize); 8] = [
    (64, 1),
    (64, 3),
    (64, 4),
    (64, 5),
    (64, 32),
    (128, 7),
    (128, 33),
    (256, 9),
];

#[test]
fn dot_rows_matches_per_row_oracle_on_every_level() {
    let mut rng = TRng::new(21);
    for ty in TqType::ALL {
        for (n, nrows) in SHAPES {
            for gap in [0, 6] {
                let (x, stride) = tile(&mut rng, ty, n, nrows, gap);
                let q = rng.gauss_vec(n);
                let row = n / 64 * ty.block_bytes();
                for level in available_levels() {
                    let mut got = vec![f32::NAN; nrows + 1];
                    kernels::dot_rows_at(level, ty, &x, stride, &q, &mut got[..nrows]);
                    assert!(got[nrows].is_nan(), "wrote past the last row");
                    for r in 0..nrows {
                        let xr = &x[r * stride..r * stride + row];
                        let want = kernels::vec_dot_row_at(SimdLevel::Scalar, ty, xr, &q);
                        let dec = decode(ty, xr);
                        let abs: f64 = dec
                            .iter()
                            .zip(&q)
                            .map(|(&a, &b)| ((a * b) as f64).abs())
                            .sum();
                        let err = (got[r] as f64 - want as f64).abs();
                        assert!(
                            err <= 1e-5 * abs + 1e-30,
                            "{level:?} {ty:?} n={n} rows={nrows} r={r}: {} vs {want}",
                            got[r]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn mad_rows_equals_sequential_mad_bit_for_bit_on_every_level() {
    let mut rng = TRng::new(22);
    for ty in TqType::ALL {
        for (n, nrows) in SHAPES {
            let (x, stride) = tile(&mut rng, ty, n, nrows, 10);
            let row = n / 64 * ty.block_bytes();
            let y0 = rng.gauss_vec(n);
            // softmax-like weights, with an exact 0 and 1 among them
            let mut w: Vec<f32> = (0..nrows).map(|_| rng.gauss().abs().min(1.0)).collect();
            w[0] = 1.0;
            if nrows > 2 {
                w[2] = 0.0;
            }
            let mut want = y0.clone();
            for r in 0..nrows {
                kernels::mad_row_at(
                    SimdLevel::Scalar,
                    ty,
                    &x[r * stride..r * stride + row],
                    &mut want,
                    w[r],
                );
            }
            for level in available_levels() {
                let mut got = y0.clone();
                kernels::mad_rows_at(level, ty, &x, stride, &w, &mut got);
                for j in 0..n {
                    assert_eq!(
                        got[j].to_bits(),
                        want[j].to_bits(),
                        "{level:?} {ty:?} n={n} rows={nrows} j={j}"
                    );
                }
            }
        }
    }
}

#[test]
fn empty_tiles_change_nothing() {
    for level in available_levels() {
        for ty in TqType::ALL {
            let mut y = vec![1.5f32; 64];
            kernels::mad_rows_at(level, ty, &[], 0, &[], &mut y);
            assert!(y.iter().all(|&v| v == 1.5));
            kernels::dot_rows_at(level, ty, &[], 0, &[0.0; 64], &mut []);
        }
    }
}

#[test]
#[should_panic(expected = "tile needs")]
fn a_short_tile_buffer_is_rejected() {
    let ty = TqType::Turbo4;
    let x = vec![0u8; 2 * ty.block_bytes() - 1];
    let mut out = [0f32; 2];
    kernels::dot_rows_at(
        SimdLevel::Scalar,
        ty,
        &x,
        ty.block_bytes(),
        &[0.0; 64],
        &mut out,
    );
}
