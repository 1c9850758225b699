//! The semantic IR's entities: source locations, parameters, SSA values, operations and
//! their structured regions. [`crate::kernel::Kernel`] holds them; the schedule layer
//! ([`crate::sched`]) names them by handle without depending on the kernel.

use std::fmt;

use crate::arena::{EntityName, Handle};
use crate::types::{DType, Shape, Type};

/// A location in the user's Rust source, captured when the IR is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Loc {
    /// Source file as rustc names it (`file!()`), empty when unknown.
    pub file: &'static str,
    /// 1-based line; 0 when unknown.
    pub line: u32,
    /// 1-based column; 0 when unknown.
    pub column: u32,
}

impl Loc {
    /// The caller's location (use from `#[track_caller]` functions).
    #[track_caller]
    pub fn caller() -> Loc {
        let l = std::panic::Location::caller();
        Loc {
            file: l.file(),
            line: l.line(),
            column: l.column(),
        }
    }

    /// Whether a real location was recorded.
    pub fn is_known(&self) -> bool {
        self.line != 0
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_known() && self.column == 0 {
            // A line without a column: recovered from a PTX comment (`kiln_ptx::ptxas`).
            write!(f, "{}:{}", self.file, self.line)
        } else if self.is_known() {
            write!(f, "{}:{}:{}", self.file, self.line, self.column)
        } else {
            f.write_str("<unknown>")
        }
    }
}

/// A kernel parameter, in launch order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// A global-memory tensor with runtime shape and strides. Its innermost dimension is
    /// contiguous (stride 1); the runtime checks that at launch.
    Tensor {
        /// Parameter name, as written in the kernel signature.
        name: String,
        /// Element type.
        dtype: DType,
        /// Number of dimensions (1..=5).
        rank: usize,
        /// Whether the kernel may write it (`TensorMut`).
        mutable: bool,
        /// Whether the base address and every outer stride are multiples of 16 bytes. The
        /// runtime specialises on this, so 16-byte vector accesses are only emitted when true.
        aligned16: bool,
    },
    /// A scalar passed by value.
    Scalar {
        /// Parameter name.
        name: String,
        /// Its type (`f32` or `i32`).
        dtype: DType,
    },
}

impl Param {
    /// A tensor parameter that is not known to be 16-byte aligned (the conservative
    /// specialisation: no 16-byte vector accesses are emitted for it).
    pub fn tensor(name: impl Into<String>, dtype: DType, rank: usize, mutable: bool) -> Param {
        Param::Tensor {
            name: name.into(),
            dtype,
            rank,
            mutable,
            aligned16: false,
        }
    }

    /// The parameter's name.
    pub fn name(&self) -> &str {
        match self {
            Param::Tensor { name, .. } | Param::Scalar { name, .. } => name,
        }
    }

    /// Whether the parameter is a tensor known to be 16-byte aligned (see
    /// [`Param::Tensor::aligned16`]).
    pub fn aligned16(&self) -> bool {
        matches!(
            self,
            Param::Tensor {
                aligned16: true,
                ..
            }
        )
    }

    /// The parameter's dtype: a tensor's element type, or a scalar's type.
    pub fn dtype(&self) -> DType {
        match self {
            Param::Tensor { dtype, .. } | Param::Scalar { dtype, .. } => *dtype,
        }
    }
}

/// What defines an SSA value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// Result `index` of an operation.
    Op(OpId, usize),
    /// Argument `index` of the block that is region `region` of `op`.
    BlockArg {
        /// The operation owning the region.
        op: OpId,
        /// Which region of that op.
        region: usize,
        /// Which argument of the region's block.
        index: usize,
    },
}

/// An SSA value's data: its type and definition.
#[derive(Clone, Debug)]
pub struct ValueData {
    /// The value's type.
    pub ty: Type,
    /// Where it is defined.
    pub def: ValueDef,
}

/// Handle of an SSA value; prints as `%N`.
pub type ValueId = Handle<ValueData>;
impl EntityName for ValueData {
    const PREFIX: &'static str = "%";
}

/// Handle of an operation; prints as `op N`.
pub type OpId = Handle<Op>;
impl EntityName for Op {
    const PREFIX: &'static str = "op";
}

