//! Unit tests of the verifier: kernels built with `Builder` pass; hand-broken copies fail
//! with the expected message, printed under the offending line.

use super::{VerifyErrors, verify};
use crate::builder::Builder;
use crate::kernel::{
    BinaryOp, Const, Kernel, KernelOptions, Loc, Op, OpId, OpKind, Param, ValueId,
};
use crate::types::{DType, Shape, Type};

/// A kernel with a loop carrying a tile and an `if` inside the loop:
/// `acc = splat(0); for i in 0..n { acc = if i < 2 { acc + x } else { acc } }; store`.
struct Sample {
    kernel: Kernel,
    /// The `for` op.
    for_op: OpId,
    /// The `if` op (inside the loop body).
    if_op: OpId,
    /// The `add` inside the then-branch.
    add: ValueId,
    /// The loop's induction variable.
    iv: ValueId,
}

fn sample() -> Sample {
    let loc = Loc::default();
    let params = vec![
        Param::Tensor {
            name: "x".into(),
            dtype: DType::F32,
            rank: 1,
            mutable: false,
            aligned16: false,
        },
        Param::Tensor {
            name: "y".into(),
            dtype: DType::F32,
            rank: 1,
            mutable: true,
            aligned16: false,
        },
    ];
    let mut b = Builder::new("sample", params, KernelOptions::default());
    let zero = b.constant(Const::Int(0), DType::I32, loc).unwrap();
    let one = b.constant(Const::Int(1), DType::I32, loc).unwrap();
    let two = b.constant(Const::Int(2), DType::I32, loc).unwrap();
    let n = b
        .op1(OpKind::TensorDim { tensor: 0, dim: 0 }, &[], loc)
        .unwrap();
    let fz = b.constant(Const::Float(0.0), DType::F32, loc).unwrap();
    let shape = Shape(vec![16]);
    let acc0 = b
        .op1(
            OpKind::Splat {
                shape: shape.clone(),
            },
            &[fz],
            loc,
        )
        .unwrap();
    let x = b
        .op1(OpKind::Load { tensor: 0, shape }, &[zero], loc)
        .unwrap();
    let scope = b.begin_for(zero, n, one, &[acc0], None, loc).unwrap();
    let acc = scope.carried[0];
    let cond = b
        .op1(OpKind::Binary(BinaryOp::Lt), &[scope.iv, two], loc)
        .unwrap();
    let if_op = b.begin_if(cond, loc).unwrap();
    let add = b
        .op1(OpKind::Binary(BinaryOp::Add), &[acc, x], loc)
        .unwrap();
    b.begin_else(if_op, &[add], loc).unwrap();
    let r = b.end_if(if_op, &[acc], loc).unwrap();
    let out = b.end_for(&scope, &r, loc).unwrap();
    b.op(
        OpKind::Store {
            tensor: 1,
            bound: None,
        },
        &[zero, out[0]],
        loc,
    )
    .unwrap();
    Sample {
        kernel: b.finish().unwrap(),
        for_op: scope.op,
        if_op,
        add,
        iv: scope.iv,
    }
}

fn errors(k: &Kernel) -> VerifyErrors {
    match verify(k) {
        Ok(()) => panic!(
            "expected verifier errors for\n{}",
            crate::print::print_kernel(k)
        ),
        Err(e) => e,
    }
}

fn assert_has(e: &VerifyErrors, op: OpId, needle: &str) {
    assert!(
        e.errors
            .iter()
            .any(|x| x.op == op && x.message.contains(needle)),
        "no error at {op} containing {needle:?}:\n{e}"
    );
}

/// The op in the top-level body at `index`.
fn top(k: &Kernel, index: usize) -> OpId {
    k.body.ops[index]
}

#[test]
fn builder_kernels_pass() {
    verify(&sample().kernel).unwrap();
}

#[test]
fn use_before_def_is_reported() {
    let mut k = sample().kernel;
    // Move the `splat` (index 5) after the `for` that uses it (index 7).
    let splat = k.body.ops.remove(5);
    k.body.ops.insert(7, splat);
    let e = errors(&k);
    let for_op = top(&k, 6);
    assert_has(&e, for_op, "which does not dominate this use");
}

