//! Addressed memory accesses on a [`TileView`]: masked loads with a fill value and masked
//! stores, gathers and scatters through index tiles ([`TileView::index`],
//! [`Tensor::rows`], [`Tensor::elems`]), and atomics ([`TileView::atomic_add`] and the
//! others, [`TileView::atomic`] with [`AtomicOpts`]), and scalar atomics on one element
//! ([`Tensor::at`], [`ElementView`]). They build [`OpKind::Gather`], [`OpKind::Scatter`],
//! [`OpKind::Atomic`] and [`OpKind::ScalarAtomic`].

use crate::diag::Diagnostic;
use crate::kernel::{Access, Addr, AtomicOp, Loc, MemScope, MemSem, OpKind};
use crate::types::{DType, Shape};

use super::context;
use super::index::{IntoIndex, shape_of};
use super::tensor::{Tensor, TileView};
use super::value::{self, AsValue, IntoOperand, Value};

/// The options of an atomic, as Triton's `atomic_add(ptr, val, mask, sem, scope)`:
/// `AtomicOpts::new().mask(&m).sem(MemSem::AcqRel).scope(MemScope::Gpu)`. The default is
/// unmasked, relaxed, GPU scope.
#[derive(Clone, Copy, Debug, Default)]
pub struct AtomicOpts {
    mask: Option<Value>,
    sem: MemSem,
    scope: MemScope,
}

impl AtomicOpts {
    /// Unmasked, relaxed, GPU scope.
    pub fn new() -> AtomicOpts {
        AtomicOpts::default()
    }

    /// Only the elements where `mask` (a bool tile broadcasting to the tile, or a scalar)
    /// holds are applied.
    pub fn mask(mut self, mask: impl AsValue) -> AtomicOpts {
        self.mask = Some(mask.as_value());
        self
    }

    /// The memory-ordering semantics.
    pub fn sem(mut self, sem: MemSem) -> AtomicOpts {
        self.sem = sem;
        self
    }

    /// The memory-ordering scope.
    pub fn scope(mut self, scope: MemScope) -> AtomicOpts {
        self.scope = scope;
        self
    }
}

impl Tensor {
    /// The tile of rows `rows` (an i32 tile `[R]`: row indices into the tensor's
    /// second-to-last dimension) and columns `[c, c + cols)`, where `coords` gives every
    /// coordinate (its row entry is ignored): `x.rows(&idx, 64, [0, c0]).load()` gathers MoE
    /// routed tokens, `y.rows(&idx, 64, [0, c0]).store(v)` scatters them back. Rows outside
    /// the tensor are skipped (they load as 0).
    #[track_caller]
    pub fn rows<const C: usize>(
        self,
        rows: impl AsValue,
        cols: impl IntoIndex,
        coords: [super::Index; C],
    ) -> TileView {
        let loc = Loc::caller();
        let rows = rows.as_value();
        let r = match rows.ty().as_ref().and_then(|t| t.shape().cloned()) {
            Some(s) if s.rank() == 1 => s.rows(),
            Some(s) => {
                value::fail(Diagnostic::new(
                    loc,
                    format!("the row indices are a {s} tile, expected a 1-D tile"),
                ));
                0
            }
            None => 0,
        };
        if self.rank < 2 {
            value::fail(Diagnostic::new(
                loc,
                format!(
                    "`rows` needs a tensor of rank 2 or more, found rank {}",
                    self.rank
                ),
            ));
        }
        let shape = shape_of(&[super::Index::Const(r as i64), cols.into_index()], loc)
            .filter(|_| r > 0 && self.rank >= 2);
        let coords = self.coords(&coords, loc).unwrap_or_default();
        let view = TileView {
            tensor: self,
            shape,
            coords,
            indices: Vec::new(),
        };
        view.index_at(self.rank.saturating_sub(2), rows, loc)
    }

