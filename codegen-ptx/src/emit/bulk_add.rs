//! sm_90a: an f32 atomic add of a whole register tile applied with bulk reductions
//! ([`kiln_ir::passes::bulk_add`] decides which): every thread holding the tile (the block's,
//! or a warp-specialised kernel's consumer warpgroups, meeting at their named barrier) writes
//! its elements into the staging region, the writes are fenced for the async proxy, and
//! after a barrier the copies start.
//!
//! As boxes ([`AddBoxes`]): the region holds the tile as 128-byte swizzled boxes and thread 0
//! issues one `cp.reduce.async.bulk.tensor .add` a box through the tensor's map, which clips
//! them at the tensor's bounds; an accumulator fragment's rows land in different banks.
//!
//! As rows (rows [`BulkAdds::pitch`] bytes apart): thread `t` issues one
//! `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32` for each row `t`, `t +
//! threads`, .. inside the tensor, the row's last `< 4` columns (a bulk size is a multiple of
//! 16 bytes) as `red.global.add`, then commits its group. The rows are issued side by side:
//! one thread issuing them all kept its warp, and with it the warpgroup's next mma, waiting
//! through a tile's rows at every add, and the first lane of every warp issuing a share of
//! them ran slower than this too (attention backward's keys-major dK/dV kernel at d = 128 on
//! an H100: 1.85 against 1.65 ms, its loop 20% more instructions), though ptxas issues a
//! warp's copies lane by lane (their addresses must be warp-uniform).
//!
//! Before the region is written again (and before the kernel exits) every thread waits for
//! its own group to have read it.

use kiln_ir::schedule::{AddBoxes, BulkAdds, Distribution, Scratch};
use kiln_ir::{OpId, OpKind};

use super::exchange::linear;
use super::{Emitter, ParamRegs};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

