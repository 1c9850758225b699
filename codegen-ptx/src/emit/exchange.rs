//! Elements changing threads through the kernel's shared scratch region
//! ([`kiln_ir::schedule::Scratch`]): a `convert` writes every element of its operand at the
//! element's row-major place and reads its result's elements back; a reduction spread over
//! warps leaves one partial result per warp there and each thread combines them.
//!
//! Every exchange has a `bar.sync` between its writes and its reads, and one before its
//! writes (readers of the previous exchange are done) unless the exchange just before it in
//! straight-line code used the region's other slot ([`Scratch`]): that exchange's own
//! barrier came after every read of this slot. The code is at most one instruction per register
//! the thread holds: it grows with the per-thread tile, not with the tile. A thread's 32-bit
//! elements that lie side by side there move as one 8- or 16-byte access (a lane's run of
//! elements is one wavefront slot instead of one per element: a warp's four-element runs
//! are conflict-free where single elements 16 bytes apart would meet in a quarter of the
//! banks).

use kiln_ir::schedule::{Distribution, Scratch, Term};
use kiln_ir::{DType, OpId, ValueId};

use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// Bytes an element takes in the scratch region.
pub(super) fn scratch_bytes(dtype: DType) -> u32 {
    dtype.size_bytes() as u32
}

