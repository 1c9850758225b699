//! Kernels built from arbitrary bytes through the [`Builder`] API, and the whole compiler
//! run over them: the generator behind the random-kernel test (`tests/random_kernels.rs`)
//! and the `ir` and `pipeline` fuzz targets (`fuzz/`).
//!
//! Each byte picks what comes next (an op, its operands among the values built so far, a
//! shape, a loop or branch, or one of the shapes users write: a vector broadcast over a tile
//! with `.col()`/`.row()`, an accumulator carried through a loop into a reduction or `mma`,
//! a bounded store); an op the builder rejects is left out, so the IR is always what a front
//! end could have built. Every op gets its own source line (`random_kernel.rs:<n>`), so an
//! error that names no line is caught.
//!
//! [`exercise`] runs the verifier, the pass pipeline and the PTX writer for every target and
//! the interpreter on small inputs: any of them may refuse the kernel with an error, none
//! may panic or hang (loops run at most 3 times). [`check`] is the stricter judge of the
//! backend: per target, the PTX or the error's kind ([`Outcome`]), with ptxas run on every
//! module when asked; [`Tally`] counts outcomes by category with one example each.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kiln_ir::interp::{HostArg, run};
use kiln_ir::{
    Axis, BinaryOp, Builder, Const, DType, DiagKind, Diagnostic, HostTensor, Kernel, KernelOptions,
    Loc, OpKind, Param, ReduceOp, Shape, Target, UnaryOp, ValueId,
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

/// 2-D tile shapes the generator uses: small, mma-friendly, block-sized, and a few that are
/// no power of two.
const SHAPES: [[usize; 2]; 12] = [
    [16, 16],
    [16, 32],
    [32, 16],
    [32, 32],
    [64, 16],
    [16, 8],
    [64, 64],
    [128, 32],
    [96, 32],
    [64, 96],
    [128, 64],
    [32, 128],
];

/// Vector (1-D tile) lengths.
const LENGTHS: [usize; 6] = [16, 32, 64, 128, 96, 8];

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

/// Arithmetic a broadcast applies (defined on every numeric type).
const ARITH: [BinaryOp; 5] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Max,
    BinaryOp::Min,
];

const DTYPES: [DType; 5] = [DType::F32, DType::Bf16, DType::F16, DType::I32, DType::Bool];

/// Warps per block: mostly the default 4, sometimes any other count `#[kernel(num_warps)]`
/// accepts (1..=32), powers of two or not.
const WARPS: [u32; 12] = [4, 4, 4, 4, 1, 2, 8, 3, 6, 12, 16, 32];

/// The source file every generated op names.
pub const FILE: &str = "random_kernel.rs";

/// Parameter indices (see [`params`]).
const X: usize = 0;
const Y: usize = 1;
const OUT: usize = 2;
const V: usize = 4;
const OUT1: usize = 5;
const W: usize = 6;

/// The generator's state: the builder, every value built so far, the loop depth and the
/// next op's source line.
struct Gen<'a> {
    b: Builder,
    bytes: Bytes<'a>,
    values: Vec<ValueId>,
    depth: u32,
    line: u32,
}

/// The parameters every generated kernel takes; the 2-D tensors 16-byte aligned when
/// `aligned` (which TMA, and so the sm_90a and sm_100a schedules, need).
fn params(aligned: bool) -> Vec<Param> {
    let tensor = |name: &str, dtype, mutable| match Param::tensor(name, dtype, 2, mutable) {
        Param::Tensor {
            name,
            dtype,
            rank,
            mutable,
            ..
        } => Param::Tensor {
            name,
            dtype,
            rank,
            mutable,
            aligned16: aligned,
        },
        p => p,
    };
    vec![
        tensor("x", DType::F32, false),
        tensor("y", DType::Bf16, false),
        tensor("out", DType::F32, true),
        Param::Scalar {
            name: "s".into(),
            dtype: DType::F32,
        },
        Param::tensor("v", DType::F32, 1, false),
        Param::tensor("out1", DType::F32, 1, true),
        tensor("w", DType::Bf16, false),
    ]
}

/// A kernel built from `data` (see the module doc), or `None` when the builder refuses to
/// finish it.
pub fn kernel(data: &[u8]) -> Option<Kernel> {
    let mut bytes = Bytes { data, at: 0 };
    let options = KernelOptions {
        num_warps: WARPS[bytes.below(WARPS.len())],
        ..KernelOptions::default()
    };
    let aligned = !bytes.one_in(3);
    let mut g = Gen {
        b: Builder::new("random", params(aligned), options),
        bytes,
        values: Vec::new(),
        depth: 0,
        line: 0,
    };
    // One kernel in four opens with a GEMM mainloop, so the sm_90a and sm_100a schedules
    // (which take one such loop and little else) see many epilogues.
    let mainloop = if g.bytes.one_in(4) {
        g.accumulate(Some(4))
    } else {
        None
    };
    // A mainloop gets a short epilogue: the schedules take little beside their loop.
    let steps = if mainloop.is_some() { 6 } else { 48 };
    for _ in 0..steps {
        if g.bytes.done() {
            break;
        }
        g.step();
    }
    // Something the passes cannot drop as dead: the mainloop's product, and one more.
    if let Some(acc) = mainloop {
        g.store_value(OUT, acc);
    }
    g.store();
    g.b.finish().ok()
}

