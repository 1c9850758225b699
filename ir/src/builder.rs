//! Builds a [`Kernel`] one operation at a time, typing each operation as it is added.
//!
//! Regions nest: `begin_for`/`end_for` and `begin_if`/`begin_else`/`end_if` push and pop the
//! block that new operations go into. Every error is a [`Diagnostic`] at the caller's
//! [`Loc`], so shape and dtype mistakes point at the user's source.

use crate::diag::Diagnostic;
use crate::infer::result_types;
use crate::kernel::{
    Block, Const, Kernel, KernelOptions, Loc, Op, OpId, OpKind, Param, ValueData, ValueDef, ValueId,
};
use crate::types::{DType, Type};

/// An open region: the op that owns it and the block being filled.
#[derive(Debug)]
struct Frame {
    owner: Option<OpId>,
    block: Block,
}

/// The loop variable and carried values of a `for` being built.
#[derive(Clone, Debug)]
pub struct ForScope {
    /// The `For` op.
    pub op: OpId,
    /// The induction variable (i32).
    pub iv: ValueId,
    /// The carried values as seen inside the body.
    pub carried: Vec<ValueId>,
}

/// Builds one kernel. See the module doc.
#[derive(Debug)]
pub struct Builder {
    kernel: Kernel,
    frames: Vec<Frame>,
}

impl Builder {
    /// Starts a kernel with the given parameters.
    pub fn new(name: impl Into<String>, params: Vec<Param>, options: KernelOptions) -> Builder {
        Builder {
            kernel: Kernel::new(name, params, options),
            frames: vec![Frame {
                owner: None,
                block: Block::default(),
            }],
        }
    }

