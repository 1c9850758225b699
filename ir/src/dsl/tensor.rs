//! [`Tensor`], the handle of a tensor parameter inside a kernel body, and [`TileView`], a
//! tile of it at given coordinates.

use crate::diag::Diagnostic;
use crate::kernel::{Loc, OpKind};
use crate::types::Shape;

use super::context;
use super::index::{Index, shape_of};
use super::value::{AsValue, Value};

/// A tensor parameter (`Tensor<T, R>` or `TensorMut<T, R>` in the signature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    index: usize,
    rank: usize,
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
        let coords = if C == self.rank {
            coords.iter().map(|c| c.to_value(loc)).collect()
        } else {
            context::fail(Diagnostic::new(
                loc,
                format!(
                    "a rank-{} tensor needs {} coordinates, found {C}",
                    self.rank, self.rank
                ),
            ));
            Vec::new()
        };
        TileView {
            tensor: self,
            shape,
            coords,
        }
    }

    /// The runtime extent of dimension `dim` (an i32 scalar).
    #[track_caller]
    pub fn dim(self, dim: usize) -> Value {
        context::emit(
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
    tensor: Tensor,
    /// `None` after a shape diagnostic.
    shape: Option<Shape>,
    /// Empty after a coordinate diagnostic.
    coords: Vec<Value>,
}

impl TileView {
    /// Loads the tile.
    #[track_caller]
    pub fn load(self) -> Value {
        let (Some(shape), false) = (self.shape, self.coords.is_empty()) else {
            return Value::POISON;
        };
        let kind = OpKind::Load {
            tensor: self.tensor.index,
            shape,
        };
        context::emit(kind, &self.coords, Loc::caller())
    }

    /// Stores `value` (whose shape should match the tile's) into the tile.
    #[track_caller]
    pub fn store(self, value: impl AsValue) {
        let loc = Loc::caller();
        let value = value.as_value();
        let Some(shape) = self.shape else { return };
        if self.coords.is_empty() {
            return;
        }
        if let Some(ty) = value.ty()
            && ty.shape() != Some(&shape)
        {
            context::fail(Diagnostic::new(
                loc,
                format!("storing a {ty} value into a {shape} tile"),
            ));
            return;
        }
        let mut operands = self.coords;
        operands.push(value);
        context::emit_effect(
            OpKind::Store {
                tensor: self.tensor.index,
            },
            &operands,
            loc,
        );
    }
}