impl Gen<'_> {
    /// A fresh source line for the next op.
    fn loc(&mut self) -> Loc {
        self.line += 1;
        Loc {
            file: FILE,
            line: self.line,
            column: 1,
        }
    }

    /// Adds `kind` over `operands` and keeps its results; a refused op is left out.
    fn add(&mut self, kind: OpKind, operands: &[ValueId]) -> Option<ValueId> {
        let loc = self.loc();
        let r = self.b.op(kind, operands, loc).ok()?;
        self.values.extend(&r);
        r.first().copied()
    }

    fn constant(&mut self, c: Const, dtype: DType) -> Option<ValueId> {
        let loc = self.loc();
        self.b.constant(c, dtype, loc).ok()
    }

    fn any(&mut self) -> Option<ValueId> {
        let vs = self.values.clone();
        self.bytes.pick(&vs)
    }

    /// Mostly a value whose type `keep` accepts (so most ops type-check), sometimes any.
    fn such(&mut self, keep: impl Fn(&kiln_ir::Type) -> bool) -> Option<ValueId> {
        let of = self.all(keep);
        if of.is_empty() || self.bytes.one_in(8) {
            self.any()
        } else {
            self.bytes.pick(&of)
        }
    }

    /// Every value at hand whose type `keep` accepts.
    fn all(&self, keep: impl Fn(&kiln_ir::Type) -> bool) -> Vec<ValueId> {
        self.values
            .iter()
            .copied()
            .filter(|&v| keep(self.b.ty(v)))
            .collect()
    }

    /// `v` as `dtype` (cast if it is not).
    fn as_dtype(&mut self, v: ValueId, dtype: DType) -> Option<ValueId> {
        if self.b.ty(v).dtype() == dtype {
            return Some(v);
        }
        self.add(OpKind::Cast { to: dtype }, &[v])
    }

    /// A `dtype` tile of `shape`: one at hand, or loaded (and cast) from a tensor of its
    /// rank.
    fn tile_of(&mut self, shape: &[usize], dtype: DType) -> Option<ValueId> {
        let want = Shape(shape.to_vec());
        let at_hand = self.all(|t| t.shape() == Some(&want));
        if let Some(v) = self.bytes.pick(&at_hand).filter(|_| !self.bytes.one_in(3)) {
            return self.as_dtype(v, dtype);
        }
        let tensor = match (shape.len(), dtype) {
            (1, _) => V,
            (_, DType::Bf16 | DType::F16) => Y,
            _ => X,
        };
        let v = self.load(tensor, want)?;
        self.as_dtype(v, dtype)
    }

    /// A load of a `shape` tile of `tensor` at coordinates built from the values at hand
    /// (a loop's induction variable among them, scaled by the tile).
    fn load(&mut self, tensor: usize, shape: Shape) -> Option<ValueId> {
        let rank = if tensor == V || tensor == OUT1 { 1 } else { 2 };
        let coords = self.coords(rank, &shape)?;
        self.add(OpKind::Load { tensor, shape }, &coords)
    }

    /// `rank` i32 coordinates: constants, values at hand, or a value at hand times the
    /// tile's extent (a loop walking tiles).
    fn coords(&mut self, rank: usize, shape: &Shape) -> Option<Vec<ValueId>> {
        let mut out = Vec::with_capacity(rank);
        for d in 0..rank {
            let c = self.scalar(DType::I32)?;
            let extent = shape
                .dims()
                .get(d + shape.rank() - rank.min(shape.rank()))
                .copied();
            let c = match extent {
                Some(n) if self.bytes.one_in(2) => {
                    let n = self.constant(Const::Int(n as i64), DType::I32)?;
                    self.add(OpKind::Binary(BinaryOp::Mul), &[c, n])?
                }
                _ => c,
            };
            out.push(c);
        }
        Some(out)
    }

    /// A value of scalar type `dtype`, built if none is at hand.
    fn scalar(&mut self, dtype: DType) -> Option<ValueId> {
        let of = self.all(|t| t.shape().is_none() && t.dtype() == dtype);
        match self.bytes.pick(&of) {
            Some(v) if !self.bytes.one_in(4) => Some(v),
            _ => {
                let c = match dtype {
                    DType::F32 => Const::Float(f64::from(self.bytes.byte() as i8) / 8.0),
                    DType::Bool => Const::Bool(self.bytes.one_in(2)),
                    _ => Const::Int(i64::from(self.bytes.byte() % 80)),
                };
                let v = self.constant(c, dtype)?;
                self.values.push(v);
                Some(v)
            }
        }
    }

    /// A shape of `s`'s element count and 1 to 4 dimensions (`[32, 16]` as `[4, 8, 16]`,
    /// `[512]`, `[2, 16, 16]`): power-of-two factors split off the count.
    fn same_count(&mut self, s: &Shape) -> Shape {
        let rank = 1 + self.bytes.below(4);
        let mut rest = s.numel();
        let mut dims = Vec::with_capacity(rank);
        for _ in 1..rank {
            let f = [1, 2, 4, 8, 16][self.bytes.below(5)];
            if rest.is_multiple_of(f) {
                dims.push(f);
                rest /= f;
            } else {
                dims.push(1);
            }
        }
        dims.push(rest);
        Shape(dims)
    }

    fn shape(&mut self) -> Shape {
        if self.bytes.one_in(5) {
            Shape(vec![LENGTHS[self.bytes.below(LENGTHS.len())]])
        } else {
            Shape(SHAPES[self.bytes.below(SHAPES.len())].to_vec())
        }
    }

    fn step(&mut self) {
        match self.bytes.below(27) {
            0 => {
                self.scalar(DType::I32);
            }
            1 => {
                self.scalar(DType::F32);
            }
            2 => {
                let axis = [Axis::X, Axis::Y, Axis::Z][self.bytes.below(3)];
                match self.bytes.below(3) {
                    0 => self.add(OpKind::BlockId(axis), &[]),
                    1 => self.add(OpKind::GridDim(axis), &[]),
                    _ => {
                        let tensor = [X, Y, OUT, V][self.bytes.below(4)];
                        let dim = self.bytes.below(2);
                        self.add(OpKind::TensorDim { tensor, dim }, &[])
                    }
                };
            }
            3 | 4 => {
                let tensor = [X, Y, OUT][self.bytes.below(3)];
                let shape = Shape(SHAPES[self.bytes.below(SHAPES.len())].to_vec());
                self.load(tensor, shape);
            }
            5 => {
                if let Some(v) = self.any() {
                    let op = UNARY[self.bytes.below(UNARY.len())];
                    self.add(OpKind::Unary(op), &[v]);
                }
            }
            6 | 7 => {
                if let Some(a) = self.any() {
                    let ty = self.b.ty(a).clone();
                    let dtype = ty.dtype();
                    let c = self.such(|t| *t == ty || (t.shape().is_none() && t.dtype() == dtype));
                    let op = BINARY[self.bytes.below(BINARY.len())];
                    if let Some(c) = c {
                        let operands = if self.bytes.one_in(2) { [a, c] } else { [c, a] };
                        self.add(OpKind::Binary(op), &operands);
                    }
                }
            }
            8 => {
                if let Some(v) = self.any() {
                    let to = DTYPES[self.bytes.below(DTYPES.len())];
                    self.add(OpKind::Cast { to }, &[v]);
                }
            }
            9 | 10 => {
                if let Some(v) = self.such(|t| t.shape().is_some()) {
                    let op = [ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min][self.bytes.below(3)];
                    let rank = self.b.ty(v).shape().map_or(2, Shape::rank).max(2);
                    let dim = self.bytes.below(rank);
                    self.add(OpKind::Reduce { op, dim }, &[v]);
                }
            }
            11 => {
                self.mma(None);
            }
            12 => {
                let dtype = DTYPES[self.bytes.below(3)];
                if let Some(s) = self.scalar(dtype) {
                    let shape = self.shape();
                    self.add(OpKind::Splat { shape }, &[s]);
                }
            }
            13 => {
                let shape = self.shape();
                let dim = self.bytes.below(shape.rank());
                self.add(OpKind::Iota { shape, dim }, &[]);
            }
            14 => {
                let c = self.such(|t| t.dtype() == DType::Bool);
                if let (Some(c), Some(a)) = (c, self.any()) {
                    let ty = self.b.ty(a).clone();
                    if let Some(d) = self.such(|t| *t == ty) {
                        self.add(OpKind::Select, &[c, a, d]);
                    }
                }
            }
            15 => {
                if let Some(v) = self.any() {
                    let rank = self.b.ty(v).shape().map_or(0, Shape::rank);
                    if rank >= 2 && self.bytes.one_in(2) {
                        // A permutation of the tile's dimensions.
                        let mut perm: Vec<usize> = (0..rank).collect();
                        for i in (1..rank).rev() {
                            perm.swap(i, self.bytes.below(i + 1));
                        }
                        self.add(OpKind::Permute { perm }, &[v]);
                    } else {
                        self.add(OpKind::Transpose, &[v]);
                    }
                }
            }
            16 => {
                if let Some(v) = self.any() {
                    let shape = match self.b.ty(v).shape().cloned() {
                        Some(s) if self.bytes.one_in(2) => self.same_count(&s),
                        _ => self.shape(),
                    };
                    self.add(OpKind::Reshape { shape }, &[v]);
                }
            }
            17 | 18 => self.for_loop(),
            19 => self.branch(),
            20 | 21 => {
                self.broadcast();
            }
            22 => {
                self.accumulate(None);
            }
            23 => {
                let n = LENGTHS[self.bytes.below(LENGTHS.len())];
                self.load(V, Shape(vec![n]));
            }
            24 => {
                if let Some(c) = self.coords(2, &Shape(vec![1, 1])) {
                    self.add(OpKind::LoadScalar { tensor: X }, &c);
                }
            }
            25 => self.store_vector(),
            _ => self.store(),
        }
    }

    /// `mma(a, b)` or `mma_acc(a, b, acc)` on bf16 tiles of mma-friendly extents, `acc`
    /// given (a loop's carried accumulator) or found.
    fn mma(&mut self, acc: Option<(ValueId, usize, usize)>) -> Option<ValueId> {
        let pick = |g: &mut Self| [16, 32, 64][g.bytes.below(3)];
        let (m, n) = match acc {
            Some((_, m, n)) => (m, n),
            None => (pick(self), pick(self)),
        };
        let k = pick(self);
        let a = self.tile_of(&[m, k], DType::Bf16)?;
        let b = if self.bytes.one_in(4) {
            // `y.t()`: the B operand read transposed.
            let bt = self.tile_of(&[n, k], DType::Bf16)?;
            self.add(OpKind::Transpose, &[bt])?
        } else {
            self.tile_of(&[k, n], DType::Bf16)?
        };
        let mut operands = vec![a, b];
        match acc {
            Some((c, ..)) => operands.push(c),
            None if self.bytes.one_in(2) => {
                let acc_shape = Shape(vec![m, n]);
                if let Some(c) = self
                    .all(|t| t.shape() == Some(&acc_shape) && t.dtype() == DType::F32)
                    .first()
                {
                    operands.push(*c);
                }
            }
            None => {}
        }
        self.add(OpKind::Mma, &operands)
    }

    /// A vector broadcast over a 2-D tile, `t op v.col()` or `t op v.row()`: the vector a
    /// reduction of the tile, a loaded one, or an `iota`.
    fn broadcast(&mut self) -> Option<ValueId> {
        let t = self.such(|t| t.shape().is_some_and(|s| s.rank() == 2))?;
        let Some(&[r, c]) = self.b.ty(t).shape().map(Shape::dims) else {
            return None;
        };
        let dtype = self.b.ty(t).dtype();
        if dtype == DType::Bool {
            return None;
        }
        let col = self.bytes.one_in(2);
        let n = if col { r } else { c };
        let vector = match self.bytes.below(4) {
            0 | 1 => {
                let op = [ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min][self.bytes.below(3)];
                // `.col()` takes a per-row vector: the reduction along the columns.
                let dim = usize::from(col);
                self.add(OpKind::Reduce { op, dim }, &[t])?
            }
            2 => self.tile_of(&[n], dtype)?,
            _ => self.add(
                OpKind::Iota {
                    shape: Shape(vec![n]),
                    dim: 0,
                },
                &[],
            )?,
        };
        let vector = self.as_dtype(vector, dtype)?;
        let shape = Shape(if col { vec![n, 1] } else { vec![1, n] });
        let view = self.add(OpKind::Reshape { shape }, &[vector])?;
        let op = ARITH[self.bytes.below(ARITH.len())];
        let operands = if self.bytes.one_in(2) {
            [t, view]
        } else {
            [view, t]
        };
        self.add(OpKind::Binary(op), &operands)
    }

    /// An accumulator carried through a loop of at most 3 trips: `zeros` then, per trip, a
    /// loaded tile (walking the tensor by the induction variable) added in, reduced into
    /// it (`acc = acc + row_sum(t)`, `acc = max(acc, col_max(t))`), or `mma_acc` (`kind` 4:
    /// a GEMM mainloop's; `None`: any kind).
    fn accumulate(&mut self, kind: Option<usize>) -> Option<ValueId> {
        if self.depth >= 2 {
            return None;
        }
        let [r, c] = SHAPES[self.bytes.below(SHAPES.len())];
        let kind = kind.unwrap_or_else(|| self.bytes.below(5));
        let acc_shape = match kind {
            0 => vec![r],
            1 => vec![c],
            2 => vec![r, c],
            3 => vec![
                [16, 32, 64][self.bytes.below(3)],
                [16, 32, 64][self.bytes.below(3)],
            ],
            // A GEMM mainloop's block tile: what the sm_90a (16 rows a warp) and sm_100a
            // (128 rows) schedules take, mostly.
            _ => {
                let warps = self.b.kernel().options.num_warps as usize;
                vec![
                    [16 * warps, 16 * warps, 128][self.bytes.below(3)],
                    [64, 128, 256, 32][self.bytes.below(4)],
                ]
            }
        };
        let zero = self.constant(Const::Float(0.0), DType::F32)?;
        let init = self.add(
            OpKind::Splat {
                shape: Shape(acc_shape.clone()),
            },
            &[zero],
        )?;
        // A mainloop's block coordinates, computed before it as a user writes them.
        let origin = match kind {
            4 => Some(self.block_origin(acc_shape[0], acc_shape[1])),
            _ => None,
        };
        let trips = i64::from(1 + self.bytes.byte() % 3);
        let stages = match kind {
            4 => Some(2 + self.bytes.below(3) as u32).filter(|_| !self.bytes.one_in(4)),
            _ => self.bytes.one_in(3).then_some(2),
        };
        let scope = self.begin_for(trips, &[init], stages)?;
        let outer = self.values.clone();
        self.values.push(scope.iv);
        self.values.extend(&scope.carried);
        self.depth += 1;
        if self.bytes.one_in(2) {
            self.step();
        }
        let acc = scope.carried[0];
        let next = match kind {
            0 | 1 => self.load(X, Shape(vec![r, c])).and_then(|t| {
                let op = [ReduceOp::Sum, ReduceOp::Max][self.bytes.below(2)];
                let red = self.add(OpKind::Reduce { op, dim: 1 - kind }, &[t])?;
                let combine = if op == ReduceOp::Sum {
                    BinaryOp::Add
                } else {
                    BinaryOp::Max
                };
                self.add(OpKind::Binary(combine), &[acc, red])
            }),
            2 => self
                .load(X, Shape(vec![r, c]))
                .and_then(|t| self.add(OpKind::Binary(BinaryOp::Add), &[acc, t])),
            3 => self.mma(Some((acc, acc_shape[0], acc_shape[1]))),
            _ => origin.flatten().and_then(|(row, col)| {
                self.mainloop_step(scope.iv, acc, row, col, acc_shape[0], acc_shape[1])
            }),
        };
        self.depth -= 1;
        self.values = outer;
        let loc = self.loc();
        let results = self.b.end_for(&scope, &[next.unwrap_or(acc)], loc).ok()?;
        self.values.extend(&results);
        results.first().copied()
    }

    /// One step of a GEMM mainloop at induction variable `kb`: `acc + a @ b` with `a` the
    /// block's rows of `y` (from `row`) at column `kb * bk`, `b` the next `bk` rows of `w`
    /// at column `col` (read directly or as the transpose of a loaded tile).
    fn mainloop_step(
        &mut self,
        kb: ValueId,
        acc: ValueId,
        row: ValueId,
        col: ValueId,
        m: usize,
        n: usize,
    ) -> Option<ValueId> {
        let bk = [32, 64][self.bytes.below(2)];
        let bkc = self.constant(Const::Int(bk as i64), DType::I32)?;
        let k0 = self.add(OpKind::Binary(BinaryOp::Mul), &[kb, bkc])?;
        let a = self.add(
            OpKind::Load {
                tensor: Y,
                shape: Shape(vec![m, bk]),
            },
            &[row, k0],
        )?;
        let b = if self.bytes.one_in(3) {
            let bt = self.add(
                OpKind::Load {
                    tensor: W,
                    shape: Shape(vec![n, bk]),
                },
                &[col, k0],
            )?;
            self.add(OpKind::Transpose, &[bt])?
        } else {
            self.add(
                OpKind::Load {
                    tensor: W,
                    shape: Shape(vec![bk, n]),
                },
                &[k0, col],
            )?
        };
        self.add(OpKind::Mma, &[a, b, acc])
    }

    /// `(block_id().x * m, block_id().y * n)`: a block's tile origin.
    fn block_origin(&mut self, m: usize, n: usize) -> Option<(ValueId, ValueId)> {
        let (bx, by) = (
            self.add(OpKind::BlockId(Axis::X), &[])?,
            self.add(OpKind::BlockId(Axis::Y), &[])?,
        );
        let (bm, bn) = (
            self.constant(Const::Int(m as i64), DType::I32)?,
            self.constant(Const::Int(n as i64), DType::I32)?,
        );
        Some((
            self.add(OpKind::Binary(BinaryOp::Mul), &[bx, bm])?,
            self.add(OpKind::Binary(BinaryOp::Mul), &[by, bn])?,
        ))
    }

    /// Opens `for i in 0..trips` carrying `init`.
    fn begin_for(
        &mut self,
        trips: i64,
        init: &[ValueId],
        stages: Option<u32>,
    ) -> Option<kiln_ir::builder::ForScope> {
        let lo = self.constant(Const::Int(0), DType::I32)?;
        let hi = self.constant(Const::Int(trips), DType::I32)?;
        let one = self.constant(Const::Int(1), DType::I32)?;
        let loc = self.loc();
        self.b.begin_for(lo, hi, one, init, stages, loc).ok()
    }

    /// A store of an f32 rank-2 tile (mostly) into `out` (mostly), bounded along its
    /// columns one time in four.
    fn store(&mut self) {
        let tensor = if self.bytes.one_in(8) {
            [X, Y, OUT, V, OUT1][self.bytes.below(5)]
        } else {
            OUT
        };
        let v = self.such(|t| t.dtype() == DType::F32 && t.shape().is_some_and(|s| s.rank() == 2));
        let Some(v) = v else { return };
        let shape = self.b.ty(v).shape().cloned().unwrap_or(Shape(Vec::new()));
        let Some(mut c) = self.coords(2, &shape) else {
            return;
        };
        c.push(v);
        let bound = self.bytes.one_in(4).then_some(1);
        if bound.is_some()
            && let Some(limit) = self.scalar(DType::I32)
        {
            c.push(limit);
        }
        self.add(OpKind::Store { tensor, bound }, &c);
    }

    /// A store of tile `v` into `tensor` at the block's tile (`block_id().x` times its
    /// extents).
    fn store_value(&mut self, tensor: usize, v: ValueId) -> Option<()> {
        let dims = self.b.ty(v).shape()?.dims().to_vec();
        let bid = self.add(OpKind::BlockId(Axis::X), &[])?;
        let mut operands = Vec::with_capacity(dims.len() + 1);
        for n in dims {
            let n = self.constant(Const::Int(n as i64), DType::I32)?;
            operands.push(self.add(OpKind::Binary(BinaryOp::Mul), &[bid, n])?);
        }
        operands.push(v);
        self.add(
            OpKind::Store {
                tensor,
                bound: None,
            },
            &operands,
        )
        .map(|_| ())
    }

    /// A store of an f32 vector into `out1`, sometimes bounded.
    fn store_vector(&mut self) {
        let v = self.such(|t| t.dtype() == DType::F32 && t.shape().is_some_and(|s| s.rank() == 1));
        let Some(v) = v else { return };
        let shape = self.b.ty(v).shape().cloned().unwrap_or(Shape(Vec::new()));
        let Some(mut c) = self.coords(1, &shape) else {
            return;
        };
        c.push(v);
        let bound = self.bytes.one_in(3).then_some(0);
        if bound.is_some()
            && let Some(limit) = self.scalar(DType::I32)
        {
            c.push(limit);
        }
        self.add(
            OpKind::Store {
                tensor: OUT1,
                bound,
            },
            &c,
        );
    }

    /// A loop of at most 3 trips carrying one value, with a few body steps.
    fn for_loop(&mut self) {
        if self.depth >= 2 {
            return;
        }
        let trips = i64::from(self.bytes.byte() % 4);
        let init: Vec<ValueId> = self.any().into_iter().collect();
        let stages = (self.bytes.one_in(3)).then_some(2);
        let Some(scope) = self.begin_for(trips, &init, stages) else {
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
        let loc = self.loc();
        if let Ok(results) = self.b.end_for(&scope, &next, loc) {
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
        let loc = self.loc();
        let Ok(op) = self.b.begin_if(cond, loc) else {
            return;
        };
        let outer = self.values.clone();
        self.depth += 1;
        self.step();
        let then_v = self.yield_like(v);
        self.values = outer.clone();
        let loc = self.loc();
        let else_ok = self.b.begin_else(op, &[then_v], loc).is_ok();
        self.step();
        let else_v = self.yield_like(v);
        self.depth -= 1;
        self.values = outer;
        let loc = self.loc();
        if else_ok && let Ok(results) = self.b.end_if(op, &[else_v], loc) {
            self.values.extend(results);
        }
    }

    /// A value of `v`'s type among those at hand (`v` itself if none).
    fn yield_like(&mut self, v: ValueId) -> ValueId {
        let ty = self.b.ty(v).clone();
        let same = self.all(|t| *t == ty);
        self.bytes.pick(&same).unwrap_or(v)
    }
}

/// Runs the compiler over `kernel`: the pass pipeline and the PTX writer for every target,
/// then the interpreter on small random inputs. Errors are answers; a panic is a bug.
pub fn exercise(kernel: &Kernel) {
    for target in Target::ALL {
        let _ = kiln_ptx::compile(kernel, target);
    }
    interpret(kernel);
}

/// Runs `kernel` on the interpreter over small inputs (two blocks); its answer is ignored.
pub fn interpret(kernel: &Kernel) {
    let x = HostTensor::from_fn(&[48, 40], DType::F32, |i| (i % 7) as f64 - 3.0);
    let y = HostTensor::from_fn(&[40, 48], DType::Bf16, |i| (i % 5) as f64 * 0.5);
    let mut out = HostTensor::from_fn(&[48, 48], DType::F32, |_| f64::NAN);
    let v = HostTensor::from_fn(&[100], DType::F32, |i| (i % 9) as f64 - 4.0);
    let mut out1 = HostTensor::from_fn(&[100], DType::F32, |_| f64::NAN);
    let w = HostTensor::from_fn(&[40, 48], DType::Bf16, |i| (i % 3) as f64 - 1.0);
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&y),
        HostArg::TensorMut(&mut out),
        HostArg::F32(0.5),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut out1),
        HostArg::Tensor(&w),
    ];
    let _ = run(kernel, [2, 1, 1], &mut args);
}

