//! The lowering of the kernel's own ops a scheduled kernel has on both families.

use std::ops::Range;

use kiln_ir::OpId;
use kiln_ir::sched::{Sched, TmaStore};

use super::store;
use crate::emit::{Emitter, Lower};
use crate::error::CodegenError;
use crate::types::Reg;

/// The lowering of the kernel's own ops a scheduled kernel has on both families: a
/// persistent kernel's block index (its work tile's) and grid (the logical one), its stores
/// through TMA, and the chunk of the accumulator's columns the code after the loop runs on.
pub(crate) struct Ops<'k> {
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
}

impl<'k> Ops<'k> {
    /// The lowering of schedule `s`'s ops with logical grid `grid`.
    pub(crate) fn new(s: &'k Sched, grid: Option<[Reg; 3]>) -> Ops<'k> {
        Ops {
            s,
            grid,
            block: None,
            stores: &s.stores,
            warpgroup: None,
            columns: None,
        }
    }
}

impl Lower for Ops<'_> {
    fn block_id(&self, axis: usize) -> Option<Reg> {
        self.block.map(|b| b[axis])
    }

    fn grid_dim(&self, axis: usize) -> Option<Reg> {
        self.grid.map(|g| g[axis])
    }

    fn columns(&self) -> Option<Range<u32>> {
        self.columns.clone()
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
