//! Tensor memory: the accumulator's allocation and its address's publication before the
//! roles split, the accumulator barriers, the epilogue's copy to registers (`tcgen05.ld`,
//! shape `32x32b`), on which it runs the code after the loop (whole, or chunk by chunk), and
//! the owner's `tcgen05.dealloc` (ptx-notes §7). Every op comes from the role programs of
//! `kiln_ir::sched`.

use std::ops::Range;

use kiln_ir::OpId;
use kiln_ir::sched::{BarrierId, Op, Region, Role, RoleKind, Sched};

use super::Around;
use super::tcgen05::cta_group;
use crate::CodegenError;
use crate::sm90a::named;
use crate::sm90a::persistent::scalar_only;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

impl Writer<'_> {
    /// The set-up before the roles split ([`Sched::setup`]): thread 0 inits the barriers that
    /// hand tensor memory between the roles, the MMA warp allocates the columns into the
    /// shared slot and gives up the permit, every thread orders its tcgen05 ops before the
    /// set-up barrier; thread 0 inits the load ring's barriers (fenced with the others), the
    /// barrier publishes the address, and tcgen05 ops are ordered after it.
    pub(crate) fn write_tmem_setup(&mut self, s: &Sched) -> Result<(), CodegenError> {
        let ring = crate::sm90a::ring_barriers(s);
        let (ring_bars, tmem_bars): (Vec<BarrierId>, Vec<BarrierId>) = s
            .barriers
            .iter()
            .filter(|(_, b)| b.as_mbarrier().is_some())
            .map(|(h, _)| h)
            .partition(|h| ring.contains(h));
        let mma_warp = s
            .role(RoleKind::Mma)
            .map(|r| r.first_warp)
            .ok_or_else(|| self.internal(s.for_op, "an sm_100a schedule without its mma role"))?;
        let slot_offset = s
            .tmem
            .as_ref()
            .map(|t| t.slot_offset)
            .ok_or_else(|| self.internal(s.for_op, "an sm_100a schedule without TMEM"))?;
        // The MMA warp's ops, written as one block.
        let mut alloc: Option<String> = None;
        for (i, &op) in s.setup.iter().enumerate() {
            match op {
                Op::TmemAlloc { .. } | Op::TmemRelinquish => {
                    if alloc.is_none() {
                        let (warp, other, skip) = (
                            self.new_reg(Class::B32),
                            self.new_reg(Class::Pred),
                            self.new_label(),
                        );
                        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
                        self.ins(format!("setp.ne.u32 {other}, {warp}, {mma_warp}"));
                        self.ins(format!("@{other} bra {skip}"));
                        alloc = Some(skip);
                    }
                    let group = cta_group(s);
                    if let Op::TmemAlloc { columns } = op {
                        let slot = self.shared_at(slot_offset);
                        self.ins(format!(
                            "tcgen05.alloc.{group}.sync.aligned.shared::cta.b32 [{slot}], {columns}"
                        ));
                    } else {
                        self.ins(format!(
                            "tcgen05.relinquish_alloc_permit.{group}.sync.aligned"
                        ));
                    }
                    let next = s.setup.get(i + 1);
                    if !matches!(next, Some(Op::TmemAlloc { .. } | Op::TmemRelinquish))
                        && let Some(skip) = alloc.take()
                    {
                        self.label(&skip);
                    }
                }
                Op::InitBarriers => self.init_barriers(s, &tmem_bars),
                Op::Tcgen05FenceBefore => self.ins("tcgen05.fence::before_thread_sync"),
                Op::FenceBarrierInit => {
                    self.init_barriers(s, &ring_bars);
                    self.ins("fence.mbarrier_init.release.cluster");
                }
                Op::CtaSync => {
                    self.ins("bar.sync 0");
                    self.bind_once(s);
                }
                Op::ClusterSync => {
                    self.cluster_barrier();
                    self.bind_once(s);
                }
                Op::Tcgen05FenceAfter => self.ins("tcgen05.fence::after_thread_sync"),
                other => {
                    return Err(
                        self.internal(s.for_op, format!("`{}` in the set-up", named(s, other)))
                    );
                }
            }
        }
        Ok(())
    }

    /// The TMEM base address (lane 0, column 0) the MMA warp published in the shared slot.
    pub(super) fn tmem_address(&mut self, s: &Sched) -> Result<Reg, CodegenError> {
        let slot = s
            .tmem
            .as_ref()
            .map(|t| t.slot_offset)
            .ok_or_else(|| self.internal(s.for_op, "an sm_100a schedule without TMEM"))?;
        Ok(self.tmem_base(slot))
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

    /// An op of the MMA warp or the epilogue that is the same for both and needs no phase
    /// (`base`: the accumulator's TMEM address).
    pub(super) fn tmem_op(&mut self, s: &Sched, op: Op, base: Reg) -> Result<(), CodegenError> {
        match op {
            Op::Arrive { bar, .. } => {
                let a = self.bar_at(s, bar)?;
                let lane0 = self.lane0();
                match s.cluster.as_ref().and_then(|c| c.pair) {
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
            Op::ClusterSync => self.cluster_barrier(),
            Op::Tcgen05FenceAfter => self.ins("tcgen05.fence::after_thread_sync"),
            Op::Tcgen05FenceBefore => self.ins("tcgen05.fence::before_thread_sync"),
            Op::TmemWaitLoad => self.ins("tcgen05.wait::ld.sync.aligned"),
            Op::TmemDealloc { columns } => {
                let group = cta_group(s);
                self.ins(format!(
                    "tcgen05.dealloc.{group}.sync.aligned.b32 {base}, {columns}"
                ))
            }
            other => {
                return Err(
                    self.internal(s.for_op, format!("`{}` outside its role", named(s, other)))
                );
            }
        }
        Ok(())
    }

    /// The epilogue warps, per work tile: warp `w` copies TMEM lanes `32 (w % 4) ..` (its
    /// threads' rows) of its warpgroup's column block (columns `(w / 4) b ..`, `b` the
    /// accumulator's columns over the warpgroups) load by load, column `j` of the block into
    /// the `j`-th register, and at each [`Region::Epilogue`] runs the code after the loop on
    /// the columns it names ([`Writer::read_chunk`]). A loop that ran no iteration yields its
    /// initial value instead (no mma wrote the accumulator).
    pub(super) fn write_tmem_epilogue(
        &mut self,
        s: &Sched,
        epilogue: &Role,
        around: &Around,
    ) -> Result<(), CodegenError> {
        let id = s.for_op;
        let acc = s
            .tmem
            .as_ref()
            .and_then(|t| t.tiles.first())
            .copied()
            .ok_or_else(|| self.internal(id, "an sm_100a schedule without its accumulator"))?;
        let groups = epilogue.warps / 4;
        let block_columns = acc.columns / groups.max(1);
        let base = self.tmem_address(s)?;
        let (warp, lanes) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        // TMEM address = (lane << 16) | column; warp w reaches lanes 32 (w % 4) .. + 31.
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        self.ins(format!("and.b32 {lanes}, {warp}, 3"));
        self.ins(format!("shl.b32 {lanes}, {lanes}, 21"));
        self.ins(format!("add.u32 {lanes}, {lanes}, {base}"));
        if groups > 1 {
            let group = self.new_reg(Class::B32);
            self.ins(format!("shr.u32 {group}, {warp}, 2"));
            self.ins(format!(
                "mad.lo.u32 {lanes}, {group}, {block_columns}, {lanes}"
            ));
        }
        let mut c = self.cursor(s, &[]);
        let (tl, [lo, hi, _]) = self.enter_tile(s, around, &mut c, false)?;
        let mut regs: Vec<Reg> = Vec::new();
        let mut first = true;
        for &op in &epilogue.program.end {
            match op {
                Op::TmemLoad {
                    column, columns, ..
                } => {
                    if column as usize != regs.len() {
                        return Err(self.internal(id, "TMEM loads out of column order"));
                    }
                    let dst: Vec<Reg> = (0..columns).map(|_| self.new_reg(Class::F32)).collect();
                    let at = self.new_reg(Class::B32);
                    self.ins(format!("add.u32 {at}, {lanes}, {}", acc.column + column));
                    let list: Vec<String> = dst.iter().map(Reg::to_string).collect();
                    self.ins(format!(
                        "tcgen05.ld.sync.aligned.32x32b.x{columns}.b32 {{{}}}, [{at}]",
                        list.join(", ")
                    ));
                    regs.extend(dst);
                }
                Op::Run(Region::Epilogue(Some((column, columns)))) => {
                    if columns < block_columns {
                        self.comment(&format!(
                            "the code after the loop on block columns {column}..{}",
                            column + columns
                        ));
                    }
                    let chunk = column..column + columns;
                    self.read_chunk(id, &regs, chunk, [lo, hi], &around.after, first)?;
                    first = false;
                }
                Op::Wait { bar, start, .. } => {
                    self.wait(s, &c, bar, start, false)?;
                    // Lanes may leave the wait loop apart; the `.sync.aligned` copies after it
                    // need the whole warp.
                    self.ins("bar.warp.sync -1");
                }
                other => self.tmem_op(s, other, base)?,
            }
        }
        self.leave_tile(tl, &c);
        for &op in &epilogue.program.exit {
            match op {
                Op::BulkWaitAll => self.finish_tma_stores(s, &s.stores)?,
                Op::ClusterSync => {
                    self.comment("no CTA exits while the pair's mmas or copies may still use it");
                    self.cluster_barrier();
                }
                other => self.tmem_op(s, other, base)?,
            }
        }
        Ok(())
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
