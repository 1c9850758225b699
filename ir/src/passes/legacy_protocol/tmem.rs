//! The sm_100a rules: how the MMA warp and the epilogue share the tensor-memory accumulator
//! of a [`TmemPlan`] (see the parent module's doc for the list).

use super::ProtocolError;
use crate::ring::{Bar, Ring, Step};
use crate::tmem::{AccBar, TMEM_COLUMNS, TmemPlan, TmemStep};

/// A broken TMEM protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TmemError {
    /// The allocation is not a power of 2 in 32..=512 columns, or smaller than the
    /// accumulator.
    #[error(
        "TMEM allocation of {columns} columns for a {acc}-column accumulator: it must be a power of 2 from 32 to {TMEM_COLUMNS} holding the accumulator"
    )]
    Columns {
        /// Columns allocated.
        columns: u32,
        /// The accumulator's columns.
        acc: u32,
    },
    /// The MMA warp's lifecycle (alloc, relinquish, publish, mainloop, commit, wait for the
    /// epilogue, dealloc) is out of order or incomplete.
    #[error("the TMEM-owning MMA warp must {0}")]
    Owner(&'static str),
    /// Another warp allocates, frees or gives up the permit.
    #[error("`{0}` in the epilogue: TMEM is allocated and freed by the MMA warp alone")]
    NotOwner(TmemStep),
    /// A ring stage is released by something other than a `tcgen05.commit`.
    #[error(
        "the MMA thread releases a stage with `{0}`; only tcgen05.commit arrives after the tcgen05.mma reading it completes"
    )]
    PlainRelease(Step),
    /// The epilogue reads the accumulator before it is committed and waited for.
    #[error("the epilogue runs `{0}` before waiting on acc_full and fencing after it")]
    LoadBeforeCommit(TmemStep),
    /// Registers copied by `tcgen05.ld` are used or handed back before `tcgen05.wait::ld`.
    #[error(
        "the epilogue runs `{0}` while a tcgen05.ld may still be in flight (tcgen05.wait::ld missing)"
    )]
    LoadNotWaited(TmemStep),
    /// TMEM is handed back to the owner without `fence::before_thread_sync`.
    #[error("the epilogue arrives on acc_empty without tcgen05.fence::before_thread_sync")]
    Unfenced,
    /// The epilogue does not hand TMEM back exactly once, after its copies: the owner's wait
    /// on `acc_empty` would hang, or pass while a copy still reads.
    #[error("each epilogue warp must arrive on acc_empty exactly once, after tcgen05.wait::ld")]
    NoHandBack,
    /// The ring and the TMEM plan disagree on the 2-SM form.
    #[error("the ring is {ring} and the TMEM plan {plan}: both or neither are the 2-SM form")]
    PairMismatch {
        /// How the ring is scheduled.
        ring: &'static str,
        /// How the plan is.
        plan: &'static str,
    },
    /// The 2-SM pair's CTAs do not allocate and free the same columns.
    #[error(
        "the 2-SM pair allocates {columns} columns together (cta_group::2 allocations are \
         collective) but the peer CTA frees {peer:?}"
    )]
    PairColumns {
        /// Columns the pair allocates.
        columns: u32,
        /// What the peer's MMA warp frees.
        peer: Vec<u32>,
    },
    /// The peer CTA of a 2-SM pair issues mma work.
    #[error("`{0}` in the peer CTA's MMA warp: only the leader issues the pair's tcgen05.mma")]
    PeerIssues(TmemStep),
    /// A 2-SM commit does not reach every CTA of the pair.
    #[error(
        "the 2-SM pair's {what} commit arrives on the CTAs {mask:#b}; it must reach both \
         ({all:#b}), whose {what} it releases"
    )]
    CommitMask {
        /// Which commit.
        what: &'static str,
        /// Its `ctaMask`.
        mask: u16,
        /// Both CTAs.
        all: u16,
    },
    /// A CTA of the 2-SM pair frees TMEM before the cluster barrier.
    #[error(
        "the {cta} CTA's MMA warp frees TMEM without a cluster barrier before it: the leader's \
         mmas or the other CTA's copies may still use the columns"
    )]
    PairExit {
        /// Which CTA (leader or peer).
        cta: &'static str,
    },
    /// The epilogue does not copy every accumulator column exactly once.
    #[error(
        "the epilogue's tcgen05.ld copies columns {got:?} in each of {warpgroups} warpgroups (warpgroup g at + g x {block}); the accumulator has {acc}, column {column} is copied {times} times"
    )]
    Coverage {
        /// `(first column, columns)` of each load.
        got: Vec<(u32, u32)>,
        /// The epilogue's warpgroups.
        warpgroups: u32,
        /// The columns between two warpgroups' blocks.
        block: u32,
        /// The accumulator's columns.
        acc: u32,
        /// The first column not copied exactly once (or copied past the accumulator).
        column: u32,
        /// How many times it is copied.
        times: u32,
    },
    /// The epilogue copies from TMEM after handing it back: the next tile's mmas may already
    /// overwrite the accumulator.
    #[error(
        "the epilogue runs `{0}` after arriving on acc_empty: the next tile's mmas may overwrite the accumulator it copies"
    )]
    LoadAfterHandBack(TmemStep),
    /// The code after the loop reads a column before the epilogue copies it.
    #[error("the epilogue runs `{read}` before a tcgen05.ld copies column {column}")]
    ReadBeforeLoad {
        /// The read.
        read: TmemStep,
        /// The first column not copied yet.
        column: u32,
    },
    /// The code after the loop does not read every column of the block exactly once.
    #[error(
        "the epilogue's code after the loop reads columns {got:?} of each {block}-column block; column {column} is read {times} times"
    )]
    ReadCoverage {
        /// `(first column, columns)` of each read.
        got: Vec<(u32, u32)>,
        /// The columns of a warpgroup's block.
        block: u32,
        /// The first column not read exactly once (or read past the block).
        column: u32,
        /// How many times it is read.
        times: u32,
    },
    /// The epilogue is not whole warpgroups: some TMEM lane quarter of a column block has no
    /// warp to read it (warp `w` reaches only lanes `32 (w % 4) ..`).
    #[error(
        "{0} epilogue warps: every warpgroup of 4 reads all 128 TMEM lanes of its column block"
    )]
    Lanes(u32),
}

