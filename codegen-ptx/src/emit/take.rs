//! `take` ([`kiln_ir::OpKind::Take`]), a gather inside a register tile: every thread writes
//! its elements of the gathered tile at their row-major places in the kernel's shared
//! scratch region (as a `convert` does), and after a barrier reads each of its result
//! elements at the place its index names, or takes the fill value where the index is
//! outside the tile. One load per result register: the code grows with the per-thread
//! tile, not with the tile.

use kiln_ir::OpId;

use super::exchange::{linear, row_major_strides, scratch_bytes};
use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, mem_ty};

impl Emitter<'_> {
    /// Writes `take` along `dim`.
    pub(crate) fn write_take(&mut self, id: OpId, dim: usize) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let [x, idx, other] = op.operands[..] else {
            return Err(self.internal(id, "`take` takes a tile, indices and a fill value"));
        };
        let r = op.results[0];
        let dtype = self.k.ty(x).dtype();
        let esize = scratch_bytes(dtype);
        let strides = row_major_strides(self.k, x, id, self)?;
        let extent = self
            .k
            .ty(x)
            .shape()
            .and_then(|s| s.dims().get(dim).copied())
            .ok_or_else(|| self.internal(id, "`take` along a dimension the tile lacks"))?;
        let (src, dst) = (self.dist(x, id)?, self.dist(r, id)?);
        let other = self.scalar(other, id)?;

        self.comment("take: the tile through shared memory, read back at the indices");
        let elems = self.k.ty(x).shape().map_or(1, |s| s.numel() as u32);
        let (scratch, slot) = self.begin_exchange(id, elems * esize)?;
        let base = self.element_address(&src, &strides, esize, scratch);
        for offs in &src.regs {
            let e = self.elem(x, offs, id)?;
            self.store_scratch(dtype, base, linear(offs, &strides) * esize, e);
        }
        self.ins("bar.sync 0");
        // The thread's part of each result element's place, but along `dim`, which the
        // index gives.
        let mut across = dst.clone();
        if let Some(t) = across.terms.get_mut(dim) {
            t.clear();
        }
        let rows = self.element_address(&across, &strides, esize, scratch);
        let step = strides[dim] * esize;
        let ty = mem_ty(dtype);
        let mut out = Vec::with_capacity(dst.regs.len());
        for offs in &dst.regs {
            let i = self.elem(idx, offs, id)?;
            // Unsigned: a negative index is outside too.
            let inside = self.setp("lt.u32", i, extent);
            let mut fixed = offs.clone();
            fixed[dim] = 0;
            let at = linear(&fixed, &strides) * esize;
            let addr = self.new_reg(Class::B32);
            self.ins(format!("mad.lo.u32 {addr}, {i}, {step}, {rows}"));
            let v = self.new_reg(Class::of(dtype));
            self.mov(v, other);
            self.ins(format!("@{inside} ld.shared.{ty} {v}, [{addr}+{at}]"));
            out.push(v);
        }
        self.end_exchange(slot);
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }
}
