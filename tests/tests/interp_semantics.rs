//! Element semantics of the interpreter that the numerical tests cannot see: bf16 results
//! rounded after every op, NaN-ignoring float max, round-to-nearest-even casts, and
//! reductions along both dimensions. Expected values are computed independently in f64 and
//! rounded with `half`.

use half::bf16;
use kiln_ir::interp::{HostArg, run};
use kiln_ir::{
    BinaryOp, Builder, DType, HostTensor, Kernel, KernelOptions, Loc, OpKind, Param, ReduceOp,
    Shape, TensorData, ValueId,
};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};

const N: usize = 64;

/// A kernel over 1-D tensors `x`, `y` (dtype `inp`) and `out` (dtype `outp`) of one `N`-tile
/// whose body `f` maps the two loaded tiles to the stored one.
fn elementwise(
    inp: DType,
    outp: DType,
    f: impl FnOnce(&mut Builder, ValueId, ValueId) -> ValueId,
) -> Kernel {
    let loc = Loc::caller();
    let mut b = Builder::new(
        "elementwise",
        vec![
            Param::tensor("x", inp, 1, false),
            Param::tensor("y", inp, 1, false),
            Param::tensor("out", outp, 1, true),
        ],
        KernelOptions::default(),
    );
    let zero = b.constant(kiln_ir::Const::Int(0), DType::I32, loc).unwrap();
    let shape = Shape(vec![N]);
    let x = b
        .op1(
            OpKind::Load {
                tensor: 0,
                shape: shape.clone(),
            },
            &[zero],
            loc,
        )
        .unwrap();
    let y = b
        .op1(OpKind::Load { tensor: 1, shape }, &[zero], loc)
        .unwrap();
    let z = f(&mut b, x, y);
    b.op(
        OpKind::Store {
            tensor: 2,
            bound: None,
        },
        &[zero, z],
        loc,
    )
    .unwrap();
    b.finish().unwrap()
}

fn bin(b: &mut Builder, op: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    b.op1(OpKind::Binary(op), &[x, y], Loc::caller()).unwrap()
}

fn run3(k: &Kernel, x: &HostTensor, y: &HostTensor, out: &mut HostTensor) {
    let mut args = [
        HostArg::Tensor(x),
        HostArg::Tensor(y),
        HostArg::TensorMut(out),
    ];
    run(k, [1, 1, 1], &mut args).unwrap();
}

fn rbf(x: f64) -> f64 {
    kiln::ir::rounding::to_bf16(x).to_f64()
}

#[test]
fn bf16_rounds_after_every_op() {
    // (x + y) - x: with |x| >> |y| the sum rounds in bf16 and the difference shows it.
    let k = elementwise(DType::Bf16, DType::Bf16, |b, x, y| {
        let s = bin(b, BinaryOp::Add, x, y);
        bin(b, BinaryOp::Sub, s, x)
    });
    let mut rng = Rng::from_env();
    let x = tensor(&mut rng, &[N], DType::Bf16, Dist::Large);
    let y = tensor(&mut rng, &[N], DType::Bf16, Dist::Uniform);
    let mut out = poisoned(&[N], DType::Bf16);
    run3(&k, &x, &y, &mut out);
    let (xv, yv, got) = (x.to_f64_vec(), y.to_f64_vec(), out.to_f64_vec());
    let mut rounded = 0;
    for i in 0..N {
        // x + y is exact in f64; each op's result is rounded to bf16.
        let want = rbf(rbf(xv[i] + yv[i]) - xv[i]);
        rounded += usize::from(want != yv[i]);
        assert_eq!(
            got[i].to_bits(),
            want.to_bits(),
            "element {i}: x={} y={}, KILN_SEED={}",
            xv[i],
            yv[i],
            rng.seed()
        );
    }
    // With |x| ~ 10 and |y| < 1, most sums lose bits of y; otherwise the test proves nothing.
    assert!(
        rounded > N / 4,
        "only {rounded} elements rounded, KILN_SEED={}",
        rng.seed()
    );
}

