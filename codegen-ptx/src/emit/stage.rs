//! Register mma operands staged through shared memory (`kiln_ir::passes::mma_operands`):
//! every thread writes its elements of the source tile into the operand's buffer, row-major
//! in the buffer's swizzle, as 8x8 matrices ([`super::matrices`]) where the buffer has 128-byte
//! swizzled rows and the tile is laid out as an mma accumulator, else packing runs of
//! adjacent columns into 32-, 64- or 128-bit stores; the mma then reads the buffer with
//! `ldmatrix` (or a wgmma descriptor) as it reads a staged load.

use std::collections::BTreeMap;

use kiln_ir::schedule::{SmemBuffer, StagedOperand};
use kiln_ir::{DType, OpId, Target};

use super::matrices::{MatrixPlan, MatrixWriter, SwizzledBoxes};
use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// How the source tile's elements are held.
enum Elements {
    /// One `.b16` register per element.
    Half(Vec<Reg>),
    /// One `.f32` register per element, rounded to `DType` when stored.
    Wide(Vec<Reg>, DType),
    /// Two elements per `.b32` register (element `2k` in the low half).
    Pairs(Vec<Reg>),
}

/// Which threads meet at the barriers around a staging write.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StageSync {
    /// Every thread of the block (`bar.sync 0`).
    Block,
    /// A ring's consumer warpgroups only: named barrier `id` of `threads` threads (the
    /// producer never reaches a block-wide one). Their wgmmas read the buffer, so the writes
    /// are always fenced into the async proxy.
    Consumers { id: u32, threads: u32 },
}

