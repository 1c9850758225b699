//! Free functions of the DSL: tile constructors, math, reductions, `mma`, `select` and grid
//! queries. Each records its caller's location on the ops it emits.

use crate::diag::Diagnostic;
use crate::kernel::{Axis, BinaryOp, Loc, OpKind, ReduceOp, UnaryOp};
use crate::types::DType;

use super::context;
use super::index::{Entries, Index, shape_of};
use super::value::{self, AsValue, Element, IntoOperand, Operand, Value, binary, unary};

/// A tile of `shape` filled with zeros of type `T`.
#[track_caller]
pub fn zeros<T: Element>(shape: impl Entries) -> Value {
    splat::<T>(&shape.entries(), Operand::Int(0), Loc::caller())
}

/// A tile of `shape` filled with `x` (a Rust number, or a scalar value of type `T`).
#[track_caller]
pub fn full<T: Element>(shape: impl Entries, x: impl IntoOperand) -> Value {
    splat::<T>(&shape.entries(), x.into_operand(), Loc::caller())
}

fn splat<T: Element>(shape: &[Index], x: Operand, loc: Loc) -> Value {
    let Some(shape) = shape_of(shape, loc) else {
        return Value::POISON;
    };
    let x = x.place(Some(T::DTYPE), loc);
    if let Some(ty) = x.ty()
        && ty.dtype() != T::DTYPE
    {
        return value::fail(Diagnostic::new(
            loc,
            format!("filling a {} tile with {}", T::DTYPE, ty.words()),
        ));
    }
    value::emit(OpKind::Splat { shape }, &[x], loc)
}

/// An i32 tile of `shape` whose elements hold their index along dimension `dim`.
#[track_caller]
pub fn iota(shape: impl Entries, dim: usize) -> Value {
    let loc = Loc::caller();
    match shape_of(&shape.entries(), loc) {
        Some(shape) => value::emit(OpKind::Iota { shape, dim }, &[], loc),
        None => Value::POISON,
    }
}

/// Defines elementwise unary functions.
macro_rules! unary_fns {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(x: impl AsValue) -> Value {
            unary($op, x.as_value(), Loc::caller())
        }
    )*};
}

unary_fns! {
    /// `2^x`, elementwise; a result below f32's normal range (`x < -126`) is 0, as the GPU's
    /// fast exponential gives.
    exp2 => UnaryOp::Exp2;
    /// `e^x`, elementwise; a result below f32's normal range (`x < -87.3`) is 0, as the GPU's
    /// fast exponential gives.
    exp => UnaryOp::Exp;
    /// `log2(x)`, elementwise, within about an f32 ulp for every `x` (subnormals too); NaN
    /// below 0, `-inf` at 0.
    log2 => UnaryOp::Log2;
    /// The natural logarithm, elementwise, as [`log2`].
    log => UnaryOp::Log;
    /// `sqrt(x)`, elementwise.
    sqrt => UnaryOp::Sqrt;
    /// `1/sqrt(x)`, elementwise.
    rsqrt => UnaryOp::Rsqrt;
    /// `|x|`, elementwise.
    abs => UnaryOp::Abs;
    /// `1/x`, elementwise.
    recip => UnaryOp::Recip;
    /// `sin(x)`, elementwise, within about an f32 ulp for every finite `x` (the argument is
    /// reduced exactly, so large `|x|` stay accurate); NaN for infinities.
    sin => UnaryOp::Sin;
    /// `cos(x)`, elementwise, as [`sin`].
    cos => UnaryOp::Cos;
    /// `tanh(x)`, elementwise, within about an f32 ulp.
    tanh => UnaryOp::Tanh;
    /// The error function `erf(x)`, elementwise, within about an f32 ulp.
    erf => UnaryOp::Erf;
    /// The logistic function `1 / (1 + e^-x)`, elementwise, within about an f32 ulp.
    sigmoid => UnaryOp::Sigmoid;
}

/// Reinterprets the bits of every element of `x` as `T` (same width: f32, i32 and u32;
/// bf16 and f16).
#[track_caller]
pub fn bitcast<T: Element>(x: impl AsValue) -> Value {
    value::emit(
        OpKind::Bitcast { to: T::DTYPE },
        &[x.as_value()],
        Loc::caller(),
    )
}

/// The high 32 bits of the 64-bit product of two u32 values (scalars or tiles).
#[track_caller]
pub fn umulhi(a: impl IntoOperand, b: impl IntoOperand) -> Value {
    mul_high(
        a.into_operand(),
        b.into_operand(),
        DType::U32,
        "umulhi",
        Loc::caller(),
    )
}

