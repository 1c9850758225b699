//! Global loads and stores of register tiles (one masked access per element: elements
//! outside the tensor read as zero and are not written, nor are those past a bounded store's
//! limit), scalar loads (masked the same way), and loads staged in shared memory
//! (the whole block copies the tile into its buffer, laid out and swizzled as the
//! `memory_plan` pass's [`SmemBuffer`] says).

use inkwell::basic_block::BasicBlock;
use inkwell::types::BasicType;
use inkwell::values::{IntValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};
use kiln_ir::schedule::SmemBuffer;
use kiln_ir::{OpId, OpKind, ValueId};

use crate::lower::{GLOBAL, LlvmError, Lower, ParamVals, SHARED, Val};

/// Where a tile sits in its tensor, for one thread.
struct TileAt<'ctx> {
    /// Every coordinate outside the tile's dimensions is inside the tensor.
    outer_ok: IntValue<'ctx>,
    /// Element offset (i64, in elements) of the outer coordinates.
    outer_off: IntValue<'ctx>,
    /// Per tile dimension: the coordinate of this thread's register at offset 0.
    base: Vec<IntValue<'ctx>>,
    /// Per tile dimension: the tensor's extent and stride (the innermost stride is 1).
    dims: Vec<(IntValue<'ctx>, Option<IntValue<'ctx>>)>,
    /// The tensor's base address, as a pointer to its element type in global memory.
    ptr: PointerValue<'ctx>,
}

