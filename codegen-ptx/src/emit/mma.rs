//! Tensor-core matrix multiply: `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}` over the
//! accumulator layout `#mma(wm x wn)`, with operands read from swizzled shared memory by
//! `ldmatrix` (`.trans` for an N-contiguous B or an M-contiguous A) or, for A, repacked in
//! registers from an accumulator-layout tile (P in attention's P @ V). Other register
//! operands are first written to shared memory (`stage`).

use kiln_ir::schedule::{Layout, SmemBuffer};
use kiln_ir::{DType, OpId, ValueId};

use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg, half_ty};

/// Whether all registers are different (a splat shares one register among all elements).
fn distinct(regs: &[Reg]) -> bool {
    let set: std::collections::BTreeSet<Reg> = regs.iter().copied().collect();
    set.len() == regs.len()
}

/// Which mma operand a shared tile feeds, and how it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// A, stored `[M, K]`.
    A,
    /// A stored `[K, M]` (the transpose of a staged register tile, `p.t()`): ldmatrix.trans.
    ACols,
    /// B stored `[N, K]` (the transpose of a loaded tile, `k.t()`): plain ldmatrix.
    BRows,
    /// B stored `[K, N]`: ldmatrix.trans.
    BCols,
}

/// The per-lane addressing of one shared operand in one mma.
struct Lanes {
    which: Operand,
    /// Shared address of the stage.
    base: Reg,
    buf: SmemBuffer,
    /// Lane- and warp-dependent row and chunk of the stored tile.
    row: Reg,
    chunk: Reg,
    /// Per swizzle class of the chunk immediate, the lane's address.
    keyed: Vec<(u32, Reg)>,
    /// Whether the lane's chunk and every fragment's chunk immediate share no bit, so one
    /// `xor` moves between swizzle classes: a warp's first chunk is a multiple of a power
    /// of two above the immediates, or every warp starts at chunk 0.
    xor_ok: bool,
}

/// One k-step's fragments: A per m-fragment, B per pair of n-fragments.
type StepFragments = (Vec<[Reg; 4]>, Vec<[Reg; 4]>);

/// Per-warp geometry of one mma.
struct Geometry {
    /// Warp grid.
    warps: [u32; 2],
    /// Rows and columns of the warp's sub-tile.
    wm: u32,
    wn: u32,
    /// The reduction depth.
    k: u32,
}

