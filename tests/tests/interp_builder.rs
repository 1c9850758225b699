//! The interpreter on kernels built directly with `Builder`: vector add, a two-pass row
//! softmax with loops over column tiles, a tiled bf16 gemm through `mma` (also with a
//! transposed operand), an `if` on a runtime flag, i32 division, and the argument and
//! runtime errors. Inputs are fresh random draws (seed printed on failure), outputs are
//! poisoned before each run and compared with f64 references by relative norm error.

use kiln_ir::interp::{ArgProblem, HostArg, InterpError, run};
use kiln_ir::{
    BinaryOp, Builder, Const, DType, HostTensor, Kernel, KernelOptions, Loc, OpKind, Param,
    ReduceOp, Shape, UnaryOp, ValueId,
};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor, with_row_padding};
use kiln_tests::reference;

/// A thin layer over `Builder` so the kernels below read like their IR.
struct K(Builder);

impl K {
    fn new(name: &str, params: Vec<Param>) -> K {
        K(Builder::new(name, params, KernelOptions::default()))
    }
    fn op(&mut self, kind: OpKind, operands: &[ValueId]) -> ValueId {
        self.0.op1(kind, operands, Loc::caller()).unwrap()
    }
    fn effect(&mut self, kind: OpKind, operands: &[ValueId]) {
        self.0.op(kind, operands, Loc::caller()).unwrap();
    }
    fn i32(&mut self, v: i64) -> ValueId {
        self.0
            .constant(Const::Int(v), DType::I32, Loc::caller())
            .unwrap()
    }
    fn f32(&mut self, v: f64) -> ValueId {
        self.0
            .constant(Const::Float(v), DType::F32, Loc::caller())
            .unwrap()
    }
    fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.op(OpKind::Binary(op), &[a, b])
    }
    fn un(&mut self, op: UnaryOp, a: ValueId) -> ValueId {
        self.op(OpKind::Unary(op), &[a])
    }
    fn cast(&mut self, a: ValueId, to: DType) -> ValueId {
        if self.0.ty(a).dtype() == to {
            a
        } else {
            self.op(OpKind::Cast { to }, &[a])
        }
    }
    fn reshape(&mut self, a: ValueId, dims: &[usize]) -> ValueId {
        self.op(
            OpKind::Reshape {
                shape: Shape(dims.to_vec()),
            },
            &[a],
        )
    }
    fn load(&mut self, tensor: usize, coords: &[ValueId], dims: &[usize]) -> ValueId {
        let shape = Shape(dims.to_vec());
        self.op(OpKind::Load { tensor, shape }, coords)
    }
    fn store(&mut self, tensor: usize, coords: &[ValueId], v: ValueId) {
        let mut operands = coords.to_vec();
        operands.push(v);
        self.effect(
            OpKind::Store {
                tensor,
                bound: None,
            },
            &operands,
        );
    }
    fn block_id(&mut self, axis: kiln_ir::Axis) -> ValueId {
        self.op(OpKind::BlockId(axis), &[])
    }
    fn finish(self) -> Kernel {
        self.0.finish().unwrap()
    }
}

fn blocks(n: usize, tile: usize) -> u32 {
    n.div_ceil(tile) as u32
}

const VEC_BLOCK: usize = 64;

/// `out[i] = x[i] + y[i]`, one 64-element tile per block.
fn vector_add(dtype: DType) -> Kernel {
    let mut k = K::new(
        "vector_add",
        vec![
            Param::tensor("x", dtype, 1, false),
            Param::tensor("y", dtype, 1, false),
            Param::tensor("out", dtype, 1, true),
        ],
    );
    let pid = k.block_id(kiln_ir::Axis::X);
    let bs = k.i32(VEC_BLOCK as i64);
    let off = k.bin(BinaryOp::Mul, pid, bs);
    let a = k.load(0, &[off], &[VEC_BLOCK]);
    let b = k.load(1, &[off], &[VEC_BLOCK]);
    let c = k.bin(BinaryOp::Add, a, b);
    k.store(2, &[off], c);
    k.finish()
}