/// A block of operations with arguments. Regions (loop bodies, branches) are single blocks:
/// control flow is structured.
#[derive(Clone, Debug, Default)]
pub struct Block {
    /// Block arguments (loop induction variable and carried values).
    pub args: Vec<ValueId>,
    /// Operations in program order; a region's block ends with [`OpKind::Yield`].
    pub ops: Vec<OpId>,
}

/// Elementwise unary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `2^x` (hardware `ex2.approx` on the GPU).
    Exp2,
    /// `e^x`.
    Exp,
    /// `log2(x)`, within about an f32 ulp ([`crate::math::log2`]).
    Log2,
    /// The natural logarithm `ln(x)`, within about an f32 ulp ([`crate::math::log`]).
    Log,
    /// `|x|`.
    Abs,
    /// `sqrt(x)`.
    Sqrt,
    /// `1/sqrt(x)`.
    Rsqrt,
    /// `1/x`.
    Recip,
    /// Logical not of a `bool`; bitwise not (`!x`) of an `i32` or `u32`.
    Not,
    /// `sin(x)` with a full range reduction: accurate for every finite `x`.
    Sin,
    /// `cos(x)`, as [`UnaryOp::Sin`].
    Cos,
    /// `tanh(x)`.
    Tanh,
    /// The error function `erf(x)`.
    Erf,
    /// The logistic function `1 / (1 + e^-x)`.
    Sigmoid,
}

impl UnaryOp {
    /// IR spelling.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp2 => "exp2",
            UnaryOp::Exp => "exp",
            UnaryOp::Log2 => "log2",
            UnaryOp::Log => "log",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Not => "not",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Sigmoid => "sigmoid",
        }
    }
}

/// Elementwise binary operators (with broadcasting, see [`Shape::broadcast`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (integer division truncates toward zero).
    Div,
    /// `a % b` (integer remainder, sign of `a`).
    Rem,
    /// `min(a, b)`.
    Min,
    /// `max(a, b)`; for floats, a NaN operand yields the other operand.
    Max,
    /// Logical and of `bool`s.
    And,
    /// Logical or of `bool`s.
    Or,
    /// `a < b`, producing `bool`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// Bitwise and of `i32`s or `u32`s.
    BitAnd,
    /// Bitwise or.
    BitOr,
    /// Bitwise exclusive or.
    BitXor,
    /// `a << b`. The shift amount `b` is read as unsigned and clamped to 32, as PTX does: a
    /// shift by 32 or more (or by a negative `i32`) gives 0.
    Shl,
    /// `a >> b`: arithmetic for `i32` (a shift by 32 or more, or by a negative amount, gives
    /// 0 or -1 by `a`'s sign), logical for `u32` (0). The amount clamps as for [`BinaryOp::Shl`].
    Shr,
    /// The high 32 bits of the 64-bit product `a * b`: unsigned for `u32` (`umulhi`),
    /// signed for `i32` (`mulhi`).
    MulHi,
}

impl BinaryOp {
    /// IR spelling.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::BitAnd => "bitand",
            BinaryOp::BitOr => "bitor",
            BinaryOp::BitXor => "bitxor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr => "shr",
            BinaryOp::MulHi => "mulhi",
        }
    }

    /// Whether the result is `bool` regardless of the operand type.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne
        )
    }
}

/// Reductions along one axis of a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Maximum (NaN-ignoring, `-inf` identity).
    Max,
    /// Sum (f32 accumulation, `0` identity).
    Sum,
    /// Minimum.
    Min,
}

impl ReduceOp {
    /// IR spelling.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Max => "max",
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
        }
    }
}

/// One of the three grid axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// `x`.
    X,
    /// `y`.
    Y,
    /// `z`.
    Z,
}

impl Axis {
    /// `x`, `y` or `z`.
    pub fn name(self) -> &'static str {
        match self {
            Axis::X => "x",
            Axis::Y => "y",
            Axis::Z => "z",
        }
    }
}