/// What the backend made of a kernel for one target.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// PTX (that ptxas accepted, when it was run).
    Ptx,
    /// An error of the user's kernel ([`DiagKind::Invalid`]), at an op's line.
    Invalid(Diagnostic),
    /// A construct kiln does not lower yet ([`DiagKind::Unsupported`]), at an op's line.
    Unsupported(Diagnostic),
    /// A kiln bug the backend caught ([`DiagKind::Internal`]).
    Internal(Diagnostic),
    /// An error that names no source line although every op has one.
    Unlocated(Diagnostic),
    /// PTX that ptxas rejected: its message, mapped to the op's line.
    PtxasRejected(String),
    /// A panic, with its message.
    Panic(String),
}

impl Outcome {
    /// Whether this outcome is a kiln bug: a panic, an internal error, an error without a
    /// line, or PTX ptxas rejects.
    pub fn is_bug(&self) -> bool {
        matches!(
            self,
            Outcome::Internal(_)
                | Outcome::Unlocated(_)
                | Outcome::PtxasRejected(_)
                | Outcome::Panic(_)
        )
    }

    /// The outcome's category: its kind and its message with numbers elided, so kernels
    /// failing the same way count together.
    pub fn category(&self) -> String {
        let (kind, text) = match self {
            Outcome::Ptx => return "ptx".into(),
            Outcome::Invalid(d) => ("invalid", d.message.as_str()),
            Outcome::Unsupported(d) => ("unsupported", d.message.as_str()),
            Outcome::Internal(d) => ("INTERNAL", d.message.as_str()),
            Outcome::Unlocated(d) => ("UNLOCATED", d.message.as_str()),
            Outcome::PtxasRejected(m) => ("PTXAS", m.as_str()),
            Outcome::Panic(m) => ("PANIC", m.as_str()),
        };
        let first = text.lines().next().unwrap_or("");
        // Numbers go (`a 16x32 tile`, line numbers), names with digits stay (`sm_80`, `f32`).
        let mut key = String::with_capacity(first.len());
        let mut prev = ' ';
        for ch in first.chars() {
            let in_name = prev.is_ascii_alphabetic() && prev != 'x' || prev == '_';
            if ch.is_ascii_digit() && (prev == 'N' || !in_name && !prev.is_ascii_digit()) {
                if prev != 'N' {
                    key.push('N');
                }
                prev = 'N';
                continue;
            }
            if ch.is_ascii_digit() && prev == 'N' {
                continue;
            }
            key.push(ch);
            prev = ch;
        }
        format!("{kind}: {key}")
    }
}

