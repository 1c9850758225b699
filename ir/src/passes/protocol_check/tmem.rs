//! The static tensor-memory rules (sm_100a; see `docs/pipeline.md`): the allocation, its
//! owner's lifecycle, how each role's tcgen05 ops are waited for and fenced, the epilogue's
//! copies of the accumulator, and the 2-SM pair's.

use super::rules::in_order;
use super::{ProtocolError, TmemError, TmemRule};
use crate::sched::tmem::TMEM_COLUMNS;
use crate::sched::{BarrierId, MmaPart, Op, Phase, Region, Role, RoleKind, Sched};

/// The rules of the module doc.
pub(super) fn check(s: &Sched) -> Result<(), ProtocolError> {
    let Some(t) = &s.tmem else {
        return Ok(());
    };
    let needed: u32 = t.tiles.iter().map(|x| x.columns).sum();
    let mut spans: Vec<(u32, u32)> = t
        .tiles
        .iter()
        .map(|x| (x.column, x.column + x.columns))
        .collect();
    spans.sort_unstable();
    let apart = spans.windows(2).all(|w| w[0].1 <= w[1].0);
    if !t.columns.is_power_of_two()
        || !(32..=TMEM_COLUMNS).contains(&t.columns)
        || !apart
        || spans.last().is_some_and(|x| x.1 > t.columns)
    {
        return Err(TmemError::Columns {
            columns: t.columns,
            needed,
        }
        .into());
    }
    for r in mma_roles(s) {
        check_release_by_commit(s, r)?;
    }
    // The epilogue first: a free or an allocation there names the role that should own it.
    for r in s.roles.iter().filter(|r| r.kind == RoleKind::Epilogue) {
        check_epilogue(s, r)?;
    }
    check_owner(s, t.columns)?;
    for r in &s.roles {
        for (_, ops) in r.program.sections() {
            check_section(s, r, ops)?;
        }
    }
    check_pair(s, t.columns)
}

/// Whether `op` reads or writes tensor memory.
fn tcgen05(op: Op) -> bool {
    matches!(
        op,
        Op::Tcgen05Mma { .. } | Op::TmemLoad { .. } | Op::TmemStore { .. } | Op::TmemDealloc { .. }
    )
}

/// The error for `op` of role `r` breaking `rule`.
fn broken(r: &Role, op: String, rule: TmemRule) -> ProtocolError {
    let role = r.kind.to_string();
    TmemError::Rule { role, op, rule }.into()
}

/// What a check of a section names when the section ends with a copy in flight.
const AFTER_LOOP: &str = "the code after the loop";

/// The MMA roles: the leader's (or the one) and, in the 2-SM form, the peer's.
fn mma_roles(s: &Sched) -> impl Iterator<Item = &Role> {
    s.roles.iter().filter(|r| r.kind == RoleKind::Mma)
}

/// The MMA thread releases the ring's stages only with `tcgen05.commit`.
fn check_release_by_commit(s: &Sched, r: &Role) -> Result<(), ProtocolError> {
    let frees: Vec<BarrierId> = s.ring_loads().filter_map(|(_, l)| l.free).collect();
    let plain = r
        .program
        .iteration
        .iter()
        .chain(&r.program.drain)
        .find(|op| {
            matches!(**op, Op::Arrive { bar, .. } if frees.contains(&bar))
                || matches!(op, Op::WgmmaCommit | Op::WgmmaWait(_))
        });
    match plain {
        Some(&op) => Err(TmemError::PlainRelease(s.name(op)).into()),
        None => Ok(()),
    }
}

