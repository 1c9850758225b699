//! The memory-operation kernels (`memory_kernels`) on the GPU, for sm_80 and (on Hopper)
//! sm_90a, against exact or f64 references and against the interpreter: a histogram built
//! with atomic adds, a MoE-style row gather and scatter with indices outside the tensor,
//! atomics of every kind through repeated row indices (float adds compared with a
//! tolerance, since their order differs; integer results exactly; old values where the
//! indices are distinct), atomic adds from several blocks, masked loads with a fill value
//! and masked stores, element gathers. Fresh random inputs of several distributions, shapes
//! no multiple of any tile, outputs poisoned. Skips itself without a GPU.

mod gpu_common;
mod memory_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, device};
use kiln_ir::interp::{HostArg, run_def};
use kiln_ir::{AtomicOp, DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor, KernelArg};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use memory_kernels::*;

fn cdiv(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

/// The devices to run on: sm_80 code, and sm_90a code on a Hopper GPU.
fn devices() -> Vec<Device> {
    let Some(dev) = device() else {
        return Vec::new();
    };
    let mut out = vec![dev];
    if let Ok(d) = Device::new(0)
        && d.compute_capability() == (9, 0)
    {
        out.push(d.with_target(Target::Sm90a));
    }
    out
}

fn up(dev: &Device, t: &HostTensor) -> DeviceTensor {
    dev.upload(t).expect("upload")
}

fn down(t: &DeviceTensor) -> HostTensor {
    t.download().expect("download")
}

/// A poisoned device tensor.
fn poisoned_on(dev: &Device, dtype: DType, shape: &[usize]) -> DeviceTensor {
    up(dev, &poisoned(shape, dtype))
}

fn gpu_histogram_counts_exactly() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for n in [1, 1000, 4097, 100_000] {
            for bins in [1, 37, 1000] {
                let x = ints(&mut rng, &[n], -3, bins as i64 + 3);
                let init = ints(&mut rng, &[bins], -5, 5);
                let (dx, dh) = (up(&dev, &x), up(&dev, &init));
                let grid = [cdiv(n, HIST_BLOCK), 1, 1];
                dev.launch(
                    &histogram,
                    &HIST,
                    grid,
                    &[KernelArg::Tensor(&dx), KernelArg::Tensor(&dh)],
                )
                .expect("launch");
                let mut hi = init.clone();
                run_def(
                    &histogram,
                    &HIST,
                    grid,
                    &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut hi)],
                )
                .expect("interpret");
                let want = histogram_ref(&i32s(&x), &i32s(&init));
                let what = format!(
                    "{} histogram n={n} bins={bins} KILN_SEED={}",
                    dev.target(),
                    rng.seed()
                );
                assert_eq!(i32s(&down(&dh)), want, "{what} (GPU)");
                assert_eq!(i32s(&hi), want, "{what} (interpreter)");
            }
        }
    }
}

