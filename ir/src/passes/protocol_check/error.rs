//! What a broken schedule protocol is reported as. Ops, roles and barriers are named as the
//! schedule IR prints them (`wait empty(phase from 1)`, `consumer`, `full[2]`).

use std::ops::Range;

use crate::sched::tmem::TMEM_COLUMNS;

/// A broken schedule protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The set-up does not init, fence and synchronise in that order.
    #[error(
        "barrier set-up must be mbarrier.init, fence.mbarrier_init, bar.sync in that order; got {0}"
    )]
    Init(String),
    /// A wait starts at the wrong parity.
    #[error(
        "the {role}'s wait on `{bar}` starts at phase parity {start}; it must start at {expected}"
    )]
    StartPhase {
        /// The waiting role.
        role: String,
        /// The barrier.
        bar: String,
        /// The parity in the program.
        start: u32,
        /// The parity the protocol needs.
        expected: u32,
    },
    /// The announced transaction bytes differ from the boxes' bytes.
    #[error(
        "the producer announces {announced} transaction bytes on `{bar}` but its TMA boxes carry {boxes}"
    )]
    TxBytes {
        /// The barrier.
        bar: String,
        /// Bytes in `arrive.expect_tx`.
        announced: u32,
        /// Bytes of every box signalling it.
        boxes: u32,
    },
    /// A load is not issued exactly once per iteration (per tile, for a once load).
    #[error("{load} is issued {times} times per {per}; it must be issued once")]
    LoadCount {
        /// The load.
        load: String,
        /// How often the producer issues it.
        times: usize,
        /// `iteration` or `tile`.
        per: &'static str,
    },
    /// An op touches a stage before the wait that makes it safe.
    #[error("the {role} runs `{op}` before waiting on `{bar}`")]
    BeforeWait {
        /// The role.
        role: String,
        /// The op.
        op: String,
        /// The barrier it must wait on first.
        bar: String,
    },
    /// A generic-proxy write reaches the async proxy without a fence.
    #[error(
        "the {role} writes {load}'s stage through the generic proxy and `{op}` follows without fence.proxy.async"
    )]
    Unfenced {
        /// The role.
        role: String,
        /// The load whose buffer is written.
        load: String,
        /// The op that would expose the write.
        op: String,
    },
    /// More arrivals than the barrier's count in one phase.
    #[error("`{bar}[{stage}]` receives more arrivals than its count {count} in one phase")]
    TooManyArrivals {
        /// The barrier.
        bar: String,
        /// The stage.
        stage: u32,
        /// Its init count.
        count: u32,
    },
    /// A parity wait would pass or block on another phase than the one it means.
    #[error(
        "phases disagree with trip counts {tiles:?}: the {role}'s wait on `{bar}[{stage}]` in iteration {iteration} needs {needed} completed phase(s) but {completed} are, so its parity would pass on the wrong phase"
    )]
    Phase {
        /// The trip count of each work tile of the run.
        tiles: Vec<u32>,
        /// The waiting role.
        role: String,
        /// The barrier.
        bar: String,
        /// The stage.
        stage: u32,
        /// The loop iteration (the work tile, for a per-tile barrier).
        iteration: u32,
        /// Phases completed so far.
        completed: u32,
        /// Phases the wait needs completed.
        needed: u32,
    },
    /// A stage is released while an mma reading it may still run.
    #[error(
        "iteration {iteration} releases the stage of iteration {released} on `{bar}` before the wgmma reading it has completed (wgmma.wait_group too weak)"
    )]
    EarlyRelease {
        /// The releasing iteration.
        iteration: u32,
        /// The iteration whose stage is released.
        released: u32,
        /// The barrier released on.
        bar: String,
    },
    /// An mma reads a stage before the wait that shows its data landed.
    #[error(
        "an mma reads the stage of iteration {iteration} before the {role}'s wait on `{bar}` for it passed"
    )]
    ReadBeforeWait {
        /// The reading role.
        role: String,
        /// The iteration whose stage is read.
        iteration: u32,
        /// The barrier its data lands on.
        bar: String,
    },
    /// TMA overwrites a stage its readers have not released.
    #[error(
        "TMA refills the stage of iteration {previous} in iteration {iteration} before the consumers released it"
    )]
    Overwrite {
        /// The refilling iteration.
        iteration: u32,
        /// The iteration that used the stage before.
        previous: u32,
    },
    /// A wgmma's registers are touched while it may still run: the code between a rotated
    /// loop's mmas reads the head's products, the next rescale the accumulator the tail still
    /// writes, or the handoff the `P` the tail still reads.
    #[error("in iteration {iteration} {what} (wgmma.wait_group missing or too weak)")]
    InFlight {
        /// The iteration.
        iteration: u32,
        /// What is touched, and by what.
        what: &'static str,
    },
    /// A named barrier generation completed with no role waiting on it (`lost`), or one is
    /// left mid-generation when the roles end.
    #[error(
        "broken ping-pong order: turn barrier {barrier} {}",
        if *lost {
            "completed with no warpgroup waiting for its turn"
        } else {
            "is left with arrivals no warpgroup waits for"
        }
    )]
    Turn {
        /// The element of the named barrier array (the warpgroup's turn).
        barrier: u32,
        /// Whether a generation completed unwaited for.
        lost: bool,
    },
    /// The split barrier arrays of a ring's tail loads are misused.
    #[error("split ring: {0}")]
    Split(String),
    /// A rotated program's ops are not the rotation's.
    #[error("rotated loop: {0}")]
    Rotation(String),
    /// The once loads or their per-tile barriers are misused.
    #[error("once loads: {0}")]
    Once(#[from] OnceError),
    /// A tile's once loads are released while an mma reading them may still run.
    #[error(
        "tile {tile}'s consumers release the once tiles on `once_free` before the wgmmas reading them completed"
    )]
    OnceReleasedEarly {
        /// The work tile.
        tile: u32,
    },
    /// TMA reloads the once tiles before their readers released the previous tile's.
    #[error(
        "TMA reloads the once tiles for tile {tile} before the consumers released the previous tile's"
    )]
    OnceOverwrite {
        /// The work tile being loaded.
        tile: u32,
    },
    /// The cluster-scope protocol is broken.
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterError),
    /// The tensor-memory protocol is broken.
    #[error("tensor memory: {0}")]
    Tmem(#[from] TmemError),
    /// An epilogue TMA store breaks the store protocol.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Two roles touch a region in an order no barrier guarantees (boxed: it names two
    /// accesses, and every other error stays small).
    #[error("{0}")]
    Race(Box<Race>),
    /// The roles cannot all finish.
    #[error("deadlock with trip counts {tiles:?} (one per work tile): {blocked}")]
    Deadlock {
        /// The trip count of each work tile simulated.
        tiles: Vec<u32>,
        /// Each unfinished role and where it waits.
        blocked: String,
    },
}

