//! The `protocol_check` pass (sm_90a, sm_100a): proves the stage rings' barrier protocol
//! before any PTX is written. A violation is a compiler error, not a hang on the GPU.
//!
//! Static rules, per [`Ring`]:
//! - set-up is `mbarrier.init`, then `fence.mbarrier_init`, then `bar.sync`;
//! - the producer's wait on `empty` starts at parity 1, the consumers' wait on `full` at 0;
//! - every load of the ring is issued once per iteration, after the producer's `empty` wait,
//!   and the bytes announced on `full` equal the bytes of every box signalling it;
//! - the wgmmas run after the consumers' `full` wait;
//! - once loads (tiles loaded before the loop) are issued once each by the producer's once
//!   program, which announces exactly their bytes on the single-phase `once` barrier, and the
//!   consumers' once program waits on it (parity 0) before their loop; no per-iteration step
//!   touches `once`;
//! - every generic-proxy write to a stage is followed by `fence.proxy.async` before the async
//!   proxy can read it (the wgmma, or a release to another role).
//!
//! - a loop the `overlap` pass rotated issues its head and tail mmas, its code between and its
//!   handoff once per iteration, and turn barriers appear only when its warpgroups ping-pong.
//!
//! - in a split ring (the tail's loads on `tail_full` / `tail_empty`), each `full` array is
//!   announced exactly its loads' bytes, each load is issued after the producer's wait on its
//!   `empty` array, and the arrays' waits start at the usual parities; other rings never name
//!   them;
//! - a persistent ring's producer waits on `once_free` (from parity 1) before its once loads
//!   and the consumers' release program only arrives on it; other rings never touch it.
//!
//! Dynamic rules: the producer and the consumers (each consumer warpgroup on its own when they
//! ping-pong) are executed on an abstract machine with mbarrier semantics (pending arrivals,
//! transaction bytes, completed phases, parity waits), named turn barriers (a generation
//! completes when two warpgroups arrived: the one whose turn it is and the one before it in
//! the round-robin order, of two or three) and wgmma groups, for every trip count from 0 to
//! `2 * stages + 1`, which covers a cold ring, the first wrap of every stage and a second
//! wrap; a rotated program runs its prologue, steady and epilogue iterations. A persistent
//! ring also runs sequences of three work tiles of those trip counts, its stages, phases and
//! once barriers carried from tile to tile. It fails when
//! the roles deadlock (a wait without its arrive, too few bytes, warpgroups waiting for each
//! other's turn), a barrier gets more arrivals than its count, a parity wait would pass on a
//! different phase than the one it means (phases disagree), a stage is released before the
//! wgmma reading it has completed (`wgmma.wait_group`), TMA refills a stage before the
//! consumers released it, a turn is passed to nobody or left pending at the end, a wgmma's
//! registers are read or overwritten before their group is waited for (the code between
//! reading the head's products, the rescale of the accumulator, the handoff of `P`), a wgmma
//! reads a stage whose `full` wait has not passed for that iteration, or the once tiles are
//! released while a wgmma reads them or reloaded before they were released.
//!
//! A clustered ring ([`crate::cluster`], [`ClusterError`]): its set-up synchronises the
//! cluster after the inits; `empty` counts both CTAs' consumer releases; every box of the
//! shared load is issued by one CTA and lands in all (so each `full` gets the bytes it
//! announces, which the machine also sees). Its machine runs both CTAs: a multicast that
//! refills a peer's stage before that CTA's consumers released it, and a remote arrival or
//! multicast reaching a CTA that exited (no cluster barrier before exit), fail it.
//!
//! The TMA stores of the epilogue ([`crate::tma_store`]): per round the staging tile is freed
//! (the issuing thread's `wait_group.read`, a barrier) before it is written, fenced to the
//! async proxy with a barrier after before it is stored, and the store committed; the
//! consumers wait for every store before they exit ([`StoreError`]).
//!
//! sm_100a: the ring runs on the same machine with the MMA thread as its one consumer, each
//! `tcgen05.commit` arriving once every `tcgen05.mma` before it has completed (so a stage
//! released by a plain arrive while an mma may read it is an early release). Then the
//! [`TmemPlan`]'s rules ([`TmemError`]): the allocation is a power of 2 of at most 512
//! columns holding the accumulator; the MMA warp allocates once, relinquishes the permit and
//! publishes the address before the roles split; per work tile its thread waits on
//! `acc_empty` from parity 1 (the previous tile's copy is out) and fences before the mmas,
//! and commits the accumulator to `acc_full` once after the mainloop; after the tiles it
//! frees its columns only after the same wait and a fence; no other warp allocates or frees;
//! the ring's stages are released only by `tcgen05.commit`; per tile the epilogue waits on
//! `acc_full` from parity 0 and fences before its first `tcgen05.ld`, copies every column
//! once, waits for the copies (`tcgen05.wait::ld`) before the registers are read or TMEM is
//! handed back on `acc_empty` (once, fenced before, with no copy after it), and reads every
//! column of its block once, after its copy (whole, or chunk by chunk). A persistent ring's
//! machine runs sequences of work tiles as on sm_90a.
//!
//! The sm_100a 2-SM pair ([`crate::cluster::Pair`]): the cluster's set-up and exit barrier as
//! above, `empty` counting the leader's one multicast commit, the leader announcing both CTAs'
//! bytes on its `full`; the TMEM plan is paired with the ring, both CTAs free the columns they
//! allocate together, each after a cluster barrier, the peer issues no mma, and every commit
//! (the stages' and `acc_full`'s) reaches both CTAs. Its machine runs both CTAs, only the
//! leader consuming: each CTA's TMA completes on the leader's `full`, each commit arrives on
//! both CTAs' barrier, and a TMA that refills a stage before the pair's mma that read it
//! completed (or was committed to that CTA) fails it.
//!
//! sm_100a attention ([`AttentionPlan`]): the ring's set-up and static rules, then the
//! schedule's own ([`AttentionError`], module `tmem_attention`): TMEM ownership as above, only
//! the MMA thread signalling and only by `tcgen05.commit`, every `tcgen05.ld`/`st` waited
//! before its registers are used or TMEM is handed on, the tcgen05 fence pairs around every
//! handoff, and an abstract execution of the load warp, the MMA thread, both softmax
//! warpgroups and the correction warpgroup with vector clocks, in which every access to S/P,
//! O, the rescale factors, the Q tiles and the K/V stages must be ordered after the previous
//! conflicting one by a barrier.

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::ring::{Bar, InitStep, Ring, Roles, Step};
use crate::target::Target;
use crate::tmem::TmemPlan;
use crate::tmem::attention::AttentionPlan;

