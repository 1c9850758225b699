//! Scalar atomics ([`OpKind::ScalarAtomic`]): one read-modify-write per block. Every thread
//! meets at a barrier (the block's earlier accesses are done, so a release by the applying
//! thread orders them all before it), thread 0 applies the atomic with the tile atomics'
//! instruction forms, and, where the old value is used, hands it to the others through the
//! kernel's shared scratch word with a second barrier (after which an acquire orders every
//! thread's later accesses after it).

use kiln_ir::{OpId, OpKind};

use super::access::{Element, atomic_form};
use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, mem_ty};

impl Emitter<'_> {
    /// Writes a scalar atomic.
    pub(crate) fn write_scalar_atomic(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let OpKind::ScalarAtomic {
            tensor,
            op: aop,
            sem,
            scope,
        } = op.kind
        else {
            return Err(self.internal(id, "not a scalar atomic"));
        };
        let dtype = self.k.params[tensor].dtype();
        let form = atomic_form(aop, dtype)
            .ok_or_else(|| self.internal(id, "an atomic the verifier should reject"))?;
        // The coordinates, then `cas`'s compare value, then the value.
        let rank = op
            .operands
            .len()
            .checked_sub(1 + usize::from(aop == kiln_ir::AtomicOp::Cas))
            .ok_or_else(|| self.internal(id, "malformed scalar atomic"))?;
        let coords = self.coord_regs(id, rank)?;
        let (cmp, v) = match op.operands[rank..] {
            [c, v] => (Some(self.scalar(c, id)?), self.scalar(v, id)?),
            [v] => (None, self.scalar(v, id)?),
            _ => return Err(self.internal(id, "malformed scalar atomic")),
        };
        let scratch = self
            .k
            .schedule
            .scratch
            .ok_or_else(|| self.internal(id, "a scalar atomic without scratch memory"))?;
        let r = op.results[0];
        let used = self.uses.get(&r).is_some_and(|u| !u.is_empty());

        self.comment("scalar atomic: once for the block, by thread 0");
        self.ins("bar.sync 0");
        let o = self.origin(tensor, &coords, 0, None, id)?;
        let inside = o
            .outer_ok
            .ok_or_else(|| self.internal(id, "a scalar atomic on a rank-0 tensor"))?;
        let first = self.setp("eq.u32", self.tid, 0);
        let on = self.new_reg(Class::Pred);
        self.ins(format!("and.pred {on}, {inside}, {first}"));
        let e = Element {
            addr: o.base,
            imm: 0,
            on,
        };
        let old = self.atomic_element(aop, form, (sem, scope), dtype, &e, v, cmp, used);
        if used {
            let addr = self.new_reg(Class::B32);
            self.ins(format!("add.u32 {addr}, {}, {}", self.smem, scratch.offset));
            let ty = mem_ty(dtype);
            self.ins(format!("@{first} st.shared.{ty} [{addr}], {old}"));
            self.ins("bar.sync 0");
            let x = self.new_reg(Class::of(dtype));
            self.ins(format!("ld.shared.{ty} {x}, [{addr}]"));
            // It wrote slot 0 after its own barrier, and read it after another.
            self.end_exchange(0);
            self.vals.insert(r, Val::Scalar(x));
        } else {
            self.vals.insert(r, Val::Scalar(old));
        }
        Ok(())
    }
}
