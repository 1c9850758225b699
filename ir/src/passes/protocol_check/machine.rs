//! The dynamic rules of the schedule protocol (see `docs/pipeline.md`): every role of
//! the schedule, each replica of it in each CTA of the cluster (one CTA without a cluster),
//! runs its expanded program ([`crate::sched::expand`]) on an abstract machine for a run of
//! work tiles with given trip counts.
//!
//! The abstract machine ([`Machine`]) also clocks the schedule's CPU execution
//! ([`crate::interp::run_scheduled`]).

use std::collections::{BTreeMap, BTreeSet};

use super::ProtocolError;
use super::error::{ClusterError, Race};
use super::rules::reads;
use crate::sched::expand::{At, Section, Step, expand};
use crate::sched::tmem::TmemTileId;
use crate::sched::{
    BarrierId, BarrierKind, Index, LoadId, MmaPart, Op, Phase, Region, Role, Sched, Scope,
};

/// Runs the machine for every trip count from 0 to past the ring's second wrap, and a
/// persistent schedule for sequences of three work tiles of those.
pub(super) fn check(s: &Sched) -> Result<(), ProtocolError> {
    let counts: Vec<u32> = (0..=2 * s.stages + 1).collect();
    for &trips in &counts {
        Machine::new(s, &[trips]).run()?;
    }
    if s.persistent() {
        // Tiles of every pair of trip counts (an empty tile, a short one, one that wraps the
        // ring, ...) in both orders, then a third: the state carries over from each.
        for &a in &counts {
            for &b in &counts {
                Machine::new(s, &[a, b, (a + b) % 3 + 1]).run()?;
            }
        }
    }
    Ok(())
}

/// One mbarrier stage of one CTA.
#[derive(Clone, Debug, Default)]
struct Mbar {
    count: u32,
    /// Arrivals still missing in the current phase, and transaction bytes announced but not
    /// yet delivered.
    pending: i64,
    tx: i64,
    /// The clock and the CTAs heard from (bit per CTA) of the phase in progress, and of each
    /// completed one.
    clock: Vec<u32>,
    from: u32,
    clocks: Vec<Vec<u32>>,
    froms: Vec<u32>,
}

impl Mbar {
    fn new(count: u32, actors: usize) -> Mbar {
        Mbar {
            count,
            pending: i64::from(count),
            clock: vec![0; actors],
            ..Mbar::default()
        }
    }

    fn completed(&self) -> u32 {
        self.clocks.len() as u32
    }

    /// Completes the phase once every arrival and byte is in, and re-arms the count.
    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.pending = i64::from(self.count);
            let n = self.clock.len();
            self.clocks
                .push(std::mem::replace(&mut self.clock, vec![0; n]));
            self.froms.push(std::mem::take(&mut self.from));
        }
    }
}

/// One element of a named barrier array in one CTA.
#[derive(Clone, Debug, Default)]
struct Named {
    /// Arrivals of the generation in progress, and how many of them wait.
    arrived: u32,
    waiting: u32,
    clock: Vec<u32>,
    /// The clock of each completed generation.
    clocks: Vec<Vec<u32>>,
}

/// An mma in flight: the iteration whose data it reads and which part of the body it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Read {
    i: u32,
    part: MmaPart,
}

/// A region whose accesses must be ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Area {
    /// A box of a stage of a load's buffer.
    Buffer(LoadId, u32, usize),
    /// A TMEM tile.
    Tmem(TmemTileId),
    /// The rescale factors of a Q tile.
    Factors(u32),
}

/// The last write and the reads since, per region and CTA: `(actor, clock, op)`.
#[derive(Clone, Debug, Default)]
struct History {
    write: Option<(usize, Vec<u32>, String)>,
    reads: Vec<(usize, Vec<u32>, String)>,
}

/// One replica of a role in one CTA.
#[derive(Default)]
pub(crate) struct Actor {
    /// The role (index into the schedule's roles), the replica and the CTA.
    pub(crate) role: usize,
    pub(crate) replica: u32,
    pub(crate) cta: u32,
    steps: Vec<Step>,
    pc: usize,
    clock: Vec<u32>,
    /// mma groups: what each mma reads; groups below `done` completed.
    groups: Vec<Vec<Read>>,
    uncommitted: Vec<Read>,
    done: usize,
    /// The generation a blocked `bar.sync` arrived in; the cluster barrier's.
    named_arrival: Option<u32>,
    cluster_arrival: Option<u32>,
    /// The `(barrier, iteration or tile)` waits that passed, and the CTAs each heard from.
    landed: BTreeSet<(BarrierId, u32)>,
    heard: BTreeMap<(BarrierId, u32), u32>,
}

