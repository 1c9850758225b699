//! Elementwise operations (`unary`, `binary`, `select`, `cast`) on scalars and register tiles,
//! with broadcasting of slice-layout operands. bf16 and f16 are computed in f32 and rounded
//! after each operation, as the IR specifies.

use kiln_ir::schedule::Distribution;
use kiln_ir::{BinaryOp, DType, OpId, OpKind, Shape, UnaryOp, ValueId};

use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg, f32_imm, half_ty};

/// log2(e), to compute `e^x` as `2^(x * log2 e)`.
const LOG2_E: f64 = std::f64::consts::LOG2_E;

impl Emitter<'_> {
    /// Writes an elementwise op, per register of its result's layout.
    pub(crate) fn write_elementwise(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let r = op.results[0];
        let in_dtype = match op.kind {
            OpKind::Select => self.k.ty(op.operands[1]).dtype(),
            _ => self.k.ty(op.operands[0]).dtype(),
        };
        let out_dtype = self.k.ty(r).dtype();
        let Some(shape) = self.k.ty(r).shape().cloned() else {
            let srcs = op
                .operands
                .iter()
                .map(|&v| self.scalar(v, id))
                .collect::<Result<Vec<_>, _>>()?;
            let reg = self.element(id, &op.kind, in_dtype, out_dtype, &srcs)?;
            self.vals.insert(r, Val::Scalar(reg));
            return Ok(());
        };
        if let OpKind::Cast {
            to: to @ (DType::Bf16 | DType::F16),
        } = op.kind
            && in_dtype == DType::F32
            && self.uses.get(&r).is_some_and(|us| {
                us.iter()
                    .all(|&u| self.k.ops[u].kind == OpKind::Mma && self.k.ops[u].operands[0] == r)
            })
        {
            let src = self.tile(op.operands[0], id)?;
            self.vals.insert(r, Val::Narrowed { src, to });
            return Ok(());
        }
        if let (OpKind::Binary(b @ (BinaryOp::Add | BinaryOp::Sub)), [x, y]) =
            (&op.kind, op.operands.as_slice())
        {
            let (vx, vy) = (self.val(*x, id)?, self.val(*y, id)?);
            let folded = match (vx, vy) {
                (Val::Affine { base, offs }, Val::Scalar(s)) => Some((base, offs, s)),
                (Val::Scalar(s), Val::Affine { base, offs }) if *b == BinaryOp::Add => {
                    Some((base, offs, s))
                }
                _ => None,
            };
            if let Some((base, offs, s)) = folded {
                let nb = self.new_reg(Class::B32);
                self.ins(format!("{}.s32 {nb}, {base}, {s}", b.name()));
                self.vals.insert(r, Val::Affine { base: nb, offs });
                return Ok(());
            }
        }
        let d = self.dist(r, id)?;
        for &v in &op.operands {
            self.check_broadcast(v, &shape, &d, id)?;
        }
        if self.fusable(id, r) {
            self.vals.insert(r, Val::Lazy(id));
            return Ok(());
        }
        self.rounded.clear();
        let mut out = Vec::with_capacity(d.regs.len());
        for offs in &d.regs {
            out.push(self.lazy_element(id, offs)?);
        }
        if let OpKind::Cast {
            to: to @ (DType::Bf16 | DType::F16),
        } = op.kind
            && in_dtype == DType::F32
            && self.uses.get(&r).is_some_and(|us| {
                us.iter()
                    .all(|&u| matches!(self.k.ops[u].kind, OpKind::Store { .. }))
            })
        {
            self.round_in_pairs(&mut out, to);
        }
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }

    /// A stored tile's 16-bit elements rounded from f32, re-rounded in register pairs with
    /// one `cvt.rn.{bf16,f16}x2.f32` each: the pairs a vector store packs (its runs start at
    /// even registers), so the store's packing `mov` folds away. The elements' own
    /// conversions are left unused.
    fn round_in_pairs(&mut self, out: &mut [Reg], to: DType) {
        let ty = if to == DType::Bf16 { "bf16x2" } else { "f16x2" };
        for pair in out.chunks_exact_mut(2) {
            let (Some(&(lo, _)), Some(&(hi, _))) =
                (self.rounded.get(&pair[0]), self.rounded.get(&pair[1]))
            else {
                continue;
            };
            let word = self.new_reg(Class::B32);
            let (a, b) = (self.new_reg(Class::B16), self.new_reg(Class::B16));
            // `d.hi` rounds the first source, `d.lo` the second.
            self.ins(format!("cvt.rn.{ty}.f32 {word}, {hi}, {lo}"));
            self.ins(format!("mov.b32 {{{a}, {b}}}, {word}"));
            pair[0] = a;
            pair[1] = b;
        }
    }

    /// Checks that tile operand `v` of an op with result `shape` in distribution `d` can be
    /// matched to it by register offsets ([`Distribution::broadcasts_to`]).
    pub(super) fn check_broadcast(
        &mut self,
        v: ValueId,
        shape: &Shape,
        d: &Distribution,
        id: OpId,
    ) -> Result<(), CodegenError> {
        let Some(vshape) = self.k.ty(v).shape().cloned() else {
            return Ok(());
        };
        if self.dist(v, id)?.broadcasts_to(&vshape, d, shape) {
            Ok(())
        } else {
            Err(self.unsupported(id, "operands in layouts that need a conversion"))
        }
    }

    /// Whether elementwise op `id` (result `r`) can be left unwritten and computed element by
    /// element inside its only user, an elementwise op or reduction of the same block. This
    /// fuses chains such as masks, so their intermediate tiles never occupy registers at once.
    fn fusable(&self, id: OpId, r: ValueId) -> bool {
        let Some([u]) = self.uses.get(&r).map(Vec::as_slice) else {
            return false;
        };
        let elementwise = matches!(
            self.k.ops[*u].kind,
            OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Select
                | OpKind::Cast { .. }
                | OpKind::Bitcast { .. }
                | OpKind::Reduce { .. }
        );
        elementwise && self.parents.get(u) == self.parents.get(&id)
    }

    /// Writes the element at register offsets `offs` of elementwise op `id`'s result.
    pub(crate) fn lazy_element(&mut self, id: OpId, offs: &[u32]) -> Result<Reg, CodegenError> {
        let op = self.k.ops[id].clone();
        let r = op.results[0];
        let in_dtype = match op.kind {
            OpKind::Select => self.k.ty(op.operands[1]).dtype(),
            _ => self.k.ty(op.operands[0]).dtype(),
        };
        let mut srcs = Vec::with_capacity(op.operands.len());
        for &v in &op.operands {
            srcs.push(self.elem(v, offs, id)?);
        }
        self.element(id, &op.kind, in_dtype, self.k.ty(r).dtype(), &srcs)
    }

    /// The register holding the element of `v` at register offsets `offs` of a consumer of
    /// the same rank (offsets along `v`'s broadcast dimensions are ignored), writing it if
    /// `v` is lazy or affine.
    pub(crate) fn elem(&mut self, v: ValueId, offs: &[u32], at: OpId) -> Result<Reg, CodegenError> {
        let val = self.val(v, at)?;
        if let Val::Scalar(s) = val {
            return Ok(s);
        }
        let vshape = self
            .k
            .ty(v)
            .shape()
            .cloned()
            .ok_or_else(|| self.internal(at, "tile value with a scalar type"))?;
        let want: Vec<u32> = offs
            .iter()
            .zip(vshape.dims())
            .map(|(&o, &n)| if n == 1 { 0 } else { o })
            .collect();
        let j = self.reg_index(v, &want, at)?;
        // The registers were written in the layout of the op that made them; fewer than
        // `v`'s layout has means they were handed across a layout change unconverted.
        let missing = || {
            self.internal(
                at,
                format!(
                    "{} holds fewer registers than its layout",
                    self.value_words(at, v)
                ),
            )
        };
        match val {
            Val::Tile(regs) => regs.get(j).copied().ok_or_else(missing),
            Val::Affine { base, offs } => {
                let o = *offs.get(j).ok_or_else(missing)?;
                let x = self.new_reg(Class::B32);
                self.ins(format!("add.s32 {x}, {base}, {o}"));
                Ok(x)
            }
            Val::Lazy(op) => self.lazy_element(op, &want),
            Val::Scalar(_) | Val::Narrowed { .. } | Val::Packed(_) | Val::Smem { .. } => Err(self
                .internal(
                    at,
                    format!("{} has no register elements", self.value_words(at, v)),
                )),
        }
    }

    /// The f32 value of a float element register.
    pub(crate) fn widen(&mut self, x: Reg, dtype: DType) -> Reg {
        if let (DType::Bf16, Some(&f)) = (dtype, self.widened.get(&x)) {
            return f;
        }
        match half_ty(dtype) {
            Some(ty) => {
                let f = self.new_reg(Class::F32);
                self.ins(format!("cvt.f32.{ty} {f}, {x}"));
                f
            }
            None => x,
        }
    }

    /// Rounds an f32 register to a `dtype` element register.
    pub(crate) fn narrow(&mut self, x: Reg, dtype: DType) -> Reg {
        match half_ty(dtype) {
            Some(ty) => {
                let h = self.new_reg(Class::B16);
                self.ins(format!("cvt.rn.{ty}.f32 {h}, {x}"));
                self.rounded.insert(h, (x, dtype));
                h
            }
            None => x,
        }
    }

    pub(crate) fn element(
        &mut self,
        id: OpId,
        kind: &OpKind,
        in_dtype: DType,
        out_dtype: DType,
        srcs: &[Reg],
    ) -> Result<Reg, CodegenError> {
        match kind {
            OpKind::Unary(u) => self.unary(id, *u, in_dtype, srcs[0]),
            OpKind::Binary(b) => self.binary(id, *b, in_dtype, srcs[0], srcs[1]),
            OpKind::Select => {
                let d = self.new_reg(Class::of(out_dtype));
                let ty = match out_dtype {
                    DType::F32 => "f32",
                    DType::I32 | DType::U32 => "b32",
                    DType::Bf16 | DType::F16 => "b16",
                    DType::Bool => {
                        let t = self.new_reg(Class::Pred);
                        self.ins(format!("and.pred {t}, {}, {}", srcs[0], srcs[1]));
                        self.ins(format!("not.pred {d}, {}", srcs[0]));
                        self.ins(format!("and.pred {d}, {d}, {}", srcs[2]));
                        self.ins(format!("or.pred {d}, {d}, {t}"));
                        return Ok(d);
                    }
                };
                if ty == "b16" {
                    // selp has no 16-bit form; widen through a 32-bit register.
                    let [a, b, w] = self.new_regs(Class::B32);
                    self.ins(format!("cvt.u32.u16 {a}, {}", srcs[1]));
                    self.ins(format!("cvt.u32.u16 {b}, {}", srcs[2]));
                    self.ins(format!("selp.b32 {w}, {a}, {b}, {}", srcs[0]));
                    self.ins(format!("cvt.u16.u32 {d}, {w}"));
                } else {
                    self.ins(format!(
                        "selp.{ty} {d}, {}, {}, {}",
                        srcs[1], srcs[2], srcs[0]
                    ));
                }
                Ok(d)
            }
            OpKind::Cast { to } => self.cast(srcs[0], in_dtype, *to),
            OpKind::Bitcast { to } => Ok(self.bitcast(srcs[0], in_dtype, *to)),
            _ => Err(self.internal(id, "not an elementwise op")),
        }
    }

    fn unary(&mut self, id: OpId, u: UnaryOp, dtype: DType, x: Reg) -> Result<Reg, CodegenError> {
        if dtype == DType::Bool {
            let d = self.new_reg(Class::Pred);
            return match u {
                UnaryOp::Not => {
                    self.ins(format!("not.pred {d}, {x}"));
                    Ok(d)
                }
                _ => Err(self.unsupported(id, "this operator on bool")),
            };
        }
        if dtype.is_int() {
            let d = self.new_reg(Class::B32);
            let opname = match (u, dtype) {
                (UnaryOp::Neg, _) => "neg.s32",
                // A u32 is its own absolute value.
                (UnaryOp::Abs, DType::U32) => return Ok(x),
                (UnaryOp::Abs, _) => "abs.s32",
                (UnaryOp::Not, _) => "not.b32",
                _ => return Err(self.unsupported(id, "this operator on an integer")),
            };
            self.ins(format!("{opname} {d}, {x}"));
            return Ok(d);
        }
        let xf = self.widen(x, dtype);
        let d = self.new_reg(Class::F32);
        match u {
            UnaryOp::Neg => self.ins(format!("neg.f32 {d}, {xf}")),
            UnaryOp::Exp2 => self.ins(format!("ex2.approx.ftz.f32 {d}, {xf}")),
            UnaryOp::Exp => {
                let t = self.new_reg(Class::F32);
                self.ins(format!("mul.f32 {t}, {xf}, {}", f32_imm(LOG2_E)));
                self.ins(format!("ex2.approx.ftz.f32 {d}, {t}"));
            }
            UnaryOp::Abs => self.ins(format!("abs.f32 {d}, {xf}")),
            UnaryOp::Sqrt => self.ins(format!("sqrt.rn.f32 {d}, {xf}")),
            UnaryOp::Rsqrt => self.ins(format!("rsqrt.approx.f32 {d}, {xf}")),
            UnaryOp::Recip => self.ins(format!("rcp.rn.f32 {d}, {xf}")),
            UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tanh
            | UnaryOp::Erf
            | UnaryOp::Sigmoid
            | UnaryOp::Log2
            | UnaryOp::Log => {
                let y = self.transcendental(id, u, xf);
                return Ok(self.narrow(y, dtype));
            }
            UnaryOp::Not => return Err(self.unsupported(id, "`not` on a float")),
        }
        Ok(self.narrow(d, dtype))
    }

    fn binary(
        &mut self,
        id: OpId,
        b: BinaryOp,
        dtype: DType,
        x: Reg,
        y: Reg,
    ) -> Result<Reg, CodegenError> {
        if dtype == DType::Bool {
            let d = self.new_reg(Class::Pred);
            match b {
                BinaryOp::And => self.ins(format!("and.pred {d}, {x}, {y}")),
                BinaryOp::Or => self.ins(format!("or.pred {d}, {x}, {y}")),
                BinaryOp::Ne => self.ins(format!("xor.pred {d}, {x}, {y}")),
                BinaryOp::Eq => {
                    self.ins(format!("xor.pred {d}, {x}, {y}"));
                    self.ins(format!("not.pred {d}, {d}"));
                }
                _ => return Err(self.unsupported(id, "this operator on bool")),
            }
            return Ok(d);
        }
        let int = dtype.is_int();
        let (xs, ys) = if int {
            (x, y)
        } else {
            (self.widen(x, dtype), self.widen(y, dtype))
        };
        // Signedness decides division, remainder, comparisons, min/max, `>>` and `mulhi`.
        let ty = match dtype {
            DType::I32 => "s32",
            DType::U32 => "u32",
            _ => "f32",
        };
        if b.is_comparison() {
            let cmp = match b {
                BinaryOp::Lt => "lt",
                BinaryOp::Le => "le",
                BinaryOp::Gt => "gt",
                BinaryOp::Ge => "ge",
                BinaryOp::Eq => "eq",
                _ => "ne",
            };
            return Ok(self.setp(&format!("{cmp}.{ty}"), xs, ys));
        }
        let d = self.new_reg(if int { Class::B32 } else { Class::F32 });
        let opname = match (b, int) {
            (BinaryOp::Add, _) => format!("add.{ty}"),
            (BinaryOp::Sub, _) => format!("sub.{ty}"),
            (BinaryOp::Mul, true) => format!("mul.lo.{ty}"),
            (BinaryOp::Mul, false) => "mul.f32".into(),
            (BinaryOp::Div, true) => format!("div.{ty}"),
            (BinaryOp::Div, false) => "div.rn.f32".into(),
            (BinaryOp::Rem, true) => format!("rem.{ty}"),
            (BinaryOp::BitAnd, true) => "and.b32".into(),
            (BinaryOp::BitOr, true) => "or.b32".into(),
            (BinaryOp::BitXor, true) => "xor.b32".into(),
            // PTX clamps the (unsigned) amount at 32, as the IR defines.
            (BinaryOp::Shl, true) => "shl.b32".into(),
            (BinaryOp::Shr, true) => format!("shr.{ty}"),
            (BinaryOp::MulHi, true) => format!("mul.hi.{ty}"),
            (BinaryOp::Min, _) => format!("min.{ty}"),
            (BinaryOp::Max, _) => format!("max.{ty}"),
            _ => return Err(self.unsupported(id, "this operator on this type")),
        };
        self.ins(format!("{opname} {d}, {xs}, {ys}"));
        Ok(if int { d } else { self.narrow(d, dtype) })
    }

    /// Reinterprets element register `x` of `from` as `to` (same width).
    pub(crate) fn bitcast(&mut self, x: Reg, from: DType, to: DType) -> Reg {
        if Class::of(from) == Class::of(to) {
            // i32 <-> u32, bf16 <-> f16: the same register bits.
            return x;
        }
        let d = self.new_reg(Class::of(to));
        self.ins(format!("mov.b32 {d}, {x}"));
        d
    }

    /// Converts element register `x` from `from` to `to`.
    pub(crate) fn cast(&mut self, x: Reg, from: DType, to: DType) -> Result<Reg, CodegenError> {
        if from == to {
            return Ok(x);
        }
        let d = self.new_reg(Class::of(to));
        match (from, to) {
            (DType::Bool, DType::I32 | DType::U32) => {
                self.ins(format!("selp.b32 {d}, 1, 0, {x}"));
            }
            // The bits stay: two's complement wrap, as Rust's `as`.
            (DType::I32, DType::U32) | (DType::U32, DType::I32) => return Ok(x),
            (DType::U32, DType::Bool) => self.ins(format!("setp.ne.u32 {d}, {x}, 0")),
            (DType::Bool, _) => {
                let f = self.new_reg(Class::F32);
                self.ins(format!("selp.f32 {f}, 0f3F800000, 0f00000000, {x}"));
                return Ok(self.narrow(f, to));
            }
            (DType::I32, DType::Bool) => self.ins(format!("setp.ne.s32 {d}, {x}, 0")),
            (_, DType::Bool) => {
                let f = self.widen(x, from);
                self.ins(format!("setp.neu.f32 {d}, {f}, 0f00000000"));
            }
            (DType::I32 | DType::U32, _) => {
                let f = self.new_reg(Class::F32);
                let ty = if from == DType::U32 { "u32" } else { "s32" };
                self.ins(format!("cvt.rn.f32.{ty} {f}, {x}"));
                return Ok(self.narrow(f, to));
            }
            (_, DType::I32 | DType::U32) => {
                let f = self.widen(x, from);
                let ty = if to == DType::U32 { "u32" } else { "s32" };
                // Saturating, NaN to 0.
                self.ins(format!("cvt.rzi.{ty}.f32 {d}, {f}"));
            }
            (_, _) => {
                let f = self.widen(x, from);
                return Ok(self.narrow(f, to));
            }
        }
        Ok(d)
    }
}
