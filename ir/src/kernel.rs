//! The kernel: parameters, SSA values, operations and structured regions, with the
//! scheduling annotations the passes add.

pub use crate::entities::*;

use crate::arena::Arena;
use crate::schedule::{Distribution, Schedule};
use crate::types::Type;

/// Launch-shape and code-generation options of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelOptions {
    /// Warps per thread block. The frontend leaves this at its default; a
    /// `#[kernel(num_warps = N)]` attribute overrides it.
    pub num_warps: u32,
    /// The kernel's request for thread-block clusters along x ([`crate::dsl::cluster`]):
    /// CTAs per cluster (1: none) and where it was asked for. A request, not a promise: the
    /// passes cluster a schedule that can share its loads across the cluster
    /// ([`crate::sched::cluster`]) and report any other as a diagnostic at `loc`.
    pub cluster: u32,
    /// Where the cluster was requested (the default location when it was not).
    pub cluster_loc: Loc,
    /// Whether the sm_90a and sm_100a passes may give a pipelined loop warp roles and a TMA
    /// ring ([`crate::dsl::warp_specialize`]); `false` keeps the plain lowering.
    pub warp_specialize: bool,
    /// Where warp specialisation was turned off (the default location when it was not).
    pub warp_specialize_loc: Loc,
    /// Blocks the kernel asks to fit on one multiprocessor ([`crate::dsl::blocks_per_sm`];
    /// 1: no request): `.minnctapersm`, so ptxas keeps each thread's registers within the
    /// register file's share.
    pub blocks_per_sm: u32,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            num_warps: 4,
            cluster: 1,
            cluster_loc: Loc::default(),
            warp_specialize: true,
            warp_specialize_loc: Loc::default(),
            blocks_per_sm: 1,
        }
    }
}

/// A specialised kernel: all comptime arguments are applied, shapes are constants.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The kernel's name (a valid PTX identifier).
    pub name: String,
    /// Launch parameters in order.
    pub params: Vec<Param>,
    /// Every SSA value.
    pub values: Arena<ValueData>,
    /// Every operation, including ones no longer reachable from `body` after a rewrite.
    pub ops: Arena<Op>,
    /// The top-level block (takes no arguments).
    pub body: Block,
    /// Launch options.
    pub options: KernelOptions,
    /// Scheduling annotations added by the passes (empty on a freshly built kernel).
    pub schedule: Schedule,
}

impl Kernel {
    /// An empty kernel.
    pub fn new(name: impl Into<String>, params: Vec<Param>, options: KernelOptions) -> Kernel {
        Kernel {
            name: name.into(),
            params,
            values: Arena::new(),
            ops: Arena::new(),
            body: Block::default(),
            options,
            schedule: Schedule::default(),
        }
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &Type {
        &self.values[v].ty
    }

    /// The location of the operation defining `v` (a block argument reports its op's).
    pub fn value_loc(&self, v: ValueId) -> Loc {
        match self.values[v].def {
            ValueDef::Op(op, _) | ValueDef::BlockArg { op, .. } => self.ops[op].loc,
        }
    }

    /// The distribution of tile `v`'s layout over its shape (what a backend writes registers
    /// from); why not, when `v` has no layout or is not a tile.
    pub fn distribution(&self, v: ValueId) -> Result<Distribution, String> {
        let layout = self
            .schedule
            .layouts
            .get(&v)
            .ok_or_else(|| format!("{v} has no layout"))?;
        let shape = self
            .ty(v)
            .shape()
            .ok_or_else(|| format!("{v} is not a tile"))?;
        layout.distribution(shape).map_err(|e| e.to_string())
    }
}