mod cluster;
pub(crate) mod machine;
mod rules;
#[cfg(test)]
mod tests;
mod tma_store;
mod tmem;
pub(crate) mod tmem_attention;

pub use cluster::ClusterError;
pub use tma_store::StoreError;
pub use tmem::TmemError;
pub use tmem_attention::AttentionError;

use machine::Machine;
use rules::{check_init, check_static};

/// A broken ring protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The set-up does not init, fence and synchronise in that order.
    #[error(
        "barrier set-up must be mbarrier.init, fence.mbarrier_init, bar.sync in that order; got {0:?}"
    )]
    Init(Vec<InitStep>),
    /// A wait starts at the wrong parity.
    #[error(
        "the {role}'s wait on `{bar}` starts at phase parity {start}; it must start at {expected}"
    )]
    StartPhase {
        /// `producer` or `consumer`.
        role: &'static str,
        /// The barrier array.
        bar: Bar,
        /// The parity in the program.
        start: u32,
        /// The parity the protocol needs.
        expected: u32,
    },
    /// The announced transaction bytes differ from the boxes' bytes.
    #[error(
        "the producer announces {announced} transaction bytes on `full` but its TMA boxes carry {boxes}"
    )]
    TxBytes {
        /// Bytes in `arrive.expect_tx`.
        announced: u32,
        /// Bytes of every box signalling `full`.
        boxes: u32,
    },
    /// A load of the ring is not issued exactly once per iteration.
    #[error("ring load {load} is issued {times} times per iteration; it must be issued once")]
    LoadCount {
        /// Index into the ring's loads.
        load: usize,
        /// How often the producer issues it.
        times: usize,
    },
    /// A step touches a stage before the wait that makes it safe.
    #[error("the {role} runs `{step}` before waiting on `{bar}`")]
    BeforeWait {
        /// `producer` or `consumer`.
        role: &'static str,
        /// The step.
        step: Step,
        /// The barrier it must wait on first.
        bar: Bar,
    },
    /// A generic-proxy write reaches the async proxy without a fence.
    #[error(
        "the {role} writes stage buffer {load} through the generic proxy and `{step}` follows without fence.proxy.async"
    )]
    Unfenced {
        /// `producer` or `consumer`.
        role: &'static str,
        /// Index into the ring's loads.
        load: usize,
        /// The step that would expose the write.
        step: String,
    },
    /// More arrivals than the barrier's count in one phase.
    #[error("`{bar}[{stage}]` receives more arrivals than its count {count} in one phase")]
    TooManyArrivals {
        /// The barrier array.
        bar: Bar,
        /// The stage.
        stage: u32,
        /// Its init count.
        count: u32,
    },
    /// A parity wait would pass or block on another phase than the one it means.
    #[error(
        "phases disagree: the {role}'s wait on `{bar}[{stage}]` in iteration {iteration} tests parity {parity} after {completed} completed phase(s) but needs {needed}"
    )]
    Phase {
        /// `producer` or `consumer`.
        role: &'static str,
        /// The barrier array.
        bar: Bar,
        /// The stage.
        stage: u32,
        /// The loop iteration.
        iteration: u32,
        /// The parity tested.
        parity: u32,
        /// Phases completed so far.
        completed: u32,
        /// Phases the wait needs completed.
        needed: u32,
    },
    /// A stage is released while a wgmma group reading it may still run.
    #[error(
        "iteration {iteration} releases the stage of iteration {released} on `empty` before the wgmma reading it has completed (wgmma.wait_group too weak)"
    )]
    EarlyRelease {
        /// The releasing iteration.
        iteration: u32,
        /// The iteration whose stage is released.
        released: u32,
    },
    /// A wgmma reads a stage before the wait that shows its data landed.
    #[error(
        "a wgmma reads the stage of iteration {iteration} before the consumers' wait on `{bar}` for it passed"
    )]
    ReadBeforeWait {
        /// The iteration whose stage is read.
        iteration: u32,
        /// The `full` array it lands on.
        bar: Bar,
    },
    /// TMA overwrites a stage the consumers have not released.
    #[error(
        "TMA refills the stage of iteration {previous} in iteration {iteration} before the consumers released it"
    )]
    Overwrite {
        /// The refilling iteration.
        iteration: u32,
        /// The iteration that used the stage before.
        previous: u32,
    },
    /// The code between a rotated loop's mmas reads the head's products before they are
    /// waited for.
    #[error(
        "the code between the mmas of iteration {iteration} reads the head mma's products before wgmma.wait_group shows them complete"
    )]
    ReadsInFlight {
        /// The iteration.
        iteration: u32,
    },
    /// The carried accumulator is rescaled while the previous tail wgmma may still write it.
    #[error(
        "iteration {iteration} rescales the carried accumulator while the previous tail wgmma may still write it (wgmma.wait_group missing)"
    )]
    AccumulatorInFlight {
        /// The iteration.
        iteration: u32,
    },
    /// The handoff overwrites the registers a tail wgmma still reads.
    #[error(
        "iteration {iteration} hands P to the next tail while the tail wgmma reading the previous P may still run"
    )]
    HandoffInFlight {
        /// The iteration.
        iteration: u32,
    },
    /// A turn barrier generation completed with no warpgroup waiting on it.
    #[error(
        "broken ping-pong order: turn barrier {barrier} completed with no warpgroup waiting for its turn"
    )]
    TurnLost {
        /// The turn barrier (warpgroup index).
        barrier: u32,
    },
    /// A turn barrier is left mid-generation when the loop ends.
    #[error(
        "broken ping-pong order: turn barrier {barrier} is left with arrivals no warpgroup waits for"
    )]
    TurnUnbalanced {
        /// The turn barrier (warpgroup index).
        barrier: u32,
    },
    /// The split barrier arrays of a ring's tail loads are misused.
    #[error("split ring: {0}")]
    Split(String),
    /// A rotated program's steps are not the rotation's.
    #[error("rotated loop: {0}")]
    Rotation(String),
    /// The once loads or the `once` barrier are misused.
    #[error("once loads: {0}")]
    Once(#[from] OnceError),
    /// The consumers release a tile's once loads while a wgmma reading them may still run.
    #[error(
        "tile {tile}'s consumers release the once tiles on `once_free` before the wgmmas reading them completed"
    )]
    OnceReleasedEarly {
        /// The work tile.
        tile: u32,
    },
    /// TMA reloads the once tiles before the consumers released the previous tile's.
    #[error(
        "TMA reloads the once tiles for tile {tile} before the consumers released the previous tile's"
    )]
    OnceOverwrite {
        /// The work tile being loaded.
        tile: u32,
    },
    /// The cluster-scope protocol of a clustered ring is broken.
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterError),
    /// The tensor-memory protocol of sm_100a is broken.
    #[error("tensor memory: {0}")]
    Tmem(#[from] TmemError),
    /// The sm_100a attention schedule's protocol is broken (boxed: its races name two
    /// accesses, and every other error stays small).
    #[error("attention schedule: {0}")]
    Attention(Box<AttentionError>),
    /// Neither role can move.
    #[error(
        "deadlock with trip counts {tiles:?} (one per work tile): producer {producer}, consumers {consumer}"
    )]
    Deadlock {
        /// The trip count of each work tile simulated.
        tiles: Vec<u32>,
        /// Where the producer stands.
        producer: String,
        /// Where the consumers stand.
        consumer: String,
    },
}

