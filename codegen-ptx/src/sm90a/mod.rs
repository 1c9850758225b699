//! sm_90a: the schedule IR's roles (`kiln_ir::sched`) as a warp-specialised loop: the kernel's
//! consumer warps plus one producer warpgroup, which gives registers back at the ring's `for`
//! while one elected thread issues the TMA boxes; the consumers run the body with its `mma`s as
//! wgmmas ([`wgmma`]). Every op comes from the role programs `protocol_check` proved ([`roles`];
//! a rotated consumer program, [`rotated`]). A kernel without a ring keeps the generic writer's
//! code, with wgmma in program order where it applies ([`plain`]). Persistent and clustered
//! schedules: `docs/targets.md`, sm_90a.

mod descriptor;
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