impl Emitter<'_> {
    /// Begins an exchange of `need` bytes at op `at`: the slot of the scratch region (which
    /// the `lower` pass sized for every exchange of the kernel) it writes and where it
    /// starts, after a barrier where one is needed. The exchange calls
    /// [`Emitter::end_exchange`] after its reads.
    pub(super) fn begin_exchange(
        &mut self,
        at: OpId,
        need: u32,
    ) -> Result<(Scratch, u32), CodegenError> {
        let s = self.k.schedule.scratch.ok_or_else(|| {
            self.internal(at, "an exchange between threads without scratch memory")
        })?;
        let slot = match self.scratch_slot {
            Some(0) if need <= s.small => 1,
            Some(1) => 0,
            _ => {
                self.ins("bar.sync 0");
                0
            }
        };
        let offset = if slot == 0 { s.offset } else { s.second() };
        let region = Scratch {
            offset,
            bytes: need,
            small: 0,
        };
        Ok((region, slot))
    }

    /// Ends an exchange that wrote `slot`, with a barrier between its writes and its reads.
    pub(super) fn end_exchange(&mut self, slot: u32) {
        self.scratch_slot = Some(slot);
    }

    /// `convert`: the operand's elements, in its layout, become the result's, in another.
    /// Also a `reshape` between layouts that hold its elements in other threads (the result
    /// reads each element at its row-major index, which a reshape keeps) and a `permute`
    /// (`perm`: the result reads each element at its operand's row-major index, through the
    /// operand's strides permuted).
    pub(crate) fn write_convert(
        &mut self,
        id: OpId,
        perm: Option<&[usize]>,
    ) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (x, r) = (op.operands[0], op.results[0]);
        let dtype = self.k.ty(x).dtype();
        let strides = row_major_strides(self.k, x, id, self)?;
        let read_strides = match perm {
            Some(p) => p
                .iter()
                .map(|&d| strides.get(d).copied())
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| self.internal(id, "a permutation past the tile's rank"))?,
            None => row_major_strides(self.k, r, id, self)?,
        };
        let (src, dst) = (self.dist(x, id)?, self.dist(r, id)?);
        let esize = scratch_bytes(dtype);

        self.comment("layout conversion through shared memory");
        let elems = self.k.ty(r).shape().map_or(1, |s| s.numel() as u32);
        let (scratch, slot) = self.begin_exchange(id, elems * esize)?;
        let base = self.element_address(&src, &strides, esize, scratch);
        let align = thread_align(&src, &strides, esize);
        let mut elems = Vec::with_capacity(src.regs.len());
        for offs in &src.regs {
            elems.push((linear(offs, &strides) * esize, self.elem(x, offs, id)?));
        }
        self.store_scratch_runs(dtype, base, align, &elems);
        self.ins("bar.sync 0");
        let base = self.element_address(&dst, &read_strides, esize, scratch);
        let align = thread_align(&dst, &read_strides, esize);
        let ats: Vec<u32> = dst
            .regs
            .iter()
            .map(|offs| linear(offs, &read_strides) * esize)
            .collect();
        let out = self.load_scratch_runs(dtype, base, align, &ats);
        self.end_exchange(slot);
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }

    /// The last stage of reduction `id` over a dimension whose thread terms `reduced` span
    /// warps: each warp's partial result for every element of the result (`partial`, in
    /// `dst`'s register order) goes to shared memory, and each thread combines every warp's.
    pub(crate) fn reduce_across_warps(
        &mut self,
        id: OpId,
        dst: &Distribution,
        reduced: &[Term],
        partial: Vec<Reg>,
        combine: &mut dyn FnMut(&mut Self, Reg, Reg) -> Reg,
    ) -> Result<Vec<Reg>, CodegenError> {
        let r = self.k.ops[id].results[0];
        // 16-bit floats are reduced in f32.
        let dtype = match self.k.ty(r).dtype() {
            DType::Bf16 | DType::F16 => DType::F32,
            d => d,
        };
        let (warps, lane_terms): (Vec<Term>, Vec<Term>) =
            reduced.iter().partition(|t| t.div.is_multiple_of(32));
        let strides = row_major_strides(self.k, r, id, self)?;
        let esize = scratch_bytes(dtype);
        // One row of partials per warp, in the result's row-major order: element e of warp w
        // at `(w * elems + e) * esize`, so a thread's neighbouring elements are neighbours
        // there (vector accesses; lanes of a warp on distinct banks).
        let elems = self.k.ty(r).shape().map_or(1, |s| s.numel() as u32);
        let count: u32 = warps.iter().map(|t| t.modulo).product();
        let mut radix = 1;
        let dense: Vec<Term> = warps
            .iter()
            .map(|t| {
                let d = Term {
                    div: t.div,
                    modulo: t.modulo,
                    mul: radix,
                };
                radix *= t.modulo;
                d
            })
            .collect();
        let warp = self.thread_coord(&dense);
        let row = elems * esize;

        self.comment("reduction across warps through shared memory");
        let (scratch, used) = self.begin_exchange(id, count * row)?;
        let base = self.element_address(dst, &strides, esize, scratch);
        let align = thread_align(dst, &strides, esize).min(row & row.wrapping_neg());
        let slot = self.new_reg(Class::B32);
        self.ins(format!("mad.lo.u32 {slot}, {warp}, {row}, {base}"));
        // After the butterflies every lane of a group holds the same partial: the first
        // writes it.
        let lane = self.thread_coord(&lane_terms);
        let first = self.setp("eq.u32", lane, 0);
        let skip = self.new_label();
        self.ins(format!("@!{first} bra {skip}"));
        let ats: Vec<u32> = dst
            .regs
            .iter()
            .map(|offs| linear(offs, &strides) * esize)
            .collect();
        let mine: Vec<(u32, Reg)> = ats.iter().copied().zip(partial).collect();
        self.store_scratch_runs(dtype, slot, align, &mine);
        self.label(&skip);
        self.ins("bar.sync 0");
        // Warp by warp, in order: each element combines its partials as a sequential loop
        // over the warps would.
        let mut out = self.load_scratch_runs(dtype, base, align, &ats);
        for w in 1..count {
            let shifted: Vec<u32> = ats.iter().map(|at| at + w * row).collect();
            let next = self.load_scratch_runs(dtype, base, align, &shifted);
            for (acc, p) in out.iter_mut().zip(next) {
                *acc = combine(self, *acc, p);
            }
        }
        self.end_exchange(used);
        Ok(out)
    }

    /// A shared address: the scratch region's start plus `esize` times this thread's
    /// row-major element index (its thread terms only; registers add their offsets).
    pub(super) fn element_address(
        &mut self,
        d: &Distribution,
        strides: &[u32],
        esize: u32,
        scratch: Scratch,
    ) -> Reg {
        let index = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {index}, 0"));
        for (terms, &stride) in d.terms.iter().zip(strides) {
            if terms.is_empty() {
                continue;
            }
            let c = self.thread_coord(terms);
            self.ins(format!("mad.lo.u32 {index}, {c}, {stride}, {index}"));
        }
        let addr = self.new_reg(Class::B32);
        self.ins(format!(
            "mad.lo.u32 {addr}, {index}, {esize}, {}",
            self.smem
        ));
        self.ins(format!("add.u32 {addr}, {addr}, {}", scratch.offset));
        addr
    }

    pub(super) fn store_scratch(&mut self, dtype: DType, base: Reg, at: u32, e: Reg) {
        match dtype {
            DType::Bool => {
                let b = self.new_reg(Class::B32);
                self.ins(format!("selp.b32 {b}, 1, 0, {e}"));
                self.ins(format!("st.shared.u8 [{base}+{at}], {b}"));
            }
            DType::Bf16 | DType::F16 => self.ins(format!("st.shared.b16 [{base}+{at}], {e}")),
            DType::F32 => self.ins(format!("st.shared.f32 [{base}+{at}], {e}")),
            DType::I32 | DType::U32 => self.ins(format!("st.shared.b32 [{base}+{at}], {e}")),
        }
    }

    /// Stores each `(at, register)` of `elems` at `base + at`, neighbouring 32-bit elements
    /// as one vector store where `base` (aligned to `align` bytes) and `at` allow.
    fn store_scratch_runs(&mut self, dtype: DType, base: Reg, align: u32, elems: &[(u32, Reg)]) {
        let ats: Vec<u32> = elems.iter().map(|&(at, _)| at).collect();
        for run in vector_runs(dtype, align, &ats) {
            let regs: Vec<String> = run.iter().map(|&i| elems[i].1.to_string()).collect();
            let at = elems[run[0]].0;
            match regs.len() {
                1 => self.store_scratch(dtype, base, at, elems[run[0]].1),
                n => self.ins(format!(
                    "st.shared.v{n}.{} [{base}+{at}], {{{}}}",
                    vector_type(dtype),
                    regs.join(", ")
                )),
            }
        }
    }

    /// The elements at `base + at` for each `at` of `ats`, in that order, loaded as
    /// [`Emitter::store_scratch_runs`] stores them.
    fn load_scratch_runs(&mut self, dtype: DType, base: Reg, align: u32, ats: &[u32]) -> Vec<Reg> {
        let mut out: Vec<Option<Reg>> = vec![None; ats.len()];
        for run in vector_runs(dtype, align, ats) {
            if let [i] = run[..] {
                out[i] = Some(self.load_scratch(dtype, base, ats[i]));
                continue;
            }
            let regs: Vec<Reg> = run.iter().map(|_| self.new_reg(Class::of(dtype))).collect();
            let names: Vec<String> = regs.iter().map(Reg::to_string).collect();
            self.ins(format!(
                "ld.shared.v{}.{} {{{}}}, [{base}+{}]",
                regs.len(),
                vector_type(dtype),
                names.join(", "),
                ats[run[0]]
            ));
            for (&i, r) in run.iter().zip(regs) {
                out[i] = Some(r);
            }
        }
        out.into_iter().flatten().collect()
    }

    fn load_scratch(&mut self, dtype: DType, base: Reg, at: u32) -> Reg {
        let r = self.new_reg(Class::of(dtype));
        match dtype {
            DType::Bool => {
                let b = self.new_reg(Class::B32);
                self.ins(format!("ld.shared.u8 {b}, [{base}+{at}]"));
                self.ins(format!("setp.ne.u32 {r}, {b}, 0"));
            }
            DType::Bf16 | DType::F16 => self.ins(format!("ld.shared.b16 {r}, [{base}+{at}]")),
            DType::F32 => self.ins(format!("ld.shared.f32 {r}, [{base}+{at}]")),
            DType::I32 | DType::U32 => self.ins(format!("ld.shared.b32 {r}, [{base}+{at}]")),
        }
        r
    }
}

