//! The sm_100a attention schedule's rules ([`AttentionPlan`]): TMEM ownership, the ordering of
//! every tcgen05 op against the barriers around it, and an abstract execution of all five
//! roles that proves every handoff of S, P, O, the rescale factors and the ring's stages is
//! ordered by a barrier.
//!
//! Static rules, per program:
//! - the allocation is a power of 2 of 32..=512 columns holding both tiles' `O` and `S`, which
//!   do not overlap; the MMA warp allocates once, relinquishes the permit and publishes the
//!   address before the roles split, and frees exactly those columns after its last tile,
//!   after waiting on every tile's `o_empty` and fencing; no other program allocates, frees or
//!   gives up the permit ([`AttentionError::Owner`], [`AttentionError::NotOwner`]);
//! - only the MMA thread signals barriers with `tcgen05.commit` (an arrival once its mmas
//!   complete), and it never arrives plainly ([`AttentionError::PlainSignal`]);
//! - every `tcgen05.ld` is waited for (`tcgen05.wait::ld`) before its registers are used or
//!   TMEM is handed on, every `tcgen05.st` (`wait::st`) before the handoff;
//! - each softmax warpgroup's epilogue TMA store follows the store protocol
//!   ([`crate::tma_store`]) with a staging tile and a named barrier of its own;
//! - a tcgen05 op after a barrier wait comes after `tcgen05.fence::after_thread_sync`, and an
//!   arrival that hands TMEM on after a tcgen05 op after `tcgen05.fence::before_thread_sync`.
//!
//! Dynamic rules: the load warp, the MMA thread, both softmax warpgroups and the correction
//! warpgroup run their expanded programs on an abstract machine for sequences of work tiles
//! with trip counts from 0 to past the ring's second wrap. mbarriers count arrivals and
//! transaction bytes; a wait passes when its phase completed, and fails the check when its
//! parity would pass on another phase. Every barrier phase carries the vector clock of its
//! arrivals (a `tcgen05.commit`'s is that of the thread that issued the mmas before it), a
//! wait joins it, and every access to a region (each tile's `S`/`P` and `O` in TMEM, its
//! rescale factors, both Q tiles, each stage of K and V; the dealloc writes all of TMEM) must
//! be ordered after the previous conflicting access of another role ([`AttentionError::Race`]).
//! The roles must all finish ([`AttentionError::Deadlock`]).
//!
//! The machine is also the clock of the schedule's CPU execution
//! ([`crate::interp::run_scheduled`]): [`run_observed`] reports each step a role completes, in
//! the machine's order, to an observer that moves the data.

use std::collections::BTreeMap;

use super::ProtocolError;
use crate::ring::{Bar, Ring, Step};
use crate::tmem::TMEM_COLUMNS;
use crate::tmem::attention::{AttentionPlan, AttnBar, AttnStep, Q_TILES};