/// Compiles `kernel` for `target` (the pass pipeline and the PTX writer), catching panics,
/// and with `ptxas` assembles the PTX: the [`Outcome`].
pub fn check(kernel: &Kernel, target: Target, ptxas: bool) -> Outcome {
    let compiled = catch_unwind(AssertUnwindSafe(|| kiln_ptx::compile(kernel, target)));
    match compiled {
        Err(payload) => Outcome::Panic(
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into()),
        ),
        Ok(Err(e)) => {
            let d = e.diagnostic().clone();
            match d.kind {
                _ if !d.loc.is_known() => Outcome::Unlocated(d),
                DiagKind::Invalid => Outcome::Invalid(d),
                DiagKind::Unsupported => Outcome::Unsupported(d),
                DiagKind::Internal => Outcome::Internal(d),
            }
        }
        Ok(Ok(m)) if ptxas => match kiln_ptx::ptxas::check(&m.ptx, target) {
            Ok(_) => Outcome::Ptx,
            Err(kiln_ptx::ptxas::PtxasError::Rejected { at, log, .. }) => {
                Outcome::PtxasRejected(match at.first() {
                    Some(d) => format!("{}\n{d}", d.message),
                    None => log,
                })
            }
            // ptxas missing or not runnable: nothing to say about the PTX.
            Err(_) => Outcome::Ptx,
        },
        Ok(Ok(_)) => Outcome::Ptx,
    }
}

