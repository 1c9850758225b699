//! The attention schedule's MMA warp: its lane 0 runs the plan's MMA programs over the CTA's
//! pairs of tiles, issuing `S_g = Q_g K^T` from shared-memory descriptors and `O_g += P_g V`
//! with A (`P_g`) read from TMEM, each committed to its barrier; the reconverged warp frees
//! TMEM after the last tile.
//!
//! The tcgen05.mmas of one thread execute in issue order (PTX ISA, tcgen05 memory
//! consistency: they form one pipeline; FlashAttention-4 relies on the same), so `S_g` of the
//! next iteration, written over the `P_g` the previous `O_g += P_g V` reads, is issued after
//! it and needs no wait of its own. (Not checked on hardware: no Blackwell here.)

use kiln_ir::tmem::attention::AttnStep;

use super::Parts;
use crate::CodegenError;
use crate::sm90a::Cursor;
use crate::types::{Class, Reg};
use crate::writer::Writer;

/// Registers the MMA thread's steps read.
struct MmaRegs {
    base: Reg,
    s_idesc: Reg,
    o_idesc: Reg,
    it: Reg,
    /// False in the tile's first iteration: its first PV mma overwrites `O_g`.
    accumulate: Reg,
}

impl Writer<'_> {
    /// The MMA warp (see the module doc).
    pub(super) fn write_attention_mma(&mut self, p: &Parts) -> Result<(), CodegenError> {
        let plan = &p.plan;
        let (base, _) = self.attention_tmem(plan);
        let (other, join) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!(
            "setp.ne.u32 {other}, {}, {}",
            self.tid,
            32 * plan.roles.mma_warp
        ));
        self.ins(format!("@{other} bra {join}"));
        let [s_idesc, o_idesc, it] = [(); 3].map(|_| self.new_reg(Class::B32));
        self.ins(format!("mov.u32 {s_idesc}, 0x{:08X}", plan.s_idesc));
        self.ins(format!("mov.u32 {o_idesc}, 0x{:08X}", plan.o_idesc));
        self.ins(format!("mov.u32 {it}, 0"));
        let r = MmaRegs {
            base,
            s_idesc,
            o_idesc,
            it,
            accumulate: self.new_reg(Class::Pred),
        };
        let mut c = self.cursor(&p.ring.consumer);
        let pair = self.open_pair(p, &mut c)?;
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        for &s in &plan.mma_tile {
            self.mma_step(p, &c, &r, s)?;
        }
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        self.ins(format!("setp.ne.s32 {}, {iv}, {lo}", r.accumulate));
        for &s in &plan.mma_iteration {
            self.mma_step(p, &c, &r, s)?;
        }
        self.advance(&c, p.ring.stages);
        self.ins(format!("add.u32 {it}, {it}, 1"));
        self.close_counted_loop(&counted);
        for &s in &plan.mma_tile_end {
            self.mma_step(p, &c, &r, s)?;
        }
        self.close_pair(&pair, &c);
        // The exit's waits by the thread that ran the tiles, the rest by the whole warp.
        let waits = plan
            .mma_exit
            .iter()
            .take_while(|s| matches!(s, AttnStep::Wait { .. }))
            .count();
        for &s in &plan.mma_exit[..waits] {
            self.attn_wait(plan, s, r.it, &c, false)?;
        }
        self.label(&join);
        self.ins("bar.warp.sync -1");
        for &s in &plan.mma_exit[waits..] {
            match s {
                AttnStep::Dealloc { columns } => self.ins(format!(
                    "tcgen05.dealloc.cta_group::1.sync.aligned.b32 {}, {columns}",
                    r.base
                )),
                other => self.attn_common(plan, other)?,
            }
        }
        Ok(())
    }

    /// One step of the MMA thread's per-tile or per-iteration program.
    fn mma_step(
        &mut self,
        p: &Parts,
        c: &Cursor,
        r: &MmaRegs,
        s: AttnStep,
    ) -> Result<(), CodegenError> {
        let plan = &p.plan;
        match s {
            AttnStep::RingWait { bar, start } => self.wait(&p.ring, c, bar, start)?,
            AttnStep::RingCommit { bar } => {
                let a = self.bar_addr(&p.ring, bar, c.stage);
                self.tcgen05_commit(a);
            }
            AttnStep::Wait { .. } => self.attn_wait(plan, s, r.it, c, false)?,
            AttnStep::Commit { bar } => {
                let a = self.attn_bar(plan, bar);
                self.tcgen05_commit(a);
            }
            AttnStep::MmaS { tile } => {
                let q = if tile == 0 {
                    p.ring.once[0].offset
                } else {
                    plan.q1_offset
                };
                let k = &p.ring.loads[0];
                let qa = self.new_reg(Class::B32);
                self.ins(format!("add.u32 {qa}, {}, {q}", self.smem));
                let ka = self.stage_address(c.stage, k.stage_stride, k.offset);
                let d = self.new_reg(Class::B32);
                self.ins(format!(
                    "add.u32 {d}, {}, {}",
                    r.base, plan.tiles[tile as usize].s
                ));
                for (step, (&sq, &sk)) in plan.q.steps.iter().zip(&plan.k.steps).enumerate() {
                    let (a, b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                    self.ins(format!("add.u32 {a}, {qa}, {sq}"));
                    self.ins(format!("add.u32 {b}, {ka}, {sk}"));
                    let da = self.descriptor(a, plan.q.template);
                    let db = self.descriptor(b, plan.k.template);
                    let enable = if step == 0 { "0" } else { "1" };
                    self.ins(format!(
                        "tcgen05.mma.cta_group::1.kind::f16 [{d}], {da}, {db}, {}, {enable}",
                        r.s_idesc
                    ));
                }
            }
            AttnStep::MmaO { tile } => {
                let cols = plan.tiles[tile as usize];
                let v = &p.ring.loads[1];
                let va = self.stage_address(c.stage, v.stage_stride, v.offset);
                let d = self.new_reg(Class::B32);
                self.ins(format!("add.u32 {d}, {}, {}", r.base, cols.o));
                for (step, &sv) in plan.v.steps.iter().enumerate() {
                    // P's k16 step `step`: 16 bf16 of a row, two a 32-bit column (the lower
                    // key in the low half; see the softmax's store).
                    let (a, b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                    self.ins(format!(
                        "add.u32 {a}, {}, {}",
                        r.base,
                        cols.s + 8 * step as u32
                    ));
                    self.ins(format!("add.u32 {b}, {va}, {sv}"));
                    let db = self.descriptor(b, plan.v.template);
                    let enable = if step == 0 {
                        r.accumulate.to_string()
                    } else {
                        "1".to_string()
                    };
                    self.ins(format!(
                        "tcgen05.mma.cta_group::1.kind::f16 [{d}], [{a}], {db}, {}, {enable}",
                        r.o_idesc
                    ));
                }
            }
            other => self.attn_common(plan, other)?,
        }
        Ok(())
    }

    /// Shared address of a ring load's stage `stage`.
    fn stage_address(&mut self, stage: Reg, stride: u32, offset: u32) -> Reg {
        let a = self.new_reg(Class::B32);
        self.ins(format!("mad.lo.u32 {a}, {stage}, {stride}, {}", self.smem));
        self.ins(format!("add.u32 {a}, {a}, {offset}"));
        a
    }

    /// `tcgen05.commit`: one arrival on the mbarrier at `bar` once every earlier tcgen05 op of
    /// this thread has completed.
    pub(super) fn tcgen05_commit(&mut self, bar: Reg) {
        self.ins(format!(
            "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [{bar}]"
        ));
    }
}