    /// The elements at index tiles `idx` (one i32 tile per tensor dimension, all
    /// broadcasting to one shape, which is the tile's): `x.elems([&i, &j]).load()` is
    /// `x[i, j]` element by element, `hist.elems([&bins]).atomic_add(1)` a histogram.
    /// Indices outside the tensor are skipped.
    #[track_caller]
    pub fn elems<const C: usize>(self, idx: [super::Index; C]) -> TileView {
        let loc = Loc::caller();
        // The macro writes the array's entries as indices; each must be a traced tile.
        let idx = idx.map(|i| match i {
            super::Index::Value(v) => v,
            super::Index::Const(_) => value::fail(Diagnostic::new(
                loc,
                "`elems` takes one i32 tile per dimension, found a constant",
            )),
        });
        let mut shape: Option<Shape> = None;
        for v in &idx {
            let Some(s) = v.ty().and_then(|t| t.shape().cloned()) else {
                if !v.is_poison() {
                    value::fail(Diagnostic::new(
                        loc,
                        "`elems` takes one i32 tile per dimension",
                    ));
                }
                continue;
            };
            shape = match shape {
                None => Some(s),
                Some(p) => match p.broadcast(&s) {
                    Some(b) => Some(b),
                    None => {
                        value::fail(Diagnostic::new(
                            loc,
                            format!("index tiles of shapes {p} and {s} do not broadcast"),
                        ));
                        None
                    }
                },
            };
        }
        let ok = C == self.rank;
        if !ok {
            value::fail(Diagnostic::new(
                loc,
                format!(
                    "a rank-{} tensor needs {} index tiles, found {C}",
                    self.rank, self.rank
                ),
            ));
        }
        TileView {
            tensor: self,
            shape: shape.filter(|_| ok),
            // Unused: every dimension is indexed.
            coords: (0..self.rank)
                .map(|_| super::Index::Const(0).to_value(loc))
                .collect(),
            indices: idx.into_iter().enumerate().collect(),
        }
    }
}

impl TileView {
    /// The same tile with tensor dimension `dim` addressed through `idx`, an i32 tile
    /// broadcasting to the tile (a 1-D one along the tile dimension that `dim` is): element
    /// `e`'s coordinate along `dim` is `idx`'s element for `e` instead of the tile's
    /// coordinate plus `e`'s offset.
    #[track_caller]
    pub fn index(self, dim: usize, idx: impl AsValue) -> TileView {
        self.index_at(dim, idx.as_value(), Loc::caller())
    }

    fn index_at(mut self, dim: usize, idx: Value, loc: Loc) -> TileView {
        if dim >= self.tensor.rank {
            value::fail(Diagnostic::new(
                loc,
                format!(
                    "indexing dimension {dim} of a rank-{} tensor",
                    self.tensor.rank
                ),
            ));
            return self;
        }
        // A vector index of a 2-D tile runs along the tile dimension `dim` maps to.
        let idx = match (&self.shape, idx.ty().and_then(|t| t.shape().cloned())) {
            (Some(tile), Some(s)) if tile.rank() == 2 && s.rank() == 1 => {
                match crate::access::tile_dim(dim, self.tensor.rank, 2) {
                    Some(0) => idx.col(),
                    Some(_) => idx.row(),
                    None => idx,
                }
            }
            _ => idx,
        };
        self.indices.retain(|(d, _)| *d != dim);
        self.indices.push((dim, idx));
        self
    }

    /// The tensor's element type, if it is known.
    fn dtype(&self) -> Option<DType> {
        let i = self.tensor.index;
        context::with(|b| Ok(b.params().get(i).map(|p| p.dtype()))).flatten()
    }

    /// The address operands and their [`Access`] (`None` after an earlier diagnostic).
    fn access(&self, masked: bool) -> Option<(Vec<Value>, Access)> {
        // After a diagnostic (wrong coordinate or index count) there is nothing to emit.
        if self.coords.len() != self.tensor.rank
            || self.indices.iter().any(|&(d, _)| d >= self.tensor.rank)
        {
            return None;
        }
        let mut addr = self.coords.clone();
        let mut dims = vec![Addr::Coord; self.tensor.rank];
        for &(d, v) in &self.indices {
            addr[d] = v;
            dims[d] = Addr::Index;
        }
        Some((addr, Access { dims, masked }))
    }

