//! Global memory: register-tile loads and stores, in vectors where the layout gives each
//! thread runs of contiguous columns (`vector`), else with per-element bounds checks (a
//! bounded store's against its clipped extent); tensors the kernel never writes are read
//! through the read-only path (`ld.global.nc`); scalar loads predicated on their index, and
//! the shared stage of a staged load (copied by `copy`).

use std::collections::BTreeMap;

use kiln_ir::passes::staged_load;
use kiln_ir::schedule::Distribution;
use kiln_ir::{DType, OpId, OpKind, ValueId};

use super::vector::vector_width;
use super::{Emitter, ParamRegs, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg, mem_ty};

/// Where a tile sits in its tensor: the address of the tile's origin row/column base and
/// the registers needed for bounds checks.
pub(super) struct TileOrigin {
    /// Global address of element `(outer coords..., 0, 0)` (`.b64`).
    pub(super) base: Reg,
    /// Whether every outer coordinate is inside the tensor (`None`: there is none).
    pub(super) outer_ok: Option<Reg>,
    /// Per tile dimension: the tensor coordinate of the tile's first element.
    pub(super) coords: Vec<Reg>,
    /// Per tile dimension: the tensor's extent.
    pub(super) dims: Vec<Reg>,
    /// The row stride in elements (`.b64`), for 2-D tiles.
    pub(super) row_stride: Option<Reg>,
    /// Element size in bytes.
    pub(super) esize: u32,
}

