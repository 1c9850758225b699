//! The rules of a TMA store's rounds ([`crate::tma_store`]): in each round the staging tile is
//! free before any thread writes it (the issuing thread's `wait_group.read`, then a barrier),
//! the writes are fenced to the async proxy and every thread is past them (a fence, then a
//! barrier) before the store is issued, the store's group is committed, and the consumers do
//! not exit before every store has completed. Groups that store apart each meet at a named
//! barrier of their own, none of them the block's (0) or a turn barrier of the warpgroups,
//! and each stores whole 8-row swizzle atoms of every box.

use std::ops::Range;

use crate::ring::NAMED_BARRIERS;
use crate::tma_store::{StoreStep, TmaStore};

/// A broken TMA-store protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A round does not write once and store once, in that order.
    #[error("a TMA store round must write the staging tile once, then store it once; got {0:?}")]
    Shape(Vec<StoreStep>),
    /// Threads may write the staging tile while an earlier store still reads it.
    #[error(
        "a TMA store round writes the staging tile before the issuing thread's wait_group.read and a barrier after it: an earlier store may still read it"
    )]
    WriteBeforeFree,
    /// The store may read the staging tile before every thread's writes reach the async proxy.
    #[error(
        "a TMA store round stores the staging tile before fence.proxy.async and a barrier after it: the copy may miss the threads' writes"
    )]
    StoreBeforeVisible,
    /// The round's bulk stores are never committed, so no wait covers them.
    #[error("a TMA store round stores without committing the bulk group after")]
    Uncommitted,
    /// The consumers may exit while a store still reads the staging tile.
    #[error(
        "the consumers exit without waiting for every TMA store (wait_group 0); steps at exit: {0:?}"
    )]
    ExitBeforeStored(Vec<StoreStep>),
    /// The groups' barriers are not ids of their own.
    #[error(
        "a TMA store's named barriers {stores:?} must lie in 1..16, apart from the warpgroups' turn barriers {turns:?}"
    )]
    Barriers {
        /// The groups' barrier ids.
        stores: Range<u32>,
        /// The turn barriers' ids.
        turns: Range<u32>,
    },
    /// A group's band of a box is not whole swizzle atoms.
    #[error(
        "a TMA store's {groups} groups split its {rows}-row boxes into bands that are not whole 8-row swizzle atoms"
    )]
    Bands {
        /// Groups storing apart.
        groups: u32,
        /// Rows of a box.
        rows: u32,
    },
}

