//! The `protocol_check` pass (sm_90a): proves the stage rings' barrier protocol before any
//! PTX is written. A violation is a compiler error, not a hang on the GPU.
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
//! Dynamic rules: both roles are executed on an abstract machine with mbarrier semantics
//! (pending arrivals, transaction bytes, completed phases, parity waits) for every trip count
//! from 0 to `2 * stages + 1`, which covers a cold ring, the first wrap of every stage and a
//! second wrap. It fails when the roles deadlock (a wait without its arrive, too few bytes),
//! a barrier gets more arrivals than its count, a parity wait would pass on a different phase
//! than the one it means (phases disagree), a stage is released before the wgmma reading it
//! has completed (`wgmma.wait_group`), or TMA refills a stage before the consumers released it.

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::ring::{Bar, InitStep, Ring, Roles, Step};
use crate::target::Target;

/// A broken ring protocol.
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
    /// The once loads or the `once` barrier are misused.
    #[error("once loads: {0}")]
    Once(String),
    /// Neither role can move.
    #[error("deadlock with {trips} iteration(s): producer {producer}, consumers {consumer}")]
    Deadlock {
        /// The trip count simulated.
        trips: u32,
        /// Where the producer stands.
        producer: String,
        /// Where the consumers stand.
        consumer: String,
    },
}

/// Checks every ring of the kernel.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a {
        return Ok(());
    }
    for ring in kernel.schedule.rings.values() {
        let loc = kernel.ops[ring.for_op].loc;
        let Some(roles) = kernel.schedule.roles else {
            return Err(Diagnostic::internal(loc, "a stage ring without warp roles"));
        };
        check(ring, &roles).map_err(|e| {
            Diagnostic::new(
                loc,
                format!("internal kiln error: the pipelined loop's barrier protocol is wrong: {e}"),
            )
        })?;
    }
    Ok(())
}

/// Checks one ring: the static rules, then the abstract execution (see the module doc).
pub fn check(ring: &Ring, roles: &Roles) -> Result<(), ProtocolError> {
    check_init(&ring.init)?;
    check_static(ring)?;
    for trips in 0..=2 * ring.stages + 1 {
        Machine::new(ring, roles).run(trips)?;
    }
    Ok(())
}

fn check_init(init: &[InitStep]) -> Result<(), ProtocolError> {
    let pos = |s: InitStep| init.iter().position(|&x| x == s);
    match (
        pos(InitStep::InitBarriers),
        pos(InitStep::FenceMbarrierInit),
        pos(InitStep::BarSync),
    ) {
        (Some(a), Some(b), Some(c)) if a < b && b < c => Ok(()),
        _ => Err(ProtocolError::Init(format!("{init:?}"))),
    }
}

fn check_static(ring: &Ring) -> Result<(), ProtocolError> {
    for (role, steps, bar, expected) in [
        ("producer", &ring.producer, Bar::Empty, 1),
        ("consumer", &ring.consumer, Bar::Full, 0),
    ] {
        let first_wait = steps
            .iter()
            .position(|s| matches!(s, Step::Wait { bar: b, .. } if *b == bar));
        for (i, s) in steps.iter().enumerate() {
            match *s {
                Step::Wait { bar: b, start } if b == bar && start != expected => {
                    return Err(ProtocolError::StartPhase {
                        role,
                        bar,
                        start,
                        expected,
                    });
                }
                Step::Tma { .. } | Step::Mma if first_wait.is_none_or(|w| w > i) => {
                    return Err(ProtocolError::BeforeWait {
                        role,
                        step: *s,
                        bar,
                    });
                }
                _ => {}
            }
        }
        check_fences(role, steps)?;
    }
    let announced: u32 = ring
        .producer
        .iter()
        .map(|s| match s {
            Step::ArriveExpectTx {
                bar: Bar::Full,
                bytes,
            } => *bytes,
            _ => 0,
        })
        .sum();
    let mut boxes = 0;
    for (l, load) in ring.loads.iter().enumerate() {
        let times = ring
            .producer
            .iter()
            .filter(|s| **s == Step::Tma { load: l })
            .count();
        if times != 1 {
            return Err(ProtocolError::LoadCount { load: l, times });
        }
        boxes += load.tile_bytes();
    }
    if announced != boxes {
        return Err(ProtocolError::TxBytes { announced, boxes });
    }
    check_once(ring)
}

