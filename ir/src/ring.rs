//! The expert layer that Hopper scheduling lowers into: warp roles, shared-memory stage rings
//! guarded by `full`/`empty` mbarrier arrays, TMA loads, and the per-iteration *programs* each
//! role runs over a ring.
//!
//! A [`Ring`] belongs to one pipelined `for` loop. Iteration `i` uses stage `i % stages` of every
//! buffer and barrier; a role's wait on a barrier uses the parity `start ^ ((i / stages) & 1)`,
//! so the bit flips each time the stage index wraps (ptx-notes §2). The programs are plain
//! data: the `pipeline` pass writes them, the `protocol_check` pass proves them safe, and the
//! PTX writer emits exactly these steps, so what is checked is what runs.
//!
//! A ring may also carry *once* loads: tiles loaded before the loop and read by its wgmmas in
//! every iteration (attention's `Q`). The producer issues them once before its loop,
//! completing on the single-phase `once` barrier; the consumers wait on it before theirs.
//!
//! In a persistent kernel ([`Ring::persistent`]) the ring runs once per work tile: its stages
//! and phase bits go on from tile to tile as if the tiles' loops were one, and the once
//! barriers flip phase per tile (tile `k` waits with parity `start ^ (k & 1)`). A rotated
//! loop's release lags start again in each tile (its last iteration releases every stage it
//! used); an unrotated loop's run on, so a tile's first release frees the previous tile's last
//! stage, whose wgmma the drain waited for. The consumers release the once tiles on `once_free`
//! ([`Ring::consumer_release`]) once no wgmma reads them: after the drain, or in a rotated loop
//! before its last iteration (which runs only the last block's tail); the producer issues a
//! tile's first iteration, then waits on `once_free` before reloading them.
//!
//! A ring the `overlap` pass rotates ([`Ring::overlap`]) runs its consumer program over the
//! iterations `t = 0 ..= trips`: steps that serve iteration `t` ([`Step::lag`] 0) skip the
//! last one, steps that serve `t - 1` (lag 1) skip the first, and the rest (commits, group
//! waits, turn barriers) run in every one. So the loop is written as a prologue (`t = 0`), a
//! steady state (`t` in `1..trips`) and an epilogue (`t = trips`), and iteration `t` issues the
//! head mma of block `t` before the tail mma of block `t - 1` and the code between them.

use std::fmt;

use crate::kernel::OpId;
use crate::print::join_steps;
pub use crate::sched::overlap::{Deferral, NAMED_BARRIERS, Overlap, Turns};
pub use crate::sched::role::Who;
pub use crate::sched::tma::{Operand, SWIZZLE_ATOM, TmaBox, TmaLoad, box_columns};

/// Which barrier array of a ring a step names; stage `i % stages` of it. Ordered so a
/// `(Bar, stage)` pair can key a map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bar {
    /// Completes when a stage's data has landed (producer arrive + TMA transaction bytes).
    Full,
    /// Completes when every consumer has finished reading a stage.
    Empty,
    /// The single barrier of the ring's once loads (one phase per tile; no stages).
    Once,
    /// Persistent kernels: completes when every consumer has finished reading the once
    /// tiles of a work tile (one phase per tile; no stages).
    OnceFree,
    /// A split ring ([`Ring::tail_loads`]): `full` of the loads only the tail mma reads.
    TailFull,
    /// A split ring: `empty` of the loads only the tail mma reads, released after the tail.
    TailEmpty,
}