/// A broken attention schedule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttentionError {
    /// The allocation does not hold both tiles' `O` and `S` apart.
    #[error(
        "TMEM allocation of {columns} columns: it must be a power of 2 from 32 to {TMEM_COLUMNS} holding both tiles' O and S ({needed} columns) without overlap"
    )]
    Columns {
        /// Columns allocated.
        columns: u32,
        /// Columns the tiles need.
        needed: u32,
    },
    /// The MMA warp's TMEM lifecycle is out of order or incomplete.
    #[error("the TMEM-owning MMA warp must {0}")]
    Owner(&'static str),
    /// Another program allocates, frees or gives up the permit.
    #[error("`{step}` in the {role} program: TMEM is allocated and freed by the MMA warp alone")]
    NotOwner {
        /// The program.
        role: String,
        /// The step.
        step: AttnStep,
    },
    /// A barrier signalled by the wrong kind of arrival.
    #[error(
        "`{step}` in the {role} program: the MMA thread signals only with tcgen05.commit (which waits for its mmas), the other roles only with plain arrivals"
    )]
    PlainSignal {
        /// The program.
        role: String,
        /// The step.
        step: AttnStep,
    },
    /// Registers of a `tcgen05.ld` used, or TMEM handed on, before `tcgen05.wait::ld`.
    #[error(
        "the {role} program runs `{step}` while a tcgen05.ld may still be in flight (tcgen05.wait::ld missing)"
    )]
    LoadNotWaited {
        /// The program.
        role: String,
        /// The step.
        step: AttnStep,
    },
    /// TMEM handed on before a `tcgen05.st` completed.
    #[error(
        "the {role} program runs `{step}` while a tcgen05.st may still be in flight (tcgen05.wait::st missing)"
    )]
    StoreNotWaited {
        /// The program.
        role: String,
        /// The step.
        step: AttnStep,
    },
    /// A tcgen05 op not fenced against the barrier before or after it.
    #[error(
        "the {role} program runs `{step}` without the tcgen05.fence::{fence}_thread_sync it needs"
    )]
    Unfenced {
        /// The program.
        role: String,
        /// The step.
        step: AttnStep,
        /// `after` or `before`.
        fence: &'static str,
    },
    /// Two roles touch a region in an order no barrier guarantees.
    #[error(
        "with trip counts {tiles:?}: {region} is {first} by the {first_role} ({first_step}) and {second} by the {second_role} ({second_step}) with no barrier ordering them"
    )]
    Race {
        /// The trip count of each work tile of the run.
        tiles: Vec<u32>,
        /// The region.
        region: String,
        /// The earlier access: read or written, by whom, in which step.
        first: &'static str,
        /// See [`AttentionError::Race::first`].
        first_role: String,
        /// See [`AttentionError::Race::first`].
        first_step: String,
        /// The later access.
        second: &'static str,
        /// See [`AttentionError::Race::second`].
        second_role: String,
        /// See [`AttentionError::Race::second`].
        second_step: String,
    },
    /// A parity wait would pass on a phase other than the one it means.
    #[error(
        "with trip counts {tiles:?}: the {role}'s wait on {bar} needs phase {need} completed but {completed} are; its parity would pass on the wrong phase"
    )]
    Phase {
        /// The trip counts.
        tiles: Vec<u32>,
        /// The waiting role.
        role: String,
        /// The barrier.
        bar: String,
        /// Phases the wait means to see completed.
        need: u32,
        /// Phases completed.
        completed: u32,
    },
    /// A softmax warpgroup's TMA store breaks the store protocol.
    #[error("softmax {tile}'s epilogue store: {error}")]
    Store {
        /// The Q tile.
        tile: u32,
        /// The broken rule.
        error: super::StoreError,
    },
    /// The softmax warpgroups' stores share a staging tile or a named barrier, or one uses
    /// the set-up's barrier 0.
    #[error(
        "the softmax warpgroups' epilogue stores must each have a staging tile and a named barrier (not 0) of their own"
    )]
    SharedStaging,
    /// The roles cannot all finish.
    #[error("deadlock with trip counts {tiles:?}: {blocked}")]
    Deadlock {
        /// The trip counts.
        tiles: Vec<u32>,
        /// Each unfinished role and the step it waits at.
        blocked: String,
    },
}

/// Checks the plan against its ring: the static rules, then the abstract execution.
pub(super) fn check_attention(ring: &Ring, plan: &AttentionPlan) -> Result<(), ProtocolError> {
    check_columns(plan)?;
    check_stores(plan)?;
    check_owner(plan)?;
    for (role, steps) in programs(plan) {
        check_program(&role, &steps, role_of(&role))?;
    }
    let stages = ring.stages;
    let counts: Vec<u32> = (0..=2 * stages + 1).collect();
    for &trips in &counts {
        run(ring, plan, &[trips])?;
    }
    for &a in &counts {
        for &b in &counts {
            run(ring, plan, &[a, b, (a + b) % 3 + 1])?;
        }
    }
    Ok(())
}

/// Every program of the plan with the name errors give it.
fn programs(plan: &AttentionPlan) -> Vec<(String, Vec<AttnStep>)> {
    let mut v = vec![
        ("mma warp setup".to_string(), plan.setup.clone()),
        (
            "load warp".to_string(),
            [&plan.load_tile[..], &plan.load_iteration].concat(),
        ),
        ("mma thread tile".to_string(), plan.mma_tile.clone()),
        ("mma thread".to_string(), plan.mma_iteration.clone()),
        ("mma thread tile end".to_string(), plan.mma_tile_end.clone()),
        ("mma warp exit".to_string(), plan.mma_exit.clone()),
        ("correction".to_string(), plan.correction_iteration.clone()),
    ];
    for (g, (it, end)) in plan
        .softmax_iteration
        .iter()
        .zip(&plan.softmax_end)
        .enumerate()
    {
        v.push((format!("softmax {g} tile"), plan.softmax_tile[g].clone()));
        v.push((format!("softmax {g}"), it.clone()));
        v.push((format!("softmax {g} epilogue"), end.clone()));
    }
    v
}

