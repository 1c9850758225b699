//! The attention schedule's MMA warp: its lane 0 runs its role's program over the CTA's
//! pairs of tiles, issuing `S_g = Q_g K^T` from shared-memory descriptors and `O_g += P_g V`
//! with A (`P_g`) read from TMEM, each committed to its barrier; the reconverged warp frees
//! TMEM after the last tile.
//!
//! The tcgen05.mmas of one thread execute in issue order (PTX ISA, tcgen05 memory
//! consistency: they form one pipeline; FlashAttention-4 relies on the same), so `S_g` of the
//! next iteration, written over the `P_g` the previous `O_g += P_g V` reads, is issued after
//! it and needs no wait of its own. (Not checked on hardware: no Blackwell here.)

use kiln_ir::sched::tmem::TmemMma;
use kiln_ir::sched::{MmaPart, Op, Role};

use super::Parts;
use crate::CodegenError;
use crate::sm90a::Cursor;
use crate::types::{Class, Reg};
use crate::writer::Writer;

/// Registers the MMA thread's ops read.
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
    pub(super) fn write_attention_mma(
        &mut self,
        p: &Parts,
        mma: &Role,
    ) -> Result<(), CodegenError> {
        let (head, tail) = (self.part(p, MmaPart::Head)?, self.part(p, MmaPart::Tail)?);
        let (base, _) = self.attention_tmem(p);
        let (other, join) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!(
            "setp.ne.u32 {other}, {}, {}",
            self.tid,
            32 * mma.first_warp
        ));
        self.ins(format!("@{other} bra {join}"));
        let [s_idesc, o_idesc, it] = [(); 3].map(|_| self.new_reg(Class::B32));
        self.ins(format!("mov.u32 {s_idesc}, 0x{:08X}", head.idesc));
        self.ins(format!("mov.u32 {o_idesc}, 0x{:08X}", tail.idesc));
        self.ins(format!("mov.u32 {it}, 0"));
        let r = MmaRegs {
            base,
            s_idesc,
            o_idesc,
            it,
            accumulate: self.new_reg(Class::Pred),
        };
        let prog = &mma.program;
        let mut c = self.cursor(p.s, &prog.iteration);
        let pair = self.open_pair(p, &mut c)?;
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        for &op in &prog.tile {
            self.mma_step(p, &c, &r, op)?;
        }
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        self.ins(format!("setp.ne.s32 {}, {iv}, {lo}", r.accumulate));
        for &op in &prog.iteration {
            self.mma_step(p, &c, &r, op)?;
        }
        self.advance(&c, p.s.stages);
        self.ins(format!("add.u32 {it}, {it}, 1"));
        self.close_counted_loop(&counted);
        for &op in prog.drain.iter().chain(&prog.release).chain(&prog.end) {
            self.mma_step(p, &c, &r, op)?;
        }
        self.close_pair(&pair, &c);
        // The exit's waits by the thread that ran the tiles, the rest by the whole warp.
        let waits = prog
            .exit
            .iter()
            .take_while(|op| matches!(op, Op::Wait { .. }))
            .count();
        for &op in &prog.exit[..waits] {
            self.attn_wait(p, op, r.it, &c, false)?;
        }
        self.label(&join);
        self.ins("bar.warp.sync -1");
        for &op in &prog.exit[waits..] {
            match op {
                Op::TmemDealloc { columns } => self.ins(format!(
                    "tcgen05.dealloc.cta_group::1.sync.aligned.b32 {}, {columns}",
                    r.base
                )),
                other => self.attn_common(p, other)?,
            }
        }
        Ok(())
    }

    /// The operands of mma `part`.
    fn part<'s>(&self, p: &Parts<'s>, part: MmaPart) -> Result<&'s TmemMma, CodegenError> {
        p.tmem.mma(part).ok_or_else(|| {
            self.internal(
                p.id,
                format!("an attention schedule without its {part:?} mma"),
            )
        })
    }

    /// One op of the MMA thread's per-tile or per-iteration program.
    fn mma_step(&mut self, p: &Parts, c: &Cursor, r: &MmaRegs, op: Op) -> Result<(), CodegenError> {
        let s = p.s;
        match op {
            Op::Wait { .. } => self.attn_wait(p, op, r.it, c, false)?,
            Op::Tcgen05Commit { bar, .. } => {
                let a = self.bar_addr(s, bar, c.stage, p.id)?;
                self.tcgen05_commit(a);
            }
            Op::Tcgen05Mma {
                part: MmaPart::Head,
                tile,
            } => {
                let mma = self.part(p, MmaPart::Head)?;
                let q = s
                    .loads
                    .iter()
                    .find(|(h, l)| s.once(*h) && l.work_tile == tile)
                    .map(|(_, l)| l.tma.offset);
                let (Some(q), Some(qd), Some((_, k)), Some(col)) =
                    (q, &mma.a, s.ring_loads().next(), p.column("S", tile))
                else {
                    return Err(self.internal(p.id, "an S mma without its operands"));
                };
                let qa = self.new_reg(Class::B32);
                self.ins(format!("add.u32 {qa}, {}, {q}", self.smem));
                let ka = self.stage_address(c.stage, k.tma.stage_stride, k.tma.offset);
                let d = self.new_reg(Class::B32);
                self.ins(format!("add.u32 {d}, {}, {col}", r.base));
                for (step, (&sq, &sk)) in qd.steps.iter().zip(&mma.b.steps).enumerate() {
                    let (a, b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                    self.ins(format!("add.u32 {a}, {qa}, {sq}"));
                    self.ins(format!("add.u32 {b}, {ka}, {sk}"));
                    let da = self.descriptor(a, qd.template);
                    let db = self.descriptor(b, mma.b.template);
                    let enable = if step == 0 { "0" } else { "1" };
                    self.ins(format!(
                        "tcgen05.mma.cta_group::1.kind::f16 [{d}], {da}, {db}, {}, {enable}",
                        r.s_idesc
                    ));
                }
            }
            Op::Tcgen05Mma {
                part: MmaPart::Tail,
                tile,
            } => {
                let mma = self.part(p, MmaPart::Tail)?;
                let (Some((_, v)), Some(o), Some(sc)) = (
                    s.ring_loads().nth(1),
                    p.column("O", tile),
                    p.column("S", tile),
                ) else {
                    return Err(self.internal(p.id, "an O mma without its operands"));
                };
                let va = self.stage_address(c.stage, v.tma.stage_stride, v.tma.offset);
                let d = self.new_reg(Class::B32);
                self.ins(format!("add.u32 {d}, {}, {o}", r.base));
                for (step, &sv) in mma.b.steps.iter().enumerate() {
                    // P's k16 step `step`: 16 bf16 of a row, two a 32-bit column (the lower
                    // key in the low half; see the softmax's store).
                    let (a, b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                    self.ins(format!("add.u32 {a}, {}, {}", r.base, sc + 8 * step as u32));
                    self.ins(format!("add.u32 {b}, {va}, {sv}"));
                    let db = self.descriptor(b, mma.b.template);
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
            other => self.attn_common(p, other)?,
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
