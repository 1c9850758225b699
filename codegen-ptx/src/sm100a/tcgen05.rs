//! The MMA warp's program: the ring's consumer program issued by one thread as
//! `tcgen05.mma.cta_group::1.kind::f16` (ptx-notes §7) into the TMEM accumulator, every stage
//! released by `tcgen05.commit` to its `empty` barrier (an arrival once the mmas reading it
//! complete), then the accumulator committed to `acc_full`; the whole warp frees TMEM last.
//! In the 2-SM form (`kiln_ir::cluster::Pair`) only the leader CTA's thread issues, every
//! tcgen05 op is `cta_group::2` (ptxas rejects a kernel that mixes the two), each commit
//! multicasts its arrival to both CTAs, and both MMA warps free their columns after a cluster
//! barrier.
//!
//! Each stage is `K / 16` mmas; the shared-memory descriptors are the plan's templates with
//! the start address of each k16 step, so A (K-major) and B (K- or MN-major) are read where
//! TMA wrote them. The first mma of a tile's loop overwrites the accumulator (enable-input-d
//! false: it starts as zeros), every later one accumulates.

use kiln_ir::OpId;
use kiln_ir::ring::{Ring, Step};
use kiln_ir::tmem::{AccBar, TmemPlan, TmemStep};

use super::Around;
use crate::CodegenError;
use crate::sm90a::Cursor;
use crate::types::{Class, Reg};
use crate::writer::Writer;