/// The kind of role a program belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mma,
    Other,
}

fn role_of(name: &str) -> Kind {
    if name.starts_with("mma") {
        Kind::Mma
    } else {
        Kind::Other
    }
}

/// Both tiles' `O` and `S` inside the allocation and apart from each other.
fn check_columns(plan: &AttentionPlan) -> Result<(), ProtocolError> {
    let needed = Q_TILES * (plan.d + plan.block_n);
    let err = || AttentionError::Columns {
        columns: plan.columns,
        needed,
    };
    if !plan.columns.is_power_of_two() || !(32..=TMEM_COLUMNS).contains(&plan.columns) {
        return Err(err().into());
    }
    let mut spans: Vec<(u32, u32)> = plan
        .tiles
        .iter()
        .flat_map(|t| [(t.o, t.o + plan.d), (t.s, t.s + plan.block_n)])
        .collect();
    spans.sort_unstable();
    let apart = spans.windows(2).all(|w| w[0].1 <= w[1].0);
    if plan.tiles.len() != Q_TILES as usize
        || !apart
        || spans.last().is_some_and(|s| s.1 > plan.columns)
    {
        return Err(err().into());
    }
    Ok(())
}

/// Each softmax warpgroup's store follows the store protocol, with a staging tile and a
/// named barrier of its own.
fn check_stores(plan: &AttentionPlan) -> Result<(), ProtocolError> {
    for (g, st) in plan.stores.iter().enumerate() {
        super::tma_store::check_store(st, 0..0).map_err(|error| AttentionError::Store {
            tile: g as u32,
            error,
        })?;
    }
    if let [a, b] = &plan.stores[..] {
        let apart = a.offset + a.bytes() <= b.offset || b.offset + b.bytes() <= a.offset;
        if !apart || a.barrier == b.barrier || a.barrier == 0 || b.barrier == 0 {
            return Err(AttentionError::SharedStaging.into());
        }
    } else if !plan.stores.is_empty() {
        return Err(AttentionError::SharedStaging.into());
    }
    Ok(())
}

/// The MMA warp allocates, relinquishes and publishes first, frees the same columns last
/// (after every tile's `o_empty` and a fence), and no other program owns TMEM.
fn check_owner(plan: &AttentionPlan) -> Result<(), ProtocolError> {
    let alloc = AttnStep::Alloc {
        columns: plan.columns,
    };
    if plan.setup != [alloc, AttnStep::Relinquish, AttnStep::Publish] {
        return Err(AttentionError::Owner(
            "allocate the columns once, relinquish the allocation permit and publish the \
             address before the roles split",
        )
        .into());
    }
    for (role, steps) in programs(plan) {
        let owned = role == "mma warp setup" || role == "mma warp exit";
        for &s in &steps {
            let owning = matches!(
                s,
                AttnStep::Alloc { .. } | AttnStep::Dealloc { .. } | AttnStep::Relinquish
            );
            if owning && !owned {
                return Err(AttentionError::NotOwner { role, step: s }.into());
            }
        }
    }
    let exit = &plan.mma_exit;
    let dealloc = AttnStep::Dealloc {
        columns: plan.columns,
    };
    let Some(free) = exit.iter().position(|s| *s == dealloc) else {
        return Err(
            AttentionError::Owner("free the columns it allocated after its last tile").into(),
        );
    };
    let drained = (0..Q_TILES).all(|g| {
        exit[..free].contains(&AttnStep::Wait {
            bar: AttnBar::OEmpty(g),
            start: 1,
            lag: 0,
        })
    });
    if !drained || !exit[..free].contains(&AttnStep::FenceAfter) || free + 1 != exit.len() {
        return Err(AttentionError::Owner(
            "wait on every tile's o_empty (the last output copied out) and fence after it before \
             freeing the columns, last",
        )
        .into());
    }
    Ok(())
}

/// Whether a step is a tcgen05 op touching TMEM.
fn tcgen05(s: AttnStep) -> bool {
    matches!(
        s,
        AttnStep::MmaS { .. }
            | AttnStep::MmaO { .. }
            | AttnStep::LoadS { .. }
            | AttnStep::LoadO { .. }
            | AttnStep::StoreP { .. }
            | AttnStep::StoreO { .. }
            | AttnStep::Dealloc { .. }
    )
}