/// The once loads' rules (see the module doc).
fn check_once(ring: &Ring) -> Result<(), ProtocolError> {
    if ring.once.is_empty() && !(ring.producer_once.is_empty() && ring.consumer_once.is_empty()) {
        return Err(ProtocolError::Once(
            "once programs without once loads".into(),
        ));
    }
    let touches_once = |s: &Step| match *s {
        Step::Wait { bar, .. } | Step::ArriveExpectTx { bar, .. } | Step::Arrive { bar, .. } => {
            bar == Bar::Once
        }
        Step::TmaOnce { .. } => true,
        _ => false,
    };
    let per_iteration = ring.producer.iter().chain(&ring.consumer);
    if let Some(s) = per_iteration
        .chain(&ring.consumer_drain)
        .find(|s| touches_once(s))
    {
        return Err(ProtocolError::Once(format!(
            "`{s}` runs every iteration; the once barrier has a single phase"
        )));
    }
    let mut announced = 0;
    for s in &ring.producer_once {
        match *s {
            Step::ArriveExpectTx {
                bar: Bar::Once,
                bytes,
            } => announced += bytes,
            Step::TmaOnce { .. } => {}
            other => {
                return Err(ProtocolError::Once(format!(
                    "the producer's once program may only announce and issue once loads, not `{other}`"
                )));
            }
        }
    }
    let mut boxes = 0;
    for (l, load) in ring.once.iter().enumerate() {
        let times = ring
            .producer_once
            .iter()
            .filter(|s| **s == Step::TmaOnce { load: l })
            .count();
        if times != 1 {
            return Err(ProtocolError::Once(format!(
                "once load {l} is issued {times} times; it must be issued once"
            )));
        }
        boxes += load.tile_bytes();
    }
    if announced != boxes {
        return Err(ProtocolError::Once(format!(
            "the producer announces {announced} transaction bytes on `once` but its boxes carry {boxes}"
        )));
    }
    let waits = ring
        .consumer_once
        .iter()
        .map(|s| match *s {
            Step::Wait {
                bar: Bar::Once,
                start: 0,
            } => Ok(()),
            other => Err(ProtocolError::Once(format!(
                "the consumers' once program may only wait on `once` from parity 0, not `{other}`"
            ))),
        })
        .collect::<Result<Vec<()>, _>>()?;
    if !ring.once.is_empty() && waits.is_empty() {
        return Err(ProtocolError::Once(
            "the consumers read once loads without waiting on `once`".into(),
        ));
    }
    Ok(())
}

/// Every generic write must be fenced before a step that lets the async proxy read it.
fn check_fences(role: &'static str, steps: &[Step]) -> Result<(), ProtocolError> {
    let mut unfenced: Option<usize> = None;
    for s in steps {
        match s {
            Step::GenericWrite { load } => unfenced = Some(*load),
            Step::FenceProxyAsync => unfenced = None,
            Step::Mma
            | Step::Arrive { .. }
            | Step::ArriveExpectTx { .. }
            | Step::Tma { .. }
            | Step::TmaOnce { .. } => {
                if let Some(load) = unfenced {
                    return Err(ProtocolError::Unfenced {
                        role,
                        load,
                        step: s.to_string(),
                    });
                }
            }
            Step::Wait { .. } | Step::Commit | Step::WaitGroup(_) => {}
        }
    }
    match unfenced {
        Some(load) => Err(ProtocolError::Unfenced {
            role,
            load,
            step: "the end of the iteration".into(),
        }),
        None => Ok(()),
    }
}

/// One mbarrier of the abstract machine.
#[derive(Clone, Copy, Debug)]
struct Barrier {
    count: u32,
    pending: i64,
    tx: i64,
    completed: u32,
}

impl Barrier {
    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = i64::from(self.count);
        }
    }
}

/// The abstract machine: both roles' flattened programs and the barriers.
struct Machine<'r> {
    ring: &'r Ring,
    roles: &'r Roles,
    bars: BTreeMap<(u8, u32), Barrier>,
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

fn key(bar: Bar, stage: u32) -> (u8, u32) {
    let b = match bar {
        Bar::Full => 0,
        Bar::Empty => 1,
        Bar::Once => 2,
    };
    (b, stage)
}