/// The MMA warp allocates, relinquishes and publishes before the roles split, frees the same
/// columns last (after its waits for the tiles' last handoffs and a fence), and no other
/// role owns TMEM; per tile it waits for the previous tile's accumulator to be copied out
/// and fences before its mmas overwrite it, and commits the accumulator once after them.
fn check_owner(s: &Sched, columns: u32) -> Result<(), ProtocolError> {
    let err = |m: &str| Err(TmemError::Owner(m.to_string()).into());
    let barrier = [Op::CtaSync, Op::ClusterSync]
        .into_iter()
        .find(|op| s.setup.contains(op));
    let published = barrier.is_some_and(|b| {
        let (alloc, fence_after) = (Op::TmemAlloc { columns }, Op::Tcgen05FenceAfter);
        in_order(&s.setup, &[alloc, Op::TmemRelinquish, b, fence_after])
            && in_order(&s.setup, &[Op::Tcgen05FenceBefore, b])
    });
    let allocs = s
        .setup
        .iter()
        .filter(|op| matches!(op, Op::TmemAlloc { .. }));
    if !published || allocs.count() != 1 {
        return err(
            "allocate the columns once, relinquish the allocation permit and publish the \
             address before the roles split",
        );
    }
    for r in &s.roles {
        let owning = |op: &Op| matches!(op, Op::TmemAlloc { .. } | Op::TmemRelinquish);
        let freeing = |op: &Op| matches!(op, Op::TmemDealloc { .. });
        let p = &r.program;
        let found = if r.kind == RoleKind::Mma {
            p.ops()
                .find(owning)
                .or(p.ops_except(&["exit"]).find(freeing))
        } else {
            p.ops().find(|op| owning(op) || freeing(op))
        };
        if let Some(op) = found {
            return Err(broken(r, s.name(op), TmemRule::NotOwner));
        }
    }
    let leader = s.cluster.as_ref().and_then(|c| c.pair.map(|p| p.leader));
    for r in mma_roles(s).filter(|r| r.rank == leader) {
        let p = &r.program;
        // The per-tile barriers the MMA thread waits on before it overwrites TMEM: the
        // previous tile's copies are out.
        let drained: Vec<BarrierId> = p
            .tile
            .iter()
            .filter_map(|op| match *op {
                Op::Wait { bar, start: 1, .. }
                    if s.mbarrier(bar)
                        .is_some_and(|m| m.phase == Phase::Tile && m.hands_tmem) =>
                {
                    Some(bar)
                }
                _ => None,
            })
            .collect();
        let first_mma = p.iteration.iter().position(|op| tcgen05(*op));
        let fenced = p.tile.contains(&Op::Tcgen05FenceAfter)
            || first_mma.is_some_and(|m| p.iteration[..m].contains(&Op::Tcgen05FenceAfter));
        if drained.is_empty() || !fenced {
            return err(
                "wait on the accumulator's handback (from parity 1) and fence after it before a \
                 tile's mmas overwrite it",
            );
        }
        let body = |op: &Op| matches!(op, Op::Tcgen05Mma { part, .. } if *part == MmaPart::Body);
        if p.iteration.iter().any(body) {
            let commits = p
                .end
                .iter()
                .filter(|op| matches!(op, Op::Tcgen05Commit { .. }));
            if commits.count() != 1 {
                return err("commit the accumulator to acc_full once per tile, after the mainloop");
            }
        }
        let Some(free) = p
            .exit
            .iter()
            .position(|op| *op == Op::TmemDealloc { columns })
        else {
            return err("free the columns it allocated after its last tile");
        };
        let before = &p.exit[..free];
        let waited = drained.iter().all(|&bar| {
            before
                .iter()
                .any(|op| matches!(*op, Op::Wait { bar: b, start: 1, .. } if b == bar))
        });
        let fence = before.iter().rposition(|op| *op == Op::Tcgen05FenceAfter);
        let last_wait = before.iter().rposition(|op| matches!(op, Op::Wait { .. }));
        if !waited
            || fence.is_none_or(|f| last_wait.is_some_and(|w| w > f))
            || free + 1 != p.exit.len()
        {
            let mut bars: Vec<&str> = drained.iter().map(|&b| s.barriers[b].name).collect();
            bars.dedup();
            return Err(TmemError::Owner(format!(
                "wait on every tile's {} (the last output copied out) and fence after it before \
                 freeing the columns, last",
                bars.join(", ")
            ))
            .into());
        }
    }
    Ok(())
}