/// Two accesses to a region that no barrier orders.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "with trip counts {tiles:?}: {region} is {first} by the {first_role} ({first_op}) and {second} by the {second_role} ({second_op}) with no barrier ordering them"
)]
pub struct Race {
    /// The trip count of each work tile of the run.
    pub tiles: Vec<u32>,
    /// The region.
    pub region: String,
    /// The earlier access: read or written.
    pub first: &'static str,
    /// Its role.
    pub first_role: String,
    /// Its op.
    pub first_op: String,
    /// The later access.
    pub second: &'static str,
    /// Its role.
    pub second_role: String,
    /// Its op.
    pub second_op: String,
}

/// A misuse of the once loads or their per-tile barriers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OnceError {
    /// Once ops exist but nothing is loaded once.
    #[error("once programs without once loads")]
    ProgramsWithoutLoads,
    /// A per-iteration op touches a per-tile barrier or issues a once load.
    #[error("`{op}` runs every iteration; the once barrier has a single phase per tile")]
    EveryIteration {
        /// The op.
        op: String,
    },
    /// The producer's tile section does something besides announcing and issuing.
    #[error("the producer's once program may only announce and issue once loads, not `{op}`")]
    ProducerStep {
        /// The op.
        op: String,
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
    /// A reader's tile section does something besides waiting on `once` from parity 0.
    #[error("the {role}'s once program may only wait on `once` from parity 0, not `{op}`")]
    ConsumerStep {
        /// The role.
        role: String,
        /// The op.
        op: String,
    },
    /// A role reads once loads without waiting for them.
    #[error("the {role} reads once loads without waiting on `once`")]
    NoWait {
        /// The role.
        role: String,
    },
    /// The release of the once tiles is not the one the schedule needs.
    #[error("the {role}'s release program is [{got}]; this schedule needs [{expected}]")]
    Release {
        /// The role.
        role: String,
        /// The program.
        got: String,
        /// What the schedule needs: one arrival on `once_free` in a persistent schedule with
        /// once loads, nothing otherwise.
        expected: String,
    },
    /// The producer's wait on `once_free` is missing from a persistent schedule or present
    /// in another.
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

/// The cluster-scope rules of a clustered schedule ([`crate::sched::cluster`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The set-up does not synchronise the cluster after the inits.
    #[error(
        "a clustered ring's set-up must be mbarrier.init, fence.mbarrier_init, barrier.cluster \
         in that order (before any remote arrival or multicast); got {0}"
    )]
    Init(String),
    /// `empty` does not count every CTA's releases.
    #[error(
        "`empty` counts {count} arrivals per phase; the consumers of the cluster's {ctas} CTAs \
         make {expected}"
    )]
    EmptyCount {
        /// Its count.
        count: u32,
        /// CTAs of the cluster.
        ctas: u32,
        /// The arrivals a phase gets.
        expected: u32,
    },
    /// A box of the shared load is not issued by one CTA into all.
    #[error(
        "box {index} of the shared load is issued by CTA {issuer} with mask {mask:#b}; every \
         box must be issued by one CTA of the {ctas} and land in all ({all:#b}), so that each \
         `full` gets the bytes it announces"
    )]
    Multicast {
        /// The box.
        index: usize,
        /// Its issuer.
        issuer: u32,
        /// Its mask.
        mask: u16,
        /// CTAs of the cluster.
        ctas: u32,
        /// Every CTA's bit.
        all: u16,
    },
    /// The clustered schedule is not of the shape clusters take.
    #[error("a clustered ring must be a persistent GEMM mainloop: {0}")]
    Shape(String),
    /// A peer release without a cluster.
    #[error("`{0}` in a ring without a cluster")]
    PeerWithoutCluster(String),
    /// A multicast refills a peer's stage its readers have not released.
    #[error(
        "CTA {from}'s multicast refills CTA {cta}'s stage of iteration {previous} in iteration \
         {iteration} before CTA {cta}'s consumers released it"
    )]
    Overwrite {
        /// The CTA whose stage is refilled.
        cta: u32,
        /// The issuing CTA.
        from: u32,
        /// The refilling iteration.
        iteration: u32,
        /// The iteration that used the stage.
        previous: u32,
    },
    /// A 2-SM pair's TMA refills a stage before the pair's mma released it there.
    #[error(
        "CTA {cta}'s TMA refills its stage of iteration {previous} in iteration {iteration} \
         before the pair's mma reading it completed (no commit released it there)"
    )]
    Refill {
        /// The CTA.
        cta: u32,
        /// The refilling iteration.
        iteration: u32,
        /// The iteration that used the stage.
        previous: u32,
    },
    /// A remote op reaches a CTA that exited.
    #[error(
        "CTA {from}'s `{op}` reaches CTA {cta} after it exited (no cluster barrier before exit)"
    )]
    AfterExit {
        /// The exited CTA.
        cta: u32,
        /// The CTA whose op reaches it.
        from: u32,
        /// The op.
        op: String,
    },
}

