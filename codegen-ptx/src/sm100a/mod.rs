//! sm_100a: the schedule IR's roles (`kiln_ir::sched`) as a Blackwell warp-specialised loop,
//! with the accumulator in tensor memory (`kiln_ir::sched::tmem`).
//!
//! The block is the kernel's epilogue warps (threads `0..32 * epilogue_warps`), a TMA
//! producer warp and an MMA warp. Before the roles split, the MMA warp allocates the
//! accumulator's TMEM columns ([`tmem`]) under the ring's set-up barrier. Then each role
//! runs its side for one work tile, or, in a persistent kernel, walks the work tiles as on
//! sm_90a (`crate::sm90a::persistent`: the same tile order, block index and per-tile scalars):
//! the producer's elected thread runs the ring's producer program exactly as on sm_90a (TMA
//! and mbarriers are the same on Blackwell); the MMA warp's elected thread runs its
//! per-tile program, the ring's consumer program inside it as `tcgen05.mma` from shared-memory
//! descriptors with each stage released by `tcgen05.commit` ([`tcgen05`]), and the warp frees
//! the columns after the last tile; the epilogue warps copy each tile's accumulator to
//! registers, the `for`'s result, and run the kernel's code after the loop (its store goes
//! through the TMA-store epilogue) while the MMA warp already works on the next tile. Where
//! the plan reads the accumulator in chunks of columns, that code is written once per chunk,
//! on the chunk's registers ([`tmem`]).
//!
//! The 2-SM form (`kiln_ir::cluster::Pair`, `CLUSTER_M = 2`): both CTAs of the cluster run
//! these roles on their tile of a pair; the producers' TMA completes on the leader's `full`,
//! only the leader's MMA thread issues (`cta_group::2`, commits multicast to both CTAs), both
//! epilogues hand TMEM back to the leader, and the MMA and epilogue warps meet at a cluster
//! barrier before they exit.

mod attention;
mod tcgen05;
mod tmem;

use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::sched::{Role, RoleKind, Sched};
use kiln_ir::{Kernel, OpId};

use crate::CodegenError;
use crate::sm90a::Cursor;
use crate::sm90a::persistent::{TileLoop, scalar_only};
use crate::types::{Class, Reg};
use crate::writer::Writer;

/// A role's ops around the ring loop: those before it in a persistent kernel (rewritten per
/// work tile; none in another, whose code before the loop is written once before the roles
/// split), and those after it (which the epilogue runs).
pub(crate) struct Around {
    tiles: Option<TileScheduler>,
    before: Vec<OpId>,
    after: Vec<OpId>,
}

impl Writer<'_> {
    /// Writes the body of an sm_100a kernel with an accumulator in tensor memory: the roles,
    /// each walking the work tiles of a persistent kernel or running its one tile. A
    /// persistent kernel's roles rewrite the code before the ring loop per tile; another's
    /// runs once in every thread before the roles split. The epilogue runs the code after the
    /// loop.
    pub(crate) fn write_tcgen05(
        &mut self,
        tiles: Option<TileScheduler>,
    ) -> Result<(), CodegenError> {
        let (id, before, after) = self.persistent_parts()?;
        let around = match tiles {
            Some(_) => Around {
                tiles,
                before,
                after,
            },
            None => {
                for &op in &before {
                    self.write_op(op)?;
                }
                Around {
                    tiles,
                    before: Vec::new(),
                    after,
                }
            }
        };
        let k: &Kernel = self.k;
        let s = k
            .schedule
            .sched
            .as_ref()
            .ok_or_else(|| self.internal(id, "an sm_100a ring without its schedule"))?;
        self.write_tcgen05_roles(s, &around)
    }

    /// The three roles (see the module doc).
    fn write_tcgen05_roles(&mut self, s: &Sched, around: &Around) -> Result<(), CodegenError> {
        let id = s.for_op;
        let role = |kind| {
            s.role(kind).ok_or_else(|| {
                self.internal(id, format!("an sm_100a schedule without its {kind} role"))
            })
        };
        let (epilogue, producer, mma) = (
            role(RoleKind::Epilogue)?,
            role(RoleKind::Producer)?,
            role(RoleKind::Mma)?,
        );
        let [is_epilogue, is_mma, idle] = [(); 3].map(|_| self.new_reg(Class::Pred));
        let (epilogue_label, mma_label) = (self.new_label(), self.new_label());
        self.ins(format!(
            "setp.lt.u32 {is_epilogue}, {}, {}",
            self.tid,
            32 * epilogue.end_warp()
        ));
        self.ins(format!("@{is_epilogue} bra {epilogue_label}"));
        self.ins(format!(
            "setp.ge.u32 {is_mma}, {}, {}",
            self.tid,
            32 * mma.first_warp
        ));
        self.ins(format!("@{is_mma} bra {mma_label}"));
        self.comment("producer warp: one thread issues every stage's TMA");
        self.ins(format!(
            "setp.ne.u32 {idle}, {}, {}",
            self.tid,
            32 * producer.first_warp
        ));
        self.ins(format!("@{idle} exit"));
        let mut c = self.cursor(s, &producer.program.iteration);
        let (tl, bounds) = self.enter_tile(s, around, &mut c, true)?;
        self.write_producer(s, producer, &c, bounds)?;
        self.leave_tile(tl, &c);
        self.ins("exit");
        self.label(&mma_label);
        self.comment("mma warp: one thread issues the tcgen05.mmas; the warp owns TMEM");
        self.write_mma_warp(s, mma, around)?;
        self.ins("exit");
        self.label(&epilogue_label);
        self.comment("epilogue warps: the accumulator from TMEM, then the kernel's code");
        self.write_tmem_epilogue(s, epilogue, around)
    }

    /// Starts a role's work tile: in a persistent kernel opens its walk over the tiles and
    /// writes the ops before the ring loop (only the scalar ones when `scalars`); returns the
    /// walk and the loop's bounds.
    fn enter_tile(
        &mut self,
        s: &Sched,
        around: &Around,
        c: &mut Cursor,
        scalars: bool,
    ) -> Result<(Option<TileLoop>, [Reg; 3]), CodegenError> {
        let tl = match around.tiles {
            Some(tiles) => Some(self.open_tile_loop(s, tiles, c)?),
            None => None,
        };
        for &op in &around.before {
            if !scalars || scalar_only(self.k, op) {
                self.write_op(op)?;
            }
        }
        Ok((tl, self.loop_bounds(s.for_op)?))
    }

    /// Ends a role's work tile (closes the walk of a persistent kernel).
    fn leave_tile(&mut self, tl: Option<TileLoop>, c: &Cursor) {
        if let Some(tl) = tl {
            self.close_tile_loop(&tl, c);
        }
    }
}

/// The MMA role of the 2-SM form's peer CTA (which only frees its columns), if any.
fn peer_role(s: &Sched) -> Option<&Role> {
    let leader = s.cluster.as_ref()?.pair?.leader;
    s.roles
        .iter()
        .find(|r| r.kind == RoleKind::Mma && r.rank.is_some_and(|rank| rank != leader))
}