impl Emitter<'_> {
    /// Writes `st`'s source into its buffer between two `bar.sync`s and returns the operand's
    /// form for the mma at `id`: the buffer, transposed when the operand is.
    pub(crate) fn stage_operand(
        &mut self,
        id: OpId,
        st: &StagedOperand,
    ) -> Result<Val, CodegenError> {
        self.stage_operand_among(id, st, StageSync::Block)
    }

    /// [`Emitter::stage_operand`], the threads that write meeting as `sync` says.
    pub(crate) fn stage_operand_among(
        &mut self,
        id: OpId,
        st: &StagedOperand,
        sync: StageSync,
    ) -> Result<Val, CodegenError> {
        let mut vals = self.stage_operands_among(id, &[st], sync)?;
        vals.pop()
            .ok_or_else(|| self.internal(id, "a staging write of no operand"))
    }

    /// The staged operands `sts` of mma `id` (its A and B both, in a ring) written between
    /// one pair of barriers of the threads `sync` names; their forms, in order.
    pub(crate) fn stage_operands_among(
        &mut self,
        id: OpId,
        sts: &[&StagedOperand],
        sync: StageSync,
    ) -> Result<Vec<Val>, CodegenError> {
        let barrier = match sync {
            StageSync::Block => "bar.sync 0".to_string(),
            StageSync::Consumers { id, threads } => format!("bar.sync {id}, {threads}"),
        };
        let mut written = Vec::with_capacity(sts.len());
        for (i, st) in sts.iter().enumerate() {
            let first = (i == 0).then_some(barrier.as_str());
            written.push(self.write_staged(id, st, first)?);
        }
        self.staged_written(id, sync, barrier);
        Ok(sts
            .iter()
            .zip(written)
            .map(|(st, (base, buf))| Val::Smem {
                base,
                buf,
                transposed: st.transposed,
            })
            .collect())
    }

    /// Writes `st`'s source into its buffer, after the threads meet at `barrier` (`None`:
    /// an earlier operand's write met there); its base address and buffer.
    fn write_staged(
        &mut self,
        id: OpId,
        st: &StagedOperand,
        barrier: Option<&str>,
    ) -> Result<(Reg, SmemBuffer), CodegenError> {
        let dtype = self.k.ty(st.source).dtype();
        let elements = match self.val(st.source, id)? {
            Val::Narrowed { src, to } => Elements::Wide(src, to),
            Val::Packed(pairs) => Elements::Pairs(pairs),
            Val::Tile(_) | Val::Affine { .. } | Val::Lazy(_) => match dtype {
                DType::Bf16 | DType::F16 => Elements::Half(self.tile(st.source, id)?),
                _ => return Err(self.internal(id, "an mma operand that is not bf16 or f16")),
            },
            Val::Scalar(_) | Val::Smem { .. } => {
                return Err(self.internal(id, "a staged mma operand that is not a register tile"));
            }
        };
        let d = self.dist(st.source, id)?;
        if d.terms.len() != 2 {
            return Err(self.internal(id, "a staged mma operand that is not 2-D"));
        }
        let buf = st.buffer.clone();
        let base = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {base}, {}, {}", self.smem, buf.offset));
        let threads = 32 * self.k.options.num_warps;
        // `stmatrix` is sm_90's.
        let matrices = (self.target != Target::Sm80)
            .then(|| swizzled_boxes(&buf, dtype))
            .flatten()
            .and_then(|layout| MatrixPlan::of(&d, threads, layout).map(|plan| (layout, plan)));
        if let Some((layout, plan)) = matrices {
            let origin = (self.smem, buf.offset);
            let mut writer = MatrixWriter::new(self, &d, Some(plan), layout, origin);
            self.before_staging(id, barrier);
            let per_store = writer.regs_per_store();
            for (i, offs) in d.regs.chunks(per_store).enumerate() {
                let place = writer.place(self, (offs[0][0], offs[0][1]));
                let words = self.stage_words(&elements, i * per_store, per_store, dtype);
                let words: Vec<Reg> = words
                    .into_iter()
                    .map(|w| match w {
                        Word::Full(r) => Ok(r),
                        Word::Half(_) => Err(self.internal(id, "a matrix row of one element")),
                    })
                    .collect::<Result<_, _>>()?;
                writer.store(self, place, &words);
            }
            return Ok((base, buf));
        }
        let row0 = self.thread_coord(&d.terms[0]);
        let col0 = self.thread_coord(&d.terms[1]);
        // Runs of registers along a row, at most one 16-byte chunk, starting at a column that
        // every thread's column offset keeps aligned to the run.
        let col_align = d.terms[1]
            .iter()
            .map(|t| t.mul)
            .fold(8u32, |a, m| a.min(1 << m.trailing_zeros().min(3)));
        self.before_staging(id, barrier);
        let mut rows: BTreeMap<u32, (Reg, Option<Reg>)> = BTreeMap::new();
        let mut cols: BTreeMap<u32, (Reg, Reg)> = BTreeMap::new();
        let mut i = 0;
        while i < d.regs.len() {
            let [r, c] = [d.regs[i][0], d.regs[i][1]];
            let mut len = 1;
            while len < 8
                && i + 2 * len <= d.regs.len()
                && (0..2 * len).all(|j| d.regs[i + j] == [r, c + j as u32])
                && (c % (2 * len as u32)) == 0
                && col_align >= 2 * len as u32
            {
                len *= 2;
            }
            if matches!(elements, Elements::Pairs(_)) && (len < 2 || i % 2 != 0) {
                return Err(self.internal(id, "a packed mma operand not in column pairs"));
            }
            let words = self.stage_words(&elements, i, len, dtype);
            // Per row offset: the row's address and swizzle; per column offset: the chunk
            // and the byte in it; per store, the swizzled chunk between them.
            let (row_at, sw) = match rows.get(&r) {
                Some(&x) => x,
                None => {
                    let row = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {row}, {row0}, {r}"));
                    let sw = buf.swizzle().map(|(shift, mask)| {
                        let t = self.new_reg(Class::B32);
                        self.ins(format!("shr.u32 {t}, {row}, {shift}"));
                        self.ins(format!("and.b32 {t}, {t}, {mask}"));
                        t
                    });
                    let at = self.new_reg(Class::B32);
                    self.ins(format!("mad.lo.u32 {at}, {row}, {}, {base}", buf.pitch()));
                    rows.insert(r, (at, sw));
                    (at, sw)
                }
            };
            let (chunk, byte) = match cols.get(&c) {
                Some(&x) => x,
                None => {
                    let col = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {col}, {col0}, {c}"));
                    let (chunk, byte) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                    self.ins(format!("shr.u32 {chunk}, {col}, 3"));
                    self.ins(format!("and.b32 {byte}, {col}, 7"));
                    self.ins(format!("shl.b32 {byte}, {byte}, 1"));
                    // A boxed buffer (read by wgmma): the chunk's box is a byte offset, the
                    // chunk inside it is what the row swizzles.
                    let per_box = buf.pitch() / 16;
                    if buf.boxed && per_box < buf.row_bytes / 16 {
                        let b = self.new_reg(Class::B32);
                        self.ins(format!(
                            "shr.u32 {b}, {chunk}, {}",
                            per_box.trailing_zeros()
                        ));
                        self.ins(format!(
                            "mad.lo.u32 {byte}, {b}, {}, {byte}",
                            buf.box_bytes()
                        ));
                        self.ins(format!("and.b32 {chunk}, {chunk}, {}", per_box - 1));
                    }
                    cols.insert(c, (chunk, byte));
                    (chunk, byte)
                }
            };
            let swizzled = match sw {
                Some(t) => {
                    let x = self.new_reg(Class::B32);
                    self.ins(format!("xor.b32 {x}, {chunk}, {t}"));
                    x
                }
                None => chunk,
            };
            let addr = self.new_reg(Class::B32);
            self.ins(format!("mad.lo.u32 {addr}, {swizzled}, 16, {row_at}"));
            self.ins(format!("add.s32 {addr}, {addr}, {byte}"));
            match words.as_slice() {
                [Word::Half(h)] => self.ins(format!("st.shared.b16 [{addr}], {h}")),
                [Word::Full(w)] => self.ins(format!("st.shared.b32 [{addr}], {w}")),
                [Word::Full(a), Word::Full(b)] => {
                    self.ins(format!("st.shared.v2.b32 [{addr}], {{{a}, {b}}}"))
                }
                [Word::Full(a), Word::Full(b), Word::Full(c), Word::Full(e)] => {
                    self.ins(format!("st.shared.v4.b32 [{addr}], {{{a}, {b}, {c}, {e}}}"))
                }
                _ => return Err(self.internal(id, "a staged run of an unexpected length")),
            }
            i += len;
        }
        Ok((base, buf))
    }

    /// Before mma `id`'s staging write: every thread is done reading the previous contents,
    /// unless another barrier already says so ([`kiln_ir::schedule::ImpliedBarriers::staged`])
    /// or the threads met for an earlier operand of the same write (`None`).
    fn before_staging(&mut self, id: OpId, barrier: Option<&str>) {
        if let Some(barrier) = barrier
            && !self.k.schedule.implied_barriers.staged.contains(&id)
        {
            self.ins(barrier);
        }
    }

    /// After mma `id`'s staging write: the writes made visible to every warp's ldmatrix
    /// (and, through the proxy fence, to a wgmma's reads). Where a bulk add leaves its first
    /// barrier to this one ([`kiln_ir::schedule::ImpliedBarriers::bulk`]), the threads first
    /// wait for their bulk reductions to have read the adds' region.
    fn staged_written(&mut self, id: OpId, sync: StageSync, barrier: String) {
        match sync {
            StageSync::Block => self.async_proxy_fence(),
            StageSync::Consumers { .. } => self.ins("fence.proxy.async.shared::cta"),
        }
        if self
            .k
            .schedule
            .implied_barriers
            .bulk
            .values()
            .any(|&h| h == id)
        {
            self.ins("cp.async.bulk.wait_group.read 0");
        }
        self.ins(barrier);
    }

    /// The buffer of `st`, written where its source was loaded ([`StagedOperand::at_source`]),
    /// as an mma reads it.
    pub(crate) fn staged_buffer(&mut self, st: &StagedOperand) -> Val {
        let base = self.new_reg(Class::B32);
        self.ins(format!(
            "add.s32 {base}, {}, {}",
            self.smem, st.buffer.offset
        ));
        Val::Smem {
            base,
            buf: st.buffer.clone(),
            transposed: st.transposed,
        }
    }

    /// The words holding elements `i .. i + len` (`len` 1, 2, 4 or 8): one `.b16` register
    /// for a single element, else one `.b32` per pair.
    fn stage_words(
        &mut self,
        elements: &Elements,
        i: usize,
        len: usize,
        dtype: DType,
    ) -> Vec<Word> {
        let cvt = if dtype == DType::F16 { "f16" } else { "bf16" };
        match elements {
            Elements::Half(regs) if len == 1 => vec![Word::Half(regs[i])],
            Elements::Wide(regs, to) if len == 1 => {
                let h = self.new_reg(Class::B16);
                let t = if *to == DType::F16 { "f16" } else { "bf16" };
                self.ins(format!("cvt.rn.{t}.f32 {h}, {}", regs[i]));
                vec![Word::Half(h)]
            }
            Elements::Pairs(regs) => (0..len / 2).map(|j| Word::Full(regs[i / 2 + j])).collect(),
            Elements::Half(regs) => (0..len / 2)
                .map(|j| {
                    let w = self.new_reg(Class::B32);
                    let (lo, hi) = (regs[i + 2 * j], regs[i + 2 * j + 1]);
                    self.ins(format!("mov.b32 {w}, {{{lo}, {hi}}}"));
                    Word::Full(w)
                })
                .collect(),
            Elements::Wide(regs, _) => (0..len / 2)
                .map(|j| {
                    let w = self.new_reg(Class::B32);
                    let (lo, hi) = (regs[i + 2 * j], regs[i + 2 * j + 1]);
                    // The first source lands in the upper half (docs/ptx.md §6).
                    self.ins(format!("cvt.rn.{cvt}x2.f32 {w}, {hi}, {lo}"));
                    Word::Full(w)
                })
                .collect(),
        }
    }
}

