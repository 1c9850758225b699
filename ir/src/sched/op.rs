//! The operations of the schedule IR: one vocabulary for every role of every target family.
//!
//! An op is asynchronous where the hardware's instruction is: a TMA load completes on its
//! barrier, a wgmma in its commit group, a `tcgen05.mma` at the `tcgen05.commit` after it, a
//! `tcgen05.ld`/`st` at its wait, a bulk store at its bulk-group wait. What each op reads,
//! writes and signals is stated at its variant; the `protocol_check` pass proves that every
//! asynchronous result is waited for before it is used, and the writers emit exactly these
//! ops. An op that runs a part of the kernel's own code names the [`Region`].

use std::fmt;

use super::barrier::{BarrierId, Index};
use super::region::{MmaPart, Region};
use super::tma::LoadId;
use super::tmem::TmemTileId;

/// One step of a role's program (or of the set-up before the roles split).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    // --- set-up, before the roles split ---
    /// One thread runs `mbarrier.init` on every mbarrier of the arena with its count.
    InitBarriers,
    /// `fence.mbarrier_init.release.cluster`: the inits become visible to the async proxy.
    FenceBarrierInit,
    /// `bar.sync 0`: every thread of the CTA meets (the set-up barrier).
    CtaSync,
    /// `barrier.cluster.arrive.release` + `wait.acquire`: every thread of the cluster meets
    /// (in place of [`Op::CtaSync`] in a clustered schedule, and before a clustered role
    /// exits, so no CTA leaves while a peer may still write its memory or barriers).
    ClusterSync,

    // --- mbarriers ---
    /// A parity wait on `bar` for the phase of iteration `i - lag` (per-iteration barriers)
    /// or of the work tile (per-tile barriers; after the tiles, the phase past the last):
    /// the parity tested is `start` flipped once per completed phase of the barrier's stage.
    /// A `lag` wait with no such iteration in the tile is skipped.
    Wait {
        /// The barrier.
        bar: BarrierId,
        /// The parity of its first phase's wait (1 passes a fresh barrier at once).
        start: u32,
        /// Iterations back.
        lag: u32,
    },
    /// One arrival per arriving unit of the role (its elected thread, or lane 0 of each of
    /// its warps) on `bar` at the stage of iteration `i - lag`; skipped while `i < lag`.
    Arrive {
        /// The barrier.
        bar: BarrierId,
        /// Iterations back.
        lag: u32,
    },
    /// [`Op::Arrive`] on the same barrier of every other CTA of the cluster (`mapa` +
    /// `mbarrier.arrive.release.cluster`).
    ArrivePeer {
        /// The barrier.
        bar: BarrierId,
        /// Iterations back.
        lag: u32,
    },
    /// `mbarrier.arrive.expect_tx`: one arrival plus `bytes` of expected transactions.
    ExpectTx {
        /// The barrier.
        bar: BarrierId,
        /// Announced transaction bytes.
        bytes: u32,
    },

    // --- TMA and the async proxy ---
    /// Every TMA box of a load into its buffer (the iteration's stage), its bytes completing
    /// on the load's barrier.
    Tma {
        /// The load.
        load: LoadId,
    },
    /// Generic-proxy stores (`st.shared`) into the iteration's stage of a load's buffer.
    GenericWrite {
        /// The load whose buffer is written.
        load: LoadId,
    },
    /// `fence.proxy.async.shared::cta`: the thread's generic writes become visible to the
    /// async proxy (TMA, wgmma, tcgen05).
    FenceProxyAsync,

    // --- wgmma (sm_90a) ---
    /// The mmas of a part of the loop body as wgmmas reading the iteration's stages (the
    /// tail's: the previous iteration's); asynchronous until their commit group is waited
    /// for. [`MmaPart::Body`] runs the whole unrotated body around them.
    Wgmma(MmaPart),
    /// `wgmma.commit_group`: the wgmmas since the last commit form one group.
    WgmmaCommit,
    /// `wgmma.wait_group n`: at most `n` committed groups stay in flight.
    WgmmaWait(u32),

    // --- the kernel's own code ---
    /// A region of the kernel's code (see [`Region`]).
    Run(Region),

    // --- named barriers ---
    /// `bar.sync` on an element of a named barrier array, by the replicas `who` names.
    Sync {
        /// The barrier array.
        bar: BarrierId,
        /// Which element.
        index: Index,
        /// Which replicas run it.
        who: Who,
    },
    /// `bar.arrive` on an element of a named barrier array, by the replicas `who` names.
    Signal {
        /// The barrier array.
        bar: BarrierId,
        /// Which element.
        index: Index,
        /// Which replicas run it.
        who: Who,
    },

    // --- tensor memory and tcgen05 (sm_100a) ---
    /// `tcgen05.alloc` of `columns` by the MMA role's warp; the address lands in the shared
    /// slot, which every thread may read once a set-up barrier after a
    /// [`Op::Tcgen05FenceBefore`] and before a [`Op::Tcgen05FenceAfter`] published it.
    TmemAlloc {
        /// Columns (a power of 2 in 32..=512).
        columns: u32,
    },
    /// `tcgen05.relinquish_alloc_permit`: the CTA allocates no more.
    TmemRelinquish,
    /// `tcgen05.dealloc` of `columns` by the whole warp.
    TmemDealloc {
        /// Columns (those allocated).
        columns: u32,
    },
    /// The `tcgen05.mma`s of a part of the loop body for Q tile `tile` (0 outside an
    /// attention pair), issued by one thread into TMEM; asynchronous until a
    /// [`Op::Tcgen05Commit`] after them.
    Tcgen05Mma {
        /// The part.
        part: MmaPart,
        /// The Q tile.
        tile: u32,
    },
    /// `tcgen05.commit` to `bar` at the stage of iteration `i - lag`: one arrival once every
    /// `tcgen05.mma` the thread issued before it has completed (multicast to the cluster's
    /// CTAs in the 2-SM form).
    Tcgen05Commit {
        /// The barrier.
        bar: BarrierId,
        /// Iterations back.
        lag: u32,
    },
    /// `tcgen05.ld.32x32b` of `columns` columns of a TMEM tile from `column` into registers;
    /// asynchronous until [`Op::TmemWaitLoad`].
    TmemLoad {
        /// The tile.
        tile: TmemTileId,
        /// First column within the tile.
        column: u32,
        /// Columns.
        columns: u32,
    },
    /// `tcgen05.st.32x32b` of registers into a TMEM tile (the softmax's `P` over `S`, the
    /// correction's rescaled `O` back where the last [`Op::TmemLoad`] read it); asynchronous
    /// until [`Op::TmemWaitStore`].
    TmemStore {
        /// The tile.
        tile: TmemTileId,
    },
    /// `tcgen05.wait::ld`.
    TmemWaitLoad,
    /// `tcgen05.wait::st`.
    TmemWaitStore,
    /// `tcgen05.fence::before_thread_sync`: the thread's tcgen05 ops are ordered before its
    /// next barrier arrival.
    Tcgen05FenceBefore,
    /// `tcgen05.fence::after_thread_sync`: the thread's tcgen05 ops are ordered after its last
    /// barrier wait.
    Tcgen05FenceAfter,

    // --- the rescale handoff of an attention pair (sm_100a) ---
    /// The softmax writes its rows' rescale factors of Q tile `tile` to the tile's shared
    /// exchange slot (`st.shared`).
    FactorStore {
        /// The Q tile.
        tile: u32,
    },
    /// The correction reads the factors of Q tile `tile` from its slot.
    FactorLoad {
        /// The Q tile.
        tile: u32,
    },
    /// Opens the correction's rescale of `O` of Q tile `tile`: skipped by a warp whose
    /// factors are all 1, and in a tile's first iteration (nothing in `O` yet).
    RescaleBegin {
        /// The Q tile.
        tile: u32,
    },
    /// Multiplies the registers of the last [`Op::TmemLoad`] by the row's factor.
    Rescale {
        /// The Q tile.
        tile: u32,
    },
    /// Closes [`Op::RescaleBegin`].
    RescaleEnd,

    // --- TMA stores (bulk async groups) ---
    /// The issuing thread waits until every earlier bulk store has read its staging tile
    /// (`cp.async.bulk.wait_group.read 0`).
    BulkWaitRead,
    /// Every thread writes its elements of the round's boxes into the staging tile.
    StagingWrite,
    /// The issuing thread stores the round's boxes (`cp.async.bulk.tensor`).
    BulkStore,
    /// The issuing thread closes the round's bulk group (`cp.async.bulk.commit_group`).
    BulkCommit,
    /// The issuing thread waits until every bulk store has completed
    /// (`cp.async.bulk.wait_group 0`).
    BulkWaitAll,
}

