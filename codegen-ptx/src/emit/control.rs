//! Structured control flow: `for` loops (with their cp.async software pipeline) and `if`.
//! Carried values and branch results live in registers allocated here and assigned by
//! `mov` at each `yield`.

use kiln_ir::{Block, Op, OpId, OpKind, ValueId};

use super::{Emitter, Lower, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// The registers and labels of a counted loop between [`Emitter::open_counted_loop`] and
/// [`Emitter::close_counted_loop`].
pub(crate) struct CountedLoop {
    /// The induction variable.
    iv: Reg,
    /// The exclusive upper bound.
    hi: Reg,
    /// The increment.
    step: Reg,
    /// The label at the top of the body.
    top: String,
    /// The label after the loop.
    end: String,
    /// The predicate the entry and back-edge tests write.
    more: Reg,
}

impl Emitter<'_> {
    /// Fresh registers shaped like `v`.
    pub(crate) fn fresh_like(&mut self, v: &Val, at: OpId) -> Result<Val, CodegenError> {
        match v {
            Val::Scalar(r) => Ok(Val::Scalar(self.new_reg(r.class))),
            Val::Tile(rs) => Ok(Val::Tile(
                rs.iter().map(|r| self.new_reg(r.class)).collect(),
            )),
            Val::Affine { offs, .. } => Ok(Val::Tile(
                offs.iter().map(|_| self.new_reg(Class::B32)).collect(),
            )),
            Val::Smem { .. } | Val::Narrowed { .. } | Val::Packed(_) | Val::Lazy(_) => {
                Err(self.unsupported(at, "a shared-memory or packed tile carried or merged"))
            }
        }
    }

    /// Copies `src` into the registers of `dst`.
    pub(crate) fn assign(&mut self, dst: &Val, src: &Val, at: OpId) -> Result<(), CodegenError> {
        match (dst, src) {
            (Val::Scalar(d), Val::Scalar(s)) if d != s => self.mov(*d, *s),
            (Val::Scalar(_), Val::Scalar(_)) => {}
            (Val::Tile(d), Val::Tile(s)) if d.len() == s.len() => {
                for (d, s) in d.iter().zip(s) {
                    if d != s {
                        self.mov(*d, *s);
                    }
                }
            }
            _ => return Err(self.internal(at, "carried value changes shape")),
        }
        Ok(())
    }

    /// Copies `values` into `dsts`; through temporaries when a source is one of the
    /// destinations (a loop yielding its arguments in another order).
    pub(crate) fn assign_all(
        &mut self,
        dsts: &[Val],
        values: &[ValueId],
        at: OpId,
    ) -> Result<(), CodegenError> {
        let mut srcs = Vec::new();
        for &v in values {
            srcs.push(self.in_registers(v, at)?);
        }
        // Moving in order is only wrong when a source is the destination of another move.
        let dst_regs: Vec<Reg> = dsts.iter().flat_map(regs_of).collect();
        let src_regs: Vec<Reg> = srcs.iter().flat_map(regs_of).collect();
        let overlap = src_regs
            .iter()
            .enumerate()
            .any(|(i, r)| dst_regs.iter().enumerate().any(|(j, d)| i != j && d == r));
        let srcs = if overlap {
            let mut tmps = Vec::new();
            for s in &srcs {
                let t = self.fresh_like(s, at)?;
                self.assign(&t, s, at)?;
                tmps.push(t);
            }
            tmps
        } else {
            srcs
        };
        for (d, s) in dsts.iter().zip(&srcs) {
            self.assign(d, s, at)?;
        }
        Ok(())
    }

    /// Binds a counted loop's body arguments before its first iteration: a new induction
    /// variable set to `lo`, and fresh registers for every carried value set to its initial
    /// value (fresh even when the initial value is already in registers, because the body
    /// updates them in place: a wgmma accumulates into its own registers). Returns the
    /// induction variable and the carried registers, in operand order.
    pub(crate) fn enter_loop(
        &mut self,
        id: OpId,
        op: &Op,
        body: &Block,
        lo: Reg,
    ) -> Result<(Reg, Vec<Val>), CodegenError> {
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        self.vals.insert(body.args[0], Val::Scalar(iv));
        let mut carried = Vec::new();
        for (i, &init) in op.operands[3..].iter().enumerate() {
            carried.push(self.carry(init, body.args[1 + i], id)?);
        }
        Ok((iv, carried))
    }

    /// The registers of a value a loop carries (see [`Emitter::enter_loop`]): fresh ones set
    /// to its initial value `init`, bound to the body's argument `arg`.
    pub(crate) fn carry(
        &mut self,
        init: ValueId,
        arg: ValueId,
        at: OpId,
    ) -> Result<Val, CodegenError> {
        let v = self.in_registers(init, at)?;
        let c = self.fresh_like(&v, at)?;
        self.assign(&c, &v, at)?;
        self.vals.insert(arg, c.clone());
        Ok(c)
    }

    /// Opens a counted loop over `iv` (already set to its start): skips the loop when
    /// `iv >= hi`, then places the label at the top of the body. The body is bottom-tested,
    /// closed by [`Emitter::close_counted_loop`].
    pub(crate) fn open_counted_loop(&mut self, iv: Reg, hi: Reg, step: Reg) -> CountedLoop {
        let (top, end, more) = (
            self.new_label(),
            self.new_label(),
            self.new_reg(Class::Pred),
        );
        self.ins(format!("setp.ge.s32 {more}, {iv}, {hi}"));
        self.ins(format!("@{more} bra {end}"));
        self.label(&top);
        CountedLoop {
            iv,
            hi,
            step,
            top,
            end,
            more,
        }
    }

    /// Closes a counted loop: `iv += step`, back to the top while `iv < hi`, then the label
    /// after the loop.
    pub(crate) fn close_counted_loop(&mut self, l: &CountedLoop) {
        self.ins(format!("add.s32 {0}, {0}, {1}", l.iv, l.step));
        self.ins(format!("setp.lt.s32 {}, {}, {}", l.more, l.iv, l.hi));
        self.ins(format!("@{} bra {}", l.more, l.top));
        self.label(&l.end);
    }

    /// Writes a counted loop: `iv = lo; while iv < hi { body; iv += step }`.
    pub(crate) fn write_for(
        &mut self,
        id: OpId,
        lower: &mut dyn Lower,
    ) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let body = op.regions[0].clone();
        let (lo, hi, step) = (
            self.scalar(op.operands[0], id)?,
            self.scalar(op.operands[1], id)?,
            self.scalar(op.operands[2], id)?,
        );
        let (iv, carried) = self.enter_loop(id, &op, &body, lo)?;
        let pipeline = self.pipeline_prologue(id, iv, step, lower)?;
        let counted = self.open_counted_loop(iv, hi, step);
        self.pipeline_iteration(&pipeline, iv, step, lower)?;
        self.write_block(&body, lower)?;
        let yields = self.yielded(&body);
        self.assign_all(&carried, &yields, id)?;
        self.pipeline_advance(&pipeline, lower)?;
        self.close_counted_loop(&counted);
        self.pipeline_epilogue(&pipeline);
        for (r, c) in op.results.iter().zip(carried) {
            self.vals.insert(*r, c);
        }
        Ok(())
    }

    /// The values `block`'s terminating `yield` passes on (none when it has no `yield`,
    /// which the verifier rejects for regions).
    pub(crate) fn yielded(&self, block: &Block) -> Vec<ValueId> {
        block
            .ops
            .last()
            .filter(|&&y| self.k.ops[y].kind == OpKind::Yield)
            .map(|&y| self.k.ops[y].operands.clone())
            .unwrap_or_default()
    }

    /// Writes `if cond { then } else { else }`, both branches assigning the results.
    pub(crate) fn write_if(&mut self, id: OpId, lower: &mut dyn Lower) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let cond = self.scalar(op.operands[0], id)?;
        let (else_l, end) = (self.new_label(), self.new_label());
        let mut results: Option<Vec<Val>> = None;
        self.ins(format!("@!{cond} bra {else_l}"));
        for (i, region) in op.regions.iter().enumerate() {
            if i == 1 {
                self.label(&else_l);
            }
            self.write_block(region, lower)?;
            let yields = self.yielded(region);
            if results.is_none() {
                let mut rs = Vec::new();
                for &y in &yields {
                    let v = self.val(y, id)?;
                    rs.push(self.fresh_like(&v, id)?);
                }
                results = Some(rs);
            }
            let rs = results.clone().unwrap_or_default();
            self.assign_all(&rs, &yields, id)?;
            if i == 0 {
                self.ins(format!("bra.uni {end}"));
            }
        }
        if op.regions.len() < 2 {
            self.label(&else_l);
        }
        self.label(&end);
        for (r, v) in op.results.iter().zip(results.unwrap_or_default()) {
            self.vals.insert(*r, v);
        }
        Ok(())
    }
}

fn regs_of(v: &Val) -> Vec<Reg> {
    match v {
        Val::Scalar(r) => vec![*r],
        Val::Tile(rs) => rs.clone(),
        Val::Affine { base, .. } => vec![*base],
        Val::Smem { .. } | Val::Narrowed { .. } | Val::Packed(_) | Val::Lazy(_) => Vec::new(),
    }
}