impl<'r> Machine<'r> {
    fn new(ring: &'r Ring, roles: &'r Roles) -> Machine<'r> {
        let mut bars = BTreeMap::new();
        for s in 0..ring.stages {
            for (bar, count) in [(Bar::Full, ring.full_count), (Bar::Empty, ring.empty_count)] {
                bars.insert(
                    key(bar, s),
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
                key(Bar::Once, 0),
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

    fn run(mut self, trips: u32) -> Result<(), ProtocolError> {
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
                let b = self.bars[&key(bar, stage)];
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
        self.bars.entry(key(bar, stage)).or_insert(Barrier {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::OpId;
    use crate::ring::{Operand, TmaBox, TmaLoad};

    fn load(index: u32, box_dims: [u32; 2], boxes: u32) -> TmaLoad {
        TmaLoad {
            load: OpId::from_index(index as usize),
            param: index as usize,
            lead_dims: 0,
            operand: if index == 0 {
                Operand::KMajorA
            } else {
                Operand::MnMajorB
            },
            box_dims,
            swizzle: 128,
            boxes: (0..boxes)
                .map(|j| TmaBox {
                    origin: [0, 64 * j],
                    smem_offset: j * box_dims[0] * box_dims[1] * 2,
                })
                .collect(),
            offset: 0,
            stage_stride: 16384,
        }
    }

    /// The ring the `pipeline` pass plans for a 128x128x64 GEMM with 3 stages.
    fn good() -> (Ring, Roles) {
        let loads = vec![load(0, [128, 64], 1), load(1, [64, 64], 2)];
        let bytes = loads.iter().map(TmaLoad::tile_bytes).sum();
        let ring = Ring {
            for_op: OpId::from_index(0),
            stages: 3,
            loads,
            once: Vec::new(),
            once_offset: 0,
            full_offset: 0,
            empty_offset: 24,
            full_count: 1,
            empty_count: 8,
            init: vec![
                InitStep::InitBarriers,
                InitStep::FenceMbarrierInit,
                InitStep::BarSync,
            ],
            producer_once: Vec::new(),
            consumer_once: Vec::new(),
            producer: vec![
                Step::Wait {
                    bar: Bar::Empty,
                    start: 1,
                },
                Step::ArriveExpectTx {
                    bar: Bar::Full,
                    bytes,
                },
                Step::Tma { load: 0 },
                Step::Tma { load: 1 },
            ],
            consumer: vec![
                Step::Wait {
                    bar: Bar::Full,
                    start: 0,
                },
                Step::Mma,
                Step::Commit,
                Step::WaitGroup(1),
                Step::Arrive {
                    bar: Bar::Empty,
                    lag: 1,
                },
            ],
            consumer_drain: vec![Step::WaitGroup(0)],
        };
        let roles = Roles {
            consumer_warps: 8,
            producer_warps: 4,
            producer_regs: 40,
            consumer_regs: 232,
        };
        (ring, roles)
    }

    /// The ring the `pipeline` pass plans for attention: `Q` once, `K` and `V` per stage, two
    /// stages, each product waited for in the body and its stage released at once.
    fn attention_like() -> (Ring, Roles) {
        let (mut ring, roles) = good();
        ring.stages = 2;
        ring.once = vec![load(0, [128, 64], 1)];
        let once_bytes = ring.once[0].tile_bytes();
        ring.producer_once = vec![
            Step::ArriveExpectTx {
                bar: Bar::Once,
                bytes: once_bytes,
            },
            Step::TmaOnce { load: 0 },
        ];
        ring.consumer_once = vec![Step::Wait {
            bar: Bar::Once,
            start: 0,
        }];
        ring.consumer = vec![
            Step::Wait {
                bar: Bar::Full,
                start: 0,
            },
            Step::Mma,
            Step::Commit,
            Step::WaitGroup(0),
            Step::Arrive {
                bar: Bar::Empty,
                lag: 0,
            },
        ];
        ring.consumer_drain = Vec::new();
        (ring, roles)
    }

    fn broken_attention(edit: impl FnOnce(&mut Ring)) -> ProtocolError {
        let (mut ring, roles) = attention_like();
        edit(&mut ring);
        check(&ring, &roles).expect_err("a broken protocol must be rejected")
    }

    #[test]
    fn once_loads_and_immediate_release_pass() {
        let (ring, roles) = attention_like();
        check(&ring, &roles).expect("the attention protocol is sound");
    }

    #[test]
    fn broken_once_protocols_are_rejected() {
        let e = broken_attention(|r| r.consumer_once.clear());
        assert!(e.to_string().contains("without waiting on `once`"), "{e}");
        let e = broken_attention(|r| {
            r.producer_once.pop();
        });
        assert!(e.to_string().contains("issued 0 times"), "{e}");
        let e = broken_attention(|r| {
            if let Step::ArriveExpectTx { bytes, .. } = &mut r.producer_once[0] {
                *bytes += 16;
            }
        });
        assert!(e.to_string().contains("on `once`"), "{e}");
        let e = broken_attention(|r| r.consumer.push(r.consumer_once[0]));
        assert!(e.to_string().contains("single phase"), "{e}");
        // Releasing the stage just used while its wgmma may still run.
        let e = broken_attention(|r| r.consumer[3] = Step::WaitGroup(1));
        assert!(matches!(e, ProtocolError::EarlyRelease { .. }), "{e}");
    }

    fn broken(edit: impl FnOnce(&mut Ring)) -> ProtocolError {
        let (mut ring, roles) = good();
        edit(&mut ring);
        check(&ring, &roles).expect_err("a broken protocol must be rejected")
    }

    #[test]
    fn planned_ring_passes() {
        let (ring, roles) = good();
        check(&ring, &roles).expect("the planned protocol is sound");
    }

    #[test]
    fn missing_consumer_release_deadlocks() {
        let e = broken(|r| r.consumer.retain(|s| !matches!(s, Step::Arrive { .. })));
        assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
        assert!(e.to_string().contains("wait empty"), "{e}");
    }

    #[test]
    fn wrong_tx_bytes_are_rejected() {
        let e = broken(|r| {
            if let Step::ArriveExpectTx { bytes, .. } = &mut r.producer[1] {
                *bytes -= 2048;
            }
        });
        assert_eq!(
            e,
            ProtocolError::TxBytes {
                announced: 30720,
                boxes: 32768
            }
        );
    }

    #[test]
    fn producer_empty_phase_must_start_at_one() {
        let e = broken(|r| {
            r.producer[0] = Step::Wait {
                bar: Bar::Empty,
                start: 0,
            }
        });
        assert!(
            matches!(
                e,
                ProtocolError::StartPhase {
                    role: "producer",
                    bar: Bar::Empty,
                    start: 0,
                    expected: 1
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn release_before_wgmma_completes_is_rejected() {
        let e = broken(|r| {
            r.consumer[4] = Step::Arrive {
                bar: Bar::Empty,
                lag: 0,
            }
        });
        assert_eq!(
            e,
            ProtocolError::EarlyRelease {
                iteration: 0,
                released: 0
            }
        );
    }

    #[test]
    fn wrong_empty_count_is_rejected() {
        let e = broken(|r| r.empty_count = 4);
        assert!(
            matches!(
                e,
                ProtocolError::TooManyArrivals {
                    bar: Bar::Empty,
                    ..
                }
            ),
            "{e}"
        );
        let e = broken(|r| r.empty_count = 16);
        assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    }

    #[test]
    fn unfenced_generic_write_is_rejected() {
        let e = broken(|r| r.consumer.insert(1, Step::GenericWrite { load: 0 }));
        assert!(
            matches!(
                e,
                ProtocolError::Unfenced {
                    role: "consumer",
                    load: 0,
                    ..
                }
            ),
            "{e}"
        );
        let (mut ring, roles) = good();
        ring.consumer.insert(1, Step::GenericWrite { load: 0 });
        ring.consumer.insert(2, Step::FenceProxyAsync);
        check(&ring, &roles).expect("a fenced generic write is fine");
    }

    #[test]
    fn set_up_without_fence_is_rejected() {
        let e = broken(|r| r.init.retain(|s| *s != InitStep::FenceMbarrierInit));
        assert!(matches!(e, ProtocolError::Init(_)), "{e}");
    }

    #[test]
    fn tma_before_empty_wait_is_rejected() {
        let e = broken(|r| r.producer.swap(0, 2));
        assert!(
            matches!(
                e,
                ProtocolError::BeforeWait {
                    role: "producer",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_producer_arrive_is_rejected() {
        let e = broken(|r| {
            r.producer.remove(1);
            r.full_count = 1;
        });
        // The static byte check sees it first: nothing announces the boxes' bytes.
        assert!(
            matches!(e, ProtocolError::TxBytes { announced: 0, .. }),
            "{e}"
        );
    }

    #[test]
    fn double_release_is_rejected() {
        // Releasing a stage twice per iteration completes `empty` a phase early: the
        // producer's parity wait then tests a phase that is not the one it means.
        let e = broken(|r| {
            r.consumer.push(Step::Arrive {
                bar: Bar::Empty,
                lag: 1,
            });
            r.empty_count = 8;
        });
        assert!(
            matches!(
                e,
                ProtocolError::Phase { .. } | ProtocolError::TooManyArrivals { .. }
            ),
            "{e}"
        );
    }
}