/// The per-section rules of every role: the MMA thread signals only by commit and the others
/// only by plain arrivals; every `tcgen05.ld` is waited for before its registers are used or
/// TMEM is handed on, every `tcgen05.st` before the handoff; a tcgen05 op after a wait comes
/// after `fence::after_thread_sync`, an arrival handing TMEM on after a tcgen05 op after
/// `fence::before_thread_sync`.
fn check_section(s: &Sched, r: &Role, ops: &[Op]) -> Result<(), ProtocolError> {
    let mma = r.kind == RoleKind::Mma;
    let fail = |op: Op, rule| Err(broken(r, s.name(op), rule));
    let (mut ld, mut st) = (false, false);
    let (mut after_wait, mut touched) = (false, false);
    for &op in ops {
        match op {
            Op::Tcgen05Commit { .. } if !mma => return fail(op, TmemRule::PlainSignal),
            Op::Arrive { .. } if mma => return fail(op, TmemRule::PlainSignal),
            _ => {}
        }
        match op {
            Op::TmemWaitLoad => ld = false,
            Op::TmemLoad { .. } => {}
            _ if ld => return fail(op, TmemRule::NotWaited("ld")),
            _ => {}
        }
        match op {
            Op::TmemWaitStore => st = false,
            Op::Tcgen05FenceBefore | Op::Arrive { .. } | Op::RescaleEnd if st => {
                return fail(op, TmemRule::NotWaited("st"));
            }
            Op::TmemStore { .. } => st = true,
            _ => {}
        }
        if matches!(op, Op::TmemLoad { .. }) {
            ld = true;
        }
        let hands = |bar: BarrierId| s.mbarrier(bar).is_some_and(|m| m.hands_tmem);
        match op {
            // A wait that hands TMEM over orders the tcgen05 ops after it only through a
            // fence; TMA data (the ring's `full`) reaches tcgen05.mma through the async proxy.
            Op::Wait { bar, .. } if hands(bar) => after_wait = true,
            Op::Tcgen05FenceAfter => after_wait = false,
            Op::Tcgen05FenceBefore => touched = false,
            _ if tcgen05(op) && after_wait => return fail(op, TmemRule::Unfenced("after")),
            Op::Arrive { bar, .. } if touched && hands(bar) => {
                return fail(op, TmemRule::Unfenced("before"));
            }
            _ => {}
        }
        if tcgen05(op) && !mma {
            touched = true;
        }
    }
    match (ld, st) {
        (true, _) => Err(broken(r, AFTER_LOOP.into(), TmemRule::NotWaited("ld"))),
        (false, true) => Err(broken(r, AFTER_LOOP.into(), TmemRule::NotWaited("st"))),
        (false, false) => Ok(()),
    }
}

/// The epilogue copies the accumulator after waiting on its commit (and fencing), copies
/// every column of the accumulator once over its warpgroups, hands TMEM back once after its
/// last copy landed, and reads every column of its block once, after its copy.
fn check_epilogue(s: &Sched, r: &Role) -> Result<(), ProtocolError> {
    let Some(t) = &s.tmem else {
        return Ok(());
    };
    let Some(acc) = t.tiles.first() else {
        return Ok(());
    };
    let fail = |op: Op, rule| Err(broken(r, s.name(op), rule));
    let ops = &r.program.end;
    let (mut waited, mut fenced) = (false, false);
    let (mut pending, mut before_sync, mut handed_back) = (false, false, false);
    let mut loads = Vec::new();
    let (mut reads, mut early) = (Vec::new(), None);
    let mut hand_backs = 0;
    for &op in ops {
        match op {
            Op::TmemAlloc { .. } | Op::TmemDealloc { .. } | Op::TmemRelinquish => {
                return fail(op, TmemRule::NotOwner);
            }
            Op::Wait { bar, start: 0, .. }
                if s.mbarrier(bar).is_some_and(|m| m.phase == Phase::Tile) =>
            {
                waited = true
            }
            Op::Tcgen05FenceAfter => fenced = waited,
            Op::TmemLoad {
                column, columns, ..
            } => {
                if !(waited && fenced) {
                    return fail(op, TmemRule::LoadBeforeCommit);
                }
                if handed_back {
                    return Err(TmemError::LoadAfterHandBack(s.name(op)).into());
                }
                loads.push((column, columns));
                pending = true;
                before_sync = false;
            }
            Op::TmemWaitLoad => pending = false,
            Op::Tcgen05FenceBefore => before_sync = true,
            Op::Run(Region::Epilogue(_)) | Op::Arrive { .. } if pending => {
                return fail(op, TmemRule::NotWaited("ld"));
            }
            Op::Arrive { .. } if !before_sync => return fail(op, TmemRule::Unfenced("before")),
            Op::Arrive { .. } => {
                handed_back = true;
                hand_backs += 1;
            }
            Op::Run(Region::Epilogue(cols)) => {
                let (column, columns) = cols.unwrap_or((0, acc.columns));
                let copied = |c: u32| loads.iter().any(|&(l, n)| (l..l + n).contains(&c));
                let missing = (column..column + columns).find(|&c| !copied(c));
                early = early.or(missing.map(|c| (op, c)));
                reads.push((column, columns));
            }
            _ => {}
        }
    }
    if pending {
        return Err(broken(r, AFTER_LOOP.into(), TmemRule::NotWaited("ld")));
    }
    if hand_backs != 1 {
        return Err(TmemError::NoHandBack.into());
    }
    if r.warps == 0 || !r.warps.is_multiple_of(4) {
        return Err(TmemError::Lanes(r.warps).into());
    }
    let warpgroups = r.warps / 4;
    let block = acc.columns / warpgroups;
    let mut times: Vec<u32> = vec![0; acc.columns as usize];
    let mut past = None;
    for g in 0..warpgroups {
        for &(column, columns) in &loads {
            for c in g * block + column..g * block + column + columns {
                match times.get_mut(c as usize) {
                    Some(t) => *t += 1,
                    None => past = past.or(Some(c)),
                }
            }
        }
    }
    let wrong = (0..acc.columns)
        .zip(&times)
        .find(|&(_, &t)| t != 1)
        .map(|(c, &t)| (c, t))
        .or(past.map(|c| (c, 1)));
    if let Some((column, times)) = wrong {
        return Err(TmemError::Coverage {
            got: loads,
            warpgroups,
            block,
            acc: acc.columns,
            column,
            times,
        }
        .into());
    }
    if let Some((read, column)) = early {
        return Err(TmemError::ReadBeforeLoad {
            read: s.name(read),
            column,
        }
        .into());
    }
    let count = |c: u32| {
        reads
            .iter()
            .filter(|&&(r, n)| (r..r + n).contains(&c))
            .count() as u32
    };
    let past = reads.iter().any(|&(r, n)| r + n > block);
    let wrong = (0..block)
        .map(|c| (c, count(c)))
        .find(|&(_, t)| t != 1)
        .or(past.then_some((block, 1)));
    match wrong {
        None => Ok(()),
        Some((column, times)) => Err(TmemError::ReadCoverage {
            got: reads,
            block,
            column,
            times,
        }
        .into()),
    }
}

