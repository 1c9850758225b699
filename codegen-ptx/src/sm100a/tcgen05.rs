//! The MMA warp's program: its iteration program issued by one thread as
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

use kiln_ir::sched::{MmaPart, Op, Role, Sched};

use super::{Around, peer_role};
use crate::CodegenError;
use crate::sm90a::{Cursor, named};
use crate::types::{Class, Reg};
use crate::writer::Writer;

impl Writer<'_> {
    /// The MMA warp after the address is published: its elected lane 0 runs the per-tile
    /// program over the work tiles and the exit's wait (it alone knows how many tiles ran);
    /// the reconverged warp runs the rest of the exit (the dealloc is warp-wide).
    pub(super) fn write_mma_warp(
        &mut self,
        s: &Sched,
        mma: &Role,
        around: &Around,
    ) -> Result<(), CodegenError> {
        let id = s.for_op;
        let base = self.tmem_address(s)?;
        let (other, join) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!(
            "setp.ne.u32 {other}, {}, {}",
            self.tid,
            32 * mma.first_warp
        ));
        // The 2-SM form: the peer's MMA warp issues nothing; it only frees its columns.
        let peer = match (s.cluster.as_ref().and_then(|c| c.pair), peer_role(s)) {
            (Some(p), Some(role)) => {
                let (rank, peer) = (self.cluster_rank(), self.new_reg(Class::Pred));
                self.ins(format!("setp.ne.u32 {peer}, {rank}, {}", p.leader));
                self.ins(format!("or.pred {other}, {other}, {peer}"));
                Some((peer, role))
            }
            _ => None,
        };
        self.ins(format!("@{other} bra {join}"));
        let mut c = self.cursor(s, &mma.program.iteration);
        let (tl, bounds) = self.enter_tile(s, around, &mut c, true)?;
        let p = &mma.program;
        for &op in &p.tile {
            self.mma_op(s, &c, op, base)?;
        }
        if !p.iteration.is_empty() {
            self.write_tcgen05_mainloop(s, mma, &c, base, bounds)?;
        }
        for &op in p.drain.iter().chain(&p.release).chain(&p.end) {
            self.mma_op(s, &c, op, base)?;
        }
        self.leave_tile(tl, &c);
        let Some((&Op::Wait { bar, start, .. }, rest)) = p.exit.split_first() else {
            return Err(self.internal(id, "an MMA warp exit that does not wait for the epilogue"));
        };
        self.wait(s, &c, bar, start, true)?;
        self.label(&join);
        self.ins("bar.warp.sync -1");
        // The peer's warp runs its own exit, the leader's its role's.
        let peer_exit = match peer {
            Some((p, role)) => {
                let (own, done) = (self.new_label(), self.new_label());
                self.ins(format!("@{p} bra {own}"));
                Some((own, done, role))
            }
            None => None,
        };
        for &op in rest {
            self.tmem_op(s, op, base)?;
        }
        if let Some((own, done, role)) = peer_exit {
            self.ins(format!("bra.uni {done}"));
            self.label(&own);
            for &op in &role.program.exit {
                self.tmem_op(s, op, base)?;
            }
            self.label(&done);
        }
        Ok(())
    }

    /// One op of the MMA thread outside its loop: a wait on the epilogue's hand-back, the
    /// accumulator's commit, a fence.
    fn mma_op(&mut self, s: &Sched, c: &Cursor, op: Op, base: Reg) -> Result<(), CodegenError> {
        match op {
            Op::Wait { bar, start, .. } => self.wait(s, c, bar, start, false),
            Op::Tcgen05Commit { bar, .. } => {
                let a = self.bar_addr(s, bar, c.stage, s.for_op)?;
                self.commit(s, a);
                Ok(())
            }
            other => self.tmem_op(s, other, base),
        }
    }

    /// The MMA role's iteration program over the tile's loop iterations, from one thread; the
    /// cursor `c` goes on from tile to tile.
    fn write_tcgen05_mainloop(
        &mut self,
        s: &Sched,
        mma: &Role,
        c: &Cursor,
        acc: Reg,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let id = s.for_op;
        let body = s
            .tmem
            .as_ref()
            .and_then(|t| t.mma(MmaPart::Body))
            .ok_or_else(|| self.internal(id, "a tcgen05 ring without its mma"))?;
        let idesc = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {idesc}, 0x{:08X}", body.idesc));
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        // The tile's first mma overwrites the accumulator; every later one accumulates.
        let accumulate = self.new_reg(Class::Pred);
        self.ins(format!("setp.ne.s32 {accumulate}, {iv}, {lo}"));
        for &op in &mma.program.iteration {
            match op {
                Op::Wait { bar, start, .. } => self.wait(s, c, bar, start, false)?,
                Op::Tcgen05Mma {
                    part: MmaPart::Body,
                    ..
                } => self.issue_tcgen05(s, c, acc, idesc, accumulate)?,
                // The pipeline pass releases the stage just read (lag 0): the commit's arrival
                // already waits for the mmas reading it.
                Op::Tcgen05Commit { bar, lag: 0 } => {
                    let a = self.bar_addr(s, bar, c.stage, id)?;
                    self.commit(s, a);
                }
                other => {
                    return Err(self.internal(
                        id,
                        format!("`{}` in a tcgen05 ring program", named(s, other)),
                    ));
                }
            }
        }
        self.advance(c, s.stages);
        self.close_counted_loop(&counted);
        Ok(())
    }

    /// The stage's mmas: K / 16 `tcgen05.mma`s, A and B from their stage's descriptors; the
    /// first accumulates when `accumulate` holds.
    fn issue_tcgen05(
        &mut self,
        s: &Sched,
        c: &Cursor,
        acc: Reg,
        idesc: Reg,
        accumulate: Reg,
    ) -> Result<(), CodegenError> {
        let id = s.for_op;
        let loads: Vec<_> = s.ring_loads().map(|(_, l)| &l.tma).collect();
        let ([a, b], Some(mma)) = (
            &loads[..],
            s.tmem.as_ref().and_then(|t| t.mma(MmaPart::Body)),
        ) else {
            return Err(self.internal(id, "a tcgen05 ring without its two loads"));
        };
        let (Some(da_t), db_t) = (&mma.a, &mma.b) else {
            return Err(self.internal(id, "a tcgen05 ring reading A from tensor memory"));
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
        for (k, (&sa, &sb)) in da_t.steps.iter().zip(&db_t.steps).enumerate() {
            let (at_a, at_b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
            self.ins(format!("add.u32 {at_a}, {}, {sa}", bases[0]));
            self.ins(format!("add.u32 {at_b}, {}, {sb}", bases[1]));
            let da = self.descriptor(at_a, da_t.template);
            let db = self.descriptor(at_b, db_t.template);
            let enable = if k == 0 {
                accumulate.to_string()
            } else {
                "1".to_string()
            };
            let group = cta_group(s);
            self.ins(format!(
                "tcgen05.mma.{group}.kind::f16 [{acc}], {da}, {db}, {idesc}, {enable}"
            ));
        }
        Ok(())
    }

    /// `tcgen05.commit`: one arrival on the mbarrier at `bar` once every earlier tcgen05 op of
    /// this thread has completed; in the 2-SM form on the barrier at the same offset of every
    /// CTA its commit mask names.
    pub(super) fn commit(&mut self, s: &Sched, bar: Reg) {
        let group = cta_group(s);
        match s
            .cluster
            .as_ref()
            .and_then(|c| c.pair)
            .map(|p| p.commit_mask)
        {
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

/// The `.cta_group` of every tcgen05 op of the kernel: `::2` in the 2-SM form, whose
/// allocation, mmas and commits act for both CTAs of the pair.
pub(super) fn cta_group(s: &Sched) -> &'static str {
    match s.cluster.as_ref().and_then(|c| c.pair) {
        Some(_) => "cta_group::2",
        None => "cta_group::1",
    }
}