/// A compile-time constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Const {
    /// An integer (stored wide; the value type says `i32` or `u32`).
    Int(i64),
    /// A float (stored as f64; the value type says its precision).
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl fmt::Display for Const {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Const::Int(v) => write!(f, "{v}"),
            Const::Float(v) if v.is_infinite() => {
                f.write_str(if *v > 0.0 { "inf" } else { "-inf" })
            }
            Const::Float(v) if v.is_nan() => f.write_str("nan"),
            Const::Float(v) => write!(f, "{v:?}"),
            Const::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// How a memory op ([`OpKind::Gather`], [`OpKind::Scatter`], [`OpKind::Atomic`]) finds
/// the tensor coordinate of each tile element along one tensor dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    /// A scalar i32 coordinate, as a tile's: along a tensor dimension the tile covers, the
    /// element's offset in the tile is added to it.
    Coord,
    /// An i32 tile broadcast to the accessed tile's shape: each element's coordinate along
    /// the dimension is its element of the index tile (a gather's row indices).
    Index,
}

/// How a memory op addresses its tensor: per tensor dimension an [`Addr`], and whether a
/// bool mask tile (broadcast to the tile) selects the elements accessed. Elements outside
/// the tensor, or where the mask is false, are never accessed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// One per tensor dimension, outermost first.
    pub dims: Vec<Addr>,
    /// Whether a mask operand follows (see each op's operand list).
    pub masked: bool,
}

impl Access {
    /// Plain tile coordinates on a rank-`rank` tensor, no mask.
    pub fn coords(rank: usize) -> Access {
        Access {
            dims: vec![Addr::Coord; rank],
            masked: false,
        }
    }

    /// Whether any dimension is addressed through an index tile.
    pub fn indexed(&self) -> bool {
        self.dims.contains(&Addr::Index)
    }
}

/// What an atomic read-modify-write does to a memory element `m` with value `v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// `m = m + v`.
    Add,
    /// `m = max(m, v)` (for floats, a NaN operand yields the other).
    Max,
    /// `m = min(m, v)`.
    Min,
    /// `m = v`.
    Xchg,
    /// `m = (m == compare) ? v : m` (bitwise equality).
    Cas,
}

impl AtomicOp {
    /// IR spelling.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "add",
            AtomicOp::Max => "max",
            AtomicOp::Min => "min",
            AtomicOp::Xchg => "xchg",
            AtomicOp::Cas => "cas",
        }
    }
}

/// The memory-ordering semantics of an atomic (PTX's `.sem`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemSem {
    /// No ordering beyond the element itself.
    #[default]
    Relaxed,
    /// Later accesses of the thread stay after it.
    Acquire,
    /// Earlier accesses of the thread stay before it.
    Release,
    /// Both.
    AcqRel,
}

impl MemSem {
    /// IR spelling (PTX's too).
    pub fn name(self) -> &'static str {
        match self {
            MemSem::Relaxed => "relaxed",
            MemSem::Acquire => "acquire",
            MemSem::Release => "release",
            MemSem::AcqRel => "acq_rel",
        }
    }
}

/// The threads an atomic's ordering is guaranteed to (PTX's `.scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemScope {
    /// The thread block.
    Cta,
    /// Every thread of the device.
    #[default]
    Gpu,
    /// The device and the host (and peer devices).
    Sys,
}

impl MemScope {
    /// IR spelling (PTX's too).
    pub fn name(self) -> &'static str {
        match self {
            MemScope::Cta => "cta",
            MemScope::Gpu => "gpu",
            MemScope::Sys => "sys",
        }
    }
}

