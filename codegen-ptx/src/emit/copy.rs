//! Tiles staged in shared memory by `cp.async`: 16-byte chunks, zero-filled past the
//! tensor's edge (or a masked load's bound, `staged_load`) through the src-size operand, with an element-wise fallback when the tensor
//! or the coordinate is not known to be 16-byte aligned, into a buffer's swizzled rows.

use kiln_ir::passes::staged_load::{self, StagedLoad};
use kiln_ir::schedule::SmemBuffer;
use kiln_ir::{DType, OpId};

use super::Emitter;
use super::memory::TileOrigin;
use crate::error::CodegenError;
use crate::types::mem_ty;
use crate::types::{Class, Reg};

impl Emitter<'_> {
    /// Issues the cp.async copies (or element copies) of load `id`'s tile into shared memory
    /// at `dst`, `scalars` holding its `StagedLoad::scalars` (the coordinates, then a masked
    /// load's bound). Does not commit. `whole_chunks`: test at run time whether
    /// the warp's chunks all lie inside the tensor's columns and, if so, copy without a
    /// register src-size (GEMM mainloops: fewer instructions, a few more live registers).
    ///
    /// Thread `t` copies 16-byte chunk `t % cpr` of rows `t / cpr + q * (threads / cpr)`,
    /// so when `threads / cpr` is a multiple of 8 every copy of a thread shares one swizzled
    /// shared offset, column and global address step.
    pub(crate) fn issue_copy(
        &mut self,
        id: OpId,
        scalars: &[Reg],
        dst: Reg,
        buf: &SmemBuffer,
        whole_chunks: bool,
    ) -> Result<(), CodegenError> {
        let Some(staged) = staged_load::of(self.k, id) else {
            return Err(self.internal(id, "not a load"));
        };
        let (tensor, shape) = (staged.tensor, staged.shape.clone());
        if shape.rank() != 2 {
            return Err(self.unsupported(id, "a 1-D tile staged in shared memory"));
        }
        if !buf.row_bytes.is_multiple_of(16) {
            return Err(self.unsupported(
                id,
                "a shared tile whose rows are not a multiple of 16 bytes",
            ));
        }
        let rank = staged.coords.len();
        let coords = scalars
            .get(..rank)
            .ok_or_else(|| self.internal(id, "a staged load without its coordinates"))?;
        let clip = self.copy_clip(&staged, scalars, id)?;
        let o = self.origin(tensor, coords, 2, clip, id)?;
        let aligned = self.k.params[tensor].aligned16();
        let epc = 16 / o.esize;
        let col_coord = staged.coords[rank - 1];
        let fast = aligned && self.known_multiple(col_coord).is_multiple_of(epc);
        let dtype = self.k.params[tensor].dtype();
        let cpr = buf.row_bytes / 16;
        let total = shape.rows() as u32 * cpr;
        let threads = 32 * self.k.options.num_warps;
        let regular = threads.is_multiple_of(cpr)
            && total.is_multiple_of(threads)
            && (threads / cpr).is_multiple_of(8);
        if !regular {
            return self.issue_copy_general(&o, fast, dtype, dst, buf, total);
        }
        let rstep = threads / cpr;
        let (row, cc) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("div.u32 {row}, {}, {cpr}", self.tid));
        self.ins(format!("rem.u32 {cc}, {}, {cpr}", self.tid));
        let saddr = self.smem_addr(dst, row, cc, buf);
        let (grow, gcol) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("add.s32 {grow}, {}, {row}", o.coords[0]));
        self.ins(format!("mad.lo.s32 {gcol}, {cc}, {epc}, {}", o.coords[1]));
        // Elsewhere only the column part of the address is shared by a thread's chunks: a
        // per-chunk `q * row step` (or a hoisted step) would be loop-invariant, and ptxas
        // would keep it in registers across the main loop.
        let colbase = self.element_addr(&o, None, gcol);
        let stride = o
            .row_stride
            .ok_or_else(|| self.internal(id, "2-D tile without a row stride"))?;
        let col_bytes = if fast {
            let left = self.new_reg(Class::B32);
            self.ins(format!("sub.s32 {left}, {}, {gcol}", o.dims[1]));
            self.ins(format!("max.s32 {left}, {left}, 0"));
            self.ins(format!("min.s32 {left}, {left}, {epc}"));
            self.ins(format!("mul.lo.s32 {left}, {left}, {}", o.esize));
            Some(left)
        } else {
            None
        };
        // In a GEMM mainloop the chunks' addresses are one 64-bit add apart (the step is
        // loop-invariant: two more registers, which attention cannot spare).
        let row_step = whole_chunks.then(|| {
            let step = self.new_reg(Class::B64);
            self.ins(format!("mul.lo.s64 {step}, {stride}, {}", rstep * o.esize));
            step
        });
        let mut prev: Option<Reg> = None;
        let mut chunks = Vec::new();
        for q in 0..total / threads {
            let r = self.new_reg(Class::B32);
            self.ins(format!("add.s32 {r}, {grow}, {}", q * rstep));
            let row_ok = self.in_bounds(r, o.dims[0], o.outer_ok);
            let g = match (prev, row_step) {
                (Some(p), Some(step)) => {
                    let g = self.new_reg(Class::B64);
                    self.ins(format!("add.s64 {g}, {p}, {step}"));
                    g
                }
                _ => {
                    let (r64, g) = (self.new_reg(Class::B64), self.new_reg(Class::B64));
                    self.ins(format!("cvt.s64.s32 {r64}, {r}"));
                    self.ins(format!("mul.lo.s64 {r64}, {r64}, {stride}"));
                    self.ins(format!("mad.lo.s64 {g}, {r64}, {}, {colbase}", o.esize));
                    g
                }
            };
            prev = Some(g);
            // The thread's chunk stays in its box: rows are `pitch` bytes apart in it.
            let soff = q * rstep * buf.pitch();
            match col_bytes {
                Some(_) if whole_chunks => chunks.push((g, row_ok, soff)),
                Some(cb) => self.copy_sized(cb, row_ok, saddr, soff, g),
                None => self.copy_elements(&o, dtype, row_ok, gcol, g, saddr, soff),
            }
        }
        let (Some(cb), true) = (col_bytes, whole_chunks) else {
            return Ok(());
        };
        // A register src-size costs ptxas about five instructions per copy. When every lane
        // of the warp copies whole chunks (all but the K-tail tile), a row outside the tensor
        // only needs the `ignore-src` predicate (zero fill, nothing read).
        let (whole, all_whole) = (self.setp("eq.s32", cb, 16), self.new_reg(Class::Pred));
        let (partial, done) = (self.new_label(), self.new_label());
        self.ins(format!(
            "vote.sync.all.pred {all_whole}, {whole}, 0xffffffff"
        ));
        self.ins(format!("@!{all_whole} bra {partial}"));
        for &(g, row_ok, soff) in &chunks {
            let skip = self.new_reg(Class::Pred);
            self.ins(format!("not.pred {skip}, {row_ok}"));
            self.ins(format!(
                "cp.async.cg.shared.global [{saddr}+{soff}], [{g}], 16, {skip}"
            ));
        }
        self.ins(format!("bra.uni {done}"));
        self.label(&partial);
        for (g, row_ok, soff) in chunks {
            self.copy_sized(cb, row_ok, saddr, soff, g);
        }
        self.label(&done);
        Ok(())
    }

    /// A masked load's bound as the clipped extent of its tensor dimension (`origin`'s
    /// `clip`): element `i` is kept iff `i + shift < limit`, so tensor coordinates from
    /// `coord + limit - shift` on are cut, and never past the tensor's own extent.
    fn copy_clip(
        &mut self,
        staged: &StagedLoad,
        scalars: &[Reg],
        id: OpId,
    ) -> Result<Option<(usize, Reg)>, CodegenError> {
        let (Some(b), Some(dim)) = (staged.bound, staged.bound_dim(staged.coords.len())) else {
            return Ok(None);
        };
        let rank = staged.coords.len();
        let rest = &scalars[rank..];
        let (shift, limit) = match (b.shift, rest) {
            (Some(_), [s, l]) => (Some(*s), *l),
            (None, [l]) => (None, *l),
            _ => return Err(self.internal(id, "a bounded load without its bound")),
        };
        let (_, dims, _) = self.tensor_regs(staged.tensor, id)?;
        let end = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {end}, {}, {limit}", scalars[dim]));
        if let Some(s) = shift {
            self.ins(format!("sub.s32 {end}, {end}, {s}"));
        }
        self.ins(format!("max.s32 {end}, {end}, 0"));
        self.ins(format!("min.s32 {end}, {end}, {}", dims[dim]));
        Ok(Some((dim, end)))
    }

    /// One 16-byte cp.async of `bytes` bytes (zero-filled), none when `row_ok` is false.
    fn copy_sized(&mut self, bytes: Reg, row_ok: Reg, saddr: Reg, soff: u32, g: Reg) {
        let n = self.new_reg(Class::B32);
        self.ins(format!("selp.b32 {n}, {bytes}, 0, {row_ok}"));
        // With src-size 0 nothing is read, so the address may be past the end.
        self.ins(format!(
            "cp.async.cg.shared.global [{saddr}+{soff}], [{g}], 16, {n}"
        ));
    }

    /// The copy of a tile whose chunks do not divide evenly among the threads.
    fn issue_copy_general(
        &mut self,
        o: &TileOrigin,
        fast: bool,
        dtype: DType,
        dst: Reg,
        buf: &SmemBuffer,
        total: u32,
    ) -> Result<(), CodegenError> {
        let epc = 16 / o.esize;
        let cpr = buf.row_bytes / 16;
        let threads = 32 * self.k.options.num_warps;
        for q in 0..total.div_ceil(threads) {
            let idx = self.new_reg(Class::B32);
            self.ins(format!("add.s32 {idx}, {}, {}", self.tid, q * threads));
            let skip = if (q + 1) * threads > total {
                Some(self.branch_if("ge.u32", idx, total))
            } else {
                None
            };
            let (row, cc) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
            self.ins(format!("div.u32 {row}, {idx}, {cpr}"));
            self.ins(format!("rem.u32 {cc}, {idx}, {cpr}"));
            let saddr = self.smem_addr(dst, row, cc, buf);
            let (grow, gcol) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
            self.ins(format!("add.s32 {grow}, {}, {row}", o.coords[0]));
            self.ins(format!("mad.lo.s32 {gcol}, {cc}, {epc}, {}", o.coords[1]));
            let row_ok = self.in_bounds(grow, o.dims[0], o.outer_ok);
            let gaddr = self.element_addr(o, Some(grow), gcol);
            if fast {
                let bytes = self.new_reg(Class::B32);
                self.ins(format!("sub.s32 {bytes}, {}, {gcol}", o.dims[1]));
                self.ins(format!("max.s32 {bytes}, {bytes}, 0"));
                self.ins(format!("min.s32 {bytes}, {bytes}, {epc}"));
                self.ins(format!("selp.b32 {bytes}, {bytes}, 0, {row_ok}"));
                self.ins(format!("mul.lo.s32 {bytes}, {bytes}, {}", o.esize));
                self.ins(format!(
                    "cp.async.cg.shared.global [{saddr}], [{gaddr}], 16, {bytes}"
                ));
            } else {
                self.copy_elements(o, dtype, row_ok, gcol, gaddr, saddr, 0);
            }
            if let Some(l) = skip {
                self.label(&l);
            }
        }
        Ok(())
    }

    /// Element-by-element copy of one 16-byte chunk (zero past the tensor's edge), for
    /// tensors or coordinates not known to be 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    fn copy_elements(
        &mut self,
        o: &TileOrigin,
        dtype: DType,
        row_ok: Reg,
        gcol: Reg,
        gaddr: Reg,
        saddr: Reg,
        soff: u32,
    ) {
        let ty = mem_ty(dtype);
        for e in 0..16 / o.esize {
            let (c, x) = (self.new_reg(Class::B32), self.new_reg(Class::of(dtype)));
            self.ins(format!("add.s32 {c}, {gcol}, {e}"));
            let p = self.in_bounds(c, o.dims[1], Some(row_ok));
            self.ins(format!("mov.{ty} {x}, 0"));
            self.ins(format!(
                "@{p} ld.global.{ty} {x}, [{gaddr}+{}]",
                e * o.esize
            ));
            self.ins(format!(
                "st.shared.{ty} [{saddr}+{}], {x}",
                soff + e * o.esize
            ));
        }
    }

    /// Shared address of 16-byte chunk `chunk` of row `row` of a buffer stage at `base`.
    pub(crate) fn smem_addr(&mut self, base: Reg, row: Reg, chunk: Reg, buf: &SmemBuffer) -> Reg {
        let off = self.smem_offset(row, chunk, buf);
        let addr = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {addr}, {base}, {off}"));
        addr
    }

    /// Byte offset in a buffer stage of 16-byte chunk `chunk` of row `row`, after the
    /// buffer's XOR swizzle (and its column boxes, [`SmemBuffer::boxed_offset`]).
    pub(crate) fn smem_offset(&mut self, row: Reg, chunk: Reg, buf: &SmemBuffer) -> Reg {
        let per_box = buf.pitch() / 16;
        let (chunk, box_off) = if buf.boxed && per_box < buf.row_bytes / 16 {
            let (c, b) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
            self.ins(format!("and.b32 {c}, {chunk}, {}", per_box - 1));
            self.ins(format!(
                "shr.u32 {b}, {chunk}, {}",
                per_box.trailing_zeros()
            ));
            self.ins(format!("mul.lo.u32 {b}, {b}, {}", buf.box_bytes()));
            (c, Some(b))
        } else {
            (chunk, None)
        };
        let c = match buf.swizzle() {
            Some((shift, mask)) => {
                let (t, c) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                self.ins(format!("shr.u32 {t}, {row}, {shift}"));
                self.ins(format!("and.b32 {t}, {t}, {mask}"));
                self.ins(format!("xor.b32 {c}, {chunk}, {t}"));
                c
            }
            None => chunk,
        };
        let (a, off) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        match box_off {
            Some(b) => self.ins(format!("mad.lo.u32 {a}, {row}, {}, {b}", buf.pitch())),
            None => self.ins(format!("mul.lo.u32 {a}, {row}, {}", buf.row_bytes)),
        }
        self.ins(format!("mad.lo.u32 {off}, {c}, 16, {a}"));
        off
    }
}
