//! The DSL frontend end to end: what `#[kernel]` bodies trace to, the source locations the
//! ops record, and the diagnostics `build` returns for shape, dtype and spec errors.

use kiln::ir::dsl::{Comptime, ComptimeValue, KernelDecl, KernelDef, Spec};
use kiln::ir::print::print_kernel;
use kiln::ir::{Block, Diagnostic, Kernel, Loc, OpKind};
use kiln::prelude::*;

/// The 1-based line of this file holding `marker` (a comment placed at the checked line),
/// and the 1-based column where `code` starts on it.
fn position(marker: &str, code: &str) -> (u32, u32) {
    let src = include_str!("frontend.rs");
    let (i, line) = src
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(marker) && !l.contains("position("))
        .unwrap_or_else(|| panic!("marker {marker} not found"));
    let col = line
        .find(code)
        .unwrap_or_else(|| panic!("{code} not on line {}", i + 1));
    (i as u32 + 1, col as u32 + 1)
}

fn build_err<K: KernelDef + ?Sized>(def: &K, spec: &Spec<K::Comptime>) -> Diagnostic {
    match def.build(spec) {
        Ok(k) => panic!("expected a diagnostic, built:\n{}", print_kernel(&k)),
        Err(d) => d,
    }
}

fn all_ops(k: &Kernel, b: &Block, out: &mut Vec<(OpKind, Loc)>) {
    for &op in &b.ops {
        out.push((k.ops[op].kind.clone(), k.ops[op].loc));
        for r in &k.ops[op].regions {
            all_ops(k, r, out);
        }
    }
}

#[kernel]
fn mma_shape_mismatch(a: Tensor<bf16, 2>, c: TensorMut<f32, 2>) {
    let x = a.tile([64, 32], [0, 0]).load();
    let y = mma(&x, &x); // MARK-mma
    c.tile([64, 32], [0, 0]).store(y);
}

#[test]
fn mma_shape_mismatch_points_at_the_users_call() {
    let d = build_err(&mma_shape_mismatch, &Spec::new(()));
    let (line, col) = position("MARK-mma", "mma(");
    assert_eq!(
        (d.loc.file, d.loc.line, d.loc.column),
        (file!(), line, col),
        "{d}"
    );
    assert!(d.message.contains("64x32"), "{d}");
}

#[kernel]
fn dtype_mismatch(a: Tensor<bf16, 1>, b: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let x = a.tile([128], [0]).load();
    let y = b.tile([128], [0]).load();
    let z = x + y; // MARK-add
    c.tile([128], [0]).store(z);
}

#[test]
fn dtype_mismatch_points_at_the_users_operator() {
    let d = build_err(&dtype_mismatch, &Spec::new(()));
    let (line, col) = position("MARK-add", "x + y");
    assert_eq!((d.loc.line, d.loc.column), (line, col), "{d}");
    assert!(
        d.message.contains("bf16") && d.message.contains("f32"),
        "{d}"
    );
}

#[kernel]
fn runtime_shape(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let n = a.dim(0);
    let x = a.tile([n], [0]).load(); // MARK-shape
    c.tile([128], [0]).store(x);
}

#[test]
fn runtime_tile_shape_is_a_diagnostic() {
    let d = build_err(&runtime_shape, &Spec::new(()));
    assert_eq!(d.loc.line, position("MARK-shape", "").0, "{d}");
    assert!(
        d.notes.iter().any(|n| n.contains("known at compile time")),
        "{d}"
    );
}

#[kernel]
fn float_into_int(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let i = block_id().x * 1.5; // MARK-float
    c.tile([128], [i]).store(a.tile([128], [0]).load());
}

#[test]
fn float_constant_with_integer_value_is_a_diagnostic() {
    let d = build_err(&float_into_int, &Spec::new(()));
    assert_eq!(d.loc.line, position("MARK-float", "").0, "{d}");
    assert!(d.message.contains("float constant"), "{d}");
}

#[kernel]
fn bounded_on_an_outer_dimension(x: Tensor<f32, 2>, o: TensorMut<f32, 2>, n: i32) {
    let t = x.tile([8], [0, 0]).load();
    o.tile([8], [0, 0]).store_bounded(t, 0, n); // MARK-outer-bound
}

#[kernel]
fn bounded_by_a_float(x: Tensor<f32, 2>, o: TensorMut<f32, 2>, n: f32) {
    let t = x.tile([8, 8], [0, 0]).load();
    o.tile([8, 8], [0, 0]).store_bounded(t, 0, n); // MARK-float-limit
}

#[kernel]
fn scalar_of_two_coordinates(cu: Tensor<i32, 1>, o: TensorMut<i32, 1>) {
    let x = cu.scalar([0, 1]); // MARK-scalar-coords
    o.tile([1], [0]).store(full::<i32>([1], x));
}

#[test]
fn bounded_stores_and_scalar_loads_report_misuse_at_the_call() {
    // A bound must clip one of the tile's dimensions, by an i32 limit; a scalar takes one
    // coordinate per tensor dimension.
    let cases: [(&dyn KernelDef<Comptime = ()>, &str, &str, &str); 3] = [
        (
            &bounded_on_an_outer_dimension,
            "MARK-outer-bound",
            "store_bounded",
            "must be one of the 1-D tile's dimensions",
        ),
        (
            &bounded_by_a_float,
            "MARK-float-limit",
            "store_bounded",
            "limit is an f32 scalar, expected an i32 scalar",
        ),
        (
            &scalar_of_two_coordinates,
            "MARK-scalar-coords",
            "scalar",
            "a rank-1 tensor needs 1 coordinates, found 2",
        ),
    ];
    for (def, marker, call, message) in cases {
        let d = build_err(def, &Spec::new(()));
        let (line, col) = position(marker, call);
        assert_eq!((d.loc.line, d.loc.column), (line, col), "{d}");
        assert!(d.message.contains(message), "{d}");
    }
}