#[test]
fn value_from_inside_a_region_is_not_visible_after_it() {
    let s = sample();
    let mut k = s.kernel;
    // Make the final store read the `add` from inside the `if` instead of the loop result.
    let store = *k.body.ops.last().unwrap();
    k.ops[store].operands[1] = s.add;
    let e = errors(&k);
    assert_has(&e, store, "does not dominate");
}

#[test]
fn block_argument_outside_its_region_is_reported() {
    let s = sample();
    let mut k = s.kernel;
    let store = *k.body.ops.last().unwrap();
    k.ops[store].operands[0] = s.iv;
    let e = errors(&k);
    assert_has(&e, store, "that does not enclose it");
}

#[test]
fn wrong_yield_count_is_reported() {
    let s = sample();
    let mut k = s.kernel;
    let then_yield = *k.ops[s.if_op].regions[0].ops.last().unwrap();
    k.ops[then_yield].operands.push(s.iv);
    let e = errors(&k);
    assert_has(&e, then_yield, "yields (a 16 f32 tile, an i32 scalar), but");
}

#[test]
fn wrong_result_type_is_reported() {
    let s = sample();
    let mut k = s.kernel;
    k.values[s.add].ty = Type::tile(DType::F32, &[8]);
    let e = errors(&k);
    let add_op = k.ops[s.if_op].regions[0].ops[0];
    assert_has(
        &e,
        add_op,
        "results are (an 8 f32 tile), expected (a 16 f32 tile)",
    );
    // The changed value also flows into the then-branch's yield.
    let then_yield = *k.ops[s.if_op].regions[0].ops.last().unwrap();
    assert_has(&e, then_yield, "yields (an 8 f32 tile)");
}

#[test]
fn yield_outside_a_region_and_missing_yield_are_reported() {
    let s = sample();
    let mut k = s.kernel;
    let body_yield = k.ops[s.for_op].regions[0].ops.pop().unwrap();
    k.body.ops.push(body_yield);
    let e = errors(&k);
    assert_has(&e, body_yield, "`yield` outside a region");
    assert_has(&e, s.for_op, "does not end with `yield`");
}

#[test]
fn wrong_operand_type_is_reported_with_infer_message() {
    let s = sample();
    let mut k = s.kernel;
    // `lt` on (i32, f32 tile).
    let lt = k.ops[s.for_op].regions[0].ops[0];
    k.ops[lt].operands[1] = s.add;
    let e = errors(&k);
    assert_has(&e, lt, "different element types");
}

#[test]
fn dangling_handles_do_not_panic() {
    let mut k = sample().kernel;
    let bogus = OpId::from_index(10_000);
    k.body.ops.push(bogus);
    let extra = k.ops.append(Op {
        kind: OpKind::Yield,
        operands: vec![ValueId::from_index(10_000)],
        results: vec![],
        regions: vec![],
        loc: Loc::default(),
    });
    k.body.ops.push(extra);
    let e = errors(&k);
    assert!(e.errors.len() >= 2, "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn display_prints_each_error_under_its_line() {
    let s = sample();
    let mut k = s.kernel;
    k.values[s.add].ty = Type::tile(DType::F32, &[8]);
    let text = errors(&k).to_string();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{} = add", s.add)))
        .unwrap_or_else(|| panic!("no add line in\n{text}"));
    assert!(
        lines[at + 1].trim_start().starts_with("; error: op")
            && lines[at + 1].contains("results are"),
        "{text}"
    );
    assert!(lines[0].starts_with("kernel sample("), "{text}");
    assert!(text.trim_end().ends_with("verifier error(s)"), "{text}");
}

#[test]
fn for_without_bounds_is_reported_without_printing_it() {
    let s = sample();
    let mut k = s.kernel;
    k.ops[s.for_op].operands.truncate(1);
    let e = errors(&k);
    assert_has(&e, s.for_op, "`for` takes lo, hi and step");
    assert!(!e.to_string().contains("kernel sample("), "{e}");
}
