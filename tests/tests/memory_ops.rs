//! Memory operations on the interpreter against exact or f64 references: a histogram built
//! with masked atomic adds through an index tile, MoE-style row gathers and scatters with
//! indices outside the tensor, atomics of every kind through row indices that repeat (bf16,
//! f16, f32, i32; every memory order), masked loads with a fill value and masked stores,
//! element gathers; shapes that are no multiple of any tile, several input distributions,
//! outputs poisoned. And the diagnostics of misused memory operations, at the user's line.

mod memory_kernels;

use half::{bf16, f16};
use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ir::interp::{HostArg, run_def};
use kiln::ir::{AtomicOp, DType, HostTensor};
use kiln::prelude::*;
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use memory_kernels::*;

fn cdiv(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

#[test]
fn histogram_counts_every_in_range_value_exactly() {
    let mut rng = Rng::from_env();
    for n in [1, 255, 1000, 4097] {
        for bins in [1, 37, 300] {
            let x = ints(&mut rng, &[n], -3, bins as i64 + 3);
            let init = ints(&mut rng, &[bins], -5, 5);
            let mut h = init.clone();
            let grid = [cdiv(n, HIST_BLOCK), 1, 1];
            run_def(
                &histogram,
                &HIST,
                grid,
                &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut h)],
            )
            .unwrap();
            let want = histogram_ref(&i32s(&x), &i32s(&init));
            assert_eq!(i32s(&h), want, "n={n} bins={bins} KILN_SEED={}", rng.seed());
        }
    }
}

/// Row indices in `-2..n + 2`: some outside the tensor.
fn row_indices(rng: &mut Rng, count: usize, n: usize) -> HostTensor {
    ints(rng, &[count], -2, n as i64 + 2)
}

#[test]
fn gather_rows_reads_indexed_rows_and_zero_outside() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16, DType::I32] {
        for (n, rows, cols) in [(100, 45, 70), (7, 64, 64), (300, 1, 130)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[n, cols], dtype, dist);
                let idx = row_indices(&mut rng, rows, n);
                let mut y = poisoned(&[rows, cols], dtype);
                let grid = [cdiv(rows, ROWS), cdiv(cols, COLS), 1];
                let ct = GatherRowsComptime { dtype };
                let mut args = [
                    HostArg::Tensor(&x),
                    HostArg::Tensor(&idx),
                    HostArg::TensorMut(&mut y),
                ];
                run_def(&gather_rows, &ct, grid, &mut args).unwrap();
                let (xv, iv) = (x.to_f64_vec(), i32s(&idx));
                let want: Vec<f64> = (0..rows * cols)
                    .map(|e| {
                        let (r, c) = (e / cols, e % cols);
                        match usize::try_from(iv[r]) {
                            Ok(s) if s < n => xv[s * cols + c],
                            _ => 0.0,
                        }
                    })
                    .collect();
                assert_same(
                    &y.to_f64_vec(),
                    &want,
                    &format!(
                        "gather_rows {dtype} n={n} rows={rows} cols={cols} {dist:?} KILN_SEED={}",
                        rng.seed()
                    ),
                );
            }
        }
    }
}

/// A permutation of `0..count` shifted so that some rows land outside `0..n`.
fn distinct_rows(rng: &mut Rng, count: usize, n: usize) -> HostTensor {
    let mut p: Vec<i64> = (0..n as i64 + 4).map(|i| i - 2).collect();
    for i in (1..p.len()).rev() {
        p.swap(i, rng.range(0, i + 1));
    }
    HostTensor::from_fn(&[count], DType::I32, |i| p[i % p.len()] as f64)
}