fn gpu_row_gather_and_scatter_move_rows_exactly() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::F32, DType::Bf16, DType::I32] {
            for (n, rows, cols) in [(100, 45, 70), (7, 64, 64), (300, 257, 130)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[n, cols], dtype, dist);
                    let idx = ints(&mut rng, &[rows], -2, n as i64 + 2);
                    let grid = [cdiv(rows, ROWS), cdiv(cols, COLS), 1];
                    let ct = GatherRowsComptime { dtype };
                    let (dx, di) = (up(&dev, &x), up(&dev, &idx));
                    let dy = poisoned_on(&dev, dtype, &[rows, cols]);
                    dev.launch(
                        &gather_rows,
                        &ct,
                        grid,
                        &[
                            KernelArg::Tensor(&dx),
                            KernelArg::Tensor(&di),
                            KernelArg::Tensor(&dy),
                        ],
                    )
                    .expect("launch");
                    let mut yi = poisoned(&[rows, cols], dtype);
                    let mut args = [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&idx),
                        HostArg::TensorMut(&mut yi),
                    ];
                    run_def(&gather_rows, &ct, grid, &mut args).expect("interpret");
                    let (xv, iv) = (x.to_f64_vec(), i32s(&idx));
                    let want: Vec<f64> = (0..rows * cols)
                        .map(|e| match usize::try_from(iv[e / cols]) {
                            Ok(s) if s < n => xv[s * cols + e % cols],
                            _ => 0.0,
                        })
                        .collect();
                    let what = format!(
                        "{} gather_rows {dtype} {n}/{rows}x{cols} {dist:?} KILN_SEED={}",
                        dev.target(),
                        rng.seed()
                    );
                    assert_same(&down(&dy).to_f64_vec(), &want, &format!("{what} (GPU)"));
                    assert_same(&yi.to_f64_vec(), &want, &format!("{what} (interpreter)"));

                    // Scatter back through a permutation: every row of `z` lands once.
                    let perm = distinct(&mut rng, rows, rows);
                    let init = tensor(&mut rng, &[rows, cols], dtype, Dist::Uniform);
                    let dz = up(&dev, &init);
                    let dp = up(&dev, &perm);
                    let st = ScatterRowsComptime { dtype };
                    dev.launch(
                        &scatter_rows,
                        &st,
                        grid,
                        &[
                            KernelArg::Tensor(&dy),
                            KernelArg::Tensor(&dp),
                            KernelArg::Tensor(&dz),
                        ],
                    )
                    .expect("launch");
                    let mut want_z = init.to_f64_vec();
                    for (r, &t) in i32s(&perm).iter().enumerate() {
                        if let Ok(t) = usize::try_from(t)
                            && t < rows
                        {
                            want_z[t * cols..(t + 1) * cols]
                                .copy_from_slice(&want[r * cols..(r + 1) * cols]);
                        }
                    }
                    assert_same(
                        &down(&dz).to_f64_vec(),
                        &want_z,
                        &format!("{what} scatter (GPU)"),
                    );
                }
            }
        }
    }
}

/// `count` distinct indices drawn from `-2..n + 2` (some outside `0..n`), `count <= n + 4`.
fn distinct(rng: &mut Rng, count: usize, n: usize) -> HostTensor {
    let mut p: Vec<i64> = (0..n as i64 + 4).map(|i| i - 2).collect();
    for i in (1..p.len()).rev() {
        p.swap(i, rng.range(0, i + 1));
    }
    HostTensor::from_fn(&[count], DType::I32, |i| p[i] as f64)
}

/// One atomic element applied to memory value `m` (the exact integer or f64 result; float
/// adds are compared with a tolerance).
fn apply(op: AtomicOp, dtype: DType, m: f64, v: f64, c: f64) -> f64 {
    let same = |a: f64, b: f64| match dtype {
        DType::I32 => a == b,
        _ => (a as f32).to_bits() == (b as f32).to_bits(),
    };
    match op {
        AtomicOp::Add if dtype == DType::I32 => f64::from((m as i32).wrapping_add(v as i32)),
        AtomicOp::Add => m + v,
        AtomicOp::Max => m.max(v),
        AtomicOp::Min => m.min(v),
        AtomicOp::Xchg => v,
        AtomicOp::Cas if same(m, c) => v,
        AtomicOp::Cas => m,
    }
}