/// Checks `st`'s groups against the ring's turn barriers `turns` (empty without
/// ping-pong), then its round and exit steps.
pub(super) fn check_store(st: &TmaStore, turns: Range<u32>) -> Result<(), StoreError> {
    let stores = st.barrier..st.barrier + st.groups;
    let apart = stores.end <= turns.start || turns.end <= stores.start || turns.is_empty();
    if stores.start == 0 || stores.end > NAMED_BARRIERS || !apart {
        return Err(StoreError::Barriers { stores, turns });
    }
    let rows = st.box_dims[0];
    if st.groups == 0 || !rows.is_multiple_of(8 * st.groups) {
        return Err(StoreError::Bands {
            groups: st.groups,
            rows,
        });
    }
    let r = &st.round;
    let at = |step: StoreStep| -> Vec<usize> {
        r.iter()
            .enumerate()
            .filter(|&(_, &s)| s == step)
            .map(|(i, _)| i)
            .collect()
    };
    let (writes, issues) = (at(StoreStep::Write), at(StoreStep::Issue));
    let (&[write], &[issue]) = (&writes[..], &issues[..]) else {
        return Err(StoreError::Shape(r.clone()));
    };
    if write > issue {
        return Err(StoreError::Shape(r.clone()));
    }
    // The first index after `from` (and before `to`) holding `step`.
    let find = |step: StoreStep, from: usize, to: usize| (from..to).find(|&i| r[i] == step);
    let freed = find(StoreStep::WaitRead, 0, write)
        .and_then(|w| find(StoreStep::Sync, w + 1, write))
        .is_some();
    if !freed {
        return Err(StoreError::WriteBeforeFree);
    }
    let visible = find(StoreStep::Fence, write + 1, issue)
        .and_then(|f| find(StoreStep::Sync, f + 1, issue))
        .is_some();
    if !visible {
        return Err(StoreError::StoreBeforeVisible);
    }
    if find(StoreStep::Commit, issue + 1, r.len()).is_none() {
        return Err(StoreError::Uncommitted);
    }
    let waits_only = st
        .finish
        .iter()
        .all(|s| matches!(s, StoreStep::WaitAll | StoreStep::WaitRead));
    if !waits_only || !st.finish.contains(&StoreStep::WaitAll) {
        return Err(StoreError::ExitBeforeStored(st.finish.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::OpId;
    use crate::tma_store::ROUND;

    fn store(round: Vec<StoreStep>, finish: Vec<StoreStep>) -> TmaStore {
        TmaStore {
            store: OpId::from_index(0),
            param: 3,
            lead_dims: 2,
            box_dims: [128, 64],
            swizzle: 128,
            boxes: Vec::new(),
            rounds: 1,
            round,
            finish,
            offset: 0,
            barrier: 3,
            threads: 256,
            groups: 1,
        }
    }

    #[test]
    fn the_pass_protocol_is_proved() {
        assert_eq!(
            check_store(&store(ROUND.to_vec(), vec![StoreStep::WaitAll]), 1..3),
            Ok(())
        );
    }

    #[test]
    fn warpgroups_storing_apart_need_barriers_and_bands_of_their_own() {
        let apart = |barrier, groups| TmaStore {
            barrier,
            groups,
            threads: 128,
            ..store(ROUND.to_vec(), vec![StoreStep::WaitAll])
        };
        assert_eq!(check_store(&apart(3, 2), 1..3), Ok(()));
        for (barrier, groups) in [(2, 2), (0, 2), (15, 2)] {
            assert_eq!(
                check_store(&apart(barrier, groups), 1..3),
                Err(StoreError::Barriers {
                    stores: barrier..barrier + groups,
                    turns: 1..3
                })
            );
        }
        // 120 rows in 2 bands of 60: not whole 8-row atoms.
        assert_eq!(
            check_store(
                &TmaStore {
                    box_dims: [120, 64],
                    ..apart(3, 2)
                },
                1..3
            ),
            Err(StoreError::Bands {
                groups: 2,
                rows: 120
            })
        );
    }

    #[test]
    fn each_broken_round_is_named() {
        use StoreStep::*;
        let without = |gone: usize| {
            let mut r = ROUND.to_vec();
            r.remove(gone);
            r
        };
        let cases: [(Vec<StoreStep>, Vec<StoreStep>, StoreError); 7] = [
            (without(0), vec![WaitAll], StoreError::WriteBeforeFree),
            (without(1), vec![WaitAll], StoreError::WriteBeforeFree),
            (without(3), vec![WaitAll], StoreError::StoreBeforeVisible),
            (without(4), vec![WaitAll], StoreError::StoreBeforeVisible),
            (without(6), vec![WaitAll], StoreError::Uncommitted),
            // The fence after the barrier: a thread may still be writing when the store reads.
            (
                vec![WaitRead, Sync, Write, Sync, Fence, Issue, Commit],
                vec![WaitAll],
                StoreError::StoreBeforeVisible,
            ),
            (
                ROUND.to_vec(),
                vec![WaitRead],
                StoreError::ExitBeforeStored(vec![WaitRead]),
            ),
        ];
        for (round, finish, want) in cases {
            assert_eq!(
                check_store(&store(round.clone(), finish), 1..3),
                Err(want),
                "{round:?}"
            );
        }
        let twice = [ROUND.to_vec(), ROUND.to_vec()].concat();
        assert_eq!(
            check_store(&store(twice.clone(), vec![WaitAll]), 1..3),
            Err(StoreError::Shape(twice))
        );
    }
}