/// The tensor-memory rules (sm_100a).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TmemError {
    /// The allocation is not a power of 2 in 32..=512 columns holding its tiles apart.
    #[error(
        "TMEM allocation of {columns} columns: it must be a power of 2 from 32 to {TMEM_COLUMNS} holding every tile ({needed} columns) without overlap"
    )]
    Columns {
        /// Columns allocated.
        columns: u32,
        /// Columns the tiles need.
        needed: u32,
    },
    /// The MMA warp's lifecycle is out of order or incomplete.
    #[error("the TMEM-owning MMA warp must {0}")]
    Owner(String),
    /// An op of a role breaks one of the rules of [`TmemRule`].
    #[error("{}", rule.message(role, op))]
    Rule {
        /// The role.
        role: String,
        /// The op, or `the code after the loop`.
        op: String,
        /// The rule it breaks.
        rule: TmemRule,
    },
    /// A ring stage released by something other than a `tcgen05.commit`.
    #[error(
        "the MMA thread releases a stage with `{0}`; only tcgen05.commit arrives after the tcgen05.mma reading it completes"
    )]
    PlainRelease(String),
    /// The epilogue does not hand TMEM back exactly once, after its copies.
    #[error("each epilogue warp must arrive on acc_empty exactly once, after tcgen05.wait::ld")]
    NoHandBack,
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
    PeerIssues(String),
    /// A 2-SM commit does not reach every CTA of the pair.
    #[error(
        "the 2-SM pair's commits arrive on the CTAs {mask:#b}; they must reach both ({all:#b}), whose barriers they release"
    )]
    CommitMask {
        /// The `ctaMask`.
        mask: u16,
        /// Both CTAs.
        all: u16,
    },
    /// The cluster and the roles disagree on the 2-SM form.
    #[error("the schedule is {ring} and its MMA roles {plan}: both or neither are the 2-SM form")]
    PairMismatch {
        /// How the cluster is.
        ring: &'static str,
        /// How the roles are.
        plan: &'static str,
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
        /// The first column not copied exactly once.
        column: u32,
        /// How many times it is copied.
        times: u32,
    },
    /// The epilogue copies from TMEM after handing it back.
    #[error(
        "the epilogue runs `{0}` after arriving on acc_empty: the next tile's mmas may overwrite the accumulator it copies"
    )]
    LoadAfterHandBack(String),
    /// The code after the loop reads a column before the epilogue copies it.
    #[error("the epilogue runs `{read}` before a tcgen05.ld copies column {column}")]
    ReadBeforeLoad {
        /// The read.
        read: String,
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
        /// The first column not read exactly once.
        column: u32,
        /// How many times it is read.
        times: u32,
    },
    /// The epilogue is not whole warpgroups.
    #[error(
        "{0} epilogue warps: every warpgroup of 4 reads all 128 TMEM lanes of its column block"
    )]
    Lanes(u32),
}

