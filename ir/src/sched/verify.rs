//! The schedule IR's structural verifier: what must hold of any [`Sched`] before the
//! protocol check proves its barrier protocol or a writer walks it.
//!
//! The checks (references, barrier kinds and placement, set-up and section rules, roles'
//! warps and register budgets) are listed at [`verify`]; the protocol itself (waits, phases,
//! completions, TMEM) is the `protocol_check` pass's to prove.

use std::fmt;

use super::barrier::{BarrierKind, Phase};
use super::op::Op;
use super::{BarrierId, Sched};

/// Named barrier ids of a CTA: 0 (the block-wide `bar.sync 0`) to 15.
const NAMED_BARRIERS: u32 = 16;

/// One broken invariant: where (a role's section, or a resource) and what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct VerifyError {
    /// The role and section, or the resource.
    pub place: String,
    /// What is wrong.
    pub message: String,
}

/// Every broken invariant of a schedule, in order.
///
/// Checked:
/// - every barrier, load and TMEM tile an op names exists, and each op names the kind of
///   barrier it needs (waits, arrivals and commits an mbarrier; `bar.sync`/`bar.arrive` a
///   named barrier);
/// - mbarriers have a count and stages, 8-byte aligned slots inside shared memory, and no
///   two overlap; named barrier arrays use ids 1..16 (that stores and turns do not share
///   them is a protocol rule);
/// - set-up ops only in [`Sched::setup`], and the set-up holds nothing else that needs a
///   role; lagged waits, arrivals and commits only on per-iteration barriers; per-tile
///   barriers' ops only outside the iteration section, except the TMA loads and commits
///   that fill and release them;
/// - a load's barrier is an mbarrier; a once load (per-tile barrier) has one stage;
/// - a store's barrier is a named array with one element per group and its threads;
/// - roles hold disjoint warps, register budgets are multiples of 8 in 24..=256, replicas
///   divide a role into whole warpgroups.
///
/// Not checked here (the `protocol_check` pass proves them): that waits have their
/// arrivals, phases agree, asynchronous results are waited for before use, the TMEM
/// allocation holds its tiles.
pub fn verify(s: &Sched) -> Result<(), Vec<VerifyError>> {
    let mut errs = Vec::new();
    let mut fail = |place: &dyn fmt::Display, message: String| {
        errs.push(VerifyError {
            place: place.to_string(),
            message,
        })
    };
    check_barriers(s, &mut fail);
    check_resources(s, &mut fail);
    for &op in &s.setup {
        if let Some(m) = op_error(s, op, Section::Setup) {
            fail(&"setup", m);
        }
    }
    let mut warps: Vec<(u32, u32, String)> = Vec::new();
    for r in &s.roles {
        let name = format!("role {}", r.kind);
        for (section, ops) in r.program.sections() {
            let sec = if section == "iteration" {
                Section::Iteration
            } else {
                Section::Other
            };
            for &op in ops {
                if let Some(m) = op_error(s, op, sec) {
                    fail(&format!("{name} {section}"), m);
                }
            }
        }
        if let Some(regs) = r.regs
            && (regs % 8 != 0 || !(24..=256).contains(&regs))
        {
            fail(
                &name,
                format!("setmaxnreg {regs} is not a multiple of 8 in 24..=256"),
            );
        }
        if r.replicas == 0 || !r.warps.is_multiple_of(r.replicas) {
            fail(
                &name,
                format!("{} replicas of {} warps", r.replicas, r.warps),
            );
        }
        if let Some((_, _, other)) = warps.iter().find(|(first, end, _)| {
            r.first_warp < *end && *first < r.end_warp() && r.rank.is_none()
        }) {
            fail(&name, format!("shares warps with {other}"));
        }
        if r.rank.is_none() {
            warps.push((r.first_warp, r.end_warp(), name));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

/// Where an op stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Setup,
    Iteration,
    Other,
}

/// Why `op` may not stand in `section`, if it may not.
fn op_error(s: &Sched, op: Op, section: Section) -> Option<String> {
    let setup = matches!(
        op,
        Op::InitBarriers | Op::FenceBarrierInit | Op::TmemRelinquish
    );
    if setup != (section == Section::Setup)
        && !matches!(
            op,
            Op::CtaSync
                | Op::ClusterSync
                | Op::TmemAlloc { .. }
                | Op::Tcgen05FenceBefore
                | Op::Tcgen05FenceAfter
        )
    {
        return Some(if setup {
            format!("`{op:?}` belongs to the set-up before the roles split")
        } else {
            format!("`{op:?}` needs a role; the set-up runs before the roles split")
        });
    }
    if let Op::Tma { load } | Op::GenericWrite { load } = op
        && load.index() >= s.loads.len()
    {
        return Some(format!("{load} does not exist"));
    }
    if let Op::TmemLoad { tile, .. } | Op::TmemStore { tile } = op
        && s.tmem.as_ref().is_none_or(|t| tile.0 >= t.tiles.len())
    {
        return Some(format!("TMEM tile {} does not exist", tile.0));
    }
    let bar = op.barrier()?;
    if bar.index() >= s.barriers.len() {
        return Some(format!("{bar} does not exist"));
    }
    let named = matches!(op, Op::Sync { .. } | Op::Signal { .. });
    let mbarrier = s.mbarrier(bar);
    match (named, mbarrier) {
        (true, Some(_)) => Some(format!(
            "`bar.sync`/`bar.arrive` on the mbarrier {}",
            s.barriers[bar]
        )),
        (false, None) => Some(format!(
            "an mbarrier op on the named barrier {}",
            s.barriers[bar]
        )),
        (false, Some(m)) => {
            let lag = match op {
                Op::Wait { lag, .. }
                | Op::Arrive { lag, .. }
                | Op::ArrivePeer { lag, .. }
                | Op::Tcgen05Commit { lag, .. } => lag,
                _ => 0,
            };
            if m.phase == Phase::Tile && lag > 0 {
                return Some(format!(
                    "a lag of {lag} on {}, whose phases are per work tile",
                    s.barriers[bar]
                ));
            }
            let fills = matches!(op, Op::Tcgen05Commit { .. } | Op::Arrive { .. });
            (m.phase == Phase::Tile && section == Section::Iteration && !fills).then(|| {
                format!(
                    "a per-iteration op on {}, whose phases are per work tile",
                    s.barriers[bar]
                )
            })
        }
        (true, None) => None,
    }
}

fn check_barriers(s: &Sched, fail: &mut dyn FnMut(&dyn fmt::Display, String)) {
    let mut slots: Vec<(u32, u32, BarrierId)> = Vec::new();
    for (h, b) in s.barriers.iter() {
        let place = format!("{h} {b}");
        match b.kind {
            BarrierKind::Mbarrier(m) => {
                if m.count == 0 || m.stages == 0 {
                    fail(&place, format!("count {} x{} stages", m.count, m.stages));
                }
                if m.offset % 8 != 0 {
                    fail(&place, format!("offset {} is not 8-byte aligned", m.offset));
                }
                slots.push((m.offset, m.offset + 8 * m.stages, h));
            }
            BarrierKind::Named {
                first,
                ids: n,
                threads,
            } => {
                if first == 0 || first + n > NAMED_BARRIERS || threads % 32 != 0 || threads == 0 {
                    fail(
                        &place,
                        format!(
                            "ids {first}..{} for {threads} threads (ids 1..{NAMED_BARRIERS}, whole warps)",
                            first + n
                        ),
                    );
                }
            }
        }
    }
    slots.sort_unstable();
    for w in slots.windows(2) {
        if w[0].1 > w[1].0 {
            fail(
                &format!("{} {}", w[1].2, s.barriers[w[1].2]),
                format!("overlaps {} {}", w[0].2, s.barriers[w[0].2]),
            );
        }
    }
}

fn check_resources(s: &Sched, fail: &mut dyn FnMut(&dyn fmt::Display, String)) {
    for (h, l) in s.loads.iter() {
        if l.barrier.index() >= s.barriers.len() {
            fail(&h, format!("its barrier {} does not exist", l.barrier));
            continue;
        }
        match s.mbarrier(l.barrier) {
            None => fail(&h, "completes on a named barrier".into()),
            Some(m) if m.phase == Phase::Tile && l.tma.stage_stride != 0 => {
                fail(&h, "a once load with stages".into())
            }
            Some(_) => {}
        }
    }
    for st in &s.stores {
        let place = format!("store {}", st.store);
        let ok = st.barrier.index() < s.barriers.len()
            && matches!(s.barriers[st.barrier].kind,
                BarrierKind::Named { ids, threads, .. } if ids == st.groups && threads == st.threads);
        if !ok {
            fail(
                &place,
                format!(
                    "its barrier is not a named array of {} x{} threads",
                    st.groups, st.threads
                ),
            );
        }
        if st.rounds == 0 || !(st.boxes.len() as u32).is_multiple_of(st.rounds) {
            fail(
                &place,
                format!("{} boxes in {} rounds", st.boxes.len(), st.rounds),
            );
        }
    }
}