#[test]
fn vector_add_matches_reference() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        let kernel = vector_add(dtype);
        for n in [1, 63, 64, 1000, 4099] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[n], dtype, dist);
                let y = tensor(&mut rng, &[n], dtype, dist);
                let mut out = poisoned(&[n], dtype);
                let mut args = [
                    HostArg::Tensor(&x),
                    HostArg::Tensor(&y),
                    HostArg::TensorMut(&mut out),
                ];
                run(&kernel, [blocks(n, VEC_BLOCK), 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("vector_add<{dtype}>"),
                    shape: format!("n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(
                    &case,
                    &out,
                    &reference::vector_add(&x, &y),
                    tolerance(dtype),
                );
            }
        }
    }
}

const SM_ROWS: usize = 4;
const SM_COLS: usize = 32;

/// Row softmax of `x: [R, C]` into `y`, `SM_ROWS` rows per block: a first loop over column
/// tiles keeps the running max and sum (online softmax), a second writes `exp(x - m) / l`.
/// Columns past `C` are masked to `-inf` with `iota` + `select`.
fn softmax(dtype: DType) -> Kernel {
    let mut k = K::new(
        "softmax",
        vec![
            Param::tensor("x", dtype, 2, false),
            Param::tensor("y", dtype, 2, true),
        ],
    );
    let pid = k.block_id(kiln_ir::Axis::X);
    let br = k.i32(SM_ROWS as i64);
    let row0 = k.bin(BinaryOp::Mul, pid, br);
    let ncols = k.op(OpKind::TensorDim { tensor: 0, dim: 1 }, &[]);
    let zero = k.i32(0);
    let bc = k.i32(SM_COLS as i64);
    let log2e = k.f32(std::f64::consts::LOG2_E);
    let ninf = k.f32(f64::NEG_INFINITY);
    let fzero = k.f32(0.0);
    let rows = Shape(vec![SM_ROWS]);
    let m0 = k.op(
        OpKind::Splat {
            shape: rows.clone(),
        },
        &[ninf],
    );
    let l0 = k.op(OpKind::Splat { shape: rows }, &[fzero]);
    let tile = [SM_ROWS, SM_COLS];

    let scope =
        k.0.begin_for(zero, ncols, bc, &[m0, l0], None, Loc::caller())
            .unwrap();
    let (j, m, l) = (scope.iv, scope.carried[0], scope.carried[1]);
    let t = k.load(0, &[row0, j], &tile);
    let t = k.cast(t, DType::F32);
    let col = k.op(
        OpKind::Iota {
            shape: Shape(tile.to_vec()),
            dim: 1,
        },
        &[],
    );
    let col = k.bin(BinaryOp::Add, col, j);
    let valid = k.bin(BinaryOp::Lt, col, ncols);
    let t = k.op(OpKind::Select, &[valid, t, ninf]);
    let tmax = k.op(
        OpKind::Reduce {
            op: ReduceOp::Max,
            dim: 1,
        },
        &[t],
    );
    let m_new = k.bin(BinaryOp::Max, m, tmax);
    let m_col = k.reshape(m_new, &[SM_ROWS, 1]);
    let d = k.bin(BinaryOp::Sub, t, m_col);
    let d = k.bin(BinaryOp::Mul, d, log2e);
    let p = k.un(UnaryOp::Exp2, d);
    let psum = k.op(
        OpKind::Reduce {
            op: ReduceOp::Sum,
            dim: 1,
        },
        &[p],
    );
    let dm = k.bin(BinaryOp::Sub, m, m_new);
    let dm = k.bin(BinaryOp::Mul, dm, log2e);
    let alpha = k.un(UnaryOp::Exp2, dm);
    let l_scaled = k.bin(BinaryOp::Mul, l, alpha);
    let l_new = k.bin(BinaryOp::Add, l_scaled, psum);
    let res = k.0.end_for(&scope, &[m_new, l_new], Loc::caller()).unwrap();

    let m_col = k.reshape(res[0], &[SM_ROWS, 1]);
    let l_col = k.reshape(res[1], &[SM_ROWS, 1]);
    let scope =
        k.0.begin_for(zero, ncols, bc, &[], None, Loc::caller())
            .unwrap();
    let j = scope.iv;
    let t = k.load(0, &[row0, j], &tile);
    let t = k.cast(t, DType::F32);
    let d = k.bin(BinaryOp::Sub, t, m_col);
    let d = k.bin(BinaryOp::Mul, d, log2e);
    let p = k.un(UnaryOp::Exp2, d);
    let o = k.bin(BinaryOp::Div, p, l_col);
    let o = k.cast(o, dtype);
    k.store(1, &[row0, j], o);
    k.0.end_for(&scope, &[], Loc::caller()).unwrap();
    k.finish()
}

