//! The attention schedule's correction warpgroup: per iteration and Q tile it reads its rows'
//! rescale factors from shared memory, waits for the previous `O += P V`, and rescales `O`
//! in TMEM (`tcgen05.ld`, multiply, `tcgen05.st`, 32 columns at a time) unless every factor
//! of the warp is 1 (FlashAttention-4's conditional rescale; exact, see
//! `kiln_ir::tmem::attention`) or the tile's first iteration has no product yet; then it
//! hands `O` to the MMA thread.

use kiln_ir::sched::tmem::ACC_ROWS;
use kiln_ir::sched::{Op, Role};

use super::Parts;
use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::Writer;

impl Writer<'_> {
    /// The correction warpgroup (see the module doc).
    pub(super) fn write_correction(&mut self, p: &Parts, role: &Role) -> Result<(), CodegenError> {
        let (_, lanes) = self.attention_tmem(p);
        let row = self.new_reg(Class::B32);
        self.ins(format!("and.b32 {row}, {}, {}", self.tid, ACC_ROWS - 1));
        let it = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {it}, 0"));
        let mut c = self.cursor(p.s, &[]);
        let pair = self.open_pair(p, &mut c)?;
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        let first = self.new_reg(Class::Pred);
        self.ins(format!("setp.eq.s32 {first}, {iv}, {lo}"));
        let (mut factor, mut o_at, mut regs) = (None, None, Vec::<Reg>::new());
        let (mut skip, mut copy_at) = (None, None);
        for &op in &role.program.iteration {
            match op {
                Op::Wait { lag, .. } => {
                    // The previous iteration's phase: none in the tile's first.
                    let after = (lag > 0).then(|| self.new_label());
                    if let Some(l) = &after {
                        self.ins(format!("@{first} bra.uni {l}"));
                    }
                    self.attn_wait(p, op, it, &c, true)?;
                    if let Some(l) = after {
                        self.label(&l);
                    }
                }
                Op::FactorLoad { tile } => {
                    let (a, f) = (self.new_reg(Class::B32), self.new_reg(Class::F32));
                    self.ins(format!("mad.lo.u32 {a}, {row}, 4, {}", self.smem));
                    self.ins(format!("ld.shared.f32 {f}, [{a}+{}]", p.factors(tile)));
                    factor = Some(f);
                }
                Op::RescaleBegin { tile } => {
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
                    let o = p
                        .column("O", tile)
                        .ok_or_else(|| self.internal(p.id, "a rescale of no O tile"))?;
                    let at = self.new_reg(Class::B32);
                    self.ins(format!("add.u32 {at}, {lanes}, {o}"));
                    o_at = Some(at);
                }
                Op::TmemLoad {
                    column, columns, ..
                } => {
                    let at = o_at.ok_or_else(|| self.internal(p.id, "a copy outside a rescale"))?;
                    let a = self.new_reg(Class::B32);
                    self.ins(format!("add.u32 {a}, {at}, {column}"));
                    regs = self.tmem_load(a, columns);
                    copy_at = Some(a);
                }
                Op::Rescale { .. } => {
                    let f = factor
                        .ok_or_else(|| self.internal(p.id, "a rescale before its factors"))?;
                    for r in &regs {
                        self.ins(format!("mul.f32 {r}, {r}, {f}"));
                    }
                }
                Op::TmemStore { .. } => {
                    let a = copy_at
                        .take()
                        .ok_or_else(|| self.internal(p.id, "a store before its copy"))?;
                    self.tmem_store(a, &regs);
                }
                Op::RescaleEnd => {
                    let l = skip
                        .take()
                        .ok_or_else(|| self.internal(p.id, "a rescale closed twice"))?;
                    self.label(&l);
                }
                other => self.attn_common(p, other)?,
            }
        }
        self.ins(format!("add.u32 {it}, {it}, 1"));
        self.close_counted_loop(&counted);
        self.close_pair(&pair, &c);
        Ok(())
    }
}
