//! sm_100a: the schedule IR's roles (`kiln_ir::sched`) as a Blackwell warp-specialised loop,
//! with the accumulators in tensor memory (`kiln_ir::sched::tmem`). A GEMM's block is its
//! epilogue warps, a TMA producer warp (as on sm_90a) and an MMA warp issuing `tcgen05.mma` from
//! shared-memory descriptors ([`mma`]); the epilogue warps copy each tile's accumulator out of
//! TMEM and run the kernel's code after the loop ([`roles`]) while the next tile's mmas run.
//! Attention's schedule: [`attention`]. The 2-SM form and the persistent walk:
//! `docs/targets.md`, sm_100a.

mod attention;
mod mma;
mod roles;
mod tmem;

use kiln_ir::OpId;
use kiln_ir::sched::tmem::Tmem;
use kiln_ir::sched::{BarrierId, Op, RoleKind, Sched};

use crate::emit::Emitter;
use crate::error::CodegenError;
use crate::sched::{Ops, View};
use crate::types::{Class, Reg};

/// Writes the roles of schedule `s` after the prologue (`grid`: a persistent kernel's
/// logical grid).
pub(crate) fn write<'k>(
    e: &mut Emitter<'k>,
    s: &'k Sched,
    grid: Option<[Reg; 3]>,
) -> Result<(), CodegenError> {
    let k = e.k;
    let v = View::new(k, s);
    let tmem = s
        .tmem
        .as_ref()
        .ok_or_else(|| e.internal(s.for_op, "an sm_100a schedule without TMEM"))?;
    let (before, after) = v.parts(e)?;
    let mut w = Sm100a {
        e,
        v,
        ops: Ops::new(s, grid, ()),
        tmem,
        before,
        after,
    };
    w.setup()?;
    if s.role(RoleKind::Softmax(0)).is_some() {
        return w.attention();
    }
    if !s.persistent() {
        // Written once, in every thread, before the roles split.
        for &op in &w.before {
            w.e.write_op(op, &mut w.ops)?;
        }
    }
    w.roles()
}

/// The sm_100a writer of a scheduled kernel.
struct Sm100a<'a, 'k> {
    /// The generic writer.
    e: &'a mut Emitter<'k>,
    /// The schedule.
    v: View<'k>,
    /// How the kernel's own ops are written where the programs run them.
    ops: Ops<'k>,
    /// The schedule's tensor memory.
    tmem: &'k Tmem,
    /// The ops before the ring loop: a role writes them per work tile of a persistent kernel;
    /// in another every thread writes them once, before the roles split.
    before: Vec<OpId>,
    /// The ops after the ring loop (the epilogue's code).
    after: Vec<OpId>,
}

impl Sm100a<'_, '_> {
    /// The set-up before the roles split ([`Sched::setup`]): thread 0 inits the barriers that
    /// hand tensor memory between the roles, the MMA warp allocates the columns into the
    /// shared slot and gives up the permit, every thread orders its tcgen05 ops before the
    /// set-up barrier; thread 0 inits the load ring's barriers (fenced with the others), the
    /// barrier publishes the address, and tcgen05 ops are ordered after it.
    fn setup(&mut self) -> Result<(), CodegenError> {
        let s = self.v.s;
        let (ring, handoffs): (Vec<BarrierId>, Vec<BarrierId>) = s
            .barriers
            .iter()
            .filter(|(_, b)| b.as_mbarrier().is_some())
            .map(|(h, _)| h)
            .partition(|&h| self.v.in_ring(h));
        let mma_warp = self.v.role(self.e, RoleKind::Mma)?.first_warp;
        // The MMA warp's ops, written as one block.
        let mut alloc: Option<String> = None;
        for (i, &op) in s.setup.iter().enumerate() {
            match op {
                Op::TmemAlloc { .. } | Op::TmemRelinquish => {
                    let e = &mut *self.e;
                    if alloc.is_none() {
                        let warp = e.new_reg(Class::B32);
                        e.ins(format!("shr.u32 {warp}, {}, 5", e.tid));
                        alloc = Some(e.branch_if("ne.u32", warp, mma_warp));
                    }
                    let group = cta_group(s);
                    if let Op::TmemAlloc { columns } = op {
                        let slot = shared_at(e, self.tmem.slot_offset);
                        e.ins(format!(
                            "tcgen05.alloc.{group}.sync.aligned.shared::cta.b32 [{slot}], {columns}"
                        ));
                    } else {
                        e.ins(format!(
                            "tcgen05.relinquish_alloc_permit.{group}.sync.aligned"
                        ));
                    }
                    let next = s.setup.get(i + 1);
                    if !matches!(next, Some(Op::TmemAlloc { .. } | Op::TmemRelinquish))
                        && let Some(skip) = alloc.take()
                    {
                        e.label(&skip);
                    }
                }
                Op::InitBarriers => self.v.init_barriers(self.e, &handoffs),
                Op::FenceBarrierInit => {
                    self.v.init_barriers(self.e, &ring);
                    self.e.ins("fence.mbarrier_init.release.cluster");
                }
                Op::CtaSync | Op::ClusterSync => self.v.setup_barrier(self.e, op),
                Op::Tcgen05FenceBefore | Op::Tcgen05FenceAfter => self.fence(op),
                other => return Err(self.v.misplaced(self.e, other, "in the set-up")),
            }
        }
        Ok(())
    }

    /// `tcgen05.fence::before_thread_sync` or `::after_thread_sync`.
    fn fence(&mut self, op: Op) {
        if op == Op::Tcgen05FenceBefore {
            self.e.ins("tcgen05.fence::before_thread_sync");
        } else {
            self.e.ins("tcgen05.fence::after_thread_sync");
        }
    }
}

/// The shared address `offset` bytes into the kernel's dynamic shared memory.
fn shared_at(e: &mut Emitter<'_>, offset: u32) -> Reg {
    let a = e.new_reg(Class::B32);
    e.ins(format!("add.u32 {a}, {}, {offset}", e.smem));
    a
}

/// The `.cta_group` of every tcgen05 op of the kernel: `::2` in the 2-SM form, whose
/// allocation, mmas and commits act for both CTAs of the pair.
fn cta_group(s: &Sched) -> &'static str {
    match s.cluster.as_ref().and_then(|c| c.pair) {
        Some(_) => "cta_group::2",
        None => "cta_group::1",
    }
}