impl Actor {
    /// Closes the mmas issued since the last commit into a group.
    fn commit(&mut self) {
        let g = std::mem::take(&mut self.uncommitted);
        self.groups.push(g);
    }

    fn in_flight(&self, f: impl Fn(&Read) -> bool) -> bool {
        self.uncommitted.iter().any(&f) || self.groups[self.done..].iter().flatten().any(&f)
    }

    fn finished(&self) -> bool {
        self.pc == self.steps.len()
    }
}

/// The abstract machine.
///
/// The machine has mbarriers (arrival counts, transaction bytes, completed phases, parity
/// waits, the CTAs each phase heard from), named barriers (generations of the threads that
/// meet at them), per role the mmas in flight (wgmma commit groups; a `tcgen05.commit`
/// completes every mma its thread issued) and a vector clock: an arrival carries the
/// arriving role's clock into the phase it completes, a wait that passes joins it. Every
/// access to a region (a stage of a load's buffer, a TMEM tile, the rescale factors) is
/// checked against the previous conflicting access of another role: it must be ordered after
/// it by the clocks.
///
/// The machine is also the clock of the schedule's CPU execution
/// ([`crate::interp::run_scheduled`]): [`Machine::run_observed`] reports every op a role runs,
/// in the order the machine runs them, to an observer that moves the data. Each round every
/// role runs as far as it can, in role order (the producer first): the producer refills a
/// stage the moment its release lets it, the order that exposes a release that comes early.
pub(crate) struct Machine<'s> {
    s: &'s Sched,
    tiles: Vec<u32>,
    ctas: u32,
    actors: Vec<Actor>,
    bars: BTreeMap<(u32, BarrierId, u32), Mbar>,
    named: BTreeMap<(u32, BarrierId, u32), Named>,
    history: BTreeMap<(u32, Area), History>,
    /// Per CTA, barrier and iteration (tile, for a per-tile barrier): the actors that
    /// released it.
    released: BTreeMap<(u32, BarrierId, u32), BTreeSet<usize>>,
    /// The cluster barrier's generation, and the clock each completed generation carries
    /// (every actor's that met it or had finished).
    cluster_generation: u32,
    cluster_clocks: Vec<Vec<u32>>,
}

impl<'s> Machine<'s> {
    /// A machine for `s` over work tiles with trip counts `tiles`.
    pub(crate) fn new(s: &'s Sched, tiles: &[u32]) -> Machine<'s> {
        let ctas = s.cluster.as_ref().map_or(1, |c| c.ctas);
        let mut actors = Vec::new();
        for cta in 0..ctas {
            for (k, r) in s.roles.iter().enumerate() {
                if r.rank.is_some_and(|rank| rank != cta) {
                    continue;
                }
                for replica in 0..r.replicas.max(1) {
                    actors.push(Actor {
                        role: k,
                        replica,
                        cta,
                        steps: expand(r, replica, tiles),
                        ..Actor::default()
                    });
                }
            }
        }
        let n = actors.len();
        for a in &mut actors {
            a.clock = vec![0; n];
        }
        Machine {
            s,
            tiles: tiles.to_vec(),
            ctas,
            actors,
            bars: BTreeMap::new(),
            named: BTreeMap::new(),
            history: BTreeMap::new(),
            released: BTreeMap::new(),
            cluster_generation: 0,
            cluster_clocks: Vec::new(),
        }
    }

    /// Each actor's role (index into the schedule's roles), replica and CTA, in the order
    /// [`Machine::run_observed`] numbers them.
    pub(crate) fn who(&self) -> Vec<(usize, u32, u32)> {
        self.actors
            .iter()
            .map(|a| (a.role, a.replica, a.cta))
            .collect()
    }

    /// Runs every actor to its end.
    pub(crate) fn run(self) -> Result<(), ProtocolError> {
        self.run_observed(&mut |_, _| true)
    }

    /// [`Machine::run`], reporting each op an actor runs (its index and the step) to
    /// `observe` after the machine ran it; the run stops, successfully, when `observe`
    /// returns `false`.
    pub(crate) fn run_observed(
        mut self,
        observe: &mut dyn FnMut(usize, Step) -> bool,
    ) -> Result<(), ProtocolError> {
        loop {
            let mut moved = false;
            for a in 0..self.actors.len() {
                while let Some(&step) = self.actors[a].steps.get(self.actors[a].pc) {
                    self.actors[a].clock[a] += 1;
                    if !self.step(a, step)? {
                        break;
                    }
                    self.actors[a].pc += 1;
                    moved = true;
                    if !observe(a, step) {
                        return Ok(());
                    }
                }
            }
            if self.actors.iter().all(Actor::finished) {
                return self.balanced();
            }
            if self.cluster_met() {
                moved = true;
            }
            if !moved {
                return Err(self.deadlock());
            }
        }
    }

    fn role(&self, a: usize) -> &'s Role {
        &self.s.roles[self.actors[a].role]
    }

