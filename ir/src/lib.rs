//! # kiln-ir: the tile IR
//!
//! A kiln kernel is a program run by every thread block of a grid. Its values are SSA values
//! of two kinds (see [`types::Type`]):
//!
//! - **scalars**: one element, uniform across the block (block ids, loop counters, offsets,
//!   scalar parameters);
//! - **register tiles** (`rt<dtype,RxC>`): arrays of compile-time shape, rank 1 to 4 (the
//!   `canonicalize` pass folds the leading dimensions of ranks 3 and 4 into 2-D tiles),
//!   distributed over the block's threads. How a tile is distributed (its *layout*) is not
//!   part of the semantic IR: the `layout` pass chooses it.
//!
//! Global memory is reached only through tensor parameters ([`kernel::Param::Tensor`]), whose
//! shape and strides are runtime values and whose innermost dimension is contiguous. `load`
//! reads a tile whose first element sits at given coordinates, with elements outside the
//! tensor reading as zero; `store` writes a tile, skipping elements outside (and, bounded, those
//! at or past a runtime limit along one dimension); `load_scalar` reads one element, `0` outside.
//! So a kernel never touches memory outside its tensors, whatever the launch's shapes.
//!
//! ## Operations and evaluation
//!
//! An [`kernel::Op`] reads operands, defines results and may own regions. Operations run in
//! block order; a value is defined before every use (the verifier checks dominance). Control
//! flow is structured: [`kernel::OpKind::For`] and [`kernel::OpKind::If`] own single-block
//! regions that end in `yield`, and values flow out of them only through their results
//! (carried loop values, branch results). Conditions and loop bounds are scalars, hence
//! uniform across the block: no operation ever diverges within a block.
//!
//! Element semantics: integer arithmetic is 32-bit two's complement; float arithmetic on bf16
//! and f16 tiles is performed in f32 and rounded to the element type after each operation
//! (round to nearest even); `mma` multiplies bf16/f16 operands exactly and accumulates in f32.
//! `exp2` may use the hardware approximation (relative error below 2^-22).
//!
//! ## Stages
//!
//! 1. The `#[kernel]` macro's generated code drives [`builder::Builder`] through the
//!    frontend in [`dsl`]; every op records the user's source [`kernel::Loc`].
//! 2. [`verify`] checks types, shapes and dominance.
//! 3. The pass list in [`passes`] rewrites and annotates the kernel for a [`target::Target`].
//!    On sm_90a and sm_100a the scheduling passes write the expert layer, the schedule IR
//!    ([`sched`]): warp roles with register budgets and programs of asynchronous ops over
//!    barriers (TMA stage rings, wgmma or `tcgen05.mma` with tensor memory, TMA stores,
//!    2-CTA clusters), proved by the `protocol_check` pass.
//! 4. A backend (crate `kiln-ptx`) writes the annotated kernel as PTX.
//!
//! The [`interp`] module runs the semantic IR (before passes) on the CPU with the GPU's
//! numeric types; it is the reference every GPU result is checked against.
//!
//! **Architecture invariant:** kiln-ir knows nothing of PTX text, of syn, or of the CUDA
//! driver.

pub mod access;
pub mod arena;
pub mod builder;
pub mod device_print;
pub mod diag;
pub mod dsl;
pub mod entities;
pub mod host;
pub mod infer;
pub mod interp;
pub mod kernel;
pub mod math;
pub mod passes;
pub mod print;
pub mod sched;
pub mod schedule;
pub mod target;
pub mod tmem;
pub mod types;
pub mod verify;

pub use arena::{Arena, Handle};
pub use builder::Builder;
pub use diag::{DiagKind, Diagnostic};
pub use host::{HostTensor, TensorData};
pub use kernel::{
    Access, AccessOperands, Addr, AtomicOp, Axis, BinaryOp, Block, Const, Kernel, KernelOptions,
    Loc, MemScope, MemSem, Op, OpId, OpKind, Param, ReduceOp, StoreOperands, UnaryOp, ValueDef,
    ValueId,
};
pub use target::Target;

/// The link-time registry `#[kernel]` submits every kernel definition to
/// ([`dsl::registry`]), re-exported so a crate writing kernels needs no dependency of its own.
#[doc(hidden)]
pub use inventory;
pub use types::{DType, Shape, Type};
