//! sm_90a: the schedule IR's roles (`kiln_ir::sched`) as a warp-specialised loop.
//!
//! The block is the kernel's consumer warps (threads `0..32 * consumer_warps`, which run the
//! kernel's code unchanged) plus one producer warpgroup after them. At the ring's `for`, the
//! producer warpgroup gives registers back (`setmaxnreg.dec`), one elected thread runs the
//! producer's program (wait `empty`, `arrive.expect_tx` on `full`, `cp.async.bulk.tensor`
//! boxes) over the loop's iteration space and exits; the consumers take the registers
//! (`setmaxnreg.inc`) and run their program around the loop body, whose `mma`s become
//! wgmmas ([`wgmma`]) reading the stage. Tiles loaded once per work tile (attention's `Q`) are
//! issued by the producer before its loop and waited for by the consumers before theirs; the
//! load op itself, earlier in the kernel, only names the tile's shared address. Every op
//! comes from the role programs ([`roles`] walks them; a rotated consumer program,
//! [`rotated`]), the data the `protocol_check` pass proved.
//!
//! A persistent kernel (`kiln_ir::sched::tiles`) splits the roles at the start; each walks
//! the work tiles and, per tile, runs the ops before the ring loop (the producer only those
//! computing scalars: its TMA coordinates and trip count need nothing else) and its side of
//! the ring; the consumers then run the ops after the loop (the epilogue) while the producer
//! already loads the next tile.
//!
//! A clustered schedule (`kiln_ir::sched::cluster`): the entry requires clusters of 2
//! (`.reqnctapercluster`), the set-up ends on a cluster barrier instead of `bar.sync`, each
//! CTA issues its boxes of the shared load with `.multicast::cluster` (the others' are
//! predicated off by `%cluster_ctarank`), the consumers' peer releases arrive through `mapa`
//! on the other CTA's `empty`, which the producer waits on with cluster scope, and the
//! consumers meet at a cluster barrier before they exit.
//!
//! A kernel without a ring keeps the generic writer's code (cp.async, register staging, no
//! warp roles); the mmas `kiln_ir::passes::wgmma_plain` took are written as wgmma issued by
//! every warpgroup in program order ([`plain`]).

pub(crate) mod plain;
mod roles;
mod rotated;
mod wgmma;

use kiln_ir::sched::{BarrierId, Op, Sched};

use crate::emit::Emitter;
use crate::error::CodegenError;
use crate::sched::{Ops, View};
use crate::types::Reg;

use wgmma::RingBody;

/// Writes the roles of schedule `s` after the prologue (`grid`: a persistent kernel's
/// logical grid).
pub(crate) fn write<'k>(
    e: &mut Emitter<'k>,
    s: &'k Sched,
    grid: Option<[Reg; 3]>,
) -> Result<(), CodegenError> {
    let k = e.k;
    let mut w = Sm90a {
        e,
        v: View::new(k, s),
        ops: Ops::new(s, grid, None),
        turns: None,
    };
    w.setup()?;
    w.roles()
}

/// The sm_90a writer of a scheduled kernel.
struct Sm90a<'a, 'k> {
    /// The generic writer.
    e: &'a mut Emitter<'k>,
    /// The schedule.
    v: View<'k>,
    /// How the kernel's own ops are written where the programs run them; in the ring's body
    /// being written, its `mma`s as wgmmas reading the current stage.
    ops: Ops<'k, Option<RingBody>>,
    /// The consumer warpgroup's registers of the named barriers the warpgroups take turns
    /// at, computed where the consumers start.
    turns: Option<TurnRegs>,
}

/// The registers of a named barrier array the consumer warpgroups take turns at.
#[derive(Clone, Copy, Debug)]
struct TurnRegs {
    /// The array.
    bar: BarrierId,
    /// This warpgroup's barrier id, and the next warpgroup's.
    own: Reg,
    next: Reg,
    /// Whether this is warpgroup 0.
    leader: Reg,
    /// Whether this is not the last warpgroup of the turn order.
    not_last: Reg,
    /// Threads meeting at each barrier of the array.
    threads: u32,
}

impl Sm90a<'_, '_> {
    /// The set-up before the roles split ([`Sched::setup`]): one thread inits every
    /// mbarrier, the inits are fenced, and the CTA (or cluster) meets.
    fn setup(&mut self) -> Result<(), CodegenError> {
        let s = self.v.s;
        for &op in &s.setup {
            match op {
                Op::InitBarriers => {
                    let bars: Vec<BarrierId> = s.barriers.iter().map(|(h, _)| h).collect();
                    self.v.init_barriers(self.e, &bars);
                }
                Op::FenceBarrierInit => self.e.ins("fence.mbarrier_init.release.cluster"),
                Op::CtaSync | Op::ClusterSync => self.v.setup_barrier(self.e, op),
                other => return Err(self.v.misplaced(self.e, other, "in the set-up")),
            }
        }
        Ok(())
    }
}