/// Row-major strides, in elements, of tile `v`'s shape.
pub(super) fn row_major_strides(
    k: &kiln_ir::Kernel,
    v: ValueId,
    at: OpId,
    e: &Emitter<'_>,
) -> Result<Vec<u32>, CodegenError> {
    let shape = k
        .ty(v)
        .shape()
        .ok_or_else(|| e.internal(at, "an exchange of a scalar"))?;
    let dims = shape.dims();
    let mut strides = vec![1u32; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1] as u32;
    }
    Ok(strides)
}

/// The row-major index of the element at `offs`.
pub(super) fn linear(offs: &[u32], strides: &[u32]) -> u32 {
    offs.iter().zip(strides).map(|(o, s)| o * s).sum()
}

/// The largest power of two, up to 16, dividing every byte offset [`Emitter::element_address`]
/// gives a thread of `d` (the scratch region's start is 128-byte aligned).
fn thread_align(d: &Distribution, strides: &[u32], esize: u32) -> u32 {
    d.terms
        .iter()
        .zip(strides)
        .flat_map(|(terms, &stride)| {
            terms
                .iter()
                .filter(|t| t.modulo > 1)
                .map(move |t| t.mul * stride * esize)
        })
        .fold(16, |align, step| {
            if step == 0 {
                align
            } else {
                align.min(step & step.wrapping_neg())
            }
        })
}

/// The PTX type of a vector access to `dtype` elements.
fn vector_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        _ => "b32",
    }
}

/// The indices of `ats` grouped into accesses: runs of 4 or 2 neighbouring 32-bit elements
/// whose first byte offset (and `align`, the base's) is a multiple of the run's bytes, in
/// ascending order of offset; every other element alone. Indices whose offsets repeat
/// (replicated registers) stay alone.
fn vector_runs(dtype: DType, align: u32, ats: &[u32]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..ats.len()).collect();
    if !matches!(dtype, DType::F32 | DType::I32 | DType::U32) {
        return order.into_iter().map(|i| vec![i]).collect();
    }
    order.sort_by_key(|&i| ats[i]);
    let mut runs = Vec::with_capacity(order.len());
    let mut k = 0;
    while k < order.len() {
        let fits = |n: usize| {
            let bytes = 4 * n as u32;
            align >= bytes
                && ats[order[k]].is_multiple_of(bytes)
                && k + n <= order.len()
                && (1..n).all(|j| ats[order[k + j]] == ats[order[k]] + 4 * j as u32)
        };
        let n = [4, 2].into_iter().find(|&n| fits(n)).unwrap_or(1);
        runs.push(order[k..k + n].to_vec());
        k += n;
    }
    runs
}
