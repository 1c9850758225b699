//! The rules of the epilogue's TMA stores ([`crate::sched::tma::TmaStore`]): in each round
//! the staging tile is free before any thread writes it (the issuing thread's
//! `wait_group.read`, then a barrier), the writes are fenced to the async proxy and every
//! thread is past them (a fence, then a barrier) before the store is issued, and the store's
//! group is committed; the storing role waits for every store before it exits. Groups that
//! store apart each meet at a named barrier of their own, none of them 0 or another named
//! barrier of the schedule, and each stores whole 8-row swizzle atoms of every box; stores
//! that run at once (an attention pair's) have staging tiles and barriers of their own.

use super::StoreError;
use crate::sched::{BarrierKind, Op, Region, Role, RoleKind, Sched, TmaStore};

/// Named barrier ids of a CTA: 0 (the block-wide `bar.sync 0`) to 15.
const NAMED_BARRIERS: u32 = 16;

/// The first broken store and why.
pub(super) fn check(s: &Sched) -> Result<(), (usize, StoreError)> {
    for (k, st) in s.stores.iter().enumerate() {
        check_store(s, st).map_err(|e| (k, e))?;
    }
    if let [a, b] = &s.stores[..] {
        let apart = a.offset + a.bytes() <= b.offset || b.offset + b.bytes() <= a.offset;
        let (x, y) = (ids(s, a), ids(s, b));
        let shared_ids = x.start < y.end && y.start < x.end;
        if a.work_tile != b.work_tile && (!apart || shared_ids) {
            return Err((1, StoreError::SharedStaging));
        }
    }
    Ok(())
}

/// The role whose code after the loop stores through `st`.
pub(super) fn storing_role<'s>(s: &'s Sched, st: &TmaStore) -> Option<&'s Role> {
    s.roles.iter().find(|r| {
        let runs = r
            .program
            .ops()
            .any(|op| matches!(op, Op::Run(Region::Epilogue(_))));
        runs && match r.kind {
            RoleKind::Softmax(g) => g == st.work_tile,
            _ => true,
        }
    })
}

/// The named barrier ids of a store's barrier array.
fn ids(s: &Sched, st: &TmaStore) -> std::ops::Range<u32> {
    match s.barriers[st.barrier].kind {
        BarrierKind::Named { first, ids, .. } => first..first + ids,
        BarrierKind::Mbarrier(_) => 0..0,
    }
}

fn check_store(s: &Sched, st: &TmaStore) -> Result<(), StoreError> {
    let stores = ids(s, st);
    let others = s
        .barriers
        .iter()
        .filter(|(h, _)| *h != st.barrier && !s.stores.iter().any(|o| o.barrier == *h))
        .filter_map(|(_, b)| match b.kind {
            BarrierKind::Named { first, ids, .. } => Some(first..first + ids),
            BarrierKind::Mbarrier(_) => None,
        })
        .find(|o| o.start < stores.end && stores.start < o.end);
    if stores.start == 0 || stores.end > NAMED_BARRIERS || others.is_some() {
        return Err(StoreError::Barriers {
            stores,
            others: others.unwrap_or(0..0),
        });
    }
    let rows = st.box_dims[0];
    if st.groups == 0 || !rows.is_multiple_of(8 * st.groups) {
        return Err(StoreError::Bands {
            groups: st.groups,
            rows,
        });
    }
    let r = &st.round;
    let at = |op: Op| -> Vec<usize> {
        r.iter()
            .enumerate()
            .filter(|&(_, &x)| x == op)
            .map(|(i, _)| i)
            .collect()
    };
    let (writes, issues) = (at(Op::StagingWrite), at(Op::BulkStore));
    let shape = || StoreError::Shape(s.names(r));
    let (&[write], &[issue]) = (&writes[..], &issues[..]) else {
        return Err(shape());
    };
    if write > issue {
        return Err(shape());
    }
    let is_sync = |op: Op| matches!(op, Op::Sync { bar, .. } if bar == st.barrier);
    let find = |test: &dyn Fn(Op) -> bool, from: usize, to: usize| (from..to).find(|&i| test(r[i]));
    let freed = find(&|op| op == Op::BulkWaitRead, 0, write)
        .and_then(|w| find(&is_sync, w + 1, write))
        .is_some();
    if !freed {
        return Err(StoreError::WriteBeforeFree);
    }
    let visible = find(&|op| op == Op::FenceProxyAsync, write + 1, issue)
        .and_then(|f| find(&is_sync, f + 1, issue))
        .is_some();
    if !visible {
        return Err(StoreError::StoreBeforeVisible);
    }
    if find(&|op| op == Op::BulkCommit, issue + 1, r.len()).is_none() {
        return Err(StoreError::Uncommitted);
    }
    if let Some(role) = storing_role(s, st)
        && !role.program.exit.contains(&Op::BulkWaitAll)
    {
        return Err(StoreError::ExitBeforeStored {
            role: role.kind.to_string(),
            ops: s.names(&role.program.exit),
        });
    }
    Ok(())
}