    /// How an actor is named in messages: its role, and its replica and CTA where there are
    /// several.
    fn actor_name(&self, a: usize) -> String {
        let act = &self.actors[a];
        let r = self.role(a);
        let mut name = r.kind.to_string();
        if r.replicas > 1 {
            name += &format!(" warpgroup {}", act.replica);
        }
        if self.ctas > 1 {
            name = format!("CTA {} {name}", act.cta);
        }
        name
    }

    fn deadlock(&self) -> ProtocolError {
        let blocked: Vec<String> = (0..self.actors.len())
            .map(|a| {
                let act = &self.actors[a];
                match act.steps.get(act.pc) {
                    Some(step) => format!(
                        "{} blocked at `{}` in iteration {} of tile {}",
                        self.actor_name(a),
                        self.s.name(step.op),
                        step.at.i,
                        step.at.tile
                    ),
                    None => format!("{} finished", self.actor_name(a)),
                }
            })
            .collect();
        ProtocolError::Deadlock {
            tiles: self.tiles.clone(),
            blocked: blocked.join(", "),
        }
    }

    /// Every named barrier ends between generations: no arrival is left over.
    fn balanced(&self) -> Result<(), ProtocolError> {
        match self.named.iter().find(|(_, n)| n.arrived != 0) {
            Some((&(_, _, element), _)) => Err(ProtocolError::Turn {
                barrier: element,
                lost: false,
            }),
            None => Ok(()),
        }
    }

    /// The cluster barrier completes once every actor waits at it or has finished; returns
    /// whether it did.
    fn cluster_met(&mut self) -> bool {
        let g = self.cluster_generation;
        let waiting = self.actors.iter().any(|a| a.cluster_arrival == Some(g));
        let all = self
            .actors
            .iter()
            .all(|a| a.finished() || a.cluster_arrival == Some(g));
        if waiting && all {
            let mut clock = vec![0; self.actors.len()];
            for a in &self.actors {
                join(&mut clock, &a.clock);
            }
            self.cluster_clocks.push(clock);
            self.cluster_generation += 1;
        }
        waiting && all
    }

    /// Fails when `op` of CTA `from` reaches CTA `to` after `to` exited (every actor of it
    /// finished).
    fn reaches(&self, from: u32, to: u32, op: Op) -> Result<(), ProtocolError> {
        let mut actors_of_to = self.actors.iter().filter(|a| a.cta == to);
        if to != from && actors_of_to.all(Actor::finished) {
            return Err(ClusterError::AfterExit {
                cta: to,
                from,
                op: self.s.name(op),
            }
            .into());
        }
        Ok(())
    }

    /// The iteration an op on `bar` at `at` serves, `lag` behind the loop's (the work tile,
    /// for a per-tile barrier).
    fn index(&self, bar: BarrierId, at: At, lag: u32) -> u32 {
        match self.s.mbarrier(bar).map(|m| m.phase) {
            Some(Phase::Tile) => at.tile,
            _ => at.i.saturating_sub(lag),
        }
    }

    /// The stage and phase index of `bar` for iteration (or tile) `x`.
    fn slot(&self, bar: BarrierId, x: u32) -> (u32, u32) {
        match self.s.mbarrier(bar) {
            Some(m) if m.phase == Phase::Iteration => (x % m.stages.max(1), x / m.stages.max(1)),
            _ => (0, x),
        }
    }

    fn bar(&mut self, cta: u32, bar: BarrierId, stage: u32) -> &mut Mbar {
        let count = self.s.mbarrier(bar).map_or(0, |m| m.count);
        let n = self.actors.len();
        self.bars
            .entry((cta, bar, stage))
            .or_insert_with(|| Mbar::new(count, n))
    }