fn gpu_atomics_match_the_reference() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let cases: &[(DType, &[usize])] = &[
            (DType::I32, &[0, 1, 2, 3, 4]),
            (DType::F32, &[0, 1, 2, 3, 4]),
            (DType::Bf16, &[0]),
            (DType::F16, &[0]),
        ];
        for &(dtype, ops) in cases {
            for &op in ops {
                let aop = atomic_op(op);
                // xchg and cas results depend on the order: distinct targets there.
                let repeat = matches!(aop, AtomicOp::Add | AtomicOp::Max | AtomicOp::Min);
                for (i, (n, rows, cols)) in [(50, 100, 70), (40, 44, 64), (200, 33, 1)]
                    .into_iter()
                    .enumerate()
                {
                    // Distinct targets need at least as many rows of `acc` as of `x`.
                    let n = if repeat { n } else { n.max(rows) };
                    let dist = Dist::ALL[(op + i) % Dist::ALL.len()];
                    let x = tensor(&mut rng, &[rows, cols], dtype, dist);
                    let idx = if repeat {
                        ints(&mut rng, &[rows], -2, n as i64 + 2)
                    } else {
                        distinct(&mut rng, rows, n)
                    };
                    let keep = ints(&mut rng, &[rows], -1, 4);
                    let acc0 = tensor(&mut rng, &[n, cols], dtype, Dist::Normal);
                    let (iv, av, kv) = (i32s(&idx), acc0.to_f64_vec(), i32s(&keep));
                    let mut cmp = tensor(&mut rng, &[rows, cols], dtype, dist);
                    for e in 0..rows * cols {
                        if let Ok(t) = usize::try_from(iv[e / cols])
                            && t < n
                            && rng.range(0, 2) == 0
                        {
                            cmp.data.set_f64(e, av[t * cols + e % cols]);
                        }
                    }
                    let ct = AtomicRowsComptime {
                        op,
                        dtype,
                        order: op + i,
                    };
                    let grid = [cdiv(rows, ROWS), cdiv(cols, COLS), 1];
                    let (dx, dc, di, dk, da) = (
                        up(&dev, &x),
                        up(&dev, &cmp),
                        up(&dev, &idx),
                        up(&dev, &keep),
                        up(&dev, &acc0),
                    );
                    let dold = poisoned_on(&dev, dtype, &[rows, cols]);
                    dev.launch(
                        &atomic_rows,
                        &ct,
                        grid,
                        &[
                            KernelArg::Tensor(&dx),
                            KernelArg::Tensor(&dc),
                            KernelArg::Tensor(&di),
                            KernelArg::Tensor(&dk),
                            KernelArg::Tensor(&da),
                            KernelArg::Tensor(&dold),
                        ],
                    )
                    .expect("launch");
                    let mut acc_i = acc0.clone();
                    let mut old_i = poisoned(&[rows, cols], dtype);
                    let mut args = [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&cmp),
                        HostArg::Tensor(&idx),
                        HostArg::Tensor(&keep),
                        HostArg::TensorMut(&mut acc_i),
                        HostArg::TensorMut(&mut old_i),
                    ];
                    run_def(&atomic_rows, &ct, grid, &mut args).expect("interpret");
                    // The reference in f64, elements in any order for add/max/min.
                    let (xv, cv) = (x.to_f64_vec(), cmp.to_f64_vec());
                    let mut want = av.clone();
                    let mut want_old = vec![0.0; rows * cols];
                    for r in 0..rows {
                        let Ok(t) = usize::try_from(iv[r]) else {
                            continue;
                        };
                        if kv[r] <= 0 || t >= n {
                            continue;
                        }
                        for c in 0..cols {
                            let (m, e) = (want[t * cols + c], r * cols + c);
                            want[t * cols + c] = apply(aop, dtype, m, xv[e], cv[e]);
                            want_old[e] = m;
                        }
                    }
                    let what = format!(
                        "{} atomic_rows {aop:?} {dtype} {n}/{rows}x{cols} {dist:?}",
                        dev.target()
                    );
                    let case = |s: &str| Case {
                        kernel: format!("{what} {s}"),
                        shape: format!("{rows}x{cols}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let (acc_g, old_g) = (down(&da), down(&dold));
                    if dtype.is_float() && aop == AtomicOp::Add {
                        // Each element rounds once per add, in the GPU's order.
                        let tol = 2.0 * tolerance(dtype);
                        assert_close(&case("GPU"), &acc_g, &want, tol);
                        assert_close(&case("interpreter"), &acc_i, &want, tol);
                        assert_close(
                            &case("GPU vs interpreter"),
                            &acc_g,
                            &acc_i.to_f64_vec(),
                            tol,
                        );
                    } else {
                        let seed = format!("KILN_SEED={}", rng.seed());
                        assert_same(&acc_g.to_f64_vec(), &want, &format!("{what} GPU {seed}"));
                        assert_same(
                            &acc_i.to_f64_vec(),
                            &want,
                            &format!("{what} interpreter {seed}"),
                        );
                    }
                    if !repeat {
                        let seed = format!("KILN_SEED={}", rng.seed());
                        assert_same(
                            &old_g.to_f64_vec(),
                            &want_old,
                            &format!("{what} old (GPU) {seed}"),
                        );
                        assert_same(
                            &old_i.to_f64_vec(),
                            &want_old,
                            &format!("{what} old (interpreter) {seed}"),
                        );
                    }
                }
            }
        }
    }
}