impl Op {
    /// A wait on `bar` for the phase of the current iteration (or work tile), its parity
    /// from `start`.
    pub fn wait(bar: BarrierId, start: u32) -> Op {
        Op::Wait { bar, start, lag: 0 }
    }

    /// An arrival on `bar` at the current iteration's stage.
    pub fn arrive(bar: BarrierId) -> Op {
        Op::Arrive { bar, lag: 0 }
    }

    /// A `tcgen05.commit` to `bar` at the current iteration's stage.
    pub fn commit(bar: BarrierId) -> Op {
        Op::Tcgen05Commit { bar, lag: 0 }
    }

    /// `bar.sync` on the role's own element of named barrier array `bar`, by every replica.
    pub fn sync(bar: BarrierId) -> Op {
        Op::Sync {
            bar,
            index: Index::Own,
            who: Who::All,
        }
    }

    /// In a rotated program, how many iterations behind the loop's the iteration is that the
    /// op serves: `Some(0)` for the head's ops, `Some(1)` for the tail's (and a release of
    /// the previous stage), `None` for ops every iteration runs (commits, group waits, turn
    /// barriers, fences).
    pub fn lag(self) -> Option<u32> {
        match self {
            Op::Wgmma(MmaPart::Tail) => Some(1),
            Op::Wait { lag, .. }
            | Op::Arrive { lag, .. }
            | Op::ArrivePeer { lag, .. }
            | Op::Tcgen05Commit { lag, .. } => Some(lag),
            Op::Wgmma(MmaPart::Body | MmaPart::Head)
            | Op::Run(_)
            | Op::Tma { .. }
            | Op::ExpectTx { .. }
            | Op::GenericWrite { .. }
            | Op::Tcgen05Mma { .. } => Some(0),
            Op::WgmmaCommit
            | Op::WgmmaWait(_)
            | Op::FenceProxyAsync
            | Op::Sync { .. }
            | Op::Signal { .. }
            | Op::InitBarriers
            | Op::FenceBarrierInit
            | Op::CtaSync
            | Op::ClusterSync
            | Op::TmemAlloc { .. }
            | Op::TmemRelinquish
            | Op::TmemDealloc { .. }
            | Op::TmemLoad { .. }
            | Op::TmemStore { .. }
            | Op::TmemWaitLoad
            | Op::TmemWaitStore
            | Op::Tcgen05FenceBefore
            | Op::Tcgen05FenceAfter
            | Op::FactorStore { .. }
            | Op::FactorLoad { .. }
            | Op::RescaleBegin { .. }
            | Op::Rescale { .. }
            | Op::RescaleEnd
            | Op::BulkWaitRead
            | Op::StagingWrite
            | Op::BulkStore
            | Op::BulkCommit
            | Op::BulkWaitAll => None,
        }
    }