#[test]
fn scatter_rows_writes_each_indexed_row_once() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::F16] {
        for (n, rows, cols) in [(100, 90, 70), (40, 44, 64)] {
            let x = tensor(&mut rng, &[rows, cols], dtype, Dist::Normal);
            let idx = distinct_rows(&mut rng, rows, n);
            let init = tensor(&mut rng, &[n, cols], dtype, Dist::Uniform);
            let mut y = init.clone();
            let grid = [cdiv(rows, ROWS), cdiv(cols, COLS), 1];
            let ct = ScatterRowsComptime { dtype };
            let mut args = [
                HostArg::Tensor(&x),
                HostArg::Tensor(&idx),
                HostArg::TensorMut(&mut y),
            ];
            run_def(&scatter_rows, &ct, grid, &mut args).unwrap();
            let mut want = init.to_f64_vec();
            let (xv, iv) = (x.to_f64_vec(), i32s(&idx));
            for r in 0..rows {
                if let Ok(t) = usize::try_from(iv[r])
                    && t < n
                {
                    want[t * cols..(t + 1) * cols].copy_from_slice(&xv[r * cols..(r + 1) * cols]);
                }
            }
            assert_same(
                &y.to_f64_vec(),
                &want,
                &format!(
                    "scatter_rows {dtype} n={n} rows={rows} KILN_SEED={}",
                    rng.seed()
                ),
            );
        }
    }
}

/// `x` rounded to `dtype` (floats through f32, as the hardware's adds).
fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::Bf16 => bf16::from_f32(x as f32).to_f64(),
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::F32 => f64::from(x as f32),
        _ => x,
    }
}

/// One element of an atomic: the new memory value from `m`, value `v` and compare `c`.
fn apply(op: AtomicOp, dtype: DType, m: f64, v: f64, c: f64) -> f64 {
    let same = |a: f64, b: f64| match dtype {
        DType::I32 => a == b,
        _ => (a as f32).to_bits() == (b as f32).to_bits(),
    };
    match op {
        AtomicOp::Add if dtype == DType::I32 => f64::from((m as i32).wrapping_add(v as i32)),
        AtomicOp::Add => round_to(dtype, f64::from(m as f32 + v as f32)),
        AtomicOp::Max => m.max(v),
        AtomicOp::Min => m.min(v),
        AtomicOp::Xchg => v,
        AtomicOp::Cas if same(m, c) => v,
        AtomicOp::Cas => m,
    }
}

/// Inputs of an `atomic_rows` run: its tensors and the source's extent.
struct RowsCase {
    x: HostTensor,
    cmp: HostTensor,
    idx: HostTensor,
    keep: HostTensor,
    acc: HostTensor,
    rows: usize,
    cols: usize,
}

/// `atomic_rows`'s result in the interpreter's order (blocks x fastest, then the tile's
/// elements row-major): `(acc, old)`.
fn atomic_rows_ref(op: AtomicOp, dtype: DType, c: &RowsCase) -> (Vec<f64>, Vec<f64>) {
    let (rows, cols) = (c.rows, c.cols);
    let n = c.acc.shape[0];
    let (xv, cv, iv, kv) = (
        c.x.to_f64_vec(),
        c.cmp.to_f64_vec(),
        i32s(&c.idx),
        i32s(&c.keep),
    );
    let mut acc = c.acc.to_f64_vec();
    let mut old = vec![0.0; rows * cols];
    for cb in 0..cols.div_ceil(COLS) {
        for rb in 0..rows.div_ceil(ROWS) {
            for r in rb * ROWS..((rb + 1) * ROWS).min(rows) {
                for col in cb * COLS..((cb + 1) * COLS).min(cols) {
                    let Ok(t) = usize::try_from(iv[r]) else {
                        continue;
                    };
                    if kv[r] <= 0 || t >= n {
                        continue;
                    }
                    let (m, e) = (acc[t * cols + col], r * cols + col);
                    acc[t * cols + col] = apply(op, dtype, m, xv[e], cv[e]);
                    old[e] = m;
                }
            }
        }
    }
    (acc, old)
}