/// The high 32 bits of the 64-bit signed product of two i32 values.
#[track_caller]
pub fn mulhi(a: impl IntoOperand, b: impl IntoOperand) -> Value {
    mul_high(
        a.into_operand(),
        b.into_operand(),
        DType::I32,
        "mulhi",
        Loc::caller(),
    )
}

fn mul_high(a: Operand, b: Operand, want: DType, name: &str, loc: Loc) -> Value {
    let found = a.value_dtype().or_else(|| b.value_dtype()).unwrap_or(want);
    if found != want {
        let other = if want == DType::U32 {
            "mulhi"
        } else {
            "umulhi"
        };
        return value::fail(
            Diagnostic::new(
                loc,
                format!("`{name}` takes {want} operands, found {found}"),
            )
            .note(format!(
                "use `{other}` for the other signedness, or `.bitcast::<{want}>()`"
            )),
        );
    }
    binary(BinaryOp::MulHi, a, b, loc)
}

/// Elementwise maximum (scalars or tiles, with broadcasting; NaN yields the other operand).
#[track_caller]
pub fn max(a: impl IntoOperand, b: impl IntoOperand) -> Value {
    binary(
        BinaryOp::Max,
        a.into_operand(),
        b.into_operand(),
        Loc::caller(),
    )
}

/// Elementwise minimum.
#[track_caller]
pub fn min(a: impl IntoOperand, b: impl IntoOperand) -> Value {
    binary(
        BinaryOp::Min,
        a.into_operand(),
        b.into_operand(),
        Loc::caller(),
    )
}

/// Defines reductions of a 2-D tile.
macro_rules! reduce_fns {
    ($($(#[$doc:meta])* $name:ident => $op:expr, $dim:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(x: impl AsValue) -> Value {
            value::emit(OpKind::Reduce { op: $op, dim: $dim }, &[x.as_value()], Loc::caller())
        }
    )*};
}

reduce_fns! {
    /// Maximum of each row: `[R, C] -> [R]`.
    row_max => ReduceOp::Max, 1;
    /// Sum of each row: `[R, C] -> [R]`.
    row_sum => ReduceOp::Sum, 1;
    /// Minimum of each row: `[R, C] -> [R]`.
    row_min => ReduceOp::Min, 1;
    /// Maximum of each column: `[R, C] -> [C]`.
    col_max => ReduceOp::Max, 0;
    /// Sum of each column: `[R, C] -> [C]`.
    col_sum => ReduceOp::Sum, 0;
}

/// Defines reductions along a dimension the caller names.
macro_rules! reduce_dim_fns {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(x: impl AsValue, dim: usize) -> Value {
            value::emit(OpKind::Reduce { op: $op, dim }, &[x.as_value()], Loc::caller())
        }
    )*};
}

reduce_dim_fns! {
    /// Sum along dimension `dim` of a tile of 2 or more dimensions, which it removes:
    /// `reduce_sum(&x, 1)` of `[T, H, D]` is `[T, D]` (`row_sum` is `reduce_sum(.., 1)` of
    /// a 2-D tile). Floats accumulate in f32.
    reduce_sum => ReduceOp::Sum;
    /// Maximum along dimension `dim`, which it removes (see [`reduce_sum`]).
    reduce_max => ReduceOp::Max;
    /// Minimum along dimension `dim`, which it removes (see [`reduce_sum`]).
    reduce_min => ReduceOp::Min;
}

/// `a @ b` for bf16/f16 tiles `a[M, K]`, `b[K, N]`, accumulated in f32: an f32 `[M, N]` tile.
#[track_caller]
pub fn mma(a: impl AsValue, b: impl AsValue) -> Value {
    value::emit(OpKind::Mma, &[a.as_value(), b.as_value()], Loc::caller())
}

/// `a @ b + c` with `c` an f32 `[M, N]` accumulator.
#[track_caller]
pub fn mma_acc(a: impl AsValue, b: impl AsValue, c: impl AsValue) -> Value {
    let operands = [a.as_value(), b.as_value(), c.as_value()];
    value::emit(OpKind::Mma, &operands, Loc::caller())
}

/// Fails the build with `message` at the caller's line, and stands for the value the kernel
/// could not compute: for a comptime argument outside what a kernel accepts
/// (`if act > 3 { reject("..") } else { .. }`), which no type can rule out.
#[track_caller]
pub fn reject(message: &str) -> Value {
    value::fail(Diagnostic::new(Loc::caller(), message.to_string()))
}

