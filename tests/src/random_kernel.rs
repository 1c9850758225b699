//! Kernels built from arbitrary bytes through the [`Builder`] API, and the whole compiler run
//! over them: the generator behind the random-kernel test (`tests/random_kernels.rs`) and the
//! `ir` and `pipeline` fuzz targets. [`kernel`] builds a kernel from bytes; [`exercise`] runs
//! every stage on it, where any may refuse the kernel with an error but none may panic or hang;
//! [`check`] is the stricter judge of the backend ([`Outcome`]), [`interpret`] the
//! interpreter's, and [`Tally`] counts outcomes by category.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kiln_ir::interp::{HostArg, InterpError, run};
use kiln_ir::kernel::{Access, Addr, AtomicOp, MemScope, MemSem};
use kiln_ir::{
    Axis, BinaryOp, Builder, Const, DType, DiagKind, Diagnostic, HostTensor, Kernel, KernelOptions,
    Loc, OpKind, Param, ReduceOp, Shape, Target, UnaryOp, ValueId,
};

use crate::check::bits;

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

const UNARY: [UnaryOp; 15] = [
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Erf,
    UnaryOp::Sigmoid,
    UnaryOp::Log,
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

const BINARY: [BinaryOp; 21] = [
    BinaryOp::BitAnd,
    BinaryOp::BitOr,
    BinaryOp::BitXor,
    BinaryOp::Shl,
    BinaryOp::Shr,
    BinaryOp::MulHi,
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

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::Bf16,
    DType::F16,
    DType::I32,
    DType::Bool,
    DType::U32,
];

/// Integer and bit operators.
const BITS: [BinaryOp; 9] = [
    BinaryOp::BitAnd,
    BinaryOp::BitOr,
    BinaryOp::BitXor,
    BinaryOp::Shl,
    BinaryOp::Shr,
    BinaryOp::MulHi,
    BinaryOp::Mul,
    BinaryOp::Add,
    BinaryOp::Rem,
];

/// Tiles too large for a thread's registers (more than 64 elements a thread at 4 warps): the
/// `strip_mine` pass streams them in chunks.
const BIG: [&[usize]; 8] = [
    &[256, 128],
    &[128, 256],
    &[512, 64],
    &[64, 512],
    &[256, 256],
    &[1024, 32],
    &[8192],
    &[4, 64, 128],
];

/// 3-D and 4-D tile shapes.
const SHAPES_ND: [&[usize]; 7] = [
    &[2, 16, 32],
    &[4, 8, 16],
    &[2, 4, 64],
    &[8, 16, 8],
    &[2, 2, 16, 16],
    &[2, 4, 8, 32],
    &[1, 2, 32, 16],
];

const ATOMICS: [AtomicOp; 5] = [
    AtomicOp::Add,
    AtomicOp::Max,
    AtomicOp::Min,
    AtomicOp::Xchg,
    AtomicOp::Cas,
];

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
/// i32 indices (some negative or past the end).
const IDX: usize = 7;
/// A mutable i32 vector: histograms and counters.
const CNT: usize = 8;
/// A rank-3 f32 tensor.
const X3: usize = 9;
/// A mutable rank-4 f32 tensor.
const OUT4: usize = 10;
/// A u32 scalar: a random stream's seed.
const SEED: usize = 11;

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
        Param::tensor("idx", DType::I32, 1, false),
        Param::tensor("cnt", DType::I32, 1, true),
        Param::tensor("x3", DType::F32, 3, false),
        Param::tensor("out4", DType::F32, 4, true),
        Param::Scalar {
            name: "seed".into(),
            dtype: DType::U32,
        },
    ]
}

