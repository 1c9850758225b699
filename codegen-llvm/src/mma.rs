//! `mma` of shared-memory operands: per 16-wide step of K, `ldmatrix` fragments of A and B from
//! their buffers and one `mma.sync.m16n8k16` per 16x8 fragment of the warp's accumulator
//! sub-tile, through LLVM 14's NVVM intrinsics
//! (`llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4[.trans].b16`, `llvm.nvvm.mma.m16n8k16.row.col.bf16`
//! and, for f16, `.f32.f32`); no inline asm. The accumulator is the result's `#mma` layout
//! ([`fragment_registers`]).

use std::collections::HashMap;

use inkwell::AddressSpace;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue};
use kiln_ir::schedule::{Distribution, Layout, Term};
use kiln_ir::{DType, OpId};

use crate::lower::{LlvmError, Lower, SHARED, Val};

impl<'ctx> Lower<'_, 'ctx> {
    /// `mma(a, b, c?)` with `a` and `b` staged in shared memory.
    pub(crate) fn lower_mma(&mut self, id: OpId) -> Result<(), LlvmError> {
        let op = self.k.ops[id].clone();
        let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
        let dtype = self.k.ty(a).dtype();
        if !matches!(dtype, DType::Bf16 | DType::F16) {
            return Err(self.unsupported(id, "an mma of operands that are not bf16 or f16"));
        }
        let (
            Val::Smem {
                load: la,
                transposed: false,
            },
            Val::Smem {
                load: lb,
                transposed: b_t,
            },
        ) = (self.val(a, id)?, self.val(b, id)?)
        else {
            return Err(self.unsupported(id, "an mma whose A is not a shared, untransposed tile"));
        };
        let Some(Layout::Mma { warps }) = self.k.schedule.layouts.get(&r).cloned() else {
            return Err(self.internal(id, "an mma result without an #mma layout"));
        };
        let shape = self
            .k
            .ty(r)
            .shape()
            .cloned()
            .ok_or_else(|| self.internal(id, "scalar mma"))?;
        let kdim = self.k.ty(a).shape().map(|s| s.cols()).unwrap_or(0) as u32;
        let (m, n) = (shape.rows() as u32, shape.cols() as u32);
        let (wm, wn) = (m / warps[0], n / warps[1]);
        if !wn.is_multiple_of(16) || !kdim.is_multiple_of(16) {
            return Err(self.unsupported(
                id,
                "a warp tile narrower than 16 columns or K not a multiple of 16",
            ));
        }
        let d = self.dist(r, id)?;
        let (fm, fn_) = (wm / 16, wn / 8);
        let frags = fragment_registers(&d, fm, fn_).ok_or_else(|| {
            self.internal(
                id,
                "the #mma distribution lacks an mma.sync fragment element",
            )
        })?;
        let mut acc: Vec<BasicValueEnum<'ctx>> = match op.operands.get(2) {
            Some(&c) => match self.val(c, id)? {
                Val::Tile(regs) => regs,
                _ => return Err(self.internal(id, "an accumulator not in registers")),
            },
            None => vec![self.cx.f32_type().const_zero().into(); d.regs.len()],
        };
        if acc.len() != d.regs.len() {
            return Err(self.internal(id, "accumulator register count"));
        }
        let (ba, bb) = (self.buffer(la)?, self.buffer(lb)?);
        let i32t = self.cx.i32_type();
        let k = |v: u32| i32t.const_int(u64::from(v), false);
        let warp_part = |terms: &[Term]| -> Vec<Term> {
            terms.iter().copied().filter(|t| t.div >= 32).collect()
        };
        let row0 = self.thread_coord(&warp_part(&d.terms[0]))?;
        let col0 = self.thread_coord(&warp_part(&d.terms[1]))?;
        let lane = self.b.build_and(self.tid, k(31), "lane")?;
        let lane16 = self.b.build_and(lane, k(15), "")?;
        let lane8 = self.b.build_and(lane, k(7), "")?;
        let half = self.b.build_right_shift(lane, k(4), false, "")?;
        let quad = self.b.build_right_shift(lane, k(3), false, "")?;
        // ldmatrix x4 matrix j = lane / 8: B's k half is j % 2, its n half j / 2.
        let b_khalf = self.b.build_and(quad, k(1), "")?;
        let b_nhalf = self.b.build_right_shift(quad, k(1), false, "")?;
        let sptr = self.cx.i8_type().ptr_type(AddressSpace::from(SHARED));
        let x4: BasicTypeEnum = self.cx.struct_type(&[i32t.into(); 4], false).into();
        let ldmatrix = |l: &Self, name: &str, row: IntValue<'ctx>, col: IntValue<'ctx>, buf| {
            let p = l.smem_element(buf, row, col, sptr)?;
            let s = l.intrinsic(name, x4, &[p.into()])?.into_struct_value();
            (0..4)
                .map(|i| Ok(l.b.build_extract_value(s, i, "")?))
                .collect::<Result<Vec<BasicValueEnum<'ctx>>, LlvmError>>()
        };
        let add = |l: &Self,
                   x: IntValue<'ctx>,
                   y: IntValue<'ctx>,
                   c: u32|
         -> Result<IntValue<'ctx>, LlvmError> {
            let s = l.b.build_int_add(x, y, "")?;
            Ok(l.b.build_int_add(s, k(c), "")?)
        };
        let mul = |l: &Self, x: IntValue<'ctx>, c: u32| -> Result<IntValue<'ctx>, LlvmError> {
            Ok(l.b.build_int_mul(x, k(c), "")?)
        };
        for ks in 0..kdim / 16 {
            // A [M, K] row-major: lane l addresses row l % 16, k half l / 16 of its fragment.
            let mut afrag = Vec::with_capacity(fm as usize);
            for mi in 0..fm {
                let row = add(self, row0, lane16, mi * 16)?;
                let col = add(self, mul(self, half, 8)?, k(0), ks * 16)?;
                afrag.push(ldmatrix(
                    self,
                    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3i8",
                    row,
                    col,
                    &ba,
                )?);
            }
            // B, two n fragments per ldmatrix: stored [K, N] (transposing load), or [N, K]
            // when the view is transposed (`b.t()`).
            let mut bfrag = Vec::with_capacity(fn_ as usize);
            for nj in (0..fn_).step_by(2) {
                let kk = add(self, mul(self, b_khalf, 8)?, k(0), ks * 16)?;
                let nn = add(self, col0, mul(self, b_nhalf, 8)?, nj * 8)?;
                let regs = if b_t {
                    let nrow = self.b.build_int_add(nn, lane8, "")?;
                    ldmatrix(
                        self,
                        "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3i8",
                        nrow,
                        kk,
                        &bb,
                    )?
                } else {
                    let krow = self.b.build_int_add(kk, lane8, "")?;
                    ldmatrix(
                        self,
                        "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16.p3i8",
                        krow,
                        nn,
                        &bb,
                    )?
                };
                bfrag.push([regs[0], regs[1]]);
                bfrag.push([regs[2], regs[3]]);
            }
            for mi in 0..fm as usize {
                for ni in 0..fn_ as usize {
                    let regs = frags[mi * fn_ as usize + ni];
                    let c = regs.map(|j| acc[j]);
                    let out = self.mma_sync(dtype, &afrag[mi], &bfrag[ni], &c)?;
                    for (j, v) in regs.into_iter().zip(out) {
                        acc[j] = v;
                    }
                }
            }
        }
        self.vals.insert(r, Val::Tile(acc));
        Ok(())
    }

    /// One `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32`.
    fn mma_sync(
        &self,
        dtype: DType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>; 2],
        c: &[BasicValueEnum<'ctx>],
    ) -> Result<[BasicValueEnum<'ctx>; 4], LlvmError> {
        let f32t = self.cx.f32_type();
        let ret: BasicTypeEnum = self.cx.struct_type(&[f32t.into(); 4], false).into();
        let (name, ab): (&str, Vec<BasicValueEnum<'ctx>>) = match dtype {
            DType::Bf16 => (
                "llvm.nvvm.mma.m16n8k16.row.col.bf16",
                a.iter().chain(b).copied().collect(),
            ),
            // The f16 form takes its operands as <2 x half>.
            _ => {
                let h2 = self.cx.f16_type().vec_type(2);
                let cast = a
                    .iter()
                    .chain(b)
                    .map(|&v| Ok(self.b.build_bit_cast(v, h2, "")?))
                    .collect::<Result<_, LlvmError>>()?;
                ("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", cast)
            }
        };
        let args: Vec<BasicValueEnum<'ctx>> = ab.into_iter().chain(c.iter().copied()).collect();
        let s = self.intrinsic(name, ret, &args)?.into_struct_value();
        let mut out = [c[0]; 4];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.b.build_extract_value(s, i as u32, "")?;
        }
        Ok(out)
    }
}

/// Per 16x8 fragment of the warp's sub-tile (row-major), the indices of its four C/D
/// elements among the accumulator's registers; `None` if the distribution lacks one.
///
/// Elements `c0..c3` of lane `4g + q` are at `(g, 2q)`, `(g, 2q + 1)`, `(g + 8, 2q)`,
/// `(g + 8, 2q + 1)` of the fragment (the lane part of the thread terms, fixed by the
/// hardware), so a register's offsets name its fragment and element; the warp's origin in
/// the tile is the warp-level part (`div >= 32`) of the thread terms.
fn fragment_registers(d: &Distribution, fm: u32, fn_: u32) -> Option<Vec<[usize; 4]>> {
    let index: HashMap<&[u32], usize> = d
        .regs
        .iter()
        .enumerate()
        .map(|(i, o)| (o.as_slice(), i))
        .collect();
    let mut out = Vec::new();
    for mi in 0..fm {
        for ni in 0..fn_ {
            let mut regs = [0; 4];
            for (v, r) in regs.iter_mut().enumerate() {
                let v = v as u32;
                let at = [mi * 16 + (v / 2) * 8, ni * 8 + v % 2];
                *r = *index.get(at.as_slice())?;
            }
            out.push(regs);
        }
    }
    Some(out)
}
