//! [`Value`], the handle of a traced IR value, the helpers that add ops to the kernel being
//! traced and give their results as values (poison in, poison out), and the Rust operators.
//!
//! Operators accept Rust numbers on either side (`i * B`, `2.0 * x`): an integer adopts the
//! other operand's dtype (float too), a float next to an integer value is a diagnostic.

use std::ops::{
    Add, AddAssign, BitAnd, BitAndAssign, BitOr, BitOrAssign, BitXor, BitXorAssign, Div, DivAssign,
    Mul, MulAssign, Neg, Not, Rem, Shl, ShlAssign, Shr, ShrAssign, Sub, SubAssign,
};

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Const, Loc, OpKind, UnaryOp, ValueId};
use crate::types::{DType, Shape, Type};

use super::context::with;

/// A traced IR value: a scalar or a register tile. `Copy`, so kernels use it like a number.
///
/// A value whose op failed to build is *poison*: the failure was recorded as the kernel's
/// diagnostic, and every op reading poison is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value(Option<ValueId>);

impl Value {
    /// The value standing for a failed op.
    pub const POISON: Value = Value(None);

    /// Wraps a builder handle.
    pub fn from_id(id: ValueId) -> Value {
        Value(Some(id))
    }

    /// The builder handle; `None` for poison.
    pub fn id(self) -> Option<ValueId> {
        self.0
    }

    /// Whether this value stands for a failed op.
    pub fn is_poison(self) -> bool {
        self.0.is_none()
    }

    /// The value's IR type (`None` for poison or outside a trace).
    pub fn ty(self) -> Option<Type> {
        ty(self)
    }

    /// A gather inside the tile along dimension `dim`: the result has the shape of `idx` (an
    /// i32 tile of this tile's rank and extents, but any extent along `dim`) and element `e`
    /// is this tile's element at `e`'s coordinates with the one along `dim` replaced by
    /// `idx[e]`: `x.take(1, &perm)` permutes each row's columns, `v.take(0, &order)` reorders
    /// a vector (tokens sorted by expert). An index outside `0..extent` gives 0; see
    /// [`Value::take_or`] for another value. The elements move between threads through
    /// shared memory.
    #[track_caller]
    pub fn take(self, dim: usize, idx: impl AsValue) -> Value {
        self.take_at(dim, idx.as_value(), Operand::Int(0), Loc::caller())
    }

    /// [`Value::take`] with `other` (a scalar of this tile's dtype) where an index is outside
    /// the tile.
    #[track_caller]
    pub fn take_or(self, dim: usize, idx: impl AsValue, other: impl IntoOperand) -> Value {
        self.take_at(dim, idx.as_value(), other.into_operand(), Loc::caller())
    }

    fn take_at(self, dim: usize, idx: Value, other: Operand, loc: Loc) -> Value {
        let other = other.place(self.ty().map(|t| t.dtype()), loc);
        emit(OpKind::Take { dim }, &[self, idx, other], loc)
    }

    /// Converts every element to `T` (`x.cast::<bf16>()`).
    #[track_caller]
    pub fn cast<T: Element>(self) -> Value {
        self.cast_to(T::DTYPE)
    }

    /// Converts every element to `dtype`, an element type known while building: a comptime
    /// `DType` parameter (`acc.cast_to(T)` in a kernel generic over `Tensor<T, 2>`).
    #[track_caller]
    pub fn cast_to(self, dtype: DType) -> Value {
        emit(OpKind::Cast { to: dtype }, &[self], Loc::caller())
    }

    /// Reinterprets the bits of every element as `T`, a type of the same width
    /// (`x.bitcast::<u32>()` of an f32; f32, i32 and u32; bf16 and f16).
    #[track_caller]
    pub fn bitcast<T: Element>(self) -> Value {
        self.bitcast_to(T::DTYPE)
    }

    /// [`Value::bitcast`] to an element type known while building.
    #[track_caller]
    pub fn bitcast_to(self, dtype: DType) -> Value {
        emit(OpKind::Bitcast { to: dtype }, &[self], Loc::caller())
    }

