//! The lowering of the kernel's own ops a scheduled kernel has on both families, and where
//! the roles write them: the ops before the ring loop per work tile, the code after it per
//! chunk of the accumulator's columns.

use std::ops::Range;

use kiln_ir::sched::op::Named;
use kiln_ir::sched::{Op, Sched, TmaStore};
use kiln_ir::{Kernel, OpId, OpKind, Type};

use super::barrier::cluster_barrier;
use super::store;
use crate::emit::{Emitter, Lower};
use crate::error::CodegenError;
use crate::types::Reg;

/// A family's lowering of the `mma`s of the ring loop's body (sm_90a: wgmmas reading the
/// stage); `()` for a family whose roles never write the body's `mma`.
pub(crate) trait RingMma {
    /// Writes `mma` `id` the family's way and returns `true`, or returns `false` for the
    /// generic `mma.sync` (`warpgroup`: the consumer warpgroup's index).
    fn mma(
        &mut self,
        e: &mut Emitter<'_>,
        warpgroup: Option<Reg>,
        id: OpId,
    ) -> Result<bool, CodegenError>;
}

impl RingMma for () {
    fn mma(&mut self, _: &mut Emitter<'_>, _: Option<Reg>, _: OpId) -> Result<bool, CodegenError> {
        Ok(false)
    }
}

/// The lowering of the kernel's own ops a scheduled kernel has on both families: a
/// persistent kernel's block index (its work tile's) and grid (the logical one), its stores
/// through TMA, the chunk of the accumulator's columns the code after the loop runs on, and
/// the family's `mma` in the ring's body.
pub(crate) struct Ops<'k, M = ()> {
    /// The schedule.
    pub(crate) s: &'k Sched,
    /// A persistent kernel's logical grid (its parameters).
    pub(crate) grid: Option<[Reg; 3]>,
    /// A persistent kernel's block index: that of the work tile being written.
    pub(crate) block: Option<[Reg; 3]>,
    /// The stores written through TMA: the schedule's, or a role's own.
    pub(crate) stores: &'k [TmaStore],
    /// The consumer warpgroup index, where warpgroups store apart.
    pub(crate) warpgroup: Option<Reg>,
    /// The accumulator columns the code after the loop runs on, when a chunk of them.
    pub(crate) columns: Option<Range<u32>>,
    /// The family's lowering of the ring body's `mma`s.
    pub(crate) mma: M,
}

impl<'k, M> Ops<'k, M> {
    /// The lowering of schedule `s`'s ops with logical grid `grid`.
    pub(crate) fn new(s: &'k Sched, grid: Option<[Reg; 3]>, mma: M) -> Ops<'k, M> {
        Ops {
            s,
            grid,
            block: None,
            stores: &s.stores,
            warpgroup: None,
            columns: None,
            mma,
        }
    }

    /// An op of the exit of a role that ran the code after the loop: the last wait for its
    /// bulk stores, or the cluster's last barrier.
    pub(crate) fn exit(&self, e: &mut Emitter<'_>, op: Op) -> Result<(), CodegenError> {
        match op {
            Op::BulkWaitAll => store::finish(e, self.s, self.stores, self.warpgroup),
            Op::ClusterSync => {
                e.comment("no CTA exits while a cluster peer may still use its shared memory");
                cluster_barrier(e);
                Ok(())
            }
            op => {
                let named = Named { op, sched: self.s };
                Err(e.internal(self.s.for_op, format!("`{named}` at a role's exit")))
            }
        }
    }
}

impl<M: RingMma> Ops<'_, M> {
    /// Writes the ops before the ring loop (`before`) for the work tile `block` names: all
    /// of them, or only those computing scalars when `scalars` (a role that needs nothing
    /// else, such as the producer's TMA coordinates and trip count).
    pub(crate) fn write_before(
        &mut self,
        e: &mut Emitter<'_>,
        k: &Kernel,
        before: &[OpId],
        scalars: bool,
    ) -> Result<(), CodegenError> {
        for &op in before {
            if !scalars || scalar_only(k, op) {
                e.write_op(op, self)?;
            }
        }
        Ok(())
    }

    /// Writes the ops after the ring loop (`after`, the epilogue's code) on accumulator
    /// columns `columns` (all of them: `None`). A later chunk (not `first`) skips the ops that
    /// compute only scalars: it reuses the registers the first chunk wrote.
    pub(crate) fn write_after(
        &mut self,
        e: &mut Emitter<'_>,
        k: &Kernel,
        after: &[OpId],
        columns: Option<Range<u32>>,
        first: bool,
    ) -> Result<(), CodegenError> {
        self.columns = columns;
        for &op in after {
            if k.ops[op].kind != OpKind::Yield && (first || !scalar_only(k, op)) {
                e.write_op(op, self)?;
            }
        }
        self.columns = None;
        Ok(())
    }
}

impl<M: RingMma> Lower for Ops<'_, M> {
    fn block_id(&self, axis: usize) -> Option<Reg> {
        self.block.map(|b| b[axis])
    }

    fn grid_dim(&self, axis: usize) -> Option<Reg> {
        self.grid.map(|g| g[axis])
    }

    fn columns(&self) -> Option<Range<u32>> {
        self.columns.clone()
    }

    fn mma(&mut self, e: &mut Emitter<'_>, id: OpId) -> Result<bool, CodegenError> {
        self.mma.mma(e, self.warpgroup, id)
    }

    fn store(&mut self, e: &mut Emitter<'_>, id: OpId) -> Result<bool, CodegenError> {
        match self.stores.iter().find(|st| st.store == id) {
            Some(st) => {
                store::write(e, self.s, id, st, self.warpgroup)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Whether `op` and everything in its regions only compute scalars (no tile, no memory).
fn scalar_only(k: &Kernel, op: OpId) -> bool {
    let o = &k.ops[op];
    let scalar_results = o
        .results
        .iter()
        .all(|&r| matches!(k.ty(r), Type::Scalar(_)));
    let no_memory = !matches!(
        o.kind,
        OpKind::Load { .. }
            | OpKind::Store { .. }
            | OpKind::Gather { .. }
            | OpKind::Scatter { .. }
            | OpKind::Atomic { .. }
            | OpKind::ScalarAtomic { .. }
            | OpKind::Print { .. }
            | OpKind::Mma
    );
    scalar_results
        && no_memory
        && o.regions
            .iter()
            .all(|r| r.ops.iter().all(|&inner| scalar_only(k, inner)))
}