    /// The kernel's parameters.
    pub fn params(&self) -> &[Param] {
        &self.kernel.params
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &Type {
        self.kernel.ty(v)
    }

    /// The kernel built so far (read-only).
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The kernel's launch options, for the DSL calls that set them ([`crate::dsl::cluster`]).
    pub fn options_mut(&mut self) -> &mut crate::kernel::KernelOptions {
        &mut self.kernel.options
    }

    /// Adds an operation whose result types follow from its operands; returns its results.
    pub fn op(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        loc: Loc,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let tys = self.operand_types(operands);
        let results = result_types(&kind, &tys, &self.kernel.params, None)
            .map_err(|e| Diagnostic::new(loc, e))?;
        Ok(self.push(kind, operands, results, loc))
    }

    /// Adds an operation with exactly one result and returns it.
    pub fn op1(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        loc: Loc,
    ) -> Result<ValueId, Diagnostic> {
        let name = format!("{kind:?}");
        let r = self.op(kind, operands, loc)?;
        match r.as_slice() {
            [v] => Ok(*v),
            _ => Err(Diagnostic::internal(
                loc,
                format!("{name} does not have exactly one result"),
            )),
        }
    }

    /// Adds a scalar constant of element type `dtype`.
    pub fn constant(&mut self, c: Const, dtype: DType, loc: Loc) -> Result<ValueId, Diagnostic> {
        let ty = Type::Scalar(dtype);
        let results = result_types(&OpKind::Const(c), &[], &self.kernel.params, Some(&ty))
            .map_err(|e| Diagnostic::new(loc, e))?;
        Ok(self.push(OpKind::Const(c), &[], results, loc)[0])
    }

    /// Opens a counted loop; operations added until [`Builder::end_for`] form its body.
    pub fn begin_for(
        &mut self,
        lo: ValueId,
        hi: ValueId,
        step: ValueId,
        init: &[ValueId],
        stages: Option<u32>,
        loc: Loc,
    ) -> Result<ForScope, Diagnostic> {
        let kind = OpKind::For { stages };
        let mut operands = vec![lo, hi, step];
        operands.extend_from_slice(init);
        let tys = self.operand_types(&operands);
        let carried_tys = result_types(&kind, &tys, &self.kernel.params, None)
            .map_err(|e| Diagnostic::new(loc, e))?;
        let op = self.alloc_op(kind, operands, loc);
        let mut arg_tys = vec![Type::Scalar(DType::I32)];
        arg_tys.extend(carried_tys);
        let args: Vec<ValueId> = arg_tys
            .into_iter()
            .enumerate()
            .map(|(index, ty)| {
                self.kernel.values.append(ValueData {
                    ty,
                    def: ValueDef::BlockArg {
                        op,
                        region: 0,
                        index,
                    },
                })
            })
            .collect();
        self.frames.push(Frame {
            owner: Some(op),
            block: Block {
                args: args.clone(),
                ops: Vec::new(),
            },
        });
        Ok(ForScope {
            op,
            iv: args[0],
            carried: args[1..].to_vec(),
        })
    }

    /// Closes the loop opened by `scope`, yielding `next` as the carried values of the next
    /// iteration; returns the loop's results (the carried values after the last iteration).
    pub fn end_for(
        &mut self,
        scope: &ForScope,
        next: &[ValueId],
        loc: Loc,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let expected: Vec<Type> = scope.carried.iter().map(|&v| self.ty(v).clone()).collect();
        let got = self.operand_types(next);
        if expected != got {
            return Err(Diagnostic::new(
                loc,
                format!(
                    "a value carried around the loop changes type: it enters as {} and leaves as {}",
                    join(&expected),
                    join(&got)
                ),
            )
            .note("a variable assigned inside a loop must keep its shape and dtype"));
        }
        self.push(OpKind::Yield, next, vec![], loc);
        let block = self.pop_frame(scope.op, loc)?;
        let op = scope.op;
        self.kernel.ops[op].regions.push(block);
        let results = self.define_results(op, expected);
        self.attach(op);
        Ok(results)
    }

    /// Opens an `if` on a runtime bool; operations added until [`Builder::begin_else`] form
    /// the then-branch.
    pub fn begin_if(&mut self, cond: ValueId, loc: Loc) -> Result<OpId, Diagnostic> {
        let tys = self.operand_types(&[cond]);
        result_types(&OpKind::If, &tys, &self.kernel.params, None)
            .map_err(|e| Diagnostic::new(loc, e))?;
        let op = self.alloc_op(OpKind::If, vec![cond], loc);
        self.frames.push(Frame {
            owner: Some(op),
            block: Block::default(),
        });
        Ok(op)
    }

    /// Ends the then-branch with `yields` and opens the else-branch.
    pub fn begin_else(&mut self, op: OpId, yields: &[ValueId], loc: Loc) -> Result<(), Diagnostic> {
        self.push(OpKind::Yield, yields, vec![], loc);
        let block = self.pop_frame(op, loc)?;
        self.kernel.ops[op].regions.push(block);
        self.frames.push(Frame {
            owner: Some(op),
            block: Block::default(),
        });
        Ok(())
    }

    /// Ends the else-branch with `yields`; both branches must yield the same types. Returns
    /// the `if`'s results.
    pub fn end_if(
        &mut self,
        op: OpId,
        yields: &[ValueId],
        loc: Loc,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let then_yield = self.kernel.ops[op]
            .regions
            .first()
            .and_then(|b| b.ops.last())
            .map(|&y| self.kernel.ops[y].operands.clone())
            .ok_or_else(|| Diagnostic::internal(loc, "end_if without begin_else"))?;
        let then_tys = self.operand_types(&then_yield);
        let else_tys = self.operand_types(yields);
        if then_tys != else_tys {
            return Err(Diagnostic::new(
                loc,
                format!(
                    "the branches of this `if` produce different types: {} and {}",
                    join(&then_tys),
                    join(&else_tys)
                ),
            )
            .note("both branches must give every assigned variable the same shape and dtype"));
        }
        self.push(OpKind::Yield, yields, vec![], loc);
        let block = self.pop_frame(op, loc)?;
        self.kernel.ops[op].regions.push(block);
        let results = self.define_results(op, then_tys);
        self.attach(op);
        Ok(results)
    }

    /// Finishes the kernel. Fails if a region is still open.
    pub fn finish(mut self) -> Result<Kernel, Diagnostic> {
        if self.frames.len() != 1 {
            return Err(Diagnostic::internal(
                Loc::default(),
                "a region was left open",
            ));
        }
        let top = self.frames.pop().map(|f| f.block).unwrap_or_default();
        self.kernel.body = top;
        Ok(self.kernel)
    }

    fn operand_types(&self, operands: &[ValueId]) -> Vec<Type> {
        operands.iter().map(|&v| self.ty(v).clone()).collect()
    }

    fn alloc_op(&mut self, kind: OpKind, operands: Vec<ValueId>, loc: Loc) -> OpId {
        self.kernel.ops.append(Op {
            kind,
            operands,
            results: Vec::new(),
            regions: Vec::new(),
            loc,
        })
    }

    fn define_results(&mut self, op: OpId, tys: Vec<Type>) -> Vec<ValueId> {
        let results: Vec<ValueId> = tys
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                self.kernel.values.append(ValueData {
                    ty,
                    def: ValueDef::Op(op, i),
                })
            })
            .collect();
        self.kernel.ops[op].results = results.clone();
        results
    }

    fn attach(&mut self, op: OpId) {
        if let Some(frame) = self.frames.last_mut() {
            frame.block.ops.push(op);
        }
    }

    fn push(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        results: Vec<Type>,
        loc: Loc,
    ) -> Vec<ValueId> {
        let op = self.alloc_op(kind, operands.to_vec(), loc);
        let r = self.define_results(op, results);
        self.attach(op);
        r
    }

    fn pop_frame(&mut self, owner: OpId, loc: Loc) -> Result<Block, Diagnostic> {
        match self.frames.last() {
            Some(f) if f.owner == Some(owner) && self.frames.len() > 1 => {
                Ok(self.frames.pop().map(|f| f.block).unwrap_or_default())
            }
            _ => Err(Diagnostic::internal(
                loc,
                format!("regions closed out of order at {owner}"),
            )),
        }
    }
}

fn join(tys: &[Type]) -> String {
    let parts: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
    format!("({})", parts.join(", "))
}