/// `buf` as [`SwizzledBoxes`] where it is laid out as they are: 16-bit elements in rows of
/// 128 swizzled bytes (a boxed buffer's, or a whole row's of 64 columns).
fn swizzled_boxes(buf: &SmemBuffer, dtype: DType) -> Option<SwizzledBoxes> {
    let halves = matches!(dtype, DType::Bf16 | DType::F16);
    (halves && buf.swizzle() == Some((0, 7)) && buf.pitch() == 128).then(|| SwizzledBoxes {
        box_bytes: buf.box_bytes(),
        boxes: buf.row_bytes / 128,
    })
}

/// A register holding staged elements.
enum Word {
    /// One element.
    Half(Reg),
    /// Two elements, the first in the low half.
    Full(Reg),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A staged buffer of `rows` rows of `row_bytes`, 128-byte swizzled, boxed or not.
    fn buffer(rows: u32, row_bytes: u32, boxed: bool) -> SmemBuffer {
        SmemBuffer {
            load: OpId::from_index(0),
            offset: 0,
            stage_bytes: rows * row_bytes,
            stages: 1,
            row_bytes,
            swizzled: true,
            boxed,
        }
    }

    #[test]
    fn matrices_go_where_the_buffer_keeps_each_element() {
        // Rows of 64 columns, or boxes of 64 columns side by side: every element's place as
        // the matrix writer computes it is the buffer's.
        for (rows, row_bytes, boxed) in [(64, 128, false), (128, 128, true), (64, 256, true)] {
            let buf = buffer(rows, row_bytes, boxed);
            let layout = swizzled_boxes(&buf, DType::Bf16).expect("a 128-byte swizzle");
            for row in 0..rows {
                for col in 0..row_bytes / 2 {
                    assert_eq!(
                        layout.offset(row, col),
                        buf.boxed_offset(row, col / 8) + (col % 8) * 2,
                        "{rows} x {row_bytes} B, row {row}, column {col}"
                    );
                }
            }
        }
        // Rows of 256 bytes not boxed swizzle across the whole row: not this layout.
        assert_eq!(swizzled_boxes(&buffer(64, 256, false), DType::Bf16), None);
        assert_eq!(swizzled_boxes(&buffer(64, 128, false), DType::F32), None);
    }
}
