//! The schedule's barriers, kept in one arena: mbarrier arrays ([`Mbarrier`]: arrival counts,
//! transaction bytes, phases) and named barrier arrays (`bar.sync` ids, whose element an op
//! names relative to the role's replica that runs it, [`Index`]).

use std::fmt;

use crate::arena::{EntityName, Handle};

/// A handle to a barrier of [`super::Sched::barriers`].
pub type BarrierId = Handle<Barrier>;

impl EntityName for Barrier {
    const PREFIX: &'static str = "bar";
}

/// One barrier array of the schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Barrier {
    /// What it is called in dumps and messages (`full`, `acc_empty`, `s_full`, `turn`).
    pub name: &'static str,
    /// For one of a family of barriers (one per Q tile of an attention pair), its index:
    /// printed as `s_full[1]`.
    pub index: Option<u32>,
    /// Its kind and placement.
    pub kind: BarrierKind,
}

/// How a barrier synchronises and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BarrierKind {
    /// An mbarrier array in shared memory.
    Mbarrier(Mbarrier),
    /// Consecutive named barriers (`bar.sync id, threads` / `bar.arrive id, threads`).
    Named {
        /// The first hardware barrier id (0 is the block-wide set-up barrier).
        first: u32,
        /// Barriers in the array (one per replica of the role that uses them).
        ids: u32,
        /// Threads that meet at each.
        threads: u32,
    },
}

/// An mbarrier array: `stages` barriers at consecutive 8-byte slots of shared memory (a
/// single barrier has one stage). Its phases advance per loop iteration (the stage rings and
/// the handoffs inside an iteration) or per work tile (the tiles loaded once per tile and the
/// accumulators handed over once per tile): [`Phase`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mbarrier {
    /// Arrivals that complete a phase (the `mbarrier.init` count).
    pub count: u32,
    /// Barriers in the array.
    pub stages: u32,
    /// What a phase stands for.
    pub phase: Phase,
    /// Byte offset of stage 0 in dynamic shared memory; stage `s` is at `+ 8 s`.
    pub offset: u32,
    /// Which CTAs' arrivals and transactions it hears.
    pub scope: Scope,
    /// Whether it hands tensor memory from one role to another (so a role's tcgen05 ops
    /// before it arrives need `tcgen05.fence::before_thread_sync`, and after a wait
    /// `tcgen05.fence::after_thread_sync`); `false` for a barrier that orders shared memory or
    /// registers alone.
    pub hands_tmem: bool,
}

/// Which CTAs of a cluster an mbarrier hears from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Its own CTA's roles (and TMA multicast into its CTA, which completes on it like a
    /// load of its own).
    Cta,
    /// Every CTA of the cluster arrives on each CTA's copy (a peer's release, a 2-SM commit
    /// multicast to both): a wait on it acquires at cluster scope.
    Cluster,
    /// Every CTA's arrivals and transactions land on the cluster leader's copy (the 2-SM
    /// pair's `full`, which every CTA's TMA completes on, and its `acc_empty`, which every
    /// CTA's epilogue hands back): only the leader announces transaction bytes on it, and a
    /// wait on it acquires at cluster scope.
    Leader,
}

/// What one phase of an mbarrier stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// One loop iteration (counted across the CTA's work tiles): iteration `i` uses stage
    /// `i % stages` and phase `i / stages`.
    Iteration,
    /// One work tile of the CTA: tile `k` uses phase `k`.
    Tile,
}

/// Which element of a named barrier array an op names, relative to the replica of the role
/// running it (an sm_90a consumer warpgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    /// The replica's own.
    Own,
    /// The next replica's (the last's next is the first).
    Next,
}

impl Barrier {
    /// The mbarrier, or `None` for a named barrier.
    pub fn as_mbarrier(&self) -> Option<&Mbarrier> {
        match &self.kind {
            BarrierKind::Mbarrier(m) => Some(m),
            BarrierKind::Named { .. } => None,
        }
    }

    /// The mbarrier, mutably.
    pub fn as_mbarrier_mut(&mut self) -> Option<&mut Mbarrier> {
        match &mut self.kind {
            BarrierKind::Mbarrier(m) => Some(m),
            BarrierKind::Named { .. } => None,
        }
    }

    /// Shared-memory bytes of an mbarrier array (none for named barriers).
    pub fn bytes(&self) -> u32 {
        self.as_mbarrier().map_or(0, |m| 8 * m.stages)
    }
}

impl Mbarrier {
    /// An array of `stages` mbarriers counting `count` arrivals a phase: CTA scope, handing
    /// no tensor memory, not yet placed (offset 0).
    pub fn new(count: u32, stages: u32, phase: Phase) -> Mbarrier {
        Mbarrier {
            count,
            stages,
            phase,
            offset: 0,
            scope: Scope::Cta,
            hands_tmem: false,
        }
    }

    /// Byte offset of stage `stage`.
    pub fn at(&self, stage: u32) -> u32 {
        self.offset + 8 * stage
    }
}

impl fmt::Display for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)?;
        if let Some(i) = self.index {
            write!(f, "[{i}]")?;
        }
        Ok(())
    }
}

impl fmt::Display for BarrierKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BarrierKind::Mbarrier(m) => {
                write!(f, "mbarrier @{} count {}", m.offset, m.count)?;
                if m.stages > 1 {
                    write!(f, " x{} stages", m.stages)?;
                }
                f.write_str(match m.phase {
                    Phase::Iteration => ", phase per iteration",
                    Phase::Tile => ", phase per tile",
                })?;
                if m.hands_tmem {
                    f.write_str(", hands over tmem")?;
                }
                f.write_str(match m.scope {
                    Scope::Cta => "",
                    Scope::Cluster => ", cluster scope",
                    Scope::Leader => ", on the cluster leader",
                })?;
                Ok(())
            }
            BarrierKind::Named {
                first,
                ids,
                threads,
            } => {
                write!(f, "named {first}")?;
                if *ids > 1 {
                    write!(f, "..{}", first + ids)?;
                }
                write!(f, " x{threads} threads")
            }
        }
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Index::Own => "own",
            Index::Next => "next",
        })
    }
}
