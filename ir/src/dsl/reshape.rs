//! Reshaping a tile: `reshape`, `permute` and `unsqueeze`, whose shapes and orders are
//! written like coordinates ([`Entries`]).

use crate::diag::Diagnostic;
use crate::kernel::{Loc, OpKind};
use crate::types::Shape;

use super::index::{Entries, Index, shape_of};
use super::value::{Value, emit, fail};

impl Value {
    /// The same elements, in row-major order, as a tile of `shape` (of equal element count):
    /// `x.reshape([b, h * d])` of a `[b, h, d]` tile. Free when the last dimension stays (and
    /// for added or removed extents of 1); otherwise the elements move between threads.
    #[track_caller]
    pub fn reshape(self, shape: impl Entries) -> Value {
        let loc = Loc::caller();
        match shape_of(&shape.entries(), loc) {
            Some(shape) => emit(OpKind::Reshape { shape }, &[self], loc),
            None => Value::POISON,
        }
    }

    /// The tile with its dimensions reordered: dimension `i` of the result is dimension
    /// `order[i]` of this tile (`x.permute([0, 2, 1])` of `[b, h, d]` is `[b, d, h]`).
    #[track_caller]
    pub fn permute(self, order: impl Entries) -> Value {
        let loc = Loc::caller();
        let mut perm = Vec::new();
        for e in order.entries() {
            match e {
                Index::Const(d) if d >= 0 => perm.push(d as usize),
                _ => {
                    return fail(Diagnostic::new(
                        loc,
                        "`permute` takes the tile's dimensions as compile-time numbers \
                         (`[0, 2, 1]`)",
                    ));
                }
            }
        }
        emit(OpKind::Permute { perm }, &[self], loc)
    }

    /// The tile with an extent-1 dimension inserted at `dim` (numpy's `expand_dims`), to
    /// broadcast it along that dimension: a per-head statistic `[T, H]` becomes `[T, H, 1]`.
    #[track_caller]
    pub fn unsqueeze(self, dim: usize) -> Value {
        let loc = Loc::caller();
        let Some(ty) = self.ty() else {
            return Value::POISON;
        };
        match ty.shape() {
            Some(s) if dim <= s.rank() => {
                let mut dims = s.dims().to_vec();
                dims.insert(dim, 1);
                emit(OpKind::Reshape { shape: Shape(dims) }, &[self], loc)
            }
            _ => fail(Diagnostic::new(
                loc,
                format!(
                    "`.unsqueeze({dim})` needs a tile of at least {dim} dimensions, found {}",
                    ty.words()
                ),
            )),
        }
    }
}