/// One step of a role's program, executed once per loop iteration `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `mbarrier.try_wait.parity` loop on `bar[i % stages]` with parity
    /// `start ^ ((i / stages) & 1)`.
    Wait {
        /// The barrier array.
        bar: Bar,
        /// The parity of the first round (producer on `empty`: 1; consumer on `full`: 0).
        start: u32,
    },
    /// `mbarrier.arrive.expect_tx` on `bar[i % stages]`: one arrival plus `bytes` of expected
    /// transactions.
    ArriveExpectTx {
        /// The barrier array.
        bar: Bar,
        /// Announced transaction bytes.
        bytes: u32,
    },
    /// Every TMA box of [`Ring::loads`]`[load]` into stage `i % stages`, completing its bytes
    /// on `full[i % stages]`.
    Tma {
        /// Index into the ring's loads.
        load: usize,
    },
    /// Every TMA box of [`Ring::once`]`[load]`, completing its bytes on `once` (a once
    /// program's step).
    TmaOnce {
        /// Index into the ring's once loads.
        load: usize,
    },
    /// Generic-proxy stores into stage `i % stages` of load `load`'s buffer (`st.shared`).
    GenericWrite {
        /// Index into the ring's loads.
        load: usize,
    },
    /// `fence.proxy.async.shared::cta`: earlier generic writes become visible to the async
    /// proxy (TMA, wgmma).
    FenceProxyAsync,
    /// The loop body: its `mma`s become wgmmas reading stage `i % stages` of every load (and
    /// the once loads). In a body with several `mma`s, whose results the body reads, each
    /// wgmma is committed and waited for (`wait_group 0`) before its result is used; the
    /// program's own `Commit`/`WaitGroup` steps then find nothing more in flight.
    Mma,
    /// `wgmma.commit_group`: the wgmmas since the last commit form one group.
    Commit,
    /// `wgmma.wait_group n`: at most `n` committed groups stay in flight.
    WaitGroup(u32),
    /// One arrival per arriving thread group of the role on `bar[(i - lag) % stages]`;
    /// skipped while `i < lag`.
    Arrive {
        /// The barrier array.
        bar: Bar,
        /// How many iterations back the released stage was used.
        lag: u32,
    },
    /// A clustered ring ([`Ring::cluster`]): [`Step::Arrive`] on the same barrier of every
    /// other CTA of the cluster (`mapa` + `mbarrier.arrive.release.cluster`), whose producer
    /// multicasts into this CTA's stage and so must hear that it is free.
    ArrivePeer {
        /// The barrier array.
        bar: Bar,
        /// How many iterations back the released stage was used.
        lag: u32,
    },
    /// Rotated loops: the wgmmas of the body's head mma ([`Overlap::head`]) for iteration
    /// `t`, reading stage `t % stages`; not waited for here.
    IssueHead,
    /// Rotated loops: the tail section ([`Overlap::tail_ops`]) for iteration `t - 1`: the
    /// carried accumulator is rescaled in registers, then the tail mma's wgmmas accumulate into
    /// it, reading stage `(t - 1) % stages`; not waited for here.
    IssueTail,
    /// Rotated loops: the code between the two mmas ([`Overlap::between`], the softmax) for
    /// iteration `t`: it reads the head mma's products.
    Between,
    /// Rotated loops: the values of iteration `t` that the tail reads (`P`, packed to its
    /// element type, and the rescale factors) move into the registers the next
    /// [`Step::IssueTail`] reads, overwriting those the previous one read.
    Handoff,
    /// Ping-pong: `bar.sync` on the executing warpgroup's turn barrier (its turn to issue
    /// wgmmas), by the warpgroups `who` names.
    TurnWait {
        /// Which warpgroups run the step.
        who: Who,
    },
    /// Ping-pong: `bar.arrive` on the next warpgroup's turn barrier (hands the turn on).
    TurnPass {
        /// Which warpgroups run the step.
        who: Who,
    },
    /// sm_100a: the body's `mma`s as `tcgen05.mma`, issued by one thread of the MMA warp from
    /// stage `i % stages` into the tensor-memory accumulator ([`crate::tmem`]); asynchronous
    /// until a [`Step::Tcgen05Commit`] after them.
    Tcgen05Mma,
    /// sm_100a: `tcgen05.commit` to `bar[(i - lag) % stages]`: one arrival there once every
    /// `tcgen05.mma` the thread issued before it has completed (so a stage is released when
    /// the mmas reading it are done, with no wait in the issuing thread).
    Tcgen05Commit {
        /// The barrier array.
        bar: Bar,
        /// How many iterations back the released stage was used.
        lag: u32,
    },
}