/// Checks the plan against its ring.
pub(super) fn check_tmem(ring: &Ring, plan: &TmemPlan) -> Result<(), ProtocolError> {
    let acc = plan.acc_columns;
    if !plan.columns.is_power_of_two()
        || !(32..=TMEM_COLUMNS).contains(&plan.columns)
        || acc > plan.columns
    {
        return Err(TmemError::Columns {
            columns: plan.columns,
            acc,
        }
        .into());
    }
    for s in ring.consumer.iter().chain(&ring.consumer_drain) {
        if matches!(
            s,
            Step::Arrive {
                bar: Bar::Empty,
                ..
            } | Step::Commit
                | Step::WaitGroup(_)
        ) {
            return Err(TmemError::PlainRelease(*s).into());
        }
    }
    // The epilogue first: a free or an allocation there names the warp that should own it.
    check_epilogue(plan)?;
    check_owner(plan)?;
    check_pair(ring, plan)
}

/// The 2-SM form's rules: the ring and the plan are paired together; both CTAs free the
/// columns they allocated together, each after a cluster barrier (the leader's after its
/// wait for both CTAs' last copies); the peer issues no mma; every commit, the stages' and
/// `acc_full`'s, reaches both CTAs.
fn check_pair(ring: &Ring, plan: &TmemPlan) -> Result<(), ProtocolError> {
    let form = |paired: bool| if paired { "paired" } else { "not paired" };
    let cluster = ring
        .cluster
        .as_ref()
        .and_then(|c| c.pair.map(|p| (c.all(), p)));
    let ((all, ring_pair), pair) = match (cluster, &plan.pair) {
        (Some(c), Some(p)) => (c, p),
        (None, None) => return Ok(()),
        (c, p) => {
            return Err(TmemError::PairMismatch {
                ring: form(c.is_some()),
                plan: form(p.is_some()),
            }
            .into());
        }
    };
    for (what, mask) in [
        ("stage", ring_pair.commit_mask),
        ("acc_full", pair.commit_mask),
    ] {
        if mask != all {
            return Err(TmemError::CommitMask { what, mask, all }.into());
        }
    }
    if let Some(s) = pair.peer_exit.iter().find(|s| {
        matches!(
            s,
            TmemStep::Mainloop | TmemStep::CommitAcc | TmemStep::Alloc { .. }
        )
    }) {
        return Err(TmemError::PeerIssues(*s).into());
    }
    let frees = |steps: &[TmemStep]| -> Vec<u32> {
        steps
            .iter()
            .filter_map(|s| match s {
                TmemStep::Dealloc { columns } => Some(*columns),
                _ => None,
            })
            .collect()
    };
    let peer = frees(&pair.peer_exit);
    if peer != [plan.columns] {
        return Err(TmemError::PairColumns {
            columns: plan.columns,
            peer,
        }
        .into());
    }
    let synced = |steps: &[TmemStep]| {
        let at = |s: TmemStep| steps.iter().position(|x| *x == s);
        matches!(
            (at(TmemStep::ClusterSync), at(TmemStep::Dealloc { columns: plan.columns })),
            (Some(sync), Some(free)) if sync < free
        )
    };
    for (cta, steps) in [("leader", &plan.mma_exit), ("peer", &pair.peer_exit)] {
        if !synced(steps) {
            return Err(TmemError::PairExit { cta }.into());
        }
    }
    Ok(())
}

