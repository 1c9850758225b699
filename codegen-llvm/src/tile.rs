//! Register tiles: each thread's elements in the order of its layout's
//! [`Distribution`](kiln_ir::schedule::Distribution), elementwise ops with broadcasting,
//! `iota`, and reductions within a warp (butterfly shuffles). bf16 and f16 arithmetic is
//! done in f32 and rounded after each op, as the IR specifies.

use std::collections::{BTreeMap, HashMap};

use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::schedule::{Distribution, Term};
use kiln_ir::{BinaryOp, DType, OpId, OpKind, ReduceOp, UnaryOp, ValueId};

use crate::lower::{LlvmError, Lower, Val};

/// log2(e), to compute `e^x` as `2^(x * log2 e)`.
const LOG2_E: f64 = std::f64::consts::LOG2_E;

impl<'ctx> Lower<'_, 'ctx> {
    /// The distribution of tile `v`'s layout over its shape.
    pub(crate) fn dist(&self, v: ValueId, at: OpId) -> Result<Distribution, LlvmError> {
        self.k.distribution(v).map_err(|e| self.internal(at, e))
    }

    /// `sum_t ((tid / div) % modulo) * mul` over `terms` (an i32; LLVM turns the power-of-two
    /// divisions into shifts and masks).
    pub(crate) fn thread_coord(&self, terms: &[Term]) -> Result<IntValue<'ctx>, LlvmError> {
        let i32t = self.cx.i32_type();
        let mut acc = i32t.const_zero();
        for t in terms {
            let q = self.b.build_int_unsigned_div(
                self.tid,
                i32t.const_int(u64::from(t.div), false),
                "",
            )?;
            let r =
                self.b
                    .build_int_unsigned_rem(q, i32t.const_int(u64::from(t.modulo), false), "")?;
            let m = self
                .b
                .build_int_mul(r, i32t.const_int(u64::from(t.mul), false), "")?;
            acc = self.b.build_int_add(acc, m, "")?;
        }
        Ok(acc)
    }

    /// `iota`: the thread's coordinate along `dim` plus each register's offset.
    pub(crate) fn lower_iota(&mut self, id: OpId, dim: usize) -> Result<(), LlvmError> {
        let r = self.k.ops[id].results[0];
        let d = self.dist(r, id)?;
        let terms = d
            .terms
            .get(dim)
            .ok_or_else(|| self.internal(id, "iota dimension out of range"))?;
        let base = self.thread_coord(terms)?;
        let i32t = self.cx.i32_type();
        let regs = d
            .offsets(dim)
            .map(|o| {
                let v = self
                    .b
                    .build_int_add(base, i32t.const_int(u64::from(o), false), "")?;
                Ok(v.as_basic_value_enum())
            })
            .collect::<Result<_, LlvmError>>()?;
        self.vals.insert(r, Val::Tile(regs));
        Ok(())
    }

    /// `unary`, `binary`, `select`, `cast` on scalars, or per register of the result's layout
    /// (tile operands are matched by register offsets, broadcast dimensions at offset 0).
    pub(crate) fn lower_elementwise(&mut self, id: OpId) -> Result<(), LlvmError> {
        let op = self.k.ops[id].clone();
        let r = op.results[0];
        let in_dtype = match op.kind {
            OpKind::Select => self.k.ty(op.operands[1]).dtype(),
            _ => self.k.ty(op.operands[0]).dtype(),
        };
        let Some(shape) = self.k.ty(r).shape().cloned() else {
            let srcs = op
                .operands
                .iter()
                .map(|&v| self.scalar(v, id))
                .collect::<Result<Vec<_>, _>>()?;
            let v = self.element(id, &op.kind, in_dtype, &srcs)?;
            self.vals.insert(r, Val::Scalar(v));
            return Ok(());
        };
        let d = self.dist(r, id)?;
        let mut index = Vec::with_capacity(op.operands.len());
        for &v in &op.operands {
            let Some(vshape) = self.k.ty(v).shape().cloned() else {
                index.push(None);
                continue;
            };
            let e = self.dist(v, id)?;
            if !e.broadcasts_to(&vshape, &d, &shape) {
                return Err(self.unsupported(id, "operands in layouts that need a conversion"));
            }
            let map: HashMap<Vec<u32>, usize> = e
                .regs
                .into_iter()
                .enumerate()
                .map(|(i, o)| (o, i))
                .collect();
            index.push(Some((vshape, map)));
        }
        let mut out = Vec::with_capacity(d.regs.len());
        for offs in &d.regs {
            let mut srcs = Vec::with_capacity(op.operands.len());
            for (&v, ix) in op.operands.iter().zip(&index) {
                srcs.push(match (self.val(v, id)?, ix) {
                    (Val::Scalar(s), _) => s,
                    (Val::Tile(regs), Some((vshape, map))) => {
                        let want: Vec<u32> = offs
                            .iter()
                            .zip(vshape.dims())
                            .map(|(&o, &n)| if n == 1 { 0 } else { o })
                            .collect();
                        let j = map.get(&want).copied().ok_or_else(|| {
                            self.internal(
                                id,
                                format!(
                                    "{} has no element at {want:?}",
                                    kiln_ir::diag::value_words(self.k, id, v)
                                ),
                            )
                        })?;
                        regs[j]
                    }
                    _ => {
                        return Err(self.internal(
                            id,
                            format!(
                                "{} is not a register tile",
                                kiln_ir::diag::value_words(self.k, id, v)
                            ),
                        ));
                    }
                });
            }
            out.push(self.element(id, &op.kind, in_dtype, &srcs)?);
        }
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }

    /// One element of an elementwise op whose (first value) operands are `in_dtype`.
    fn element(
        &self,
        id: OpId,
        kind: &OpKind,
        in_dtype: DType,
        srcs: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        match kind {
            OpKind::Unary(u) => self.unary(id, *u, in_dtype, srcs[0]),
            OpKind::Binary(b) => self.binary(id, *b, in_dtype, srcs[0], srcs[1]),
            OpKind::Select => {
                Ok(self
                    .b
                    .build_select(srcs[0].into_int_value(), srcs[1], srcs[2], "")?)
            }
            OpKind::Cast { to } => self.cast(srcs[0], in_dtype, *to),
            _ => Err(self.internal(id, "not an elementwise op")),
        }
    }

    fn unary(
        &self,
        id: OpId,
        u: UnaryOp,
        dtype: DType,
        x: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        match dtype {
            DType::F32 | DType::Bf16 | DType::F16 => {
                let x = self.widen(x, dtype)?;
                let f32t = self.cx.f32_type();
                let call = |name: &str, x: FloatValue<'ctx>| {
                    self.intrinsic(name, f32t.into(), &[x.into()])
                        .map(BasicValueEnum::into_float_value)
                };
                let y = match u {
                    UnaryOp::Neg => self.b.build_float_neg(x, "")?,
                    // The IR allows the hardware approximation (ex2.approx).
                    UnaryOp::Exp2 => call("llvm.nvvm.ex2.approx.f", x)?,
                    UnaryOp::Exp => {
                        let s = self.b.build_float_mul(x, f32t.const_float(LOG2_E), "")?;
                        call("llvm.nvvm.ex2.approx.f", s)?
                    }
                    UnaryOp::Log2 | UnaryOp::Log => {
                        return Err(self.unsupported(id, "log and log2"));
                    }
                    UnaryOp::Abs => call("llvm.fabs.f32", x)?,
                    UnaryOp::Sqrt => call("llvm.sqrt.f32", x)?,
                    UnaryOp::Rsqrt => call("llvm.nvvm.rsqrt.approx.f", x)?,
                    UnaryOp::Recip => self.b.build_float_div(f32t.const_float(1.0), x, "")?,
                    UnaryOp::Not => return Err(self.internal(id, "not of a float")),
                    UnaryOp::Sin
                    | UnaryOp::Cos
                    | UnaryOp::Tanh
                    | UnaryOp::Erf
                    | UnaryOp::Sigmoid => {
                        return Err(self.unsupported(id, "sin, cos, tanh, erf and sigmoid"));
                    }
                };
                self.narrow(y, dtype)
            }
            DType::I32 | DType::U32 | DType::Bool => {
                let x = x.into_int_value();
                let ty = x.get_type();
                let y = match u {
                    UnaryOp::Neg => self.b.build_int_neg(x, "")?,
                    UnaryOp::Not => self.b.build_not(x, "")?,
                    UnaryOp::Abs => {
                        let n = self.b.build_int_neg(x, "")?;
                        let neg =
                            self.b
                                .build_int_compare(IntPredicate::SLT, x, ty.const_zero(), "")?;
                        self.b.build_select(neg, n, x, "")?.into_int_value()
                    }
                    UnaryOp::Exp2
                    | UnaryOp::Exp
                    | UnaryOp::Log2
                    | UnaryOp::Log
                    | UnaryOp::Sqrt
                    | UnaryOp::Rsqrt
                    | UnaryOp::Recip
                    | UnaryOp::Sin
                    | UnaryOp::Cos
                    | UnaryOp::Tanh
                    | UnaryOp::Erf
                    | UnaryOp::Sigmoid => {
                        return Err(self.internal(id, "a float function of an integer"));
                    }
                };
                Ok(y.into())
            }
        }
    }

    fn binary(
        &self,
        id: OpId,
        op: BinaryOp,
        dtype: DType,
        x: BasicValueEnum<'ctx>,
        y: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        let b = &self.b;
        match dtype {
            DType::F32 | DType::Bf16 | DType::F16 => {
                let (x, y) = (self.widen(x, dtype)?, self.widen(y, dtype)?);
                let f32t = self.cx.f32_type();
                let cmp = |p: FloatPredicate| -> Result<BasicValueEnum<'ctx>, LlvmError> {
                    Ok(b.build_float_compare(p, x, y, "")?.into())
                };
                let z = match op {
                    BinaryOp::Add => b.build_float_add(x, y, "")?,
                    BinaryOp::Sub => b.build_float_sub(x, y, "")?,
                    BinaryOp::Mul => b.build_float_mul(x, y, "")?,
                    BinaryOp::Div => b.build_float_div(x, y, "")?,
                    BinaryOp::Rem => b.build_float_rem(x, y, "")?,
                    // minnum/maxnum: a NaN operand yields the other, as the IR specifies.
                    BinaryOp::Min => self
                        .intrinsic("llvm.minnum.f32", f32t.into(), &[x.into(), y.into()])?
                        .into_float_value(),
                    BinaryOp::Max => self
                        .intrinsic("llvm.maxnum.f32", f32t.into(), &[x.into(), y.into()])?
                        .into_float_value(),
                    BinaryOp::Lt => return cmp(FloatPredicate::OLT),
                    BinaryOp::Le => return cmp(FloatPredicate::OLE),
                    BinaryOp::Gt => return cmp(FloatPredicate::OGT),
                    BinaryOp::Ge => return cmp(FloatPredicate::OGE),
                    BinaryOp::Eq => return cmp(FloatPredicate::OEQ),
                    BinaryOp::Ne => return cmp(FloatPredicate::UNE),
                    BinaryOp::And
                    | BinaryOp::Or
                    | BinaryOp::BitAnd
                    | BinaryOp::BitOr
                    | BinaryOp::BitXor
                    | BinaryOp::Shl
                    | BinaryOp::Shr
                    | BinaryOp::MulHi => {
                        return Err(self.internal(id, "a logical or bit op on floats"));
                    }
                };
                self.narrow(z, dtype)
            }
            DType::I32 | DType::U32 | DType::Bool => {
                let (x, y) = (x.into_int_value(), y.into_int_value());
                let cmp = |p: IntPredicate| -> Result<IntValue<'ctx>, LlvmError> {
                    Ok(b.build_int_compare(p, x, y, "")?)
                };
                let z = match op {
                    BinaryOp::Add => b.build_int_add(x, y, "")?,
                    BinaryOp::Sub => b.build_int_sub(x, y, "")?,
                    BinaryOp::Mul => b.build_int_mul(x, y, "")?,
                    BinaryOp::Div => b.build_int_signed_div(x, y, "")?,
                    BinaryOp::Rem => b.build_int_signed_rem(x, y, "")?,
                    BinaryOp::Min => b
                        .build_select(cmp(IntPredicate::SLT)?, x, y, "")?
                        .into_int_value(),
                    BinaryOp::Max => b
                        .build_select(cmp(IntPredicate::SGT)?, x, y, "")?
                        .into_int_value(),
                    BinaryOp::And => b.build_and(x, y, "")?,
                    BinaryOp::Or => b.build_or(x, y, "")?,
                    BinaryOp::Lt => cmp(IntPredicate::SLT)?,
                    BinaryOp::Le => cmp(IntPredicate::SLE)?,
                    BinaryOp::Gt => cmp(IntPredicate::SGT)?,
                    BinaryOp::Ge => cmp(IntPredicate::SGE)?,
                    BinaryOp::Eq => cmp(IntPredicate::EQ)?,
                    BinaryOp::Ne => cmp(IntPredicate::NE)?,
                    BinaryOp::BitAnd
                    | BinaryOp::BitOr
                    | BinaryOp::BitXor
                    | BinaryOp::Shl
                    | BinaryOp::Shr
                    | BinaryOp::MulHi => {
                        return Err(self.unsupported(id, "a bit operation"));
                    }
                };
                Ok(z.into())
            }
        }
    }

    /// Converts an element from `from` to `to` (floats narrow with round to nearest even).
    pub(crate) fn cast(
        &self,
        x: BasicValueEnum<'ctx>,
        from: DType,
        to: DType,
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        if from == to {
            return Ok(x);
        }
        let b = &self.b;
        let f32t = self.cx.f32_type();
        // Through f32 (or i32) first: every conversion below starts from one of the two.
        let f = match from {
            DType::F32 | DType::Bf16 | DType::F16 => Some(self.widen(x, from)?),
            DType::I32 => None,
            DType::Bool => None,
            DType::U32 => return Err(u32_cast()),
        };
        match to {
            DType::F32 | DType::Bf16 | DType::F16 => {
                let v = match (f, from) {
                    (Some(v), _) => v,
                    (None, DType::Bool) => {
                        b.build_unsigned_int_to_float(x.into_int_value(), f32t, "")?
                    }
                    (None, _) => b.build_signed_int_to_float(x.into_int_value(), f32t, "")?,
                };
                self.narrow(v, to)
            }
            DType::I32 => Ok(match f {
                Some(v) => b.build_float_to_signed_int(v, self.cx.i32_type(), "")?,
                None => b.build_int_z_extend(x.into_int_value(), self.cx.i32_type(), "")?,
            }
            .into()),
            DType::U32 => Err(u32_cast()),
            DType::Bool => Ok(match f {
                Some(v) => b.build_float_compare(FloatPredicate::UNE, v, f32t.const_zero(), "")?,
                None => {
                    let x = x.into_int_value();
                    b.build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "")?
                }
            }
            .into()),
        }
    }

    /// The f32 value of a float element (bf16 and f16 are `i16` bits).
    pub(crate) fn widen(
        &self,
        x: BasicValueEnum<'ctx>,
        dtype: DType,
    ) -> Result<FloatValue<'ctx>, LlvmError> {
        let b = &self.b;
        Ok(match dtype {
            // bf16 is the high half of an f32: exact.
            DType::Bf16 => {
                let w = b.build_int_z_extend(x.into_int_value(), self.cx.i32_type(), "")?;
                let s = b.build_left_shift(w, self.cx.i32_type().const_int(16, false), "")?;
                b.build_bit_cast(s, self.cx.f32_type(), "")?
                    .into_float_value()
            }
            DType::F16 => {
                let h = b
                    .build_bit_cast(x, self.cx.f16_type(), "")?
                    .into_float_value();
                b.build_float_ext(h, self.cx.f32_type(), "")?
            }
            DType::F32 | DType::I32 | DType::U32 | DType::Bool => x.into_float_value(),
        })
    }

    /// Rounds an f32 to a `dtype` element (round to nearest even; f32 stays as it is).
    pub(crate) fn narrow(
        &self,
        x: FloatValue<'ctx>,
        dtype: DType,
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        let i16t = self.cx.i16_type();
        match dtype {
            DType::Bf16 => self.intrinsic("llvm.nvvm.f2bf16.rn", i16t.into(), &[x.into()]),
            DType::F16 => self.intrinsic("llvm.nvvm.f2h.rn", i16t.into(), &[x.into()]),
            DType::F32 | DType::I32 | DType::U32 | DType::Bool => Ok(x.into()),
        }
    }

    /// `reduce`: combines each thread's registers of equal coordinates off `dim`, then the
    /// lanes that the thread terms of `dim` spread them over, by butterfly shuffles (every
    /// lane ends with the result, as the result's slice layout says).
    pub(crate) fn lower_reduce(
        &mut self,
        id: OpId,
        rop: ReduceOp,
        dim: usize,
    ) -> Result<(), LlvmError> {
        let op = self.k.ops[id].clone();
        let (x, r) = (op.operands[0], op.results[0]);
        let dtype = self.k.ty(x).dtype();
        if !matches!(dtype, DType::F32 | DType::I32) {
            return Err(self.unsupported(id, "a reduction of a non-f32/i32 tile"));
        }
        let Val::Tile(regs) = self.val(x, id)? else {
            return Err(self.internal(id, "reduction of a non-register tile"));
        };
        let (src, dst) = (self.dist(x, id)?, self.dist(r, id)?);
        let mut acc: BTreeMap<Vec<u32>, BasicValueEnum<'ctx>> = BTreeMap::new();
        for (offs, &v) in src.regs.iter().zip(&regs) {
            let mut key = offs.clone();
            key.remove(dim);
            let v = match acc.get(&key) {
                Some(&a) => self.combine(id, rop, dtype, a, v)?,
                None => v,
            };
            acc.insert(key, v);
        }
        let masks = src
            .lane_masks(dim)
            .ok_or_else(|| self.unsupported(id, "a reduction across warps"))?;
        let (i32t, f32t) = (self.cx.i32_type(), self.cx.f32_type());
        let (shfl, ty) = match dtype {
            DType::F32 => ("llvm.nvvm.shfl.sync.bfly.f32", f32t.into()),
            _ => ("llvm.nvvm.shfl.sync.bfly.i32", i32t.into()),
        };
        let src_rank = src.regs.first().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(dst.regs.len());
        for offs in &dst.regs {
            let mut key = offs.clone();
            if key.len() == src_rank {
                key.remove(dim);
            }
            let mut v = *acc
                .get(&key)
                .ok_or_else(|| self.internal(id, "reduction output without input"))?;
            for &m in &masks {
                let all = i32t.const_all_ones().into();
                let lane_mask = i32t.const_int(u64::from(m), false).into();
                let clamp = i32t.const_int(31, false).into();
                let o = self.intrinsic(shfl, ty, &[all, v, lane_mask, clamp])?;
                v = self.combine(id, rop, dtype, v, o)?;
            }
            out.push(v);
        }
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }

    fn combine(
        &self,
        id: OpId,
        rop: ReduceOp,
        dtype: DType,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        let op = match rop {
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
            ReduceOp::Sum => BinaryOp::Add,
        };
        self.binary(id, op, dtype, a, b)
    }
}

/// A conversion to or from u32, which `lower::beyond_subset` rejects at the user's op first.
fn u32_cast() -> LlvmError {
    kiln_ir::Diagnostic::internal(
        kiln_ir::Loc::default(),
        "a u32 cast reached the LLVM backend past its subset check",
    )
    .into()
}
