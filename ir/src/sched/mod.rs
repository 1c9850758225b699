//! # The schedule IR: role programs over barriers
//!
//! The expert layer under the semantic IR: one [`Sched`] per kernel's pipelined loop, holding
//! barriers ([`barrier`]), resources and role programs ([`role`]) of [`op::Op`]s, written by the
//! scheduling passes, proved by `protocol_check`, run by the CPU execution of scheduled kernels
//! and walked by each target family's writer. A new kernel family is a pass that writes this IR,
//! not a new language. Vocabulary, execution model and invariants: `docs/pipeline.md`.

pub mod barrier;
pub mod cluster;
pub mod expand;
pub mod op;
pub mod overlap;
mod print;
pub mod region;
pub mod role;
pub mod store;
pub mod tiles;
pub mod tma;
pub mod tmem;
pub mod verify;

use crate::arena::Arena;
use crate::entities::OpId;

pub use barrier::{Barrier, BarrierId, BarrierKind, Index, Mbarrier, Phase, Scope};
pub use op::{Op, Who};
pub use region::{MmaPart, Region};
pub use role::{Issue, Program, Role, RoleKind};
pub use store::TmaStore;
pub use tma::{Load, LoadId};

/// A kernel's schedule: see the module doc, and `docs/pipeline.md` for its execution model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sched {
    /// The pipelined `for` whose iterations the programs run.
    pub for_op: OpId,
    /// Stages of the ring's buffers (and of its per-iteration barrier arrays).
    pub stages: u32,
    /// Every barrier.
    pub barriers: Arena<Barrier>,
    /// Every TMA load.
    pub loads: Arena<Load>,
    /// The TMA stores of the code after the loop.
    pub stores: Vec<TmaStore>,
    /// Tensor memory, on sm_100a.
    pub tmem: Option<tmem::Tmem>,
    /// The ops before the roles split, in order.
    pub setup: Vec<Op>,
    /// The roles, in warp order.
    pub roles: Vec<Role>,
    /// How a persistent CTA walks its work tiles; `None`: one work tile per CTA.
    pub tiles: Option<tiles::TileScheduler>,
    /// The cluster whose CTAs share one load's stages.
    pub cluster: Option<cluster::Cluster>,
    /// The structure of a rotated (or sm_100a attention) loop.
    pub overlap: Option<overlap::Overlap>,
    /// Work tiles a CTA runs at once: 2 for an sm_100a attention pair (two Q tiles on one
    /// key walk), else 1.
    pub work_tiles: u32,
    /// CTAs built to share a multiprocessor (`.minnctapersm`).
    pub ctas_per_sm: u32,
    /// sm_90a: the accumulator columns the code after the loop runs on at a time, when not
    /// all of them.
    pub epilogue_columns: Option<u32>,
    /// sm_100a attention: shared byte offset of the per-Q-tile slots (128 f32 each) through
    /// which the softmax hands the correction its rows' rescale factors.
    pub factors_offset: Option<u32>,
    /// sm_100a attention: the share `(num, den)` of the score tile's exponentials the
    /// softmax computes with the polynomial (every column `c` with `c % den < num`).
    pub poly_share: (u32, u32),
}

impl Sched {
    /// An empty schedule of loop `for_op` with `stages` stages.
    pub fn new(for_op: OpId, stages: u32) -> Sched {
        Sched {
            for_op,
            stages,
            barriers: Arena::new(),
            loads: Arena::new(),
            stores: Vec::new(),
            tmem: None,
            setup: Vec::new(),
            roles: Vec::new(),
            tiles: None,
            cluster: None,
            overlap: None,
            work_tiles: 1,
            ctas_per_sm: 1,
            epilogue_columns: None,
            factors_offset: None,
            poly_share: (0, 0),
        }
    }

    /// Threads per block: every role's warps, whole warpgroups.
    pub fn threads(&self) -> u32 {
        32 * self.roles.iter().map(Role::end_warp).max().unwrap_or(0)
    }

    /// Appends mbarrier array `name` (`index`: its place in a family) to the arena.
    pub fn add_mbarrier(
        &mut self,
        name: &'static str,
        index: Option<u32>,
        mbarrier: Mbarrier,
    ) -> BarrierId {
        self.barriers.append(Barrier {
            name,
            index,
            kind: BarrierKind::Mbarrier(mbarrier),
        })
    }

    /// Appends named barrier array `name` (`index`): `ids` hardware barriers from `first`,
    /// `threads` meeting at each.
    pub fn add_named(
        &mut self,
        name: &'static str,
        index: Option<u32>,
        (first, ids, threads): (u32, u32, u32),
    ) -> BarrierId {
        self.barriers.append(Barrier {
            name,
            index,
            kind: BarrierKind::Named {
                first,
                ids,
                threads,
            },
        })
    }