#[test]
fn softmax_matches_reference() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        let kernel = softmax(dtype);
        for (r, c) in [(1, 1), (5, 33), (17, 100), (64, 257)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[r, c], dtype, dist);
                // One case per shape reads x through padded rows (non-contiguous strides).
                let x = if dist == Dist::Normal {
                    with_row_padding(&x, 3)
                } else {
                    x
                };
                let mut y = poisoned(&[r, c], dtype);
                let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)];
                run(&kernel, [blocks(r, SM_ROWS), 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("softmax<{dtype}>"),
                    shape: format!("rows={r} cols={c}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &y, &reference::softmax_rows(&x), tolerance(dtype));
            }
        }
    }
}

const BM: usize = 32;
const BN: usize = 32;
const BK: usize = 16;

/// `c = a @ b` for bf16 `a: [M, K]` and `b: [K, N]` (or `bt: [N, K]`, transposed in the
/// kernel) into f32 `c: [M, N]`: one `BM x BN` tile per block, `mma` over `BK`-wide steps.
fn gemm(b_transposed: bool) -> Kernel {
    let mut k = K::new(
        "gemm",
        vec![
            Param::tensor("a", DType::Bf16, 2, false),
            Param::tensor("b", DType::Bf16, 2, false),
            Param::tensor("c", DType::F32, 2, true),
        ],
    );
    let bn = k.i32(BN as i64);
    let bm = k.i32(BM as i64);
    let n0 = k.block_id(kiln_ir::Axis::X);
    let n0 = k.bin(BinaryOp::Mul, n0, bn);
    let m0 = k.block_id(kiln_ir::Axis::Y);
    let m0 = k.bin(BinaryOp::Mul, m0, bm);
    let kdim = k.op(OpKind::TensorDim { tensor: 0, dim: 1 }, &[]);
    let zero = k.i32(0);
    let bk = k.i32(BK as i64);
    let fzero = k.f32(0.0);
    let acc0 = k.op(
        OpKind::Splat {
            shape: Shape(vec![BM, BN]),
        },
        &[fzero],
    );
    let scope =
        k.0.begin_for(zero, kdim, bk, &[acc0], Some(2), Loc::caller())
            .unwrap();
    let (kk, acc) = (scope.iv, scope.carried[0]);
    let ta = k.load(0, &[m0, kk], &[BM, BK]);
    let tb = if b_transposed {
        let t = k.load(1, &[n0, kk], &[BN, BK]);
        k.op(OpKind::Transpose, &[t])
    } else {
        k.load(1, &[kk, n0], &[BK, BN])
    };
    let acc_new = k.op(OpKind::Mma, &[ta, tb, acc]);
    let res = k.0.end_for(&scope, &[acc_new], Loc::caller()).unwrap();
    k.store(2, &[m0, n0], res[0]);
    k.finish()
}

fn transpose_host(t: &HostTensor) -> HostTensor {
    let (r, c) = (t.shape[0], t.shape[1]);
    let v = t.to_f64_vec();
    HostTensor::from_fn(&[c, r], t.dtype(), |i| v[(i % r) * c + i / r])
}

