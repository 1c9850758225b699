//! The MMA warp's iteration program issued by one thread as
//! `tcgen05.mma.cta_group::1.kind::f16` (ptx-notes §7) into the TMEM accumulator, every stage
//! released by `tcgen05.commit` to its `empty` barrier (an arrival once the mmas reading it
//! complete). In the 2-SM form (`kiln_ir::sched::cluster::Pair`) only the leader CTA's thread
//! issues, every tcgen05 op is `cta_group::2` (ptxas rejects a kernel that mixes the two),
//! and each commit multicasts its arrival to both CTAs.
//!
//! Each stage is `K / 16` mmas; the shared-memory descriptors are the schedule's templates
//! with the start address of each k16 step, so A (K-major) and B (K- or MN-major) are read
//! where TMA wrote them. The first mma of a tile's loop overwrites the accumulator
//! (enable-input-d false: it starts as zeros), every later one accumulates.

use std::fmt::Display;

use kiln_ir::sched::tmem::Descriptor;
use kiln_ir::sched::{MmaPart, Op, Role};

use super::{Sm100a, cta_group};
use crate::error::CodegenError;
use crate::sched::{self, Cursor};
use crate::types::{Class, Reg};

impl Sm100a<'_, '_> {
    /// The MMA role's iteration program over the tile's loop iterations, from one thread; the
    /// cursor `c` goes on from tile to tile.
    pub(super) fn mainloop(
        &mut self,
        mma: &Role,
        c: &Cursor,
        acc: Reg,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let id = self.v.for_op();
        let body = self
            .tmem
            .mma(MmaPart::Body)
            .ok_or_else(|| self.e.internal(id, "a tcgen05 ring without its mma"))?;
        let e = &mut *self.e;
        let idesc = e.new_reg(Class::B32);
        e.ins(format!("mov.u32 {idesc}, 0x{:08X}", body.idesc));
        let iv = e.new_reg(Class::B32);
        e.mov(iv, lo);
        let counted = e.open_counted_loop(iv, hi, step);
        // The tile's first mma overwrites the accumulator; every later one accumulates.
        let accumulate = e.setp("ne.s32", iv, lo);
        for &op in &mma.program.iteration {
            match op {
                Op::Wait { .. } => self.v.wait(self.e, c, op, None, false)?,
                Op::Tcgen05Mma {
                    part: MmaPart::Body,
                    ..
                } => self.issue(c, acc, idesc, accumulate)?,
                // The pipeline pass releases the stage just read (lag 0): the commit's arrival
                // already waits for the mmas reading it.
                Op::Tcgen05Commit { bar, lag: 0 } => {
                    let a = self.v.bar_addr(self.e, bar, c.stage)?;
                    self.commit(a);
                }
                other => return Err(self.v.misplaced(self.e, other, "in a tcgen05 ring program")),
            }
        }
        self.v.advance(self.e, c);
        self.e.close_counted_loop(&counted);
        Ok(())
    }

    /// The stage's mmas: K / 16 `tcgen05.mma`s, A and B from their stage's descriptors; the
    /// first accumulates when `accumulate` holds.
    fn issue(
        &mut self,
        c: &Cursor,
        acc: Reg,
        idesc: Reg,
        accumulate: Reg,
    ) -> Result<(), CodegenError> {
        let (s, id) = (self.v.s, self.v.for_op());
        let loads: Vec<_> = s.ring_loads().map(|(_, l)| &l.tma).collect();
        let ([a, b], Some(mma)) = (&loads[..], self.tmem.mma(MmaPart::Body)) else {
            return Err(self.e.internal(id, "a tcgen05 ring without its two loads"));
        };
        let (Some(da_t), db_t) = (&mma.a, &mma.b) else {
            return Err(self
                .e
                .internal(id, "a tcgen05 ring reading A from tensor memory"));
        };
        let e = &mut *self.e;
        // The stage's data landed (the `full` wait): order the mmas after it.
        e.ins("tcgen05.fence::after_thread_sync");
        let bases = [a, b].map(|l| sched::stage_address(e, c.stage, l.stage_stride, l.offset));
        self.mma_steps(acc, bases, [da_t, db_t], idesc, accumulate);
        Ok(())
    }

    /// One `tcgen05.mma` per k16 step into the TMEM tile at `d`, A and B read from shared
    /// memory at `bases` through descriptors `descs`; the first step accumulates where
    /// `accumulate` holds (a predicate, or `0`), every later one does.
    pub(super) fn mma_steps(
        &mut self,
        d: Reg,
        bases: [Reg; 2],
        [da_t, db_t]: [&Descriptor; 2],
        idesc: Reg,
        accumulate: impl Display,
    ) {
        let group = cta_group(self.v.s);
        let e = &mut *self.e;
        for (k, (&sa, &sb)) in da_t.steps.iter().zip(&db_t.steps).enumerate() {
            let [at_a, at_b] = e.new_regs(Class::B32);
            e.ins(format!("add.u32 {at_a}, {}, {sa}", bases[0]));
            e.ins(format!("add.u32 {at_b}, {}, {sb}", bases[1]));
            let da = sched::descriptor(e, at_a, da_t.template);
            let db = sched::descriptor(e, at_b, db_t.template);
            let enable = if k == 0 {
                accumulate.to_string()
            } else {
                "1".to_string()
            };
            e.ins(format!(
                "tcgen05.mma.{group}.kind::f16 [{d}], {da}, {db}, {idesc}, {enable}"
            ));
        }
    }

    /// `tcgen05.commit`: one arrival on the mbarrier at `bar` once every earlier tcgen05 op of
    /// this thread has completed; in the 2-SM form on the barrier at the same offset of every
    /// CTA its commit mask names.
    pub(super) fn commit(&mut self, bar: Reg) {
        let s = self.v.s;
        let e = &mut *self.e;
        let group = cta_group(s);
        match s
            .cluster
            .as_ref()
            .and_then(|c| c.pair)
            .map(|p| p.commit_mask)
        {
            Some(m) => {
                let r = e.new_reg(Class::B16);
                e.ins(format!("mov.b16 {r}, {m}"));
                e.ins(format!(
                    "tcgen05.commit.{group}.mbarrier::arrive::one.shared::cluster.multicast::\
                     cluster.b64 [{bar}], {r}"
                ));
            }
            None => e.ins(format!(
                "tcgen05.commit.{group}.mbarrier::arrive::one.shared::cluster.b64 [{bar}]"
            )),
        }
    }
}