/// Branches and loops on runtime values, with carried variables, a comptime `if` and an
/// unrolled loop.
#[kernel]
fn control(a: Tensor<f32, 1>, c: TensorMut<f32, 1>, #[comptime(default = 3)] reps: usize) {
    let n = a.dim(0);
    let mut x = a.tile([128], [0]).load();
    let mut y = zeros::<f32>([128]);
    for i in 0..n {
        if i < 2 && n > 5 {
            x = x * 2.0;
        } else {
            y = y + x;
        }
    }
    for _ in unroll(0..reps) {
        x = x + 1.0;
    }
    let z = if reps > 2 { x } else { y };
    c.tile([128], [0]).store(z + y);
}

#[test]
fn runtime_if_and_for_carry_assigned_variables() {
    let spec = Spec::new(ControlComptime { reps: 3 });
    let k = control.build(&spec).unwrap_or_else(|d| panic!("{d}"));
    println!("{}", print_kernel(&k));
    let mut ops = Vec::new();
    all_ops(&k, &k.body, &mut ops);
    let (line, col) = position("for i in 0..n {", "for i");
    let for_op = ops
        .iter()
        .find(|(kind, _)| matches!(kind, OpKind::For { stages: None }))
        .expect("a runtime for");
    assert_eq!((for_op.1.line, for_op.1.column), (line, col));
    let for_id = k
        .body
        .ops
        .iter()
        .find(|&&o| matches!(k.ops[o].kind, OpKind::For { .. }));
    let for_id = *for_id.expect("for at top level");
    assert_eq!(k.ops[for_id].results.len(), 2, "x and y are carried");
    assert_eq!(
        ops.iter().filter(|(kind, _)| *kind == OpKind::If).count(),
        1,
        "one runtime if"
    );
    // The unrolled loop adds 1.0 three times at top level.
    let adds_after_loop = k
        .body
        .ops
        .iter()
        .skip_while(|&&o| o != for_id)
        .filter(|&&o| matches!(k.ops[o].kind, OpKind::Binary(kiln::ir::BinaryOp::Add)))
        .count();
    assert_eq!(adds_after_loop, 3 + 1);
    // Every op was recorded in this file.
    assert!(ops.iter().all(|(_, loc)| loc.file == file!()), "{ops:?}");
}

#[test]
fn ill_typed_comptime_text_names_the_parameter() {
    // A typed value cannot be missing or of another type; `-D` text can, and is refused
    // before anything is built, naming the parameter and its type.
    assert_eq!(ControlComptime::default(), ControlComptime { reps: 3 });
    let err =
        ControlComptime::from_defines(&[("reps".into(), "true".into())]).expect_err("not a usize");
    assert_eq!(
        err.to_string(),
        "comptime parameter `reps` is a usize, and `true` is not one"
    );
}

#[test]
fn signature_and_options_come_from_the_declaration() {
    use kiln::ir::dsl::{ComptimeKind, ParamSig};
    let p = control.comptime_params();
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].name, p[0].kind), ("reps", ComptimeKind::Usize));
    assert_eq!(p[0].default, Some(ComptimeValue::Usize(3)));
    assert!(matches!(
        control.signature(),
        [
            ParamSig::Tensor {
                name: "a",
                rank: 1,
                mutable: false,
                ..
            },
            ParamSig::Tensor {
                name: "c",
                rank: 1,
                mutable: true,
                ..
            }
        ]
    ));
}

/// A `#[kernel_fn]` helper with a runtime `if` used as an expression.
#[kernel_fn]
fn clamp_low(x: Value, limit: Value) -> Value {
    if limit > 0 { max(x, 0.0) } else { x }
}

#[kernel]
fn helper_and_if_expression(a: Tensor<f32, 1>, c: TensorMut<f32, 1>, flag: i32) {
    let x = a.tile([128], [0]).load();
    let y = clamp_low(x, flag);
    c.tile([128], [0]).store(y);
}

#[test]
fn runtime_if_expression_yields_its_value() {
    let k = helper_and_if_expression
        .build(&Spec::new(()))
        .unwrap_or_else(|d| panic!("{d}"));
    println!("{}", print_kernel(&k));
    let if_op = k
        .body
        .ops
        .iter()
        .find(|&&o| k.ops[o].kind == OpKind::If)
        .expect("the helper's if is inlined at top level");
    let results = &k.ops[*if_op].results;
    assert_eq!(results.len(), 1);
    assert_eq!(k.ty(results[0]).to_string(), "rt<f32,128>");
    let store = k.body.ops.last().expect("a store");
    assert_eq!(k.ops[*store].operands.last(), Some(&results[0]));
}

#[kernel]
fn two_errors(a: Tensor<bf16, 2>, c: TensorMut<f32, 2>) {
    let x = a.tile([64, 32], [0, 0]).load();
    let y = x.t().col(); // MARK-first
    let z = mma(&x, &x);
    c.tile([64, 32], [0, 0]).store(y + z);
}

#[test]
fn the_first_diagnostic_is_reported_and_later_ops_are_skipped() {
    let d = build_err(&two_errors, &Spec::new(()));
    assert_eq!(d.loc.line, position("MARK-first", "").0, "{d}");
    assert!(d.message.contains("`.col()` needs a 1-D tile"), "{d}");
}

#[test]
fn dsl_calls_outside_a_trace_give_poison_without_panicking() {
    let v = zeros::<f32>([4]);
    assert!(v.is_poison());
    assert!((v + 1.0).is_poison());
    assert!(block_id().x.is_poison());
}
