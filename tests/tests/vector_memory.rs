//! Global memory at the hardware's width on the generic (sm_80-style) path: the PTX of
//! memory-bound kernels moves each thread's contiguous run in 16-byte vectors (f32 and bf16,
//! 16-byte aligned tensors and not: then each row's alignment is tested at run time), reads
//! tensors the kernel never writes through the read-only path, and assembles without spills
//! for sm_80 and sm_90a; and the row kernels that rely on it (softmax in bf16, layer norm, RMS
//! norm) under the interpreter against f64 references, on shapes no tile divides (N = 4097,
//! 1000, 1), with padded (non-16-byte) row strides and outputs poisoned.

use kiln_examples::rows::{RowConfig, row_config};
use kiln_ir::Target;
use kiln_ir::interp::{HostArg, run_def};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, as_stored, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor, with_row_padding};
use kiln_tests::reference;

/// How often instruction `needle` occurs in `ptx`: `(unpredicated, predicated)`.
fn count(ptx: &str, needle: &str) -> (usize, usize) {
    let mut n = (0, 0);
    for l in ptx.lines() {
        let mut words = l.split_whitespace();
        match words.next() {
            Some(w) if w == needle => n.0 += 1,
            Some(w) if w.starts_with('@') && words.next() == Some(needle) => n.1 += 1,
            _ => {}
        }
    }
    n
}

/// One kernel variant and the vector accesses its PTX must hold.
struct Expect {
    kernel: &'static str,
    defines: &'static [(&'static str, &'static str)],
    aligned: bool,
    /// `(mnemonic, unpredicated, predicated)`: each vector access, how many times on the
    /// path where the thread's runs all lie inside the tensor, and on the edge path.
    vectors: &'static [(&'static str, usize, usize)],
}

/// Per thread per tile: softmax's `4 x 512` f32 tile on 128 threads is 16 elements, four
/// 16-byte vectors; the row kernels load `x` three times (the one-pass branch, then the two
/// loops) and store twice (each branch); in bf16 two vectors of eight. vector_add's 1024
/// elements are 8 per thread, two f32x4 per load. Layer norm's `4 x 1024` tiles with `w` and
/// `b` (each warp reads the whole 1024-element rows: 32 per thread), loaded in each branch.
const EXPECT: &[Expect] = &[
    Expect {
        kernel: "softmax",
        defines: &[],
        aligned: true,
        vectors: &[("ld.global.nc.v4.f32", 12, 12), ("st.global.v4.f32", 8, 8)],
    },
    Expect {
        kernel: "softmax",
        defines: &[],
        aligned: false,
        vectors: &[("ld.global.nc.v4.f32", 12, 12), ("st.global.v4.f32", 8, 8)],
    },
    Expect {
        kernel: "softmax",
        defines: &[("dtype", "bf16")],
        aligned: true,
        vectors: &[("ld.global.nc.v4.b32", 6, 6), ("st.global.v4.b32", 4, 4)],
    },
    Expect {
        kernel: "softmax",
        defines: &[("dtype", "bf16"), ("BM", "1"), ("BN", "64")],
        aligned: true,
        // 64 bf16 on one warp: two per lane, one b32 each (no lane idle); the store of pairs
        // takes the warp-wide fast path of column pairs, element-wise on the edge.
        vectors: &[("ld.global.nc.b32", 3, 3), ("st.global.b32", 2, 0)],
    },
    Expect {
        kernel: "vector_add",
        defines: &[],
        aligned: true,
        vectors: &[("ld.global.nc.v4.f32", 4, 4), ("st.global.v4.f32", 2, 2)],
    },
    Expect {
        kernel: "vector_add",
        defines: &[],
        aligned: false,
        vectors: &[("ld.global.nc.v4.f32", 4, 4), ("st.global.v4.f32", 2, 2)],
    },
    Expect {
        kernel: "layer_norm",
        defines: &[("dtype", "bf16")],
        aligned: true,
        vectors: &[
            ("ld.global.nc.v4.b32", 3 * 4 + 2 * 8, 3 * 4 + 2 * 8),
            ("st.global.v4.b32", 2 * 4, 2 * 4),
        ],
    },
    Expect {
        kernel: "layer_norm",
        defines: &[],
        aligned: false,
        vectors: &[
            ("ld.global.nc.v4.f32", 3 * 8 + 2 * 16, 3 * 8 + 2 * 16),
            ("st.global.v4.f32", 2 * 8, 2 * 8),
        ],
    },
    Expect {
        kernel: "rms_norm",
        defines: &[],
        aligned: true,
        vectors: &[
            ("ld.global.nc.v4.f32", 3 * 8 + 2 * 8, 3 * 8 + 2 * 8),
            ("st.global.v4.f32", 2 * 8, 2 * 8),
        ],
    },
    Expect {
        kernel: "rms_norm",
        defines: &[("dtype", "bf16")],
        aligned: false,
        vectors: &[
            ("ld.global.nc.v4.b32", 3 * 4 + 2 * 4, 3 * 4 + 2 * 4),
            ("st.global.v4.b32", 2 * 4, 2 * 4),
        ],
    },
];