/// Random inputs of `atomic_rows`: `n` target rows, `rows` source rows whose indices repeat
/// (`repeat`) or are distinct; `cmp` equals the target's initial value at about half the
/// elements, so `cas` both swaps and keeps.
fn rows_case(
    rng: &mut Rng,
    dtype: DType,
    (n, rows, cols): (usize, usize, usize),
    repeat: bool,
    dist: Dist,
) -> RowsCase {
    let x = tensor(rng, &[rows, cols], dtype, dist);
    let idx = if repeat {
        row_indices(rng, rows, n)
    } else {
        distinct_rows(rng, rows, n)
    };
    let keep = ints(rng, &[rows], -1, 4);
    let acc = tensor(rng, &[n, cols], dtype, Dist::Normal);
    let (iv, av) = (i32s(&idx), acc.to_f64_vec());
    let mut cmp = tensor(rng, &[rows, cols], dtype, dist);
    for e in 0..rows * cols {
        let (r, c) = (e / cols, e % cols);
        if let Ok(t) = usize::try_from(iv[r])
            && t < n
            && rng.range(0, 2) == 0
        {
            cmp.data.set_f64(e, av[t * cols + c]);
        }
    }
    RowsCase {
        x,
        cmp,
        idx,
        keep,
        acc,
        rows,
        cols,
    }
}

/// Runs `atomic_rows` on the interpreter: `(acc, old)`.
fn run_atomic_rows(ct: &AtomicRowsComptime, c: &RowsCase) -> (HostTensor, HostTensor) {
    let mut acc = c.acc.clone();
    let mut old = poisoned(&[c.rows, c.cols], ct.dtype);
    let grid = [cdiv(c.rows, ROWS), cdiv(c.cols, COLS), 1];
    let mut args = [
        HostArg::Tensor(&c.x),
        HostArg::Tensor(&c.cmp),
        HostArg::Tensor(&c.idx),
        HostArg::Tensor(&c.keep),
        HostArg::TensorMut(&mut acc),
        HostArg::TensorMut(&mut old),
    ];
    run_def(&atomic_rows, ct, grid, &mut args).unwrap();
    (acc, old)
}

#[test]
fn atomics_through_repeated_row_indices_apply_every_element_in_order() {
    let mut rng = Rng::from_env();
    let cases: &[(DType, &[usize])] = &[
        (DType::I32, &[0, 1, 2, 3, 4]),
        (DType::F32, &[0, 1, 2, 3, 4]),
        (DType::Bf16, &[0]),
        (DType::F16, &[0]),
    ];
    for &(dtype, ops) in cases {
        for &op in ops {
            for (i, shape) in [(50, 100, 70), (3, 40, 64), (200, 33, 1)]
                .into_iter()
                .enumerate()
            {
                let dist = Dist::ALL[(op + i) % Dist::ALL.len()];
                let c = rows_case(&mut rng, dtype, shape, true, dist);
                let ct = AtomicRowsComptime {
                    op,
                    dtype,
                    order: op + i,
                };
                let (acc, old) = run_atomic_rows(&ct, &c);
                let (want_acc, want_old) = atomic_rows_ref(atomic_op(op), dtype, &c);
                let case = |what: &str| {
                    format!(
                        "atomic_rows {:?} {dtype} {shape:?} {dist:?} ({what}) KILN_SEED={}",
                        atomic_op(op),
                        rng.seed()
                    )
                };
                assert_same(&acc.to_f64_vec(), &want_acc, &case("memory"));
                assert_same(&old.to_f64_vec(), &want_old, &case("old values"));
            }
        }
    }
}

#[test]
fn atomic_adds_from_several_blocks_sum_to_the_f64_reference() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16, DType::I32] {
        for (rows, cols, repeats) in [(70, 100, 3), (32, 64, 1), (5, 3, 8)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[rows, cols], dtype, dist);
                let init = tensor(&mut rng, &[rows, cols], dtype, Dist::Uniform);
                let mut acc = init.clone();
                let grid = [cdiv(rows, ROWS), cdiv(cols, COLS), repeats as u32];
                let ct = AtomicAddTilesComptime { dtype };
                let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut acc)];
                run_def(&atomic_add_tiles, &ct, grid, &mut args).unwrap();
                let want: Vec<f64> = init
                    .to_f64_vec()
                    .iter()
                    .zip(x.to_f64_vec())
                    .map(|(a, v)| a + repeats as f64 * v)
                    .collect();
                let case = Case {
                    kernel: format!("atomic_add_tiles {dtype} x{repeats}"),
                    shape: format!("{rows}x{cols}"),
                    dist,
                    seed: rng.seed(),
                };
                // bf16 rounds after each of the adds.
                let tol = tolerance(dtype) * if dtype == DType::Bf16 { 2.0 } else { 1.0 };
                assert_close(&case, &acc, &want, tol);
            }
        }
    }
}