fn gpu_atomic_adds_from_several_blocks_sum() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::F32, DType::Bf16, DType::F16, DType::I32] {
            for (rows, cols, repeats) in [(70, 100, 3), (5, 3, 8), (300, 257, 2)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[rows, cols], dtype, dist);
                    let init = tensor(&mut rng, &[rows, cols], dtype, Dist::Uniform);
                    let (dx, da) = (up(&dev, &x), up(&dev, &init));
                    let grid = [cdiv(rows, ROWS), cdiv(cols, COLS), repeats as u32];
                    let ct = AtomicAddTilesComptime { dtype };
                    dev.launch(
                        &atomic_add_tiles,
                        &ct,
                        grid,
                        &[KernelArg::Tensor(&dx), KernelArg::Tensor(&da)],
                    )
                    .expect("launch");
                    let mut ai = init.clone();
                    run_def(
                        &atomic_add_tiles,
                        &ct,
                        grid,
                        &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut ai)],
                    )
                    .expect("interpret");
                    let want: Vec<f64> = init
                        .to_f64_vec()
                        .iter()
                        .zip(x.to_f64_vec())
                        .map(|(a, v)| a + repeats as f64 * v)
                        .collect();
                    let case = Case {
                        kernel: format!("{} atomic_add_tiles {dtype} x{repeats}", dev.target()),
                        shape: format!("{rows}x{cols}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let tol = 2.0 * tolerance(dtype);
                    assert_close(&case, &down(&da), &want, tol);
                    assert_close(&case, &ai, &want, tol);
                }
            }
        }
    }
}

