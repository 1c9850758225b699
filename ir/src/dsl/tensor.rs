//! [`Tensor`], the handle of a tensor parameter inside a kernel body, and [`TileView`], a
//! tile of it at given coordinates.

use crate::diag::Diagnostic;
use crate::kernel::{Loc, OpKind};
use crate::types::Shape;

use super::index::{Index, shape_of};
use super::value::{self, AsValue, Value};

/// A tensor parameter (`Tensor<T, R>` or `TensorMut<T, R>` in the signature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub(super) index: usize,
    pub(super) rank: usize,
}

impl Tensor {
    /// The handle of tensor parameter number `index` (launch order) of rank `rank`.
    pub fn param(index: usize, rank: usize) -> Tensor {
        Tensor { index, rank }
    }

    /// The tile of `shape` whose first element is at `coords` (one per tensor dimension).
    /// The tile covers the tensor's last `shape.len()` dimensions.
    #[track_caller]
    pub fn tile<const S: usize, const C: usize>(
        self,
        shape: [Index; S],
        coords: [Index; C],
    ) -> TileView {
        let loc = Loc::caller();
        let shape = shape_of(&shape, loc);
        let coords = self.coords(&coords, loc).unwrap_or_default();
        TileView {
            tensor: self,
            shape,
            coords,
            indices: Vec::new(),
        }
    }

    /// The element at `coords` (one per tensor dimension) as a scalar: `cu_seqlens.scalar([b])`
    /// reads sequence `b`'s offset from an `i32` tensor. An index outside the tensor reads 0,
    /// as a tile's elements outside it do, so no index can read out of bounds.
    #[track_caller]
    pub fn scalar<const C: usize>(self, coords: [Index; C]) -> Value {
        let loc = Loc::caller();
        let Some(coords) = self.coords(&coords, loc) else {
            return Value::POISON;
        };
        value::emit(OpKind::LoadScalar { tensor: self.index }, &coords, loc)
    }

    /// `coords` as values, or a diagnostic unless there is one per dimension.
    pub(super) fn coords(self, coords: &[Index], loc: Loc) -> Option<Vec<Value>> {
        if coords.len() == self.rank {
            Some(coords.iter().map(|c| c.to_value(loc)).collect())
        } else {
            value::fail(Diagnostic::new(
                loc,
                format!(
                    "a rank-{} tensor needs {} coordinates, found {}",
                    self.rank,
                    self.rank,
                    coords.len()
                ),
            ));
            None
        }
    }

    /// The runtime extent of dimension `dim` (an i32 scalar).
    #[track_caller]
    pub fn dim(self, dim: usize) -> Value {
        value::emit(
            OpKind::TensorDim {
                tensor: self.index,
                dim,
            },
            &[],
            Loc::caller(),
        )
    }
}

/// A tile of a tensor at fixed coordinates, ready to load or store. Elements outside the
/// tensor load as zero and are skipped by stores.
#[derive(Clone, Debug)]
pub struct TileView {
    pub(super) tensor: Tensor,
    /// `None` after a shape diagnostic.
    pub(super) shape: Option<Shape>,
    /// Empty after a coordinate diagnostic.
    pub(super) coords: Vec<Value>,
    /// Tensor dimensions addressed through an index tile instead of `coords`
    /// ([`TileView::index`]).
    pub(super) indices: Vec<(usize, Value)>,
}

impl TileView {
    /// Loads the tile.
    #[track_caller]
    pub fn load(self) -> Value {
        if !self.indices.is_empty() {
            return self.gather(None, None, Loc::caller());
        }
        let (Some(shape), false) = (self.shape, self.coords.is_empty()) else {
            return Value::POISON;
        };
        let kind = OpKind::Load {
            tensor: self.tensor.index,
            shape,
        };
        value::emit(kind, &self.coords, Loc::caller())
    }

    /// Stores `value` (whose shape should match the tile's) into the tile.
    #[track_caller]
    pub fn store(self, value: impl AsValue) {
        if !self.indices.is_empty() {
            return self.scatter(value.as_value(), None, Loc::caller());
        }
        self.store_with(value.as_value(), None, Loc::caller());
    }

    /// Stores `value` into the tile but for the elements whose coordinate along tensor
    /// dimension `dim` (one of the tile's) is `limit` (an i32 scalar) or more: the rows of one
    /// sequence in a packed varlen batch, `o.tile(..).store_bounded(x, 2, q_end)`. On sm_90a
    /// and sm_100a such a store is written from registers, never through TMA (whose tensor
    /// map clips at the tensor's extent, not at `limit`).
    #[track_caller]
    pub fn store_bounded(self, value: impl AsValue, dim: usize, limit: impl AsValue) {
        let loc = Loc::caller();
        if !self.indices.is_empty() {
            value::fail(Diagnostic::new(
                loc,
                "`store_bounded` on a tile addressed through index tiles; mask it with `store_masked`",
            ));
            return;
        }
        let limit = limit.as_value();
        self.store_with(value.as_value(), Some((dim, limit)), loc);
    }

    /// [`TileView::store`], bounded by `limit` when given.
    fn store_with(self, value: Value, limit: Option<(usize, Value)>, loc: Loc) {
        let Some(shape) = self.shape else { return };
        if self.coords.is_empty() {
            return;
        }
        if let Some(ty) = value.ty()
            && ty.shape() != Some(&shape)
        {
            value::fail(Diagnostic::new(
                loc,
                format!("storing {} into a {shape} tile", ty.words()),
            ));
            return;
        }
        let mut operands = self.coords;
        operands.push(value);
        operands.extend(limit.map(|(_, l)| l));
        value::emit_effect(
            OpKind::Store {
                tensor: self.tensor.index,
                bound: limit.map(|(dim, _)| dim),
            },
            &operands,
            loc,
        );
    }
}