#[test]
fn masked_loads_fill_and_masked_stores_skip() {
    let mut rng = Rng::from_env();
    for (rows, cols) in [(70, 45), (32, 32), (1, 100)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[rows, cols], DType::F32, dist);
            let init = tensor(&mut rng, &[rows, cols], DType::F32, Dist::Uniform);
            let mut y = init.clone();
            let (t, fill) = (rng.normal() as f32 * 0.5, -7.5f32);
            let limit = rng.range(0, cols + 3) as i32 - 1;
            let grid = [cdiv(rows, MASK_TILE[0]), cdiv(cols, MASK_TILE[1]), 1];
            let mut args = [
                HostArg::Tensor(&x),
                HostArg::TensorMut(&mut y),
                HostArg::F32(t),
                HostArg::F32(fill),
                HostArg::I32(limit),
            ];
            run_def(&masked_copy, &(), grid, &mut args).unwrap();
            let (xv, iv) = (x.to_f64_vec(), init.to_f64_vec());
            let want: Vec<f64> = (0..rows * cols)
                .map(|e| match (e % cols) < limit.max(0) as usize {
                    true if xv[e] > f64::from(t) => xv[e],
                    true => f64::from(fill),
                    false => iv[e],
                })
                .collect();
            assert_same(
                &y.to_f64_vec(),
                &want,
                &format!(
                    "masked_copy {rows}x{cols} t={t} limit={limit} {dist:?} KILN_SEED={}",
                    rng.seed()
                ),
            );
        }
    }
}

#[test]
fn element_gathers_read_each_index_pair() {
    let mut rng = Rng::from_env();
    for (r, c, n) in [(50, 40, 1000), (3, 300, 256), (1, 1, 7)] {
        let x = tensor(&mut rng, &[r, c], DType::F32, Dist::Normal);
        let ri = ints(&mut rng, &[n], -2, r as i64 + 2);
        let ci = ints(&mut rng, &[n], -2, c as i64 + 2);
        let mut y = poisoned(&[n], DType::F32);
        let grid = [cdiv(n, HIST_BLOCK), 1, 1];
        let mut args = [
            HostArg::Tensor(&x),
            HostArg::Tensor(&ri),
            HostArg::Tensor(&ci),
            HostArg::TensorMut(&mut y),
        ];
        run_def(&gather_elems, &(), grid, &mut args).unwrap();
        let (xv, rv, cv) = (x.to_f64_vec(), i32s(&ri), i32s(&ci));
        let want: Vec<f64> = (0..n)
            .map(|i| match (usize::try_from(rv[i]), usize::try_from(cv[i])) {
                (Ok(a), Ok(b)) if a < r && b < c => xv[a * c + b],
                _ => 0.0,
            })
            .collect();
        assert_same(
            &y.to_f64_vec(),
            &want,
            &format!("gather_elems {r}x{c} n={n} KILN_SEED={}", rng.seed()),
        );
    }
}

#[kernel(num_warps = 4)]
fn bf16_atomic_max(x: Tensor<bf16, 1>, y: TensorMut<bf16, 1>) {
    let v = x.tile([128], [0]).load();
    y.tile([128], [0]).atomic_max(v);
}

#[kernel(num_warps = 4)]
fn atomic_on_read_only(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    let v = x.tile([128], [0]).load();
    y.tile([128], [0]).atomic_add(v);
}

#[kernel(num_warps = 4)]
fn float_index(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
    let v = x.tile([128], [0]).load();
    y.elems([&v]).store(v);
}

