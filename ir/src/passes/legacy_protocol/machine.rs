//! The dynamic rules of the ring protocol (see the parent module's doc): the producer and each
//! consumer warpgroup run on an abstract machine with mbarrier, named-barrier and wgmma-group
//! semantics for a sequence of work tiles (one for a kernel that is not persistent), each with
//! its trip count. A clustered ring ([`crate::cluster`]) runs every CTA of its cluster on the
//! same machine, each with its own barriers and roles: a multicast box lands in every CTA of
//! its mask, a peer release arrives on the other CTAs' barrier, and a CTA exits when its roles
//! are done (or, with the exit barrier, when every CTA's are).
//!
//! The machine is also the clock of the schedule's CPU execution ([`crate::interp::run_scheduled`]):
//! [`Machine::run_observed`] reports every step a role executes, in the order the machine
//! runs them, to an observer that moves the data. The order is the machine's own, a round of
//! each role running as far as it can, the producer first: the producer refills a stage the
//! moment its release lets it, which is the order that exposes a release that comes too early.

use std::collections::BTreeMap;

use super::ProtocolError;
use super::cluster::ClusterError;
use crate::cluster::Pair;
use crate::ring::{Bar, Ring, Step, Turns};

/// One mbarrier of the abstract machine.
#[derive(Clone, Copy, Debug)]
struct Barrier {
    /// Arrivals per phase (the init count).
    count: u32,
    /// Arrivals still missing in the current phase.
    pending: i64,
    /// Transaction bytes announced but not yet delivered.
    tx: i64,
    /// Phases completed so far.
    completed: u32,
    /// The CTAs whose roles arrived in the current phase, and in the last completed one
    /// (bit `c` for CTA `c`): what a wait that passes on it has heard from.
    from: u32,
    heard: u32,
}

impl Barrier {
    fn new(count: u32) -> Barrier {
        Barrier {
            count,
            pending: i64::from(count),
            tx: 0,
            completed: 0,
            from: 0,
            heard: 0,
        }
    }

    /// Completes the phase once every arrival and byte is in, and re-arms the count.
    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = i64::from(self.count);
            self.heard = std::mem::take(&mut self.from);
        }
    }
}

/// A named barrier between two consumer warpgroups (`bar.sync` / `bar.arrive` with the
/// thread count of [`Turns::MEETING`] warpgroups): a generation completes when two
/// warpgroups arrived.
#[derive(Clone, Copy, Debug, Default)]
struct TurnBarrier {
    /// Warpgroups arrived in the current generation, and how many of them wait.
    arrived: u32,
    waiting: u32,
    /// Generations completed.
    generation: u32,
}

/// What a wgmma of a group reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// A whole body's mmas (an unrotated program).
    Body,
    /// The head mma (its products are read by the code between).
    Head,
    /// The tail mma (accumulates into the carried registers, reads the handed-off `P`).
    Tail,
}

/// One step of a role's program: the ring iteration it runs in (counted across tiles), the
/// work tile, and the step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At {
    /// The iteration, counted across the tiles of the run.
    pub(crate) i: u32,
    /// The work tile (0 for a kernel that is not persistent).
    pub(crate) tile: u32,
    /// The step.
    pub(crate) step: Step,
}

/// One role's program and state.
struct Role {
    /// The CTA of the cluster it runs in (0 without a cluster).
    cta: u32,
    /// The steps in execution order, and the next index.
    program: Vec<At>,
    pc: usize,
    /// wgmma groups: what each wgmma reads (iteration, part); groups below `done` completed.
    groups: Vec<Vec<(u32, Part)>>,
    uncommitted: Vec<(u32, Part)>,
    done: usize,
    /// The turn-barrier generation a blocked `TurnWait` arrived in.
    turn_arrival: Option<u32>,
    /// The `(full array, iteration)` waits that passed: what the role may read.
    landed: std::collections::BTreeSet<(Bar, u32)>,
    /// Per wait that passed, the CTAs whose arrivals completed the phase it passed on.
    heard: BTreeMap<(Bar, u32), u32>,
}

