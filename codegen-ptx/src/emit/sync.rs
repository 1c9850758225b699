//! Cross-thread communication: reductions (in-thread, then `shfl.sync.bfly` across the
//! lanes that share a row or column) and the cp.async software pipeline of `for` loops
//! (stage rings in shared memory, `cp.async.wait_group` + `bar.sync` per iteration).

use std::collections::BTreeMap;

use kiln_ir::{DType, OpId, OpKind, ReduceOp, ValueDef, ValueId};

use super::{Emitter, Lower, Pipeline, Ring, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg, half_ty};

/// Independent partial results per output element of a reduction within a thread.
const CHAINS: usize = 4;

impl Emitter<'_> {
    /// Writes `reduce.op x dim`: combine the registers of each output element, then
    /// butterfly-shuffle across the lanes holding the same output element.
    pub(crate) fn write_reduce(
        &mut self,
        id: OpId,
        rop: ReduceOp,
        dim: usize,
    ) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (x, r) = (op.operands[0], op.results[0]);
        let dtype = self.k.ty(x).dtype();
        // 16-bit floats accumulate in f32 (as the interpreter does) and round once at the end.
        let ty = match dtype {
            DType::F32 | DType::Bf16 | DType::F16 => "f32",
            DType::I32 => "s32",
            DType::U32 => "u32",
            DType::Bool => {
                return Err(self.unsupported(id, "a reduction of a bool tile"));
            }
        };
        let src = self.dist(x, id)?;
        let dst = self.dist(r, id)?;
        self.check_reduce(&src, &dst, dim, id)?;

        let combine = |w: &mut Self, a: Reg, b: Reg| {
            let d = w.new_reg(a.class);
            let name = match rop {
                ReduceOp::Max => "max",
                ReduceOp::Min => "min",
                ReduceOp::Sum => "add",
            };
            w.ins(format!("{name}.{ty} {d}, {a}, {b}"));
            d
        };
        // Each output element's registers are combined into `CHAINS` partial results in turn,
        // then those pairwise: a chain of n / CHAINS dependent ops instead of n (an online
        // softmax waits for its row maximum before any exponential). Elements are fetched one
        // at a time, so a fused (lazy) input is computed in place and never held whole.
        let mut partial: BTreeMap<Vec<u32>, Vec<Reg>> = BTreeMap::new();
        let mut seen: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
        for offs in &src.regs {
            let mut key = offs.clone();
            key.remove(dim);
            let x_k = self.elem(x, offs, id)?;
            let x_k = self.widen(x_k, dtype);
            let n = seen.entry(key.clone()).or_insert(0);
            let chains = partial.entry(key).or_default();
            match chains.get(*n % CHAINS).copied() {
                Some(a) => chains[*n % CHAINS] = combine(self, a, x_k),
                None => chains.push(x_k),
            }
            *n += 1;
        }
        let mut acc: BTreeMap<Vec<u32>, Reg> = BTreeMap::new();
        for (key, mut chains) in partial {
            while chains.len() > 1 {
                let mut next = Vec::with_capacity(chains.len().div_ceil(2));
                for p in chains.chunks(2) {
                    next.push(match *p {
                        [a, b] => combine(self, a, b),
                        _ => p[0],
                    });
                }
                chains = next;
            }
            if let Some(&v) = chains.first() {
                acc.insert(key, v);
            }
        }
        let (masks, warps) = src.reduction_stages(dim).ok_or_else(|| {
            self.unsupported(
                id,
                "a reduction over a lane group that is not a power of two, or one straddling \
                 lanes and warps",
            )
        })?;
        let mut out = Vec::with_capacity(dst.regs.len());
        for offs in &dst.regs {
            let mut key = offs.clone();
            if key.len() == src.regs.first().map_or(0, Vec::len) {
                key.remove(dim);
            }
            let mut v = *acc
                .get(&key)
                .ok_or_else(|| self.internal(id, "reduction output without input"))?;
            for &m in &masks {
                let o = self.new_reg(v.class);
                self.ins(format!("shfl.sync.bfly.b32 {o}, {v}, {m}, 31, -1"));
                v = combine(self, v, o);
            }
            out.push(v);
        }
        if !warps.is_empty() {
            let mut combine = combine;
            out = self.reduce_across_warps(id, &dst, &src.terms[dim], out, &mut combine)?;
        }
        if let Some(half) = half_ty(dtype) {
            out = out
                .into_iter()
                .map(|f| {
                    let h = self.new_reg(Class::B16);
                    self.ins(format!("cvt.rn.{half}.f32 {h}, {f}"));
                    h
                })
                .collect();
        }
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }

    /// Where shared memory written by this thread's generic-proxy stores (st.shared,
    /// completed cp.async) is next read by a wgmma, which reads through the async proxy:
    /// the writer's `fence.proxy.async`, before the barrier the readers wait at. Only in
    /// kernels with wgmmas outside a ring (`kiln_ir::passes::wgmma_plain`).
    pub(crate) fn async_proxy_fence(&mut self) {
        if !self.k.schedule.wgmma.is_empty() {
            self.ins("fence.proxy.async.shared::cta");
        }
    }

    /// The shared stage holding prefetched load `id` in the current iteration, if any.
    pub(crate) fn pipelined_stage(&self, id: OpId) -> Option<Reg> {
        self.stage_bases.get(&id).copied()
    }

    /// Before a pipelined loop: fills the first `stages - 1` stages.
    pub(crate) fn pipeline_prologue(
        &mut self,
        for_id: OpId,
        iv: Reg,
        step: Reg,
        lower: &mut dyn Lower,
    ) -> Result<Option<Pipeline>, CodegenError> {
        let Some(plan) = self.k.schedule.loops.get(&for_id).cloned() else {
            return Ok(None);
        };
        let mut loads = Vec::new();
        for &l in &plan.prefetched {
            let ring = match (self.k.schedule.buffer(l), self.k.schedule.slab(l)) {
                (Some(b), _) => Ring::Tile(b.clone()),
                (None, Some(b)) => Ring::Thread(b.clone()),
                (None, None) => return Err(self.internal(l, "prefetched load without a ring")),
            };
            loads.push((l, ring));
        }
        let p = Pipeline {
            iv: self.k.ops[for_id].regions[0].args[0],
            loads,
            stages: plan.stages,
            read: self.new_reg(Class::B32),
            write: self.new_reg(Class::B32),
        };
        self.ins(format!("mov.u32 {}, 0", p.read));
        self.ins(format!("mov.u32 {}, {}", p.write, p.stages - 1));
        // The loop may be re-entered (nested in another loop): its buffers may still be read.
        if p.shared() {
            self.ins("bar.sync 0");
        }
        for s in 0..p.stages - 1 {
            let at = self.new_reg(Class::B32);
            self.ins(format!("mad.lo.s32 {at}, {step}, {s}, {iv}"));
            let stage = self.new_reg(Class::B32);
            self.ins(format!("mov.u32 {stage}, {s}"));
            self.prefetch(&p, at, stage, lower)?;
        }
        Ok(Some(p))
    }

    /// At the top of an iteration: waits for its stage, prefetches `stages - 1` ahead and
    /// binds the loads to the stage being read.
    pub(crate) fn pipeline_iteration(
        &mut self,
        p: &Option<Pipeline>,
        iv: Reg,
        step: Reg,
        lower: &mut dyn Lower,
    ) -> Result<(), CodegenError> {
        let Some(p) = p else { return Ok(()) };
        self.ins(format!("cp.async.wait_group {}", p.stages - 2));
        // A thread reads its own copies of a register tile's ring: only a ring the block
        // shares needs the others' copies done.
        if p.shared() {
            self.async_proxy_fence();
            self.ins("bar.sync 0");
        }
        let ahead = self.new_reg(Class::B32);
        self.ins(format!(
            "mad.lo.s32 {ahead}, {step}, {}, {iv}",
            p.stages - 1
        ));
        // ptxas keeps every `ldmatrix` after a `cp.async` written before it (both touch shared
        // memory), so copies issued here put their address arithmetic between the barrier
        // and the first mma of every warp at once. When one `mma` is the body's only compute
        // (GEMM), the copies are issued at the end of the body instead, after every ldmatrix
        // of the tile; the stage written is still one every warp finished reading before
        // the barrier above.
        if self.single_mma(p.iv) {
            self.pending_prefetch = Some((p.clone(), ahead));
        } else {
            self.prefetch(p, ahead, p.write, lower)?;
        }
        for (l, ring) in &p.loads {
            let base = self.stage_base(ring, p.read);
            self.stage_bases.insert(*l, base);
        }
        Ok(())
    }

    /// Issues the iteration's deferred prefetch, if one is pending.
    fn flush_prefetch(&mut self, lower: &mut dyn Lower) -> Result<(), CodegenError> {
        match self.pending_prefetch.take() {
            Some((p, ahead)) => self.prefetch(&p, ahead, p.write, lower),
            None => Ok(()),
        }
    }

    /// Whether the body of the loop with induction variable `iv` holds exactly one `mma`,
    /// at its top level.
    fn single_mma(&self, iv: ValueId) -> bool {
        let ValueDef::BlockArg { op: for_id, .. } = self.k.values[iv].def else {
            return false;
        };
        let body = &self.k.ops[for_id].regions[0];
        let mmas = |ops: &[OpId]| {
            ops.iter()
                .filter(|&&o| self.k.ops[o].kind == OpKind::Mma)
                .count()
        };
        mmas(&body.ops) == 1 && body.ops.iter().all(|&o| self.k.ops[o].regions.is_empty())
    }

    /// At the bottom of an iteration: issues a prefetch still pending, then rotates the ring.
    pub(crate) fn pipeline_advance(
        &mut self,
        p: &Option<Pipeline>,
        lower: &mut dyn Lower,
    ) -> Result<(), CodegenError> {
        self.flush_prefetch(lower)?;
        let Some(p) = p else { return Ok(()) };
        for r in [p.read, p.write] {
            self.ins(format!("add.s32 {r}, {r}, 1"));
            let wrap = self.setp("eq.s32", r, p.stages);
            self.ins(format!("selp.b32 {r}, 0, {r}, {wrap}"));
        }
        Ok(())
    }

    /// After the loop: drains the copies still in flight.
    pub(crate) fn pipeline_epilogue(&mut self, p: &Option<Pipeline>) {
        let Some(p) = p else { return };
        self.ins("cp.async.wait_group 0");
        for (l, _) in &p.loads {
            self.stage_bases.remove(l);
        }
    }

    fn stage_base(&mut self, ring: &Ring, stage: Reg) -> Reg {
        let (offset, stage_bytes) = ring.extent();
        let base = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {base}, {}, {offset}", self.smem));
        self.ins(format!("mad.lo.u32 {base}, {stage}, {stage_bytes}, {base}"));
        base
    }

    /// Issues and commits the copies of every prefetched load for the iteration whose
    /// induction variable is `at`, into `stage`.
    fn prefetch(
        &mut self,
        p: &Pipeline,
        at: Reg,
        stage: Reg,
        lower: &mut dyn Lower,
    ) -> Result<(), CodegenError> {
        let gemm = self.single_mma(p.iv);
        for (l, ring) in &p.loads {
            let mut memo = BTreeMap::new();
            let staged = kiln_ir::passes::staged_load::of(self.k, *l)
                .ok_or_else(|| self.internal(*l, "a prefetched tile of no load"))?;
            let coords = staged
                .scalars()
                .into_iter()
                .map(|c| self.remat(c, p.iv, at, &mut memo, *l, lower))
                .collect::<Result<Vec<_>, _>>()?;
            let base = self.stage_base(ring, stage);
            match ring {
                Ring::Tile(buf) => self.issue_copy(*l, &coords, base, buf, gemm)?,
                Ring::Thread(_) => self.issue_thread_copy(*l, &coords, base)?,
            }
        }
        self.ins("cp.async.commit_group");
        Ok(())
    }

    /// Whether `v` is an elementwise result inside the loop whose induction variable is `iv`.
    fn computed_in_loop(&self, v: ValueId, iv: ValueId) -> bool {
        let (ValueDef::Op(def, _), ValueDef::BlockArg { op: for_id, .. }) =
            (self.k.values[v].def, self.k.values[iv].def)
        else {
            return false;
        };
        let elementwise = matches!(
            self.k.ops[def].kind,
            OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Select
                | OpKind::Cast { .. }
                | OpKind::Bitcast { .. }
        );
        let mut at = def;
        while let Some(&(Some(owner), _)) = self.parents.get(&at) {
            if owner == for_id {
                return elementwise;
            }
            at = owner;
        }
        false
    }

    /// Recomputes scalar `v` of the loop body with the induction variable `iv` set to `at`.
    pub(crate) fn remat(
        &mut self,
        v: ValueId,
        iv: ValueId,
        at: Reg,
        memo: &mut BTreeMap<ValueId, Reg>,
        load: OpId,
        lower: &mut dyn Lower,
    ) -> Result<Reg, CodegenError> {
        if v == iv {
            return Ok(at);
        }
        if let Some(&r) = memo.get(&v) {
            return Ok(r);
        }
        // The body's own value of `v` is for the current iteration, not `at`: reuse a written
        // value only when it cannot depend on the induction variable (a prefetch deferred into
        // the body runs after the body wrote its coordinates).
        if let Some(Val::Scalar(r)) = self.vals.get(&v)
            && !self.computed_in_loop(v, iv)
        {
            return Ok(*r);
        }
        let ValueDef::Op(def, _) = self.k.values[v].def else {
            return Err(self.internal(load, "a prefetch coordinate depends on a carried value"));
        };
        let op = self.k.ops[def].clone();
        let reg = match &op.kind {
            OpKind::Unary(_)
            | OpKind::Binary(_)
            | OpKind::Select
            | OpKind::Cast { .. }
            | OpKind::Bitcast { .. } => {
                let srcs = op
                    .operands
                    .iter()
                    .map(|&o| self.remat(o, iv, at, memo, load, lower))
                    .collect::<Result<Vec<_>, _>>()?;
                let in_dtype = match op.kind {
                    OpKind::Select => self.k.ty(op.operands[1]).dtype(),
                    _ => self.k.ty(op.operands[0]).dtype(),
                };
                self.element(def, &op.kind, in_dtype, self.k.ty(v).dtype(), &srcs)?
            }
            _ => {
                // A leaf (constant, block id, parameter): write it, then forget it so the body
                // writes its own copy where it dominates every use.
                let body_copy = self.vals.remove(&v);
                self.write_op(def, lower)?;
                let r = match self.vals.remove(&v) {
                    Some(Val::Scalar(r)) => r,
                    _ => return Err(self.internal(load, "a prefetch coordinate is not a scalar")),
                };
                if let Some(b) = body_copy {
                    self.vals.insert(v, b);
                }
                r
            }
        };
        memo.insert(v, reg);
        Ok(reg)
    }
}