/// What an operation does. Operand and result conventions are given per variant; the
/// verifier checks them.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// `() -> scalar`: a constant of the result type.
    Const(Const),
    /// `() -> scalar`: the value of scalar parameter `index` (index into [`crate::kernel::Kernel::params`]).
    ScalarParam(usize),
    /// `() -> i32`: this block's index along an axis.
    BlockId(Axis),
    /// `() -> i32`: the number of blocks along an axis.
    GridDim(Axis),
    /// `() -> i32`: extent of dimension `dim` of tensor parameter `tensor`.
    TensorDim {
        /// Parameter index.
        tensor: usize,
        /// Dimension, outermost first.
        dim: usize,
    },
    /// `(x) -> y`: elementwise unary operator on a scalar or tile.
    Unary(UnaryOp),
    /// `(a, b) -> c`: elementwise binary operator. Operands are both scalars, or a tile and a
    /// scalar, or two tiles whose shapes broadcast. Both have the same dtype.
    Binary(BinaryOp),
    /// `(cond, a, b) -> c`: elementwise `cond ? a : b` with broadcasting; `cond` is `bool`.
    Select,
    /// `(x) -> y`: elementwise conversion to `to` (round to nearest even for narrowing floats).
    Cast {
        /// Target element type.
        to: DType,
    },
    /// `(x) -> y`: elementwise reinterpretation of the bits as `to`, a type of the same width
    /// (f32, i32 and u32; bf16 and f16).
    Bitcast {
        /// Target element type.
        to: DType,
    },
    /// `(scalar) -> tile`: a tile of `shape` filled with the scalar.
    Splat {
        /// Result shape.
        shape: Shape,
    },
    /// `() -> tile<i32>`: each element holds its index along `dim`.
    Iota {
        /// Result shape.
        shape: Shape,
        /// Which dimension's index.
        dim: usize,
    },
    /// `(tile) -> tile`: the same elements in row-major order with another shape of equal
    /// element count (`[B, H, D] -> [B, H * D]`). A reshape that only adds or removes
    /// extents of 1 (`[R] <-> [R, 1]`, `.col()`) is a view of the same registers; any other
    /// keeps them where the layouts allow and otherwise moves elements between threads.
    Reshape {
        /// Result shape.
        shape: Shape,
    },
    /// `(tile[R, C]) -> tile[C, R]`.
    Transpose,
    /// `(tile) -> tile`: dimension `i` of the result is dimension `perm[i]` of the operand
    /// (`permute([0, 2, 1])` of `[B, H, D]` is `[B, D, H]`); `perm` is a permutation of the
    /// operand's dimensions.
    Permute {
        /// Per result dimension, the operand dimension it comes from.
        perm: Vec<usize>,
    },
    /// `(tile) -> tile`: the same tile in the result's layout. The `layout` pass inserts it
    /// where an op needs an operand in another layout than the one it was made in; a
    /// backend moves the elements between threads through shared memory.
    Convert,
    /// `(x, idx, other) -> y`: a gather inside a register tile along dimension `dim`:
    /// `y` has `idx`'s shape (an i32 tile of `x`'s rank, equal to `x`'s shape but along
    /// `dim`) and `x`'s dtype, and `y[e] = x[e with its coordinate along dim replaced by
    /// idx[e]]`, or the scalar `other` where `idx[e]` is outside `0..x.shape[dim]`. The
    /// backends move the elements between threads through shared memory, as a `convert`.
    Take {
        /// The gathered dimension.
        dim: usize,
    },
    /// `(tile) -> tile`: reduce dimension `dim` away (`[R, C]` -> `[R]` for `dim = 1`,
    /// `[T, H, D]` -> `[T, D]` for `dim = 1`).
    Reduce {
        /// The combining operator.
        op: ReduceOp,
        /// The reduced dimension.
        dim: usize,
    },
    /// `(a[M, K], b[K, N], c[M, N]?) -> d[M, N]`: `d = a @ b (+ c)`. `a` and `b` are bf16 or
    /// f16 (the same), `c` and `d` are f32; products accumulate in f32.
    Mma,
    /// `(coord_0, ..., coord_{rank-1}) -> tile`: load the tile of `shape` whose first element
    /// is at `coords` from tensor parameter `tensor`. The tile covers the tensor's last
    /// `shape.rank()` dimensions; elements outside the tensor read as `0`.
    Load {
        /// Parameter index of the tensor.
        tensor: usize,
        /// Tile shape.
        shape: Shape,
    },
    /// `(coord_0, ..., coord_{rank-1}) -> scalar`: the element at `coords` of tensor
    /// parameter `tensor` (a sequence offset read from an `i32` tensor). A coordinate outside
    /// the tensor reads `0`, as a tile load's elements outside it do, so no index reads out of
    /// bounds.
    LoadScalar {
        /// Parameter index of the tensor.
        tensor: usize,
    },
    /// `(coord_0, ..., coord_{rank-1}, value, limit?) -> ()`: store a tile at `coords`,
    /// skipping elements outside the tensor. With a `bound` of `Some(dim)`, the `i32` scalar
    /// `limit` follows the value, and the elements whose coordinate along tensor dimension
    /// `dim` (one of the tile's) is `>= limit` are skipped too: the tensor is clipped there, as
    /// if its extent along `dim` were `min(extent, max(limit, 0))` (a sequence's rows in a
    /// packed varlen batch). [`Op::store_operands`] splits the operands.
    Store {
        /// Parameter index of the tensor.
        tensor: usize,
        /// The tensor dimension clipped at `limit`, if any.
        bound: Option<usize>,
    },
    /// `(addr_0, ..., addr_{rank-1}, mask?, other) -> tile`: a load of the tile of `shape`
    /// addressed by `access` (a masked load when every dimension is a coordinate, a gather
    /// when some are index tiles). Elements outside the tensor or masked off read the scalar
    /// `other` (of the tensor's dtype). Without index tiles, the tile covers the tensor's last
    /// `shape.rank()` dimensions as a `load`'s does. [`Op::access_operands`] splits the
    /// operands.
    Gather {
        /// Parameter index of the tensor.
        tensor: usize,
        /// Tile shape.
        shape: Shape,
        /// How each dimension is addressed, and whether a mask follows.
        access: Access,
    },
    /// `(addr_0, ..., addr_{rank-1}, value, mask?) -> ()`: stores tile `value` at the
    /// elements `access` addresses (a scatter when some dimensions are index tiles),
    /// skipping those outside the tensor or masked off. Where two elements of one tile
    /// address the same memory element, which one lands is unspecified.
    Scatter {
        /// Parameter index of the tensor.
        tensor: usize,
        /// How each dimension is addressed, and whether a mask follows.
        access: Access,
    },
    /// `(addr_0, ..., addr_{rank-1}, compare?, value, mask?) -> old`: applies `op` with each
    /// element of tile `value` (for `cas`, also the matching element of `compare`) to the
    /// element `access` addresses, atomically, with memory order `sem` at `scope`; `old` (the
    /// value's shape and dtype) holds what each element read, `0` where it was outside the
    /// tensor or masked off. Elements of one tile are applied in row-major order, so
    /// duplicates accumulate.
    Atomic {
        /// Parameter index of the tensor.
        tensor: usize,
        /// The read-modify-write.
        op: AtomicOp,
        /// Memory-ordering semantics.
        sem: MemSem,
        /// Memory-ordering scope.
        scope: MemScope,
        /// How each dimension is addressed, and whether a mask follows.
        access: Access,
    },
    /// `(coord_0, ..., coord_{rank-1}, compare?, value) -> old`: applies `op` with the scalar
    /// `value` (for `cas`, compared with the scalar `compare`) to the element at `coords` of
    /// tensor parameter `tensor`, atomically, with memory order `sem` at `scope`, once per
    /// block: every thread of the block has finished its earlier memory accesses when one
    /// thread applies it (so a release orders all of them before it), and every thread gets
    /// `old`, what it read, after it (so an acquire orders it before every thread's later
    /// accesses). A coordinate outside the tensor applies nothing and reads `0`.
    ScalarAtomic {
        /// Parameter index of the tensor.
        tensor: usize,
        /// The read-modify-write.
        op: AtomicOp,
        /// Memory-ordering semantics.
        sem: MemSem,
        /// Memory-ordering scope.
        scope: MemScope,
    },
    /// `(lo, hi, step, init...) -> (carried...)`: a counted loop over `lo..hi` by `step`
    /// (all i32, `step > 0`). Region 0 takes `(i, carried...)` and yields the next carried
    /// values. `stages` is the requested software-pipelining depth (`pipelined(.., stages)`).
    For {
        /// Pipelining depth requested by the user; `None` for a plain loop.
        stages: Option<u32>,
    },
    /// `(cond, ...) -> (results...)`: region 0 runs when `cond` is true, region 1 otherwise;
    /// both yield the results. Neither region takes arguments.
    If,
    /// `(args...) -> ()`: prints one line per block, `[block (x, y, z)] ` and then
    /// `pieces` with the arguments between them (see [`crate::device_print`]). A scalar
    /// argument prints its value; a tile argument its element at the matching `elements`
    /// index (printed by the one thread that holds it).
    Print {
        /// The text around the arguments: one more piece than there are arguments.
        pieces: Vec<String>,
        /// Per argument: `None` for a scalar, else the element of the tile to print.
        elements: Vec<Option<Vec<u32>>>,
    },
    /// `(values...) -> ()`: ends a region, passing values to the parent op.
    Yield,
}