impl Step {
    /// In a rotated program, how many iterations behind the loop's the iteration is that the
    /// step serves: `Some(0)` for the head's steps, `Some(1)` for the tail's (and a release of
    /// the previous stage), `None` for steps every iteration runs (commits, group waits, turn
    /// barriers, fences).
    pub fn lag(self) -> Option<u32> {
        match self {
            Step::Wait { .. }
            | Step::IssueHead
            | Step::Between
            | Step::Handoff
            | Step::Mma
            | Step::Tma { .. }
            | Step::TmaOnce { .. }
            | Step::ArriveExpectTx { .. }
            | Step::GenericWrite { .. }
            | Step::Tcgen05Mma => Some(0),
            Step::IssueTail => Some(1),
            Step::Arrive { lag, .. }
            | Step::ArrivePeer { lag, .. }
            | Step::Tcgen05Commit { lag, .. } => Some(lag),
            Step::Commit
            | Step::WaitGroup(_)
            | Step::FenceProxyAsync
            | Step::TurnWait { .. }
            | Step::TurnPass { .. } => None,
        }
    }

    /// Whether the step runs in iteration `t` (of `0 ..= trips`) of a rotated program.
    pub fn runs_rotated(self, t: u32, trips: u32) -> bool {
        self.lag().is_none_or(|lag| lag <= t && t < trips + lag)
    }
}

/// One-time set-up before the roles split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InitStep {
    /// One thread runs `mbarrier.init` on every barrier with its count.
    InitBarriers,
    /// `fence.mbarrier_init.release.cluster`: the inits become visible to the async proxy.
    FenceMbarrierInit,
    /// `bar.sync 0`: every thread sees initialised barriers before using them.
    BarSync,
    /// A clustered ring: `barrier.cluster.arrive.release` + `wait.acquire` in place of
    /// `bar.sync`: every CTA's barriers are initialised before any CTA arrives on a peer's or
    /// multicasts into it.
    ClusterSync,
}

/// A pipelined loop scheduled as a ring of `stages` shared-memory stages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ring {
    /// The `for` op.
    pub for_op: OpId,
    /// Stages in the ring.
    pub stages: u32,
    /// The TMA loads filling each stage.
    pub loads: Vec<TmaLoad>,
    /// Tiles loaded once before the loop (one stage each, `stage_stride` 0).
    pub once: Vec<TmaLoad>,
    /// Byte offset of the `once` barrier (unused without once loads).
    pub once_offset: u32,
    /// Byte offset of `full[0]`; `full[s]` is at `+ 8 s`.
    pub full_offset: u32,
    /// Byte offset of `empty[0]`.
    pub empty_offset: u32,
    /// Arrivals that complete a phase of `full` (`mbarrier.init` count).
    pub full_count: u32,
    /// Arrivals that complete a phase of `empty`.
    pub empty_count: u32,
    /// Set-up before the roles split.
    pub init: Vec<InitStep>,
    /// The producer's program before its loop (the once loads).
    pub producer_once: Vec<Step>,
    /// The consumers' program before their loop (waiting for the once loads).
    pub consumer_once: Vec<Step>,
    /// The producer's program per iteration.
    pub producer: Vec<Step>,
    /// The consumers' program per iteration.
    pub consumer: Vec<Step>,
    /// The consumers' steps once after the loop (as iteration `trip count`).
    pub consumer_drain: Vec<Step>,
    /// The consumers' steps once per CTA, before their first work tile (a ping-pong's first
    /// hand-over of the turn), so that a persistent CTA's turns go round across its tiles.
    pub consumer_start: Vec<Step>,
    /// The consumers' steps once per CTA, after their last work tile (the leader taking the
    /// last pass).
    pub consumer_exit: Vec<Step>,
    /// Persistent kernels: the consumers' steps releasing the once tiles (see the module doc
    /// for where they run).
    pub consumer_release: Vec<Step>,
    /// Whether the ring runs once per work tile of a persistent CTA (see the module doc).
    pub persistent: bool,
    /// Byte offset of the `once_free` barrier (persistent rings with once loads).
    pub once_free_offset: u32,
    /// A rotated ring's loads only the tail mma reads (attention's `V`), when they have
    /// barrier arrays of their own (`tail_full`, `tail_empty`): the other loads' stages are
    /// released as soon as the head mma completes, a block before the tail's, so TMA refills
    /// them a block earlier. Empty: one pair of arrays for every load.
    pub tail_loads: Vec<usize>,
    /// Byte offset of `tail_full[0]` (split rings).
    pub tail_full_offset: u32,
    /// Byte offset of `tail_empty[0]` (split rings).
    pub tail_empty_offset: u32,
    /// The rotated schedule of the body, when the `overlap` pass found one.
    pub overlap: Option<Overlap>,
    /// The thread-block cluster whose CTAs share one load's stages, when the `persistent`
    /// pass clustered the ring ([`crate::cluster`]).
    pub cluster: Option<crate::cluster::Cluster>,
}

