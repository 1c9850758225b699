//! Tensor memory: the accumulator's allocation and its address's publication before the
//! roles split, the accumulator barriers, the epilogue's copy to registers (`tcgen05.ld`,
//! shape `32x32b`), on which it runs the code after the loop (whole, or chunk by chunk), and
//! the owner's `tcgen05.dealloc` (ptx-notes §7). Every step comes from the plan's programs
//! ([`kiln_ir::tmem::TmemStep`]).

use std::ops::Range;

use kiln_ir::OpId;
use kiln_ir::tmem::{AccBar, TmemPlan, TmemStep};

use super::Around;
use crate::CodegenError;
use crate::sm90a::persistent::scalar_only;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

/// A step of the MMA warp's tensor-memory set-up before the address is published.
pub(super) enum SetupStep {
    /// `tcgen05.alloc` of this many columns into the shared slot.
    Alloc(u32),
    /// `tcgen05.relinquish_alloc_permit`.
    Relinquish,
}

impl Writer<'_> {
    /// Before the ring's set-up (whose `bar.sync 0` publishes the address): thread 0 inits the
    /// accumulator barriers (fenced by the ring's `fence.mbarrier_init`), the MMA warp runs
    /// its steps before [`TmemStep::Publish`] (alloc into the shared slot, relinquish the
    /// permit), and every thread orders its tcgen05 ops before the barrier.
    pub(crate) fn write_tmem_setup(&mut self) -> Result<(), CodegenError> {
        if let Some(plan) = self.k.schedule.attention.clone() {
            return self.write_attention_setup(&plan);
        }
        let Some(plan) = self.k.schedule.tmem.clone() else {
            return Ok(());
        };
        let bars = [AccBar::Full, AccBar::Empty].map(|b| (plan.offset(b), plan.count(b)));
        let setup = plan.setup.iter().map_while(|s| match *s {
            TmemStep::Alloc { columns } => Some(Ok(SetupStep::Alloc(columns))),
            TmemStep::Relinquish => Some(Ok(SetupStep::Relinquish)),
            TmemStep::Publish => None,
            other => Some(Err(other.to_string())),
        });
        let setup = setup.collect::<Vec<_>>();
        self.write_tmem_alloc(
            plan.for_op,
            &bars,
            plan.roles.mma_warp,
            plan.slot_offset,
            setup,
        )
    }

    /// The set-up of a tensor-memory plan before the ring's barrier publishes the address:
    /// thread 0 inits `bars` (shared offset, count; fenced by the ring's
    /// `fence.mbarrier_init`), warp `mma_warp` runs `setup` (each step, or the text of one
    /// that has no place before the address is published) into the slot at `slot_offset`,
    /// and every thread orders its tcgen05 ops before the barrier.
    pub(super) fn write_tmem_alloc(
        &mut self,
        for_op: OpId,
        bars: &[(u32, u32)],
        mma_warp: u32,
        slot_offset: u32,
        setup: Vec<Result<SetupStep, String>>,
    ) -> Result<(), CodegenError> {
        let (not0, skip) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!("setp.ne.u32 {not0}, {}, 0", self.tid));
        self.ins(format!("@{not0} bra {skip}"));
        for &(offset, count) in bars {
            let a = self.shared_at(offset);
            self.ins(format!("mbarrier.init.shared::cta.b64 [{a}], {count}"));
        }
        self.label(&skip);
        let (warp, other, skip) = (
            self.new_reg(Class::B32),
            self.new_reg(Class::Pred),
            self.new_label(),
        );
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        self.ins(format!("setp.ne.u32 {other}, {warp}, {mma_warp}"));
        self.ins(format!("@{other} bra {skip}"));
        let slot = self.shared_at(slot_offset);
        for s in setup {
            match s {
                Ok(SetupStep::Alloc(columns)) => {
                    let group = self.cta_group();
                    self.ins(format!(
                        "tcgen05.alloc.{group}.sync.aligned.shared::cta.b32 [{slot}], {columns}"
                    ))
                }
                Ok(SetupStep::Relinquish) => {
                    let group = self.cta_group();
                    self.ins(format!(
                        "tcgen05.relinquish_alloc_permit.{group}.sync.aligned"
                    ))
                }
                Err(other) => {
                    return Err(self.internal(
                        for_op,
                        format!("`{other}` before the TMEM address is published"),
                    ));
                }
            }
        }
        self.label(&skip);
        self.ins("tcgen05.fence::before_thread_sync");
        Ok(())
    }

    /// The `.cta_group` of every tcgen05 op of the kernel: `::2` in the 2-SM form, whose
    /// allocation, mmas and commits act for both CTAs of the pair.
    pub(super) fn cta_group(&self) -> &'static str {
        match self.k.schedule.tmem.as_ref().and_then(|p| p.pair.as_ref()) {
            Some(_) => "cta_group::2",
            None => "cta_group::1",
        }
    }

    /// After the ring's set-up barrier: tcgen05 ops are ordered after it, so every role may
    /// read the address from the slot.
    pub(crate) fn write_tmem_publish(&mut self) {
        if self.k.schedule.tmem.is_some() || self.k.schedule.attention.is_some() {
            self.ins("tcgen05.fence::after_thread_sync");
        }
    }

    /// The accumulator's TMEM address (lane 0, column 0), read from the shared slot.
    pub(super) fn tmem_address(&mut self, plan: &TmemPlan) -> Reg {
        self.tmem_base(plan.slot_offset)
    }

    /// The TMEM base address (lane 0, column 0) the MMA warp published in the shared slot at
    /// `slot_offset`.
    pub(super) fn tmem_base(&mut self, slot_offset: u32) -> Reg {
        let slot = self.shared_at(slot_offset);
        let base = self.new_reg(Class::B32);
        self.ins(format!("ld.shared.b32 {base}, [{slot}]"));
        base
    }

    /// The shared address `offset` bytes into the kernel's dynamic shared memory.
    pub(super) fn shared_at(&mut self, offset: u32) -> Reg {
        let a = self.new_reg(Class::B32);
        self.ins(format!("add.u32 {a}, {}, {offset}", self.smem));
        a
    }

    /// Shared address of an accumulator barrier.
    pub(super) fn acc_bar(&mut self, plan: &TmemPlan, bar: AccBar) -> Reg {
        self.shared_at(plan.offset(bar))
    }

    /// A parity wait on an accumulator barrier (see [`Writer::acc_parity`]).
    pub(super) fn wait_acc(
        &mut self,
        plan: &TmemPlan,
        bar: AccBar,
        start: u32,
        parity: Option<Reg>,
        after: bool,
    ) {
        let phase = self.acc_parity(start, parity, after);
        let a = self.acc_bar(plan, bar);
        // The 2-SM form: each barrier hears the other CTA (the leader's commit, the peer's
        // hand-back).
        let scope = if plan.pair.is_some() {
            ".acquire.cluster"
        } else {
            ""
        };
        self.parity_wait_loop(scope, a, phase);
    }

    /// A step of the MMA warp or the epilogue that is the same for both and needs no phase
    /// (`base`: the accumulator's TMEM address).
    pub(super) fn tmem_step(
        &mut self,
        id: OpId,
        plan: &TmemPlan,
        s: TmemStep,
        base: Reg,
    ) -> Result<(), CodegenError> {
        match s {
            TmemStep::Arrive { bar } => {
                let a = self.acc_bar(plan, bar);
                let lane0 = self.lane0();
                match &plan.pair {
                    // The 2-SM form: both CTAs hand TMEM back to the leader's MMA thread.
                    Some(p) => {
                        let remote = self.new_reg(Class::B32);
                        self.ins(format!(
                            "mapa.shared::cluster.u32 {remote}, {a}, {}",
                            p.leader
                        ));
                        self.ins(format!(
                            "@{lane0} mbarrier.arrive.release.cluster.shared::cluster.b64 _, \
                             [{remote}]"
                        ));
                    }
                    None => self.ins(format!("@{lane0} mbarrier.arrive.shared::cta.b64 _, [{a}]")),
                }
            }
            TmemStep::ClusterSync => self.cluster_barrier(),
            TmemStep::FenceAfter => self.ins("tcgen05.fence::after_thread_sync"),
            TmemStep::FenceBefore => self.ins("tcgen05.fence::before_thread_sync"),
            TmemStep::WaitLoad => self.ins("tcgen05.wait::ld.sync.aligned"),
            TmemStep::Dealloc { columns } => {
                let group = self.cta_group();
                self.ins(format!(
                    "tcgen05.dealloc.{group}.sync.aligned.b32 {base}, {columns}"
                ))
            }
            TmemStep::Wait { .. }
            | TmemStep::Alloc { .. }
            | TmemStep::Relinquish
            | TmemStep::Publish
            | TmemStep::Mainloop
            | TmemStep::CommitAcc
            | TmemStep::Load { .. }
            | TmemStep::Read { .. } => {
                return Err(self.internal(id, format!("`{s}` outside its role")));
            }
        }
        Ok(())
    }

    /// The epilogue warps, per work tile: warp `w` copies TMEM lanes `32 (w % 4) ..` (its
    /// threads' rows) of its warpgroup's column block (columns `(w / 4) b ..`, `b` the plan's
    /// [`TmemPlan::block_columns`]) load by load, column `j` of the block into the `j`-th
    /// register, and at each [`TmemStep::Read`] runs the code after the loop on the columns
    /// it names ([`Writer::read_chunk`]). A loop that ran no iteration yields its initial
    /// value instead (no mma wrote the accumulator).
    pub(super) fn write_tmem_epilogue(
        &mut self,
        id: OpId,
        plan: &TmemPlan,
        around: &Around,
    ) -> Result<(), CodegenError> {
        let base = self.tmem_address(plan);
        let (warp, lanes) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        // TMEM address = (lane << 16) | column; warp w reaches lanes 32 (w % 4) .. + 31.
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        self.ins(format!("and.b32 {lanes}, {warp}, 3"));
        self.ins(format!("shl.b32 {lanes}, {lanes}, 21"));
        self.ins(format!("add.u32 {lanes}, {lanes}, {base}"));
        if plan.epilogue_warpgroups() > 1 {
            let group = self.new_reg(Class::B32);
            self.ins(format!("shr.u32 {group}, {warp}, 2"));
            self.ins(format!(
                "mad.lo.u32 {lanes}, {group}, {}, {lanes}",
                plan.block_columns()
            ));
        }
        let mut c = self.cursor(&[]);
        let (tl, [lo, hi, _]) = self.enter_tile(id, around, &mut c, false)?;
        let mut regs: Vec<Reg> = Vec::new();
        let mut first = true;
        for &s in &plan.epilogue {
            match s {
                TmemStep::Load { column, columns } => {
                    if column as usize != regs.len() {
                        return Err(self.internal(id, "TMEM loads out of column order"));
                    }
                    let dst: Vec<Reg> = (0..columns).map(|_| self.new_reg(Class::F32)).collect();
                    let at = self.new_reg(Class::B32);
                    self.ins(format!("add.u32 {at}, {lanes}, {column}"));
                    let list: Vec<String> = dst.iter().map(Reg::to_string).collect();
                    self.ins(format!(
                        "tcgen05.ld.sync.aligned.32x32b.x{columns}.b32 {{{}}}, [{at}]",
                        list.join(", ")
                    ));
                    regs.extend(dst);
                }
                TmemStep::Read { column, columns } => {
                    if columns < plan.block_columns() {
                        self.comment(&format!(
                            "the code after the loop on block columns {column}..{}",
                            column + columns
                        ));
                    }
                    let chunk = column..column + columns;
                    self.read_chunk(id, &regs, chunk, [lo, hi], &around.after, first)?;
                    first = false;
                }
                TmemStep::Wait { bar, start } => {
                    self.wait_acc(plan, bar, start, c.tile_parity, false);
                    // Lanes may leave the wait loop apart; the `.sync.aligned` copies after it
                    // need the whole warp.
                    self.ins("bar.warp.sync -1");
                }
                other => self.tmem_step(id, plan, other, base)?,
            }
        }
        self.leave_tile(tl, &c);
        self.finish_tma_stores()
    }

    /// Runs the code after the loop (`after`) on block columns `columns` of the copied
    /// registers `regs`: the ring `for`'s result is that chunk of them (of its initial value
    /// where the loop ran no iteration, `[lo, hi]` its bounds), and every tile whose layout
    /// holds the accumulator's columns has only the chunk's registers meanwhile
    /// ([`Writer::columns`]). The ops that compute only scalars are written with the `first`
    /// chunk alone; the later ones reuse their registers.
    fn read_chunk(
        &mut self,
        id: OpId,
        regs: &[Reg],
        columns: Range<u32>,
        [lo, hi]: [Reg; 2],
        after: &[OpId],
        first: bool,
    ) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (&[init], &[result]) = (&op.operands[3..], &op.results[..]) else {
            return Err(self.internal(id, "a tcgen05 ring loop carrying more than its accumulator"));
        };
        let init = self.tile(init, id)?;
        let range = columns.start as usize..columns.end as usize;
        let (Some(init), Some(regs)) = (init.get(range.clone()), regs.get(range)) else {
            return Err(self.internal(id, "a read of accumulator columns not copied"));
        };
        let (ran, skip) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!("setp.lt.s32 {ran}, {lo}, {hi}"));
        self.ins(format!("@{ran} bra {skip}"));
        for (&r, &i) in regs.iter().zip(init) {
            self.mov(r, i);
        }
        self.label(&skip);
        self.vals.insert(result, Val::Tile(regs.to_vec()));
        self.columns = Some(columns);
        // The tiles of another chunk have other registers.
        self.reg_index.clear();
        for &op in after {
            if self.k.ops[op].kind != kiln_ir::OpKind::Yield && (first || !scalar_only(self.k, op))
            {
                self.write_op(op)?;
            }
        }
        self.columns = None;
        Ok(())
    }
}