#[test]
fn gemm_mma_matches_reference() {
    let mut rng = Rng::from_env();
    for transposed in [false, true] {
        let kernel = gemm(transposed);
        for (m, n, kd) in [(130, 70, 50), (1, 1, 1), (64, 64, 64), (33, 17, 100)] {
            for dist in Dist::ALL {
                let a = tensor(&mut rng, &[m, kd], DType::Bf16, dist);
                let b = tensor(&mut rng, &[kd, n], DType::Bf16, dist);
                let b_arg = if transposed {
                    transpose_host(&b)
                } else {
                    b.clone()
                };
                let mut c = poisoned(&[m, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&b_arg),
                    HostArg::TensorMut(&mut c),
                ];
                run(&kernel, [blocks(n, BN), blocks(m, BM), 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("gemm(b transposed: {transposed})"),
                    shape: format!("m={m} n={n} k={kd}"),
                    dist,
                    seed: rng.seed(),
                };
                // Exact bf16 products and f32 accumulation: f32 tolerance applies.
                assert_close(&case, &c, &reference::gemm(&a, &b), tolerance(DType::F32));
            }
        }
    }
}

/// `out = flag != 0 ? x * alpha : x`, through a runtime `if` with a result.
fn scale_if() -> Kernel {
    let mut k = K::new(
        "scale_if",
        vec![
            Param::tensor("x", DType::F32, 1, false),
            Param::tensor("out", DType::F32, 1, true),
            Param::Scalar {
                name: "alpha".into(),
                dtype: DType::F32,
            },
            Param::Scalar {
                name: "flag".into(),
                dtype: DType::I32,
            },
        ],
    );
    let pid = k.block_id(kiln_ir::Axis::X);
    let bs = k.i32(VEC_BLOCK as i64);
    let off = k.bin(BinaryOp::Mul, pid, bs);
    let x = k.load(0, &[off], &[VEC_BLOCK]);
    let alpha = k.op(OpKind::ScalarParam(2), &[]);
    let flag = k.op(OpKind::ScalarParam(3), &[]);
    let zero = k.i32(0);
    let cond = k.bin(BinaryOp::Ne, flag, zero);
    let op = k.0.begin_if(cond, Loc::caller()).unwrap();
    let scaled = k.bin(BinaryOp::Mul, x, alpha);
    k.0.begin_else(op, &[scaled], Loc::caller()).unwrap();
    let out = k.0.end_if(op, &[x], Loc::caller()).unwrap();
    k.store(1, &[off], out[0]);
    k.finish()
}

#[test]
fn if_selects_branch_at_run_time() {
    let mut rng = Rng::from_env();
    let kernel = scale_if();
    for flag in [0, 1, -7] {
        for dist in Dist::ALL {
            let n = rng.range(1, 300);
            let alpha = rng.normal() as f32;
            let x = tensor(&mut rng, &[n], DType::F32, dist);
            let mut out = poisoned(&[n], DType::F32);
            let mut args = [
                HostArg::Tensor(&x),
                HostArg::TensorMut(&mut out),
                HostArg::F32(alpha),
                HostArg::I32(flag),
            ];
            run(&kernel, [blocks(n, VEC_BLOCK), 1, 1], &mut args).unwrap();
            let factor = if flag != 0 { f64::from(alpha) } else { 1.0 };
            let want: Vec<f64> = x.to_f64_vec().iter().map(|v| v * factor).collect();
            let case = Case {
                kernel: format!("scale_if(flag={flag})"),
                shape: format!("n={n}"),
                dist,
                seed: rng.seed(),
            };
            assert_close(&case, &out, &want, tolerance(DType::F32));
        }
    }
}

/// `q = x / y`, `r = x % y` on i32 vectors.
fn int_divide() -> Kernel {
    let mut k = K::new(
        "int_divide",
        vec![
            Param::tensor("x", DType::I32, 1, false),
            Param::tensor("y", DType::I32, 1, false),
            Param::tensor("q", DType::I32, 1, true),
            Param::tensor("r", DType::I32, 1, true),
        ],
    );
    let pid = k.block_id(kiln_ir::Axis::X);
    let bs = k.i32(VEC_BLOCK as i64);
    let off = k.bin(BinaryOp::Mul, pid, bs);
    let x = k.load(0, &[off], &[VEC_BLOCK]);
    let y = k.load(1, &[off], &[VEC_BLOCK]);
    let q = k.bin(BinaryOp::Div, x, y);
    let r = k.bin(BinaryOp::Rem, x, y);
    k.store(2, &[off], q);
    k.store(3, &[off], r);
    k.finish()
}

#[test]
fn integer_division_truncates_and_faults_on_zero() {
    let mut rng = Rng::from_env();
    let kernel = int_divide();
    // Loads past the end read 0, so the last partial tile divides by zero too; use a whole
    // number of tiles for the fault-free run.
    let n = VEC_BLOCK * rng.range(1, 5);
    let x = tensor(&mut rng, &[n], DType::I32, Dist::Large);
    let mut y = tensor(&mut rng, &[n], DType::I32, Dist::Normal);
    if let kiln_ir::TensorData::I32(v) = &mut y.data {
        for e in v.iter_mut().filter(|e| **e == 0) {
            *e = 3;
        }
    }
    let mut q = poisoned(&[n], DType::I32);
    let mut r = poisoned(&[n], DType::I32);
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&y),
        HostArg::TensorMut(&mut q),
        HostArg::TensorMut(&mut r),
    ];
    run(&kernel, [blocks(n, VEC_BLOCK), 1, 1], &mut args).unwrap();
    let (xv, yv) = (x.to_f64_vec(), y.to_f64_vec());
    let want_q: Vec<f64> = xv.iter().zip(&yv).map(|(a, b)| (a / b).trunc()).collect();
    let want_r: Vec<f64> = xv
        .iter()
        .zip(&yv)
        .map(|(a, b)| a - b * (a / b).trunc())
        .collect();
    let seed = rng.seed();
    assert_eq!(q.to_f64_vec(), want_q, "quotients, n={n}, KILN_SEED={seed}");
    assert_eq!(
        r.to_f64_vec(),
        want_r,
        "remainders, n={n}, KILN_SEED={seed}"
    );

    // A partial last tile reads y = 0 past the end and faults at the division.
    let m = n + 1;
    let x = tensor(&mut rng, &[m], DType::I32, Dist::Large);
    let y = HostTensor::full(&[m], DType::I32, 5.0);
    let (mut q, mut r) = (poisoned(&[m], DType::I32), poisoned(&[m], DType::I32));
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&y),
        HostArg::TensorMut(&mut q),
        HostArg::TensorMut(&mut r),
    ];
    let err = run(&kernel, [blocks(m, VEC_BLOCK), 1, 1], &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::DivisionByZero { op, .. } if op.contains('/')),
        "{err}"
    );
    assert!(err.to_string().contains("interp_builder.rs"), "{err}");
}