    /// Transposes a 2-D tile.
    #[track_caller]
    pub fn t(self) -> Value {
        emit(OpKind::Transpose, &[self], Loc::caller())
    }

    /// Views a vector `[R]` as a column `[R, 1]`, to broadcast it across columns.
    #[track_caller]
    pub fn col(self) -> Value {
        self.vector_view("col", |n| vec![n, 1], Loc::caller())
    }

    /// Views a vector `[C]` as a row `[1, C]`, to broadcast it across rows.
    #[track_caller]
    pub fn row(self) -> Value {
        self.vector_view("row", |n| vec![1, n], Loc::caller())
    }

    fn vector_view(self, what: &str, dims: impl FnOnce(usize) -> Vec<usize>, loc: Loc) -> Value {
        let Some(ty) = self.ty() else {
            return Value::POISON;
        };
        match ty.shape().map(Shape::dims) {
            Some(&[n]) => emit(
                OpKind::Reshape {
                    shape: Shape(dims(n)),
                },
                &[self],
                loc,
            ),
            _ => fail(Diagnostic::new(
                loc,
                format!("`.{what}()` needs a 1-D tile, found {}", ty.words()),
            )),
        }
    }
}

/// A [`Value`] or a reference to one (free functions take either).
pub trait AsValue {
    /// The value.
    fn as_value(&self) -> Value;
}

impl AsValue for Value {
    fn as_value(&self) -> Value {
        *self
    }
}

impl AsValue for &Value {
    fn as_value(&self) -> Value {
        **self
    }
}

/// A Rust element type usable as a kiln dtype: `half::bf16`, `half::f16`, `f32`, `i32`, `u32`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kiln element type",
    note = "kiln element types are bf16, f16, f32, i32 and u32"
)]
pub trait Element {
    /// The IR element type.
    const DTYPE: DType;
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}

/// An operand before it is placed in the IR: a traced value or a Rust constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    /// A traced value.
    Value(Value),
    /// A Rust integer; takes the dtype of the value it meets (i32 alone). Next to a u32 value
    /// it may be anything in `0..=u32::MAX`.
    Int(i64),
    /// A Rust float; takes the float dtype of the value it meets (f32 alone).
    Float(f64),
    /// A Rust bool.
    Bool(bool),
}

/// Anything that can be an operand of a kiln op: [`Value`], `&Value`, and Rust numbers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an operand of a kiln op",
    note = "operands are `Value`s, `&Value`s, Rust integers, floats and bools"
)]
pub trait IntoOperand {
    /// Converts to an [`Operand`].
    fn into_operand(self) -> Operand;
}

impl IntoOperand for Value {
    fn into_operand(self) -> Operand {
        Operand::Value(self)
    }
}
impl IntoOperand for &Value {
    fn into_operand(self) -> Operand {
        Operand::Value(*self)
    }
}
impl IntoOperand for bool {
    fn into_operand(self) -> Operand {
        Operand::Bool(self)
    }
}

