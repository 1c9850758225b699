//! Comparisons and logic that work on Rust values (giving `bool`, decided while tracing) and
//! on traced values (giving a bool [`Value`]). The `#[kernel]` macro rewrites `a < b` to
//! `Compare::lt(a, b)` and `a && b` to `Logic::and(a, b)`.

use crate::kernel::{BinaryOp, Loc};

use super::value::{IntoOperand, Value, binary};

/// `< <= > >= == !=` for kernel operands.
#[diagnostic::on_unimplemented(
    message = "cannot compare `{Self}` with `{Rhs}` in a kernel",
    note = "compare two Rust values of one type, or a `Value` with a `Value` or a Rust number"
)]
pub trait Compare<Rhs = Self> {
    /// `bool` for Rust operands, [`Value`] for traced ones.
    type Output;
    /// `self < rhs`.
    fn lt(self, rhs: Rhs) -> Self::Output;
    /// `self <= rhs`.
    fn le(self, rhs: Rhs) -> Self::Output;
    /// `self > rhs`.
    fn gt(self, rhs: Rhs) -> Self::Output;
    /// `self >= rhs`.
    fn ge(self, rhs: Rhs) -> Self::Output;
    /// `self == rhs`.
    fn eq(self, rhs: Rhs) -> Self::Output;
    /// `self != rhs`.
    fn ne(self, rhs: Rhs) -> Self::Output;
}

/// `&&` and `||` for kernel operands (both sides are evaluated).
#[diagnostic::on_unimplemented(
    message = "cannot combine `{Self}` and `{Rhs}` with `&&`/`||` in a kernel",
    note = "combine two `bool`s, or bool `Value`s"
)]
pub trait Logic<Rhs = Self> {
    /// `bool` for Rust operands, [`Value`] for traced ones.
    type Output;
    /// `self && rhs`.
    fn and(self, rhs: Rhs) -> Self::Output;
    /// `self || rhs`.
    fn or(self, rhs: Rhs) -> Self::Output;
}

/// Native comparisons between Rust values of one type.
macro_rules! rust_compare {
    ($($t:ty),*) => {$(
        impl Compare for $t {
            type Output = bool;
            fn lt(self, rhs: $t) -> bool { self < rhs }
            fn le(self, rhs: $t) -> bool { self <= rhs }
            fn gt(self, rhs: $t) -> bool { self > rhs }
            fn ge(self, rhs: $t) -> bool { self >= rhs }
            fn eq(self, rhs: $t) -> bool { self == rhs }
            fn ne(self, rhs: $t) -> bool { self != rhs }
        }
    )*};
}
rust_compare!(usize, u32, i32, i64, f32, f64, bool);

/// Traced comparisons with the value on the left, the right, or both sides.
macro_rules! value_compare {
    ($(impl $lhs:ty, $rhs:ty;)*) => {$(
        impl Compare<$rhs> for $lhs {
            type Output = Value;
            #[track_caller]
            fn lt(self, rhs: $rhs) -> Value { cmp(BinaryOp::Lt, self, rhs) }
            #[track_caller]
            fn le(self, rhs: $rhs) -> Value { cmp(BinaryOp::Le, self, rhs) }
            #[track_caller]
            fn gt(self, rhs: $rhs) -> Value { cmp(BinaryOp::Gt, self, rhs) }
            #[track_caller]
            fn ge(self, rhs: $rhs) -> Value { cmp(BinaryOp::Ge, self, rhs) }
            #[track_caller]
            fn eq(self, rhs: $rhs) -> Value { cmp(BinaryOp::Eq, self, rhs) }
            #[track_caller]
            fn ne(self, rhs: $rhs) -> Value { cmp(BinaryOp::Ne, self, rhs) }
        }
    )*};
    ($($t:ty),*) => {
        $(value_compare! { impl Value, $t; impl $t, Value; })*
    };
}
value_compare! { impl Value, Value; }
value_compare!(usize, u32, i32, i64, f32, f64, bool);

#[track_caller]
fn cmp(op: BinaryOp, a: impl IntoOperand, b: impl IntoOperand) -> Value {
    binary(op, a.into_operand(), b.into_operand(), Loc::caller())
}

impl Logic for bool {
    type Output = bool;
    fn and(self, rhs: bool) -> bool {
        self && rhs
    }
    fn or(self, rhs: bool) -> bool {
        self || rhs
    }
}

/// Traced logic with a value on at least one side.
macro_rules! value_logic {
    ($(impl $lhs:ty, $rhs:ty;)*) => {$(
        impl Logic<$rhs> for $lhs {
            type Output = Value;
            #[track_caller]
            fn and(self, rhs: $rhs) -> Value {
                binary(BinaryOp::And, self.into_operand(), rhs.into_operand(), Loc::caller())
            }
            #[track_caller]
            fn or(self, rhs: $rhs) -> Value {
                binary(BinaryOp::Or, self.into_operand(), rhs.into_operand(), Loc::caller())
            }
        }
    )*};
}
value_logic! { impl Value, Value; impl Value, bool; impl bool, Value; }
