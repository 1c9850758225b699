//! The attention schedule's correction warpgroup: per iteration and Q tile it reads its rows'
//! rescale factors from shared memory, waits for the previous `O += P V`, and rescales `O`
//! in TMEM (`tcgen05.ld`, multiply, `tcgen05.st`, 32 columns at a time) unless every factor
//! of the warp is 1 (FlashAttention-4's conditional rescale; exact, see
//! `kiln_ir::tmem::attention`) or the tile's first iteration has no product yet; then it
//! hands `O` to the MMA thread.

use kiln_ir::tmem::ACC_ROWS;
use kiln_ir::tmem::attention::AttnStep;

use super::Parts;
use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::Writer;

impl Writer<'_> {
    /// The correction warpgroup (see the module doc).
    pub(super) fn write_correction(&mut self, p: &Parts) -> Result<(), CodegenError> {
        let plan = &p.plan;
        let (_, lanes) = self.attention_tmem(plan);
        let row = self.new_reg(Class::B32);
        self.ins(format!("and.b32 {row}, {}, {}", self.tid, ACC_ROWS - 1));
        let it = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {it}, 0"));
        let mut c = self.cursor(&[]);
        let pair = self.open_pair(p, &mut c)?;
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        let first = self.new_reg(Class::Pred);
        self.ins(format!("setp.eq.s32 {first}, {iv}, {lo}"));
        let (mut factor, mut o_at, mut regs) = (None, None, Vec::<Reg>::new());
        let (mut skip, mut copy_at) = (None, None);
        for &s in &plan.correction_iteration {
            match s {
                AttnStep::Wait { lag, .. } => {
                    // The previous iteration's phase: none in the tile's first.
                    let after = (lag > 0).then(|| self.new_label());
                    if let Some(l) = &after {
                        self.ins(format!("@{first} bra.uni {l}"));
                    }
                    self.attn_wait(plan, s, it, &c, true)?;
                    if let Some(l) = after {
                        self.label(&l);
                    }
                }
                AttnStep::LoadScale { tile } => {
                    let (a, f) = (self.new_reg(Class::B32), self.new_reg(Class::F32));
                    self.ins(format!("mad.lo.u32 {a}, {row}, 4, {}", self.smem));
                    self.ins(format!(
                        "ld.shared.f32 {f}, [{a}+{}]",
                        plan.scale_slot(tile)
                    ));
                    factor = Some(f);
                }
                AttnStep::BeginRescale { tile } => {
                    let f = factor
                        .ok_or_else(|| self.internal(p.id, "a rescale before its factors"))?;
                    let (unit, all, none) = (
                        self.new_reg(Class::Pred),
                        self.new_reg(Class::Pred),
                        self.new_reg(Class::Pred),
                    );
                    self.ins(format!("setp.eq.f32 {unit}, {f}, 0f3F800000"));
                    self.ins(format!("vote.sync.all.pred {all}, {unit}, 0xffffffff"));
                    self.ins(format!("or.pred {none}, {all}, {first}"));
                    let l = self.new_label();
                    self.ins(format!("@{none} bra.uni {l}"));
                    skip = Some(l);
                    let at = self.new_reg(Class::B32);
                    self.ins(format!(
                        "add.u32 {at}, {lanes}, {}",
                        plan.tiles[tile as usize].o
                    ));
                    o_at = Some(at);
                }
                AttnStep::LoadO {
                    column, columns, ..
                } => {
                    let at = o_at.ok_or_else(|| self.internal(p.id, "a copy outside a rescale"))?;
                    let a = self.new_reg(Class::B32);
                    self.ins(format!("add.u32 {a}, {at}, {column}"));
                    regs = self.tmem_load(a, columns);
                    copy_at = Some(a);
                }
                AttnStep::ScaleO { .. } => {
                    let f = factor
                        .ok_or_else(|| self.internal(p.id, "a rescale before its factors"))?;
                    for r in &regs {
                        self.ins(format!("mul.f32 {r}, {r}, {f}"));
                    }
                }
                AttnStep::StoreO { .. } => {
                    let a = copy_at
                        .take()
                        .ok_or_else(|| self.internal(p.id, "a store before its copy"))?;
                    self.tmem_store(a, &regs);
                }
                AttnStep::EndRescale => {
                    let l = skip
                        .take()
                        .ok_or_else(|| self.internal(p.id, "a rescale closed twice"))?;
                    self.label(&l);
                }
                other => self.attn_common(plan, other)?,
            }
        }
        self.ins(format!("add.u32 {it}, {it}, 1"));
        self.close_counted_loop(&counted);
        self.close_pair(&pair, &c);
        Ok(())
    }
}