/// A tensor-memory rule one op of a role breaks ([`TmemError::Rule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmemRule {
    /// Another role allocates, frees or gives up the permit.
    NotOwner,
    /// A role signals with the wrong kind of arrival.
    PlainSignal,
    /// TMEM is read before its producer's commit is waited for and fenced.
    LoadBeforeCommit,
    /// Registers of a `tcgen05.ld` used, or TMEM handed on, before `tcgen05.wait::ld`; TMEM
    /// handed on before a `tcgen05.st` completed (`tcgen05.wait::st`). The copy in flight:
    /// `ld` or `st`.
    NotWaited(&'static str),
    /// A tcgen05 op not fenced against the barrier before or after it: `before` or `after`.
    Unfenced(&'static str),
}

impl TmemRule {
    fn message(self, role: &str, op: &str) -> String {
        match self {
            TmemRule::NotOwner => format!(
                "`{op}` in the {role} program: TMEM is allocated and freed by the MMA warp alone"
            ),
            TmemRule::PlainSignal => format!(
                "`{op}` in the {role} program: the MMA thread signals only with tcgen05.commit (which waits for its mmas), the other roles only with plain arrivals"
            ),
            TmemRule::LoadBeforeCommit => format!(
                "the {role} runs `{op}` before waiting on the accumulator's barrier and fencing after it"
            ),
            TmemRule::NotWaited(copy) => format!(
                "the {role} program runs `{op}` while a tcgen05.{copy} may still be in flight (tcgen05.wait::{copy} missing)"
            ),
            TmemRule::Unfenced(fence) => format!(
                "the {role} program runs `{op}` without the tcgen05.fence::{fence}_thread_sync it needs"
            ),
        }
    }
}

/// The rules of a TMA store's rounds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A round does not write the staging tile once, then store it once.
    #[error("a TMA store round must write the staging tile once, then store it once; got [{0}]")]
    Shape(String),
    /// The staging tile is written before it is free.
    #[error(
        "a TMA store round writes the staging tile before the issuing thread's wait_group.read and a barrier after it: an earlier store may still read it"
    )]
    WriteBeforeFree,
    /// The staging tile is stored before the writes are visible.
    #[error(
        "a TMA store round stores the staging tile before fence.proxy.async and a barrier after it: the copy may miss the threads' writes"
    )]
    StoreBeforeVisible,
    /// The store's bulk group is not committed.
    #[error("a TMA store round stores without committing the bulk group after")]
    Uncommitted,
    /// The storing role exits before every store completed.
    #[error(
        "the {role} exits without waiting for every TMA store (wait_group 0); ops at exit: [{ops}]"
    )]
    ExitBeforeStored {
        /// The role.
        role: String,
        /// Its exit section.
        ops: String,
    },
    /// The store's named barriers collide with others.
    #[error(
        "a TMA store's named barriers {stores:?} must lie in 1..16, apart from every other named barrier {others:?}"
    )]
    Barriers {
        /// Its ids.
        stores: Range<u32>,
        /// The other ids it overlaps.
        others: Range<u32>,
    },
    /// Two stores that run at once share a staging tile or a named barrier.
    #[error(
        "the softmax warpgroups' epilogue stores must each have a staging tile and a named barrier (not 0) of their own"
    )]
    SharedStaging,
    /// The groups' bands are not whole swizzle atoms.
    #[error(
        "a TMA store's {groups} groups split its {rows}-row boxes into bands that are not whole 8-row swizzle atoms"
    )]
    Bands {
        /// Groups.
        groups: u32,
        /// Rows of a box.
        rows: u32,
    },
}
