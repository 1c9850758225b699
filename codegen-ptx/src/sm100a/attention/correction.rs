//! The attention schedule's correction warpgroup: per iteration and Q tile it reads its rows'
//! rescale factors from shared memory, waits for the previous `O += P V`, and rescales `O`
//! in TMEM (`tcgen05.ld`, multiply, `tcgen05.st`, 32 columns at a time) unless every factor
//! of the warp is 1 (FlashAttention-4's conditional rescale; exact, see
//! `kiln_ir::tmem::attention`) or the tile's first iteration has no product yet; then it
//! hands `O` to the MMA thread.

use kiln_ir::sched::tmem::ACC_ROWS;
use kiln_ir::sched::{Op, Role};

use crate::error::CodegenError;
use crate::sm100a::Sm100a;
use crate::types::{Class, Reg};

impl Sm100a<'_, '_> {
    /// The correction warpgroup (see the module doc).
    pub(super) fn correction(&mut self, role: &Role) -> Result<(), CodegenError> {
        let (base, lanes) = self.lanes();
        let row = self.e.new_reg(Class::B32);
        self.e
            .ins(format!("and.b32 {row}, {}, {}", self.e.tid, ACC_ROWS - 1));
        let it = self.e.new_reg(Class::B32);
        self.e.ins(format!("mov.u32 {it}, 0"));
        let mut c = self.v.cursor(self.e, &[]);
        let pair = self.open_pair(&mut c)?;
        let [lo, hi, step] = self.pair_bounds(&pair)?;
        let iv = self.e.new_reg(Class::B32);
        self.e.mov(iv, lo);
        let counted = self.e.open_counted_loop(iv, hi, step);
        let first = self.e.setp("eq.s32", iv, lo);
        let (mut factor, mut o_at, mut regs) = (None, None, Vec::<Reg>::new());
        let (mut skip, mut copy_at) = (None, None);
        for &op in &role.program.iteration {
            match op {
                Op::Wait { lag, .. } => {
                    // The previous iteration's phase: none in the tile's first.
                    let after = (lag > 0).then(|| self.e.new_label());
                    if let Some(l) = &after {
                        self.e.ins(format!("@{first} bra.uni {l}"));
                    }
                    self.warp_wait(op, Some(it), &c)?;
                    if let Some(l) = after {
                        self.e.label(&l);
                    }
                }
                Op::FactorLoad { tile } => {
                    let (a, f) = (self.e.new_reg(Class::B32), self.e.new_reg(Class::F32));
                    self.e
                        .ins(format!("mad.lo.u32 {a}, {row}, 4, {}", self.e.smem));
                    self.e
                        .ins(format!("ld.shared.f32 {f}, [{a}+{}]", self.factors(tile)));
                    factor = Some(f);
                }
                Op::RescaleBegin { tile } => {
                    let f = factor.ok_or_else(|| {
                        self.e
                            .internal(self.v.for_op(), "a rescale before its factors")
                    })?;
                    let unit = self.e.setp("eq.f32", f, "0f3F800000");
                    let [all, none] = self.e.new_regs(Class::Pred);
                    self.e
                        .ins(format!("vote.sync.all.pred {all}, {unit}, 0xffffffff"));
                    self.e.ins(format!("or.pred {none}, {all}, {first}"));
                    let l = self.e.new_label();
                    self.e.ins(format!("@{none} bra.uni {l}"));
                    skip = Some(l);
                    let o = self.column("O", tile)?;
                    let at = self.e.new_reg(Class::B32);
                    self.e.ins(format!("add.u32 {at}, {lanes}, {o}"));
                    o_at = Some(at);
                }
                Op::TmemLoad {
                    column, columns, ..
                } => {
                    let at = o_at.ok_or_else(|| {
                        self.e.internal(self.v.for_op(), "a copy outside a rescale")
                    })?;
                    let a = self.e.new_reg(Class::B32);
                    self.e.ins(format!("add.u32 {a}, {at}, {column}"));
                    regs = self.tmem_load(a, columns);
                    copy_at = Some(a);
                }
                Op::Rescale { .. } => {
                    let f = factor.ok_or_else(|| {
                        self.e
                            .internal(self.v.for_op(), "a rescale before its factors")
                    })?;
                    for r in &regs {
                        self.e.ins(format!("mul.f32 {r}, {r}, {f}"));
                    }
                }
                Op::TmemStore { .. } => {
                    let a = copy_at.take().ok_or_else(|| {
                        self.e.internal(self.v.for_op(), "a store before its copy")
                    })?;
                    self.tmem_store(a, &regs);
                }
                Op::RescaleEnd => {
                    let l = skip.take().ok_or_else(|| {
                        self.e.internal(self.v.for_op(), "a rescale closed twice")
                    })?;
                    self.e.label(&l);
                }
                other => self.tmem_op(other, base)?,
            }
        }
        self.e.ins(format!("add.u32 {it}, {it}, 1"));
        self.e.close_counted_loop(&counted);
        self.close_pair(&pair, &c);
        Ok(())
    }
}
