//! Kernels built from arbitrary bytes through the [`Builder`] API, and the whole compiler
//! run over them: the generator behind the random-kernel test (`tests/random_kernels.rs`)
//! and the `ir` fuzz target (`fuzz/`).
//!
//! Each byte picks what comes next (an op, its operands among the values built so far, a
//! shape, a loop or branch); an op the builder rejects is left out, so the IR is always what
//! a front end could have built. [`exercise`] then runs the verifier, the pass pipeline and
//! the PTX writer for every target and the interpreter on small inputs: any of them may
//! refuse the kernel with an error, none may panic or hang (loops run at most 3 times).

use kiln_ir::interp::{HostArg, run};
use kiln_ir::{
    Axis, BinaryOp, Builder, Const, DType, HostTensor, Kernel, KernelOptions, Loc, OpKind, Param,
    ReduceOp, Shape, Target, UnaryOp, ValueId,
};

/// Reads choices from the bytes; zeros once they run out.
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// A choice in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }

    /// True one time in `n` (`n > 0`).
    fn one_in(&mut self, n: u8) -> bool {
        self.byte().is_multiple_of(n)
    }

    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.below(from.len())])
    }
}

/// Tile shapes the generator uses: small, mma-friendly, and a few odd ones.
const SHAPES: [&[usize]; 8] = [
    &[16, 16],
    &[16, 32],
    &[32, 16],
    &[32, 32],
    &[64, 16],
    &[16, 8],
    &[16],
    &[32],
];

const UNARY: [UnaryOp; 9] = [
    UnaryOp::Neg,
    UnaryOp::Exp2,
    UnaryOp::Exp,
    UnaryOp::Log2,
    UnaryOp::Abs,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Recip,
    UnaryOp::Not,
];

const BINARY: [BinaryOp; 15] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Rem,
    BinaryOp::Min,
    BinaryOp::Max,
    BinaryOp::And,
    BinaryOp::Or,
    BinaryOp::Lt,
    BinaryOp::Le,
    BinaryOp::Gt,
    BinaryOp::Ge,
    BinaryOp::Eq,
    BinaryOp::Ne,
];

const DTYPES: [DType; 5] = [DType::F32, DType::Bf16, DType::F16, DType::I32, DType::Bool];

/// The generator's state: the builder, every value built so far, and the loop depth.
struct Gen<'a> {
    b: Builder,
    bytes: Bytes<'a>,
    values: Vec<ValueId>,
    depth: u32,
}

/// The parameters every generated kernel takes.
fn params() -> Vec<Param> {
    vec![
        Param::tensor("x", DType::F32, 2, false),
        Param::tensor("y", DType::Bf16, 2, false),
        Param::tensor("out", DType::F32, 2, true),
        Param::Scalar {
            name: "s".into(),
            dtype: DType::F32,
        },
    ]
}

/// A kernel built from `data` (see the module doc), or `None` when the builder refuses to
/// finish it.
pub fn kernel(data: &[u8]) -> Option<Kernel> {
    let mut g = Gen {
        b: Builder::new("random", params(), KernelOptions::default()),
        bytes: Bytes { data, at: 0 },
        values: Vec::new(),
        depth: 0,
    };
    for _ in 0..48 {
        if g.bytes.done() {
            break;
        }
        g.step();
    }
    // Something the passes cannot drop as dead.
    g.store();
    g.b.finish().ok()
}