/// A kernel built from `data`, or `None` when the builder refuses to finish it.
///
/// Each byte picks what comes next (an op, its operands among the values built so far, a
/// shape, a loop or branch, or one of the shapes users write: a vector broadcast over a tile
/// with `.col()`/`.row()`, an accumulator carried through a loop into a reduction or `mma`,
/// a bounded store; bit and integer ops on i32 and u32, bitcasts, Philox `rand`/`randn`
/// chains, `sin`/`cos`/`tanh`/`erf`/`sigmoid`/`log`, masked loads with a fill value, row
/// and element gathers and scatters, tile and scalar atomics of every op and memory order,
/// in-tile `take`, reshapes and permutes to 3-D and 4-D tiles, tiles too large for
/// registers, reductions over any dimension, strided and persistent loops, any
/// `num_warps`); an op the builder rejects is left out, so the IR is always what a front
/// end could have built. Every op gets its own source line (`random_kernel.rs:<n>`), so an
/// error that names no line is caught.
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
    // What the steps computed, stored, so that the passes keep it and the backend writes
    // it (the bytes have run out here: no choice is left to make).
    g.sink_unused();
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
        match self.bytes.below(40) {
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
                    // Any dimension of the operand; now and then one past its last.
                    let rank = self.b.ty(v).shape().map_or(2, Shape::rank);
                    let past = usize::from(self.bytes.one_in(16));
                    let dim = self.bytes.below(rank + past);
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
            26 => self.store(),
            27 => {
                if let Some(v) = self.such(|t| t.dtype() == DType::F32) {
                    let op = UNARY[self.bytes.below(6)];
                    self.add(OpKind::Unary(op), &[v]);
                }
            }
            28 => {
                self.bits();
            }
            29 => {
                self.bitcast();
            }
            30 => {
                self.random();
            }
            31 => {
                self.masked_load();
            }
            32 => {
                self.gather();
            }
            33 => {
                self.scatter();
            }
            34 => {
                self.atomic();
            }
            35 => {
                self.scalar_atomic();
            }
            36 => {
                self.take();
            }
            37 => {
                self.tile_nd();
            }
            38 => {
                self.big_tile();
            }
            _ => self.for_loop(),
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
        let rank = match self.b.params().get(tensor) {
            Some(Param::Tensor { rank, .. }) => *rank,
            _ => dims.len(),
        };
        let mut operands = Vec::with_capacity(rank + 1);
        // The tensor's dimensions the tile does not cover, at 0.
        for _ in dims.len()..rank {
            operands.push(self.int(0)?);
        }
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
        let scope = match self.bytes.below(4) {
            0 => self.strided_for(trips, &init, stages),
            1 => self.persistent_for(&init, stages),
            _ => self.begin_for(trips, &init, stages),
        };
        let Some(scope) = scope else {
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

/// The operations added since the first generator: bit and integer arithmetic, bitcasts,
/// counter-based random numbers, masked loads, gathers, scatters, atomics, in-tile `take`,
/// 3-D and 4-D tiles, tiles streamed in chunks, strided and persistent loops.
impl Gen<'_> {
    /// Stores the values at hand no op reads (the last 16 tiles and 2 scalars of them): a
    /// tile into the tensor of its rank (cast to f32), a scalar through a scalar atomic
    /// exchange.
    fn sink_unused(&mut self) {
        let k = self.b.kernel();
        let read: std::collections::HashSet<ValueId> = k
            .ops
            .iter()
            .flat_map(|(_, op)| op.operands.iter().copied())
            .collect();
        let unused = |tiles: bool| -> Vec<ValueId> {
            self.values
                .iter()
                .copied()
                .filter(|v| !read.contains(v) && self.b.ty(*v).shape().is_some() == tiles)
                .collect()
        };
        // Tiles first (the ops worth writing make them), then a few scalars.
        let mut sinks: Vec<ValueId> = unused(true).into_iter().rev().take(16).collect();
        sinks.extend(unused(false).into_iter().rev().take(2));
        for v in sinks {
            let ty = self.b.ty(v).clone();
            let Some(v) = self.as_dtype(v, DType::F32) else {
                continue;
            };
            match ty.shape().map(Shape::rank) {
                None => {
                    let Some(at) = self.int(i64::from(self.line % 48)) else {
                        continue;
                    };
                    self.add(
                        OpKind::ScalarAtomic {
                            tensor: OUT,
                            op: AtomicOp::Xchg,
                            sem: MemSem::Relaxed,
                            scope: MemScope::Gpu,
                        },
                        &[at, at, v],
                    );
                }
                Some(rank) => {
                    let tensor = match rank {
                        1 => OUT1,
                        2 => OUT,
                        _ => OUT4,
                    };
                    self.store_value(tensor, v);
                }
            }
        }
    }

    /// A u32 constant.
    fn word(&mut self, w: u32) -> Option<ValueId> {
        self.constant(Const::Int(i64::from(w)), DType::U32)
    }

    /// An i32 constant.
    fn int(&mut self, v: i64) -> Option<ValueId> {
        self.constant(Const::Int(v), DType::I32)
    }

    /// `a op b` on an integer value at hand (cast to i32 or u32 if it is not one) and a
    /// scalar or a value of its type: `& | ^ << >> mulhi * + %`.
    fn bits(&mut self) -> Option<ValueId> {
        let a = self.such(|t| matches!(t.dtype(), DType::I32 | DType::U32))?;
        let dtype = if self.bytes.one_in(2) {
            DType::U32
        } else {
            DType::I32
        };
        let a = match self.b.ty(a).dtype() {
            DType::I32 | DType::U32 => a,
            _ => self.as_dtype(a, dtype)?,
        };
        let dtype = self.b.ty(a).dtype();
        let op = BITS[self.bytes.below(BITS.len())];
        let ty = self.b.ty(a).clone();
        let b = match self.bytes.below(3) {
            // A shift amount or a mask, some of them past 31.
            0 => {
                let c = [1, 7, 13, 31, 32, 40, 0xFFFF][self.bytes.below(7)];
                self.constant(Const::Int(c), dtype)?
            }
            1 => self.such(|t| *t == ty)?,
            _ => self.scalar(dtype)?,
        };
        let operands = if self.bytes.one_in(3) { [b, a] } else { [a, b] };
        self.add(OpKind::Binary(op), &operands)
    }

    /// A bitcast between types of one width (f32, i32, u32; bf16, f16), sometimes to one
    /// of another width (which the builder refuses).
    fn bitcast(&mut self) -> Option<ValueId> {
        let v = self.any()?;
        let to = match self.b.ty(v).dtype() {
            DType::Bf16 => DType::F16,
            DType::F16 => DType::Bf16,
            _ => [DType::F32, DType::I32, DType::U32, DType::Bf16][self.bytes.below(4)],
        };
        self.add(OpKind::Bitcast { to }, &[v])
    }

    /// `rand(seed, offsets)` or `randn(seed, offsets)` as the DSL writes them: Philox rounds
    /// (`umulhi`, `*`, `^` and the key's Weyl steps) on a u32 counter tile, the first words
    /// mapped to `[0, 1)` and, for `randn`, through Box-Muller.
    fn random(&mut self) -> Option<ValueId> {
        let big = self.bytes.one_in(6);
        let shape = if big {
            Shape(BIG[self.bytes.below(BIG.len())].to_vec())
        } else {
            self.shape()
        };
        let dim = self.bytes.below(shape.rank());
        let iota = self.add(OpKind::Iota { shape, dim }, &[])?;
        let base = self.scalar(DType::I32)?;
        let offsets = self.add(OpKind::Binary(BinaryOp::Add), &[iota, base])?;
        let c0 = self.add(OpKind::Bitcast { to: DType::U32 }, &[offsets])?;
        let mut k0 = if self.bytes.one_in(2) {
            self.add(OpKind::ScalarParam(SEED), &[])?
        } else {
            let w = u32::from(self.bytes.byte()) * 0x0101_0101;
            self.word(w)?
        };
        let mut k1 = self.word(0)?;
        // A tile too large for registers gets a round or two: the passes' and the
        // interpreter's time grows with its elements times the ops on it, and a debug build
        // takes seconds per round there.
        let rounds = if big {
            1 + self.bytes.below(2)
        } else if self.bytes.one_in(2) {
            10
        } else {
            1 + self.bytes.below(10)
        };
        // `None` is a word known to be zero, as the DSL folds it.
        let mut c: [Option<ValueId>; 4] = [Some(c0), None, None, None];
        for round in 0..rounds {
            let times = |g: &mut Self, w: Option<ValueId>, m: u32, op| -> Option<Option<ValueId>> {
                match w {
                    None => Some(None),
                    Some(w) => {
                        let m = g.word(m)?;
                        Some(Some(g.add(OpKind::Binary(op), &[m, w])?))
                    }
                }
            };
            let xor = |g: &mut Self, a: Option<ValueId>, b: Option<ValueId>| match (a, b) {
                (None, w) | (w, None) => Some(w),
                (Some(a), Some(b)) => Some(Some(g.add(OpKind::Binary(BinaryOp::BitXor), &[a, b])?)),
            };
            let hi_b = times(self, c[2], 0xCD9E_8D57, BinaryOp::MulHi)?;
            let hi_a = times(self, c[0], 0xD251_1F53, BinaryOp::MulHi)?;
            let x0 = xor(self, hi_b, c[1])?;
            let n0 = xor(self, x0, Some(k0))?;
            let n1 = times(self, c[2], 0xCD9E_8D57, BinaryOp::Mul)?;
            let x2 = xor(self, hi_a, c[3])?;
            let n2 = xor(self, x2, Some(k1))?;
            let n3 = times(self, c[0], 0xD251_1F53, BinaryOp::Mul)?;
            c = [n0, n1, n2, n3];
            if round + 1 < rounds {
                let (a, b) = (self.word(0x9E37_79B9)?, self.word(0xBB67_AE85)?);
                k0 = self.add(OpKind::Binary(BinaryOp::Add), &[k0, a])?;
                k1 = self.add(OpKind::Binary(BinaryOp::Add), &[k1, b])?;
            }
        }
        let w0 = c[0].unwrap_or(c0);
        let u1 = self.uniform(w0)?;
        if self.bytes.one_in(2) {
            return Some(u1);
        }
        // randn: sqrt(-2 ln max(u1, 1e-7)) * cos(2 pi u2).
        let w1 = c[1].or(c[2]).unwrap_or(c0);
        let u2 = self.uniform(w1)?;
        let floor = self.constant(Const::Float(1.0e-7), DType::F32)?;
        let u1 = self.add(OpKind::Binary(BinaryOp::Max), &[u1, floor])?;
        let l = self.add(OpKind::Unary(UnaryOp::Log), &[u1])?;
        let m2 = self.constant(Const::Float(-2.0), DType::F32)?;
        let l = self.add(OpKind::Binary(BinaryOp::Mul), &[l, m2])?;
        let r = self.add(OpKind::Unary(UnaryOp::Sqrt), &[l])?;
        let tau = self.constant(Const::Float(std::f64::consts::TAU), DType::F32)?;
        let theta = self.add(OpKind::Binary(BinaryOp::Mul), &[u2, tau])?;
        let cos = self.add(OpKind::Unary(UnaryOp::Cos), &[theta])?;
        self.add(OpKind::Binary(BinaryOp::Mul), &[r, cos])
    }

    /// u32 bits `x` as an f32 in `[0, 1)`, as `rand` maps them.
    fn uniform(&mut self, x: ValueId) -> Option<ValueId> {
        let s = self.add(OpKind::Bitcast { to: DType::I32 }, &[x])?;
        let zero = self.int(0)?;
        let negative = self.add(OpKind::Binary(BinaryOp::Lt), &[s, zero])?;
        let flipped = self.add(OpKind::Unary(UnaryOp::Not), &[s])?;
        let v = self.add(OpKind::Select, &[negative, flipped, s])?;
        let f = self.add(OpKind::Cast { to: DType::F32 }, &[v])?;
        let scale = self.constant(Const::Float(4.656_612_734_2e-10), DType::F32)?;
        self.add(OpKind::Binary(BinaryOp::Mul), &[f, scale])
    }

    /// A tensor to read a tile of `rank` from, with its rank and dtype.
    fn readable(&mut self, rank: usize) -> (usize, usize, DType) {
        let of: &[(usize, usize, DType)] = match rank {
            1 => &[(V, 1, DType::F32), (IDX, 1, DType::I32), (X, 2, DType::F32)],
            2 => &[(X, 2, DType::F32), (Y, 2, DType::Bf16), (X3, 3, DType::F32)],
            3 => &[(X3, 3, DType::F32), (OUT4, 4, DType::F32)],
            _ => &[(OUT4, 4, DType::F32)],
        };
        of[self.bytes.below(of.len())]
    }

    /// A bool mask broadcasting to `shape`: an `iota` compared with a scalar (the tail of a
    /// row), a comparison of a tile at hand, or a scalar.
    fn mask(&mut self, shape: &Shape) -> Option<ValueId> {
        match self.bytes.below(4) {
            0 | 1 => {
                let dim = self.bytes.below(shape.rank());
                // Along one dimension only: `cols.row() < n`.
                let mut dims = vec![1; shape.rank()];
                dims[dim] = shape.dims()[dim];
                let along = if self.bytes.one_in(2) {
                    Shape(dims)
                } else {
                    shape.clone()
                };
                let iota = self.add(OpKind::Iota { shape: along, dim }, &[])?;
                let n = self.scalar(DType::I32)?;
                let op = [BinaryOp::Lt, BinaryOp::Ge, BinaryOp::Ne][self.bytes.below(3)];
                self.add(OpKind::Binary(op), &[iota, n])
            }
            2 => {
                let want = shape.clone();
                let b = self.all(|t| t.dtype() == DType::Bool && t.shape() == Some(&want));
                match self.bytes.pick(&b) {
                    Some(b) => Some(b),
                    None => self.scalar(DType::Bool),
                }
            }
            _ => self.scalar(DType::Bool),
        }
    }

    /// A fill value of `dtype`: zero, a large magnitude or minus infinity.
    fn fill(&mut self, dtype: DType) -> Option<ValueId> {
        let c = match dtype {
            DType::I32 | DType::U32 => Const::Int([0, 7, 0x7FFF_FFFF][self.bytes.below(3)]),
            DType::Bool => Const::Bool(false),
            _ => Const::Float([0.0, -1.0e30, f64::NEG_INFINITY][self.bytes.below(3)]),
        };
        self.constant(c, dtype)
    }

    /// `t.tile(..).load_masked(mask, other)` of a 1-D to 4-D tile.
    fn masked_load(&mut self) -> Option<ValueId> {
        let shape = match self.bytes.below(4) {
            0 => Shape(SHAPES_ND[self.bytes.below(SHAPES_ND.len())].to_vec()),
            1 => Shape(vec![LENGTHS[self.bytes.below(LENGTHS.len())]]),
            _ => Shape(SHAPES[self.bytes.below(SHAPES.len())].to_vec()),
        };
        let (tensor, rank, dtype) = self.readable(shape.rank());
        let mut operands = self.coords(rank, &shape)?;
        let mask = self.mask(&shape)?;
        operands.push(mask);
        operands.push(self.fill(dtype)?);
        self.add(
            OpKind::Gather {
                tensor,
                shape,
                access: Access {
                    dims: vec![Addr::Coord; rank],
                    masked: true,
                },
            },
            &operands,
        )
    }

    /// An i32 index tile of `shape`: loaded indices, a permutation-like `iota` expression,
    /// or an integer value at hand cast to i32; some out of range.
    fn indices(&mut self, shape: &Shape, bound: i64) -> Option<ValueId> {
        match self.bytes.below(3) {
            0 if shape.rank() == 1 => self.load(IDX, shape.clone()),
            0 | 1 => {
                let dim = self.bytes.below(shape.rank());
                let iota = self.add(
                    OpKind::Iota {
                        shape: shape.clone(),
                        dim,
                    },
                    &[],
                )?;
                let k = [1, 3, 5, -1][self.bytes.below(4)];
                let (a, b) = (self.int(k)?, self.scalar(DType::I32)?);
                let t = self.add(OpKind::Binary(BinaryOp::Mul), &[iota, a])?;
                let t = self.add(OpKind::Binary(BinaryOp::Add), &[t, b])?;
                if self.bytes.one_in(4) {
                    return Some(t);
                }
                let n = self.int(bound)?;
                self.add(OpKind::Binary(BinaryOp::Rem), &[t, n])
            }
            _ => {
                let want = shape.clone();
                let v = self.such(|t| t.shape() == Some(&want))?;
                let v = self.as_dtype(v, DType::I32)?;
                let n = self.int(bound)?;
                self.add(OpKind::Binary(BinaryOp::Rem), &[v, n])
            }
        }
    }

    /// A gather: rows of `x` through a row-index tile (`x.rows(&idx, C, [0, c])`), or the
    /// elements of `v` at an index tile of any rank (`v.elems([&i])`), masked or not.
    fn gather(&mut self) -> Option<ValueId> {
        let masked = self.bytes.one_in(3);
        let (tensor, shape, mut operands, dims, dtype) = if self.bytes.one_in(2) {
            let [r, c] = SHAPES[self.bytes.below(SHAPES.len())];
            let shape = Shape(vec![r, c]);
            let idx = self.indices(&Shape(vec![r]), 48)?;
            let col = self.add(
                OpKind::Reshape {
                    shape: Shape(vec![r, 1]),
                },
                &[idx],
            )?;
            let c0 = self.scalar(DType::I32)?;
            let (tensor, dtype) = [(X, DType::F32), (Y, DType::Bf16)][self.bytes.below(2)];
            (
                tensor,
                shape,
                vec![col, c0],
                vec![Addr::Index, Addr::Coord],
                dtype,
            )
        } else {
            let shape = self.shape();
            let idx = self.indices(&shape, 100)?;
            (V, shape, vec![idx], vec![Addr::Index], DType::F32)
        };
        if masked {
            operands.push(self.mask(&shape)?);
        }
        operands.push(self.fill(dtype)?);
        self.add(
            OpKind::Gather {
                tensor,
                shape,
                access: Access { dims, masked },
            },
            &operands,
        )
    }

    /// A scatter: an f32 tile stored to rows of `out` through a row-index tile, to the
    /// elements of `out1` at an index tile, or to `out` at coordinates under a mask.
    fn scatter(&mut self) -> Option<()> {
        let v = self.such(|t| t.dtype() == DType::F32 && t.shape().is_some())?;
        let v = self.as_dtype(v, DType::F32)?;
        let shape = self.b.ty(v).shape()?.clone();
        let masked = self.bytes.one_in(2);
        let (tensor, mut operands, dims) = match (shape.rank(), self.bytes.below(3)) {
            (2, 0) => {
                let idx = self.indices(&Shape(vec![shape.dims()[0]]), 48)?;
                let col = self.add(
                    OpKind::Reshape {
                        shape: Shape(vec![shape.dims()[0], 1]),
                    },
                    &[idx],
                )?;
                let c0 = self.scalar(DType::I32)?;
                (OUT, vec![col, c0], vec![Addr::Index, Addr::Coord])
            }
            (r, 1) if r <= 2 => {
                let c = self.coords(2, &shape)?;
                (OUT, c, vec![Addr::Coord; 2])
            }
            _ => {
                let idx = self.indices(&shape, 100)?;
                (OUT1, vec![idx], vec![Addr::Index])
            }
        };
        operands.push(v);
        if masked {
            operands.push(self.mask(&shape)?);
        }
        self.add(
            OpKind::Scatter {
                tensor,
                access: Access { dims, masked },
            },
            &operands,
        )
        .map(|_| ())
    }

    fn order(&mut self) -> (MemSem, MemScope) {
        let sem = [
            MemSem::Relaxed,
            MemSem::Acquire,
            MemSem::Release,
            MemSem::AcqRel,
        ][self.bytes.below(4)];
        let scope = [MemScope::Gpu, MemScope::Cta, MemScope::Sys][self.bytes.below(3)];
        (sem, scope)
    }

    /// A tile atomic: a histogram into `cnt` through an index tile
    /// (`cnt.elems([&bins]).atomic_add(1)`), or an f32 tile applied to a tile of `out`; any
    /// op, order and scope, sometimes masked.
    fn atomic(&mut self) -> Option<ValueId> {
        let op = ATOMICS[self.bytes.below(ATOMICS.len())];
        let (sem, scope) = self.order();
        let masked = self.bytes.one_in(3);
        let (tensor, shape, mut operands, dims, dtype) = if self.bytes.one_in(2) {
            let shape = self.shape();
            let idx = self.indices(&shape, 64)?;
            (CNT, shape, vec![idx], vec![Addr::Index], DType::I32)
        } else {
            let shape = Shape(SHAPES[self.bytes.below(SHAPES.len())].to_vec());
            let c = self.coords(2, &shape)?;
            (OUT, shape, c, vec![Addr::Coord; 2], DType::F32)
        };
        if op == AtomicOp::Cas {
            let cmp = self.fill(dtype)?;
            operands.push(cmp);
        }
        let value = if self.bytes.one_in(2) {
            let one = match dtype {
                DType::I32 => self.int(1)?,
                _ => self.constant(Const::Float(1.5), dtype)?,
            };
            self.add(
                OpKind::Splat {
                    shape: shape.clone(),
                },
                &[one],
            )?
        } else {
            self.tile_of(shape.dims(), dtype)?
        };
        operands.push(value);
        if masked {
            operands.push(self.mask(&shape)?);
        }
        self.add(
            OpKind::Atomic {
                tensor,
                op,
                sem,
                scope,
                access: Access { dims, masked },
            },
            &operands,
        )
    }

    /// `t.at([..]).atomic_*(v)`: a scalar atomic on `cnt` or `out`.
    fn scalar_atomic(&mut self) -> Option<ValueId> {
        let op = ATOMICS[self.bytes.below(ATOMICS.len())];
        let (sem, scope) = self.order();
        let (tensor, rank, dtype) =
            [(CNT, 1, DType::I32), (OUT, 2, DType::F32)][self.bytes.below(2)];
        let mut operands = Vec::new();
        for _ in 0..rank {
            operands.push(self.scalar(DType::I32)?);
        }
        if op == AtomicOp::Cas {
            operands.push(self.fill(dtype)?);
        }
        operands.push(self.scalar(dtype)?);
        self.add(
            OpKind::ScalarAtomic {
                tensor,
                op,
                sem,
                scope,
            },
            &operands,
        )
    }

    /// `x.take(dim, idx)` or `take_or`: a gather inside a register tile.
    fn take(&mut self) -> Option<ValueId> {
        let x = self.such(|t| t.shape().is_some() && t.dtype() != DType::Bool)?;
        let xs = self.b.ty(x).shape()?.clone();
        let dtype = self.b.ty(x).dtype();
        let dim = self.bytes.below(xs.rank());
        let mut is = xs.dims().to_vec();
        if self.bytes.one_in(3) {
            is[dim] = [1, 16, 32, 64][self.bytes.below(4)];
        }
        let idx = self.indices(&Shape(is), xs.dims()[dim] as i64)?;
        let other = self.fill(dtype)?;
        self.add(OpKind::Take { dim }, &[x, idx, other])
    }

    /// A 3-D or 4-D tile: loaded from `x3` or `out4`, or a tile at hand reshaped; combined
    /// and stored to `out4` at block coordinates.
    fn tile_nd(&mut self) -> Option<()> {
        let v = if self.bytes.one_in(2) {
            let shape = Shape(SHAPES_ND[self.bytes.below(SHAPES_ND.len())].to_vec());
            let (tensor, _, _) = self.readable(shape.rank());
            self.load(tensor, shape)?
        } else {
            let v = self.such(|t| t.shape().is_some())?;
            let s = self.b.ty(v).shape()?.clone();
            let mut to = self.same_count(&s);
            while to.rank() < 3 && to.dims()[0] > 1 && to.dims()[0].is_multiple_of(2) {
                let mut d = to.dims().to_vec();
                d[0] /= 2;
                d.insert(0, 2);
                to = Shape(d);
            }
            self.add(OpKind::Reshape { shape: to }, &[v])?
        };
        if self.bytes.one_in(2) {
            self.step();
        }
        let v = self.as_dtype(v, DType::F32)?;
        let rank = self.b.ty(v).shape()?.rank();
        if rank > 4 {
            return None;
        }
        let shape = self.b.ty(v).shape()?.clone();
        let mut operands = self.coords(4, &shape)?;
        operands.push(v);
        self.add(
            OpKind::Store {
                tensor: OUT4,
                bound: None,
            },
            &operands,
        )
        .map(|_| ())
    }

    /// A tile too large for registers: loaded, combined with a scalar or put through a
    /// function, then reduced or stored.
    fn big_tile(&mut self) -> Option<()> {
        let shape = Shape(BIG[self.bytes.below(BIG.len())].to_vec());
        let (tensor, _, _) = self.readable(shape.rank());
        let t = if self.bytes.one_in(4) {
            let (tensor, rank, dtype) = self.readable(shape.rank());
            let mut operands = self.coords(rank, &shape)?;
            operands.push(self.mask(&shape)?);
            operands.push(self.fill(dtype)?);
            self.add(
                OpKind::Gather {
                    tensor,
                    shape: shape.clone(),
                    access: Access {
                        dims: vec![Addr::Coord; rank],
                        masked: true,
                    },
                },
                &operands,
            )?
        } else {
            self.load(tensor, shape.clone())?
        };
        let t = self.as_dtype(t, DType::F32)?;
        let t = match self.bytes.below(3) {
            0 => {
                let op = UNARY[self.bytes.below(UNARY.len())];
                self.add(OpKind::Unary(op), &[t])?
            }
            1 => {
                let s = self.scalar(DType::F32)?;
                let op = ARITH[self.bytes.below(ARITH.len())];
                self.add(OpKind::Binary(op), &[t, s])?
            }
            _ => t,
        };
        match self.bytes.below(3) {
            0 => {
                let op = [ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min][self.bytes.below(3)];
                let dim = self.bytes.below(shape.rank());
                self.add(OpKind::Reduce { op, dim }, &[t]).map(|_| ())
            }
            1 if shape.rank() == 2 => {
                let c = self.coords(2, &shape)?;
                let mut operands = c;
                operands.push(t);
                self.add(
                    OpKind::Store {
                        tensor: OUT,
                        bound: None,
                    },
                    &operands,
                )
                .map(|_| ())
            }
            _ => Some(()),
        }
    }

    /// `for i in (lo..hi).step_by(s)`: a strided loop of `trips` trips from a value at hand.
    fn strided_for(
        &mut self,
        trips: i64,
        init: &[ValueId],
        stages: Option<u32>,
    ) -> Option<kiln_ir::builder::ForScope> {
        let step = 2 + self.bytes.below(3) as i64;
        let lo = if self.bytes.one_in(2) {
            self.int(0)?
        } else {
            self.add(OpKind::BlockId(Axis::X), &[])?
        };
        let span = self.int(trips * step)?;
        let hi = self.add(OpKind::Binary(BinaryOp::Add), &[lo, span])?;
        let step = self.int(step)?;
        let loc = self.loc();
        self.b.begin_for(lo, hi, step, init, stages, loc).ok()
    }

    /// `for t in (block_id().x..n).step_by(grid_dim().x)`: a persistent loop over work
    /// tiles.
    fn persistent_for(
        &mut self,
        init: &[ValueId],
        stages: Option<u32>,
    ) -> Option<kiln_ir::builder::ForScope> {
        let lo = self.add(OpKind::BlockId(Axis::X), &[])?;
        let n = 1 + self.bytes.below(5) as i64;
        let hi = self.int(n)?;
        let step = self.add(OpKind::GridDim(Axis::X), &[])?;
        let loc = self.loc();
        self.b.begin_for(lo, hi, step, init, stages, loc).ok()
    }
}

/// Runs the compiler over `kernel`: the pass pipeline and the PTX writer for every target,
/// then the interpreter on small random inputs. Errors are answers; a panic is a bug, and so
/// is a hang (the generated loops run at most 3 times).
pub fn exercise(kernel: &Kernel) {
    for target in Target::ALL {
        let _ = kiln_ptx::compile(kernel, target);
    }
    let _ = interpret(kernel);
}

/// Runs `kernel` on the interpreter over small inputs (two blocks): `Err` with the
/// interpreter's error when that error is a kiln bug (the kernel failed to verify, an op
/// the verifier should have rejected, a wrong schedule, an argument the harness passes
/// wrongly, a message quoting the IR); a runtime error of the kernel (a division by zero)
/// is an answer. Where the `prefetch` pass rewrites the kernel, the kernel before it and
/// after it must also give the same bits (the pass only moves loads).
pub fn interpret(kernel: &Kernel) -> Result<(), String> {
    if outputs(kernel)?.is_none() {
        return Ok(());
    }
    let Some((before, after)) = around_prefetch(kernel) else {
        return Ok(());
    };
    match (outputs(&before)?, outputs(&after)?) {
        (Some(a), Some(b)) if a == b => Ok(()),
        (a, b) => Err(format!(
            "the prefetch pass changed the kernel's results on the interpreter \
             (outputs equal: {}; a runtime error before: {}, after: {})",
            a == b,
            a.is_none(),
            b.is_none()
        )),
    }
}

/// The kernel after the passes before `prefetch` (on sm_80) and after `prefetch`, where that
/// pass changes it.
fn around_prefetch(kernel: &Kernel) -> Option<(Kernel, Kernel)> {
    let mut before = kernel.clone();
    kiln_ir::passes::run_through(&mut before, Target::Sm80, "strip_mine").ok()?;
    let mut after = before.clone();
    kiln_ir::passes::prefetch::run(&mut after, Target::Sm80).ok()?;
    let changed = kiln_ir::print::print_kernel(&after) != kiln_ir::print::print_kernel(&before);
    changed.then_some((before, after))
}

/// The bits of every tensor `kernel` may write, run on the harness's inputs; `None` for a
/// runtime error of the kernel (see [`interpret`]), `Err` for a kiln bug.
fn outputs(kernel: &Kernel) -> Result<Option<Vec<Vec<u64>>>, String> {
    let x = HostTensor::from_fn(&[48, 40], DType::F32, |i| (i % 7) as f64 - 3.0);
    let y = HostTensor::from_fn(&[40, 48], DType::Bf16, |i| (i % 5) as f64 * 0.5);
    let mut out = HostTensor::from_fn(&[48, 48], DType::F32, |_| f64::NAN);
    let v = HostTensor::from_fn(&[100], DType::F32, |i| (i % 9) as f64 - 4.0);
    let mut out1 = HostTensor::from_fn(&[100], DType::F32, |_| f64::NAN);
    let w = HostTensor::from_fn(&[40, 48], DType::Bf16, |i| (i % 3) as f64 - 1.0);
    let idx = HostTensor::from_fn(&[100], DType::I32, |i| ((i * 37) % 53) as f64 - 3.0);
    let mut cnt = HostTensor::from_fn(&[64], DType::I32, |_| 0.0);
    let x3 = HostTensor::from_fn(&[3, 20, 24], DType::F32, |i| (i % 11) as f64 - 5.0);
    let mut out4 = HostTensor::from_fn(&[2, 3, 16, 20], DType::F32, |_| f64::NAN);
    let mut args = [
        HostArg::Tensor(&x),
        HostArg::Tensor(&y),
        HostArg::TensorMut(&mut out),
        HostArg::F32(0.5),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut out1),
        HostArg::Tensor(&w),
        HostArg::Tensor(&idx),
        HostArg::TensorMut(&mut cnt),
        HostArg::Tensor(&x3),
        HostArg::TensorMut(&mut out4),
        HostArg::U32(0x1234_5678),
    ];
    match run(kernel, [2, 1, 1], &mut args) {
        Ok(()) => Ok(Some(vec![bits(&out), bits(&out1), bits(&cnt), bits(&out4)])),
        Err(e @ (InterpError::DivisionByZero { .. } | InterpError::NonPositiveStep { .. })) => {
            let shown = e.to_string();
            if quotes_ir(&shown) {
                Err(shown)
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(e.to_string()),
    }
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
    /// An error of kind invalid or unsupported whose text reads as kiln's, not the DSL's:
    /// it quotes the IR (`%12 = ...`, `rt<f32,64x64>`) or calls itself internal.
    QuotesIr(Diagnostic),
    /// The kernel after a pass breaks an invariant the verifier checks: the pass's name and
    /// the verifier's first error.
    BrokenAfter(&'static str, String),
    /// PTX that ptxas rejected: its message, mapped to the op's line.
    PtxasRejected(String),
    /// An interpreter error that is a kiln bug ([`interpret`]).
    Interpreter(String),
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
                | Outcome::QuotesIr(_)
                | Outcome::BrokenAfter(..)
                | Outcome::PtxasRejected(_)
                | Outcome::Interpreter(_)
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
            Outcome::QuotesIr(d) => ("QUOTES-IR", d.message.as_str()),
            Outcome::BrokenAfter(pass, m) => {
                return format!("BROKEN-AFTER-{pass}: {}", m.lines().next().unwrap_or(""));
            }
            Outcome::PtxasRejected(m) => ("PTXAS", m.as_str()),
            Outcome::Interpreter(m) => ("INTERPRETER", m.as_str()),
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

/// Whether `text`, from an error meant for a kernel author, reads as kiln's own: it quotes
/// the IR (a value number `%12`, a tile type `rt<f32,64x64>`), names the PTX writer, or
/// calls itself internal.
pub fn quotes_ir(text: &str) -> bool {
    let value_number = text
        .as_bytes()
        .windows(2)
        .any(|w| w[0] == b'%' && w[1].is_ascii_digit());
    value_number
        || text.contains("rt<")
        || text.contains("PTX writer")
        || text.to_ascii_lowercase().contains("internal")
}

/// The pipeline for `target` over a copy of `kernel` with the verifier run after every pass,
/// then the PTX writer: the module, the first pass after which the kernel no longer
/// verifies, or the error.
fn compile_verified(kernel: &Kernel, target: Target) -> Result<kiln_ptx::PtxModule, Outcome> {
    let mut k = kernel.clone();
    let mut broken: Option<(&'static str, String)> = None;
    let ran = kiln_ir::passes::run_pipeline(&mut k, target, &mut |pass, k| {
        if broken.is_none()
            && let Err(e) = kiln_ir::verify::verify(k)
        {
            let first = e.errors.first().map_or(e.to_string(), |e| e.to_string());
            let pass = kiln_ir::passes::PASSES
                .iter()
                .map(|p| p.0)
                .find(|&p| p == pass)
                .unwrap_or("a pass");
            broken = Some((pass, first));
        }
    });
    if let Some((pass, m)) = broken {
        return Err(Outcome::BrokenAfter(pass, m));
    }
    let module = ran
        .map_err(kiln_ptx::CodegenError::from)
        .and_then(|()| kiln_ptx::writer::Writer::new(&k, target).write());
    module.map_err(|e| {
        let d = e.diagnostic().clone();
        let shown = d.to_string();
        match d.kind {
            _ if !d.loc.is_known() => Outcome::Unlocated(d),
            DiagKind::Internal => Outcome::Internal(d),
            _ if quotes_ir(&shown) => Outcome::QuotesIr(d),
            DiagKind::Invalid => Outcome::Invalid(d),
            DiagKind::Unsupported => Outcome::Unsupported(d),
        }
    })
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Compiles `kernel` for `target` (the pass pipeline, the verifier after each pass, and the
/// PTX writer), catching panics, and with `ptxas` assembles the PTX: the [`Outcome`], per
/// target the PTX or the error's kind.
pub fn check(kernel: &Kernel, target: Target, ptxas: bool) -> Outcome {
    let compiled = catch_unwind(AssertUnwindSafe(|| compile_verified(kernel, target)));
    match compiled {
        Err(payload) => Outcome::Panic(panic_message(&*payload)),
        Ok(Err(outcome)) => outcome,
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
    /// Per kind of op ([`op_name`]), the kernels holding one after dead-code removal (so
    /// the backend writes it), and of them those that every target compiled: what the run
    /// covered.
    pub ops: BTreeMap<&'static str, (usize, usize)>,
    /// The kernel that took longest to check, in seconds, and its bytes.
    pub slowest: (f64, Vec<u8>),
}

/// The [`op_name`]s of the ops of `block` and the regions in it.
fn live_ops(
    kernel: &Kernel,
    block: &kiln_ir::kernel::Block,
    names: &mut std::collections::BTreeSet<&'static str>,
) {
    for &id in &block.ops {
        let op = &kernel.ops[id];
        names.insert(op_name(kernel, op));
        for r in &op.regions {
            live_ops(kernel, r, names);
        }
    }
}

/// The name an op kind is counted under in [`Tally::ops`]: the IR mnemonic, with the forms
/// of the addressed memory ops and loops told apart.
pub fn op_name(kernel: &Kernel, op: &kiln_ir::kernel::Op) -> &'static str {
    match &op.kind {
        OpKind::Const(_) | OpKind::ScalarParam(_) | OpKind::Yield => "const/param/yield",
        OpKind::BlockId(_) | OpKind::GridDim(_) | OpKind::TensorDim { .. } => "grid/dim query",
        OpKind::Unary(UnaryOp::Sin | UnaryOp::Cos) => "sin/cos",
        OpKind::Unary(UnaryOp::Tanh | UnaryOp::Erf | UnaryOp::Sigmoid) => "tanh/erf/sigmoid",
        OpKind::Unary(UnaryOp::Log | UnaryOp::Log2) => "log/log2",
        OpKind::Unary(_) => "other unary",
        OpKind::Binary(
            BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr,
        ) => "bit op",
        OpKind::Binary(BinaryOp::MulHi) => "mulhi",
        OpKind::Binary(_) => "other binary",
        OpKind::Select => "select",
        OpKind::Cast { .. } => "cast",
        OpKind::Bitcast { .. } => "bitcast",
        OpKind::Splat { .. } => "splat",
        OpKind::Iota { .. } => "iota",
        OpKind::Reshape { shape } if shape.rank() >= 3 => "reshape to 3-D/4-D",
        OpKind::Reshape { .. } => "reshape",
        OpKind::Transpose | OpKind::Permute { .. } => "transpose/permute",
        OpKind::Convert => "convert",
        OpKind::Take { .. } => "take",
        OpKind::Reduce { dim, .. } => {
            let rank = op
                .operands
                .first()
                .and_then(|&v| kernel.values.get(v))
                .and_then(|d| d.ty.shape().map(Shape::rank))
                .unwrap_or(0);
            match (rank, dim) {
                (0..=2, 0) => "reduce dim 0",
                (0..=2, _) => "reduce dim 1",
                _ => "reduce of a 3-D/4-D tile",
            }
        }
        OpKind::Mma => "mma",
        OpKind::Load { shape, .. } if shape.numel() > 64 * 128 => "load of a big tile",
        OpKind::Load { shape, .. } if shape.rank() >= 3 => "load of a 3-D/4-D tile",
        OpKind::Load { .. } => "load",
        OpKind::LoadScalar { .. } => "scalar load",
        OpKind::Store { tensor, .. } if *tensor == OUT4 => "store to a rank-4 tensor",
        OpKind::Store { bound: Some(_), .. } => "bounded store",
        OpKind::Store { .. } => "store",
        OpKind::Gather { access, .. } if access.indexed() => "gather",
        OpKind::Gather { .. } => "masked load",
        OpKind::Scatter { access, .. } if access.indexed() => "scatter",
        OpKind::Scatter { .. } => "masked store",
        OpKind::Atomic { access, .. } if access.indexed() => "atomic through indices",
        OpKind::Atomic { .. } => "tile atomic",
        OpKind::ScalarAtomic { .. } => "scalar atomic",
        OpKind::For { stages: Some(_) } => "pipelined loop",
        OpKind::For { .. } => {
            // Strided and persistent loops step by a constant other than 1 or by grid_dim.
            let unit = op
                .operands
                .get(2)
                .and_then(|&v| kernel.values.get(v))
                .is_some_and(|d| {
                    matches!(d.def, kiln_ir::kernel::ValueDef::Op(c, 0)
                    if kernel.ops[c].kind == OpKind::Const(Const::Int(1)))
                });
            if unit {
                "loop"
            } else {
                "strided/persistent loop"
            }
        }
        OpKind::If => "if",
        OpKind::Print { .. } => "print",
    }
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
            | Outcome::Unlocated(d)
            | Outcome::QuotesIr(d) => d.to_string(),
            Outcome::BrokenAfter(_, m)
            | Outcome::PtxasRejected(m)
            | Outcome::Interpreter(m)
            | Outcome::Panic(m) => m.clone(),
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
        out.push_str(&format!(
            "slowest kernel: {:.1} s, bytes {:?}\n",
            self.slowest.0, self.slowest.1
        ));
        out.push_str("kernels holding each kind of op (of them, compiled for every target):\n");
        for (name, (n, ok)) in &self.ops {
            out.push_str(&format!("{n:7} ({ok:6})  {name}\n"));
        }
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

/// A fuzz run: kernels from random byte strings of 16 to `max_len` bytes (the longer, the
/// larger the kernel) drawn from `rng` until `cases` byte strings or `budget` is spent, each
/// checked on every target ([`check`]; ptxas on every `ptxas_every`-th kernel, none when
/// `None`) and, when `interpret_too` is set, run on the interpreter ([`interpret`]).
pub fn fuzz(
    rng: &mut crate::inputs::Rng,
    cases: usize,
    max_len: usize,
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
        let len = 16 + (rng.uniform(0.0, max_len.saturating_sub(16) as f64) as usize);
        let bytes: Vec<u8> = (0..len).map(|_| rng.uniform(0.0, 256.0) as u8).collect();
        tally.attempts += 1;
        let started = std::time::Instant::now();
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
        let mut compiled = true;
        for t in Target::ALL {
            let outcome = check(&k, t, ptxas);
            compiled &= matches!(outcome, Outcome::Ptx);
            tally.add(t, &outcome, &bytes);
        }
        // The ops that survive dead-code removal: those the backend writes.
        let mut live = k.clone();
        let _ = kiln_ir::passes::canonicalize::run(&mut live, Target::Sm80);
        let mut names = std::collections::BTreeSet::new();
        live_ops(&live, &live.body, &mut names);
        for n in names {
            let e = tally.ops.entry(n).or_default();
            e.0 += 1;
            e.1 += usize::from(compiled);
        }
        if interpret_too {
            let outcome = match catch_unwind(AssertUnwindSafe(|| interpret(&k))) {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(Outcome::Interpreter(e)),
                Err(payload) => Some(Outcome::Panic(format!(
                    "the interpreter panicked: {}",
                    panic_message(&*payload)
                ))),
            };
            if let Some(o) = outcome {
                tally.add(Target::Sm80, &o, &bytes);
            }
        }
        let took = started.elapsed().as_secs_f64();
        if took > tally.slowest.0 {
            tally.slowest = (took, bytes);
        }
    }
    tally
}