    /// The first hardware named barrier id after every named barrier array of the arena
    /// (1 when there is none: 0 is the block-wide barrier).
    pub fn free_named_barrier(&self) -> u32 {
        self.barriers
            .iter()
            .filter_map(|(_, b)| match b.kind {
                BarrierKind::Named { first, ids, .. } => Some(first + ids),
                BarrierKind::Mbarrier(_) => None,
            })
            .max()
            .unwrap_or(1)
    }

    /// The first role of `kind`.
    pub fn role(&self, kind: RoleKind) -> Option<&Role> {
        self.roles.iter().find(|r| r.kind == kind)
    }

    /// The mbarrier `bar`, or `None` for a named barrier.
    pub fn mbarrier(&self, bar: BarrierId) -> Option<&Mbarrier> {
        self.barriers[bar].as_mbarrier()
    }

    /// Whether the CTAs walk work tiles.
    pub fn persistent(&self) -> bool {
        self.tiles.is_some()
    }

    /// Whether `load` is loaded once per work tile (its barrier's phase is per tile).
    pub fn once(&self, load: LoadId) -> bool {
        self.mbarrier(self.loads[load].barrier)
            .is_some_and(|m| m.phase == Phase::Tile)
    }

    /// The ring's loads: those filling a stage per iteration.
    pub fn ring_loads(&self) -> impl Iterator<Item = (LoadId, &Load)> + '_ {
        self.loads.iter().filter(|(l, _)| !self.once(*l))
    }

    /// The once loads: those filling their buffer once per work tile.
    pub fn once_loads(&self) -> impl Iterator<Item = LoadId> + '_ {
        self.loads.iter().map(|(h, _)| h).filter(|&h| self.once(h))
    }
}

impl Sched {
    /// Every op of the schedule, mutably: the set-up, each role's sections, each store's
    /// round.
    pub fn ops_mut(&mut self) -> impl Iterator<Item = &mut Op> {
        let roles = self.roles.iter_mut().flat_map(|r| {
            let p = &mut r.program;
            p.start
                .iter_mut()
                .chain(&mut p.tile)
                .chain(&mut p.iteration)
                .chain(&mut p.drain)
                .chain(&mut p.release)
                .chain(&mut p.end)
                .chain(&mut p.exit)
        });
        self.setup
            .iter_mut()
            .chain(roles)
            .chain(self.stores.iter_mut().flat_map(|st| st.round.iter_mut()))
    }

    /// Puts the arena in its canonical order, every handle renamed to match: mbarriers by
    /// their shared-memory offset, then named barriers by id (the order the writers
    /// initialise and the dumps print them in).
    pub fn sort_barriers(&mut self) {
        let mut order: Vec<BarrierId> = self.barriers.iter().map(|(h, _)| h).collect();
        order.sort_by_key(|&h| match self.barriers[h].kind {
            BarrierKind::Mbarrier(m) => (0, m.offset),
            BarrierKind::Named { first, .. } => (1, first),
        });
        self.rebuild_barriers(&order);
    }

    /// Removes barriers `gone`, which nothing names any more, every other handle renamed.
    pub fn remove_barriers(&mut self, gone: &[BarrierId]) {
        let order: Vec<BarrierId> = self
            .barriers
            .iter()
            .map(|(h, _)| h)
            .filter(|h| !gone.contains(h))
            .collect();
        self.rebuild_barriers(&order);
    }

    /// The arena of the barriers `order` names, in that order, every handle renamed.
    fn rebuild_barriers(&mut self, order: &[BarrierId]) {
        let mut rename: Vec<Option<BarrierId>> = vec![None; self.barriers.len()];
        let mut arena = Arena::new();
        for &old in order {
            rename[old.index()] = Some(arena.append(self.barriers[old].clone()));
        }
        self.barriers = arena;
        let new = |h: BarrierId| rename[h.index()].unwrap_or(h);
        for op in self.ops_mut() {
            rename_barrier(op, &new);
        }
        for (_, l) in self.loads.iter_mut() {
            l.barrier = new(l.barrier);
            l.free = l.free.map(new);
        }
        for st in &mut self.stores {
            st.barrier = new(st.barrier);
        }
    }
}

/// Renames the barrier `op` names through `new`.
fn rename_barrier(op: &mut Op, new: &dyn Fn(BarrierId) -> BarrierId) {
    if let Some(bar) = op.barrier_mut() {
        *bar = new(*bar);
    }
}
