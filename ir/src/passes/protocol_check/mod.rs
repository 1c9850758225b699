//! The `protocol_check` pass (sm_90a, sm_100a): proves the schedule IR's barrier protocol
//! ([`crate::sched`]) before any PTX is written. A violation is a compiler error at the
//! user's loop, not a hang or a race on the GPU.
//!
//! **Static rules** (`rules`, `tmem`, `cluster`, `store`), over the role programs:
//! - set-up: `mbarrier.init`, `fence.mbarrier_init`, then the set-up barrier (the cluster's,
//!   in a clustered schedule);
//! - every load is issued once per iteration (a once load once per tile) by the producer,
//!   after its wait on the load's free barrier, which starts at parity 1; the bytes
//!   announced on each barrier equal the bytes of the loads completing on it; the readers'
//!   waits on a load's barrier start at parity 0, before their first op reading it;
//! - once loads: the producer's tile section only waits on their free barrier (from parity
//!   1, persistent schedules only), announces and issues them; their readers wait on them
//!   (parity 0) before the loop and, in a persistent schedule, release them once per tile;
//!   no per-iteration op touches them;
//! - every generic-proxy write to a stage is fenced (`fence.proxy.async`) before the async
//!   proxy may read it;
//! - a rotated program runs its head and tail mmas, its code between and its handoff once
//!   per round; named (turn) barriers only where replicas take turns;
//! - a cluster synchronises after the inits, its `empty` counts every CTA's releases, each
//!   box of the shared load is issued by one CTA into all; the 2-SM pair's commits reach
//!   both CTAs, only the leader issues, both free their columns after a cluster barrier;
//! - tensor memory: the allocation holds every tile apart, the MMA warp allocates,
//!   relinquishes and (after its last tile, its barrier waits and a fence) frees it; only
//!   the MMA thread commits, never arrives plainly, and releases stages only by commit; every
//!   `tcgen05.ld`/`st` is waited for before its registers are used or TMEM is handed on; a
//!   tcgen05 op after a wait is fenced after it, an arrival handing TMEM on fenced before;
//!   the epilogue copies every accumulator column once and reads each once, after its copy;
//! - TMA stores: each round frees, writes, fences and stores the staging tile, and commits;
//!   the storing role waits for every store before it exits.
//!
//! **Dynamic rules** (`machine`): every role (each replica, in each CTA of a cluster) runs
//! its expanded program ([`crate::sched::expand`]) on an abstract machine with mbarrier
//! semantics (arrival counts, transaction bytes, phases, parity waits), named barriers,
//! wgmma commit groups, tcgen05 commits and vector clocks, for every trip count from 0 to
//! past the ring's second wrap (and, when persistent, sequences of three tiles of those).
//! It fails when the roles deadlock, a barrier gets more arrivals than its count, a parity
//! wait would pass on another phase than the one it means, a stage is released while an mma
//! reading it may run, TMA refills a stage (or reloads the once tiles) before its readers
//! released it, an mma reads a stage its wait has not shown landed, a wgmma's registers are
//! read or overwritten in flight, a turn is passed to nobody or left pending, a remote
//! arrival or multicast reaches an exited CTA, or two roles touch a region (a stage, a TMEM
//! tile, the rescale factors) with no barrier ordering them.

mod cluster;
mod error;
pub(crate) mod machine;
mod rules;
mod store;
#[cfg(test)]
mod tests;
mod tmem;

pub use error::{ClusterError, OnceError, ProtocolError, Race, StoreError, TmemError, TmemRule};

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::sched::Sched;
use crate::target::Target;

/// Checks the kernel's schedule IR (see the module doc).
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if !matches!(target, Target::Sm90a | Target::Sm100a) {
        return Ok(());
    }
    let Some(sched) = &kernel.schedule.sched else {
        return Ok(());
    };
    let loc = kernel.ops[sched.for_op].loc;
    if let Err(errors) = crate::sched::verify::verify(sched) {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(Diagnostic::internal(
            loc,
            format!("the schedule IR is malformed: {}", text.join("; ")),
        ));
    }
    // A schedule the passes wrote that fails its proof is kiln's bug, typed as such.
    let wrong = |loc, what: String| Diagnostic {
        kind: crate::diag::DiagKind::Internal,
        ..Diagnostic::new(loc, format!("internal kiln error: {what}"))
    };
    let loop_error = |e: ProtocolError| {
        wrong(
            loc,
            format!("the pipelined loop's barrier protocol is wrong: {e}"),
        )
    };
    check_static(sched).map_err(loop_error)?;
    store::check(sched).map_err(|(k, e)| {
        let st = &sched.stores[k];
        let role = store::storing_role(sched, st).map_or("consumer".into(), |r| r.kind.to_string());
        wrong(
            kernel.ops[st.store].loc,
            format!("the {role}'s epilogue store's TMA protocol is wrong: {e}"),
        )
    })?;
    machine::check(sched).map_err(loop_error)
}

/// Checks a schedule: the static rules, then the abstract execution (see the module doc).
pub fn check(s: &Sched) -> Result<(), ProtocolError> {
    check_static(s)?;
    store::check(s).map_err(|(_, e)| ProtocolError::Store(e))?;
    machine::check(s)
}

/// The static rules of the loop's roles.
fn check_static(s: &Sched) -> Result<(), ProtocolError> {
    rules::check(s)?;
    cluster::check(s)?;
    tmem::check(s)
}