/// The per-program rules of the module doc.
fn check_program(role: &str, steps: &[AttnStep], kind: Kind) -> Result<(), ProtocolError> {
    let named = |step| (role.to_string(), step);
    let (mut ld, mut st) = (false, false);
    // After a wait: no tcgen05 op until a fence::after. After a tcgen05 op: no arrival
    // until a fence::before.
    let (mut after_wait, mut touched) = (false, false);
    for &s in steps {
        match s {
            AttnStep::Commit { .. } | AttnStep::RingCommit { .. } if kind != Kind::Mma => {
                let (role, step) = named(s);
                return Err(AttentionError::PlainSignal { role, step }.into());
            }
            AttnStep::Arrive { .. } if kind == Kind::Mma => {
                let (role, step) = named(s);
                return Err(AttentionError::PlainSignal { role, step }.into());
            }
            _ => {}
        }
        match s {
            AttnStep::WaitLd => ld = false,
            AttnStep::LoadS { .. } | AttnStep::LoadO { .. } => {}
            _ if ld => {
                let (role, step) = named(s);
                return Err(AttentionError::LoadNotWaited { role, step }.into());
            }
            _ => {}
        }
        match s {
            AttnStep::WaitSt => st = false,
            AttnStep::FenceBefore | AttnStep::Arrive { .. } | AttnStep::EndRescale if st => {
                let (role, step) = named(s);
                return Err(AttentionError::StoreNotWaited { role, step }.into());
            }
            AttnStep::StoreP { .. } | AttnStep::StoreO { .. } => st = true,
            _ => {}
        }
        if matches!(s, AttnStep::LoadS { .. } | AttnStep::LoadO { .. }) {
            ld = true;
        }
        match s {
            AttnStep::Wait { .. } | AttnStep::RingWait { .. } => after_wait = true,
            AttnStep::FenceAfter => after_wait = false,
            AttnStep::FenceBefore => touched = false,
            _ if tcgen05(s) && after_wait => {
                let (role, step) = named(s);
                return Err(AttentionError::Unfenced {
                    role,
                    step,
                    fence: "after",
                }
                .into());
            }
            AttnStep::Arrive { bar } if touched && bar.hands_tmem() => {
                let (role, step) = named(s);
                return Err(AttentionError::Unfenced {
                    role,
                    step,
                    fence: "before",
                }
                .into());
            }
            _ => {}
        }
        if tcgen05(s) && kind != Kind::Mma {
            touched = true;
        }
    }
    if ld {
        let (role, step) = named(AttnStep::Epilogue);
        return Err(AttentionError::LoadNotWaited { role, step }.into());
    }
    if st {
        let (role, step) = named(AttnStep::Epilogue);
        return Err(AttentionError::StoreNotWaited { role, step }.into());
    }
    Ok(())
}

/// The roles of the machine, in the order [`run_observed`] numbers them.
pub(crate) const ROLES: [&str; 5] = [
    "load warp",
    "mma thread",
    "softmax 0",
    "softmax 1",
    "correction",
];

/// A barrier of the machine: the ring's (with its stage) or the schedule's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Ring(Bar, u32),
    Attn(AttnBar),
}

/// A shared region whose accesses must be ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Region {
    S(u32),
    O(u32),
    Scale(u32),
    Q(u32),
    K(u32),
    V(u32),
}

/// One event of a role's expanded program.
#[derive(Clone, Debug)]
enum Event {
    /// Wait until `need` phases of the barrier completed.
    Wait { key: Key, need: u32 },
    /// One arrival (and `tx` announced bytes).
    Arrive { key: Key, tx: u32 },
    /// Bytes delivered on the barrier (a TMA write completing).
    Deliver { key: Key, bytes: u32 },
    /// An access; `write` or read.
    Access { region: Region, write: bool },
    /// The step completed (for the observer; no protocol effect).
    Done { step: AttnStep, at: Pos },
}

/// An expanded step: the event and the step it came from (for messages).
type Program = Vec<(Event, String)>;

/// A barrier's state.
#[derive(Clone, Debug)]
struct Barrier {
    count: u32,
    arrived: u32,
    tx: i64,
    completed: u32,
    /// The clock of the phase in progress, and of each completed phase.
    pending_clock: Vec<u32>,
    clocks: Vec<Vec<u32>>,
}