#[test]
fn loads_and_stores_outside_the_tensor_are_masked() {
    // A tile at a negative or far-away offset: loads read 0, stores are skipped.
    let mut k = K::new(
        "shift",
        vec![
            Param::tensor("x", DType::F32, 2, false),
            Param::tensor("y", DType::F32, 2, true),
            Param::Scalar {
                name: "dr".into(),
                dtype: DType::I32,
            },
            Param::Scalar {
                name: "dc".into(),
                dtype: DType::I32,
            },
        ],
    );
    let dr = k.op(OpKind::ScalarParam(2), &[]);
    let dc = k.op(OpKind::ScalarParam(3), &[]);
    let zero = k.i32(0);
    let t = k.load(0, &[dr, dc], &[8, 8]);
    k.store(1, &[zero, zero], t);
    let kernel = k.finish();
    let mut rng = Rng::from_env();
    let (r, c) = (rng.range(1, 12), rng.range(1, 12));
    let x = tensor(&mut rng, &[r, c], DType::F32, Dist::Normal);
    for (dr, dc) in [(-3, 2), (0, 0), (5, -9), (i32::MIN, i32::MAX), (-100, 4)] {
        let mut y = poisoned(&[r, c], DType::F32);
        let mut args = [
            HostArg::Tensor(&x),
            HostArg::TensorMut(&mut y),
            HostArg::I32(dr),
            HostArg::I32(dc),
        ];
        run(&kernel, [1, 1, 1], &mut args).unwrap();
        let xv = x.to_f64_vec();
        for i in 0..r {
            for j in 0..c {
                let got = y.data.get_f64(i * c + j);
                let want = if i < 8 && j < 8 {
                    let (si, sj) = (i as i64 + dr as i64, j as i64 + dc as i64);
                    if (0..r as i64).contains(&si) && (0..c as i64).contains(&sj) {
                        xv[si as usize * c + sj as usize]
                    } else {
                        0.0
                    }
                } else {
                    f64::NAN
                };
                assert!(
                    got == want || (got.is_nan() && want.is_nan()),
                    "shift ({dr},{dc}) [{r}x{c}] at ({i},{j}): got {got}, want {want}, KILN_SEED={}",
                    rng.seed()
                );
            }
        }
    }
}