#[kernel(num_warps = 4)]
fn int_mask(x: Tensor<f32, 1>, i: Tensor<i32, 1>, y: TensorMut<f32, 1>) {
    let m = i.tile([128], [0]).load();
    let v = x.tile([128], [0]).load_masked(m, 0.0);
    y.tile([128], [0]).store(v);
}

#[kernel(num_warps = 4)]
fn too_many_indices(x: Tensor<f32, 1>, i: Tensor<i32, 1>, y: TensorMut<f32, 1>) {
    let j = i.tile([128], [0]).load();
    let v = x.elems([&j, &j]).load();
    y.tile([128], [0]).store(v);
}

/// The first diagnostic building `def` gives, with its line.
fn diagnostic<K: KernelDef<Comptime = ()>>(def: &K) -> (u32, String) {
    match def.build(&Spec::uniform((), def.signature(), true)) {
        Ok(_) => panic!("{} built", def.name()),
        Err(d) => (d.loc.line, d.to_string()),
    }
}

/// Builds a kernel that should fail: the diagnostic's line and text.
type Diagnose = dyn Fn() -> (u32, String);

/// The 1-based line of this file holding `text`.
fn line_of(text: &str) -> u32 {
    let src = include_str!("memory_ops.rs");
    let i = src
        .lines()
        .position(|l| l.contains(text))
        .expect("text in this file");
    i as u32 + 1
}

#[test]
fn misused_memory_ops_are_diagnosed_at_their_line() {
    let cases: [(&Diagnose, &str, &str); 5] = [
        (
            &|| diagnostic(&too_many_indices),
            "x.elems([&j, &j])",
            "a rank-1 tensor needs 1 index tiles, found 2",
        ),
        (
            &|| diagnostic(&bf16_atomic_max),
            "[0]).atomic_max(v);",
            "atomic max is not available on bf16",
        ),
        (
            &|| diagnostic(&atomic_on_read_only),
            "[0]).atomic_add(v);",
            "read-only",
        ),
        (
            &|| diagnostic(&float_index),
            "y.elems([&v])",
            "expected an i32 tile",
        ),
        (
            &|| diagnostic(&int_mask),
            ".load_masked(m, 0.0)",
            "the mask is a 128 i32 tile",
        ),
    ];
    for (f, at, text) in cases {
        let (got_line, msg) = f();
        assert!(msg.contains(text), "expected `{text}` in: {msg}");
        assert_eq!(got_line, line_of(at), "{msg}");
    }
}

#[test]
fn memory_ops_print_their_addressing() {
    let ct = AtomicRowsComptime {
        op: 4,
        dtype: DType::F32,
        order: 7,
    };
    let k = atomic_rows
        .build(&Spec::uniform(ct, atomic_rows.signature(), true))
        .unwrap();
    let text = kiln::ir::print::print_kernel(&k);
    let line = text
        .lines()
        .find(|l| l.contains("atomic."))
        .expect("an atomic line");
    // cas, acq_rel (7 % 4 = 3), cta scope (7 % 3 = 1); rows through an index tile; the
    // compare and the values; the mask.
    assert!(
        line.contains("atomic.cas.acq_rel.cta acc[idx %") && line.contains(" mask %"),
        "{line}"
    );
    let k = histogram
        .build(&Spec::uniform(HIST, histogram.signature(), true))
        .unwrap();
    let text = kiln::ir::print::print_kernel(&k);
    assert!(text.contains("atomic.add.relaxed.gpu hist[idx %"), "{text}");
    let k = masked_copy
        .build(&Spec::uniform((), masked_copy.signature(), true))
        .unwrap();
    let text = kiln::ir::print::print_kernel(&k);
    assert!(
        text.contains("gather x[%") && text.contains(" other %"),
        "{text}"
    );
    assert!(text.contains("scatter y[%"), "{text}");
}