/// Implements [`IntoOperand`] for Rust integer types. Values beyond `i64` saturate and are
/// then rejected as out of `i32` range when placed.
macro_rules! int_operand {
    ($($t:ty),*) => {$(
        impl IntoOperand for $t {
            fn into_operand(self) -> Operand {
                Operand::Int(i64::try_from(self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_operand!(usize, u32, i32, i64);

impl IntoOperand for f32 {
    fn into_operand(self) -> Operand {
        Operand::Float(f64::from(self))
    }
}
impl IntoOperand for f64 {
    fn into_operand(self) -> Operand {
        Operand::Float(self)
    }
}

impl Operand {
    /// The dtype this operand has if it is a traced value.
    pub(crate) fn value_dtype(self) -> Option<DType> {
        match self {
            Operand::Value(v) => v.ty().map(|t| t.dtype()),
            _ => None,
        }
    }

    /// Places the operand in the IR; a constant takes `like` as its dtype when given.
    pub(crate) fn place(self, like: Option<DType>, loc: Loc) -> Value {
        let (c, dtype) = match self {
            Operand::Value(v) => return v,
            Operand::Int(i) => match like.unwrap_or(DType::I32) {
                d if d.is_float() => (Const::Float(i as f64), d),
                DType::I32 if i32::try_from(i).is_ok() => (Const::Int(i), DType::I32),
                DType::I32 => {
                    return fail(Diagnostic::new(
                        loc,
                        format!("integer constant {i} does not fit in i32"),
                    ));
                }
                DType::U32 if u32::try_from(i).is_ok() => (Const::Int(i), DType::U32),
                DType::U32 => {
                    return fail(Diagnostic::new(
                        loc,
                        format!("integer constant {i} does not fit in u32"),
                    ));
                }
                d => return mismatch(loc, "an integer", d),
            },
            Operand::Float(f) => match like.unwrap_or(DType::F32) {
                d if d.is_float() => (Const::Float(f), d),
                d => return mismatch(loc, "a float", d),
            },
            Operand::Bool(b) => match like.unwrap_or(DType::Bool) {
                DType::Bool => (Const::Bool(b), DType::Bool),
                d => return mismatch(loc, "a bool", d),
            },
        };
        with(|b| b.constant(c, dtype, loc)).map_or(Value::POISON, Value::from_id)
    }
}

fn mismatch(loc: Loc, what: &str, d: DType) -> Value {
    fail(
        Diagnostic::new(
            loc,
            format!("{what} constant cannot be combined with a {d} value"),
        )
        .note("write a constant of the value's type, or `.cast::<T>()` the value"),
    )
}

/// Places both operands (constants adopting the other side's dtype) and emits `op`.
pub(crate) fn binary(op: BinaryOp, a: Operand, b: Operand, loc: Loc) -> Value {
    let like = a.value_dtype().or_else(|| b.value_dtype());
    if matches!(a, Operand::Value(v) if v.is_poison())
        || matches!(b, Operand::Value(v) if v.is_poison())
    {
        return Value::POISON;
    }
    let (a, b) = (a.place(like, loc), b.place(like, loc));
    let ab = promote_ranks(&[a, b], loc);
    emit(OpKind::Binary(op), &ab, loc)
}

/// Numpy's broadcasting between ranks, for tiles of 3 or more dimensions: a tile of lower
/// rank gains leading extents of 1 (`[D]` against `[T, H, D]` reads as `[1, 1, D]`). Tiles
/// of at most 2 dimensions keep the explicit `.row()`/`.col()`.
pub(crate) fn promote_ranks(values: &[Value], loc: Loc) -> Vec<Value> {
    let rank = |v: &Value| v.ty().and_then(|t| t.shape().map(Shape::rank));
    let top = values.iter().filter_map(rank).max().unwrap_or(0);
    values
        .iter()
        .map(|&v| match (rank(&v), v.ty()) {
            (Some(r), Some(ty)) if top >= 3 && r < top => {
                let mut dims = vec![1; top - r];
                dims.extend(ty.shape().map(Shape::dims).unwrap_or_default());
                emit(OpKind::Reshape { shape: Shape(dims) }, &[v], loc)
            }
            _ => v,
        })
        .collect()
}

/// Emits a unary op.
pub(crate) fn unary(op: UnaryOp, x: Value, loc: Loc) -> Value {
    emit(OpKind::Unary(op), &[x], loc)
}

/// Implements one arithmetic operator for `Value op Value`, `Value op Rust` and `Rust op
/// Value`, plus its compound assignment.
macro_rules! arith {
    ($tr:ident, $m:ident, $atr:ident, $am:ident, $op:expr) => {
        impl<R: IntoOperand> $tr<R> for Value {
            type Output = Value;
            #[track_caller]
            fn $m(self, rhs: R) -> Value {
                binary($op, Operand::Value(self), rhs.into_operand(), Loc::caller())
            }
        }
        impl<R: IntoOperand> $tr<R> for &Value {
            type Output = Value;
            #[track_caller]
            fn $m(self, rhs: R) -> Value {
                binary($op, Operand::Value(*self), rhs.into_operand(), Loc::caller())
            }
        }
        impl<R: IntoOperand> $atr<R> for Value {
            #[track_caller]
            fn $am(&mut self, rhs: R) {
                *self = binary($op, Operand::Value(*self), rhs.into_operand(), Loc::caller());
            }
        }
        arith!(@lhs $tr, $m, $op, usize, u32, i32, i64, f32, f64);
    };
    (@lhs $tr:ident, $m:ident, $op:expr, $($t:ty),*) => {$(
        impl $tr<Value> for $t {
            type Output = Value;
            #[track_caller]
            fn $m(self, rhs: Value) -> Value {
                binary($op, self.into_operand(), Operand::Value(rhs), Loc::caller())
            }
        }
        impl $tr<&Value> for $t {
            type Output = Value;
            #[track_caller]
            fn $m(self, rhs: &Value) -> Value {
                binary($op, self.into_operand(), Operand::Value(*rhs), Loc::caller())
            }
        }
    )*};
}

arith!(Add, add, AddAssign, add_assign, BinaryOp::Add);
arith!(Sub, sub, SubAssign, sub_assign, BinaryOp::Sub);
arith!(Mul, mul, MulAssign, mul_assign, BinaryOp::Mul);
arith!(Div, div, DivAssign, div_assign, BinaryOp::Div);
// Bit operations on i32 and u32 values (`>>` is arithmetic on i32, logical on u32).
arith!(
    BitAnd,
    bitand,
    BitAndAssign,
    bitand_assign,
    BinaryOp::BitAnd
);
arith!(BitOr, bitor, BitOrAssign, bitor_assign, BinaryOp::BitOr);
arith!(
    BitXor,
    bitxor,
    BitXorAssign,
    bitxor_assign,
    BinaryOp::BitXor
);
arith!(Shl, shl, ShlAssign, shl_assign, BinaryOp::Shl);
arith!(Shr, shr, ShrAssign, shr_assign, BinaryOp::Shr);

impl<R: IntoOperand> Rem<R> for Value {
    type Output = Value;
    #[track_caller]
    fn rem(self, rhs: R) -> Value {
        binary(
            BinaryOp::Rem,
            Operand::Value(self),
            rhs.into_operand(),
            Loc::caller(),
        )
    }
}

impl Neg for Value {
    type Output = Value;
    #[track_caller]
    fn neg(self) -> Value {
        unary(UnaryOp::Neg, self, Loc::caller())
    }
}

impl Neg for &Value {
    type Output = Value;
    #[track_caller]
    fn neg(self) -> Value {
        unary(UnaryOp::Neg, *self, Loc::caller())
    }
}

/// Logical not of a bool value, bitwise not of an i32 or u32 one.
impl Not for Value {
    type Output = Value;
    #[track_caller]
    fn not(self) -> Value {
        unary(UnaryOp::Not, self, Loc::caller())
    }
}

impl Not for &Value {
    type Output = Value;
    #[track_caller]
    fn not(self) -> Value {
        unary(UnaryOp::Not, *self, Loc::caller())
    }
}

/// Records `diag` unless an earlier diagnostic was recorded; always gives a poison value.
pub(crate) fn fail(diag: Diagnostic) -> Value {
    with::<()>(|_| Err(diag));
    Value::POISON
}

/// The type of a traced value (`None` for poison).
pub(crate) fn ty(v: Value) -> Option<Type> {
    let id = v.id()?;
    with(|b| Ok(b.ty(id).clone()))
}

/// Adds an op with one result whose operands are `operands`; poison in, poison out.
pub(crate) fn emit(kind: OpKind, operands: &[Value], loc: Loc) -> Value {
    let Some(ids) = ids(operands) else {
        return Value::POISON;
    };
    with(|b| b.op1(kind, &ids, loc)).map_or(Value::POISON, Value::from_id)
}

/// Adds an op with no results (a store); skipped if an operand is poison.
pub(crate) fn emit_effect(kind: OpKind, operands: &[Value], loc: Loc) {
    if let Some(ids) = ids(operands) {
        with(|b| b.op(kind, &ids, loc));
    }
}

/// The handles of `values`, or `None` if one is poison.
pub(crate) fn ids(values: &[Value]) -> Option<Vec<ValueId>> {
    values.iter().map(|v| v.id()).collect()
}
