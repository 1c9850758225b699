//! The producer's program, the same on both families (TMA and mbarriers did not change on
//! Blackwell): per work tile its first `lead` iterations, its per-tile ops (the once
//! tiles), then its loop over the iterations, one elected thread issuing every box.

use kiln_ir::sched::{Op, Role};

use super::barrier::{Cursor, cluster_rank};
use super::view::View;
use crate::emit::{Emitter, Lower};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

impl View<'_> {
    /// The producer's side of the ring for one work tile with loop bounds `[lo, hi, step]`.
    /// A persistent producer issues the first iteration before the per-tile program (its
    /// stage is free before the consumers release the previous tile's once tiles).
    pub(crate) fn producer(
        &self,
        e: &mut Emitter<'_>,
        lower: &mut dyn Lower,
        producer: &Role,
        c: &Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let iv = e.new_reg(Class::B32);
        e.mov(iv, lo);
        for _ in 0..producer.program.lead {
            let skip = e.branch_if("ge.s32", iv, hi);
            self.producer_iteration(e, lower, producer, c, iv)?;
            e.ins(format!("add.s32 {iv}, {iv}, {step}"));
            e.label(&skip);
        }
        for &op in &producer.program.tile {
            self.producer_op(e, lower, c, op, iv)?;
        }
        let counted = e.open_counted_loop(iv, hi, step);
        self.producer_iteration(e, lower, producer, c, iv)?;
        e.close_counted_loop(&counted);
        Ok(())
    }

    /// One iteration of the producer's program, then the cursor moves on.
    pub(crate) fn producer_iteration(
        &self,
        e: &mut Emitter<'_>,
        lower: &mut dyn Lower,
        producer: &Role,
        c: &Cursor,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        for &op in &producer.program.iteration {
            self.producer_op(e, lower, c, op, iv)?;
        }
        self.advance(e, c);
        Ok(())
    }

    /// One op of the producer's program (`iv`: the iteration's induction variable).
    pub(crate) fn producer_op(
        &self,
        e: &mut Emitter<'_>,
        lower: &mut dyn Lower,
        c: &Cursor,
        op: Op,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        match op {
            Op::Wait { .. } => self.wait(e, c, op, None, false)?,
            Op::ExpectTx { bar, bytes } => {
                let a = self.bar_addr(e, bar, c.stage)?;
                // The 2-SM form: the leader announces the pair's bytes on its own `full`.
                let guard = match self.s.cluster.as_ref().and_then(|c| c.pair) {
                    Some(p) => {
                        let rank = cluster_rank(e);
                        format!("@{} ", e.setp("eq.u32", rank, p.leader))
                    }
                    None => String::new(),
                };
                e.ins(format!(
                    "{guard}mbarrier.arrive.expect_tx.shared::cta.b64 _, [{a}], {bytes}"
                ));
            }
            Op::Tma { load } => self.tma(e, lower, load, c, iv)?,
            Op::Arrive { bar, lag } => self.release(e, c, bar, lag, None, false)?,
            Op::FenceProxyAsync => e.ins("fence.proxy.async.shared::cta"),
            other => return Err(self.misplaced(e, other, "in the producer's program")),
        }
        Ok(())
    }
}
