//! `interp::run_def` on a hand-written `KernelDef` whose comptime struct is declared under
//! `#[comptime]`: comptime values reach `build`, the Spec marks tensors 16-byte aligned from
//! their strides, and build errors come back as `InterpError::Build`.

use std::sync::Mutex;

use kiln::prelude::comptime;
use kiln_ir::dsl::{ComptimeParam, KernelDecl, KernelDef, ParamSig, Spec};
use kiln_ir::interp::{HostArg, InterpError, run_def};
use kiln_ir::{
    BinaryOp, Builder, Const, DType, Diagnostic, Kernel, KernelOptions, Loc, OpKind, Shape,
};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor, with_row_padding};

/// `y[r, :] = x[r, :] * 2` for a `[R, C]` tensor, one row of `block` columns per block along
/// x and one row per block along y; `block` is a comptime parameter. Remembers the last Spec.
struct Double {
    last_spec: Mutex<Option<Spec<Block>>>,
}

/// [`Double`]'s comptime values.
#[comptime]
struct Block {
    /// Columns per block (no default).
    block: usize,
}

const SIG: &[ParamSig] = &[
    ParamSig::Tensor {
        name: "x",
        dtype: DType::F32,
        dtype_param: None,
        rank: 2,
        mutable: false,
    },
    ParamSig::Tensor {
        name: "y",
        dtype: DType::F32,
        dtype_param: None,
        rank: 2,
        mutable: true,
    },
];

impl KernelDecl for Double {
    fn name(&self) -> &'static str {
        "double"
    }
    fn comptime_params(&self) -> &'static [ComptimeParam] {
        <Block as kiln_ir::dsl::Comptime>::PARAMS
    }
    fn signature(&self) -> &'static [ParamSig] {
        SIG
    }
}

impl KernelDef for Double {
    type Comptime = Block;

    fn build(&self, spec: &Spec<Block>) -> Result<Kernel, Diagnostic> {
        if let Ok(mut last) = self.last_spec.lock() {
            *last = Some(spec.clone());
        }
        let loc = Loc::caller();
        let block = spec.comptime.block;
        let params = kiln_ir::dsl::params_for(SIG, spec);
        let mut b = Builder::new("double", params, KernelOptions::default());
        let bx = b.op1(OpKind::BlockId(kiln_ir::Axis::X), &[], loc)?;
        let row = b.op1(OpKind::BlockId(kiln_ir::Axis::Y), &[], loc)?;
        let bs = b.constant(Const::Int(block as i64), DType::I32, loc)?;
        let col = b.op1(OpKind::Binary(BinaryOp::Mul), &[bx, bs], loc)?;
        let shape = Shape(vec![block]);
        let t = b.op1(OpKind::Load { tensor: 0, shape }, &[row, col], loc)?;
        let two = b.constant(Const::Float(2.0), DType::F32, loc)?;
        let t2 = b.op1(OpKind::Binary(BinaryOp::Mul), &[t, two], loc)?;
        b.op(
            OpKind::Store {
                tensor: 1,
                bound: None,
            },
            &[row, col, t2],
            loc,
        )?;
        b.finish()
    }
}

#[test]
fn run_def_builds_with_comptime_and_alignment() {
    let def = Double {
        last_spec: Mutex::new(None),
    };
    let mut rng = Rng::from_env();
    let comptime = Block { block: 16 };
    // 8 f32 columns are 32 bytes per row (aligned); 8 + 1 padding are 36 (not aligned).
    for (rows, cols, pad, aligned) in [(3, 8, 0, true), (5, 8, 1, false), (2, 37, 3, true)] {
        let x = tensor(&mut rng, &[rows, cols], DType::F32, Dist::Normal);
        let x = with_row_padding(&x, pad);
        let mut y = poisoned(&[rows, cols], DType::F32);
        let grid = [cols.div_ceil(16) as u32, rows as u32, 1];
        let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)];
        run_def(&def, &comptime, grid, &mut args).unwrap();
        let want: Vec<f64> = x.to_f64_vec().iter().map(|v| v * 2.0).collect();
        let case = Case {
            kernel: "double".into(),
            shape: format!("{rows}x{cols} pad {pad}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &y, &want, tolerance(DType::F32));
        let spec = def.last_spec.lock().unwrap().clone().unwrap();
        assert_eq!(spec.comptime, comptime);
        assert_eq!(spec.aligned16.get("x"), Some(&aligned), "{case}");
        assert_eq!(
            spec.aligned16.get("y"),
            Some(&(cols * 4 % 16 == 0)),
            "{case}"
        );
    }
}

#[test]
fn run_def_reports_build_errors() {
    let def = Double {
        last_spec: Mutex::new(None),
    };
    let x = tensor(&mut Rng::from_env(), &[2, 2], DType::F32, Dist::Uniform);
    let mut y = poisoned(&[2, 2], DType::F32);
    let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)];
    // A tile extent that is neither a power of two nor a multiple of 32 is a shape error at
    // build time. (A missing comptime value cannot reach `build`: the struct has every field.)
    let bad = Block { block: 12 };
    let err = run_def(&def, &bad, [1, 1, 1], &mut args).unwrap_err();
    assert!(
        matches!(&err, InterpError::Build(d) if d.message.contains("power of two")),
        "{err}"
    );
}