impl Role {
    fn new(cta: u32, program: Vec<At>) -> Role {
        Role {
            cta,
            program,
            pc: 0,
            groups: Vec::new(),
            uncommitted: Vec::new(),
            done: 0,
            turn_arrival: None,
            landed: std::collections::BTreeSet::new(),
            heard: BTreeMap::new(),
        }
    }

    /// Whether a wgmma matching `f` may still be running.
    fn in_flight(&self, f: impl Fn(&(u32, Part)) -> bool) -> bool {
        self.uncommitted.iter().any(&f) || self.groups[self.done..].iter().flatten().any(&f)
    }

    fn at(&self) -> String {
        match self.program.get(self.pc) {
            Some(a) => format!(
                "blocked at `{}` in iteration {} of tile {}",
                a.step, a.i, a.tile
            ),
            None => "finished".to_string(),
        }
    }
}

/// The abstract machine: per CTA of the cluster (one without a cluster) the producer, each
/// consumer warpgroup, and the barriers.
pub(crate) struct Machine<'r> {
    ring: &'r Ring,
    /// CTAs in the cluster (1 without one).
    ctas: u32,
    /// Keyed by CTA, array and stage.
    bars: BTreeMap<(u32, Bar, u32), Barrier>,
    /// Per CTA, one per consumer warpgroup (CTA `c`'s barrier `b` at `c * warpgroups + b`).
    turns: Vec<TurnBarrier>,
    roles: Vec<Role>,
    /// Arrivals each consumer warpgroup's `Arrive` makes.
    arrivals: u32,
    /// Per CTA and iteration, how many of its consumer warpgroups released its stage (of
    /// `empty`, and of `tail_empty` in a split ring).
    released: Vec<Vec<u32>>,
    released_tail: Vec<Vec<u32>>,
    /// Per CTA and tile, how many consumer warpgroups released its once tiles.
    once_released: Vec<Vec<u32>>,
    /// Per CTA, whether it has exited.
    exited: Vec<bool>,
}

/// The producer's role index; consumer warpgroup `g` is role `g + 1` (in CTA `c` of a
/// cluster, role `c * (1 + warpgroups)` and on).
pub(crate) const PRODUCER: usize = 0;

