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

use crate::error::CodegenError;
use crate::sched::{self, Cursor};
use crate::sm100a::Sm100a;
use crate::types::{Class, Reg};

/// Registers the MMA thread's ops read.
struct MmaRegs {
    base: Reg,
    s_idesc: Reg,
    o_idesc: Reg,
    it: Reg,
    /// False in the tile's first iteration: its first PV mma overwrites `O_g`.
    accumulate: Reg,
}

impl<'k> Sm100a<'_, 'k> {
    /// The MMA warp (see the module doc).
    pub(super) fn attention_mma(&mut self, mma: &Role) -> Result<(), CodegenError> {
        let (head, tail) = (self.part(MmaPart::Head)?, self.part(MmaPart::Tail)?);
        let (base, _) = self.lanes();
        let e = &mut *self.e;
        let join = e.branch_if("ne.u32", e.tid, 32 * mma.first_warp);
        let [s_idesc, o_idesc, it] = e.new_regs(Class::B32);
        e.ins(format!("mov.u32 {s_idesc}, 0x{:08X}", head.idesc));
        e.ins(format!("mov.u32 {o_idesc}, 0x{:08X}", tail.idesc));
        e.ins(format!("mov.u32 {it}, 0"));
        let r = MmaRegs {
            base,
            s_idesc,
            o_idesc,
            it,
            accumulate: e.new_reg(Class::Pred),
        };
        let prog = &mma.program;
        let mut c = self.v.cursor(self.e, &prog.iteration);
        let pair = self.open_pair(&mut c)?;
        let [lo, hi, step] = self.pair_bounds(&pair)?;
        for &op in &prog.tile {
            self.mma_step(&c, &r, op)?;
        }
        let iv = self.e.new_reg(Class::B32);
        self.e.mov(iv, lo);
        let counted = self.e.open_counted_loop(iv, hi, step);
        self.e
            .ins(format!("setp.ne.s32 {}, {iv}, {lo}", r.accumulate));
        for &op in &prog.iteration {
            self.mma_step(&c, &r, op)?;
        }
        self.v.advance(self.e, &c);
        self.e.ins(format!("add.u32 {it}, {it}, 1"));
        self.e.close_counted_loop(&counted);
        for &op in prog.drain.iter().chain(&prog.release).chain(&prog.end) {
            self.mma_step(&c, &r, op)?;
        }
        self.close_pair(&pair, &c);
        // The exit's waits by the thread that ran the tiles, the rest by the whole warp.
        let waits = prog
            .exit
            .iter()
            .take_while(|op| matches!(op, Op::Wait { .. }))
            .count();
        for &op in &prog.exit[..waits] {
            self.attn_wait(op, r.it, &c, false)?;
        }
        self.e.label(&join);
        self.e.ins("bar.warp.sync -1");
        for &op in &prog.exit[waits..] {
            self.tmem_op(op, r.base)?;
        }
        Ok(())
    }

    /// The operands of mma `part`.
    fn part(&self, part: MmaPart) -> Result<&'k TmemMma, CodegenError> {
        self.tmem.mma(part).ok_or_else(|| {
            self.e.internal(
                self.v.for_op(),
                format!("an attention schedule without its {part:?} mma"),
            )
        })
    }

    /// One op of the MMA thread's per-tile or per-iteration program.
    fn mma_step(&mut self, c: &Cursor, r: &MmaRegs, op: Op) -> Result<(), CodegenError> {
        let s = self.v.s;
        match op {
            Op::Wait { .. } => self.attn_wait(op, r.it, c, false)?,
            Op::Tcgen05Commit { bar, .. } => {
                let a = self.v.bar_addr(self.e, bar, c.stage)?;
                self.commit(a);
            }
            Op::Tcgen05Mma {
                part: MmaPart::Head,
                tile,
            } => {
                let mma = self.part(MmaPart::Head)?;
                let q = s
                    .loads
                    .iter()
                    .find(|(h, l)| s.once(*h) && l.work_tile == tile)
                    .map(|(_, l)| l.tma.offset);
                let col = self.column("S", tile)?;
                let (Some(q), Some(qd), Some((_, k))) = (q, &mma.a, s.ring_loads().next()) else {
                    return Err(self
                        .e
                        .internal(self.v.for_op(), "an S mma without its operands"));
                };
                let e = &mut *self.e;
                let qa = e.new_reg(Class::B32);
                e.ins(format!("add.u32 {qa}, {}, {q}", e.smem));
                let ka = sched::stage_address(e, c.stage, k.tma.stage_stride, k.tma.offset);
                let d = e.new_reg(Class::B32);
                e.ins(format!("add.u32 {d}, {}, {col}", r.base));
                self.mma_steps(d, [qa, ka], [qd, &mma.b], r.s_idesc, 0);
            }
            Op::Tcgen05Mma {
                part: MmaPart::Tail,
                tile,
            } => {
                let mma = self.part(MmaPart::Tail)?;
                let (o, sc) = (self.column("O", tile)?, self.column("S", tile)?);
                let Some((_, v)) = s.ring_loads().nth(1) else {
                    return Err(self
                        .e
                        .internal(self.v.for_op(), "an O mma without its operands"));
                };
                let e = &mut *self.e;
                let va = sched::stage_address(e, c.stage, v.tma.stage_stride, v.tma.offset);
                let d = e.new_reg(Class::B32);
                e.ins(format!("add.u32 {d}, {}, {o}", r.base));
                for (step, &sv) in mma.b.steps.iter().enumerate() {
                    // P's k16 step `step`: 16 bf16 of a row, two a 32-bit column (the lower
                    // key in the low half; see the softmax's store).
                    let (a, b) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
                    e.ins(format!("add.u32 {a}, {}, {}", r.base, sc + 8 * step as u32));
                    e.ins(format!("add.u32 {b}, {va}, {sv}"));
                    let db = sched::descriptor(e, b, mma.b.template);
                    let enable = if step == 0 {
                        r.accumulate.to_string()
                    } else {
                        "1".to_string()
                    };
                    e.ins(format!(
                        "tcgen05.mma.cta_group::1.kind::f16 [{d}], [{a}], {db}, {}, {enable}",
                        r.o_idesc
                    ));
                }
            }
            other => self.tmem_op(other, r.base)?,
        }
        Ok(())
    }
}