/// The last write and the reads since, per region: `(role, clock, step)`.
#[derive(Clone, Debug, Default)]
struct History {
    write: Option<(usize, Vec<u32>, String)>,
    reads: Vec<(usize, Vec<u32>, String)>,
}

/// Runs the five roles for work tiles with trip counts `tiles`.
fn run(ring: &Ring, plan: &AttentionPlan, tiles: &[u32]) -> Result<(), ProtocolError> {
    run_observed(ring, plan, tiles, &mut |_, _, _| true)
}

/// [`run`], reporting each step a role completes (the role's index in [`ROLES`], the step,
/// where it ran) to `observe`; the run stops, successfully, when `observe` returns `false`.
pub(crate) fn run_observed(
    ring: &Ring,
    plan: &AttentionPlan,
    tiles: &[u32],
    observe: &mut dyn FnMut(usize, AttnStep, Pos) -> bool,
) -> Result<(), ProtocolError> {
    let programs: Vec<Program> = (0..ROLES.len())
        .map(|r| expand(ring, plan, r, tiles))
        .collect();
    let mut bars: BTreeMap<Key, Barrier> = BTreeMap::new();
    let count = |key: Key| match key {
        Key::Ring(Bar::Empty | Bar::TailEmpty, _) => ring.empty_count,
        Key::Ring(Bar::OnceFree, _) => 1,
        Key::Ring(_, _) => ring.full_count,
        // The machine counts warps' arrivals as one per role (a warpgroup's four arrive
        // together).
        Key::Attn(b) => u32::from(plan.count(b) > 0),
    };
    let mut clocks = vec![vec![0u32; ROLES.len()]; ROLES.len()];
    let mut pcs = vec![0usize; ROLES.len()];
    let mut history: BTreeMap<Region, History> = BTreeMap::new();
    loop {
        let mut moved = false;
        for r in 0..ROLES.len() {
            while let Some((event, step)) = programs[r].get(pcs[r]) {
                clocks[r][r] += 1;
                match *event {
                    Event::Wait { key, need } => {
                        let b = bars.entry(key).or_insert_with(|| fresh(count(key)));
                        if b.completed < need {
                            if (need - b.completed).is_multiple_of(2) {
                                return Err(phase_error(tiles, r, key, need, b.completed));
                            }
                            break;
                        }
                        if b.completed > need {
                            return Err(phase_error(tiles, r, key, need, b.completed));
                        }
                        if let Some(c) = need.checked_sub(1).and_then(|k| b.clocks.get(k as usize))
                        {
                            let c = c.clone();
                            join(&mut clocks[r], &c);
                        }
                    }
                    Event::Arrive { key, tx } => {
                        let b = bars.entry(key).or_insert_with(|| fresh(count(key)));
                        b.arrived += 1;
                        b.tx += i64::from(tx);
                        join(&mut b.pending_clock, &clocks[r]);
                        settle(b);
                    }
                    Event::Deliver { key, bytes } => {
                        let b = bars.entry(key).or_insert_with(|| fresh(count(key)));
                        b.tx -= i64::from(bytes);
                        join(&mut b.pending_clock, &clocks[r]);
                        settle(b);
                    }
                    Event::Access { region, write } => {
                        let h = history.entry(region).or_default();
                        let me = (r, clocks[r].clone(), step.clone());
                        let mut earlier: Vec<&(usize, Vec<u32>, String)> = h.write.iter().collect();
                        if write {
                            earlier.extend(h.reads.iter());
                        }
                        for e in earlier {
                            if e.0 != r && e.1[e.0] > me.1[e.0] {
                                let write_first = h.write.as_ref().is_some_and(|w| w == e);
                                return Err(AttentionError::Race {
                                    tiles: tiles.to_vec(),
                                    region: region_name(region),
                                    first: if write_first { "written" } else { "read" },
                                    first_role: ROLES[e.0].to_string(),
                                    first_step: e.2.clone(),
                                    second: if write { "written" } else { "read" },
                                    second_role: ROLES[r].to_string(),
                                    second_step: step.clone(),
                                }
                                .into());
                            }
                        }
                        if write {
                            h.write = Some(me);
                            h.reads.clear();
                        } else {
                            h.reads.retain(|x| x.0 != r);
                            h.reads.push(me);
                        }
                    }
                    Event::Done { step, at } => {
                        if !observe(r, step, at) {
                            return Ok(());
                        }
                    }
                }
                pcs[r] += 1;
                moved = true;
            }
        }
        if pcs.iter().zip(&programs).all(|(pc, p)| *pc == p.len()) {
            return Ok(());
        }
        if !moved {
            let blocked: Vec<String> = (0..ROLES.len())
                .filter_map(|r| {
                    programs[r]
                        .get(pcs[r])
                        .map(|(_, step)| format!("the {} waits at `{step}`", ROLES[r]))
                })
                .collect();
            return Err(AttentionError::Deadlock {
                tiles: tiles.to_vec(),
                blocked: blocked.join(", "),
            }
            .into());
        }
    }
}