impl<'ctx> Lower<'_, 'ctx> {
    /// `load`: into shared memory when the layout pass staged it there, else into registers.
    pub(crate) fn lower_load(&mut self, id: OpId) -> Result<(), LlvmError> {
        let r = self.k.ops[id].results[0];
        let staged = self
            .k
            .schedule
            .layouts
            .get(&r)
            .is_some_and(|l| l.is_shared());
        if staged {
            return self.lower_smem_load(id);
        }
        let at = self.tile_at(id, r)?;
        let d = self.dist(r, id)?;
        let ety = self.elem_type(self.k.ty(r).dtype());
        let mut regs = Vec::with_capacity(d.regs.len());
        for offs in &d.regs {
            let (ok, p) = self.element_address(&at, offs)?;
            let (from, done) = self.guard(ok)?;
            let v = self.b.build_load(p, "")?;
            let last = self.guard_end(done)?;
            let phi = self.b.build_phi(ety, "")?;
            phi.add_incoming(&[(&v, last), (&ety.const_zero(), from)]);
            regs.push(phi.as_basic_value());
        }
        self.vals.insert(r, Val::Tile(regs));
        Ok(())
    }

    /// `load_scalar`: the element, when every coordinate is inside the tensor, else 0.
    pub(crate) fn lower_load_scalar(&mut self, id: OpId) -> Result<(), LlvmError> {
        let r = self.k.ops[id].results[0];
        let at = self.tile_at(id, r)?;
        let ety = self.elem_type(self.k.ty(r).dtype());
        let (ok, p) = self.element_address(&at, &[])?;
        let (from, done) = self.guard(ok)?;
        let v = self.b.build_load(p, "")?;
        let last = self.guard_end(done)?;
        let phi = self.b.build_phi(ety, "")?;
        phi.add_incoming(&[(&v, last), (&ety.const_zero(), from)]);
        self.vals.insert(r, Val::Scalar(phi.as_basic_value()));
        Ok(())
    }

    /// `store`: each register to its element, when inside the tensor (clipped at a bounded
    /// store's limit).
    pub(crate) fn lower_store(&mut self, id: OpId) -> Result<(), LlvmError> {
        let op = &self.k.ops[id];
        let v = op
            .store_operands()
            .ok_or_else(|| self.internal(id, "store without a value"))?
            .value;
        let Val::Tile(regs) = self.val(v, id)? else {
            return Err(self.unsupported(id, "a store of a tile not in registers"));
        };
        let at = self.tile_at(id, v)?;
        let d = self.dist(v, id)?;
        for (offs, x) in d.regs.iter().zip(regs) {
            let (ok, p) = self.element_address(&at, offs)?;
            let (_, done) = self.guard(ok)?;
            self.b.build_store(p, x)?;
            self.guard_end(done)?;
        }
        Ok(())
    }

    /// `load` of a tile staged in shared memory: after a barrier (earlier readers of the
    /// buffer are done), every thread copies elements `tid, tid + threads, ...` of the
    /// row-major tile (zero outside the tensor) into stage 0 of its buffer, then a barrier
    /// publishes them.
    fn lower_smem_load(&mut self, id: OpId) -> Result<(), LlvmError> {
        let r = self.k.ops[id].results[0];
        let buf = self.buffer(id)?;
        let shape = self
            .k
            .ty(r)
            .shape()
            .cloned()
            .ok_or_else(|| self.internal(id, "a staged load of a scalar"))?;
        if shape.rank() != 2 {
            return Err(self.unsupported(id, "a staged tile that is not 2-D"));
        }
        let (rows, cols) = (shape.rows() as u64, shape.cols() as u64);
        let i32t = self.cx.i32_type();
        let threads = u64::from(self.k.options.num_warps * 32);
        self.barrier()?;
        // The copy loop: e = tid; e < rows * cols; e += threads.
        let pre = self.current_block()?;
        let head = self.cx.append_basic_block(self.f, "copy.head");
        let body = self.cx.append_basic_block(self.f, "copy.body");
        let exit = self.cx.append_basic_block(self.f, "copy.exit");
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        let e = self.b.build_phi(i32t, "e")?;
        e.add_incoming(&[(&self.tid, pre)]);
        let ev = e.as_basic_value().into_int_value();
        let go = self.b.build_int_compare(
            IntPredicate::ULT,
            ev,
            i32t.const_int(rows * cols, false),
            "",
        )?;
        self.b.build_conditional_branch(go, body, exit)?;
        self.b.position_at_end(body);
        let c = i32t.const_int(cols, false);
        let row = self.b.build_int_unsigned_div(ev, c, "")?;
        let col = self.b.build_int_unsigned_rem(ev, c, "")?;
        // The element's global address, as for a register tile whose only register is at
        // (row, col) of this thread.
        let mut at = self.tile_at(id, r)?;
        at.base[0] = self.b.build_int_add(at.base[0], row, "")?;
        at.base[1] = self.b.build_int_add(at.base[1], col, "")?;
        let (ok, p) = self.element_address(&at, &[0, 0])?;
        let ety = self.elem_type(self.k.ty(r).dtype());
        let (from, done) = self.guard(ok)?;
        let v = self.b.build_load(p, "")?;
        let last = self.guard_end(done)?;
        let phi = self.b.build_phi(ety, "")?;
        phi.add_incoming(&[(&v, last), (&ety.const_zero(), from)]);
        let dst = self.smem_element(&buf, row, col, ety.ptr_type(AddressSpace::from(SHARED)))?;
        self.b.build_store(dst, phi.as_basic_value())?;
        let next = self
            .b
            .build_int_add(ev, i32t.const_int(threads, false), "")?;
        let latch = self.current_block()?;
        e.add_incoming(&[(&next, latch)]);
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(exit);
        self.barrier()?;
        self.vals.insert(
            r,
            Val::Smem {
                load: id,
                transposed: false,
            },
        );
        Ok(())
    }

    /// The shared-memory buffer of staged load `load`.
    pub(crate) fn buffer(&self, load: OpId) -> Result<SmemBuffer, LlvmError> {
        self.k
            .schedule
            .buffer(load)
            .cloned()
            .ok_or_else(|| self.internal(load, "a staged load without a buffer"))
    }

    /// The address (as `ty`, a shared pointer type) of element `(row, col)` of stage 0 of
    /// `buf`: row-major rows of `row_bytes`, 16-byte chunks XOR-swizzled by the buffer's
    /// [`SmemBuffer::swizzle`].
    pub(crate) fn smem_element(
        &self,
        buf: &SmemBuffer,
        row: IntValue<'ctx>,
        col: IntValue<'ctx>,
        ty: inkwell::types::PointerType<'ctx>,
    ) -> Result<PointerValue<'ctx>, LlvmError> {
        let b = &self.b;
        let i32t = self.cx.i32_type();
        let k = |v: u32| i32t.const_int(u64::from(v), false);
        let smem = self
            .smem
            .ok_or_else(|| self.internal(buf.load, "a buffer without shared memory"))?;
        let bytes = b.build_int_mul(col, k(2), "")?;
        let mut chunk = b.build_right_shift(bytes, k(4), false, "")?;
        let within = b.build_and(bytes, k(15), "")?;
        if let Some((shift, mask)) = buf.swizzle() {
            let s = b.build_right_shift(row, k(shift), false, "")?;
            let s = b.build_and(s, k(mask), "")?;
            chunk = b.build_xor(chunk, s, "")?;
        }
        let off = b.build_int_mul(row, k(buf.row_bytes), "")?;
        let off = b.build_int_add(off, k(buf.offset), "")?;
        let off = b.build_int_add(off, b.build_int_mul(chunk, k(16), "")?, "")?;
        let off = b.build_int_add(off, within, "")?;
        // SAFETY: the offset is inside the block's dynamic shared memory, whose size the
        // launch requests (`dynamic_smem_bytes` covers every buffer).
        let p = unsafe { b.build_gep(smem, &[off], "")? };
        Ok(b.build_pointer_cast(p, ty, "")?)
    }

    /// The tensor, outer coordinates and per-dimension thread coordinates of the tile that
    /// load or store `id` accesses, whose value (in registers: its layout's thread terms; a
    /// scalar load's: no tile dimension) is `v`. A bounded store's dimension is checked
    /// against `min(extent, max(limit, 0))`.
    fn tile_at(&self, id: OpId, v: ValueId) -> Result<TileAt<'ctx>, LlvmError> {
        let op = &self.k.ops[id];
        let (tensor, ncoords, limit) = match op.kind {
            OpKind::Load { tensor, .. } | OpKind::LoadScalar { tensor } => {
                (tensor, op.operands.len(), None)
            }
            OpKind::Store { tensor, .. } => {
                let parts = op
                    .store_operands()
                    .ok_or_else(|| self.internal(id, "store without a value"))?;
                (tensor, parts.coords.len(), parts.limit)
            }
            _ => return Err(self.internal(id, "not a load or store")),
        };
        let Some(ParamVals::Tensor { ptr, dims, strides }) = self.params.get(tensor) else {
            return Err(self.internal(id, "not a tensor parameter"));
        };
        let rank = match op.kind {
            OpKind::LoadScalar { .. } => 0,
            _ => self
                .k
                .ty(v)
                .shape()
                .map(|s| s.rank())
                .ok_or_else(|| self.internal(id, "a load or store of a scalar"))?,
        };
        if ncoords != dims.len() || rank > ncoords {
            return Err(self.internal(id, "coordinates do not match the tensor's rank"));
        }
        let lead = ncoords - rank;
        let terms = match self.k.schedule.layouts.get(&v) {
            _ if rank == 0 => Vec::new(),
            Some(l) if l.is_shared() => vec![Vec::new(); rank],
            _ => self.dist(v, id)?.terms,
        };
        let (b, i64t) = (&self.b, self.cx.i64_type());
        let mut dims = dims.clone();
        if let Some((dim, limit)) = limit {
            let (limit, zero) = (self.int(limit, id)?, self.cx.i32_type().const_zero());
            let extent = dims
                .get_mut(dim)
                .ok_or_else(|| self.internal(id, "a bound past the tensor's rank"))?;
            let neg = b.build_int_compare(IntPredicate::SLT, limit, zero, "")?;
            let limit = b.build_select(neg, zero, limit, "")?.into_int_value();
            let past = b.build_int_compare(IntPredicate::SLT, *extent, limit, "")?;
            *extent = b.build_select(past, *extent, limit, "")?.into_int_value();
        }
        let mut outer_ok = self.cx.bool_type().const_all_ones();
        let mut outer_off = i64t.const_zero();
        let mut base = Vec::with_capacity(rank);
        let mut tdims = Vec::with_capacity(rank);
        for d in 0..ncoords {
            let c = self.int(op.operands[d], id)?;
            let inner = d + 1 == ncoords;
            let stride = (!inner).then_some(strides[d]);
            if d < lead {
                let ok = b.build_int_compare(IntPredicate::ULT, c, dims[d], "")?;
                outer_ok = b.build_and(outer_ok, ok, "")?;
                let off = b.build_int_mul(b.build_int_s_extend(c, i64t, "")?, strides[d], "")?;
                outer_off = b.build_int_add(outer_off, off, "")?;
            } else {
                let t = self.thread_coord(&terms[d - lead])?;
                base.push(b.build_int_add(c, t, "")?);
                tdims.push((dims[d], stride));
            }
        }
        let ety = self.elem_type(self.k.ty(v).dtype());
        let ptr = b.build_pointer_cast(*ptr, ety.ptr_type(AddressSpace::from(GLOBAL)), "")?;
        Ok(TileAt {
            outer_ok,
            outer_off,
            base,
            dims: tdims,
            ptr,
        })
    }

    /// Whether the element at register offsets `offs` of the tile is inside the tensor, and
    /// its address.
    fn element_address(
        &self,
        at: &TileAt<'ctx>,
        offs: &[u32],
    ) -> Result<(IntValue<'ctx>, PointerValue<'ctx>), LlvmError> {
        let (b, i32t, i64t) = (&self.b, self.cx.i32_type(), self.cx.i64_type());
        let mut ok = at.outer_ok;
        let mut off = at.outer_off;
        for ((&base, &(extent, stride)), &o) in at.base.iter().zip(&at.dims).zip(offs) {
            let c = b.build_int_add(base, i32t.const_int(u64::from(o), false), "")?;
            // Unsigned: a negative coordinate is outside too.
            let inside = b.build_int_compare(IntPredicate::ULT, c, extent, "")?;
            ok = b.build_and(ok, inside, "")?;
            let c = b.build_int_s_extend(c, i64t, "")?;
            let term = match stride {
                Some(s) => b.build_int_mul(c, s, "")?,
                None => c,
            };
            off = b.build_int_add(off, term, "")?;
        }
        // SAFETY: the address is only dereferenced under `ok` (inside the tensor).
        let p = unsafe { b.build_gep(at.ptr, &[off], "")? };
        Ok((ok, p))
    }

    /// Branches on `ok` into a new block, where the builder continues; returns the block
    /// that branched and the block [`Lower::guard_end`] rejoins.
    fn guard(&self, ok: IntValue<'ctx>) -> Result<(BasicBlock<'ctx>, BasicBlock<'ctx>), LlvmError> {
        let from = self.current_block()?;
        let inside = self.cx.append_basic_block(self.f, "inside");
        let done = self.cx.append_basic_block(self.f, "done");
        self.b.build_conditional_branch(ok, inside, done)?;
        self.b.position_at_end(inside);
        Ok((from, done))
    }

    /// Ends a [`Lower::guard`]ed block: jumps to `done` and continues there. Returns the
    /// guarded block's last block (for phis).
    fn guard_end(&self, done: BasicBlock<'ctx>) -> Result<BasicBlock<'ctx>, LlvmError> {
        let last = self.current_block()?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        Ok(last)
    }
}