impl Ring {
    /// The `full` array load `load` completes on.
    pub fn full_of(&self, load: usize) -> Bar {
        if self.tail_loads.contains(&load) {
            Bar::TailFull
        } else {
            Bar::Full
        }
    }

    /// The `empty` array guarding `bar`'s stages (`full` -> `empty`, `tail_full` ->
    /// `tail_empty`).
    pub fn empty_of(bar: Bar) -> Bar {
        match bar {
            Bar::TailFull | Bar::TailEmpty => Bar::TailEmpty,
            _ => Bar::Empty,
        }
    }
}

/// How the block's warps are split into roles for warp-specialised rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Roles {
    /// Consumer warps (whole warpgroups, threads `0..32 * consumer_warps`): they run the
    /// kernel's code and the wgmmas.
    pub consumer_warps: u32,
    /// Producer warps (one warpgroup after the consumers); one elected thread issues TMA.
    pub producer_warps: u32,
    /// `setmaxnreg.dec` target of the producer warpgroup.
    pub producer_regs: u32,
    /// `setmaxnreg.inc` target of each consumer warpgroup.
    pub consumer_regs: u32,
    /// CTAs the kernel is built to share a multiprocessor with (`.minnctapersm`): 2 when the
    /// `occupancy` pass found room for two, else 1.
    pub ctas_per_sm: u32,
}

impl Roles {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        32 * (self.consumer_warps + self.producer_warps)
    }

    /// Arrivals one consumer `Arrive` step makes (one elected lane per consumer warp).
    pub fn consumer_arrivals(&self) -> u32 {
        self.consumer_warps
    }
}

impl fmt::Display for Bar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bar::Full => "full",
            Bar::Empty => "empty",
            Bar::Once => "once",
            Bar::OnceFree => "once_free",
            Bar::TailFull => "tail_full",
            Bar::TailEmpty => "tail_empty",
        })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Wait { bar, start } => write!(f, "wait {bar}(phase from {start})"),
            Step::ArriveExpectTx { bar, bytes } => write!(f, "arrive.expect_tx {bar} {bytes}B"),
            Step::Tma { load } => write!(f, "tma load{load}"),
            Step::TmaOnce { load } => write!(f, "tma once{load}"),
            Step::GenericWrite { load } => write!(f, "st.shared load{load}"),
            Step::FenceProxyAsync => f.write_str("fence.proxy.async"),
            Step::Mma => f.write_str("wgmma"),
            Step::Commit => f.write_str("commit"),
            Step::WaitGroup(n) => write!(f, "wait_group {n}"),
            Step::Arrive { bar, lag } => write!(f, "arrive {bar}[i-{lag}]"),
            Step::ArrivePeer { bar, lag } => write!(f, "arrive.peer {bar}[i-{lag}]"),
            Step::IssueHead => f.write_str("wgmma head[i]"),
            Step::IssueTail => f.write_str("wgmma tail[i-1]"),
            Step::Between => f.write_str("between[i]"),
            Step::Handoff => f.write_str("handoff[i]"),
            Step::TurnWait { who } => write!(f, "turn.wait{who}"),
            Step::TurnPass { who } => write!(f, "turn.pass{who}"),
            Step::Tcgen05Mma => f.write_str("tcgen05.mma"),
            Step::Tcgen05Commit { bar, lag } => write!(f, "tcgen05.commit {bar}[i-{lag}]"),
        }
    }
}

