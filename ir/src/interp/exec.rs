//! The walker: runs a verified kernel's blocks op by op for one grid block after another.

use std::collections::BTreeMap;

use crate::device_print::{self, PrintValue};
use crate::kernel::{Axis, Block, Const, Kernel, OpId, OpKind, ValueId};
use crate::print::op_str;
use crate::rounding;
use crate::types::DType;

use super::HostArg;
use super::access;
use super::error::InterpError;
use super::eval::{self, Fault};
use super::memory;
use super::value::{Elems, Value};

/// The state of one run: the kernel, its arguments, the block being run and every SSA
/// value's current contents (indexed by value handle).
pub(crate) struct Machine<'k, 'a, 'b> {
    kernel: &'k Kernel,
    args: &'b mut [HostArg<'a>],
    grid: [i32; 3],
    block: [i32; 3],
    env: Vec<Option<Value>>,
    /// The lines `print` ops wrote, when they are kept rather than written to stdout.
    printed: Option<Vec<String>>,
    /// Tiles that `load` ops take from here instead of global memory: the stage buffers of a
    /// scheduled execution ([`super::scheduled`]).
    served: BTreeMap<OpId, Value>,
}

impl<'k, 'a, 'b> Machine<'k, 'a, 'b> {
    /// A machine for `kernel` whose arguments were checked against its parameters.
    /// `capture`: keep printed lines ([`Machine::printed`]) instead of writing them to stdout.
    pub(crate) fn new(
        kernel: &'k Kernel,
        args: &'b mut [HostArg<'a>],
        grid: [i32; 3],
        capture: bool,
    ) -> Self {
        Machine {
            kernel,
            args,
            grid,
            block: [0; 3],
            env: vec![None; kernel.values.len()],
            printed: capture.then(Vec::new),
            served: BTreeMap::new(),
        }
    }

    /// Runs `ops` (of one block, in its order) in the current environment; returns the
    /// values a `yield` among them passes.
    pub(super) fn exec_ops(&mut self, ops: &[OpId]) -> Result<Option<Vec<Value>>, InterpError> {
        for &id in ops {
            if let Some(yielded) = self.exec(id)? {
                return Ok(Some(yielded));
            }
        }
        Ok(None)
    }

    /// Value `v`'s contents in the current environment.
    pub(super) fn value(&self, v: ValueId) -> Option<&Value> {
        self.env.get(v.index()).and_then(Option::as_ref)
    }

    /// Sets value `v`'s contents in the current environment.
    pub(super) fn bind(&mut self, v: ValueId, value: Value) {
        if let Some(slot) = self.env.get_mut(v.index()) {
            *slot = Some(value);
        }
    }

    /// Whether value `v` has contents in the current environment.
    pub(super) fn is_bound(&self, v: ValueId) -> bool {
        matches!(self.env.get(v.index()), Some(Some(_)))
    }

    /// Sets the block index `block_id` ops read.
    pub(super) fn set_block(&mut self, block: [i32; 3]) {
        self.block = block;
    }

    /// Runs `f` with `env` as the environment (every SSA value's contents), then takes `env`
    /// back with what `f` left in it.
    pub(super) fn with_env<R>(
        &mut self,
        env: &mut Vec<Option<Value>>,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        std::mem::swap(&mut self.env, env);
        let out = f(self);
        std::mem::swap(&mut self.env, env);
        out
    }

    /// Makes the `load` op `load` produce `tile` instead of reading global memory, until
    /// [`Machine::unserve`].
    pub(super) fn serve(&mut self, load: OpId, tile: Value) {
        self.served.insert(load, tile);
    }

    /// Lets every `load` read global memory again.
    pub(super) fn unserve(&mut self) {
        self.served.clear();
    }

    /// The tensor argument `index`, when the kernel may write it.
    pub(super) fn tensor_arg_mut(&mut self, index: usize) -> Option<&mut crate::host::HostTensor> {
        match self.args.get_mut(index) {
            Some(HostArg::TensorMut(t)) => Some(t),
            _ => None,
        }
    }

    /// The tensor argument `index`.
    pub(super) fn tensor_arg(&self, index: usize) -> Option<&crate::host::HostTensor> {
        self.args.get(index).and_then(HostArg::tensor)
    }

    /// The lines printed so far, when captured.
    pub(crate) fn printed(self) -> Vec<String> {
        self.printed.unwrap_or_default()
    }

    /// Runs every block of the grid, z outermost and x innermost.
    pub(crate) fn run_grid(&mut self) -> Result<(), InterpError> {
        let [gx, gy, gz] = self.grid;
        for z in 0..gz {
            for y in 0..gy {
                for x in 0..gx {
                    self.block = [x, y, z];
                    self.run_block(&self.kernel.body)?;
                }
            }
        }
        Ok(())
    }

    /// Runs a block's ops in order; returns the values its `yield` passes (none for the
    /// kernel's top-level block).
    fn run_block(&mut self, block: &'k Block) -> Result<Vec<Value>, InterpError> {
        for &id in &block.ops {
            if let Some(yielded) = self.exec(id)? {
                return Ok(yielded);
            }
        }
        Ok(Vec::new())
    }

    fn internal(&self, id: OpId) -> InterpError {
        InterpError::Internal {
            loc: self.kernel.ops[id].loc,
            op: op_str(self.kernel, id),
        }
    }

    fn fault(&self, id: OpId, f: Fault) -> InterpError {
        match f {
            Fault::DivisionByZero => InterpError::DivisionByZero {
                loc: self.kernel.ops[id].loc,
                op: crate::diag::op_words(self.kernel, id),
            },
            Fault::Mistyped => self.internal(id),
        }
    }

    fn get(&self, id: OpId, v: ValueId) -> Result<&Value, InterpError> {
        self.env
            .get(v.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| self.internal(id))
    }

    fn set(&mut self, id: OpId, v: ValueId, value: Value) -> Result<(), InterpError> {
        match self.env.get_mut(v.index()) {
            Some(slot) => {
                *slot = Some(value);
                Ok(())
            }
            None => Err(self.internal(id)),
        }
    }

    fn scalar_i32(&self, id: OpId, v: ValueId) -> Result<i32, InterpError> {
        self.get(id, v)?.as_i32().ok_or_else(|| self.internal(id))
    }

    fn tensor(&self, id: OpId, index: usize) -> Result<&crate::host::HostTensor, InterpError> {
        self.args
            .get(index)
            .and_then(HostArg::tensor)
            .ok_or_else(|| self.internal(id))
    }

    /// Runs one op and stores its results. Returns `Some(values)` for a `yield`.
    fn exec(&mut self, id: OpId) -> Result<Option<Vec<Value>>, InterpError> {
        let kernel = self.kernel;
        let op = &kernel.ops[id];
        let operand = |i: usize| op.operands.get(i).copied().ok_or_else(|| self.internal(id));
        let results: Vec<Value> = match &op.kind {
            OpKind::Yield => {
                let vals = op
                    .operands
                    .iter()
                    .map(|&v| self.get(id, v).cloned())
                    .collect::<Result<_, _>>()?;
                return Ok(Some(vals));
            }
            OpKind::Const(c) => {
                let r = op.results.first().ok_or_else(|| self.internal(id))?;
                vec![constant(*c, kernel.ty(*r).dtype()).ok_or_else(|| self.internal(id))?]
            }
            OpKind::ScalarParam(i) => vec![match self.args.get(*i) {
                Some(HostArg::F32(x)) => Value::float(DType::F32, *x),
                Some(HostArg::I32(x)) => Value::i32(*x),
                Some(HostArg::U32(x)) => Value::u32(*x),
                _ => return Err(self.internal(id)),
            }],
            OpKind::BlockId(a) => vec![Value::i32(self.block[axis_index(*a)])],
            OpKind::GridDim(a) => vec![Value::i32(self.grid[axis_index(*a)])],
            OpKind::TensorDim { tensor, dim } => {
                let t = self.tensor(id, *tensor)?;
                let e = t.shape.get(*dim).ok_or_else(|| self.internal(id))?;
                // check_args proved every extent fits in i32.
                vec![Value::i32(
                    i32::try_from(*e).map_err(|_| self.internal(id))?,
                )]
            }
            OpKind::Unary(u) => {
                vec![eval::unary(*u, self.get(id, operand(0)?)?).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Binary(b) => {
                let (x, y) = (self.get(id, operand(0)?)?, self.get(id, operand(1)?)?);
                vec![eval::binary(*b, x, y).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Select => {
                let c = self.get(id, operand(0)?)?;
                let (x, y) = (self.get(id, operand(1)?)?, self.get(id, operand(2)?)?);
                vec![eval::select(c, x, y).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Cast { to } => {
                vec![eval::cast(self.get(id, operand(0)?)?, *to).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Bitcast { to } => {
                vec![
                    eval::bitcast(self.get(id, operand(0)?)?, *to)
                        .map_err(|f| self.fault(id, f))?,
                ]
            }
            OpKind::Splat { shape } => vec![eval::splat(self.get(id, operand(0)?)?, shape.dims())],
            OpKind::Iota { shape, dim } => vec![eval::iota(shape.dims(), *dim)],
            OpKind::Reshape { shape } => {
                let mut v = self.get(id, operand(0)?)?.clone();
                v.dims = shape.dims().to_vec();
                vec![v]
            }
            OpKind::Transpose => vec![eval::transpose(self.get(id, operand(0)?)?)],
            OpKind::Take { dim } => {
                let (x, idx, other) = (
                    self.get(id, operand(0)?)?,
                    self.get(id, operand(1)?)?,
                    self.get(id, operand(2)?)?,
                );
                vec![eval::take(x, idx, other, *dim).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Permute { perm } => {
                let x = self.get(id, operand(0)?)?;
                vec![eval::permute(x, perm).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Convert => vec![self.get(id, operand(0)?)?.clone()],
            OpKind::Reduce { op: r, dim } => {
                let x = self.get(id, operand(0)?)?;
                vec![eval::reduce(*r, x, *dim).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Mma => {
                let (a, b) = (self.get(id, operand(0)?)?, self.get(id, operand(1)?)?);
                let c = match op.operands.get(2) {
                    Some(&c) => Some(self.get(id, c)?),
                    None => None,
                };
                vec![eval::mma(a, b, c).map_err(|f| self.fault(id, f))?]
            }
            OpKind::Load { .. } if self.served.contains_key(&id) => {
                vec![self.served[&id].clone()]
            }
            OpKind::Load { tensor, shape } => {
                let coords = self.coords(id, &op.operands)?;
                vec![memory::load(
                    self.tensor(id, *tensor)?,
                    &coords,
                    shape.dims(),
                )]
            }
            OpKind::Print { pieces, elements } => {
                let mut values = Vec::with_capacity(elements.len());
                for (&v, element) in op.operands.iter().zip(elements) {
                    let value = self.get(id, v)?;
                    let flat = match element {
                        None => 0,
                        Some(idx) => idx
                            .iter()
                            .zip(&value.dims)
                            .fold(0, |at, (&i, &n)| at * n + i as usize),
                    };
                    values.push(
                        match &value.elems {
                            Elems::F(x) => x.get(flat).map(|&x| PrintValue::Float(f64::from(x))),
                            Elems::I(x) if value.dtype == DType::U32 => {
                                x.get(flat).map(|&x| PrintValue::Int(i64::from(x as u32)))
                            }
                            Elems::I(x) => x.get(flat).map(|&x| PrintValue::Int(i64::from(x))),
                            Elems::B(x) => x.get(flat).map(|&x| PrintValue::Int(i64::from(x))),
                        }
                        .ok_or_else(|| self.internal(id))?,
                    );
                }
                let line = device_print::format_line(self.block, pieces, &values);
                match &mut self.printed {
                    Some(lines) => lines.push(line),
                    None => println!("{line}"),
                }
                Vec::new()
            }
            OpKind::LoadScalar { tensor } => {
                let coords = self.coords(id, &op.operands)?;
                vec![memory::load(self.tensor(id, *tensor)?, &coords, &[])]
            }
            OpKind::Store { tensor, .. } => {
                let parts = op.store_operands().ok_or_else(|| self.internal(id))?;
                let coords = self.coords(id, parts.coords)?;
                let bound = match parts.limit {
                    Some((dim, limit)) => Some((dim, self.scalar_i32(id, limit)?)),
                    None => None,
                };
                let value = self
                    .env
                    .get(parts.value.index())
                    .and_then(Option::as_ref)
                    .ok_or_else(|| self.internal(id))?;
                let fault = match self.args.get_mut(*tensor) {
                    Some(HostArg::TensorMut(t)) => memory::store(t, &coords, value, bound).err(),
                    _ => Some(Fault::Mistyped),
                };
                if let Some(f) = fault {
                    return Err(self.fault(id, f));
                }
                Vec::new()
            }
            OpKind::Gather { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
                self.exec_access(id)?
            }
            OpKind::ScalarAtomic { tensor, op: a, .. } => {
                // Blocks run one after another here, so the block's single application is
                // just this read-modify-write.
                let rank = self.tensor(id, *tensor)?.shape.len();
                let (coords, rest) = op.operands.split_at(rank.min(op.operands.len()));
                let addr = coords
                    .iter()
                    .map(|&v| self.get(id, v).cloned())
                    .collect::<Result<Vec<_>, _>>()?;
                let (compare, value) = match rest {
                    [c, v] => (Some(self.get(id, *c)?.clone()), self.get(id, *v)?.clone()),
                    [v] => (None, self.get(id, *v)?.clone()),
                    _ => return Err(self.internal(id)),
                };
                let internal = self.internal(id);
                let Some(HostArg::TensorMut(t)) = self.args.get_mut(*tensor) else {
                    return Err(internal);
                };
                let access = crate::kernel::Access::coords(rank);
                let result = access::offsets(t, &access, &addr, None, &[])
                    .and_then(|offs| access::atomic(t, *a, &offs, &value, compare.as_ref()));
                vec![result.map_err(|f| self.fault(id, f))?]
            }
            OpKind::For { .. } => self.run_for(id)?,
            OpKind::If => {
                let cond = self.get(id, operand(0)?)?;
                let branch = if cond.as_bool().ok_or_else(|| self.internal(id))? {
                    0
                } else {
                    1
                };
                let region = op.regions.get(branch).ok_or_else(|| self.internal(id))?;
                self.run_block(region)?
            }
        };
        if results.len() != op.results.len() {
            return Err(self.internal(id));
        }
        for (&r, v) in op.results.iter().zip(results) {
            // Every later op indexes elements by the declared shape; a mismatch would be an
            // interpreter bug, so it is reported instead of risking an out-of-range index.
            let numel: usize = v.dims.iter().product();
            if v.ty() != *kernel.ty(r) || v.elems.len() != numel {
                return Err(self.internal(id));
            }
            self.set(id, r, v)?;
        }
        Ok(None)
    }

    /// Runs a gather, scatter or atomic ([`access`]); returns its results.
    fn exec_access(&mut self, id: OpId) -> Result<Vec<Value>, InterpError> {
        let op = &self.kernel.ops[id];
        let parts = op.access_operands().ok_or_else(|| self.internal(id))?;
        let get = |v: Option<ValueId>| -> Result<Option<Value>, InterpError> {
            v.map(|v| self.get(id, v).cloned()).transpose()
        };
        let addr = parts
            .addr
            .iter()
            .map(|&v| self.get(id, v).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        let (mask, value, compare, other) = (
            get(parts.mask)?,
            get(parts.value)?,
            get(parts.compare)?,
            get(parts.other)?,
        );
        let fault = |f| self.fault(id, f);
        match &op.kind {
            OpKind::Gather {
                tensor,
                shape,
                access,
            } => {
                let t = self.tensor(id, *tensor)?;
                let other = other.ok_or_else(|| self.internal(id))?;
                let offs = access::offsets(t, access, &addr, mask.as_ref(), shape.dims())
                    .map_err(fault)?;
                Ok(vec![
                    access::gather(t, &offs, shape.dims(), &other).map_err(fault)?,
                ])
            }
            OpKind::Scatter { tensor, access } | OpKind::Atomic { tensor, access, .. } => {
                let value = value.ok_or_else(|| self.internal(id))?;
                let internal = self.internal(id);
                let Some(HostArg::TensorMut(t)) = self.args.get_mut(*tensor) else {
                    return Err(internal);
                };
                let result = access::offsets(t, access, &addr, mask.as_ref(), &value.dims)
                    .and_then(|offs| match &op.kind {
                        OpKind::Atomic { op: a, .. } => {
                            access::atomic(t, *a, &offs, &value, compare.as_ref()).map(Some)
                        }
                        _ => access::scatter(t, &offs, &value).map(|()| None),
                    });
                match result {
                    Ok(old) => Ok(old.into_iter().collect()),
                    Err(f) => Err(self.fault(id, f)),
                }
            }
            _ => Err(self.internal(id)),
        }
    }

    fn coords(&self, id: OpId, vs: &[ValueId]) -> Result<Vec<i32>, InterpError> {
        vs.iter().map(|&v| self.scalar_i32(id, v)).collect()
    }

    /// Runs a `for` and returns its carried values after the last iteration.
    fn run_for(&mut self, id: OpId) -> Result<Vec<Value>, InterpError> {
        let op = &self.kernel.ops[id];
        let [lo, hi, step] = match op.operands.get(..3) {
            Some(&[lo, hi, step]) => [lo, hi, step].map(|v| self.scalar_i32(id, v)),
            _ => return Err(self.internal(id)),
        };
        let (lo, hi, step) = (lo?, hi?, step?);
        if step <= 0 {
            return Err(InterpError::NonPositiveStep { loc: op.loc, step });
        }
        let body = op.regions.first().ok_or_else(|| self.internal(id))?;
        let (iv, carried_args) = body.args.split_first().ok_or_else(|| self.internal(id))?;
        let mut carried: Vec<Value> = op.operands[3..]
            .iter()
            .map(|&v| self.get(id, v).cloned())
            .collect::<Result<_, _>>()?;
        if carried.len() != carried_args.len() {
            return Err(self.internal(id));
        }
        // Counting in i64 so that `i + step` cannot wrap past `hi`.
        let mut i = i64::from(lo);
        while i < i64::from(hi) {
            self.set(id, *iv, Value::i32(i as i32))?;
            for (&a, v) in carried_args.iter().zip(carried) {
                self.set(id, a, v)?;
            }
            carried = self.run_block(body)?;
            if carried.len() != carried_args.len() {
                return Err(self.internal(id));
            }
            i += i64::from(step);
        }
        Ok(carried)
    }
}

fn axis_index(a: Axis) -> usize {
    match a {
        Axis::X => 0,
        Axis::Y => 1,
        Axis::Z => 2,
    }
}

/// A constant of `dtype`; floats round from f64 straight to the dtype (no double rounding).
fn constant(c: Const, dtype: DType) -> Option<Value> {
    Some(match (c, dtype) {
        // Integers are stored wide; the IR type is i32, so they wrap as i32 arithmetic does.
        (Const::Int(v), DType::I32) => Value::i32(v as i32),
        (Const::Int(v), DType::U32) => Value::u32(v as u32),
        (Const::Float(v), DType::Bf16) => Value::float(dtype, rounding::to_bf16(v).to_f32()),
        (Const::Float(v), DType::F16) => Value::float(dtype, rounding::to_f16(v).to_f32()),
        (Const::Float(v), DType::F32) => Value::float(dtype, v as f32),
        (Const::Bool(v), DType::Bool) => Value::bool(v),
        _ => return None,
    })
}
