//! The frontend the `#[kernel]` macro's generated code calls to build IR.
//!
//! Kernels are *traced*: the generated `build` runs the (rewritten) kernel body once inside
//! [`trace`], and every DSL call on a [`Value`] adds an op to the kernel through a
//! thread-local [`crate::Builder`], recording its caller's source location. Rust values
//! (consts, comptime parameters, `unroll` counters) stay Rust values: the IR only sees what
//! they computed.

mod cleanup;
pub mod compare;
pub mod context;
pub mod control;
pub mod def;
pub mod index;
pub mod ops;
pub mod params;
pub mod tensor;
pub mod value;

pub use compare::{Compare, Logic};
pub use context::trace;
pub use control::{Carry, Condition, LoopRange, for_loop, pipelined, range, unroll};
pub use def::{ComptimeKind, ComptimeParam, ComptimeValue, KernelDef, ParamSig, Spec};
pub use index::{Entries, Index, IntoIndex};
pub use ops::{
    Dim3, abs, block_id, cdiv, col_max, col_sum, exp, exp2, full, grid_dim, iota, log2, max, min,
    mma, mma_acc, recip, row_max, row_min, row_sum, rsqrt, select, sqrt, zeros,
};
pub use params::{ComptimeArg, comptime, params_for, scalar_param};
pub use tensor::{Tensor, TileView};
pub use value::{AsValue, Element, IntoOperand, Operand, Value};