fn fresh(count: u32) -> Barrier {
    Barrier {
        count,
        arrived: 0,
        tx: 0,
        completed: 0,
        pending_clock: vec![0; ROLES.len()],
        clocks: Vec::new(),
    }
}

/// Completes the phase once every arrival and byte is in.
fn settle(b: &mut Barrier) {
    if b.arrived == b.count && b.tx == 0 {
        b.completed += 1;
        b.arrived = 0;
        b.clocks.push(std::mem::replace(
            &mut b.pending_clock,
            vec![0; ROLES.len()],
        ));
    }
}

fn join(into: &mut [u32], from: &[u32]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}

fn phase_error(tiles: &[u32], r: usize, key: Key, need: u32, completed: u32) -> ProtocolError {
    AttentionError::Phase {
        tiles: tiles.to_vec(),
        role: ROLES[r].to_string(),
        bar: match key {
            Key::Ring(bar, stage) => format!("{bar}[{stage}]"),
            Key::Attn(bar) => bar.to_string(),
        },
        need,
        completed,
    }
    .into()
}

fn region_name(r: Region) -> String {
    match r {
        Region::S(g) => format!("S{g}/P{g} (TMEM)"),
        Region::O(g) => format!("O{g} (TMEM)"),
        Region::Scale(g) => format!("the rescale factors of tile {g} (shared memory)"),
        Region::Q(g) => format!("Q tile {g} (shared memory)"),
        Region::K(s) => format!("K stage {s} (shared memory)"),
        Region::V(s) => format!("V stage {s} (shared memory)"),
    }
}

/// Where a role is in its expansion.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pos {
    /// The work tile (a pair of Q tiles), counted in the CTA.
    pub(crate) tile: u32,
    /// The iteration within the tile's walk.
    pub(crate) j: u32,
    /// The iteration counted across the CTA's tiles.
    pub(crate) it: u32,
    /// The tile's trip count.
    pub(crate) trips: u32,
}

/// Role `r`'s program for `tiles`, as events.
fn expand(ring: &Ring, plan: &AttentionPlan, r: usize, tiles: &[u32]) -> Program {
    let mut out = Program::new();
    let mut it = 0;
    for (tile, &trips) in tiles.iter().enumerate() {
        let at = |j, it| Pos {
            tile: tile as u32,
            j,
            it,
            trips,
        };
        let (before, per_iteration, after): (&[AttnStep], &[AttnStep], &[AttnStep]) = match r {
            0 => (&plan.load_tile, &plan.load_iteration, &[]),
            1 => (&plan.mma_tile, &plan.mma_iteration, &plan.mma_tile_end),
            2 | 3 => (
                &plan.softmax_tile[r - 2],
                &plan.softmax_iteration[r - 2],
                &plan.softmax_end[r - 2],
            ),
            _ => (&[], &plan.correction_iteration, &[]),
        };
        for &s in before {
            events(ring, s, at(0, it), &mut out);
        }
        for j in 0..trips {
            let mut rescale = true;
            for &s in per_iteration {
                // A tile's first iteration has no product in O to rescale.
                if let AttnStep::BeginRescale { .. } = s {
                    rescale = j > 0;
                }
                if rescale {
                    events(ring, s, at(j, it), &mut out);
                }
                if s == AttnStep::EndRescale {
                    rescale = true;
                }
            }
            it += 1;
        }
        for &s in after {
            events(ring, s, at(trips, it), &mut out);
        }
    }
    if r == 1 {
        for &s in &plan.mma_exit {
            events(
                ring,
                s,
                Pos {
                    tile: tiles.len() as u32,
                    j: 0,
                    it,
                    trips: 0,
                },
                &mut out,
            );
        }
    }
    out
}

