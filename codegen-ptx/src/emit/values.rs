//! The writer's view of IR values: looking up the form each value was written in
//! ([`Val`]), turning lazy and affine tiles into registers, the register of a tile element,
//! thread coordinates of a layout, constants, and whether an op may overwrite an operand.

use kiln_ir::schedule::{Distribution, Term};
use kiln_ir::tmem::epilogue;
use kiln_ir::{BinaryOp, Const, DType, OpId, OpKind, ValueDef, ValueId};

use super::{Emitter, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg, f32_imm};

impl Emitter<'_> {
    /// The writer's form of `v`.
    pub(crate) fn val(&self, v: ValueId, at: OpId) -> Result<Val, CodegenError> {
        self.vals.get(&v).cloned().ok_or_else(|| {
            self.internal(
                at,
                format!("{} is used before it is written", self.value_words(at, v)),
            )
        })
    }

    /// The register of scalar `v`.
    pub(crate) fn scalar(&self, v: ValueId, at: OpId) -> Result<Reg, CodegenError> {
        match self.val(v, at)? {
            Val::Scalar(r) => Ok(r),
            _ => Err(self.internal(at, format!("{} is not a scalar", self.value_words(at, v)))),
        }
    }

    /// The writer's form of `v` with a lazy or affine tile written into registers: what a
    /// loop carries or a branch merges.
    pub(crate) fn in_registers(&mut self, v: ValueId, at: OpId) -> Result<Val, CodegenError> {
        match self.val(v, at)? {
            Val::Affine { .. } | Val::Lazy(_) => Ok(Val::Tile(self.tile(v, at)?)),
            other => Ok(other),
        }
    }

    /// The registers of register tile `v`.
    pub(crate) fn tile(&mut self, v: ValueId, at: OpId) -> Result<Vec<Reg>, CodegenError> {
        match self.val(v, at)? {
            Val::Tile(r) => Ok(r),
            Val::Affine { base, offs } => Ok(self.materialize(base, &offs)),
            Val::Lazy(op) => {
                let d = self.dist(v, at)?;
                d.regs.iter().map(|o| self.lazy_element(op, o)).collect()
            }
            Val::Scalar(_) | Val::Narrowed { .. } | Val::Packed(_) | Val::Smem { .. } => Err(self
                .internal(
                    at,
                    format!("{} is not a register tile", self.value_words(at, v)),
                )),
        }
    }

    /// The registers of an affine tile: `base + off` for each offset.
    pub(crate) fn materialize(&mut self, base: Reg, offs: &[u32]) -> Vec<Reg> {
        offs.iter()
            .map(|o| {
                let x = self.new_reg(Class::B32);
                self.ins(format!("add.s32 {x}, {base}, {o}"));
                x
            })
            .collect()
    }

    /// Whether `v` is read only by `op` and is defined in `op`'s block (a result of an op of
    /// that block, or one of its arguments), so `op` may overwrite its registers: they hold
    /// a fresh value on every execution of the block.
    pub(crate) fn dies_here(&self, v: ValueId, op: OpId) -> bool {
        let single = self.uses.get(&v).is_some_and(|u| u.as_slice() == [op]);
        let home = self.parents.get(&op).copied();
        let local = match self.k.values[v].def {
            kiln_ir::ValueDef::Op(def, _) => self.parents.get(&def).copied() == home,
            kiln_ir::ValueDef::BlockArg {
                op: owner, region, ..
            } => home == Some((Some(owner), region)),
        };
        single && local
    }

    /// The index of the register of tile `v` at offsets `offs`.
    pub(crate) fn reg_index(
        &mut self,
        v: ValueId,
        offs: &[u32],
        at: OpId,
    ) -> Result<usize, CodegenError> {
        if !self.reg_index.contains_key(&v) {
            let d = self.dist(v, at)?;
            let map = d
                .regs
                .into_iter()
                .enumerate()
                .map(|(i, o)| (o, i))
                .collect();
            self.reg_index.insert(v, map);
        }
        self.reg_index
            .get(&v)
            .and_then(|m| m.get(offs))
            .copied()
            .ok_or_else(|| {
                self.internal(
                    at,
                    format!(
                        "{} has no element at register offsets {offs:?}",
                        self.value_words(at, v)
                    ),
                )
            })
    }

    /// The distribution of tile `v`'s layout over its shape (in an epilogue chunk, only the
    /// chunk's registers of a tile in the accumulator's columns: [`Emitter::columns`]).
    pub(crate) fn dist(&self, v: ValueId, at: OpId) -> Result<Distribution, CodegenError> {
        let d = self.k.distribution(v).map_err(|e| self.internal(at, e))?;
        match (&self.columns, self.k.schedule.layouts.get(&v)) {
            (Some(columns), Some(layout)) if epilogue::holds_columns(layout) => {
                Ok(epilogue::chunk(d, columns))
            }
            _ => Ok(d),
        }
    }

    /// A register holding `sum_t ((tid / div) % modulo) * mul` (`.b32`).
    pub(crate) fn thread_coord(&mut self, terms: &[Term]) -> Reg {
        self.thread_coord_of(terms, self.tid)
    }

    /// [`Emitter::thread_coord`] for the thread whose index `tid` holds.
    pub(crate) fn thread_coord_of(&mut self, terms: &[Term], tid: Reg) -> Reg {
        let acc = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {acc}, 0"));
        for t in terms {
            let x = self.new_reg(Class::B32);
            // Layouts divide by powers of two: shifts and masks, not the division sequence.
            if t.div.is_power_of_two() {
                self.ins(format!("shr.u32 {x}, {}, {}", tid, t.div.trailing_zeros()));
            } else {
                self.ins(format!("div.u32 {x}, {}, {}", tid, t.div));
            }
            if t.modulo.is_power_of_two() {
                self.ins(format!("and.b32 {x}, {x}, {}", t.modulo - 1));
            } else {
                self.ins(format!("rem.u32 {x}, {x}, {}", t.modulo));
            }
            self.ins(format!("mad.lo.u32 {acc}, {x}, {}, {acc}", t.mul));
        }
        acc
    }

    /// A register holding constant `c` as a `dtype` scalar.
    pub(crate) fn constant(&mut self, c: Const, dtype: DType) -> Reg {
        let r = self.new_reg(Class::of(dtype));
        let x = match c {
            Const::Int(i) => i as f64,
            Const::Float(f) => f,
            Const::Bool(b) => f64::from(u8::from(b)),
        };
        match dtype {
            DType::F32 => self.ins(format!("mov.f32 {r}, {}", f32_imm(x))),
            DType::I32 => self.ins(format!("mov.b32 {r}, {}", x as i32)),
            // Unsigned constants up to u32::MAX are stored wide; they travel as their bits.
            DType::U32 => {
                let bits = match c {
                    Const::Int(i) => i as u32,
                    _ => x as u32,
                };
                self.ins(format!("mov.b32 {r}, {bits}"));
            }
            DType::Bool => self.ins(format!("setp.ne.u32 {r}, {}, 0", x as u32)),
            DType::Bf16 => {
                let bits = kiln_ir::rounding::to_bf16(x).to_bits();
                self.ins(format!("mov.b16 {r}, 0x{bits:04X}"));
            }
            DType::F16 => {
                let bits = kiln_ir::rounding::to_f16(x).to_bits();
                self.ins(format!("mov.b16 {r}, 0x{bits:04X}"));
            }
        }
        r
    }

    /// A number that statically divides scalar `v` (1 when nothing is known).
    pub(crate) fn known_multiple(&self, v: ValueId) -> u32 {
        const ANY: u32 = 1 << 16;
        match self.k.values[v].def {
            ValueDef::Op(op, _) => {
                let o = &self.k.ops[op];
                match &o.kind {
                    OpKind::Const(Const::Int(0)) => ANY,
                    OpKind::Const(Const::Int(c)) => (c.unsigned_abs().min(ANY as u64)) as u32,
                    OpKind::Binary(BinaryOp::Mul) => self
                        .known_multiple(o.operands[0])
                        .saturating_mul(self.known_multiple(o.operands[1]))
                        .min(ANY),
                    OpKind::Binary(BinaryOp::Add | BinaryOp::Sub) => gcd(
                        self.known_multiple(o.operands[0]),
                        self.known_multiple(o.operands[1]),
                    ),
                    _ => 1,
                }
            }
            ValueDef::BlockArg { op, index: 0, .. }
                if matches!(self.k.ops[op].kind, OpKind::For { .. }) =>
            {
                let o = &self.k.ops[op];
                gcd(
                    self.known_multiple(o.operands[0]),
                    self.known_multiple(o.operands[2]),
                )
            }
            ValueDef::BlockArg { .. } => 1,
        }
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}