impl Emitter<'_> {
    /// Writes atomic `id` through bulk reductions when the schedule says so; `false` when it
    /// is an ordinary per-element atomic.
    pub(super) fn write_bulk_add(&mut self, id: OpId) -> Result<bool, CodegenError> {
        let Some((region, consumers, boxes)) = self
            .k
            .schedule
            .bulk_adds
            .as_ref()
            .filter(|b| b.ops.contains(&id))
            .map(|b| {
                let region = Scratch {
                    offset: b.offset,
                    bytes: b.bytes,
                    small: 0,
                };
                (region, b.consumers, b.boxes.get(&id).cloned())
            })
        else {
            return Ok(false);
        };
        // The threads that hold the tile, stage it and issue its rows, and their barrier: the
        // block's, or the consumer warpgroups' named one in a warp-specialised kernel (the
        // first id the schedule leaves free, as the consumers' other staging writes use).
        let (threads, sync) = match (consumers, self.k.schedule.sched.as_ref()) {
            (None, _) => (32 * self.k.options.num_warps, "bar.sync 0".to_string()),
            (Some(t), Some(s)) => (t, format!("bar.sync {}, {t}", s.free_named_barrier())),
            (Some(_), None) => {
                return Err(self.internal(id, "a consumers' bulk add without a schedule"));
            }
        };
        let op = self.k.ops[id].clone();
        let OpKind::Atomic { tensor, .. } = op.kind else {
            return Err(self.internal(id, "a bulk add that is not an atomic"));
        };
        let parts = op
            .access_operands()
            .ok_or_else(|| self.internal(id, "malformed memory access"))?;
        let value = parts
            .value
            .ok_or_else(|| self.internal(id, "no value operand"))?;
        let dims: Vec<usize> = self
            .k
            .ty(value)
            .shape()
            .map(|s| s.dims().to_vec())
            .ok_or_else(|| self.internal(id, "a bulk add of a scalar"))?;
        let (rows, cols) = match dims[..] {
            [c] => (1, c),
            [r, c] => (r, c),
            _ => return Err(self.internal(id, "a bulk add of a tile of rank > 2")),
        };
        let (ptr, extents, gstrides) = match self.params.get(tensor) {
            Some(ParamRegs::Tensor {
                ptr, dims, strides, ..
            }) => (*ptr, dims.clone(), strides.clone()),
            _ => return Err(self.internal(id, "not a tensor parameter")),
        };
        let rank = extents.len();
        let pitch = BulkAdds::pitch(cols);
        let strides: Vec<u32> = if dims.len() == 1 {
            vec![1]
        } else {
            vec![pitch / 4, 1]
        };
        let d = self.dist(value, id)?;
        if let Some(b) = boxes {
            let coords = parts
                .addr
                .iter()
                .map(|&c| self.scalar(c, id))
                .collect::<Result<Vec<_>, _>>()?;
            self.write_add_boxes(id, (value, &d), &b, region, &sync, &coords)?;
            return Ok(true);
        }

        self.comment("f32 atomic add of a whole tile: staged, one bulk reduction a row");
        let tid = self.tid;
        // The previous bulk add has read the staging region (each thread its own rows).
        self.before_add_staging(id, &sync);
        let base = self.element_address(&d, &strides, 4, region);
        if d.column_pairs() {
            for pair in d.regs.chunks(2) {
                let at = linear(&pair[0], &strides) * 4;
                let lo = self.elem(value, &pair[0], id)?;
                let hi = self.elem(value, &pair[1], id)?;
                self.ins(format!("st.shared.v2.f32 [{base}+{at}], {{{lo}, {hi}}}"));
            }
        } else {
            for offs in &d.regs {
                let at = linear(offs, &strides) * 4;
                let e = self.elem(value, offs, id)?;
                self.ins(format!("st.shared.f32 [{base}+{at}], {e}"));
            }
        }
        // The bulk copies read the region through the async proxy.
        self.ins("fence.proxy.async.shared::cta");
        self.ins(&sync);
        let done = self.new_label();

        // The tile's origin (possibly outside the tensor: only the rows and columns inside
        // are added) and whether the coordinates the tile does not cover are inside.
        let mut g = ptr;
        let tile_rank = dims.len();
        for (dim, &v) in parts.addr.iter().enumerate() {
            let c = self.scalar(v, id)?;
            if kiln_ir::access::tile_dim(dim, rank, tile_rank).is_none() {
                let out = self.setp("ge.u32", c, extents[dim]);
                self.ins(format!("@{out} bra {done}"));
            }
            g = self.offset_by(g, c, gstrides[dim]);
        }
        let (lo_c, hi_c) = self.clip(parts.addr[rank - 1], extents[rank - 1], cols, id)?;
        let none = self.setp("ge.s32", lo_c, hi_c);
        self.ins(format!("@{none} bra {done}"));
        let (lo_r, hi_r, row_stride) = if tile_rank == 2 {
            let (lo, hi) = self.clip(parts.addr[rank - 2], extents[rank - 2], rows, id)?;
            let none = self.setp("ge.s32", lo, hi);
            self.ins(format!("@{none} bra {done}"));
            (lo, hi, gstrides[rank - 2])
        } else {
            let [lo, hi] = self.new_regs(Class::B32);
            self.ins(format!("mov.u32 {lo}, 0"));
            self.ins(format!("mov.u32 {hi}, 1"));
            let s = self.new_reg(Class::B64);
            self.ins(format!("mov.u64 {s}, 0"));
            (lo, hi, s)
        };
        // Columns lo_c.. of each row: a multiple of 4 in bulk, the rest element by element.
        let [n, bulk, bytes] = self.new_regs(Class::B32);
        self.ins(format!("sub.s32 {n}, {hi_c}, {lo_c}"));
        self.ins(format!("and.b32 {bulk}, {n}, -4"));
        self.ins(format!("shl.b32 {bytes}, {bulk}, 2"));
        let whole = self.setp("gt.s32", bulk, 0);
        let tail: Vec<Reg> = (0..3)
            .map(|t| {
                let c = self.new_reg(Class::B32);
                self.ins(format!("add.s32 {c}, {bulk}, {t}"));
                self.setp("lt.s32", c, n)
            })
            .collect();
        let tail_bytes = self.new_reg(Class::B64);
        self.ins(format!("cvt.u64.u32 {tail_bytes}, {bytes}"));
        // This thread's first row, r = lo_r + tid, and its global and shared addresses at
        // column lo_c; then every `threads`-th row.
        let r = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {r}, {lo_r}, {tid}"));
        let none_mine = self.setp("ge.s32", r, hi_r);
        self.ins(format!("@{none_mine} bra {done}"));
        let one = one64(self);
        let gaddr = self.offset_by(g, lo_c, one);
        let row_off = self.new_reg(Class::B64);
        let r64 = self.new_reg(Class::B64);
        self.ins(format!("cvt.s64.s32 {r64}, {r}"));
        self.ins(format!("mul.lo.s64 {row_off}, {r64}, {row_stride}"));
        self.ins(format!("mad.lo.s64 {gaddr}, {row_off}, 4, {gaddr}"));
        let gstep = self.new_reg(Class::B64);
        self.ins(format!("mul.lo.s64 {gstep}, {row_stride}, {}", 4 * threads));
        let saddr = self.new_reg(Class::B32);
        self.ins(format!("mad.lo.u32 {saddr}, {r}, {pitch}, {}", self.smem));
        self.ins(format!("mad.lo.u32 {saddr}, {lo_c}, 4, {saddr}"));
        self.ins(format!("add.u32 {saddr}, {saddr}, {}", region.offset));
        let top = self.new_label();
        self.label(&top);
        self.ins(format!(
            "@{whole} cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{gaddr}], \
             [{saddr}], {bytes}"
        ));
        let (gt, st) = (self.new_reg(Class::B64), self.new_reg(Class::B32));
        self.ins(format!("add.u64 {gt}, {gaddr}, {tail_bytes}"));
        self.ins(format!("add.u32 {st}, {saddr}, {bytes}"));
        for (t, on) in tail.iter().enumerate() {
            let x = self.new_reg(Class::F32);
            self.ins(format!("@{on} ld.shared.f32 {x}, [{st}+{}]", 4 * t));
            self.ins(format!(
                "@{on} red.relaxed.gpu.global.add.f32 [{gt}+{}], {x}",
                4 * t
            ));
        }
        self.ins(format!("add.u64 {gaddr}, {gaddr}, {gstep}"));
        self.ins(format!("add.u32 {saddr}, {saddr}, {}", pitch * threads));
        self.ins(format!("add.s32 {r}, {r}, {threads}"));
        let more = self.setp("lt.s32", r, hi_r);
        self.ins(format!("@{more} bra {top}"));
        self.ins("cp.async.bulk.commit_group");
        self.label(&done);
        Ok(true)
    }

    /// The add of `value` (laid out as `d`; atomic `id`, at tensor coordinates `coords`) as
    /// the TMA reductions of boxes `b`: the threads write their elements into the swizzled
    /// boxes ([`AddBoxes::thread_part`], [`AddBoxes::register_part`]), fence them for the
    /// async proxy and meet at `sync`; thread 0 reduces every box into the tensor, which
    /// clips them at its bounds, and commits its group.
    fn write_add_boxes(
        &mut self,
        id: OpId,
        (value, d): (kiln_ir::ValueId, &Distribution),
        b: &AddBoxes,
        region: Scratch,
        sync: &str,
        coords: &[Reg],
    ) -> Result<(), CodegenError> {
        self.comment(&format!(
            "f32 atomic add of a whole tile: staged in {} swizzled boxes, one TMA reduction each",
            b.boxes
        ));
        // The previous add's boxes have been read (only thread 0 has reductions in flight).
        self.before_add_staging(id, sync);
        // `AddBoxes::thread_part` of the thread's row and column.
        let rb = self.thread_coord(&d.terms[0]);
        let cb = self.thread_coord(&d.terms[1]);
        let [base, x, phase, rp] = self.new_regs(Class::B32);
        self.ins(format!("add.u32 {base}, {}, {}", self.smem, region.offset));
        self.ins(format!("mad.lo.u32 {base}, {rb}, 128, {base}"));
        self.ins(format!(
            "shr.u32 {x}, {cb}, {}",
            AddBoxes::COLUMNS.trailing_zeros()
        ));
        self.ins(format!("mad.lo.u32 {base}, {x}, {}, {base}", b.box_bytes()));
        self.ins(format!("and.b32 {x}, {cb}, 3"));
        self.ins(format!("mad.lo.u32 {base}, {x}, 4, {base}"));
        self.ins(format!("shr.u32 {phase}, {cb}, 2"));
        self.ins(format!("and.b32 {phase}, {phase}, 7"));
        self.ins(format!("and.b32 {rp}, {rb}, 7"));
        self.ins(format!("xor.b32 {phase}, {phase}, {rp}"));
        // Threads at odd rows store the register half a box over (`AddBoxes::odd_row_register`).
        let odd = b.swap_odd_rows.then(|| {
            let bit = self.new_reg(Class::B32);
            self.ins(format!("and.b32 {bit}, {rb}, 1"));
            let odd = self.setp("ne.u32", bit, 0);
            // `SWAP_COLUMNS / 4` chunks further: a power of two.
            let shift = (AddBoxes::SWAP_COLUMNS / 4).trailing_zeros();
            self.ins(format!("shl.b32 {bit}, {bit}, {shift}"));
            self.ins(format!("xor.b32 {phase}, {phase}, {bit}"));
            odd
        });
        // One address register per chunk a register lands in: `base + (phase ^ k) * 16`.
        let mut chunks: std::collections::BTreeMap<u32, Reg> = Default::default();
        let mut at = |e: &mut Self, k: u32| {
            *chunks.entry(k).or_insert_with(|| {
                let r = e.new_reg(Class::B32);
                e.ins(format!("xor.b32 {r}, {phase}, {k}"));
                e.ins(format!("mad.lo.u32 {r}, {r}, 16, {base}"));
                r
            })
        };
        let step = if d.column_pairs() { 2 } else { 1 };
        for group in d.regs.chunks(step) {
            let (k, imm) = b.register_part(group[0][0], group[0][1]);
            let addr = at(self, k);
            let mut elems = Vec::with_capacity(group.len());
            for offs in group {
                let own = self.elem(value, offs, id)?;
                let Some(odd) = &odd else {
                    elems.push(own.to_string());
                    continue;
                };
                let over = self.elem(value, &AddBoxes::odd_row_register(offs), id)?;
                let x = self.new_reg(Class::F32);
                self.ins(format!("selp.f32 {x}, {over}, {own}, {odd}"));
                elems.push(x.to_string());
            }
            match &elems[..] {
                [x] => self.ins(format!("st.shared.f32 [{addr}+{imm}], {x}")),
                _ => self.ins(format!(
                    "st.shared.v2.f32 [{addr}+{imm}], {{{}}}",
                    elems.join(", ")
                )),
            }
        }
        // The reductions read the boxes through the async proxy.
        self.ins("fence.proxy.async.shared::cta");
        self.ins(sync);
        let map = self.tensor_map(b.param, id)?;
        let done = self.new_label();
        let leader = self.setp("eq.u32", self.tid, 0);
        self.ins(format!("@!{leader} bra {done}"));
        let rank = coords.len();
        let (lead, tile) = coords.split_at(rank - 2);
        for j in 0..b.boxes {
            let [src, x] = self.new_regs(Class::B32);
            self.ins(format!(
                "add.u32 {src}, {}, {}",
                self.smem,
                region.offset + j * b.box_bytes()
            ));
            self.ins(format!(
                "add.s32 {x}, {}, {}",
                tile[1],
                j * AddBoxes::COLUMNS
            ));
            // Innermost dimension first.
            let mut at = vec![x.to_string(), tile[0].to_string()];
            at.extend(lead.iter().rev().map(Reg::to_string));
            self.ins(format!(
                "cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.add.tile.bulk_group \
                 [{map}, {{{}}}], [{src}]",
                at.join(", ")
            ));
        }
        self.ins("cp.async.bulk.commit_group");
        self.label(&done);
        Ok(())
    }

    /// Before add `id` writes the staging region: the threads wait for their previous
    /// reductions to have read it and meet, unless a staged mma's barrier before it does
    /// both ([`kiln_ir::schedule::ImpliedBarriers::bulk`]).
    fn before_add_staging(&mut self, id: OpId, sync: &str) {
        if !self.k.schedule.implied_barriers.bulk.contains_key(&id) {
            self.ins("cp.async.bulk.wait_group.read 0");
            self.ins(sync);
        }
    }

    /// Before the kernel exits: every thread waits for its bulk reductions to complete
    /// (their source is the block's shared memory).
    pub(crate) fn write_bulk_drain(&mut self) {
        if self.k.schedule.bulk_adds.is_none() {
            return;
        }
        self.ins("cp.async.bulk.wait_group 0");
    }

    /// `base + c * stride * 4` (`.b64`; `c` a signed 32-bit coordinate, `stride` in
    /// elements).
    fn offset_by(&mut self, base: Reg, c: Reg, stride: Reg) -> Reg {
        let c64 = self.new_reg(Class::B64);
        self.ins(format!("cvt.s64.s32 {c64}, {c}"));
        let off = self.new_reg(Class::B64);
        self.ins(format!("mul.lo.s64 {off}, {c64}, {stride}"));
        let out = self.new_reg(Class::B64);
        self.ins(format!("mad.lo.s64 {out}, {off}, 4, {base}"));
        out
    }

    /// The tile positions `lo..hi` (`.s32`) along a dimension of `len` whose coordinate `v`
    /// starts the tile and whose extent is `extent`: those inside `0..extent`.
    fn clip(
        &mut self,
        v: kiln_ir::ValueId,
        extent: Reg,
        len: usize,
        id: OpId,
    ) -> Result<(Reg, Reg), CodegenError> {
        let c = self.scalar(v, id)?;
        let [lo, hi] = self.new_regs(Class::B32);
        self.ins(format!("neg.s32 {lo}, {c}"));
        self.ins(format!("max.s32 {lo}, {lo}, 0"));
        self.ins(format!("sub.s32 {hi}, {extent}, {c}"));
        self.ins(format!("min.s32 {hi}, {hi}, {len}"));
        Ok((lo, hi))
    }
}

/// A `.b64` register holding 1 (the contiguous dimension's stride, checked at launch).
fn one64(e: &mut Emitter<'_>) -> Reg {
    let r = e.new_reg(Class::B64);
    e.ins(format!("mov.u64 {r}, 1"));
    r
}