    /// Loads the tile where `mask` (a bool tile broadcasting to the tile, or a scalar)
    /// holds and the element lies inside the tensor; every other element reads `other` (a
    /// scalar of the tensor's dtype): `x.tile(..).load_masked(&(cols.row() < n), f32::NEG_INFINITY)`.
    #[track_caller]
    pub fn load_masked(self, mask: impl IntoOperand, other: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        let other = other.into_operand().place(self.dtype(), loc);
        let mask = mask.into_operand().place(Some(DType::Bool), loc);
        self.gather(Some(mask), Some(other), loc)
    }

    pub(super) fn gather(self, mask: Option<Value>, other: Option<Value>, loc: Loc) -> Value {
        let Some(shape) = self.shape.clone() else {
            return Value::POISON;
        };
        let Some((mut operands, access)) = self.access(mask.is_some()) else {
            return Value::POISON;
        };
        let other = match other {
            Some(o) => o,
            None => value::Operand::Int(0).place(self.dtype(), loc),
        };
        operands.extend(mask);
        operands.push(other);
        let kind = OpKind::Gather {
            tensor: self.tensor.index,
            shape,
            access,
        };
        value::emit(kind, &operands, loc)
    }

    /// Stores `value` where `mask` (a bool tile broadcasting to the tile, or a scalar) holds
    /// and the element lies inside the tensor.
    #[track_caller]
    pub fn store_masked(self, value: impl AsValue, mask: impl IntoOperand) {
        let loc = Loc::caller();
        let mask = mask.into_operand().place(Some(DType::Bool), loc);
        self.scatter(value.as_value(), Some(mask), loc);
    }

    pub(super) fn scatter(self, value: Value, mask: Option<Value>, loc: Loc) {
        let Some((mut operands, access)) = self.access(mask.is_some()) else {
            return;
        };
        let Some(value) = self.values(value, loc) else {
            return;
        };
        operands.push(value);
        operands.extend(mask);
        let kind = OpKind::Scatter {
            tensor: self.tensor.index,
            access,
        };
        value::emit_effect(kind, &operands, loc);
    }

    /// `v` as a tile of the view's shape: a scalar is splatted, a tile must match.
    fn values(&self, v: Value, loc: Loc) -> Option<Value> {
        let shape = self.shape.clone()?;
        let ty = v.ty()?;
        match ty.shape() {
            None => Some(value::emit(OpKind::Splat { shape }, &[v], loc)),
            Some(s) if *s == shape => Some(v),
            Some(_) => {
                value::fail(Diagnostic::new(
                    loc,
                    format!("writing {} into a {shape} tile", ty.words()),
                ));
                None
            }
        }
    }

    /// `op` applied atomically with each element of `values` (a tile of the view's shape, or
    /// a scalar for every element) to the element it addresses, with the mask, ordering and
    /// scope of `opts`; returns the values read (0 where skipped). `compare` is `cas`'s.
    #[track_caller]
    pub fn atomic(
        self,
        op: AtomicOp,
        values: impl IntoOperand,
        compare: Option<Value>,
        opts: AtomicOpts,
    ) -> Value {
        self.atomic_at(op, values.into_operand(), compare, opts, Loc::caller())
    }

    fn atomic_at(
        self,
        op: AtomicOp,
        values: value::Operand,
        compare: Option<Value>,
        opts: AtomicOpts,
        loc: Loc,
    ) -> Value {
        if (op == AtomicOp::Cas) != compare.is_some() {
            return value::fail(Diagnostic::new(
                loc,
                "a compare operand is taken by `atomic_cas`, and only by it",
            ));
        }
        let Some((mut operands, access)) = self.access(opts.mask.is_some()) else {
            return Value::POISON;
        };
        let v = values.place(self.dtype(), loc);
        let Some(v) = self.values(v, loc) else {
            return Value::POISON;
        };
        operands.extend(compare);
        operands.push(v);
        operands.extend(opts.mask);
        let kind = OpKind::Atomic {
            tensor: self.tensor.index,
            op,
            sem: opts.sem,
            scope: opts.scope,
            access,
        };
        value::emit(kind, &operands, loc)
    }