#[test]
fn split_k_gemm_accumulates_its_partial_tiles() {
    let mut rng = Rng::from_env();
    for (m, n, k) in [(130, 70, 300), (128, 128, 128), (5, 200, 64)] {
        for dist in [Dist::Uniform, Dist::Normal] {
            let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
            let b = tensor(&mut rng, &[k, n], DType::Bf16, dist);
            let init = tensor(&mut rng, &[m, n], DType::F32, Dist::Uniform);
            let mut c = init.clone();
            let grid = [cdiv(m, 128), cdiv(n, 128), cdiv(k, KSPLIT * 64)];
            let mut args = [
                HostArg::Tensor(&a),
                HostArg::Tensor(&b),
                HostArg::TensorMut(&mut c),
            ];
            run_def(&splitk_gemm, &(), grid, &mut args).unwrap();
            let (av, bv, iv) = (a.to_f64_vec(), b.to_f64_vec(), init.to_f64_vec());
            let want: Vec<f64> = (0..m * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    iv[e] + (0..k).map(|t| av[i * k + t] * bv[t * n + j]).sum::<f64>()
                })
                .collect();
            let case = Case {
                kernel: "splitk_gemm".into(),
                shape: format!("{m}x{n}x{k}"),
                dist,
                seed: rng.seed(),
            };
            assert_close(&case, &c, &want, tolerance(DType::F32) * 10.0);
        }
    }
}

#[test]
fn atomics_on_tiles_smaller_than_the_block_apply_once() {
    let mut rng = Rng::from_env();
    for n in [16, 11] {
        let x = tensor(&mut rng, &[n], DType::F32, Dist::Normal);
        let y0 = tensor(&mut rng, &[n], DType::F32, Dist::Normal);
        let (mut y, mut z) = (y0.clone(), poisoned(&[n], DType::F32));
        let mut args = [
            HostArg::Tensor(&x),
            HostArg::TensorMut(&mut y),
            HostArg::TensorMut(&mut z),
        ];
        run_def(&small_atomics, &(), [1, 1, 1], &mut args).unwrap();
        let (xv, yv) = (x.to_f64_vec(), y0.to_f64_vec());
        let sum: Vec<f64> = (0..n)
            .map(|i| f64::from(xv[i] as f32 + yv[i] as f32))
            .collect();
        assert_same(&z.to_f64_vec(), &sum, "old values");
        assert_same(&y.to_f64_vec(), &xv, "memory");
    }
}

#[test]
fn gathered_gemm_multiplies_the_routed_rows() {
    let mut rng = Rng::from_env();
    for (na, rows, k, n) in [(100, 70, 100, 70), (16, 64, 32, 64), (300, 5, 200, 130)] {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
            let a = tensor(&mut rng, &[na, k], DType::Bf16, dist);
            let b = tensor(&mut rng, &[k, n], DType::Bf16, dist);
            let idx = row_indices(&mut rng, rows, na);
            let mut c = poisoned(&[rows, n], DType::F32);
            let grid = [cdiv(rows, 64), cdiv(n, 64), 1];
            let mut args = [
                HostArg::Tensor(&a),
                HostArg::Tensor(&idx),
                HostArg::Tensor(&b),
                HostArg::TensorMut(&mut c),
            ];
            run_def(&gathered_gemm, &(), grid, &mut args).unwrap();
            let case = Case {
                kernel: "gathered_gemm".into(),
                shape: format!("{na}/{rows}x{k}x{n}"),
                dist,
                seed: rng.seed(),
            };
            let want = gathered_gemm_ref(&a, &i32s(&idx), &b);
            assert_close(&case, &c, &want, tolerance(DType::F32) * 10.0);
        }
    }
}

#[kernel(num_warps = 4)]
fn gathered_b(a: Tensor<bf16, 2>, idx: Tensor<i32, 1>, c: TensorMut<f32, 2>) {
    let rows = idx.tile([32], [0]).load();
    let x = a.tile([64, 32], [0, 0]).load();
    let y = a.rows(&rows, 64, [0, 0]).load();
    c.tile([64, 64], [0, 0]).store(mma(&x, &y));
}