/// The MMA warp's set-up allocates once, relinquishes the permit and publishes the address;
/// per tile its thread waits (from parity 1) until the previous accumulator was copied out
/// and fences after the wait, runs the mainloop and commits the accumulator to `acc_full`
/// once; after the tiles it waits the same way for the last copy, fences and frees what it
/// allocated.
fn check_owner(plan: &TmemPlan) -> Result<(), ProtocolError> {
    let err = |m| Err(TmemError::Owner(m).into());
    let (alloc, dealloc) = (
        TmemStep::Alloc {
            columns: plan.columns,
        },
        TmemStep::Dealloc {
            columns: plan.columns,
        },
    );
    if plan.setup != [alloc, TmemStep::Relinquish, TmemStep::Publish] {
        return err(
            "allocate the accumulator's columns once, relinquish the allocation permit and \
             publish the address before the roles split",
        );
    }
    let drained = TmemStep::Wait {
        bar: AccBar::Empty,
        start: 1,
    };
    let tile = &plan.mma_tile;
    let at = |s: TmemStep| tile.iter().position(|x| *x == s);
    let once = |s: TmemStep| tile.iter().filter(|x| **x == s).count() == 1;
    let (Some(mainloop), Some(commit)) = (at(TmemStep::Mainloop), at(TmemStep::CommitAcc)) else {
        return err("run the mainloop and commit the accumulator to acc_full in every tile");
    };
    if commit < mainloop || !once(TmemStep::CommitAcc) || !once(TmemStep::Mainloop) {
        return err("commit the accumulator to acc_full once per tile, after the mainloop");
    }
    let fenced_wait = |steps: &[TmemStep], before: usize| {
        steps[..before]
            .iter()
            .position(|x| *x == drained)
            .is_some_and(|w| steps[w + 1..before].contains(&TmemStep::FenceAfter))
    };
    if !fenced_wait(tile, mainloop) {
        return err(
            "wait on acc_empty (from parity 1) and fence after it before a tile's mmas \
             overwrite the accumulator",
        );
    }
    if let Some(s) = tile
        .iter()
        .chain(&plan.mma_exit)
        .find(|s| matches!(s, TmemStep::Alloc { .. } | TmemStep::Relinquish))
    {
        return Err(TmemError::NotOwner(*s).into());
    }
    let Some(free) = plan.mma_exit.iter().position(|x| *x == dealloc) else {
        return err("free the columns it allocated after its last tile");
    };
    if tile.contains(&dealloc) || !fenced_wait(&plan.mma_exit, free) {
        return err(
            "wait on acc_empty (the epilogue's last copy is done) and fence after it before \
             freeing the columns",
        );
    }
    Ok(())
}