impl Emitter<'_> {
    /// Writes `d = a @ b (+ c)`.
    pub(crate) fn write_mma(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
        let warps = match self.k.schedule.layouts.get(&r) {
            Some(Layout::Mma { warps }) => *warps,
            // Column blocks for a ring's warpgroups, which this loop did not get.
            Some(Layout::WgmmaColumns { .. }) => {
                return Err(self
                    .unsupported(
                        id,
                        "its tile has fewer rows than the block's warps take, which only a \
                         warp-specialised ring's wgmma splits by columns, and its loop took none",
                    )
                    .note("a tile of 16 rows a warp (`num_warps` x 16) fits any loop"));
            }
            _ => return Err(self.internal(id, "mma result without an accumulator layout")),
        };
        let shape = self
            .k
            .ty(r)
            .shape()
            .cloned()
            .ok_or_else(|| self.internal(id, "scalar mma"))?;
        let k = self.k.ty(a).shape().map_or(0, |s| s.cols()) as u32;
        let g = Geometry {
            warps,
            wm: shape.rows() as u32 / warps[0],
            wn: shape.cols() as u32 / warps[1],
            k,
        };
        if !k.is_multiple_of(16) {
            return Err(self.unsupported(id, "an mma whose K is not a multiple of 16"));
        }
        let Some(elem) = half_ty(self.k.ty(a).dtype()) else {
            return Err(self.internal(id, "mma operands must be bf16 or f16"));
        };
        let (mf, nf) = (g.wm / 16, g.wn / 8);
        let mut in_place = false;
        let mut acc: Vec<Reg> = match op.operands.get(2) {
            Some(&c) => {
                let regs = self.tile(c, id)?;
                in_place = self.dies_here(c, id) && distinct(&regs);
                regs
            }
            None => {
                let z = self.new_reg(Class::F32);
                self.ins(format!("mov.f32 {z}, 0f00000000"));
                vec![z; (mf * nf * 4) as usize]
            }
        };
        let lane = self.new_reg(Class::B32);
        let warp = self.new_reg(Class::B32);
        let (wr, wc) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        self.ins(format!("div.u32 {wr}, {warp}, {}", g.warps[1]));
        self.ins(format!("rem.u32 {wr}, {wr}, {}", g.warps[0]));
        self.ins(format!("rem.u32 {wc}, {warp}, {}", g.warps[1]));
        // Register operands mma.sync cannot read in place go through shared memory.
        let a_val = match self.k.schedule.staged(a).cloned() {
            Some(st) => self.stage_operand(id, &st)?,
            None => match self.val(a, id)? {
                Val::Affine { .. } | Val::Lazy(_) => Val::Tile(self.tile(a, id)?),
                v => v,
            },
        };
        let b_val = match self.k.schedule.staged(b).cloned() {
            Some(st) => self.stage_operand(id, &st)?,
            None => self.val(b, id)?,
        };
        // Column-boxed buffers are laid out for wgmma's descriptors, not ldmatrix rows.
        if [&a_val, &b_val]
            .iter()
            .any(|v| matches!(v, Val::Smem { buf, .. } if buf.boxed))
        {
            return Err(self.internal(id, "an mma.sync operand in a column-boxed buffer"));
        }
        let mut a_src = match &a_val {
            Val::Smem {
                base,
                buf,
                transposed,
            } => {
                let which = if *transposed {
                    Operand::ACols
                } else {
                    Operand::A
                };
                Some(self.operand_lanes(*base, buf, which, &g, [lane, wr, wc]))
            }
            _ => None,
        };
        let Val::Smem {
            base,
            buf,
            transposed,
        } = &b_val
        else {
            return Err(self.unsupported(id, "a register-resident mma B operand"));
        };
        let which = if *transposed {
            Operand::BRows
        } else {
            Operand::BCols
        };
        let mut b_src = self.operand_lanes(*base, buf, which, &g, [lane, wr, wc]);
        // A GEMM mainloop (its loop's prefetch is deferred to the end of the body) reads every
        // fragment of the tile before its first mma: ptxas then keeps them in distinct
        // registers and overlaps the ldmatrix latency, instead of reusing one register per
        // B quad and waiting on each ldmatrix.
        let upfront = self.pending_prefetch.is_some() && a_src.is_some();
        let mut pre: Vec<StepFragments> = Vec::new();
        for s in 0..g.k / 16 {
            if upfront && s == 0 {
                for t in 0..g.k / 16 {
                    let a_frags = self.a_fragments(id, &mut a_src, &a_val, a, &g, t)?;
                    let b_quads = (0..nf.div_ceil(2))
                        .map(|np| self.b_quad(&mut b_src, np, t))
                        .collect();
                    pre.push((a_frags, b_quads));
                }
            }
            let a_frags = match pre.get(s as usize) {
                Some((a_frags, _)) => a_frags.clone(),
                None => self.a_fragments(id, &mut a_src, &a_val, a, &g, s)?,
            };
            for np in 0..nf.div_ceil(2) {
                let bq = match pre.get(s as usize) {
                    Some((_, b_quads)) => b_quads[np as usize],
                    None => self.b_quad(&mut b_src, np, s),
                };
                for half in 0..2u32.min(nf - 2 * np) {
                    let ni = 2 * np + half;
                    let b2 = [bq[2 * half as usize], bq[2 * half as usize + 1]];
                    for (mi, a4) in a_frags.iter().enumerate() {
                        let base = (mi * nf as usize + ni as usize) * 4;
                        // Accumulate in place when `c` dies here (one use, defined in this
                        // block): no copies, and the loop's carried registers stay put.
                        let d: Vec<Reg> = if in_place || s > 0 {
                            acc[base..base + 4].to_vec()
                        } else {
                            (0..4).map(|_| self.new_reg(Class::F32)).collect()
                        };
                        let c = &acc[base..base + 4];
                        self.ins(format!(
                            "mma.sync.aligned.m16n8k16.row.col.f32.{elem}.{elem}.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}}",
                            d[0], d[1], d[2], d[3], a4[0], a4[1], a4[2], a4[3], b2[0], b2[1], c[0], c[1], c[2], c[3]
                        ));
                        acc.splice(base..base + 4, d);
                    }
                }
            }
        }
        self.vals.insert(r, Val::Tile(acc));
        Ok(())
    }

    /// The per-lane part of an operand's ldmatrix addresses. Row `row + row_imm` and chunk
    /// `chunk + chunk_imm` of the stored tile are read, where `row`/`chunk` depend on the
    /// lane and warp and the immediates on the fragment.
    fn operand_lanes(
        &mut self,
        base: Reg,
        buf: &SmemBuffer,
        which: Operand,
        g: &Geometry,
        [lane, wr, wc]: [Reg; 3],
    ) -> Lanes {
        let [row, chunk, t] = self.new_regs(Class::B32);
        match which {
            Operand::A => {
                // Matrices: rows 0-7 / 8-15 (lanes 0-15) at k 0-7, then at k 8-15.
                self.ins(format!("and.b32 {t}, {lane}, 15"));
                self.ins(format!("mad.lo.u32 {row}, {wr}, {}, {t}", g.wm));
                self.ins(format!("shr.u32 {chunk}, {lane}, 4"));
            }
            Operand::ACols => {
                // Stored [K, M], read transposed: matrix i covers m 8*(i%2).., k 8*(i/2)..
                // (a0..a3: rows 0-7 / 8-15 at k 0-7, then at k 8-15).
                self.ins(format!("and.b32 {row}, {lane}, 7"));
                self.ins(format!("shr.u32 {t}, {lane}, 4"));
                self.ins(format!("mad.lo.u32 {row}, {t}, 8, {row}"));
                self.ins(format!("shr.u32 {t}, {lane}, 3"));
                self.ins(format!("and.b32 {t}, {t}, 1"));
                self.ins(format!("mad.lo.u32 {chunk}, {wr}, {}, {t}", g.wm / 8));
            }
            Operand::BRows => {
                // Stored [N, K]: matrix i = lane / 8 covers n 8*(i/2).., k 8*(i%2)..
                self.ins(format!("and.b32 {t}, {lane}, 7"));
                self.ins(format!("mad.lo.u32 {row}, {wc}, {}, {t}", g.wn));
                self.ins(format!("shr.u32 {t}, {lane}, 4"));
                self.ins(format!("mad.lo.u32 {row}, {t}, 8, {row}"));
                self.ins(format!("shr.u32 {chunk}, {lane}, 3"));
                self.ins(format!("and.b32 {chunk}, {chunk}, 1"));
            }
            Operand::BCols => {
                // Stored [K, N], read transposed: matrix i covers k 8*(i%2).., n 8*(i/2)..
                self.ins(format!("and.b32 {row}, {lane}, 15"));
                self.ins(format!("shr.u32 {t}, {lane}, 4"));
                self.ins(format!("mad.lo.u32 {chunk}, {wc}, {}, {t}", g.wn / 8));
            }
        }
        Lanes {
            which,
            base,
            buf: buf.clone(),
            row,
            chunk,
            keyed: Vec::new(),
            xor_ok: match which {
                Operand::A | Operand::BRows => true,
                Operand::ACols => (g.wm / 8).is_power_of_two() || g.warps[0] == 1,
                Operand::BCols => (g.wn / 8).is_power_of_two() || g.warps[1] == 1,
            },
        }
    }

    /// The A fragments of k-step `s`, one per 16-row m-fragment of the warp tile: read by
    /// ldmatrix when A is in shared memory (`a_src`), else repacked from its registers.
    fn a_fragments(
        &mut self,
        id: OpId,
        a_src: &mut Option<Lanes>,
        a_val: &Val,
        a: ValueId,
        g: &Geometry,
        s: u32,
    ) -> Result<Vec<[Reg; 4]>, CodegenError> {
        let mut frags = Vec::new();
        for mi in 0..g.wm / 16 {
            let frag = match a_src {
                Some(src) if src.which == Operand::ACols => self.ldmatrix(src, 16 * s, 2 * mi),
                Some(src) => self.ldmatrix(src, mi * 16, 2 * s),
                None => self.a_from_registers(id, a_val, a, g, mi, s)?,
            };
            frags.push(frag);
        }
        Ok(frags)
    }

    /// The four A registers of m-fragment `mi`, k-step `s`, repacked from an accumulator
    /// layout tile (bf16 pairs of adjacent columns).
    fn a_from_registers(
        &mut self,
        id: OpId,
        a_val: &Val,
        a: ValueId,
        g: &Geometry,
        mi: u32,
        s: u32,
    ) -> Result<[Reg; 4], CodegenError> {
        let layout = self.k.schedule.layouts.get(&a).cloned();
        if layout
            != Some(Layout::Mma {
                warps: [g.warps[0], 1],
            })
            || g.warps[1] != 1
        {
            return Err(self.unsupported(id, "a register A operand not in the accumulator layout"));
        }
        self.pack_a_fragment(id, a_val, g.k / 8, mi, s)
    }

    /// The four A registers (bf16 pairs) of k16 step `s` of m-fragment `mi`, from a tile in
    /// the accumulator layout with `kn` fragments of 8 columns per m-fragment: the same for
    /// `mma.sync` and the wgmma RS form (docs/ptx.md §4 "The RS A fragment").
    pub(crate) fn pack_a_fragment(
        &mut self,
        id: OpId,
        a_val: &Val,
        kn: u32,
        mi: u32,
        s: u32,
    ) -> Result<[Reg; 4], CodegenError> {
        let (regs, narrow) = match a_val {
            Val::Tile(regs) => (regs, None),
            Val::Narrowed { src, to } => (src, Some(*to)),
            Val::Packed(pairs) => {
                let at = |ni: u32, v: u32| pairs.get(((mi * kn + ni) * 4 + v) as usize / 2);
                let quad = [(2 * s, 0), (2 * s, 2), (2 * s + 1, 0), (2 * s + 1, 2)]
                    .map(|(ni, v)| at(ni, v).copied());
                return match quad {
                    [Some(a), Some(b), Some(c), Some(d)] => Ok([a, b, c, d]),
                    _ => Err(self.internal(id, "an A operand with too few registers")),
                };
            }
            Val::Scalar(_) | Val::Smem { .. } | Val::Affine { .. } | Val::Lazy(_) => {
                return Err(self.unsupported(id, "this form of mma A operand"));
            }
        };
        if regs.len() < ((mi * kn + 2 * s + 2) * 4) as usize {
            return Err(self.internal(id, "an A operand with too few registers"));
        }
        let at = |ni: u32, v: u32| regs[((mi * kn + ni) * 4 + v) as usize];
        let mut out = [self.tid; 4];
        for (i, (ni, v)) in [(2 * s, 0), (2 * s, 2), (2 * s + 1, 0), (2 * s + 1, 2)]
            .into_iter()
            .enumerate()
        {
            let p = self.new_reg(Class::B32);
            let (lo, hi) = (at(ni, v), at(ni, v + 1));
            match narrow {
                // The first source lands in the upper half (docs/ptx.md §6).
                Some(DType::F16) => self.ins(format!("cvt.rn.f16x2.f32 {p}, {hi}, {lo}")),
                Some(_) => self.ins(format!("cvt.rn.bf16x2.f32 {p}, {hi}, {lo}")),
                None => self.ins(format!("mov.b32 {p}, {{{lo}, {hi}}}")),
            }
            out[i] = p;
        }
        Ok(out)
    }

    /// The B quad `np` (n-fragments `2 np` and `2 np + 1`) of k-step `s`.
    fn b_quad(&mut self, b_src: &mut Lanes, np: u32, s: u32) -> [Reg; 4] {
        match b_src.which {
            Operand::BRows => self.ldmatrix(b_src, np * 16, 2 * s),
            Operand::A | Operand::ACols | Operand::BCols => self.ldmatrix(b_src, 16 * s, 2 * np),
        }
    }

    /// `ldmatrix.x4` of the fragment at `(row_imm, chunk_imm)`: a per-lane address computed
    /// once per swizzle class of `chunk_imm`, plus an immediate offset.
    fn ldmatrix(&mut self, src: &mut Lanes, row_imm: u32, chunk_imm: u32) -> [Reg; 4] {
        let swizzle = src.buf.swizzle();
        let mask = swizzle.map_or(0, |(_, m)| m);
        let key = chunk_imm & mask;
        let addr = if swizzle == Some((0, 7)) && src.xor_ok {
            // Stage bases and row offsets are multiples of 128 here, so bits 4-6 of the lane's
            // address are exactly its swizzled chunk: another chunk class is one `xor` away.
            // One lane address per operand, not one per class that ptxas would keep live
            // across the loop.
            let lane = match src.keyed.first() {
                Some((_, a)) => *a,
                None => {
                    let off = self.smem_offset(src.row, src.chunk, &src.buf);
                    let a = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {a}, {}, {off}", src.base));
                    src.keyed.push((0, a));
                    a
                }
            };
            if key == 0 {
                lane
            } else {
                let a = self.new_reg(Class::B32);
                self.ins(format!("xor.b32 {a}, {lane}, {}", key * 16));
                a
            }
        } else {
            match src.keyed.iter().find(|(k, _)| *k == key) {
                Some((_, a)) => *a,
                None => {
                    let c = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {c}, {}, {key}", src.chunk));
                    let off = self.smem_offset(src.row, c, &src.buf);
                    let a = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {a}, {}, {off}", src.base));
                    src.keyed.push((key, a));
                    a
                }
            }
        };
        let imm = row_imm * src.buf.row_bytes + (chunk_imm - key) * 16;
        let r: [Reg; 4] = self.new_regs(Class::B32);
        let trans = if matches!(src.which, Operand::BCols | Operand::ACols) {
            ".trans"
        } else {
            ""
        };
        self.ins(format!(
            "ldmatrix.sync.aligned.m8n8.x4{trans}.shared.b16 {{{}, {}, {}, {}}}, [{addr}+{imm}]",
            r[0], r[1], r[2], r[3]
        ));
        r
    }
}