/// A gathered B operand is read into registers and staged through shared memory from there
/// (`mma_operands`), on both targets; its numbers are checked in `mma_general.rs`.
#[test]
fn a_gathered_mma_b_operand_is_staged_from_registers() {
    let k = gathered_b
        .build(&Spec::uniform((), gathered_b.signature(), true))
        .unwrap();
    for target in [kiln::ir::Target::Sm80, kiln::ir::Target::Sm90a] {
        let mut lowered = k.clone();
        kiln::ir::passes::run_pipeline(&mut lowered, target, &mut |_, _| {})
            .unwrap_or_else(|d| panic!("{d}"));
        assert_eq!(lowered.schedule.staged.len(), 1, "{target}");
        let m = kiln::ptx::compile(&k, target).unwrap_or_else(|e| panic!("{e}"));
        if kiln::ptx::ptxas::find_ptxas().is_ok() {
            let r = kiln::ptx::ptxas::check(&m.ptx, target).expect("assembles");
            assert!(!r.spills(), "{target}: {r}");
        }
    }
}

/// The split-K and gathered GEMMs through the sm_90a and sm_100a passes, run by the CPU
/// executor of their schedules (`run_scheduled`, 2 persistent CTAs where the schedule is
/// persistent): the atomic epilogue and the gathered A operand inside the warp-specialised
/// ring give the f64 reference's numbers.
#[test]
fn scheduled_gemms_with_memory_ops_match_the_reference() {
    use kiln::ir::Target;
    use kiln::ir::interp::run_scheduled;
    use kiln::ir::passes::run_pipeline;
    let mut rng = Rng::from_env();
    for target in [Target::Sm90a, Target::Sm100a] {
        let mut k = splitk_gemm
            .build(&Spec::uniform((), splitk_gemm.signature(), true))
            .unwrap();
        run_pipeline(&mut k, target, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
        assert!(
            k.schedule.sched.is_some(),
            "{target}: split-K is warp-specialised"
        );
        let (m, n, kk) = (130, 200, 300);
        let a = tensor(&mut rng, &[m, kk], DType::Bf16, Dist::Normal);
        let b = tensor(&mut rng, &[kk, n], DType::Bf16, Dist::Normal);
        let init = tensor(&mut rng, &[m, n], DType::F32, Dist::Uniform);
        let mut c = init.clone();
        let grid = [cdiv(m, 128), cdiv(n, 128), cdiv(kk, KSPLIT * 64)];
        let mut args = [
            HostArg::Tensor(&a),
            HostArg::Tensor(&b),
            HostArg::TensorMut(&mut c),
        ];
        run_scheduled(&k, grid, 2, &mut args).unwrap_or_else(|e| panic!("{target}: {e}"));
        let (av, bv, iv) = (a.to_f64_vec(), b.to_f64_vec(), init.to_f64_vec());
        let want: Vec<f64> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                iv[e] + (0..kk).map(|t| av[i * kk + t] * bv[t * n + j]).sum::<f64>()
            })
            .collect();
        let case = Case {
            kernel: format!("scheduled splitk_gemm on {target}"),
            shape: format!("{m}x{n}x{kk}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &c, &want, tolerance(DType::F32) * 10.0);
    }
    let mut k = gathered_gemm
        .build(&Spec::uniform((), gathered_gemm.signature(), true))
        .unwrap();
    run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
    // A gathered A keeps the mma.sync lowering on sm_90a (see the `pipeline` pass), with a
    // note saying so.
    assert!(
        k.schedule.sched.is_none() && !k.schedule.notes.is_empty(),
        "the gathered GEMM is not warp-specialised"
    );
    let (na, rows, kk, n) = (100, 130, 96, 70);
    let a = tensor(&mut rng, &[na, kk], DType::Bf16, Dist::Normal);
    let b = tensor(&mut rng, &[kk, n], DType::Bf16, Dist::Normal);
    let idx = row_indices(&mut rng, rows, na);
    let mut c = poisoned(&[rows, n], DType::F32);
    let grid = [cdiv(rows, 64), cdiv(n, 64), 1];
    let mut args = [
        HostArg::Tensor(&a),
        HostArg::Tensor(&idx),
        HostArg::Tensor(&b),
        HostArg::TensorMut(&mut c),
    ];
    run_scheduled(&k, grid, 2, &mut args).unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        kernel: "scheduled gathered_gemm on sm_90a".into(),
        shape: format!("{na}/{rows}x{kk}x{n}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    let want = gathered_gemm_ref(&a, &i32s(&idx), &b);
    assert_close(&case, &c, &want, tolerance(DType::F32) * 10.0);
}

#[test]
fn scalar_atomics_apply_once_per_block_and_return_the_old_value() {
    let mut rng = Rng::from_env();
    for blocks in [1, 7, 100] {
        let v = scalar_atomic_inputs(&mut rng, blocks);
        let init = scalar_atomic_targets(&mut rng);
        let mut fin = init.clone();
        let mut old = poisoned(&[SCALAR_ATOMIC_ROWS, blocks], DType::F32);
        let [ai, af, ah] = &mut fin;
        let mut args = [
            HostArg::Tensor(&v[0]),
            HostArg::Tensor(&v[1]),
            HostArg::Tensor(&v[2]),
            HostArg::TensorMut(ai),
            HostArg::TensorMut(af),
            HostArg::TensorMut(ah),
            HostArg::TensorMut(&mut old),
        ];
        run_def(&scalar_atomics, &(), [blocks as u32, 1, 1], &mut args).unwrap();
        let what = format!("blocks={blocks} KILN_SEED={}", rng.seed());
        check_scalar_atomics(&what, &v, &init, &fin, &old);
        // The interpreter runs the blocks in order: block 0 reads the initial values.
        let olds = old.to_f64_vec();
        let ii = init[0].to_f64_vec();
        assert_eq!(olds[0], ii[0], "{what}");
        assert_eq!(olds[4 * blocks], 0.0, "{what}: block 0 wins the cas");
    }
}

#[test]
fn the_last_block_to_draw_a_ticket_sums_the_partials() {
    let mut rng = Rng::from_env();
    for n in [1usize, 255, 4097, 100_000] {
        for dist in [Dist::Uniform, Dist::Normal] {
            let blocks = n.div_ceil(SUM_BLOCK);
            let x = tensor(&mut rng, &[n], DType::F32, dist);
            let mut partial = poisoned(&[blocks], DType::F32);
            let mut counter = HostTensor::full(&[1], DType::I32, 0.0);
            let mut total = poisoned(&[1], DType::F32);
            let mut tickets = poisoned(&[blocks], DType::I32);
            // Twice: the last block resets the counter for the next launch.
            for launch in 0..2 {
                let mut args = [
                    HostArg::Tensor(&x),
                    HostArg::TensorMut(&mut partial),
                    HostArg::TensorMut(&mut counter),
                    HostArg::TensorMut(&mut total),
                    HostArg::TensorMut(&mut tickets),
                ];
                run_def(&last_block_sum, &(), [blocks as u32, 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("last_block_sum launch {launch}"),
                    shape: format!("n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                let xs = x.to_f64_vec();
                let want: f64 = xs.iter().sum();
                // f32 rounding along the longest chain of additions: the block's tree over
                // 256 elements, the last block's tree over a chunk of 256 partials, and its
                // running sum over the chunks, each addition off by 2^-24 of the magnitudes.
                let depth = 18.0 + blocks.div_ceil(SUM_BLOCK) as f64;
                let scale: f64 = xs.iter().map(|v| v.abs()).sum::<f64>() * depth * 2f64.powi(-24);
                let got = total.to_f64_vec()[0];
                assert!(
                    (got - want).abs() <= scale.max(1e-30),
                    "{case}: total {got}, want {want}"
                );
                let mut t = i32s(&tickets);
                t.sort_unstable();
                assert_eq!(t, (0..blocks as i32).collect::<Vec<_>>(), "{case}: tickets");
                assert_eq!(i32s(&counter), [0], "{case}: the counter is reset");
            }
        }
    }
}