fn gpu_masked_loads_and_stores_and_element_gathers() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (rows, cols) in [(70, 45), (32, 32), (1, 100), (300, 257)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[rows, cols], DType::F32, dist);
                let init = tensor(&mut rng, &[rows, cols], DType::F32, Dist::Uniform);
                let (t, fill) = (rng.normal() as f32 * 0.5, -7.5f32);
                let limit = rng.range(0, cols + 3) as i32 - 1;
                let grid = [cdiv(rows, MASK_TILE[0]), cdiv(cols, MASK_TILE[1]), 1];
                let (dx, dy) = (up(&dev, &x), up(&dev, &init));
                dev.launch(
                    &masked_copy,
                    &(),
                    grid,
                    &[
                        KernelArg::Tensor(&dx),
                        KernelArg::Tensor(&dy),
                        KernelArg::F32(t),
                        KernelArg::F32(fill),
                        KernelArg::I32(limit),
                    ],
                )
                .expect("launch");
                let mut yi = init.clone();
                let mut args = [
                    HostArg::Tensor(&x),
                    HostArg::TensorMut(&mut yi),
                    HostArg::F32(t),
                    HostArg::F32(fill),
                    HostArg::I32(limit),
                ];
                run_def(&masked_copy, &(), grid, &mut args).expect("interpret");
                let (xv, iv) = (x.to_f64_vec(), init.to_f64_vec());
                let want: Vec<f64> = (0..rows * cols)
                    .map(|e| match (e % cols) < limit.max(0) as usize {
                        true if xv[e] > f64::from(t) => xv[e],
                        true => f64::from(fill),
                        false => iv[e],
                    })
                    .collect();
                let what = format!(
                    "{} masked_copy {rows}x{cols} {dist:?} KILN_SEED={}",
                    dev.target(),
                    rng.seed()
                );
                assert_same(&down(&dy).to_f64_vec(), &want, &format!("{what} (GPU)"));
                assert_same(&yi.to_f64_vec(), &want, &format!("{what} (interpreter)"));
            }
        }
        for (r, c, n) in [(50, 40, 1000), (3, 300, 256), (1000, 70, 5000)] {
            let x = tensor(&mut rng, &[r, c], DType::F32, Dist::Normal);
            let ri = ints(&mut rng, &[n], -2, r as i64 + 2);
            let ci = ints(&mut rng, &[n], -2, c as i64 + 2);
            let (dx, dr, dc) = (up(&dev, &x), up(&dev, &ri), up(&dev, &ci));
            let dy = poisoned_on(&dev, DType::F32, &[n]);
            let grid = [cdiv(n, HIST_BLOCK), 1, 1];
            dev.launch(
                &gather_elems,
                &(),
                grid,
                &[
                    KernelArg::Tensor(&dx),
                    KernelArg::Tensor(&dr),
                    KernelArg::Tensor(&dc),
                    KernelArg::Tensor(&dy),
                ],
            )
            .expect("launch");
            let (xv, rv, cv) = (x.to_f64_vec(), i32s(&ri), i32s(&ci));
            let want: Vec<f64> = (0..n)
                .map(|i| match (usize::try_from(rv[i]), usize::try_from(cv[i])) {
                    (Ok(a), Ok(b)) if a < r && b < c => xv[a * c + b],
                    _ => 0.0,
                })
                .collect();
            let what = format!(
                "{} gather_elems {r}x{c} n={n} KILN_SEED={}",
                dev.target(),
                rng.seed()
            );
            assert_same(&down(&dy).to_f64_vec(), &want, &what);
        }
    }
}

fn gpu_split_k_gemm_accumulates_partial_tiles() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (m, n, k) in [(130, 70, 300), (256, 384, 1024), (5, 200, 64)] {
            for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
                let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
                let b = tensor(&mut rng, &[k, n], DType::Bf16, dist);
                let init = tensor(&mut rng, &[m, n], DType::F32, Dist::Uniform);
                let (da, db, dc) = (up(&dev, &a), up(&dev, &b), up(&dev, &init));
                let grid = [cdiv(m, 128), cdiv(n, 128), cdiv(k, KSPLIT * 64)];
                dev.launch(
                    &splitk_gemm,
                    &(),
                    grid,
                    &[
                        KernelArg::Tensor(&da),
                        KernelArg::Tensor(&db),
                        KernelArg::Tensor(&dc),
                    ],
                )
                .expect("launch");
                let mut ci = init.clone();
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&b),
                    HostArg::TensorMut(&mut ci),
                ];
                run_def(&splitk_gemm, &(), grid, &mut args).expect("interpret");
                let (av, bv, iv) = (a.to_f64_vec(), b.to_f64_vec(), init.to_f64_vec());
                let want: Vec<f64> = (0..m * n)
                    .map(|e| {
                        let (i, j) = (e / n, e % n);
                        iv[e] + (0..k).map(|t| av[i * k + t] * bv[t * n + j]).sum::<f64>()
                    })
                    .collect();
                let case = Case {
                    kernel: format!("{} splitk_gemm", dev.target()),
                    shape: format!("{m}x{n}x{k}"),
                    dist,
                    seed: rng.seed(),
                };
                let tol = 10.0 * tolerance(DType::F32);
                let got = down(&dc);
                assert_close(&case, &got, &want, tol);
                assert_close(&case, &got, &ci.to_f64_vec(), tol);
            }
        }
    }
}