impl Emitter<'_> {
    /// This thread's first column of tile `o` (distribution `d`) and, for a 2-D tile, its
    /// first row: the tile's coordinates plus the thread's terms.
    pub(super) fn thread_origin(
        &mut self,
        o: &TileOrigin,
        d: &Distribution,
        tile_rank: usize,
    ) -> (Reg, Option<Reg>) {
        let col_dim = tile_rank - 1;
        let col_base = self.thread_coord(&d.terms[col_dim]);
        let col0 = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {col0}, {}, {col_base}", o.coords[col_dim]));
        let row_base = (tile_rank == 2).then(|| {
            let rb = self.thread_coord(&d.terms[0]);
            let r0 = self.new_reg(Class::B32);
            self.ins(format!("add.s32 {r0}, {}, {rb}", o.coords[0]));
            r0
        });
        (col0, row_base)
    }

    pub(super) fn tensor_regs(
        &self,
        tensor: usize,
        at: OpId,
    ) -> Result<(Reg, Vec<Reg>, Vec<Reg>), CodegenError> {
        match self.params.get(tensor) {
            Some(ParamRegs::Tensor {
                ptr, dims, strides, ..
            }) => Ok((*ptr, dims.clone(), strides.clone())),
            _ => Err(self.internal(at, "not a tensor parameter")),
        }
    }

    /// Where a tile of rank `tile_rank` at `coords` sits in `tensor`; `clip`: a tensor
    /// dimension (one of the tile's) and the extent to check it against instead of the
    /// tensor's (a bounded store's, [`Emitter::clipped_extent`]).
    pub(super) fn origin(
        &mut self,
        tensor: usize,
        coords: &[Reg],
        tile_rank: usize,
        clip: Option<(usize, Reg)>,
        at: OpId,
    ) -> Result<TileOrigin, CodegenError> {
        let (ptr, mut dims, strides) = self.tensor_regs(tensor, at)?;
        if let Some((dim, extent)) = clip {
            *dims
                .get_mut(dim)
                .ok_or_else(|| self.internal(at, "a bound past the tensor's rank"))? = extent;
        }
        let esize = self.k.params[tensor].dtype().size_bytes() as u32;
        let rank = dims.len();
        let outer = rank - tile_rank;
        let mut base = ptr;
        let mut outer_ok = None;
        for d in 0..outer {
            let c64 = self.new_reg(Class::B64);
            self.ins(format!("cvt.s64.s32 {c64}, {}", coords[d]));
            let nb = self.new_reg(Class::B64);
            let off = self.new_reg(Class::B64);
            self.ins(format!("mul.lo.s64 {off}, {c64}, {}", strides[d]));
            self.ins(format!("mad.lo.s64 {nb}, {off}, {esize}, {base}"));
            base = nb;
            let ok = self.setp("lt.u32", coords[d], dims[d]);
            if let Some(prev) = outer_ok {
                self.ins(format!("and.pred {ok}, {ok}, {prev}"));
            }
            outer_ok = Some(ok);
        }
        Ok(TileOrigin {
            base,
            outer_ok,
            coords: coords[outer..].to_vec(),
            dims: dims[outer..].to_vec(),
            row_stride: (tile_rank == 2).then(|| strides[rank - 2]),
            esize,
        })
    }

    /// Global address of tile element `(row, col)` given as `.b32` tensor coordinates.
    pub(super) fn element_addr(&mut self, o: &TileOrigin, row: Option<Reg>, col: Reg) -> Reg {
        let idx = self.new_reg(Class::B64);
        self.ins(format!("cvt.s64.s32 {idx}, {col}"));
        if let (Some(row), Some(stride)) = (row, o.row_stride) {
            let r64 = self.new_reg(Class::B64);
            self.ins(format!("cvt.s64.s32 {r64}, {row}"));
            self.ins(format!("mad.lo.s64 {idx}, {r64}, {stride}, {idx}"));
        }
        let addr = self.new_reg(Class::B64);
        self.ins(format!("mad.lo.s64 {addr}, {idx}, {}, {}", o.esize, o.base));
        addr
    }

    /// `ok = x <u extent` (and `outer_ok`).
    pub(super) fn in_bounds(&mut self, x: Reg, extent: Reg, outer_ok: Option<Reg>) -> Reg {
        let p = self.setp("lt.u32", x, extent);
        if let Some(q) = outer_ok {
            self.ins(format!("and.pred {p}, {p}, {q}"));
        }
        p
    }

    /// For a register tile `v` moved to or from memory: per register, its element address
    /// (`.b64` register plus byte offset) and in-bounds predicate.
    fn element_accesses(
        &mut self,
        tensor: usize,
        coords: &[Reg],
        clip: Option<(usize, Reg)>,
        v: ValueId,
        at: OpId,
    ) -> Result<Vec<(Reg, u32, Reg)>, CodegenError> {
        let d = self.dist(v, at)?;
        let tile_rank = d.terms.len();
        let o = self.origin(tensor, coords, tile_rank, clip, at)?;
        let col_dim = tile_rank - 1;
        let (col0, row_base) = self.thread_origin(&o, &d, tile_rank);
        // One row pointer and predicate per distinct row offset, one predicate per distinct
        // column offset.
        let mut rows: BTreeMap<u32, (Reg, Reg)> = BTreeMap::new();
        let mut cols: BTreeMap<u32, Reg> = BTreeMap::new();
        let mut out = Vec::with_capacity(d.regs.len());
        for offs in &d.regs {
            let (ro, co) = if tile_rank == 2 {
                (offs[0], offs[1])
            } else {
                (0, offs[0])
            };
            if let std::collections::btree_map::Entry::Vacant(e) = rows.entry(ro) {
                let entry = match row_base {
                    Some(r0) => {
                        let r = self.new_reg(Class::B32);
                        self.ins(format!("add.s32 {r}, {r0}, {ro}"));
                        let ok = self.in_bounds(r, o.dims[0], o.outer_ok);
                        let addr = self.element_addr(&o, Some(r), col0);
                        (addr, ok)
                    }
                    None => {
                        let addr = self.element_addr(&o, None, col0);
                        let ok = self.new_reg(Class::Pred);
                        match o.outer_ok {
                            Some(q) => self.mov(ok, q),
                            None => self.ins(format!("setp.eq.u32 {ok}, 0, 0")),
                        }
                        (addr, ok)
                    }
                };
                e.insert(entry);
            }
            if let std::collections::btree_map::Entry::Vacant(e) = cols.entry(co) {
                let c = self.new_reg(Class::B32);
                self.ins(format!("add.s32 {c}, {col0}, {co}"));
                let ok = self.in_bounds(c, o.dims[col_dim], None);
                e.insert(ok);
            }
            let (addr, rok) = rows[&ro];
            let p = self.new_reg(Class::Pred);
            self.ins(format!("and.pred {p}, {rok}, {}", cols[&co]));
            out.push((addr, co * o.esize, p));
        }
        Ok(out)
    }

    pub(super) fn coord_regs(&self, id: OpId, n: usize) -> Result<Vec<Reg>, CodegenError> {
        self.k.ops[id].operands[..n]
            .iter()
            .map(|&c| self.scalar(c, id))
            .collect()
    }

    /// Writes load `id` (a `load`, or a masked load `staged_load` bounds) staged in shared
    /// memory for `mma`, when it has a buffer; `false` when it has none.
    pub(crate) fn write_staged_load(&mut self, id: OpId) -> Result<bool, CodegenError> {
        let Some(buf) = self.k.schedule.buffer(id).cloned() else {
            return Ok(false);
        };
        let r = self.k.ops[id].results[0];
        let base = match self.pipelined_stage(id) {
            Some(base) => base,
            None => {
                let base = self.new_reg(Class::B32);
                self.ins(format!("add.s32 {base}, {}, {}", self.smem, buf.offset));
                let staged = staged_load::of(self.k, id)
                    .ok_or_else(|| self.internal(id, "a shared tile of no load"))?;
                let scalars = staged
                    .scalars()
                    .into_iter()
                    .map(|c| self.scalar(c, id))
                    .collect::<Result<Vec<_>, _>>()?;
                // Every thread is done reading the previous contents.
                self.ins("bar.sync 0");
                self.issue_copy(id, &scalars, base, &buf, false)?;
                self.ins("cp.async.commit_group");
                self.ins("cp.async.wait_group 0");
                self.async_proxy_fence();
                self.ins("bar.sync 0");
                base
            }
        };
        self.vals.insert(
            r,
            Val::Smem {
                base,
                buf,
                transposed: false,
            },
        );
        Ok(true)
    }

    /// Writes a `load`: into registers, or staged in shared memory for `mma`.
    pub(crate) fn write_load(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let OpKind::Load { tensor, .. } = op.kind else {
            return Err(self.internal(id, "not a load"));
        };
        let r = op.results[0];
        if self.write_staged_load(id)? {
            return Ok(());
        }
        if let Some(base) = self.pipelined_stage(id) {
            let regs = if self.k.schedule.slab(id).is_some() {
                self.read_thread_stage(id, r, base)?
            } else {
                self.read_stage(id, r, base)?
            };
            self.vals.insert(r, Val::Tile(regs));
            return Ok(());
        }
        let coords = self.coord_regs(id, op.operands.len())?;
        let dtype = self.k.ty(r).dtype();
        let d = self.dist(r, id)?;
        let w = vector_width(&d, dtype);
        if w > 1 {
            let col_coord = op.operands[op.operands.len() - 1];
            let regs = self.vector_load(tensor, &coords, col_coord, &d, dtype, w, id)?;
            self.vals.insert(r, Val::Tile(regs));
            return Ok(());
        }
        let space = if self.read_only(tensor) {
            "global.nc"
        } else {
            "global"
        };
        let accesses = self.element_accesses(tensor, &coords, None, r, id)?;
        let mut regs = Vec::with_capacity(accesses.len());
        for (addr, off, p) in accesses {
            regs.push(self.guarded_load(dtype, p, &format!("{addr}+{off}"), space));
        }
        self.vals.insert(r, Val::Tile(regs));
        Ok(())
    }

    /// The registers of load `id`'s tile `r` read from the ring stage at `base` that TMA
    /// filled for this iteration (an [`Operand::Registers`] load: rows packed, unswizzled,
    /// zeros past the tensor's edge): each element at `base + (row * cols + col) * size`,
    /// two neighbours along a row at once where every thread holds pairs at even columns.
    ///
    /// [`Operand::Registers`]: kiln_ir::sched::tma::Operand::Registers
    fn read_stage(&mut self, id: OpId, r: ValueId, base: Reg) -> Result<Vec<Reg>, CodegenError> {
        let dtype = self.k.ty(r).dtype();
        let dims: Vec<u32> = self
            .k
            .ty(r)
            .shape()
            .map(|s| s.dims().iter().map(|&x| x as u32).collect())
            .ok_or_else(|| self.internal(id, "a ring load of a scalar"))?;
        let d = self.dist(r, id)?;
        let size = dtype.size_bytes() as u32;
        // Row-major strides in elements.
        let strides: Vec<u32> = (0..dims.len())
            .map(|i| dims[i + 1..].iter().product())
            .collect();
        let addr = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {addr}, {base}"));
        for (terms, &stride) in d.terms.iter().zip(&strides) {
            if !terms.is_empty() {
                let c = self.thread_coord(terms);
                self.ins(format!("mad.lo.u32 {addr}, {c}, {}, {addr}", stride * size));
            }
        }
        let last = dims.len() - 1;
        let paired = d.terms[last].iter().all(|t| t.mul.is_multiple_of(2))
            && d.regs.len().is_multiple_of(2)
            && d.regs.chunks(2).all(|p| {
                p[0][..last] == p[1][..last]
                    && p[0][last].is_multiple_of(2)
                    && p[1][last] == p[0][last] + 1
            });
        let at = |offs: &[u32]| -> u32 {
            offs.iter().zip(&strides).map(|(o, s)| o * s).sum::<u32>() * size
        };
        let ty = mem_ty(dtype);
        let mut regs = Vec::with_capacity(d.regs.len());
        if paired {
            for p in d.regs.chunks(2) {
                let [x, y] = [0, 1].map(|_| self.new_reg(Class::of(dtype)));
                self.ins(format!(
                    "ld.shared.v2.{ty} {{{x}, {y}}}, [{addr}+{}]",
                    at(&p[0])
                ));
                regs.extend([x, y]);
            }
        } else {
            for offs in &d.regs {
                let x = self.new_reg(Class::of(dtype));
                self.ins(format!("ld.shared.{ty} {x}, [{addr}+{}]", at(offs)));
                regs.push(x);
            }
        }
        Ok(regs)
    }

    /// Writes a `store` of a register tile, skipping elements outside the tensor. A 2-D tile
    /// whose registers pair up along a row at even columns of a 16-byte aligned tensor also
    /// gets a fast path: when the whole of the warp's part lies inside the tensor (every
    /// tile but the edges), each pair is one unpredicated vector store.
    pub(crate) fn write_store(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (OpKind::Store { tensor, .. }, Some(parts)) = (&op.kind, op.store_operands()) else {
            return Err(self.internal(id, "not a store"));
        };
        let (tensor, v) = (*tensor, parts.value);
        let coords = self.coord_regs(id, parts.coords.len())?;
        let clip = match parts.limit {
            Some((dim, limit)) => Some((dim, self.clipped_extent(tensor, dim, limit, id)?)),
            None => None,
        };
        let regs = self.tile(v, id)?;
        let dtype = self.k.ty(v).dtype();
        let d = self.dist(v, id)?;
        let w = vector_width(&d, dtype);
        let col_coord = parts.coords[parts.coords.len() - 1];
        // Wider than a pair: per-vector checks beat the pairs' warp-wide fast path.
        if w > 2 {
            return self.vector_store(tensor, &coords, col_coord, clip, &d, &regs, dtype, w, id);
        }
        let done = match self.paired_store(id, tensor, &coords, clip, v, &regs)? {
            Some(labels) => {
                self.label(&labels.0);
                Some(labels.1)
            }
            None if w > 1 => {
                return self
                    .vector_store(tensor, &coords, col_coord, clip, &d, &regs, dtype, w, id);
            }
            None => None,
        };
        let accesses = self.element_accesses(tensor, &coords, clip, v, id)?;
        for ((addr, off, p), x) in accesses.into_iter().zip(regs) {
            self.ins(format!(
                "@{p} st.global.{} [{addr}+{off}], {x}",
                mem_ty(dtype)
            ));
        }
        if let Some(done) = done {
            self.label(&done);
        }
        Ok(())
    }

    /// A bounded store's extent along tensor dimension `dim`: `min(extent, max(limit, 0))`,
    /// so the unsigned bounds checks skip every row at or past `limit`, and all of them for a
    /// negative one.
    fn clipped_extent(
        &mut self,
        tensor: usize,
        dim: usize,
        limit: ValueId,
        at: OpId,
    ) -> Result<Reg, CodegenError> {
        let limit = self.scalar(limit, at)?;
        let (_, dims, _) = self.tensor_regs(tensor, at)?;
        let extent = *dims
            .get(dim)
            .ok_or_else(|| self.internal(at, "a bound past the tensor's rank"))?;
        let r = self.new_reg(Class::B32);
        self.ins(format!("max.s32 {r}, {limit}, 0"));
        self.ins(format!("min.s32 {r}, {r}, {extent}"));
        Ok(r)
    }

    /// Writes a `load_scalar`: one `ld.global` of the element (read-only path for a `Tensor`),
    /// predicated on every coordinate lying inside the tensor (0 otherwise).
    pub(crate) fn write_load_scalar(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let OpKind::LoadScalar { tensor } = op.kind else {
            return Err(self.internal(id, "not a scalar load"));
        };
        let r = op.results[0];
        let coords = self.coord_regs(id, op.operands.len())?;
        let o = self.origin(tensor, &coords, 0, None, id)?;
        let inside = o
            .outer_ok
            .ok_or_else(|| self.internal(id, "a scalar load from a rank-0 tensor"))?;
        let space = if self.read_only(tensor) {
            "global.nc"
        } else {
            "global"
        };
        let x = self.guarded_load(self.k.ty(r).dtype(), inside, &o.base.to_string(), space);
        self.vals.insert(r, Val::Scalar(x));
        Ok(())
    }

    /// A register of `dtype` holding the global element at `addr` where predicate `inside`
    /// holds, else 0 (what a load outside its tensor reads); `space`: `global` or the
    /// read-only `global.nc`.
    fn guarded_load(&mut self, dtype: DType, inside: Reg, addr: &str, space: &str) -> Reg {
        let x = self.new_reg(Class::of(dtype));
        match dtype {
            DType::F32 => self.ins(format!("mov.f32 {x}, 0f00000000")),
            _ => self.ins(format!("mov.{} {x}, 0", mem_ty(dtype))),
        }
        self.ins(format!(
            "@{inside} ld.{space}.{} {x}, [{addr}]",
            mem_ty(dtype)
        ));
        x
    }

    /// The fast path of [`Emitter::write_store`], when the tile qualifies: branches to the
    /// first returned label (the element-wise stores) unless every lane's elements are inside
    /// the tensor (clipped by `clip`), else stores the pairs and branches to the second (the
    /// end).
    fn paired_store(
        &mut self,
        id: OpId,
        tensor: usize,
        coords: &[Reg],
        clip: Option<(usize, Reg)>,
        v: ValueId,
        regs: &[Reg],
    ) -> Result<Option<(String, String)>, CodegenError> {
        let d = self.dist(v, id)?;
        let dtype = self.k.ty(v).dtype();
        let aligned = self.k.params[tensor].aligned16();
        let col_coord = self.k.ops[id].operands[coords.len() - 1];
        if !d.column_pairs()
            || !matches!(dtype, DType::Bf16 | DType::F16 | DType::F32)
            || !aligned
            || !self.known_multiple(col_coord).is_multiple_of(2)
        {
            return Ok(None);
        }
        let o = self.origin(tensor, coords, 2, clip, id)?;
        let (row0, col0) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        let (rb, cb) = (
            self.thread_coord(&d.terms[0]),
            self.thread_coord(&d.terms[1]),
        );
        self.ins(format!("add.s32 {row0}, {}, {rb}", o.coords[0]));
        self.ins(format!("add.s32 {col0}, {}, {cb}", o.coords[1]));
        // Inside when the first and the last row and column this thread holds are (unsigned
        // compares: a negative coordinate is outside).
        let last = |dim: usize| d.regs.iter().map(|r| r[dim]).max().unwrap_or(0);
        let (lr, lc) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("add.s32 {lr}, {row0}, {}", last(0)));
        self.ins(format!("add.s32 {lc}, {col0}, {}", last(1)));
        let inside = self.in_bounds(lr, o.dims[0], o.outer_ok);
        for (x, extent) in [(row0, o.dims[0]), (col0, o.dims[1]), (lc, o.dims[1])] {
            let ok = self.in_bounds(x, extent, None);
            self.ins(format!("and.pred {inside}, {inside}, {ok}"));
        }
        let all = self.new_reg(Class::Pred);
        self.ins(format!("vote.sync.all.pred {all}, {inside}, 0xffffffff"));
        let (edge, done) = (self.new_label(), self.new_label());
        self.ins(format!("@!{all} bra.uni {edge}"));
        self.comment("the warp's elements all lie inside the tensor: one store per pair");
        let mut rows: BTreeMap<u32, Reg> = BTreeMap::new();
        for (p, pair) in d.regs.chunks(2).zip(regs.chunks(2)) {
            let (ro, co) = (p[0][0], p[0][1]);
            let addr = match rows.get(&ro) {
                Some(&a) => a,
                None => {
                    let r = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {r}, {row0}, {ro}"));
                    let a = self.element_addr(&o, Some(r), col0);
                    rows.insert(ro, a);
                    a
                }
            };
            let off = co * o.esize;
            match dtype {
                DType::F32 => self.ins(format!(
                    "st.global.v2.f32 [{addr}+{off}], {{{}, {}}}",
                    pair[0], pair[1]
                )),
                _ => {
                    let packed = self.new_reg(Class::B32);
                    self.ins(format!("mov.b32 {packed}, {{{}, {}}}", pair[0], pair[1]));
                    self.ins(format!("st.global.b32 [{addr}+{off}], {packed}"));
                }
            }
        }
        self.ins(format!("bra.uni {done}"));
        Ok(Some((edge, done)))
    }
}