/// Per tile the epilogue waits (from parity 0) on `acc_full` and fences after it before its
/// first `tcgen05.ld`; the loads copy every column once; `tcgen05.wait::ld` comes before the
/// registers are read and before TMEM is handed back (fenced) on `acc_empty`, once, after the
/// last load; the reads cover each block once, every column after its copy; it never
/// allocates or frees.
fn check_epilogue(plan: &TmemPlan) -> Result<(), ProtocolError> {
    let published = plan.setup.contains(&TmemStep::Publish);
    let (mut waited, mut fenced) = (false, false);
    let (mut pending, mut before_sync, mut handed_back) = (false, false, false);
    let mut loads = Vec::new();
    // `(first column, columns)` of each read, and the first read of a column no earlier
    // load copied (reported once the loads are known to cover the accumulator).
    let (mut reads, mut early) = (Vec::new(), None);
    for &s in &plan.epilogue {
        match s {
            TmemStep::Alloc { .. } | TmemStep::Dealloc { .. } | TmemStep::Relinquish => {
                return Err(TmemError::NotOwner(s).into());
            }
            TmemStep::Publish => {}
            TmemStep::Wait {
                bar: AccBar::Full,
                start: 0,
            } => waited = true,
            TmemStep::FenceAfter => fenced = waited,
            TmemStep::Load { column, columns } => {
                if !(published && waited && fenced) {
                    return Err(TmemError::LoadBeforeCommit(s).into());
                }
                if handed_back {
                    return Err(TmemError::LoadAfterHandBack(s).into());
                }
                loads.push((column, columns));
                pending = true;
                before_sync = false;
            }
            TmemStep::WaitLoad => pending = false,
            TmemStep::FenceBefore => before_sync = true,
            TmemStep::Read { .. } | TmemStep::Arrive { bar: AccBar::Empty } if pending => {
                return Err(TmemError::LoadNotWaited(s).into());
            }
            TmemStep::Arrive { bar: AccBar::Empty } if !before_sync => {
                return Err(TmemError::Unfenced.into());
            }
            TmemStep::Arrive { bar: AccBar::Empty } => handed_back = true,
            TmemStep::Read { column, columns } => {
                let copied = |c: u32| loads.iter().any(|&(l, n)| (l..l + n).contains(&c));
                let missing = (column..column + columns).find(|&c| !copied(c));
                early = early.or(missing.map(|c| (s, c)));
                reads.push((column, columns));
            }
            TmemStep::Arrive { .. }
            | TmemStep::Wait { .. }
            | TmemStep::Mainloop
            | TmemStep::CommitAcc
            | TmemStep::ClusterSync => {}
        }
    }
    if pending {
        // The registers are the loop's result, which the code after the loop reads.
        let read = TmemStep::Read {
            column: 0,
            columns: plan.block_columns(),
        };
        return Err(TmemError::LoadNotWaited(read).into());
    }
    let hand_back = TmemStep::Arrive { bar: AccBar::Empty };
    if plan.epilogue.iter().filter(|s| **s == hand_back).count() != 1 {
        return Err(TmemError::NoHandBack.into());
    }
    let warps = plan.roles.epilogue_warps;
    if warps == 0 || !warps.is_multiple_of(4) {
        return Err(TmemError::Lanes(warps).into());
    }
    // Warpgroup g copies each load's columns + g x block: count every column's copies.
    let (warpgroups, block) = (plan.epilogue_warpgroups(), plan.block_columns());
    let mut times: Vec<u32> = vec![0; plan.acc_columns as usize];
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
    let wrong = (0..plan.acc_columns)
        .zip(&times)
        .find(|&(_, &t)| t != 1)
        .map(|(c, &t)| (c, t))
        .or(past.map(|c| (c, 1)));
    if let Some((column, times)) = wrong {
        return Err(TmemError::Coverage {
            got: loads,
            warpgroups,
            block,
            acc: plan.acc_columns,
            column,
            times,
        }
        .into());
    }
    if let Some((read, column)) = early {
        return Err(TmemError::ReadBeforeLoad { read, column }.into());
    }
    check_reads(reads, block)
}

/// The reads (`(first column, columns)` each) cover a `block`-column block once.
fn check_reads(got: Vec<(u32, u32)>, block: u32) -> Result<(), ProtocolError> {
    let times = |c: u32| {
        got.iter()
            .filter(|&&(r, n)| (r..r + n).contains(&c))
            .count() as u32
    };
    // A read past the block reads the next warpgroup's column `block` first.
    let past = got.iter().any(|&(r, n)| r + n > block);
    let wrong = (0..block)
        .map(|c| (c, times(c)))
        .find(|&(_, t)| t != 1)
        .or(past.then_some((block, 1)));
    match wrong {
        None => Ok(()),
        Some((column, times)) => Err(TmemError::ReadCoverage {
            got,
            block,
            column,
            times,
        }
        .into()),
    }
}