/// Elementwise `cond ? a : b`; constants adopt the other branch's dtype.
#[track_caller]
pub fn select(cond: impl AsValue, a: impl IntoOperand, b: impl IntoOperand) -> Value {
    let loc = Loc::caller();
    let (a, b) = (a.into_operand(), b.into_operand());
    let like = [a, b].iter().find_map(|o| match o {
        Operand::Value(v) => v.ty().map(|t| t.dtype()),
        _ => None,
    });
    let (a, b) = (a.place(like, loc), b.place(like, loc));
    let operands = value::promote_ranks(&[cond.as_value(), a, b], loc);
    value::emit(OpKind::Select, &operands, loc)
}

/// `ceil(a / b)` for positive integers: the number of `b`-sized blocks covering `a`.
#[track_caller]
pub fn cdiv(a: impl IntoOperand, b: impl IntoOperand) -> Value {
    let loc = Loc::caller();
    let (a, b) = (a.into_operand(), b.into_operand());
    let sum = binary(BinaryOp::Add, a, b, loc);
    let num = binary(BinaryOp::Sub, Operand::Value(sum), Operand::Int(1), loc);
    binary(BinaryOp::Div, Operand::Value(num), b, loc)
}

/// The three components of a grid query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim3 {
    /// Along `x`.
    pub x: Value,
    /// Along `y`.
    pub y: Value,
    /// Along `z`.
    pub z: Value,
}

/// Asks that the kernel's blocks run in thread-block clusters of `ctas` along x (1: no
/// cluster; at most 2). A block still computes what its body says; the sm_90a passes
/// cluster a persistent GEMM-shaped ring, whose pair of CTAs then multicasts the operand
/// both tiles read ([`crate::sched::cluster`]), and any other kernel or target fails to build with a
/// diagnostic here, so an autotuner skips the candidate. Another `ctas` is a diagnostic too.
#[track_caller]
pub fn cluster(ctas: usize) {
    let loc = Loc::caller();
    if !(1..=2).contains(&ctas) {
        value::fail(Diagnostic::new(
            loc,
            format!("`cluster` takes 1 or 2 CTAs per cluster, not {ctas}"),
        ));
        return;
    }
    context::with(|b| {
        let options = b.options_mut();
        options.cluster = ctas as u32;
        options.cluster_loc = loc;
        Ok(())
    });
}

/// Asks that `blocks` blocks of the kernel fit on one multiprocessor at once (CUDA's
/// `__launch_bounds__` minimum, PTX's `.minnctapersm`): ptxas then keeps each thread's
/// registers within `65536 / (blocks x threads)`, spilling if it must (`kiln check` reports
/// the registers, the spills and the blocks a multiprocessor holds). For a kernel whose
/// occupancy its registers just miss. At most 32; a warp-specialised schedule sets its own.
#[track_caller]
pub fn blocks_per_sm(blocks: usize) {
    let loc = Loc::caller();
    if !(1..=32).contains(&blocks) {
        value::fail(Diagnostic::new(
            loc,
            format!("`blocks_per_sm` takes 1 to 32 blocks, not {blocks}"),
        ));
        return;
    }
    context::with(|b| {
        b.options_mut().blocks_per_sm = blocks as u32;
        Ok(())
    });
}

/// Turns the warp-specialised schedule off (`false`) or leaves it to the compiler (`true`,
/// the default): on sm_90a and sm_100a a pipelined loop whose mmas a TMA ring can feed gets a
/// producer warpgroup and consumer warpgroups; with `false` it keeps the lowering every warp
/// runs in program order (cp.async, and wgmma without warp roles on sm_90a), as Triton's
/// `warp_specialize` chooses per loop. For comparing the two schedules of one kernel, or
/// keeping a measured one.
#[track_caller]
pub fn warp_specialize(on: bool) {
    let loc = Loc::caller();
    context::with(|b| {
        let options = b.options_mut();
        options.warp_specialize = on;
        options.warp_specialize_loc = loc;
        Ok(())
    });
}

/// This block's index in the grid (i32 scalars).
#[track_caller]
pub fn block_id() -> Dim3 {
    dim3(OpKind::BlockId, Loc::caller())
}

/// The grid's extent in blocks (i32 scalars).
#[track_caller]
pub fn grid_dim() -> Dim3 {
    dim3(OpKind::GridDim, Loc::caller())
}

/// Emits one query per axis; the unused ones are removed after tracing.
fn dim3(kind: fn(Axis) -> OpKind, loc: Loc) -> Dim3 {
    Dim3 {
        x: value::emit(kind(Axis::X), &[], loc),
        y: value::emit(kind(Axis::Y), &[], loc),
        z: value::emit(kind(Axis::Z), &[], loc),
    }
}