    /// The CTA whose copy of `bar` an arrival of CTA `cta` lands on.
    fn home(&self, bar: BarrierId, cta: u32) -> u32 {
        match self.s.mbarrier(bar).map(|m| m.scope) {
            Some(Scope::Leader) => self
                .s
                .cluster
                .as_ref()
                .and_then(|c| c.pair)
                .map_or(cta, |p| p.leader),
            _ => cta,
        }
    }

    /// `n` arrivals of actor `a` on CTA `cta`'s `bar[stage]`, with `tx` transaction bytes:
    /// announced (`expect_tx`) when positive, delivered by its TMA when negative.
    fn arrive(
        &mut self,
        a: usize,
        cta: u32,
        bar: BarrierId,
        stage: u32,
        n: u32,
        tx: i64,
    ) -> Result<(), ProtocolError> {
        let clock = self.actors[a].clock.clone();
        let from = self.actors[a].cta;
        let s = self.s;
        let b = self.bar(cta, bar, stage);
        b.pending -= i64::from(n);
        b.tx += tx;
        b.from |= 1 << from;
        join(&mut b.clock, &clock);
        if b.pending < 0 {
            return Err(ProtocolError::TooManyArrivals {
                bar: s.barriers[bar].to_string(),
                stage,
                count: b.count,
            });
        }
        b.settle();
        Ok(())
    }

    /// Arrivals one op of actor `a` makes.
    fn arrivals(&self, a: usize) -> u32 {
        let r = self.role(a);
        r.arrivals() / r.replicas.max(1)
    }

    /// Checks an access of actor `a` to `area` of CTA `cta` against the previous conflicting
    /// ones, then records it.
    fn access(
        &mut self,
        a: usize,
        cta: u32,
        area: Area,
        write: bool,
        op: Op,
    ) -> Result<(), ProtocolError> {
        let me = (a, self.actors[a].clock.clone(), self.s.name(op));
        let h = self.history.entry((cta, area)).or_default();
        let mut earlier: Vec<&(usize, Vec<u32>, String)> = h.write.iter().collect();
        if write {
            earlier.extend(h.reads.iter());
        }
        if let Some(e) = earlier
            .into_iter()
            .find(|e| e.0 != a && e.1[e.0] > me.1[e.0])
        {
            let write_first = h.write.as_ref().is_some_and(|w| std::ptr::eq(w, e));
            let (first_actor, first_op) = (e.0, e.2.clone());
            return Err(ProtocolError::Race(Box::new(Race {
                tiles: self.tiles.clone(),
                region: self.area_name(area),
                first: if write_first { "written" } else { "read" },
                first_role: self.actor_name(first_actor),
                first_op,
                second: if write { "written" } else { "read" },
                second_role: self.actor_name(a),
                second_op: me.2,
            })));
        }
        let h = self.history.entry((cta, area)).or_default();
        if write {
            h.write = Some(me);
            h.reads.clear();
        } else {
            h.reads.retain(|x| x.0 != a);
            h.reads.push(me);
        }
        Ok(())
    }

    fn area_name(&self, area: Area) -> String {
        match area {
            Area::Buffer(l, _, b) if self.s.once(l) => {
                format!("box {b} of the once tile of {l} (shared memory)")
            }
            Area::Buffer(l, stage, b) => format!("box {b} of stage {stage} of {l} (shared memory)"),
            Area::Tmem(t) => {
                let tile = self.s.tmem.as_ref().and_then(|m| m.tiles.get(t.0));
                tile.map_or_else(|| format!("tmem{}", t.0), |x| format!("{x} (TMEM)"))
            }
            Area::Factors(g) => format!("the rescale factors of tile {g} (shared memory)"),
        }
    }

    /// The CTAs an mma of actor `a` reads and writes in: its own, or both CTAs of a 2-SM
    /// pair.
    fn mma_ctas(&self, a: usize) -> Vec<u32> {
        match self.s.cluster.as_ref() {
            Some(c) if c.pair.is_some() => (0..c.ctas).collect(),
            _ => vec![self.actors[a].cta],
        }
    }

    /// Whether an in-flight read of actor `a` uses a buffer released on `bar` for iteration
    /// (or tile) `x`.
    fn reads_freed_on(&self, a: usize, bar: BarrierId, x: u32, per_tile: bool) -> bool {
        let s = self.s;
        self.actors[a].in_flight(|r| {
            s.loads.iter().any(|(h, l)| {
                l.free == Some(bar)
                    && (r.part == MmaPart::Body || l.read_by == r.part)
                    && (per_tile || r.i == x)
                    && (!per_tile || s.once(h))
            })
        })
    }