impl Writer<'_> {
    /// The MMA warp after the address is published: its elected lane 0 runs the per-tile
    /// program over the work tiles and the exit's wait (it alone knows how many tiles ran);
    /// the reconverged warp runs the rest of the exit (the dealloc is warp-wide).
    pub(super) fn write_mma_warp(
        &mut self,
        id: OpId,
        ring: &Ring,
        plan: &TmemPlan,
        around: &Around,
    ) -> Result<(), CodegenError> {
        let base = self.tmem_address(plan);
        let (other, join) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!(
            "setp.ne.u32 {other}, {}, {}",
            self.tid,
            32 * plan.roles.mma_warp
        ));
        // The 2-SM form: the peer's MMA warp issues nothing; it only frees its columns.
        let peer = match &plan.pair {
            Some(p) => {
                let (rank, peer) = (self.cluster_rank(), self.new_reg(Class::Pred));
                self.ins(format!("setp.ne.u32 {peer}, {rank}, {}", p.leader));
                self.ins(format!("or.pred {other}, {other}, {peer}"));
                Some((peer, p.peer_exit.clone()))
            }
            None => None,
        };
        self.ins(format!("@{other} bra {join}"));
        let mut c = self.cursor(&ring.consumer);
        let (tl, bounds) = self.enter_tile(id, around, &mut c, true)?;
        let parity = c.tile_parity;
        for &s in &plan.mma_tile {
            match s {
                TmemStep::Mainloop => {
                    self.write_tcgen05_mainloop(id, ring, plan, &c, base, bounds)?
                }
                TmemStep::CommitAcc => {
                    let bar = self.acc_bar(plan, AccBar::Full);
                    let mask = plan.pair.as_ref().map(|p| p.commit_mask);
                    self.commit(bar, mask);
                }
                TmemStep::Wait { bar, start } => self.wait_acc(plan, bar, start, parity, false),
                other => self.tmem_step(id, plan, other, base)?,
            }
        }
        self.leave_tile(tl, &c);
        let Some((&TmemStep::Wait { bar, start }, rest)) = plan.mma_exit.split_first() else {
            return Err(self.internal(id, "an MMA warp exit that does not wait for the epilogue"));
        };
        self.wait_acc(plan, bar, start, parity, true);
        self.label(&join);
        self.ins("bar.warp.sync -1");
        // The peer's warp runs its own exit, the leader's the plan's.
        let peer_exit = match peer {
            Some((p, steps)) => {
                let (own, done) = (self.new_label(), self.new_label());
                self.ins(format!("@{p} bra {own}"));
                Some((own, done, steps))
            }
            None => None,
        };
        for &s in rest {
            self.tmem_step(id, plan, s, base)?;
        }
        if let Some((own, done, steps)) = peer_exit {
            self.ins(format!("bra.uni {done}"));
            self.label(&own);
            for s in steps {
                self.tmem_step(id, plan, s, base)?;
            }
            self.label(&done);
        }
        Ok(())
    }

    /// The ring's consumer program over the tile's loop iterations, from one thread; the
    /// cursor `c` goes on from tile to tile.
    fn write_tcgen05_mainloop(
        &mut self,
        id: OpId,
        ring: &Ring,
        plan: &TmemPlan,
        c: &Cursor,
        acc: Reg,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let idesc = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {idesc}, 0x{:08X}", plan.idesc));
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        // The tile's first mma overwrites the accumulator; every later one accumulates.
        let accumulate = self.new_reg(Class::Pred);
        self.ins(format!("setp.ne.s32 {accumulate}, {iv}, {lo}"));
        for s in ring.consumer.clone() {
            match s {
                Step::Wait { bar, start } => self.wait(ring, c, bar, start)?,
                Step::Tcgen05Mma => {
                    self.issue_tcgen05(id, ring, plan, c, acc, idesc, accumulate)?
                }
                // The pipeline pass releases the stage just read (lag 0): the commit's arrival
                // already waits for the mmas reading it.
                Step::Tcgen05Commit { bar, lag: 0 } => {
                    let a = self.bar_addr(ring, bar, c.stage);
                    let mask = ring
                        .cluster
                        .as_ref()
                        .and_then(|c| c.pair)
                        .map(|p| p.commit_mask);
                    self.commit(a, mask);
                }
                other => {
                    return Err(self.internal(id, format!("`{other}` in a tcgen05 ring program")));
                }
            }
        }
        self.advance(c, ring.stages);
        self.close_counted_loop(&counted);
        Ok(())
    }

    /// The stage's mmas: K / 16 `tcgen05.mma`s, A and B from their stage's descriptors; the
    /// first accumulates when `accumulate` holds.
    #[allow(clippy::too_many_arguments)]
    fn issue_tcgen05(
        &mut self,
        id: OpId,
        ring: &Ring,
        plan: &TmemPlan,
        c: &Cursor,
        acc: Reg,
        idesc: Reg,
        accumulate: Reg,
    ) -> Result<(), CodegenError> {
        let [a, b] = &ring.loads[..] else {
            return Err(self.internal(id, "a tcgen05 ring without its two loads"));
        };
        // The stage's data landed (the `full` wait): order the mmas after it.
        self.ins("tcgen05.fence::after_thread_sync");
        let mut bases = Vec::new();
        for l in [a, b] {
            let base = self.new_reg(Class::B32);
            self.ins(format!(
                "mad.lo.u32 {base}, {}, {}, {}",
                c.stage, l.stage_stride, self.smem
            ));
            self.ins(format!("add.u32 {base}, {base}, {}", l.offset));
            bases.push(base);
        }
        for (s, (&sa, &sb)) in plan.a.steps.iter().zip(&plan.b.steps).enumerate() {
            let (at_a, at_b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
            self.ins(format!("add.u32 {at_a}, {}, {sa}", bases[0]));
            self.ins(format!("add.u32 {at_b}, {}, {sb}", bases[1]));
            let da = self.descriptor(at_a, plan.a.template);
            let db = self.descriptor(at_b, plan.b.template);
            let enable = if s == 0 {
                accumulate.to_string()
            } else {
                "1".to_string()
            };
            let group = self.cta_group();
            self.ins(format!(
                "tcgen05.mma.{group}.kind::f16 [{acc}], {da}, {db}, {idesc}, {enable}"
            ));
        }
        Ok(())
    }

    /// `tcgen05.commit`: one arrival on the mbarrier at `bar` once every earlier tcgen05 op of
    /// this thread has completed; with `mask` (the 2-SM form), on the barrier at the same
    /// offset of every CTA in it.
    fn commit(&mut self, bar: Reg, mask: Option<u16>) {
        let group = self.cta_group();
        match mask {
            Some(m) => {
                let r = self.new_reg(Class::B16);
                self.ins(format!("mov.b16 {r}, {m}"));
                self.ins(format!(
                    "tcgen05.commit.{group}.mbarrier::arrive::one.shared::cluster.multicast::\
                     cluster.b64 [{bar}], {r}"
                ));
            }
            None => self.ins(format!(
                "tcgen05.commit.{group}.mbarrier::arrive::one.shared::cluster.b64 [{bar}]"
            )),
        }
    }
}