#[test]
fn memory_bound_kernels_move_16_byte_vectors_and_assemble_without_spills() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    for e in EXPECT {
        let k = kiln_examples::build(e.kernel, e.defines, e.aligned)
            .unwrap_or_else(|err| panic!("{}: {err}", e.kernel));
        for target in [Target::Sm80, Target::Sm90a] {
            let name = format!(
                "{} {:?} aligned16={} on {target:?}",
                e.kernel, e.defines, e.aligned
            );
            let m = kiln_ptx::compile(&k, target).unwrap_or_else(|err| panic!("{name}: {err}"));
            for &(mnemonic, inside, edge) in e.vectors {
                assert_eq!(
                    count(&m.ptx, mnemonic),
                    (inside, edge),
                    "{name}: `{mnemonic}`s"
                );
            }
            // Unaligned tensors test each row's address; aligned ones need no test.
            assert_eq!(
                m.ptx.contains("and.b64"),
                !e.aligned,
                "{name}: run-time alignment tests"
            );
            // Nothing reads an input through the coherent path.
            assert_eq!(count(&m.ptx, "ld.global.f32"), (0, 0), "{name}");
            assert_eq!(count(&m.ptx, "ld.global.b16"), (0, 0), "{name}");
            let report = kiln_ptx::ptxas::check(&m.ptx, target)
                .unwrap_or_else(|err| panic!("{name}: {err}"));
            assert!(!report.spills(), "{name} spills: {report}");
        }
    }
}