impl OpKind {
    /// A scalar the kernel reads without computing: a constant, a scalar parameter, a block
    /// id, a grid size or a tensor's extent.
    pub fn is_scalar_source(&self) -> bool {
        matches!(
            self,
            OpKind::Const(_)
                | OpKind::ScalarParam(_)
                | OpKind::BlockId(_)
                | OpKind::GridDim(_)
                | OpKind::TensorDim { .. }
        )
    }

    /// Elementwise arithmetic on registers or scalars, element by element (unary, binary,
    /// select, casts) or filling a tile (splat, iota): no memory, no other thread's values.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Select
                | OpKind::Cast { .. }
                | OpKind::Bitcast { .. }
                | OpKind::Splat { .. }
                | OpKind::Iota { .. }
        )
    }
}

/// An operation: what it does, what it reads and defines, and where the user wrote it.
#[derive(Clone, Debug)]
pub struct Op {
    /// What the operation does.
    pub kind: OpKind,
    /// Values read.
    pub operands: Vec<ValueId>,
    /// Values defined.
    pub results: Vec<ValueId>,
    /// Nested regions (loop body; then/else branches).
    pub regions: Vec<Block>,
    /// Where the user wrote it.
    pub loc: Loc,
}

/// The operands of a [`OpKind::Store`], split ([`Op::store_operands`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOperands<'a> {
    /// The tile's coordinates, one per tensor dimension.
    pub coords: &'a [ValueId],
    /// The stored tile.
    pub value: ValueId,
    /// The clipped tensor dimension and its limit, for a bounded store.
    pub limit: Option<(usize, ValueId)>,
}