#[test]
fn argument_errors_name_the_parameter() {
    let kernel = vector_add(DType::F32);
    let x = HostTensor::full(&[10], DType::F32, 1.0);
    let bf = HostTensor::full(&[10], DType::Bf16, 1.0);
    let two_d = HostTensor::full(&[2, 5], DType::F32, 1.0);
    let mut out = HostTensor::full(&[10], DType::F32, 0.0);
    let grid = [1, 1, 1];

    let err = run(&kernel, grid, &mut [HostArg::Tensor(&x)]).unwrap_err();
    assert!(
        matches!(
            err,
            InterpError::ArgCount {
                expected: 3,
                found: 1
            }
        ),
        "{err}"
    );

    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&bf),
        HostArg::TensorMut(&mut out),
    ];
    let err = run(&kernel, grid, &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Arg { param, problem: ArgProblem::DType { expected: DType::F32, found: DType::Bf16 } } if param == "y"),
        "{err}"
    );

    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&two_d),
        HostArg::TensorMut(&mut out),
    ];
    let err = run(&kernel, grid, &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Arg { param, problem: ArgProblem::Rank { expected: 1, .. } } if param == "y"),
        "{err}"
    );

    let out_ro = out.clone();
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&x),
        HostArg::Tensor(&out_ro),
    ];
    let err = run(&kernel, grid, &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Arg { param, problem: ArgProblem::NotMutable } if param == "out"),
        "{err}"
    );

    let mut args = [
        HostArg::F32(1.0),
        HostArg::Tensor(&x),
        HostArg::TensorMut(&mut out),
    ];
    let err = run(&kernel, grid, &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Arg { param, problem: ArgProblem::Kind { .. } } if param == "x"),
        "{err}"
    );

    let mut strided = x.clone();
    strided.strides = vec![2];
    let mut args = [
        HostArg::Tensor(&strided),
        HostArg::Tensor(&x),
        HostArg::TensorMut(&mut out),
    ];
    let err = run(&kernel, grid, &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Arg { param, problem: ArgProblem::InnerStride { stride: 2 } } if param == "x"),
        "{err}"
    );

    let mut short = x.clone();
    short.shape = vec![11];
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&short),
        HostArg::TensorMut(&mut out),
    ];
    let err = run(&kernel, grid, &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Arg { param, problem: ArgProblem::DataTooShort { needed: Some(11), len: 10 } } if param == "y"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "argument `y`: shape and strides address 11 elements but the data holds 10"
    );
}

#[test]
fn non_positive_loop_step_is_a_runtime_error() {
    let mut k = K::new(
        "spin",
        vec![Param::Scalar {
            name: "step".into(),
            dtype: DType::I32,
        }],
    );
    let step = k.op(OpKind::ScalarParam(0), &[]);
    let (lo, hi) = (k.i32(0), k.i32(10));
    let scope =
        k.0.begin_for(lo, hi, step, &[], None, Loc::caller())
            .unwrap();
    k.0.end_for(&scope, &[], Loc::caller()).unwrap();
    let kernel = k.finish();
    for bad in [0, -1] {
        let err = run(&kernel, [1, 1, 1], &mut [HostArg::I32(bad)]).unwrap_err();
        assert!(
            matches!(err, InterpError::NonPositiveStep { step, .. } if step == bad),
            "{err}"
        );
    }
    run(&kernel, [2, 3, 4], &mut [HostArg::I32(3)]).unwrap();
}

#[test]
fn an_ill_formed_kernel_is_rejected_before_it_runs() {
    let mut kernel = vector_add(DType::F32);
    // Move the final store to the front, before the values it reads are defined.
    let store = kernel.body.ops.pop().unwrap();
    kernel.body.ops.insert(0, store);
    let x = HostTensor::full(&[4], DType::F32, 1.0);
    let mut out = poisoned(&[4], DType::F32);
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&x),
        HostArg::TensorMut(&mut out),
    ];
    let err = run(&kernel, [1, 1, 1], &mut args).unwrap_err();
    let InterpError::Verify(errors) = &err else {
        panic!("expected a verifier error, got {err}");
    };
    assert!(errors.errors.iter().all(|e| e.op == store), "{err}");
    assert!(
        err.to_string().contains("does not dominate this use"),
        "{err}"
    );
    assert!(
        out.to_f64_vec().iter().all(|v| v.is_nan()),
        "nothing may run"
    );
}