/// One kind of outcome on one target: a [`Tally`]'s key. Bugs sort first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Category {
    /// Whether the outcome is an answer, not a bug ([`Outcome::is_bug`]).
    pub answer: bool,
    /// The target.
    pub target: Target,
    /// [`Outcome::category`].
    pub text: String,
}

/// How often a [`Category`] was seen, and its first example.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Kernels that ended so.
    pub count: usize,
    /// The bytes of the first ([`kernel`] rebuilds it).
    pub bytes: Vec<u8>,
    /// The first one's error, rendered (empty for PTX).
    pub shown: String,
}

/// Outcomes counted by target and category, with the first example of each: what a fuzz
/// run found.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Byte strings tried.
    pub attempts: usize,
    /// Kernels the generator built from them.
    pub kernels: usize,
    /// Kernels whose PTX ptxas assembled (for every target that wrote some).
    pub assembled: usize,
    /// Every category seen.
    pub counts: BTreeMap<Category, Seen>,
}

impl Tally {
    /// Counts `outcome` of the kernel made from `bytes` on `target`.
    pub fn add(&mut self, target: Target, outcome: &Outcome, bytes: &[u8]) {
        let key = Category {
            answer: !outcome.is_bug(),
            target,
            text: outcome.category(),
        };
        let shown = match outcome {
            Outcome::Ptx => String::new(),
            Outcome::Invalid(d)
            | Outcome::Unsupported(d)
            | Outcome::Internal(d)
            | Outcome::Unlocated(d) => d.to_string(),
            Outcome::PtxasRejected(m) | Outcome::Panic(m) => m.clone(),
        };
        self.counts
            .entry(key)
            .or_insert_with(|| Seen {
                count: 0,
                bytes: bytes.to_vec(),
                shown,
            })
            .count += 1;
    }