/// A misuse of a ring's once loads or its single-phase `once` barrier.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OnceError {
    /// Once programs exist but the ring has no once load.
    #[error("once programs without once loads")]
    ProgramsWithoutLoads,
    /// A per-iteration step touches the `once` barrier or issues a once load.
    #[error("`{step}` runs every iteration; the once barrier has a single phase")]
    EveryIteration {
        /// The step.
        step: Step,
    },
    /// The producer's once program does something besides announcing and issuing.
    #[error("the producer's once program may only announce and issue once loads, not `{step}`")]
    ProducerStep {
        /// The step.
        step: Step,
    },
    /// A once load is not issued exactly once.
    #[error("once load {load} is issued {times} times; it must be issued once")]
    LoadCount {
        /// Index into the ring's once loads.
        load: usize,
        /// How often the producer's once program issues it.
        times: usize,
    },
    /// The bytes announced on `once` differ from the once boxes' bytes.
    #[error(
        "the producer announces {announced} transaction bytes on `once` but its boxes carry {boxes}"
    )]
    TxBytes {
        /// Bytes in `arrive.expect_tx` on `once`.
        announced: u32,
        /// Bytes of every once box.
        boxes: u32,
    },
    /// The consumers' once program does something besides waiting on `once` from parity 0.
    #[error("the consumers' once program may only wait on `once` from parity 0, not `{step}`")]
    ConsumerStep {
        /// The step.
        step: Step,
    },
    /// The consumers never wait for the once loads.
    #[error("the consumers read once loads without waiting on `once`")]
    NoWait,
    /// The consumers' release program is not the one the ring needs.
    #[error("the consumers' release program is {got:?}; this ring needs {expected:?}")]
    Release {
        /// The program.
        got: Vec<Step>,
        /// What the ring needs: one arrival on `once_free` in a persistent ring with once
        /// loads, nothing otherwise.
        expected: Vec<Step>,
    },
    /// The producer's wait on `once_free` is missing from a persistent ring or present in
    /// another.
    #[error(
        "the producer {} on `once_free` before its once loads; {}",
        if *waits { "waits" } else { "does not wait" },
        if *waits { "only a persistent ring reloads them" } else { "a persistent ring must" }
    )]
    ReloadWait {
        /// Whether it waits.
        waits: bool,
    },
}