fn gpu_atomics_on_tiles_smaller_than_the_block() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for n in [16, 11] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[n], DType::F32, dist);
                let y0 = tensor(&mut rng, &[n], DType::F32, Dist::Normal);
                let (dx, dy) = (up(&dev, &x), up(&dev, &y0));
                let dz = poisoned_on(&dev, DType::F32, &[n]);
                dev.launch(
                    &small_atomics,
                    &(),
                    [1, 1, 1],
                    &[
                        KernelArg::Tensor(&dx),
                        KernelArg::Tensor(&dy),
                        KernelArg::Tensor(&dz),
                    ],
                )
                .expect("launch");
                // One add and one exchange per element: exact.
                let (xv, yv) = (x.to_f64_vec(), y0.to_f64_vec());
                let sum: Vec<f64> = (0..n)
                    .map(|i| f64::from(xv[i] as f32 + yv[i] as f32))
                    .collect();
                let what = format!(
                    "{} small_atomics n={n} {dist:?} KILN_SEED={}",
                    dev.target(),
                    rng.seed()
                );
                assert_same(
                    &down(&dz).to_f64_vec(),
                    &sum,
                    &format!("{what}: old values"),
                );
                assert_same(&down(&dy).to_f64_vec(), &xv, &format!("{what}: memory"));
            }
        }
    }
}

fn gpu_gathered_gemm_multiplies_the_routed_rows() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (na, rows, k, n) in [
            (100, 70, 100, 70),
            (4096, 1000, 512, 256),
            (300, 5, 200, 130),
        ] {
            for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
                let a = tensor(&mut rng, &[na, k], DType::Bf16, dist);
                let b = tensor(&mut rng, &[k, n], DType::Bf16, dist);
                let idx = ints(&mut rng, &[rows], -2, na as i64 + 2);
                let (da, di, db) = (up(&dev, &a), up(&dev, &idx), up(&dev, &b));
                let dc = poisoned_on(&dev, DType::F32, &[rows, n]);
                let grid = [cdiv(rows, 64), cdiv(n, 64), 1];
                dev.launch(
                    &gathered_gemm,
                    &(),
                    grid,
                    &[
                        KernelArg::Tensor(&da),
                        KernelArg::Tensor(&di),
                        KernelArg::Tensor(&db),
                        KernelArg::Tensor(&dc),
                    ],
                )
                .expect("launch");
                let mut ci = poisoned(&[rows, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&idx),
                    HostArg::Tensor(&b),
                    HostArg::TensorMut(&mut ci),
                ];
                run_def(&gathered_gemm, &(), grid, &mut args).expect("interpret");
                let want = gathered_gemm_ref(&a, &i32s(&idx), &b);
                let case = Case {
                    kernel: format!("{} gathered_gemm", dev.target()),
                    shape: format!("{na}/{rows}x{k}x{n}"),
                    dist,
                    seed: rng.seed(),
                };
                let tol = 10.0 * tolerance(DType::F32);
                let got = down(&dc);
                assert_close(&case, &got, &want, tol);
                assert_close(&case, &got, &ci.to_f64_vec(), tol);
            }
        }
    }
}