impl Op {
    /// A store's coordinates, value and limit; `None` for any other op, or a store whose
    /// operands do not fit its kind (which the verifier reports).
    pub fn store_operands(&self) -> Option<StoreOperands<'_>> {
        let OpKind::Store { bound, .. } = self.kind else {
            return None;
        };
        let (rest, limit) = match bound {
            Some(dim) => {
                let (&limit, rest) = self.operands.split_last()?;
                (rest, Some((dim, limit)))
            }
            None => (&self.operands[..], None),
        };
        let (&value, coords) = rest.split_last()?;
        Some(StoreOperands {
            coords,
            value,
            limit,
        })
    }
}

/// The operands of a [`OpKind::Gather`], [`OpKind::Scatter`] or [`OpKind::Atomic`], split
/// ([`Op::access_operands`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessOperands<'a> {
    /// Per tensor dimension, its scalar coordinate or index tile.
    pub addr: &'a [ValueId],
    /// An atomic `cas`'s compare tile.
    pub compare: Option<ValueId>,
    /// The stored or applied tile (scatter, atomic).
    pub value: Option<ValueId>,
    /// The mask, when the access is masked.
    pub mask: Option<ValueId>,
    /// A gather's fill value.
    pub other: Option<ValueId>,
}

impl Op {
    /// A memory access op's operands by role; `None` for any other op, or one whose operands
    /// do not fit its kind (which the verifier reports).
    pub fn access_operands(&self) -> Option<AccessOperands<'_>> {
        let (access, compare, value, other) = match &self.kind {
            OpKind::Gather { access, .. } => (access, false, false, true),
            OpKind::Scatter { access, .. } => (access, false, true, false),
            OpKind::Atomic { access, op, .. } => (access, *op == AtomicOp::Cas, true, false),
            _ => return None,
        };
        let rank = access.dims.len();
        let want = rank
            + usize::from(compare)
            + usize::from(value)
            + usize::from(access.masked)
            + usize::from(other);
        if self.operands.len() != want {
            return None;
        }
        let mut rest = self.operands[rank..].iter().copied();
        let compare = if compare { rest.next() } else { None };
        let (value, mask, other) = if value {
            (rest.next(), rest.next().filter(|_| access.masked), None)
        } else {
            let mask = if access.masked { rest.next() } else { None };
            (None, mask, rest.next())
        };
        Some(AccessOperands {
            addr: &self.operands[..rank],
            compare,
            value,
            mask,
            other,
        })
    }
}

/// Tensor parameter `i`'s element type, rank and whether the kernel may write it.
pub(crate) fn tensor_param(params: &[Param], i: usize) -> Result<(DType, usize, bool), String> {
    match params.get(i) {
        Some(Param::Tensor {
            dtype,
            rank,
            mutable,
            ..
        }) => Ok((*dtype, *rank, *mutable)),
        _ => Err(format!("parameter {i} is not a tensor")),
    }
}