impl From<AttentionError> for ProtocolError {
    fn from(e: AttentionError) -> Self {
        ProtocolError::Attention(Box::new(e))
    }
}

/// Checks every ring of the kernel.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if !matches!(target, Target::Sm90a | Target::Sm100a) {
        return Ok(());
    }
    for ring in kernel.schedule.rings.values() {
        let loc = kernel.ops[ring.for_op].loc;
        let checked = match (target, kernel.schedule.roles, &kernel.schedule.tmem) {
            (Target::Sm100a, _, Some(plan)) => check_sm100a(ring, plan),
            (Target::Sm100a, _, None) if kernel.schedule.attention.is_some() => kernel
                .schedule
                .attention
                .as_ref()
                .map_or(Ok(()), |plan| check_sm100a_attention(ring, plan)),
            (Target::Sm90a, Some(roles), _) => check(ring, &roles),
            _ => {
                return Err(Diagnostic::internal(loc, "a stage ring without warp roles"));
            }
        };
        checked.map_err(|e| {
            Diagnostic::new(
                loc,
                format!("internal kiln error: the pipelined loop's barrier protocol is wrong: {e}"),
            )
        })?;
    }
    // The warpgroups' turn barriers, which a store's own must stay apart from.
    let turns = kernel
        .schedule
        .rings
        .values()
        .find_map(|r| r.overlap.as_ref()?.turns)
        .map_or(0..0, |t| t.first_barrier..t.first_barrier + t.warpgroups);
    for st in kernel.schedule.tma_stores.values() {
        tma_store::check_store(st, turns.clone()).map_err(|e| {
            Diagnostic::new(
                kernel.ops[st.store].loc,
                format!("internal kiln error: the epilogue store's TMA protocol is wrong: {e}"),
            )
        })?;
    }
    kernel.schedule.sched = super::legacy_sched::sched_of(kernel);
    if let Some(sched) = &kernel.schedule.sched
        && let Err(errors) = crate::sched::verify::verify(sched)
    {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(Diagnostic::internal(
            kernel.ops[sched.for_op].loc,
            format!("the schedule IR is malformed: {}", text.join("; ")),
        ));
    }
    Ok(())
}

