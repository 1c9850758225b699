//! The pass pipeline: the ordered list of rewrites and annotations that turn a semantic
//! kernel into one a backend can write out for a [`Target`].
//!
//! Every pass is one module exposing `run(&mut Kernel, Target) -> Result<(), Diagnostic>`.
//! [`run_pipeline`] runs them in [`PASSES`] order and lets a caller observe the kernel after
//! each one (`kiln ir --after PASS`, `KILN_DUMP=ir`).

pub mod accumulators;
pub mod bulk_add;
pub mod canonicalize;
pub mod consumer_barriers;
mod edit;
pub mod layout;
pub mod lower;
pub mod memory_plan;
pub mod mma_issue;
pub mod mma_operands;
pub mod occupancy;
pub mod overlap;
pub mod persistent;
pub mod pipeline;
pub mod prefetch;
pub mod protocol_check;
pub mod staged_load;
pub mod strip_mine;
mod tiles_nd;
pub mod tma_store;
pub mod tmem;
pub mod verify;
pub mod warp_specialise;
pub mod wgmma_plain;

pub(crate) mod walk;

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::target::Target;

/// A pass entry point.
pub type PassFn = fn(&mut Kernel, Target) -> Result<(), Diagnostic>;

/// The pipeline, in order: `(name, purpose, entry point)`.
pub const PASSES: &[(&str, &str, PassFn)] = &[
    // First, so every later pass may assume well-typed, dominance-respecting IR.
    ("verify", "check types, shapes and dominance", verify::run),
    // Before layout: fusing `add(c, mma(a, b))` decides which values are mma accumulators.
    (
        "canonicalize",
        "fold accumulating adds into mma and drop dead ops",
        canonicalize::run,
    ),
    // After canonicalize (which decides the mma accumulators, whose tiles stay whole);
    // before layout, which then lays out the chunks.
    (
        "strip_mine",
        "stream tiles too large for registers through loops over chunks of them",
        strip_mine::run,
    ),
    // After strip_mine (which keeps a pipelined loop's tiles whole); memory_plan places the
    // rings of the loads it plans.
    (
        "prefetch",
        "pipelined loops without mma: each iteration issues a later one's loads into \
         per-thread shared-memory rings",
        prefetch::run,
    ),
    // Needs the final op set; everything after it reads the layouts.
    (
        "layout",
        "choose a register or shared layout for every tile",
        layout::run,
    ),
    // Needs the shared layouts to know which loads are staged in shared memory.
    (
        "memory_plan",
        "place shared-memory buffers, multi-buffered in pipelined loops",
        memory_plan::run,
    ),
    // sm_90a, sm_100a: needs the buffers; re-places them for TMA and adds the barrier rings.
    (
        "pipeline",
        "sm_90a, sm_100a: TMA stage rings with full/empty mbarriers and phase bits",
        pipeline::run,
    ),
    // sm_90a: needs to know whether any ring exists.
    (
        "warp_specialise",
        "sm_90a: producer warpgroup + consumer warpgroups, setmaxnreg split",
        warp_specialise::run,
    ),
    // sm_90a: needs the rings' programs and the roles (it rewrites the consumer program
    // and the register split); before protocol_check, which proves what it wrote.
    (
        "overlap",
        "sm_90a: rotate mma -> softmax -> mma loops; warpgroup ping-pong",
        overlap::run,
    ),
    // sm_90a: needs to know whether overlap rotated the body (then it is scheduled).
    (
        "mma_issue",
        "sm_90a: issue an unrotated ring body's mmas as early as their operands allow",
        mma_issue::run,
    ),
    // sm_90a: needs the final ring (overlap may deepen it) to add its per-tile barrier.
    (
        "persistent",
        "sm_90a, sm_100a: persistent CTAs walking work tiles; the ring continues across tiles",
        persistent::run,
    ),
    // sm_90a: needs the final rings and their shared memory (the staging tiles go after
    // them) and the tile loop (the staging tile is reused from tile to tile).
    (
        "tma_store",
        "sm_90a, sm_100a: epilogue stores through a swizzled staging tile and TMA",
        tma_store::run,
    ),
    // sm_90a: needs the final shared-memory plan (the staging tile included) and the roles.
    (
        "occupancy",
        "sm_90a: two CTAs per multiprocessor for a one-warpgroup kernel where they fit",
        occupancy::run,
    ),
    // sm_100a: needs the final shared-memory plan (its address slot and accumulator barriers
    // go after everything else) and the ring (whose mma it lowers to tcgen05).
    (
        "tmem",
        "sm_100a: TMEM accumulator, MMA/epilogue roles, tcgen05 descriptors",
        tmem::run,
    ),
    // Target checks and pipelining plans rely on the buffers' stage counts and the rings.
    (
        "lower",
        "target lowering plans (sm_80: cp.async pipelining)",
        lower::run,
    ),
    // Last: proves the final schedule's barrier protocol.
    (
        "protocol_check",
        "sm_90a, sm_100a: prove the rings' barrier protocol (arrives, tx bytes, phases, fences) \
         and TMEM ownership",
        protocol_check::run,
    ),
];

/// Whether pass `name` does anything on `target`: the scheduling passes of sm_90a and sm_100a
/// are skipped (and not observed) elsewhere, so other targets' dumps do not repeat unchanged
/// kernels.
pub fn applies(name: &str, target: Target) -> bool {
    match name {
        "warp_specialise" | "overlap" | "mma_issue" | "occupancy" => target == Target::Sm90a,
        "pipeline" | "persistent" | "tma_store" | "protocol_check" => {
            matches!(target, Target::Sm90a | Target::Sm100a)
        }
        "tmem" => target == Target::Sm100a,
        _ => true,
    }
}

/// Runs every pass in order, calling `observe(pass_name, kernel)` after each.
pub fn run_pipeline(
    kernel: &mut Kernel,
    target: Target,
    observe: &mut dyn FnMut(&str, &Kernel),
) -> Result<(), Diagnostic> {
    for (name, _, pass) in PASSES {
        if !applies(name, target) {
            continue;
        }
        pass(kernel, target)?;
        observe(name, kernel);
    }
    Ok(())
}

/// Runs the passes in order up to and including `last` (a name in [`PASSES`]): the kernel as
/// `kiln ir --after last` shows it.
pub fn run_through(kernel: &mut Kernel, target: Target, last: &str) -> Result<(), Diagnostic> {
    for (name, _, pass) in PASSES {
        if applies(name, target) {
            pass(kernel, target)?;
        }
        if *name == last {
            return Ok(());
        }
    }
    Err(Diagnostic::internal(
        crate::kernel::Loc::default(),
        format!("no pass named `{last}`"),
    ))
}
