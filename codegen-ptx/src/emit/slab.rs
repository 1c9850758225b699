//! Register tiles read ahead through per-thread rings in shared memory
//! ([`kiln_ir::schedule::ThreadSlab`], the `prefetch` pass): each thread copies the elements
//! of its own registers with `cp.async` in runs of the width its vector loads take, and later
//! reads them back. A warp whose runs are all inside the tensor and aligned copies them
//! without any per-element work; on an edge a run not whole is read at once, zeros outside
//! the tensor, and stored to the ring. A run under 4 bytes (16-bit elements no vector holds)
//! is always copied so, `cp.async` moving no fewer.

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
        let edges = self.edge_runs(&plan, w);
        for (k, (&(ro, co, _), e)) in plan.runs.iter().zip(&edges).enumerate() {
            let addr = plan.rows[&ro].0;
            let (off, slot) = (co * esize, k as u32 * stride);
            if let Some(cache) = copy {
                self.ins(format!(
                    "@{} cp.async.{cache}.shared.global [{mine}+{slot}], [{addr}+{off}], {run}",
                    e.whole
                ));
            }
            // The run's elements inside the tensor now, zeros elsewhere.
            let zero = if ty == "f32" { "0f00000000" } else { "0" };
            let xs: Vec<Reg> = (0..w)
                .map(|_| {
                    let x = self.new_reg(Class::of(dtype));
                    self.ins(format!("mov.{ty} {x}, {zero}"));
                    x
                })
                .collect();
            if copy.is_none() {
                self.ins(format!(
                    "@{} ld.{space}.{ty} {}, [{addr}+{off}]",
                    e.whole, xs[0]
                ));
            }
            for (j, (x, p)) in xs.iter().zip(&e.parts).enumerate() {
                self.ins(format!(
                    "@{p} ld.{space}.{ty} {x}, [{addr}+{}]",
                    off + j as u32 * esize
                ));
            }
            let (words, word_ty) = if esize == 2 && w >= 2 {
                (self.pack(&xs), "b32")
            } else {
                (xs, ty)
            };
            let guard = match copy {
                Some(_) => format!("@!{} ", e.whole),
                None => String::new(),
            };
            self.ins(format!(
                "{guard}st.shared{} [{mine}+{slot}], {}",
                vec_suffix(words.len(), word_ty),
                reg_list(&words)
            ));
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