    /// Whether every actor whose mmas read `load` in CTA `cta` (its own, or both of a 2-SM
    /// pair) released it there for `x`.
    fn all_released(&self, cta: u32, load: LoadId, free: BarrierId, x: u32) -> bool {
        let released = self.released.get(&(cta, free, x));
        (0..self.actors.len()).all(|a| {
            let program = &self.role(a).program;
            let reader = self.mma_ctas(a).contains(&cta)
                && program.ops().any(|op| reads(self.s, op).contains(&load));
            !reader || released.is_some_and(|set| set.contains(&a))
        })
    }

    /// Runs one step of actor `a`; `Ok(false)` when it blocks.
    fn step(&mut self, a: usize, step: Step) -> Result<bool, ProtocolError> {
        let s = self.s;
        let at = step.at;
        let cta = self.actors[a].cta;
        // Only waits and barriers block; every other op runs, or fails, at once.
        let ran = match step.op {
            Op::Wait { bar, start, lag } => {
                let x = self.index(bar, at, lag);
                let (stage, index) = self.slot(bar, x);
                let needed = (index + 1).saturating_sub(start);
                let b = self.bar(cta, bar, stage);
                let completed = b.completed();
                let (clock, heard) = match needed.checked_sub(1) {
                    Some(k) if completed == needed => {
                        (b.clocks[k as usize].clone(), b.froms[k as usize])
                    }
                    _ => (Vec::new(), 0),
                };
                if completed > needed
                    || (completed < needed && (needed - completed).is_multiple_of(2))
                {
                    return Err(ProtocolError::Phase {
                        tiles: self.tiles.clone(),
                        role: self.actor_name(a),
                        bar: s.barriers[bar].to_string(),
                        stage,
                        iteration: index,
                        completed,
                        needed,
                    });
                }
                if completed < needed {
                    return Ok(false);
                }
                let act = &mut self.actors[a];
                join(&mut act.clock, &clock);
                act.landed.insert((bar, x));
                act.heard.insert((bar, x), heard);
                return Ok(true);
            }
            Op::Sync { bar, index, .. } => return self.named_sync(a, bar, index),
            Op::ClusterSync => {
                let g = self.cluster_generation;
                let act = &mut self.actors[a];
                return Ok(match act.cluster_arrival {
                    Some(arrived) if arrived < g => {
                        act.cluster_arrival = None;
                        join(&mut act.clock, &self.cluster_clocks[arrived as usize]);
                        true
                    }
                    Some(_) => false,
                    None => {
                        act.cluster_arrival = Some(g);
                        false
                    }
                });
            }
            // The 2-SM pair's leader announces every CTA's bytes on its own barrier.
            Op::ExpectTx { bar, .. } if self.home(bar, cta) != cta => Ok(()),
            Op::ExpectTx { bar, bytes } => {
                let (stage, _) = self.slot(bar, self.index(bar, at, 0));
                self.arrive(a, cta, bar, stage, 1, i64::from(bytes))
            }
            Op::Arrive { bar, lag } => {
                let per_tile = s.mbarrier(bar).is_some_and(|m| m.phase == Phase::Tile);
                let x = self.index(bar, at, lag);
                if self.reads_freed_on(a, bar, x, per_tile) {
                    return Err(if per_tile {
                        ProtocolError::OnceReleasedEarly { tile: at.tile }
                    } else {
                        ProtocolError::EarlyRelease {
                            iteration: at.i,
                            released: x,
                            bar: s.barriers[bar].to_string(),
                        }
                    });
                }
                self.released.entry((cta, bar, x)).or_default().insert(a);
                let (stage, _) = self.slot(bar, x);
                let home = self.home(bar, cta);
                self.reaches(cta, home, step.op)?;
                self.arrive(a, home, bar, stage, self.arrivals(a), 0)
            }
            Op::ArrivePeer { bar, lag } => {
                let x = at.i - lag;
                if self.actors[a].in_flight(|r| r.i == x) {
                    return Err(ProtocolError::EarlyRelease {
                        iteration: at.i,
                        released: x,
                        bar: s.barriers[bar].to_string(),
                    });
                }
                let (stage, _) = self.slot(bar, x);
                let n = self.arrivals(a);
                for to in (0..self.ctas).filter(|&to| to != cta) {
                    self.reaches(cta, to, step.op)?;
                    self.arrive(a, to, bar, stage, n, 0)?;
                }
                Ok(())
            }
            Op::Tma { load } => self.tma(a, load, step),
            Op::Wgmma(_) | Op::Tcgen05Mma { .. } => self.mma(a, step),
            Op::WgmmaCommit => {
                self.actors[a].commit();
                Ok(())
            }
            Op::WgmmaWait(n) => {
                let act = &mut self.actors[a];
                act.done = act.done.max(act.groups.len().saturating_sub(n as usize));
                Ok(())
            }
            Op::Run(Region::Between)
                if self.actors[a].in_flight(|r| r.i == at.i && r.part == MmaPart::Head) =>
            {
                Err(ProtocolError::InFlight {
                    iteration: at.i,
                    what: "the code between the mmas reads the head mma's products before the head wgmma completed",
                })
            }
            Op::Run(Region::Handoff) if self.actors[a].in_flight(|r| r.part == MmaPart::Tail) => {
                Err(ProtocolError::InFlight {
                    iteration: at.i,
                    what: "P is handed to the next tail while the tail wgmma reading the previous P may still run",
                })
            }
            Op::Signal { bar, index, .. } => {
                let element = self.element(a, bar, index);
                self.named_arrive(a, bar, element, false)?;
                Ok(())
            }
            Op::Tcgen05Commit { bar, lag } => {
                // The arrival comes once every mma the thread issued so far has completed:
                // the machine completes them here, then arrives.
                let act = &mut self.actors[a];
                act.commit();
                act.done = act.groups.len();
                let x = self.index(bar, at, lag);
                let (stage, _) = self.slot(bar, x);
                let targets: Vec<u32> = match s.cluster.as_ref().and_then(|c| c.pair) {
                    Some(p) => (0..self.ctas)
                        .filter(|to| p.commit_mask & (1 << to) != 0)
                        .collect(),
                    None => vec![self.home(bar, cta)],
                };
                for to in targets {
                    self.reaches(cta, to, step.op)?;
                    self.released.entry((to, bar, x)).or_default().insert(a);
                    self.arrive(a, to, bar, stage, 1, 0)?;
                }
                Ok(())
            }
            // After a loop that ran no iteration the code after it reads the loop's initial
            // value, not the tile.
            Op::TmemLoad { .. }
                if matches!(at.section, Section::Drain | Section::End) && at.trips == 0 =>
            {
                Ok(())
            }
            Op::TmemLoad { tile, .. } => self.access(a, cta, Area::Tmem(tile), false, step.op),
            Op::TmemStore { tile } => self.access(a, cta, Area::Tmem(tile), true, step.op),
            Op::TmemDealloc { .. } => {
                let tiles = s.tmem.as_ref().map_or(0, |t| t.tiles.len());
                (0..tiles)
                    .try_for_each(|t| self.access(a, cta, Area::Tmem(TmemTileId(t)), true, step.op))
            }
            Op::FactorStore { tile } => self.access(a, cta, Area::Factors(tile), true, step.op),
            Op::FactorLoad { tile } => self.access(a, cta, Area::Factors(tile), false, step.op),
            // The code between and the handoff when no wgmma they touch is in flight.
            Op::Run(Region::Between | Region::Handoff | Region::Epilogue(_))
            | Op::GenericWrite { .. }
            | Op::FenceProxyAsync
            | Op::InitBarriers
            | Op::FenceBarrierInit
            | Op::CtaSync
            | Op::TmemAlloc { .. }
            | Op::TmemRelinquish
            | Op::TmemWaitLoad
            | Op::TmemWaitStore
            | Op::Tcgen05FenceBefore
            | Op::Tcgen05FenceAfter
            | Op::RescaleBegin { .. }
            | Op::Rescale { .. }
            | Op::RescaleEnd
            | Op::BulkWaitRead
            | Op::StagingWrite
            | Op::BulkStore
            | Op::BulkCommit
            | Op::BulkWaitAll => Ok(()),
        };
        ran.map(|()| true)
    }