impl<'r> Machine<'r> {
    /// A fresh machine for `ring` whose consumers are `consumer_warps` warps, each arriving
    /// once per release.
    pub(crate) fn new(ring: &'r Ring, consumer_warps: u32) -> Machine<'r> {
        let ctas = ring.cluster.as_ref().map_or(1, |c| c.ctas);
        let mut bars = BTreeMap::new();
        let mut arrays = vec![(Bar::Full, ring.full_count), (Bar::Empty, ring.empty_count)];
        if !ring.tail_loads.is_empty() {
            arrays.extend([
                (Bar::TailFull, ring.full_count),
                (Bar::TailEmpty, ring.empty_count),
            ]);
        }
        for (cta, s) in (0..ctas).flat_map(|c| (0..ring.stages).map(move |s| (c, s))) {
            for &(bar, count) in &arrays {
                bars.insert((cta, bar, s), Barrier::new(count));
            }
        }
        if !ring.once.is_empty() {
            let once_free = ring.persistent.then_some((Bar::OnceFree, ring.empty_count));
            for (cta, (bar, count)) in (0..ctas).flat_map(|c| {
                std::iter::once((Bar::Once, 1))
                    .chain(once_free)
                    .map(move |b| (c, b))
            }) {
                bars.insert((cta, bar, 0), Barrier::new(count));
            }
        }
        let warpgroups = consumer_warpgroups(ring, consumer_warps);
        Machine {
            ring,
            ctas,
            bars,
            turns: vec![TurnBarrier::default(); (warpgroups * ctas) as usize],
            roles: Vec::new(),
            arrivals: consumer_warps / warpgroups,
            released: Vec::new(),
            released_tail: Vec::new(),
            once_released: Vec::new(),
            exited: vec![false; ctas as usize],
        }
    }

    fn warpgroups(&self) -> u32 {
        self.turns.len() as u32 / self.ctas
    }

    /// Roles per CTA: the producer and the consumer warpgroups.
    fn per_cta(&self) -> usize {
        1 + self.warpgroups() as usize
    }

    /// Runs the roles over work tiles with trip counts `tiles` (one tile for a kernel that
    /// is not persistent).
    pub(super) fn run(self, tiles: &[u32]) -> Result<(), ProtocolError> {
        self.run_observed(tiles, &mut |_, _| true)
    }

    /// [`Machine::run`], reporting each step a role executes (its role index and the step)
    /// to `observe` after the machine executed it; the run stops, successfully, when
    /// `observe` returns `false`.
    pub(crate) fn run_observed(
        mut self,
        tiles: &[u32],
        observe: &mut dyn FnMut(usize, At) -> bool,
    ) -> Result<(), ProtocolError> {
        let ring = self.ring;
        let mut producer = Vec::new();
        let mut consumers = vec![Vec::new(); self.warpgroups() as usize];
        let wgs = self.warpgroups();
        // The CTA's own steps around its tiles: the first and the last of the run.
        let per_cta = |list: &'r [Step], wg: usize, i: u32, tile: u32| {
            list.iter()
                .filter(move |s| runs_in(**s, wg as u32, wgs))
                .map(move |&step| At { i, tile, step })
        };
        for (wg, consumer) in consumers.iter_mut().enumerate() {
            consumer.extend(per_cta(&ring.consumer_start, wg, 0, 0));
        }
        let mut base = 0;
        for (tile, &trips) in tiles.iter().enumerate() {
            let tile = tile as u32;
            // Steps of local iteration `t` (the release lags count from the tile's start).
            // A rotated loop's lags count from the tile's start; an unrotated one's run on
            // across tiles (its first release frees the previous tile's last stage).
            let from = if ring.overlap.is_some() { 0 } else { base };
            let at = |t: u32, step: Step| {
                let released_earlier = matches!(
                    step,
                    Step::Arrive { lag, .. }
                    | Step::ArrivePeer { lag, .. }
                    | Step::Tcgen05Commit { lag, .. } if from + t < lag
                );
                (!released_earlier).then_some(At {
                    i: base + t,
                    tile,
                    step,
                })
            };
            let iteration = |t: u32| ring.producer.iter().filter_map(move |&s| at(t, s));
            // A persistent ring issues its first iteration before reloading the once tiles.
            let first = u32::from(ring.persistent).min(trips);
            producer.extend((0..first).flat_map(iteration));
            producer.extend(ring.producer_once.iter().filter_map(|&s| at(0, s)));
            producer.extend((first..trips).flat_map(iteration));
            for (wg, consumer) in consumers.iter_mut().enumerate() {
                let wgs = self.warpgroups();
                let steps =
                    |list: &'r [Step]| list.iter().filter(move |s| runs_in(**s, wg as u32, wgs));
                consumer.extend(steps(&ring.consumer_once).filter_map(|&s| at(0, s)));
                let release = steps(&ring.consumer_release).filter_map(|&s| at(trips, s));
                if ring.overlap.is_some() {
                    // Rotated: iterations 0 ..= trips, each step in the iterations it serves;
                    // the once tiles are released when the last head mma is done, before the
                    // last iteration (the last block's tail).
                    let rounds = if trips == 0 { 0 } else { trips + 1 };
                    for t in 0..rounds {
                        if t == trips {
                            consumer.extend(release.clone());
                        }
                        consumer.extend(
                            steps(&ring.consumer)
                                .filter(|s| s.runs_rotated(t, trips))
                                .filter_map(|&s| at(t, s)),
                        );
                    }
                    if trips == 0 {
                        consumer.extend(release);
                    }
                    consumer.extend(steps(&ring.consumer_drain).filter_map(|&s| at(trips, s)));
                } else {
                    for t in 0..trips {
                        consumer.extend(steps(&ring.consumer).filter_map(|&s| at(t, s)));
                    }
                    consumer.extend(steps(&ring.consumer_drain).filter_map(|&s| at(trips, s)));
                    consumer.extend(release);
                }
            }
            base += trips;
        }
        let last = tiles.len().saturating_sub(1) as u32;
        for (wg, consumer) in consumers.iter_mut().enumerate() {
            consumer.extend(per_cta(&ring.consumer_exit, wg, base, last));
        }
        // Every CTA of a cluster runs the same programs: the pair walks its tiles in lockstep.
        // In the 2-SM form only the leader's MMA thread consumes and only its producer
        // announces the pair's bytes.
        let pair = ring.cluster.as_ref().and_then(|c| c.pair);
        for cta in 0..self.ctas {
            let peer = pair.is_some_and(|p| p.leader != cta);
            let own = |program: &Vec<At>| -> Vec<At> {
                match peer {
                    true => program
                        .iter()
                        .filter(|a| !matches!(a.step, Step::ArriveExpectTx { .. }))
                        .copied()
                        .collect(),
                    false => program.clone(),
                }
            };
            self.roles.push(Role::new(cta, own(&producer)));
            for consumer in &consumers {
                let program = if peer { Vec::new() } else { consumer.clone() };
                self.roles.push(Role::new(cta, program));
            }
        }
        let ctas = self.ctas as usize;
        self.released = vec![vec![0; base as usize]; ctas];
        self.released_tail = vec![vec![0; base as usize]; ctas];
        self.once_released = vec![vec![0; tiles.len()]; ctas];
        loop {
            let mut moved = false;
            for role in 0..self.roles.len() {
                while let Some(&at) = self.roles[role].program.get(self.roles[role].pc) {
                    if !self.step(role, at)? {
                        break;
                    }
                    self.roles[role].pc += 1;
                    moved = true;
                    if !observe(role, at) {
                        return Ok(());
                    }
                }
            }
            if self.roles.iter().all(|r| r.pc == r.program.len()) {
                return self.balanced();
            }
            self.exit_finished();
            if !moved {
                let per_cta = self.per_cta();
                let cta = |r: &Role| {
                    if self.ctas > 1 {
                        format!("CTA {} ", r.cta)
                    } else {
                        String::new()
                    }
                };
                let consumer = self
                    .roles
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| k % per_cta != PRODUCER)
                    .map(|(k, r)| format!("{}warpgroup {} {}", cta(r), k % per_cta - 1, r.at()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let producer = self
                    .roles
                    .iter()
                    .step_by(per_cta)
                    .map(|r| format!("{}{}", cta(r), r.at()))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(ProtocolError::Deadlock {
                    tiles: tiles.to_vec(),
                    producer,
                    consumer,
                });
            }
        }
    }

    /// Every turn barrier ends between generations: no arrival is left over at exit.
    fn balanced(&self) -> Result<(), ProtocolError> {
        match self.turns.iter().position(|t| t.arrived != 0) {
            Some(b) => Err(ProtocolError::TurnUnbalanced {
                barrier: b as u32 % self.warpgroups(),
            }),
            None => Ok(()),
        }
    }

    /// Marks the CTAs whose roles are all done as exited; with the cluster's exit barrier
    /// none leaves before every CTA's roles are done (and then nothing runs any more).
    fn exit_finished(&mut self) {
        if self.ring.cluster.as_ref().is_some_and(|c| c.exit_sync) {
            return;
        }
        for cta in 0..self.ctas {
            let mut roles = self.roles.iter().filter(|r| r.cta == cta);
            if roles.all(|r| r.pc == r.program.len()) {
                self.exited[cta as usize] = true;
            }
        }
    }

    /// Fails when `step` of CTA `from` reaches CTA `to` after `to` exited.
    fn reaches(&self, from: u32, to: u32, step: Step) -> Result<(), ProtocolError> {
        if to != from && self.exited[to as usize] {
            return Err(ClusterError::AfterExit {
                cta: to,
                from,
                step,
            }
            .into());
        }
        Ok(())
    }

    /// Executes one step; `Ok(false)` when it blocks.
    fn step(&mut self, role: usize, at: At) -> Result<bool, ProtocolError> {
        let At { i, tile, step } = at;
        // The once barriers have one phase per tile and no stages.
        let (stages, i) = match step {
            Step::Wait { bar, .. }
            | Step::Arrive { bar, .. }
            | Step::ArriveExpectTx { bar, .. }
                if matches!(bar, Bar::Once | Bar::OnceFree) =>
            {
                (1, tile)
            }
            _ => (self.ring.stages, i),
        };
        let stage = i % stages;
        let cta = self.roles[role].cta;
        let local = role % self.per_cta();
        let role_name = if local == PRODUCER {
            "producer"
        } else {
            "consumer"
        };
        match step {
            Step::Wait { bar, start } => {
                let b = self.bars[&(cta, bar, stage)];
                let parity = start ^ ((i / stages) & 1);
                let passes = parity != b.completed % 2;
                let needed = (i / stages + 1).saturating_sub(start);
                if passes != (b.completed >= needed) || b.completed > needed + 1 {
                    return Err(ProtocolError::Phase {
                        role: role_name,
                        bar,
                        stage,
                        iteration: i,
                        parity,
                        completed: b.completed,
                        needed,
                    });
                }
                if passes {
                    self.roles[role].landed.insert((bar, i));
                    self.roles[role].heard.insert((bar, i), b.heard);
                }
                Ok(passes)
            }
            Step::ArriveExpectTx { bar, bytes } => {
                self.bar(cta, bar, stage).tx += i64::from(bytes);
                self.arrive(cta, bar, stage, 1, cta)?;
                Ok(true)
            }
            Step::Tma { load } if self.pair().is_some() => self.pair_tma(cta, load, i, stage),
            Step::Tma { load } => {
                let full = self.ring.full_of(load);
                // Where each of the load's bytes land: the CTA's own stage, or, for the
                // cluster's shared load, the boxes this CTA issues in every CTA of their mask.
                let landings: Vec<(u32, u32)> = match &self.ring.cluster {
                    Some(c) if c.shared == load => {
                        let bytes = self.ring.loads.get(load).map_or(0, |l| l.box_bytes());
                        (0..self.ctas)
                            .map(|to| {
                                let boxes = c
                                    .multicast
                                    .iter()
                                    .filter(|m| m.issuer == cta && m.mask & (1 << to) != 0)
                                    .count() as u32;
                                (to, boxes * bytes)
                            })
                            .filter(|&(_, b)| b > 0)
                            .collect()
                    }
                    _ => vec![(cta, self.ring.loads.get(load).map_or(0, |l| l.tile_bytes()))],
                };
                for (to, bytes) in landings {
                    self.reaches(cta, to, step)?;
                    // Refilling another CTA's stage: the `empty` phase the producer waited on
                    // must include that CTA's releases, whatever order the roles ran in.
                    let heard = self.roles[role]
                        .heard
                        .get(&(Ring::empty_of(full), i))
                        .copied()
                        .unwrap_or(0);
                    if to != cta && i >= stages && heard & (1 << to) == 0 {
                        return Err(ClusterError::Overwrite {
                            cta: to,
                            from: cta,
                            iteration: i,
                            previous: i - stages,
                        }
                        .into());
                    }
                    let wgs = self.warpgroups();
                    let released = if full == Bar::TailFull {
                        &self.released_tail[to as usize]
                    } else {
                        &self.released[to as usize]
                    };
                    if i >= stages && released[(i - stages) as usize] < wgs {
                        return Err(if to == cta {
                            ProtocolError::Overwrite {
                                iteration: i,
                                previous: i - stages,
                            }
                        } else {
                            ClusterError::Overwrite {
                                cta: to,
                                from: cta,
                                iteration: i,
                                previous: i - stages,
                            }
                            .into()
                        });
                    }
                    let b = self.bar(to, full, stage);
                    b.tx -= i64::from(bytes);
                    b.settle();
                }
                Ok(true)
            }
            Step::TmaOnce { load } => {
                let wgs = self.warpgroups();
                if tile > 0 && self.once_released[cta as usize][tile as usize - 1] < wgs {
                    return Err(ProtocolError::OnceOverwrite { tile });
                }
                let bytes = self.ring.once.get(load).map_or(0, |l| l.tile_bytes());
                let b = self.bar(cta, Bar::Once, 0);
                b.tx -= i64::from(bytes);
                b.settle();
                Ok(true)
            }
            Step::Mma | Step::Tcgen05Mma | Step::IssueHead => {
                self.read_landed(role, Bar::Full, i)?;
                let part = if step == Step::IssueHead {
                    Part::Head
                } else {
                    Part::Body
                };
                self.roles[role].uncommitted.push((i, part));
                Ok(true)
            }
            Step::IssueTail => {
                let full = if self.ring.tail_loads.is_empty() {
                    Bar::Full
                } else {
                    Bar::TailFull
                };
                self.read_landed(role, full, i - 1)?;
                // The accumulator is rescaled in registers before the tail's wgmmas.
                if self.roles[role].in_flight(|&(_, p)| p == Part::Tail) {
                    return Err(ProtocolError::AccumulatorInFlight { iteration: i });
                }
                self.roles[role].uncommitted.push((i - 1, Part::Tail));
                Ok(true)
            }
            Step::Between => {
                if self.roles[role].in_flight(|&x| x == (i, Part::Head)) {
                    return Err(ProtocolError::ReadsInFlight { iteration: i });
                }
                Ok(true)
            }
            Step::Handoff => {
                if self.roles[role].in_flight(|&(_, p)| p == Part::Tail) {
                    return Err(ProtocolError::HandoffInFlight { iteration: i });
                }
                Ok(true)
            }
            Step::Commit => {
                let r = &mut self.roles[role];
                let g = std::mem::take(&mut r.uncommitted);
                r.groups.push(g);
                Ok(true)
            }
            Step::WaitGroup(n) => {
                let r = &mut self.roles[role];
                r.done = r.done.max(r.groups.len().saturating_sub(n as usize));
                Ok(true)
            }
            Step::Arrive { bar, lag } => {
                if i < lag {
                    return Ok(true);
                }
                let j = i - lag;
                if bar == Bar::OnceFree {
                    // Head (and unrotated body) wgmmas read the once tiles; tails do not.
                    if self.roles[role].in_flight(|&(_, p)| p != Part::Tail) {
                        return Err(ProtocolError::OnceReleasedEarly { tile });
                    }
                    if let Some(r) = self.once_released[cta as usize].get_mut(tile as usize) {
                        *r += 1;
                    }
                }
                if matches!(bar, Bar::Empty | Bar::TailEmpty) && local != PRODUCER {
                    // A stage of `empty` is read by the head (and an unrotated body), one of
                    // `tail_empty` by the tail; a release waits for the wgmmas reading it.
                    let split = !self.ring.tail_loads.is_empty();
                    let tail_stage = bar == Bar::TailEmpty;
                    let reads = |&(x, p): &(u32, Part)| {
                        x == j && (!split || tail_stage == (p == Part::Tail))
                    };
                    if self.roles[role].in_flight(reads) {
                        return Err(ProtocolError::EarlyRelease {
                            iteration: i,
                            released: j,
                        });
                    }
                    let released = if bar == Bar::TailEmpty {
                        &mut self.released_tail[cta as usize]
                    } else {
                        &mut self.released[cta as usize]
                    };
                    if let Some(r) = released.get_mut(j as usize) {
                        *r += 1;
                    }
                }
                let arrivals = if local == PRODUCER { 1 } else { self.arrivals };
                self.arrive(cta, bar, j % stages, arrivals, cta)?;
                Ok(true)
            }
            Step::ArrivePeer { bar, lag } => {
                if i < lag {
                    return Ok(true);
                }
                let j = i - lag;
                // The peer's producer refills this CTA's stage once it hears this: the wgmmas
                // reading it must be done, as for the CTA's own release.
                if self.roles[role].in_flight(|&(x, _)| x == j) {
                    return Err(ProtocolError::EarlyRelease {
                        iteration: i,
                        released: j,
                    });
                }
                for to in (0..self.ctas).filter(|&to| to != cta) {
                    self.reaches(cta, to, step)?;
                    self.arrive(to, bar, j % stages, self.arrivals, cta)?;
                }
                Ok(true)
            }
            Step::TurnWait { .. } => {
                let wg = cta * self.warpgroups() + (local - 1) as u32;
                let arrived = match self.roles[role].turn_arrival {
                    Some(g) => g,
                    None => {
                        let g = self.turn_arrive(wg, true)?;
                        self.roles[role].turn_arrival = Some(g);
                        g
                    }
                };
                let passes = self.turns[wg as usize].generation > arrived;
                if passes {
                    self.roles[role].turn_arrival = None;
                }
                Ok(passes)
            }
            Step::TurnPass { .. } => {
                let next = cta * self.warpgroups() + (local as u32) % self.warpgroups();
                self.turn_arrive(next, false)?;
                Ok(true)
            }
            Step::Tcgen05Commit { bar, lag } => {
                // The arrival comes when every mma the thread issued so far has completed:
                // the machine lets them complete here, then arrives as a release would.
                let r = &mut self.roles[role];
                let g = std::mem::take(&mut r.uncommitted);
                r.groups.push(g);
                r.done = r.groups.len();
                if let Some(p) = self.pair() {
                    return self.pair_commit(cta, p.commit_mask, bar, i, lag);
                }
                self.step(
                    role,
                    At {
                        i,
                        tile,
                        step: Step::Arrive { bar, lag },
                    },
                )
            }
            Step::GenericWrite { .. } | Step::FenceProxyAsync => Ok(true),
        }
    }

    /// The ring's 2-SM form, if it is paired.
    fn pair(&self) -> Option<Pair> {
        self.ring.cluster.as_ref().and_then(|c| c.pair)
    }

    /// A TMA of CTA `cta`'s producer in the 2-SM form: its half lands in its own stage (which
    /// the pair's mma of the stage's previous iteration must have released there, through the
    /// leader's commit), its bytes complete on the leader's `full`.
    fn pair_tma(
        &mut self,
        cta: u32,
        load: usize,
        i: u32,
        stage: u32,
    ) -> Result<bool, ProtocolError> {
        let stages = self.ring.stages;
        let leader = self.pair().map_or(0, |p| p.leader);
        // The leader's mma of the stage's previous iteration reads both CTAs' halves: it must
        // have completed, and its commit released the stage here.
        let reading = |r: &Role| r.in_flight(|&(x, _)| i >= stages && x == i - stages);
        if i >= stages
            && (self.released[cta as usize][(i - stages) as usize] == 0
                || self.roles.iter().any(reading))
        {
            return Err(ClusterError::Refill {
                cta,
                iteration: i,
                previous: i - stages,
            }
            .into());
        }
        self.reaches(cta, leader, Step::Tma { load })?;
        let bytes = self.ring.loads.get(load).map_or(0, |l| l.tile_bytes());
        let b = self.bar(leader, self.ring.full_of(load), stage);
        b.tx -= i64::from(bytes);
        b.from |= 1 << cta;
        b.settle();
        Ok(true)
    }

    /// The leader's `tcgen05.commit` in the 2-SM form (the mmas before it have completed):
    /// one arrival on `bar[(i - lag) % stages]` of every CTA of `mask`, releasing the stage
    /// there.
    fn pair_commit(
        &mut self,
        cta: u32,
        mask: u16,
        bar: Bar,
        i: u32,
        lag: u32,
    ) -> Result<bool, ProtocolError> {
        if i < lag {
            return Ok(true);
        }
        let j = i - lag;
        for to in (0..self.ctas).filter(|to| mask & (1 << to) != 0) {
            self.reaches(cta, to, Step::Tcgen05Commit { bar, lag })?;
            if bar == Bar::Empty
                && let Some(r) = self.released[to as usize].get_mut(j as usize)
            {
                *r += 1;
            }
            self.arrive(to, bar, j % self.ring.stages, 1, cta)?;
        }
        Ok(true)
    }

    /// A wgmma of `role` reads the stage of iteration `i` on `full`: its wait must have passed.
    fn read_landed(&self, role: usize, full: Bar, i: u32) -> Result<(), ProtocolError> {
        if self.roles[role].landed.contains(&(full, i)) {
            Ok(())
        } else {
            Err(ProtocolError::ReadBeforeWait {
                iteration: i,
                bar: full,
            })
        }
    }

    /// One warpgroup's arrival on turn barrier `b` (`waits`: a `bar.sync`); returns the
    /// generation it arrived in. A generation that completes with nobody waiting lost a turn.
    fn turn_arrive(&mut self, b: u32, waits: bool) -> Result<u32, ProtocolError> {
        let warpgroups = self.warpgroups();
        let t = &mut self.turns[b as usize];
        let generation = t.generation;
        t.arrived += 1;
        t.waiting += u32::from(waits);
        if t.arrived == Turns::MEETING {
            if t.waiting == 0 {
                return Err(ProtocolError::TurnLost {
                    barrier: b % warpgroups,
                });
            }
            *t = TurnBarrier {
                arrived: 0,
                waiting: 0,
                generation: generation + 1,
            };
        }
        Ok(generation)
    }

    fn bar(&mut self, cta: u32, bar: Bar, stage: u32) -> &mut Barrier {
        self.bars
            .entry((cta, bar, stage))
            .or_insert(Barrier::new(0))
    }

    /// `n` arrivals of CTA `from`'s role on CTA `cta`'s `bar[stage]`.
    fn arrive(
        &mut self,
        cta: u32,
        bar: Bar,
        stage: u32,
        n: u32,
        from: u32,
    ) -> Result<(), ProtocolError> {
        let b = self.bar(cta, bar, stage);
        b.from |= 1 << from;
        b.pending -= i64::from(n);
        if b.pending < 0 {
            return Err(ProtocolError::TooManyArrivals {
                bar,
                stage,
                count: b.count,
            });
        }
        b.settle();
        Ok(())
    }
}

/// Whether consumer warpgroup `wg` of `warpgroups` runs `step` (turn steps name their
/// warpgroups).
fn runs_in(step: Step, wg: u32, warpgroups: u32) -> bool {
    match step {
        Step::TurnWait { who } | Step::TurnPass { who } => who.includes(wg, warpgroups),
        _ => true,
    }
}

/// Consumer warpgroups the machine runs separately: those taking turns when the loop
/// ping-pongs, else one standing for all (they run the same program on the same barriers).
fn consumer_warpgroups(ring: &Ring, consumer_warps: u32) -> u32 {
    ring.overlap
        .as_ref()
        .and_then(|o| o.turns)
        .map_or(1, |t| t.warpgroups.min(consumer_warps.max(1)))
}