    /// Whether the op runs in iteration `t` (of `0 ..= trips`) of a rotated program.
    pub fn runs_rotated(self, t: u32, trips: u32) -> bool {
        self.lag().is_none_or(|lag| lag <= t && t < trips + lag)
    }

    /// The barrier the op waits on, arrives on or signals, if any.
    pub fn barrier(mut self) -> Option<BarrierId> {
        self.barrier_mut().copied()
    }

    /// The barrier the op waits on, arrives on or signals, if any, to rename it.
    pub fn barrier_mut(&mut self) -> Option<&mut BarrierId> {
        match self {
            Op::Wait { bar, .. }
            | Op::Arrive { bar, .. }
            | Op::ArrivePeer { bar, .. }
            | Op::ExpectTx { bar, .. }
            | Op::Sync { bar, .. }
            | Op::Signal { bar, .. }
            | Op::Tcgen05Commit { bar, .. } => Some(bar),
            _ => None,
        }
    }
}

impl super::Sched {
    /// `op` as the dump prints it.
    pub fn name(&self, op: Op) -> String {
        Named { op, sched: self }.to_string()
    }

    /// `ops` joined by `; `, as the dump prints them.
    pub fn names(&self, ops: &[Op]) -> String {
        ops.iter()
            .map(|&op| self.name(op))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// An op as the printer writes it: barriers, loads and TMEM tiles by name.
pub struct Named<'a> {
    /// The op.
    pub op: Op,
    /// The schedule whose arenas name its operands.
    pub sched: &'a super::Sched,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.sched;
        let bar = |b: BarrierId| s.barriers[b].to_string();
        let lagged = |b: BarrierId, lag: u32| match lag {
            0 => bar(b),
            l => format!("{}[i-{l}]", bar(b)),
        };
        match self.op {
            Op::InitBarriers => f.write_str("mbarrier.init"),
            Op::FenceBarrierInit => f.write_str("fence.mbarrier_init"),
            Op::CtaSync => f.write_str("bar.sync 0"),
            Op::ClusterSync => f.write_str("barrier.cluster"),
            Op::Wait { bar: b, start, lag } => {
                write!(f, "wait {}(phase from {start}", bar(b))?;
                if lag > 0 {
                    write!(f, ", i-{lag}")?;
                }
                f.write_str(")")
            }
            Op::Arrive { bar: b, lag } => write!(f, "arrive {}", lagged(b, lag)),
            Op::ArrivePeer { bar: b, lag } => write!(f, "arrive.peer {}", lagged(b, lag)),
            Op::ExpectTx { bar: b, bytes } => write!(f, "arrive.expect_tx {} {bytes}B", bar(b)),
            Op::Tma { load } => write!(f, "tma {load}"),
            Op::GenericWrite { load } => write!(f, "st.shared {load}"),
            Op::FenceProxyAsync => f.write_str("fence.proxy.async"),
            Op::Wgmma(MmaPart::Body) => f.write_str("wgmma"),
            Op::Wgmma(MmaPart::Head) => f.write_str("wgmma head[i]"),
            Op::Wgmma(MmaPart::Tail) => f.write_str("wgmma tail[i-1]"),
            Op::WgmmaCommit => f.write_str("commit"),
            Op::WgmmaWait(n) => write!(f, "wait_group {n}"),
            Op::Run(Region::Between) => f.write_str("between[i]"),
            Op::Run(Region::Handoff) => f.write_str("handoff[i]"),
            Op::Run(Region::Epilogue(None)) => f.write_str("epilogue"),
            Op::Run(Region::Epilogue(Some((column, columns)))) => {
                write!(f, "epilogue cols {column}..{}", column + columns)
            }
            Op::Sync { bar: b, index, who } => write!(f, "bar.sync {}.{index}{who}", bar(b)),
            Op::Signal { bar: b, index, who } => {
                write!(f, "bar.arrive {}.{index}{who}", bar(b))
            }
            Op::TmemAlloc { columns } => write!(f, "tmem.alloc {columns} cols"),
            Op::TmemRelinquish => f.write_str("tmem.relinquish_alloc_permit"),
            Op::TmemDealloc { columns } => write!(f, "tmem.dealloc {columns} cols"),
            Op::Tcgen05Mma { part, tile } => {
                write!(f, "tcgen05.mma {part}")?;
                if s.work_tiles > 1 {
                    write!(f, "[q{tile}]")?;
                }
                Ok(())
            }
            Op::Tcgen05Commit { bar: b, lag } => write!(f, "tcgen05.commit {}", lagged(b, lag)),
            Op::TmemLoad {
                tile,
                column,
                columns,
            } => write!(f, "tcgen05.ld {}[{column}+{columns}]", tmem_tile(s, tile)),
            Op::TmemStore { tile } => write!(f, "tcgen05.st {}", tmem_tile(s, tile)),
            Op::TmemWaitLoad => f.write_str("wait::ld"),
            Op::TmemWaitStore => f.write_str("wait::st"),
            Op::Tcgen05FenceBefore => f.write_str("fence::before"),
            Op::Tcgen05FenceAfter => f.write_str("fence::after"),
            Op::FactorStore { tile } => write!(f, "st.shared factors[{tile}]"),
            Op::FactorLoad { tile } => write!(f, "ld.shared factors[{tile}]"),
            Op::RescaleBegin { tile } => write!(f, "rescale O{tile} {{"),
            Op::Rescale { .. } => f.write_str("mul"),
            Op::RescaleEnd => f.write_str("}"),
            Op::BulkWaitRead => f.write_str("wait_group.read 0"),
            Op::StagingWrite => f.write_str("write"),
            Op::BulkStore => f.write_str("tma store"),
            Op::BulkCommit => f.write_str("commit_group"),
            Op::BulkWaitAll => f.write_str("wait_group 0"),
        }
    }
}

fn tmem_tile(s: &super::Sched, tile: TmemTileId) -> String {
    s.tmem
        .as_ref()
        .and_then(|t| t.tiles.get(tile.0))
        .map_or_else(|| format!("tmem{}", tile.0), ToString::to_string)
}

/// Which replicas of a role run an op (the consumer warpgroups taking turns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// Every replica.
    All,
    /// Replica 0, which takes the first turn.
    Leader,
    /// The last replica, whose turn passes to the leader.
    Last,
}

impl Who {
    /// Whether replica `r` of `replicas` runs an op for `self`.
    pub fn includes(self, r: u32, replicas: u32) -> bool {
        match self {
            Who::All => true,
            Who::Leader => r == 0,
            Who::Last => r + 1 == replicas,
        }
    }
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Who::All => "",
            Who::Leader => "(leader)",
            Who::Last => "(last)",
        })
    }
}