/// Checks one ring: the static rules, then the abstract execution (see the module doc); a
/// clustered ring's set-up synchronises the cluster instead of the block, and its machine
/// runs every CTA of the cluster.
pub fn check(ring: &Ring, roles: &Roles) -> Result<(), ProtocolError> {
    if ring.cluster.is_none() {
        check_init(&ring.init)?;
    }
    cluster::check_cluster(ring, roles.consumer_warps)?;
    check_static(ring)?;
    run_machine(ring, roles.consumer_warps)
}

/// Checks an sm_100a ring and its TMEM plan: the ring's static rules, the TMEM rules, then
/// the abstract execution with the MMA thread as the ring's one consumer (one arrival per
/// release; see the module doc).
pub fn check_sm100a(ring: &Ring, plan: &TmemPlan) -> Result<(), ProtocolError> {
    if ring.cluster.is_none() {
        check_init(&ring.init)?;
    }
    // The 2-SM form's cluster rules, its MMA thread the one consumer of the pair.
    cluster::check_cluster(ring, 1)?;
    check_static(ring)?;
    // The TMEM rules first: they name a plain release for what it is, which the machine
    // would report as an early one.
    tmem::check_tmem(ring, plan)?;
    run_machine(ring, 1)
}

/// Checks an sm_100a ring scheduled as attention: the ring's set-up and static rules (its
/// producer program is the load warp's per iteration), then the attention plan's rules
/// ([`AttentionError`]: TMEM ownership, tcgen05 waits and fences, and the abstract execution
/// of its five roles, which includes the ring's stages).
pub fn check_sm100a_attention(ring: &Ring, plan: &AttentionPlan) -> Result<(), ProtocolError> {
    check_init(&ring.init)?;
    check_static(ring)?;
    tmem_attention::check_attention(ring, plan)
}

/// The abstract execution of `ring` with `consumer_warps` arriving consumer warps.
fn run_machine(ring: &Ring, consumer_warps: u32) -> Result<(), ProtocolError> {
    let counts: Vec<u32> = (0..=2 * ring.stages + 1).collect();
    for &trips in &counts {
        Machine::new(ring, consumer_warps).run(&[trips])?;
    }
    if ring.persistent {
        // Tiles of every pair of trip counts (an empty tile, a short one, one that wraps the
        // ring, ...) in both orders, then a third: the ring's state carries over from each.
        for &a in &counts {
            for &b in &counts {
                Machine::new(ring, consumer_warps).run(&[a, b, (a + b) % 3 + 1])?;
            }
        }
    }
    Ok(())
}
