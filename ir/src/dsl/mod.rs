//! The frontend the `#[kernel]` macro's generated code calls to build IR.
//!
//! Kernels are *traced*: the generated `build` runs the (rewritten) kernel body once inside
//! [`trace`], and every DSL call on a [`Value`] adds an op to the kernel through a
//! thread-local [`crate::Builder`], recording its caller's source location
//! (`#[track_caller]`), so every op and every diagnostic points at the user's line. Rust values
//! (consts, comptime parameters ([`Comptime`], [`Spec`]), `unroll` counters) stay Rust values.
//! What the macro rewrites in a body, and how errors surface: [`trace`].

pub mod access;
mod cleanup;
pub mod compare;
pub mod comptime;
pub mod comptime_value;
pub mod context;
pub mod control;
pub mod def;
pub mod defines;
pub mod index;
pub mod ops;
pub mod params;
pub mod print;
pub mod random;
pub mod registry;
mod reshape;
pub mod tensor;
pub mod value;

pub use access::{AtomicOpts, ElementView};
pub use compare::{Compare, Logic};
pub use comptime::Comptime;
pub use comptime_value::{ComptimeArg, ComptimeKind, ComptimeParam, ComptimeValue, declared_dtype};
pub use context::trace;
pub use control::{Carry, Condition, LoopRange, for_loop, pipelined, range, unroll};
pub use def::{
    AnyKernelDef, BuildError, KernelDecl, KernelDef, ParamSig, Spec, grid_blocks, specialise,
    warp_count,
};
pub use defines::{DefineError, split_define};
pub use index::{Entries, Index, IntoIndex};
pub use ops::{
    Dim3, abs, bitcast, block_id, blocks_per_sm, cdiv, cluster, col_max, col_sum, cos, erf, exp,
    exp2, full, grid_dim, iota, log, log2, max, min, mma, mma_acc, mulhi, recip, reduce_max,
    reduce_min, reduce_sum, reject, row_max, row_min, row_sum, rsqrt, select, sigmoid, sin, sqrt,
    tanh, umulhi, warp_specialize, zeros,
};
pub use params::{params_for, scalar_param};
pub use print::{PrintArg, at};
pub use random::{Seed, rand, rand4x, randint, randint4x, randn};
pub use registry::{FindError, Registered, registered};
pub use tensor::{Tensor, TileView};
pub use value::{AsValue, Element, IntoOperand, Operand, Value};