    /// Atomically adds `values` (a tile or a scalar) to the tile's elements (bf16 and f16
    /// tensors too); returns the old values.
    #[track_caller]
    pub fn atomic_add(self, values: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Add,
            values.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// [`TileView::atomic_add`] where `mask` holds.
    #[track_caller]
    pub fn atomic_add_masked(self, values: impl IntoOperand, mask: impl AsValue) -> Value {
        let (loc, opts) = (Loc::caller(), AtomicOpts::new().mask(mask));
        self.atomic_at(AtomicOp::Add, values.into_operand(), None, opts, loc)
    }

    /// Atomic maximum; returns the old values.
    #[track_caller]
    pub fn atomic_max(self, values: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Max,
            values.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// [`TileView::atomic_max`] where `mask` holds.
    #[track_caller]
    pub fn atomic_max_masked(self, values: impl IntoOperand, mask: impl AsValue) -> Value {
        let (loc, opts) = (Loc::caller(), AtomicOpts::new().mask(mask));
        self.atomic_at(AtomicOp::Max, values.into_operand(), None, opts, loc)
    }

    /// Atomic minimum; returns the old values.
    #[track_caller]
    pub fn atomic_min(self, values: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Min,
            values.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// [`TileView::atomic_min`] where `mask` holds.
    #[track_caller]
    pub fn atomic_min_masked(self, values: impl IntoOperand, mask: impl AsValue) -> Value {
        let (loc, opts) = (Loc::caller(), AtomicOpts::new().mask(mask));
        self.atomic_at(AtomicOp::Min, values.into_operand(), None, opts, loc)
    }

    /// Atomic exchange; returns the old values.
    #[track_caller]
    pub fn atomic_xchg(self, values: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Xchg,
            values.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// [`TileView::atomic_xchg`] where `mask` holds.
    #[track_caller]
    pub fn atomic_xchg_masked(self, values: impl IntoOperand, mask: impl AsValue) -> Value {
        let (loc, opts) = (Loc::caller(), AtomicOpts::new().mask(mask));
        self.atomic_at(AtomicOp::Xchg, values.into_operand(), None, opts, loc)
    }

    /// Atomic compare-and-swap: each element equal to `compare`'s (bitwise) becomes
    /// `values`'; returns the old values (equal to `compare` where the swap happened).
    #[track_caller]
    pub fn atomic_cas(self, compare: impl AsValue, values: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        let compare = Some(compare.as_value());
        self.atomic_at(
            AtomicOp::Cas,
            values.into_operand(),
            compare,
            AtomicOpts::new(),
            loc,
        )
    }
}

/// One element of a tensor addressed by scalar coordinates ([`Tensor::at`]): the target of a
/// scalar atomic, which the block applies once (see [`ElementView::atomic`]).
#[derive(Clone, Debug)]
pub struct ElementView {
    tensor: Tensor,
    /// Empty after a coordinate diagnostic.
    coords: Vec<Value>,
}

impl Tensor {
    /// The element at `coords` (one scalar i32 per tensor dimension), for a scalar atomic:
    /// `let done = counter.at([0]).atomic_add(1);`.
    #[track_caller]
    pub fn at<const C: usize>(self, coords: [super::Index; C]) -> ElementView {
        let coords = self.coords(&coords, Loc::caller()).unwrap_or_default();
        ElementView {
            tensor: self,
            coords,
        }
    }
}

impl ElementView {
    /// `op` applied atomically with the scalar `value` (for `cas`, when the element equals
    /// `compare` bitwise) to the element, with the ordering and scope of `opts`; returns the
    /// value it read (0, and nothing applied, where the coordinates are outside the tensor).
    ///
    /// A scalar is the block's, so the block applies the atomic **once**, not once per
    /// thread: every thread of the block first finishes its earlier memory accesses, one
    /// thread applies the atomic, and every thread receives the old value. With
    /// [`MemSem::Release`] (or `AcqRel`) the block's earlier writes are therefore visible to
    /// whoever acquires the element after it, and with [`MemSem::Acquire`] what the block
    /// reads afterwards sees what was released before: the "last block finishes the
    /// reduction" pattern, `if counter.at([0]).atomic(AtomicOp::Add, 1, None, acq_rel) ==
    /// grid_dim().x - 1 { .. }`. `opts` takes no mask: put the atomic under a runtime `if`
    /// (whose scalar condition is the same in every thread) instead.
    #[track_caller]
    pub fn atomic(
        self,
        op: AtomicOp,
        value: impl IntoOperand,
        compare: Option<Value>,
        opts: AtomicOpts,
    ) -> Value {
        self.atomic_at(op, value.into_operand(), compare, opts, Loc::caller())
    }

    fn atomic_at(
        self,
        op: AtomicOp,
        value: value::Operand,
        compare: Option<Value>,
        opts: AtomicOpts,
        loc: Loc,
    ) -> Value {
        if (op == AtomicOp::Cas) != compare.is_some() {
            return value::fail(Diagnostic::new(
                loc,
                "a compare operand is taken by `atomic_cas`, and only by it",
            ));
        }
        if opts.mask.is_some() {
            return value::fail(
                Diagnostic::new(loc, "a scalar atomic takes no mask")
                    .note("put it under a runtime `if` on the condition instead"),
            );
        }
        if self.coords.is_empty() && self.tensor.rank > 0 {
            return Value::POISON;
        }
        let dtype =
            context::with(|b| Ok(b.params().get(self.tensor.index).map(|p| p.dtype()))).flatten();
        let v = value.place(dtype, loc);
        for s in compare.iter().chain([&v]) {
            if let Some(ty) = s.ty()
                && ty.shape().is_some()
            {
                return value::fail(
                    Diagnostic::new(
                        loc,
                        format!("a scalar atomic takes scalar values, found {}", ty.words()),
                    )
                    .note("an atomic on a tile's elements is `tensor.tile(..).atomic_add(..)`"),
                );
            }
        }
        let mut operands = self.coords;
        operands.extend(compare);
        operands.push(v);
        let kind = OpKind::ScalarAtomic {
            tensor: self.tensor.index,
            op,
            sem: opts.sem,
            scope: opts.scope,
        };
        value::emit(kind, &operands, loc)
    }

    /// Atomically adds the scalar `value` to the element, once per block; returns the old
    /// value (see [`ElementView::atomic`]).
    #[track_caller]
    pub fn atomic_add(self, value: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Add,
            value.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// Atomic maximum, once per block; returns the old value.
    #[track_caller]
    pub fn atomic_max(self, value: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Max,
            value.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// Atomic minimum, once per block; returns the old value.
    #[track_caller]
    pub fn atomic_min(self, value: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Min,
            value.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// Atomic exchange, once per block; returns the old value.
    #[track_caller]
    pub fn atomic_xchg(self, value: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        self.atomic_at(
            AtomicOp::Xchg,
            value.into_operand(),
            None,
            AtomicOpts::new(),
            loc,
        )
    }

    /// Atomic compare-and-swap, once per block: the element becomes `value` if it equals
    /// `compare` (bitwise); returns the old value (equal to `compare` where it swapped).
    #[track_caller]
    pub fn atomic_cas(self, compare: impl IntoOperand, value: impl IntoOperand) -> Value {
        let loc = Loc::caller();
        let dtype =
            context::with(|b| Ok(b.params().get(self.tensor.index).map(|p| p.dtype()))).flatten();
        let compare = Some(compare.into_operand().place(dtype, loc));
        self.atomic_at(
            AtomicOp::Cas,
            value.into_operand(),
            compare,
            AtomicOpts::new(),
            loc,
        )
    }
}
