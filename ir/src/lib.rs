//! # kiln-ir: the tile IR
//!
//! A kiln kernel is a program of SSA scalars and register tiles ([`types::Type`]) run by every
//! thread block of a grid, reaching global memory only through bounds-checked tensor parameters
//! (semantics: `docs/pipeline.md`, "The tile IR"). `#[kernel]` builds it ([`dsl`],
//! [`builder::Builder`]); [`verify`] checks it; [`passes`] rewrite it for a [`target::Target`]
//! (into the schedule IR, [`sched`], on sm_90a and sm_100a); `kiln-ptx` writes it as PTX;
//! [`interp`] runs it on the CPU as the reference. It knows nothing of PTX text, syn or CUDA.

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
pub mod rounding;
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