/// Scalar atomics from many blocks: each block's atomics apply once (the reads and final
/// values form one chain of per-block updates), and the last block to draw a ticket sums
/// every block's partial (visible to it through the acq_rel ticket), run twice to see the
/// counter reset.
fn gpu_scalar_atomics_apply_once_per_block() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for blocks in [1, 7, 1000] {
            let v = scalar_atomic_inputs(&mut rng, blocks);
            let init = scalar_atomic_targets(&mut rng);
            let dv: Vec<DeviceTensor> = v.iter().map(|t| up(&dev, t)).collect();
            let dt: Vec<DeviceTensor> = init.iter().map(|t| up(&dev, t)).collect();
            let dold = poisoned_on(&dev, DType::F32, &[SCALAR_ATOMIC_ROWS, blocks]);
            let args: Vec<KernelArg> = dv
                .iter()
                .chain(&dt)
                .chain([&dold])
                .map(KernelArg::Tensor)
                .collect();
            dev.launch(&scalar_atomics, &(), [blocks as u32, 1, 1], &args)
                .expect("launch");
            let fin = [down(&dt[0]), down(&dt[1]), down(&dt[2])];
            let what = format!("{} blocks={blocks} KILN_SEED={}", dev.target(), rng.seed());
            check_scalar_atomics(&what, &v, &init, &fin, &down(&dold));
        }
        for n in [1usize, 4097, 1_000_000] {
            let blocks = n.div_ceil(SUM_BLOCK);
            let x = tensor(&mut rng, &[n], DType::F32, Dist::Normal);
            let (dx, partial, total, tickets) = (
                up(&dev, &x),
                poisoned_on(&dev, DType::F32, &[blocks]),
                poisoned_on(&dev, DType::F32, &[1]),
                poisoned_on(&dev, DType::I32, &[blocks]),
            );
            let counter = up(&dev, &HostTensor::full(&[1], DType::I32, 0.0));
            for launch in 0..2 {
                let args = [&dx, &partial, &counter, &total, &tickets].map(KernelArg::Tensor);
                dev.launch(&last_block_sum, &(), [blocks as u32, 1, 1], &args)
                    .expect("launch");
                let what = format!(
                    "{} last_block_sum n={n} launch {launch} KILN_SEED={}",
                    dev.target(),
                    rng.seed()
                );
                let xs = x.to_f64_vec();
                let want: f64 = xs.iter().sum();
                // f32 rounding along the longest chain of additions: the block's tree over
                // 256 elements, the last block's tree over a chunk of 256 partials, and its
                // running sum over the chunks, each addition off by 2^-24 of the magnitudes.
                let depth = 18.0 + blocks.div_ceil(SUM_BLOCK) as f64;
                let scale: f64 = xs.iter().map(|v| v.abs()).sum::<f64>() * depth * 2f64.powi(-24);
                let got = down(&total).to_f64_vec()[0];
                assert!(
                    (got - want).abs() <= scale.max(1e-30),
                    "{what}: total {got}, want {want}"
                );
                let mut t = i32s(&down(&tickets));
                t.sort_unstable();
                assert_eq!(t, (0..blocks as i32).collect::<Vec<_>>(), "{what}: tickets");
                assert_eq!(i32s(&down(&counter)), [0], "{what}: counter reset");
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_histogram_counts_exactly",
            Needs::Gpu,
            gpu_histogram_counts_exactly,
        ),
        (
            "gpu_row_gather_and_scatter_move_rows_exactly",
            Needs::Gpu,
            gpu_row_gather_and_scatter_move_rows_exactly,
        ),
        (
            "gpu_atomics_match_the_reference",
            Needs::Gpu,
            gpu_atomics_match_the_reference,
        ),
        (
            "gpu_atomic_adds_from_several_blocks_sum",
            Needs::Gpu,
            gpu_atomic_adds_from_several_blocks_sum,
        ),
        (
            "gpu_atomics_on_tiles_smaller_than_the_block",
            Needs::Gpu,
            gpu_atomics_on_tiles_smaller_than_the_block,
        ),
        (
            "gpu_gathered_gemm_multiplies_the_routed_rows",
            Needs::Gpu,
            gpu_gathered_gemm_multiplies_the_routed_rows,
        ),
        (
            "gpu_split_k_gemm_accumulates_partial_tiles",
            Needs::Gpu,
            gpu_split_k_gemm_accumulates_partial_tiles,
        ),
        (
            "gpu_masked_loads_and_stores_and_element_gathers",
            Needs::Gpu,
            gpu_masked_loads_and_stores_and_element_gathers,
        ),
        (
            "gpu_scalar_atomics_apply_once_per_block",
            Needs::Gpu,
            gpu_scalar_atomics_apply_once_per_block,
        ),
    ])
}