/// The events of one step at `p`.
fn events(ring: &Ring, s: AttnStep, p: Pos, out: &mut Program) {
    let name = s.to_string();
    let mut push = |e: Event| out.push((e, name.clone()));
    let stage = p.it % ring.stages;
    let round = p.it / ring.stages;
    let access = |region, write| Event::Access { region, write };
    match s {
        AttnStep::RingWait { bar, start } => {
            let (key, index) = match bar {
                Bar::Once | Bar::OnceFree => (Key::Ring(bar, 0), p.tile),
                _ => (Key::Ring(bar, stage), round),
            };
            push(Event::Wait {
                key,
                need: (index + 1).saturating_sub(start),
            });
        }
        AttnStep::ExpectQ { bytes } => push(Event::Arrive {
            key: Key::Ring(Bar::Once, 0),
            tx: bytes,
        }),
        AttnStep::LoadQ { tile } => {
            push(access(Region::Q(tile), true));
            push(Event::Deliver {
                key: Key::Ring(Bar::Once, 0),
                bytes: ring.once.iter().map(|l| l.tile_bytes()).sum(),
            });
        }
        AttnStep::LoadKv => {
            for step in &ring.producer {
                match *step {
                    Step::Wait { bar, start } => push(Event::Wait {
                        key: Key::Ring(bar, stage),
                        need: (round + 1).saturating_sub(start),
                    }),
                    Step::ArriveExpectTx { bar, bytes } => push(Event::Arrive {
                        key: Key::Ring(bar, stage),
                        tx: bytes,
                    }),
                    Step::Tma { load } => {
                        let region = if load == 0 {
                            Region::K(stage)
                        } else {
                            Region::V(stage)
                        };
                        push(access(region, true));
                        push(Event::Deliver {
                            key: Key::Ring(ring.full_of(load), stage),
                            bytes: ring.loads[load].tile_bytes(),
                        });
                    }
                    _ => {}
                }
            }
        }
        AttnStep::RingCommit { bar } => {
            let key = match bar {
                Bar::Once | Bar::OnceFree => Key::Ring(bar, 0),
                _ => Key::Ring(bar, stage),
            };
            push(Event::Arrive { key, tx: 0 });
        }
        AttnStep::Wait { bar, start, lag } => {
            // A lag wait has no phase in a tile's first iteration, nor after a tile that
            // ran none.
            if lag > 0 && (p.j < lag && p.j < p.trips || p.trips == 0) {
                return;
            }
            let index = if bar.per_tile() { p.tile } else { p.it - lag };
            push(Event::Wait {
                key: Key::Attn(bar),
                need: (index + 1).saturating_sub(start),
            });
        }
        AttnStep::Arrive { bar } | AttnStep::Commit { bar } => push(Event::Arrive {
            key: Key::Attn(bar),
            tx: 0,
        }),
        AttnStep::MmaS { tile } => {
            push(access(Region::Q(tile), false));
            push(access(Region::K(stage), false));
            push(access(Region::S(tile), true));
        }
        AttnStep::MmaO { tile } => {
            push(access(Region::S(tile), false));
            push(access(Region::V(stage), false));
            push(access(Region::O(tile), true));
        }
        AttnStep::LoadS { tile } => push(access(Region::S(tile), false)),
        AttnStep::StoreP { tile } => push(access(Region::S(tile), true)),
        AttnStep::StoreScale { tile } => push(access(Region::Scale(tile), true)),
        AttnStep::LoadScale { tile } => push(access(Region::Scale(tile), false)),
        AttnStep::LoadO { tile, .. } if p.trips > 0 => push(access(Region::O(tile), false)),
        AttnStep::StoreO { tile } => push(access(Region::O(tile), true)),
        AttnStep::Dealloc { .. } => {
            for g in 0..Q_TILES {
                push(access(Region::S(g), true));
                push(access(Region::O(g), true));
            }
        }
        AttnStep::Alloc { .. }
        | AttnStep::Relinquish
        | AttnStep::Publish
        | AttnStep::FenceAfter
        | AttnStep::FenceBefore
        | AttnStep::Softmax
        | AttnStep::BeginRescale { .. }
        | AttnStep::LoadO { .. }
        | AttnStep::ScaleO { .. }
        | AttnStep::EndRescale
        | AttnStep::WaitLd
        | AttnStep::WaitSt
        | AttnStep::Epilogue => {}
    }
    out.push((Event::Done { step: s, at: p }, name));
}