    /// A TMA of `load`: refills only what its readers released, delivers its bytes where
    /// they land (a cluster's shared load in every CTA of its boxes' masks; the 2-SM pair's
    /// on the leader's barrier).
    fn tma(&mut self, a: usize, load: LoadId, step: Step) -> Result<(), ProtocolError> {
        let s = self.s;
        let at = step.at;
        let cta = self.actors[a].cta;
        let l = &s.loads[load];
        // Announced bytes count positive on a barrier, delivered ones negative.
        let bytes = -i64::from(l.tma.tile_bytes());
        if s.once(load) {
            let tile = at.tile;
            if let Some(free) = l.free
                && tile > 0
                && !self.all_released(cta, load, free, tile - 1)
            {
                return Err(ProtocolError::OnceOverwrite { tile });
            }
            for b in 0..l.tma.boxes.len() {
                self.access(a, cta, Area::Buffer(load, 0, b), true, step.op)?;
            }
            return self.arrive(a, cta, l.barrier, 0, 0, bytes);
        }
        let stages = s.stages;
        let (i, stage) = (at.i, at.i % stages);
        let cluster = s.cluster.as_ref();
        let shared = cluster.is_some_and(|c| c.shared == load.index());
        if let Some(p) = cluster.and_then(|c| c.pair) {
            // Its own half lands in its own stage, released by the leader's commit there.
            if let Some(previous) = i.checked_sub(stages) {
                let released = |free| self.released.get(&(cta, free, previous));
                let reading = |act: &Actor| act.in_flight(|r| r.i == previous);
                if l.free
                    .is_some_and(|free| released(free).is_none_or(BTreeSet::is_empty))
                    || self.actors.iter().any(reading)
                {
                    return Err(ClusterError::Refill {
                        cta,
                        iteration: i,
                        previous,
                    }
                    .into());
                }
            }
            self.reaches(cta, p.leader, step.op)?;
            for b in 0..l.tma.boxes.len() {
                self.access(a, cta, Area::Buffer(load, stage, b), true, step.op)?;
            }
            return self.arrive(a, p.leader, l.barrier, stage, 0, bytes);
        }
        // Per CTA the load lands in, the boxes that land there.
        let all: Vec<usize> = (0..l.tma.boxes.len()).collect();
        let landings: Vec<(u32, Vec<usize>)> = match cluster {
            Some(c) if shared => (0..c.ctas)
                .map(|to| {
                    let boxes = c
                        .multicast
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.issuer == cta && m.mask & (1 << to) != 0)
                        .map(|(b, _)| b)
                        .collect();
                    (to, boxes)
                })
                .filter(|(_, b): &(u32, Vec<usize>)| !b.is_empty())
                .collect(),
            _ => vec![(cta, all)],
        };
        for (to, boxes) in landings {
            self.reaches(cta, to, step.op)?;
            if let Some(free) = l.free
                && i >= stages
            {
                let previous = i - stages;
                // Refilling another CTA's stage: the free phase the producer waited on must
                // include that CTA's releases, whatever order the roles ran in.
                let heard = self.actors[a].heard.get(&(free, i)).copied().unwrap_or(0);
                if (to != cta && heard & (1 << to) == 0)
                    || !self.all_released(to, load, free, previous)
                {
                    return Err(if to == cta {
                        ProtocolError::Overwrite {
                            iteration: i,
                            previous,
                        }
                    } else {
                        ClusterError::Overwrite {
                            cta: to,
                            from: cta,
                            iteration: i,
                            previous,
                        }
                        .into()
                    });
                }
            }
            for &b in &boxes {
                self.access(a, to, Area::Buffer(load, stage, b), true, step.op)?;
            }
            let bytes = boxes.len() as u32 * l.tma.box_bytes();
            self.arrive(a, to, l.barrier, stage, 0, -i64::from(bytes))?;
        }
        Ok(())
    }

    /// An mma: its stages must have landed (for the iteration it reads); a tail wgmma may not
    /// start while the previous one may still write the accumulator; its reads go in flight
    /// until a commit group completes or a `tcgen05.commit`.
    fn mma(&mut self, a: usize, step: Step) -> Result<(), ProtocolError> {
        let s = self.s;
        let at = step.at;
        let (part, tile) = match step.op {
            Op::Wgmma(part) => (part, None),
            Op::Tcgen05Mma { part, tile } => (part, Some(tile)),
            _ => return Ok(()),
        };
        let x = at.i - step.op.lag().unwrap_or(0).min(at.i);
        for load in reads(s, step.op) {
            let l = &s.loads[load];
            if !s.once(load) && !self.actors[a].landed.contains(&(l.barrier, x)) {
                return Err(ProtocolError::ReadBeforeWait {
                    role: self.actor_name(a),
                    iteration: x,
                    bar: s.barriers[l.barrier].to_string(),
                });
            }
        }
        if step.op == Op::Wgmma(MmaPart::Tail)
            && self.actors[a].in_flight(|r| r.part == MmaPart::Tail)
        {
            return Err(ProtocolError::InFlight {
                iteration: at.i,
                what: "the carried accumulator is rescaled while the previous tail wgmma may still write it",
            });
        }
        self.actors[a].uncommitted.push(Read { i: x, part });
        for cta in self.mma_ctas(a) {
            for load in reads(s, step.op) {
                let stage = if s.once(load) { 0 } else { x % s.stages };
                for b in 0..s.loads[load].tma.boxes.len() {
                    self.access(a, cta, Area::Buffer(load, stage, b), false, step.op)?;
                }
            }
            if let (Some(t), Some(g)) = (&s.tmem, tile) {
                let index = (s.work_tiles > 1).then_some(g);
                let (read, write) = match part {
                    MmaPart::Body => (None, t.tile("acc", None)),
                    MmaPart::Head => (None, t.tile("S", index)),
                    MmaPart::Tail => (t.tile("S", index), t.tile("O", index)),
                };
                if let Some(r) = read {
                    self.access(a, cta, Area::Tmem(r), false, step.op)?;
                }
                if let Some(w) = write {
                    self.access(a, cta, Area::Tmem(w), true, step.op)?;
                }
            }
        }
        Ok(())
    }

    /// The element of named barrier array `bar` that `index` names for actor `a`.
    fn element(&self, a: usize, bar: BarrierId, index: Index) -> u32 {
        let ids = match self.s.barriers[bar].kind {
            BarrierKind::Named { ids, .. } => ids.max(1),
            BarrierKind::Mbarrier(_) => 1,
        };
        let own = self.actors[a].replica % ids;
        match index {
            Index::Own => own,
            Index::Next => (own + 1) % ids,
        }
    }

    /// A `bar.sync`: arrives once, then passes when the generation it arrived in completes.
    fn named_sync(
        &mut self,
        a: usize,
        bar: BarrierId,
        index: Index,
    ) -> Result<bool, ProtocolError> {
        let element = self.element(a, bar, index);
        let cta = self.actors[a].cta;
        let arrived = match self.actors[a].named_arrival {
            Some(g) => g,
            None => {
                let g = self.named_arrive(a, bar, element, true)?;
                self.actors[a].named_arrival = Some(g);
                g
            }
        };
        let n = self.named.get(&(cta, bar, element));
        let Some(clock) = n.and_then(|n| n.clocks.get(arrived as usize)).cloned() else {
            return Ok(false);
        };
        let act = &mut self.actors[a];
        act.named_arrival = None;
        join(&mut act.clock, &clock);
        Ok(true)
    }

    /// One arrival of actor `a` on element `element` of named barrier `bar` (`waits`: a
    /// `bar.sync`); returns the generation it arrived in. A generation that completes with
    /// nobody waiting lost a turn.
    fn named_arrive(
        &mut self,
        a: usize,
        bar: BarrierId,
        element: u32,
        waits: bool,
    ) -> Result<u32, ProtocolError> {
        let r = self.role(a);
        let threads_per_replica = 32 * r.warps / r.replicas.max(1);
        let meeting = match self.s.barriers[bar].kind {
            BarrierKind::Named { threads, .. } => (threads / threads_per_replica.max(1)).max(1),
            BarrierKind::Mbarrier(_) => 1,
        };
        let cta = self.actors[a].cta;
        let clock = self.actors[a].clock.clone();
        let n_actors = self.actors.len();
        let n = self
            .named
            .entry((cta, bar, element))
            .or_insert_with(|| Named {
                clock: vec![0; n_actors],
                ..Named::default()
            });
        let generation = n.clocks.len() as u32;
        n.arrived += 1;
        n.waiting += u32::from(waits);
        join(&mut n.clock, &clock);
        if n.arrived == meeting {
            if n.waiting == 0 {
                return Err(ProtocolError::Turn {
                    barrier: element,
                    lost: true,
                });
            }
            n.arrived = 0;
            n.waiting = 0;
            let done = std::mem::replace(&mut n.clock, vec![0; n_actors]);
            n.clocks.push(done);
        }
        Ok(generation)
    }
}

fn join(into: &mut [u32], from: &[u32]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}
