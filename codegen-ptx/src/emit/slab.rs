//! Register tiles read ahead through per-thread rings in shared memory
//! ([`kiln_ir::schedule::ThreadSlab`], the `prefetch` pass): each thread copies the elements
//! of its own registers with `cp.async` in runs of the width its vector loads take, and later
//! reads them back. A warp whose runs are all inside the tensor and aligned copies them
//! without any per-element work; on an edge a run inside and aligned is one copy, and any
//! other goes element by element: a 4-byte element is a copy of itself or of nothing (zeros),
//! a 16-bit one (which no copy moves alone) is read at once, zero outside the tensor, and
//! stored to the ring, in a loop over the run (its destination is memory, so the loop costs
//! a few instructions whatever the run's length).

use kiln_ir::{OpId, OpKind, ValueId};

use super::Emitter;
use super::vector::{reg_list, vec_suffix, vector_width};
use crate::error::CodegenError;
use crate::types::{Class, Reg, mem_ty};

impl Emitter<'_> {
    /// The thread's first run in the stage at `base`, the runs' bytes and the bytes between a
    /// thread's consecutive runs.
    fn slab_slots(&mut self, base: Reg, run: u32) -> (Reg, u32) {
        let threads = 32 * self.k.options.num_warps;
        let mine = self.new_reg(Class::B32);
        self.ins(format!("mad.lo.u32 {mine}, {}, {run}, {base}", self.tid));
        (mine, threads * run)
    }

    /// Issues the copies of load `id`'s tile at `coords` into the ring stage at `base`. Does
    /// not commit.
    pub(super) fn issue_thread_copy(
        &mut self,
        id: OpId,
        coords: &[Reg],
        base: Reg,
    ) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let OpKind::Load { tensor, .. } = op.kind else {
            return Err(self.internal(id, "a register ring of no load"));
        };
        let r = op.results[0];
        let dtype = self.k.ty(r).dtype();
        let d = self.dist(r, id)?;
        let w = vector_width(&d, dtype);
        let col_coord = *op
            .operands
            .last()
            .ok_or_else(|| self.internal(id, "a load without coordinates"))?;
        let plan = self.plan(tensor, coords, col_coord, None, &d, w, id)?;
        let esize = plan.esize;
        let run = w * esize;
        let (mine, stride) = self.slab_slots(base, run);
        let space = if self.read_only(tensor) {
            "global.nc"
        } else {
            "global"
        };
        let ty = mem_ty(dtype);
        // 16 bytes bypass L1 (`.cg`); 4 and 8 only go through it.
        let copy = (run >= 4).then_some(if run == 16 { "cg" } else { "ca" });
        let done = self.new_label();
        if let Some(cache) = copy {
            let edge = self.new_label();
            self.ins(format!("@!{} bra.uni {edge}", plan.fast));
            for (k, &(ro, co, _)) in plan.runs.iter().enumerate() {
                self.ins(format!(
                    "cp.async.{cache}.shared.global [{mine}+{}], [{}+{}], {run}",
                    k as u32 * stride,
                    plan.rows[&ro].0,
                    co * esize
                ));
            }
            self.ins(format!("bra.uni {done}"));
            self.label(&edge);
        }
        // Column predicates are made once, each before the first branch that could skip it
        // (later runs of other rows reuse them).
        let mut seen = std::collections::BTreeMap::new();
        for (k, &(ro, co, _)) in plan.runs.iter().enumerate() {
            let (addr, row_ok, _) = plan.rows[&ro];
            let (off, slot) = (co * esize, k as u32 * stride);
            let skip = self.new_label();
            let cols_ok: Vec<Reg> = if esize >= 4 {
                (co..co + w)
                    .map(|c| self.column_inside(&plan, c, &mut seen))
                    .collect()
            } else {
                Vec::new()
            };
            if let Some(cache) = copy {
                let whole = self.run_whole(&plan, (ro, co), w, &mut seen);
                self.ins(format!(
                    "@{whole} cp.async.{cache}.shared.global [{mine}+{slot}], [{addr}+{off}], {run}"
                ));
                self.ins(format!("@{whole} bra {skip}"));
            }
            if esize >= 4 {
                // A run not whole, element by element: each a copy of its 4 bytes, or of
                // none (zeros) outside the tensor.
                for (j, &col_ok) in (0..w).zip(&cols_ok) {
                    let inside = self.and(row_ok, Some(col_ok));
                    let n = self.new_reg(Class::B32);
                    self.ins(format!("selp.b32 {n}, 4, 0, {inside}"));
                    self.ins(format!(
                        "cp.async.ca.shared.global [{mine}+{}], [{addr}+{}], 4, {n}",
                        slot + j * 4,
                        off + j * 4
                    ));
                }
                self.label(&skip);
                continue;
            }
            // 16-bit elements of a run not whole, in a loop: read now, zero outside.
            let (e, top) = (self.new_reg(Class::B32), self.new_label());
            self.ins(format!("mov.u32 {e}, 0"));
            self.label(&top);
            let c = self.new_reg(Class::B32);
            self.ins(format!("add.s32 {c}, {}, {e}", plan.col0));
            self.ins(format!("add.s32 {c}, {c}, {co}"));
            let inside = self.in_bounds(c, plan.cols, Some(row_ok));
            let from = self.new_reg(Class::B64);
            self.ins(format!("mad.wide.u32 {from}, {e}, {esize}, {addr}"));
            let x = self.new_reg(Class::of(dtype));
            self.ins(format!("mov.{ty} {x}, 0"));
            self.ins(format!("@{inside} ld.{space}.{ty} {x}, [{from}+{off}]"));
            let to = self.new_reg(Class::B32);
            self.ins(format!("mad.lo.u32 {to}, {e}, {esize}, {mine}"));
            self.ins(format!("st.shared.{ty} [{to}+{slot}], {x}"));
            self.ins(format!("add.s32 {e}, {e}, 1"));
            let more = self.setp("lt.u32", e, w);
            self.ins(format!("@{more} bra {top}"));
            self.label(&skip);
        }
        self.label(&done);
        Ok(())
    }

    /// The registers of load `id`'s tile `r`, read back from the ring stage at `base` this
    /// thread copied them into.
    pub(super) fn read_thread_stage(
        &mut self,
        id: OpId,
        r: ValueId,
        base: Reg,
    ) -> Result<Vec<Reg>, CodegenError> {
        let dtype = self.k.ty(r).dtype();
        let d = self.dist(r, id)?;
        let w = vector_width(&d, dtype) as usize;
        let esize = dtype.size_bytes() as u32;
        let (mine, stride) = self.slab_slots(base, w as u32 * esize);
        let regs: Vec<Reg> = (0..d.regs.len())
            .map(|_| self.new_reg(Class::of(dtype)))
            .collect();
        let paired = esize == 2 && w >= 2;
        let words: Vec<Reg> = if paired {
            (0..regs.len() / 2)
                .map(|_| self.new_reg(Class::B32))
                .collect()
        } else {
            regs.clone()
        };
        let (per_run, word_ty) = if paired {
            (w / 2, "b32")
        } else {
            (w, mem_ty(dtype))
        };
        for (k, ws) in words.chunks(per_run).enumerate() {
            self.ins(format!(
                "ld.shared{} {}, [{mine}+{}]",
                vec_suffix(ws.len(), word_ty),
                reg_list(ws),
                k as u32 * stride
            ));
        }
        if paired {
            self.unpack(&words, &regs);
            if dtype == kiln_ir::DType::Bf16 {
                let fs: Vec<Reg> = (0..regs.len()).map(|_| self.new_reg(Class::F32)).collect();
                self.widen_words(&words, &fs);
                self.widened.extend(regs.iter().copied().zip(fs));
            }
        }
        Ok(regs)
    }
}