impl Gen<'_> {
    fn loc() -> Loc {
        Loc::default()
    }

    /// Adds `kind` over `operands` and keeps its results; a refused op is left out.
    fn add(&mut self, kind: OpKind, operands: &[ValueId]) -> Option<ValueId> {
        let r = self.b.op(kind, operands, Self::loc()).ok()?;
        self.values.extend(&r);
        r.first().copied()
    }

    fn any(&mut self) -> Option<ValueId> {
        let vs = self.values.clone();
        self.bytes.pick(&vs)
    }

    /// Mostly a value whose type `keep` accepts (so most ops type-check), sometimes any.
    fn such(&mut self, keep: impl Fn(&kiln_ir::Type) -> bool) -> Option<ValueId> {
        let of: Vec<ValueId> = self
            .values
            .iter()
            .copied()
            .filter(|&v| keep(self.b.ty(v)))
            .collect();
        if of.is_empty() || self.bytes.one_in(8) {
            self.any()
        } else {
            self.bytes.pick(&of)
        }
    }

    /// A bf16 `[rows, cols]` tile: loaded from `y`, or an existing tile cast.
    fn bf16_tile(&mut self, rows: usize, cols: usize) -> Option<ValueId> {
        let want = Shape(vec![rows, cols]);
        let found = self.such(|t| t.shape() == Some(&want));
        if let Some(v) = found.filter(|&v| self.b.ty(v).shape() == Some(&want)) {
            return match self.b.ty(v).dtype() {
                DType::Bf16 => Some(v),
                _ => self.add(OpKind::Cast { to: DType::Bf16 }, &[v]),
            };
        }
        let coords: Option<Vec<ValueId>> = (0..2).map(|_| self.scalar(DType::I32)).collect();
        self.add(
            OpKind::Load {
                tensor: 1,
                shape: want,
            },
            &coords?,
        )
    }

    /// A value of scalar type `dtype`, built if none is at hand.
    fn scalar(&mut self, dtype: DType) -> Option<ValueId> {
        let of: Vec<ValueId> = self
            .values
            .iter()
            .copied()
            .filter(|&v| self.b.ty(v).shape().is_none() && self.b.ty(v).dtype() == dtype)
            .collect();
        match self.bytes.pick(&of) {
            Some(v) if !self.bytes.one_in(4) => Some(v),
            _ => {
                let c = match dtype {
                    DType::F32 => Const::Float(f64::from(self.bytes.byte() as i8) / 8.0),
                    DType::Bool => Const::Bool(self.bytes.one_in(2)),
                    _ => Const::Int(i64::from(self.bytes.byte() % 80)),
                };
                let v = self.b.constant(c, dtype, Self::loc()).ok()?;
                self.values.push(v);
                Some(v)
            }
        }
    }

    fn shape(&mut self) -> Shape {
        Shape(SHAPES[self.bytes.below(SHAPES.len())].to_vec())
    }

    fn step(&mut self) {
        match self.bytes.below(19) {
            0 => {
                self.scalar(DType::I32);
            }
            1 => {
                self.scalar(DType::F32);
            }
            2 => {
                let axis = [Axis::X, Axis::Y, Axis::Z][self.bytes.below(3)];
                self.add(OpKind::BlockId(axis), &[]);
            }
            3 => {
                let tensor = self.bytes.below(3);
                let shape = self.shape();
                let coords: Option<Vec<ValueId>> =
                    (0..2).map(|_| self.scalar(DType::I32)).collect();
                if let Some(c) = coords {
                    self.add(OpKind::Load { tensor, shape }, &c);
                }
            }
            4 => {
                if let Some(v) = self.any() {
                    let op = UNARY[self.bytes.below(UNARY.len())];
                    self.add(OpKind::Unary(op), &[v]);
                }
            }
            5 | 6 => {
                if let Some(a) = self.any() {
                    let ty = self.b.ty(a).clone();
                    let dtype = ty.dtype();
                    let c = self.such(|t| *t == ty || (t.shape().is_none() && t.dtype() == dtype));
                    let op = BINARY[self.bytes.below(BINARY.len())];
                    if let Some(c) = c {
                        self.add(OpKind::Binary(op), &[a, c]);
                    }
                }
            }
            7 => {
                if let Some(v) = self.any() {
                    let to = DTYPES[self.bytes.below(DTYPES.len())];
                    self.add(OpKind::Cast { to }, &[v]);
                }
            }
            8 => {
                if let Some(v) = self.any() {
                    let op = [ReduceOp::Max, ReduceOp::Sum][self.bytes.below(2)];
                    let dim = self.bytes.below(2);
                    self.add(OpKind::Reduce { op, dim }, &[v]);
                }
            }
            9 => {
                let [m, k, n] = [0; 3].map(|_| [16, 32][self.bytes.below(2)]);
                if let (Some(a), Some(c)) = (self.bf16_tile(m, k), self.bf16_tile(k, n)) {
                    let mut operands = vec![a, c];
                    let acc_shape = Shape(vec![m, n]);
                    if self.bytes.one_in(2)
                        && let Some(acc) =
                            self.such(|t| t.shape() == Some(&acc_shape) && t.dtype() == DType::F32)
                    {
                        operands.push(acc);
                    }
                    self.add(OpKind::Mma, &operands);
                }
            }
            10 => {
                let dtype = DTYPES[self.bytes.below(3)];
                if let Some(s) = self.scalar(dtype) {
                    let shape = self.shape();
                    self.add(OpKind::Splat { shape }, &[s]);
                }
            }
            11 => {
                let shape = self.shape();
                let dim = self.bytes.below(2);
                self.add(OpKind::Iota { shape, dim }, &[]);
            }
            12 => {
                let c = self.such(|t| t.dtype() == DType::Bool);
                if let (Some(c), Some(a)) = (c, self.any()) {
                    let ty = self.b.ty(a).clone();
                    if let Some(d) = self.such(|t| *t == ty) {
                        self.add(OpKind::Select, &[c, a, d]);
                    }
                }
            }
            13 => {
                if let Some(v) = self.any() {
                    self.add(OpKind::Transpose, &[v]);
                }
            }
            14 => {
                if let Some(v) = self.any() {
                    let shape = self.shape();
                    self.add(OpKind::Reshape { shape }, &[v]);
                }
            }
            15 | 16 => self.for_loop(),
            17 => self.branch(),
            _ => self.store(),
        }
    }

    /// A store of an f32 rank-2 tile (mostly) into `out` (mostly).
    fn store(&mut self) {
        let tensor = if self.bytes.one_in(8) {
            self.bytes.below(3)
        } else {
            2
        };
        let coords: Option<Vec<ValueId>> = (0..2).map(|_| self.scalar(DType::I32)).collect();
        let v = self.such(|t| t.dtype() == DType::F32 && t.shape().is_some_and(|s| s.rank() == 2));
        if let (Some(mut c), Some(v)) = (coords, v) {
            c.push(v);
            self.add(
                OpKind::Store {
                    tensor,
                    bound: None,
                },
                &c,
            );
        }
    }

    /// A loop of at most 3 trips carrying one value, with a few body steps.
    fn for_loop(&mut self) {
        if self.depth >= 2 {
            return;
        }
        let trips = i64::from(self.bytes.byte() % 4);
        let (Ok(lo), Ok(hi), Ok(one)) = (
            self.b.constant(Const::Int(0), DType::I32, Self::loc()),
            self.b.constant(Const::Int(trips), DType::I32, Self::loc()),
            self.b.constant(Const::Int(1), DType::I32, Self::loc()),
        ) else {
            return;
        };
        let init: Vec<ValueId> = self.any().into_iter().collect();
        let stages = (self.bytes.one_in(3)).then_some(2);
        let Ok(scope) = self.b.begin_for(lo, hi, one, &init, stages, Self::loc()) else {
            return;
        };
        let outer = self.values.clone();
        self.values.push(scope.iv);
        self.values.extend(&scope.carried);
        self.depth += 1;
        for _ in 0..1 + self.bytes.below(4) {
            self.step();
        }
        self.depth -= 1;
        // Yield a body value of the carried type, else the carried value itself.
        let mut next = Vec::new();
        for &c in &scope.carried {
            next.push(self.yield_like(c));
        }
        self.values = outer;
        if let Ok(results) = self.b.end_for(&scope, &next, Self::loc()) {
            self.values.extend(results);
        }
    }

    /// An `if` on a bool scalar with a step in each branch, yielding one value.
    fn branch(&mut self) {
        if self.depth >= 2 {
            return;
        }
        let (Some(cond), Some(v)) = (self.scalar(DType::Bool), self.any()) else {
            return;
        };
        let Ok(op) = self.b.begin_if(cond, Self::loc()) else {
            return;
        };
        let outer = self.values.clone();
        self.depth += 1;
        self.step();
        let then_v = self.yield_like(v);
        self.values = outer.clone();
        let else_ok = self.b.begin_else(op, &[then_v], Self::loc()).is_ok();
        self.step();
        let else_v = self.yield_like(v);
        self.depth -= 1;
        self.values = outer;
        if else_ok && let Ok(results) = self.b.end_if(op, &[else_v], Self::loc()) {
            self.values.extend(results);
        }
    }

    /// A value of `v`'s type among those at hand (`v` itself if none).
    fn yield_like(&mut self, v: ValueId) -> ValueId {
        let same: Vec<ValueId> = self
            .values
            .iter()
            .copied()
            .filter(|&x| self.b.ty(x) == self.b.ty(v))
            .collect();
        self.bytes.pick(&same).unwrap_or(v)
    }
}

/// Runs the compiler over `kernel`: the pass pipeline and the PTX writer for every target,
/// then the interpreter on small random inputs. Errors are answers; a panic is a bug.
pub fn exercise(kernel: &Kernel) {
    for target in Target::ALL {
        let _ = kiln_ptx::compile(kernel, target);
    }
    let x = HostTensor::from_fn(&[48, 40], DType::F32, |i| (i % 7) as f64 - 3.0);
    let y = HostTensor::from_fn(&[40, 48], DType::Bf16, |i| (i % 5) as f64 * 0.5);
    let mut out = HostTensor::from_fn(&[48, 48], DType::F32, |_| f64::NAN);
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&y),
        HostArg::TensorMut(&mut out),
        HostArg::F32(0.5),
    ];
    let _ = run(kernel, [2, 1, 1], &mut args);
}