    /// The categories that are bugs, with their counts and examples.
    pub fn bugs(&self) -> impl Iterator<Item = (&Category, &Seen)> {
        self.counts.iter().filter(|(c, _)| !c.answer)
    }

    /// Every category with its count, the bugs first, each with its example's bytes.
    pub fn report(&self) -> String {
        let mut out = format!(
            "{} kernels from {} byte strings, {} of them through ptxas\n",
            self.kernels, self.attempts, self.assembled
        );
        for (c, seen) in &self.counts {
            out.push_str(&format!(
                "{:7}  {:8} {}\n",
                seen.count,
                c.target.name(),
                c.text
            ));
            if !seen.shown.is_empty() {
                out.push_str(&format!("         e.g. bytes {:?}\n", seen.bytes));
                for l in seen.shown.lines().take(4) {
                    out.push_str(&format!("           {l}\n"));
                }
            }
        }
        out
    }
}

/// A fuzz run: kernels from random bytes drawn from `rng` until `cases` byte strings or
/// `budget` is spent, each checked on every target ([`check`]; ptxas on every
/// `ptxas_every`-th kernel, none when `None`) and, when `interpret_too` is set, run on the
/// interpreter (which must not panic either).
pub fn fuzz(
    rng: &mut crate::inputs::Rng,
    cases: usize,
    budget: std::time::Duration,
    ptxas_every: Option<usize>,
    interpret_too: bool,
) -> Tally {
    let start = std::time::Instant::now();
    let mut tally = Tally::default();
    for _ in 0..cases {
        if start.elapsed() > budget {
            break;
        }
        let len = 16 + (rng.uniform(0.0, 240.0) as usize);
        let bytes: Vec<u8> = (0..len).map(|_| rng.uniform(0.0, 256.0) as u8).collect();
        tally.attempts += 1;
        let built = catch_unwind(|| kernel(&bytes));
        let k = match built {
            Ok(Some(k)) => k,
            Ok(None) => continue,
            Err(_) => {
                for t in Target::ALL {
                    tally.add(
                        t,
                        &Outcome::Panic("the generator or builder panicked".into()),
                        &bytes,
                    );
                }
                continue;
            }
        };
        let ptxas = ptxas_every.is_some_and(|n| tally.kernels.is_multiple_of(n.max(1)));
        tally.kernels += 1;
        tally.assembled += usize::from(ptxas);
        for t in Target::ALL {
            tally.add(t, &check(&k, t, ptxas), &bytes);
        }
        if interpret_too && catch_unwind(AssertUnwindSafe(|| interpret(&k))).is_err() {
            tally.add(
                Target::Sm80,
                &Outcome::Panic("the interpreter panicked".into()),
                &bytes,
            );
        }
    }
    tally
}
