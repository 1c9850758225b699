//! The dynamic rules of the ring protocol (see the parent module's doc): both roles run on an
//! abstract machine with mbarrier semantics for one trip count.

use std::collections::BTreeMap;

use super::ProtocolError;
use crate::ring::{Bar, Ring, Roles, Step};

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
}

impl Barrier {
    /// Completes the phase once every arrival and byte is in, and re-arms the count.
    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = i64::from(self.count);
        }
    }
}

/// The abstract machine: both roles' flattened programs and the barriers.
pub(super) struct Machine<'r> {
    ring: &'r Ring,
    roles: &'r Roles,
    bars: BTreeMap<(Bar, u32), Barrier>,
    /// Per role, `(iteration, step)` in execution order, and the next index.
    programs: [Vec<(u32, Step)>; 2],
    pc: [usize; 2],
    /// Consumer wgmma groups: the iterations each reads; groups below `done` have completed.
    groups: Vec<Vec<u32>>,
    uncommitted: Vec<u32>,
    done: usize,
    released: Vec<bool>,
}

const PRODUCER: usize = 0;
const CONSUMER: usize = 1;
const ROLE: [&str; 2] = ["producer", "consumer"];

impl<'r> Machine<'r> {
    pub(super) fn new(ring: &'r Ring, roles: &'r Roles) -> Machine<'r> {
        let mut bars = BTreeMap::new();
        for s in 0..ring.stages {
            for (bar, count) in [(Bar::Full, ring.full_count), (Bar::Empty, ring.empty_count)] {
                bars.insert(
                    (bar, s),
                    Barrier {
                        count,
                        pending: i64::from(count),
                        tx: 0,
                        completed: 0,
                    },
                );
            }
        }
        if !ring.once.is_empty() {
            bars.insert(
                (Bar::Once, 0),
                Barrier {
                    count: 1,
                    pending: 1,
                    tx: 0,
                    completed: 0,
                },
            );
        }
        Machine {
            ring,
            roles,
            bars,
            programs: [Vec::new(), Vec::new()],
            pc: [0, 0],
            groups: Vec::new(),
            uncommitted: Vec::new(),
            done: 0,
            released: Vec::new(),
        }
    }

    pub(super) fn run(mut self, trips: u32) -> Result<(), ProtocolError> {
        let flat = |steps: &[Step]| -> Vec<(u32, Step)> {
            (0..trips)
                .flat_map(|i| steps.iter().map(move |&s| (i, s)))
                .collect()
        };
        // The once programs run as iteration 0, whose stage is 0 and parity the start.
        let once = |steps: &[Step]| steps.iter().map(|&s| (0, s)).collect::<Vec<_>>();
        self.programs[PRODUCER] = once(&self.ring.producer_once);
        self.programs[PRODUCER].extend(flat(&self.ring.producer));
        let mut consumer = once(&self.ring.consumer_once);
        consumer.extend(flat(&self.ring.consumer));
        consumer.extend(self.ring.consumer_drain.iter().map(|&s| (trips, s)));
        self.programs[CONSUMER] = consumer;
        self.released = vec![false; trips as usize];
        loop {
            let mut moved = false;
            for role in [PRODUCER, CONSUMER] {
                while let Some(&(i, step)) = self.programs[role].get(self.pc[role]) {
                    if !self.step(role, i, step)? {
                        break;
                    }
                    self.pc[role] += 1;
                    moved = true;
                }
            }
            let finished = (0..2).all(|r| self.pc[r] == self.programs[r].len());
            if finished {
                return Ok(());
            }
            if !moved {
                let at = |r: usize| match self.programs[r].get(self.pc[r]) {
                    Some((i, s)) => format!("blocked at `{s}` in iteration {i}"),
                    None => "finished".to_string(),
                };
                return Err(ProtocolError::Deadlock {
                    trips,
                    producer: at(PRODUCER),
                    consumer: at(CONSUMER),
                });
            }
        }
    }

    /// Executes one step; `Ok(false)` when it blocks.
    fn step(&mut self, role: usize, i: u32, step: Step) -> Result<bool, ProtocolError> {
        let stages = self.ring.stages;
        let stage = i % stages;
        match step {
            Step::Wait { bar, start } => {
                let b = self.bars[&(bar, stage)];
                let parity = start ^ ((i / stages) & 1);
                let passes = parity != b.completed % 2;
                let needed = (i / stages + 1).saturating_sub(start);
                let phase_error = || ProtocolError::Phase {
                    role: ROLE[role],
                    bar,
                    stage,
                    iteration: i,
                    parity,
                    completed: b.completed,
                    needed,
                };
                if passes != (b.completed >= needed) || b.completed > needed + 1 {
                    return Err(phase_error());
                }
                Ok(passes)
            }
            Step::ArriveExpectTx { bar, bytes } => {
                self.bar(bar, stage).tx += i64::from(bytes);
                self.arrive(bar, stage, 1)?;
                Ok(true)
            }
            Step::Tma { load } => {
                if i >= stages && !self.released[(i - stages) as usize] {
                    return Err(ProtocolError::Overwrite {
                        iteration: i,
                        previous: i - stages,
                    });
                }
                let bytes = self.ring.loads.get(load).map_or(0, |l| l.tile_bytes());
                let b = self.bar(Bar::Full, stage);
                b.tx -= i64::from(bytes);
                b.settle();
                Ok(true)
            }
            Step::TmaOnce { load } => {
                let bytes = self.ring.once.get(load).map_or(0, |l| l.tile_bytes());
                let b = self.bar(Bar::Once, 0);
                b.tx -= i64::from(bytes);
                b.settle();
                Ok(true)
            }
            Step::Mma => {
                self.uncommitted.push(i);
                Ok(true)
            }
            Step::Commit => {
                let g = std::mem::take(&mut self.uncommitted);
                self.groups.push(g);
                Ok(true)
            }
            Step::WaitGroup(n) => {
                self.done = self.done.max(self.groups.len().saturating_sub(n as usize));
                Ok(true)
            }
            Step::Arrive { bar, lag } => {
                if i < lag {
                    return Ok(true);
                }
                let j = i - lag;
                if bar == Bar::Empty && role == CONSUMER {
                    let pending = self.uncommitted.contains(&j)
                        || self.groups[self.done..].iter().any(|g| g.contains(&j));
                    if pending {
                        return Err(ProtocolError::EarlyRelease {
                            iteration: i,
                            released: j,
                        });
                    }
                    if let Some(r) = self.released.get_mut(j as usize) {
                        *r = true;
                    }
                }
                let arrivals = if role == CONSUMER {
                    self.roles.consumer_arrivals()
                } else {
                    1
                };
                self.arrive(bar, j % stages, arrivals)?;
                Ok(true)
            }
            Step::GenericWrite { .. } | Step::FenceProxyAsync => Ok(true),
        }
    }

    fn bar(&mut self, bar: Bar, stage: u32) -> &mut Barrier {
        self.bars.entry((bar, stage)).or_insert(Barrier {
            count: 0,
            pending: 0,
            tx: 0,
            completed: 0,
        })
    }

    fn arrive(&mut self, bar: Bar, stage: u32, n: u32) -> Result<(), ProtocolError> {
        let b = self.bar(bar, stage);
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
