//! The `protocol_check` pass (sm_90a, sm_100a): proves the schedule IR's barrier protocol
//! ([`crate::sched`]) before any PTX is written. A violation is a compiler error at the
//! user's loop, not a hang or a race on the GPU.
//!
//! Static rules (`rules`, `tmem`, `cluster`, `store`) check the role programs' structure;
//! dynamic rules (`machine`) run every role's expanded program ([`crate::sched::expand`]) on
//! an abstract mbarrier machine for every trip count up to past the ring's second wrap. The
//! rules in full: `docs/pipeline.md`, "Inside the passes".

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

/// Checks the kernel's schedule IR (the rules: `docs/pipeline.md`).
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

/// Checks a schedule: the static rules, then the abstract execution (see `docs/pipeline.md`).
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