impl fmt::Display for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  ring {}: stages={} full@{} x{} empty@{} x{}",
            self.for_op,
            self.stages,
            self.full_offset,
            self.full_count,
            self.empty_offset,
            self.empty_count
        )?;
        let loads = self.loads.iter().enumerate().map(|(i, l)| ("load", i, l));
        let once = self.once.iter().enumerate().map(|(i, l)| ("once", i, l));
        for (kind, i, l) in loads.chain(once) {
            let dims: Vec<String> = l.map_box().iter().map(u32::to_string).collect();
            writeln!(
                f,
                "    {kind}{i} = {} param{} {:?} @{} stride {} B: {} box(es) {} sw{}",
                l.load,
                l.param,
                l.operand,
                l.offset,
                l.stage_stride,
                l.boxes.len(),
                dims.join("x"),
                l.swizzle
            )?;
        }
        if !self.tail_loads.is_empty() {
            let loads: Vec<String> = self.tail_loads.iter().map(|l| format!("load{l}")).collect();
            writeln!(
                f,
                "    split: {} on tail_full@{} tail_empty@{} (released after the tail)",
                loads.join(" "),
                self.tail_full_offset,
                self.tail_empty_offset
            )?;
        }
        if self.persistent {
            writeln!(
                f,
                "    persistent: stages and phases continue across work tiles"
            )?;
        }
        if let Some(c) = &self.cluster {
            writeln!(f, "{c}")?;
        }
        if !self.consumer_start.is_empty() {
            writeln!(
                f,
                "    consumer start (once per CTA): {}",
                join_steps(&self.consumer_start)
            )?;
        }
        if !self.once.is_empty() {
            writeln!(f, "    once@{}", self.once_offset)?;
            if self.persistent {
                writeln!(f, "    once_free@{}", self.once_free_offset)?;
            }
            writeln!(f, "    producer once: {}", join_steps(&self.producer_once))?;
            writeln!(f, "    consumer once: {}", join_steps(&self.consumer_once))?;
        }
        writeln!(f, "    producer: {}", join_steps(&self.producer))?;
        writeln!(f, "    consumer: {}", join_steps(&self.consumer))?;
        write!(f, "    drain: {}", join_steps(&self.consumer_drain))?;
        if !self.consumer_exit.is_empty() {
            write!(
                f,
                "\n    consumer exit (once per CTA): {}",
                join_steps(&self.consumer_exit)
            )?;
        }
        if !self.consumer_release.is_empty() {
            write!(f, "\n    release: {}", join_steps(&self.consumer_release))?;
        }
        match &self.overlap {
            Some(o) => write!(f, "\n{o}"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  roles: consumers {} warps (setmaxnreg {}), producer {} warps (setmaxnreg {})",
            self.consumer_warps, self.consumer_regs, self.producer_warps, self.producer_regs
        )?;
        if self.ctas_per_sm > 1 {
            write!(f, ", {} CTAs per multiprocessor", self.ctas_per_sm)?;
        }
        Ok(())
    }
}