#[test]
fn float_max_ignores_nan_and_casts_round_to_nearest_even() {
    let k = elementwise(DType::F32, DType::Bf16, |b, x, y| {
        let m = bin(b, BinaryOp::Max, x, y);
        b.op1(OpKind::Cast { to: DType::Bf16 }, &[m], Loc::caller())
            .unwrap()
    });
    let mut rng = Rng::from_env();
    let mut x = tensor(&mut rng, &[N], DType::F32, Dist::Normal);
    let mut y = tensor(&mut rng, &[N], DType::F32, Dist::Normal);
    // Halfway cases between adjacent bf16 values (ties go to the even mantissa) and NaNs.
    if let (TensorData::F32(xv), TensorData::F32(yv)) = (&mut x.data, &mut y.data) {
        for i in 0..8 {
            let base = bf16::from_f64(rng.normal()).to_f32();
            let ulp = f32::from_bits(base.to_bits() & 0xff80_0000) / 128.0;
            xv[i] = base + ulp.abs() / 2.0;
            yv[i] = f32::NEG_INFINITY;
        }
        xv[8..16].fill(f32::NAN);
        yv[16] = f32::NAN;
    }
    let mut out = poisoned(&[N], DType::Bf16);
    run3(&k, &x, &y, &mut out);
    let (xv, yv) = (x.to_f64_vec(), y.to_f64_vec());
    for (i, got) in out.to_f64_vec().into_iter().enumerate() {
        let m = if xv[i].is_nan() {
            yv[i]
        } else if yv[i].is_nan() {
            xv[i]
        } else {
            xv[i].max(yv[i])
        };
        // Round to nearest even by hand: pick the nearer bf16 neighbour, the even one on a tie.
        let lo = bf16::from_bits(bf16::from_f64(m).to_bits()).to_f64();
        let (below, above) = if lo <= m {
            (lo, next_bf16(lo))
        } else {
            (prev_bf16(lo), lo)
        };
        let want = match (m - below).partial_cmp(&(above - m)) {
            Some(std::cmp::Ordering::Less) => below,
            Some(std::cmp::Ordering::Greater) => above,
            _ if bf16::from_f64(below).to_bits().is_multiple_of(2) => below,
            _ => above,
        };
        assert_eq!(
            got,
            want,
            "element {i}: max({}, {}), KILN_SEED={}",
            xv[i],
            yv[i],
            rng.seed()
        );
    }
}

fn next_bf16(x: f64) -> f64 {
    let b = bf16::from_f64(x).to_bits();
    let n = if x >= 0.0 { b + 1 } else { b - 1 };
    bf16::from_bits(n).to_f64()
}

fn prev_bf16(x: f64) -> f64 {
    let b = bf16::from_f64(x).to_bits();
    let n = if x > 0.0 { b - 1 } else { b + 1 };
    bf16::from_bits(n).to_f64()
}

/// Sums of `x: [R, C]` along `dim` (0: per column, 1: per row), one `32x32` tile.
fn reduce_kernel(op: ReduceOp, dim: usize) -> Kernel {
    let loc = Loc::caller();
    let mut b = Builder::new(
        "reduce",
        vec![
            Param::tensor("x", DType::F32, 2, false),
            Param::tensor("out", DType::F32, 1, true),
        ],
        KernelOptions::default(),
    );
    let zero = b.constant(kiln_ir::Const::Int(0), DType::I32, loc).unwrap();
    let t = b
        .op1(
            OpKind::Load {
                tensor: 0,
                shape: Shape(vec![32, 32]),
            },
            &[zero, zero],
            loc,
        )
        .unwrap();
    let r = b.op1(OpKind::Reduce { op, dim }, &[t], loc).unwrap();
    b.op(
        OpKind::Store {
            tensor: 1,
            bound: None,
        },
        &[zero, r],
        loc,
    )
    .unwrap();
    b.finish().unwrap()
}

#[test]
fn reductions_along_both_dimensions() {
    let mut rng = Rng::from_env();
    for dim in [0, 1] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let k = reduce_kernel(op, dim);
            for dist in Dist::ALL {
                // The tile covers 32x32; the tensor's own extent decides what is read.
                let x = tensor(&mut rng, &[32, 32], DType::F32, dist);
                let mut out = poisoned(&[32], DType::F32);
                let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut out)];
                run(&k, [1, 1, 1], &mut args).unwrap();
                let v = x.to_f64_vec();
                let want: Vec<f64> = (0..32)
                    .map(|o| {
                        let items = (0..32).map(|i| {
                            if dim == 1 {
                                v[o * 32 + i]
                            } else {
                                v[i * 32 + o]
                            }
                        });
                        match op {
                            ReduceOp::Sum => items.sum(),
                            ReduceOp::Max => items.fold(f64::NEG_INFINITY, f64::max),
                            ReduceOp::Min => items.fold(f64::INFINITY, f64::min),
                        }
                    })
                    .collect();
                let case = Case {
                    kernel: format!("reduce.{} dim {dim}", op.name()),
                    shape: "32x32".into(),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &out, &want, tolerance(DType::F32));
            }
        }
    }
}