fn cdiv(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

/// `(M, N)` shapes: one element, tails of one past a power of two, rows narrower than a tile,
/// a row longer than the longest kept whole.
const SHAPES: &[(usize, usize)] = &[(1, 1), (3, 4097), (9, 1000), (5, 33), (2, 16500)];

/// A row kernel's comptime values for rows of `n`: a fixed `(BM, BN)` on four warps (rows
/// longer than `BN` take the two-loop path), or `row_config`'s, as the launchers pick them.
fn config(fixed: Option<(usize, usize)>, n: usize) -> RowConfig {
    fixed.map_or(row_config(n), |(bm, bn)| RowConfig { bm, bn, nw: 4 })
}

/// An input of `shape`: row-padded by an odd count (rows not 16-byte aligned) for the normal
/// distribution.
fn input(rng: &mut Rng, shape: &[usize], dtype: DType, dist: Dist) -> HostTensor {
    let x = tensor(rng, shape, dtype, dist);
    if dist == Dist::Normal {
        with_row_padding(&x, 3)
    } else {
        x
    }
}

#[test]
fn softmax_in_bf16_matches_reference() {
    let def = &kiln_examples::softmax::softmax;
    let mut rng = Rng::from_env();
    for fixed in [Some((4, 512)), Some((2, 128)), None] {
        for &(m, n) in SHAPES {
            let RowConfig { bm, bn, nw } = config(fixed, n);
            let ct = kiln_examples::softmax::SoftmaxComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype: DType::Bf16,
            };
            for dist in Dist::ALL {
                let x = input(&mut rng, &[m, n], DType::Bf16, dist);
                let mut y = poisoned(&[m, n], DType::Bf16);
                let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)];
                run_def(def, &ct, [cdiv(m, bm), 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("softmax<BM={bm},BN={bn},NW={nw},bf16>"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                let want = as_stored(&reference::softmax_rows(&x), DType::Bf16);
                assert_close(&case, &y, &want, tolerance(DType::Bf16));
            }
        }
    }
}

/// Per row of 2-D `x`, `sqrt(mean(x^2))`, or 1 for a row of zeros.
fn row_rms(x: &HostTensor) -> Vec<f64> {
    let v = x.to_f64_vec();
    v.chunks(x.shape[1])
        .map(|r| {
            let ms = r.iter().map(|a| a * a).sum::<f64>() / r.len() as f64;
            if ms > 0.0 { ms.sqrt() } else { 1.0 }
        })
        .collect()
}

#[test]
fn layer_norm_matches_reference() {
    let def = &kiln_examples::layer_norm::layer_norm;
    let mut rng = Rng::from_env();
    let eps = 1e-5;
    for (fixed, dtype) in [
        (Some((4, 1024)), DType::F32),
        (Some((4, 1024)), DType::Bf16),
        (Some((2, 256)), DType::F32),
        (None, DType::F32),
        (None, DType::Bf16),
    ] {
        for &(m, n) in SHAPES {
            let RowConfig { bm, bn, nw } = config(fixed, n);
            let ct = kiln_examples::layer_norm::LayerNormComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype,
            };
            for dist in Dist::ALL {
                let x = input(&mut rng, &[m, n], dtype, dist);
                let w = tensor(&mut rng, &[n], dtype, Dist::Normal);
                let b = tensor(&mut rng, &[n], dtype, Dist::Uniform);
                let mut y = poisoned(&[m, n], dtype);
                let mut mean = poisoned(&[m], DType::F32);
                let mut rstd = poisoned(&[m], DType::F32);
                let mut args = [
                    HostArg::Tensor(&x),
                    HostArg::Tensor(&w),
                    HostArg::Tensor(&b),
                    HostArg::TensorMut(&mut y),
                    HostArg::TensorMut(&mut mean),
                    HostArg::TensorMut(&mut rstd),
                    HostArg::F32(eps),
                ];
                run_def(def, &ct, [cdiv(m, bm), 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("layer_norm<BM={bm},BN={bn},NW={nw},{dtype}>"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                let (want, want_mean, want_rstd) =
                    reference::layer_norm_rows(&x, &w, &b, f64::from(eps));
                assert_close(&case, &y, &as_stored(&want, dtype), tolerance(dtype));
                // A mean near 0 is ill-conditioned (its f32 error is relative to the row's
                // magnitude, not its own): the error in units of each row's RMS.
                let rms = row_rms(&x);
                let got = mean.to_f64_vec();
                assert!(
                    !got.iter().any(|v| v.is_nan()),
                    "{case}: a mean is unwritten"
                );
                let err = (0..m)
                    .map(|r| (got[r] - want_mean[r]).abs() / rms[r])
                    .fold(0.0, f64::max);
                assert!(
                    err <= tolerance(DType::F32),
                    "{case}: mean off by {err:.3e} of the row's RMS"
                );
                assert_close(&case, &rstd, &want_rstd, tolerance(DType::F32));
            }
        }
    }
}

#[test]
fn rms_norm_matches_reference() {
    let def = &kiln_examples::rms_norm::rms_norm;
    let mut rng = Rng::from_env();
    let eps = 1e-6;
    for (fixed, dtype) in [
        (Some((4, 1024)), DType::F32),
        (Some((4, 1024)), DType::Bf16),
        (Some((2, 256)), DType::Bf16),
        (None, DType::F32),
        (None, DType::Bf16),
    ] {
        for &(m, n) in SHAPES {
            let RowConfig { bm, bn, nw } = config(fixed, n);
            let ct = kiln_examples::rms_norm::RmsNormComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype,
            };
            for dist in Dist::ALL {
                let x = input(&mut rng, &[m, n], dtype, dist);
                let w = tensor(&mut rng, &[n], dtype, Dist::Normal);
                let mut y = poisoned(&[m, n], dtype);
                let mut rstd = poisoned(&[m], DType::F32);
                let mut args = [
                    HostArg::Tensor(&x),
                    HostArg::Tensor(&w),
                    HostArg::TensorMut(&mut y),
                    HostArg::TensorMut(&mut rstd),
                    HostArg::F32(eps),
                ];
                run_def(def, &ct, [cdiv(m, bm), 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("rms_norm<BM={bm},BN={bn},NW={nw},{dtype}>"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                let (want, want_rstd) = reference::rms_norm_rows(&x, &w, f64::from(eps));
                assert_close(&case, &y, &as_stored(&want, dtype), tolerance(dtype));
                assert_close(&case, &rstd, &want_rstd, tolerance(DType::F32));
            }
        }
    }
}
