//! Tensor-core matrix multiply: `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}` over the
//! accumulator layout `#mma(wm x wn)`, with operands read from swizzled shared memory by
//! `ldmatrix` (`.trans` for an N-contiguous B) or, for A, repacked in registers from an
//! accumulator-layout tile (P in attention's P @ V).

use kiln_ir::schedule::{Layout, SmemBuffer};
use kiln_ir::{DType, OpId};

use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

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

impl Writer<'_> {
    /// Writes `d = a @ b (+ c)`.
    pub(crate) fn write_mma(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
        let Some(Layout::Mma { warps }) = self.k.schedule.layouts.get(&r).cloned() else {
            return Err(self.internal(id, "mma result without an accumulator layout"));
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
        let elem = match self.k.ty(a).dtype() {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            _ => return Err(self.internal(id, "mma operands must be bf16 or f16")),
        };
        let (mf, nf) = (g.wm / 16, g.wn / 8);
        let acc_in: Vec<Reg> = match op.operands.get(2) {
            Some(&c) => self.tile(c, id)?,
            None => {
                let z = self.new_reg(Class::F32);
                self.ins(format!("mov.f32 {z}, 0f00000000"));
                vec![z; (mf * nf * 4) as usize]
            }
        };
        let mut acc: Vec<Reg> = acc_in;
        let lane = self.new_reg(Class::B32);
        let warp = self.new_reg(Class::B32);
        let (wr, wc) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        self.ins(format!("div.u32 {wr}, {warp}, {}", g.warps[1]));
        self.ins(format!("rem.u32 {wr}, {wr}, {}", g.warps[0]));
        self.ins(format!("rem.u32 {wc}, {warp}, {}", g.warps[1]));
        let a_val = self.val(a, id)?;
        let b_val = self.val(b, id)?;
        for s in 0..g.k / 16 {
            let mut a_frags = Vec::new();
            for mi in 0..mf {
                a_frags.push(self.a_fragment(id, &a_val, a, &g, mi, s, lane, wr)?);
            }
            let mut b_frags = Vec::new();
            for np in 0..nf.div_ceil(2) {
                let regs = self.b_fragments(id, &b_val, &g, np, s, lane, wc, nf)?;
                b_frags.extend(regs);
            }
            let mut next = Vec::with_capacity(acc.len());
            for (mi, a4) in a_frags.iter().enumerate() {
                for (ni, b2) in b_frags.iter().enumerate() {
                    let base = (mi * nf as usize + ni) * 4;
                    let d: Vec<Reg> = (0..4).map(|_| self.new_reg(Class::F32)).collect();
                    let c = &acc[base..base + 4];
                    self.ins(format!(
                        "mma.sync.aligned.m16n8k16.row.col.f32.{elem}.{elem}.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}}",
                        d[0], d[1], d[2], d[3], a4[0], a4[1], a4[2], a4[3], b2[0], b2[1], c[0], c[1], c[2], c[3]
                    ));
                    next.extend(d);
                }
            }
            acc = next;
        }
        self.vals.insert(r, Val::Tile(acc));
        Ok(())
    }

    /// The four A registers of m-fragment `mi`, k-step `s`.
    #[allow(clippy::too_many_arguments)]
    fn a_fragment(
        &mut self,
        id: OpId,
        a_val: &Val,
        a: kiln_ir::ValueId,
        g: &Geometry,
        mi: u32,
        s: u32,
        lane: Reg,
        wr: Reg,
    ) -> Result<[Reg; 4], CodegenError> {
        match a_val {
            Val::Smem {
                base,
                buf,
                transposed: false,
            } => {
                // Lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 the same rows at k 8-15.
                let (row, chunk) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                let t = self.new_reg(Class::B32);
                self.ins(format!("and.b32 {t}, {lane}, 15"));
                self.ins(format!("mad.lo.u32 {row}, {wr}, {}, {t}", g.wm));
                self.ins(format!("add.s32 {row}, {row}, {}", mi * 16));
                self.ins(format!("shr.u32 {chunk}, {lane}, 4"));
                self.ins(format!("add.s32 {chunk}, {chunk}, {}", 2 * s));
                self.ldmatrix(*base, row, chunk, buf, false)
            }
            Val::Tile(regs) => {
                let layout = self.k.schedule.layouts.get(&a).cloned();
                if layout
                    != Some(Layout::Mma {
                        warps: [g.warps[0], 1],
                    })
                    || g.warps[1] != 1
                {
                    return Err(
                        self.unsupported(id, "a register A operand not in the accumulator layout")
                    );
                }
                let kn = g.k / 8;
                let at = |ni: u32, v: u32| regs[((mi * kn + ni) * 4 + v) as usize];
                let mut out = [self.tid; 4];
                for (i, (ni, v)) in [(2 * s, 0), (2 * s, 2), (2 * s + 1, 0), (2 * s + 1, 2)]
                    .into_iter()
                    .enumerate()
                {
                    let p = self.new_reg(Class::B32);
                    self.ins(format!("mov.b32 {p}, {{{}, {}}}", at(ni, v), at(ni, v + 1)));
                    out[i] = p;
                }
                Ok(out)
            }
            Val::Smem { .. } | Val::Scalar(_) => {
                Err(self.unsupported(id, "this form of mma A operand"))
            }
        }
    }

    /// The B registers of n-fragments `2np` and `2np + 1` at k-step `s`.
    #[allow(clippy::too_many_arguments)]
    fn b_fragments(
        &mut self,
        id: OpId,
        b_val: &Val,
        g: &Geometry,
        np: u32,
        s: u32,
        lane: Reg,
        wc: Reg,
        nf: u32,
    ) -> Result<Vec<[Reg; 2]>, CodegenError> {
        let Val::Smem {
            base,
            buf,
            transposed,
        } = b_val
        else {
            return Err(self.unsupported(id, "a register-resident mma B operand"));
        };
        let (row, chunk, t) = (
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
        );
        if *transposed {
            // Stored [N, K] (K contiguous): matrix i = lane / 8 covers n 8*(i/2).., k 8*(i%2)..
            self.ins(format!("and.b32 {t}, {lane}, 7"));
            self.ins(format!("mad.lo.u32 {row}, {wc}, {}, {t}", g.wn));
            self.ins(format!("shr.u32 {t}, {lane}, 4"));
            self.ins(format!("mad.lo.u32 {row}, {t}, 8, {row}"));
            self.ins(format!("add.s32 {row}, {row}, {}", np * 16));
            self.ins(format!("shr.u32 {chunk}, {lane}, 3"));
            self.ins(format!("and.b32 {chunk}, {chunk}, 1"));
            self.ins(format!("add.s32 {chunk}, {chunk}, {}", 2 * s));
        } else {
            // Stored [K, N] (N contiguous), read transposed: matrix i covers k 8*(i%2)..,
            // n 8*(i/2)..
            self.ins(format!("and.b32 {t}, {lane}, 15"));
            self.ins(format!("add.s32 {row}, {t}, {}", 16 * s));
            self.ins(format!("shr.u32 {t}, {lane}, 4"));
            self.ins(format!("mul.lo.u32 {chunk}, {wc}, {}", g.wn / 8));
            self.ins(format!("add.s32 {chunk}, {chunk}, {t}"));
            self.ins(format!("add.s32 {chunk}, {chunk}, {}", 2 * np));
        }
        let r = self.ldmatrix(*base, row, chunk, buf, !*transposed)?;
        let mut out = vec![[r[0], r[1]]];
        if 2 * np + 1 < nf {
            out.push([r[2], r[3]]);
        }
        Ok(out)
    }

    /// `ldmatrix.x4` at the lane's row and 16-byte chunk of a shared tile.
    fn ldmatrix(
        &mut self,
        base: Reg,
        row: Reg,
        chunk: Reg,
        buf: &SmemBuffer,
        trans: bool,
    ) -> Result<[Reg; 4], CodegenError> {
        let addr = self.smem_addr(base, row, chunk, buf);
        let r = [
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
        ];
        self.ins(format!(
            "ldmatrix.sync.aligned.m8n8.x4{}.shared.b16 {{{}, {}, {}, {}}}, [{addr}]",
            if trans { ".trans" } else { "" },
            r[0],
            r[1],
            r[2],
            r[3]
        ));
        Ok(r)
    }
}