/// The 2-SM pair: the cluster and the MMA roles agree on it; its commits reach both CTAs;
/// every peer CTA has an MMA warp, which issues nothing and frees the columns the pair
/// allocated; both free them only after a cluster barrier.
fn check_pair(s: &Sched, columns: u32) -> Result<(), ProtocolError> {
    let form = |paired: bool| if paired { "paired" } else { "not paired" };
    let pair = s
        .cluster
        .as_ref()
        .and_then(|c| c.pair.map(|p| (c.all(), p)));
    let ranked = mma_roles(s).any(|r| r.rank.is_some());
    let (all, p) = match (pair, ranked) {
        (Some(x), true) => x,
        (None, false) => return Ok(()),
        (c, r) => {
            return Err(TmemError::PairMismatch {
                ring: form(c.is_some()),
                plan: form(r),
            }
            .into());
        }
    };
    if p.commit_mask != all {
        return Err(TmemError::CommitMask {
            mask: p.commit_mask,
            all,
        }
        .into());
    }
    // The allocation is collective: a peer CTA without an MMA warp frees nothing.
    let ctas = s.cluster.as_ref().map_or(1, |c| c.ctas);
    if (0..ctas).any(|k| k != p.leader && !mma_roles(s).any(|r| r.rank == Some(k))) {
        return Err(TmemError::PairColumns {
            columns,
            peer: Vec::new(),
        }
        .into());
    }
    for r in mma_roles(s) {
        let leader = r.rank == Some(p.leader);
        let exit = &r.program.exit;
        if !leader {
            if let Some(op) = r
                .program
                .ops()
                .find(|op| matches!(op, Op::Tcgen05Mma { .. } | Op::Tcgen05Commit { .. }))
            {
                return Err(TmemError::PeerIssues(s.name(op)).into());
            }
            let frees: Vec<u32> = exit
                .iter()
                .filter_map(|op| match *op {
                    Op::TmemDealloc { columns } => Some(columns),
                    _ => None,
                })
                .collect();
            if frees != [columns] {
                return Err(TmemError::PairColumns {
                    columns,
                    peer: frees,
                }
                .into());
            }
        }
        if !in_order(exit, &[Op::ClusterSync, Op::TmemDealloc { columns }]) {
            return Err(TmemError::PairExit {
                cta: if leader { "leader" } else { "peer" },
            }
            .into());
        }
    }
    Ok(())
}
