//! [`Index`]: an entry of a tile shape or tile coordinate, comptime or traced.
//!
//! The `#[kernel]` macro rewrites every array literal `[e0, e1, ..]` in a kernel body to
//! `[IntoIndex::into_index(e0), ..]`, so `[b, h, mb * BM, 0]` mixes values and constants.

use crate::diag::Diagnostic;
use crate::kernel::{Const, Loc};
use crate::types::{DType, Shape};

use super::context;
use super::value::{self, Value};

/// A shape or coordinate entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Index {
    /// Known while tracing (a literal, a `const`, a comptime parameter).
    Const(i64),
    /// A traced i32 scalar.
    Value(Value),
}

/// What may appear in a shape or coordinate array: Rust integers and [`Value`]s.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tile shape or coordinate entry",
    note = "entries are Rust integers (usize, i32, ...) or i32 `Value`s"
)]
pub trait IntoIndex {
    /// Converts to an [`Index`].
    fn into_index(self) -> Index;
}

impl IntoIndex for Index {
    fn into_index(self) -> Index {
        self
    }
}
impl IntoIndex for Value {
    fn into_index(self) -> Index {
        Index::Value(self)
    }
}
impl IntoIndex for &Value {
    fn into_index(self) -> Index {
        Index::Value(*self)
    }
}

/// Implements [`IntoIndex`] for Rust integers (saturating beyond `i64`; such entries are
/// rejected where they are used).
macro_rules! int_index {
    ($($t:ty),*) => {$(
        impl IntoIndex for $t {
            fn into_index(self) -> Index {
                Index::Const(i64::try_from(self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_index!(usize, u32, i32, i64);

impl Index {
    /// Places the entry in the IR as an i32 scalar.
    pub(crate) fn to_value(self, loc: Loc) -> Value {
        match self {
            Index::Value(v) => v,
            Index::Const(i) if i32::try_from(i).is_ok() => {
                context::with(|b| b.constant(Const::Int(i), DType::I32, loc))
                    .map_or(Value::POISON, Value::from_id)
            }
            Index::Const(i) => value::fail(Diagnostic::new(
                loc,
                format!("index {i} does not fit in i32"),
            )),
        }
    }
}

/// A tile shape from its entries; a traced entry is a diagnostic (recorded) and gives `None`.
pub(crate) fn shape_of(entries: &[Index], loc: Loc) -> Option<Shape> {
    let mut dims = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        match e {
            Index::Const(d) => match usize::try_from(*d) {
                Ok(d) => dims.push(d),
                Err(_) => {
                    value::fail(Diagnostic::new(
                        loc,
                        format!("tile extent {i} is {d}; extents must be positive"),
                    ));
                    return None;
                }
            },
            Index::Value(_) => {
                value::fail(
                    Diagnostic::new(
                        loc,
                        format!("tile shape entry {i} is a runtime value"),
                    )
                    .note("tile shapes must be known at compile time; use a const or a #[comptime] parameter"),
                );
                return None;
            }
        }
    }
    Some(Shape(dims))
}

/// A tile shape argument: an array of entries of any length (`[BM, D]`). A trait rather
/// than a const generic so that `zeros::<f32>([BM, D])` names only the dtype; implemented for
/// arrays of anything [`IntoIndex`], so it also works outside `#[kernel]` bodies.
pub trait Entries {
    /// The entries.
    fn entries(self) -> Vec<Index>;
}

impl<T: IntoIndex, const N: usize> Entries for [T; N] {
    fn entries(self) -> Vec<Index> {
        self.into_iter().map(IntoIndex::into_index).collect()
    }
}
