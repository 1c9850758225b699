//! The static rules of the stage rings and once loads (see `docs/pipeline.md`): set-up
//! order, start parities, loads after the waits that free their stage, announced bytes,
//! once loads, proxy fences and the rotation's shape.

use std::collections::{BTreeMap, BTreeSet};

use super::{OnceError, ProtocolError};
use crate::sched::{BarrierId, LoadId, MmaPart, Op, Phase, Region, Role, Sched};

/// Every rule of this module.
pub(super) fn check(s: &Sched) -> Result<(), ProtocolError> {
    if s.cluster.is_none() {
        check_init(s)?;
    }
    if let Some(p) = producer(s) {
        check_producer(s, p)?;
    }
    for r in readers(s) {
        check_reader(s, r)?;
    }
    for r in &s.roles {
        check_fences(s, r)?;
    }
    check_rotation(s)?;
    check_once(s)
}

/// Set-up is `mbarrier.init`, then `fence.mbarrier_init`, then the set-up barrier.
fn check_init(s: &Sched) -> Result<(), ProtocolError> {
    if in_order(
        &s.setup,
        &[Op::InitBarriers, Op::FenceBarrierInit, Op::CtaSync],
    ) {
        return Ok(());
    }
    Err(ProtocolError::Init(format!("[{}]", s.names(&s.setup))))
}

/// Whether every op of `seq` occurs in `ops`, the first of each after the previous one's.
pub(super) fn in_order(ops: &[Op], seq: &[Op]) -> bool {
    let at: Option<Vec<usize>> = seq
        .iter()
        .map(|op| ops.iter().position(|x| x == op))
        .collect();
    at.is_some_and(|at| at.is_sorted_by(|a, b| a < b))
}

/// The role issuing the loads.
pub(super) fn producer(s: &Sched) -> Option<&Role> {
    s.roles
        .iter()
        .find(|r| r.program.ops().any(|op| matches!(op, Op::Tma { .. })))
}

/// The roles whose mmas read loads.
pub(super) fn readers(s: &Sched) -> impl Iterator<Item = &Role> {
    s.roles.iter().filter(|r| r.program.ops().any(is_mma))
}

/// Whether `op` is an mma (reading stages).
pub(super) fn is_mma(op: Op) -> bool {
    matches!(op, Op::Wgmma(_) | Op::Tcgen05Mma { .. })
}

/// Whether `r` issues wgmmas (an sm_90a consumer).
pub(super) fn wgmma_role(r: &Role) -> bool {
    r.program.ops().any(|op| matches!(op, Op::Wgmma(_)))
}

/// The loads an mma op reads: every load for the body; the head's (and the once loads of
/// its Q tile) or the tail's.
pub(super) fn reads(s: &Sched, op: Op) -> Vec<LoadId> {
    let (part, tile) = match op {
        Op::Wgmma(part) => (part, None),
        Op::Tcgen05Mma { part, tile } => (part, Some(tile)),
        _ => return Vec::new(),
    };
    s.loads
        .iter()
        .filter(|(h, l)| {
            let tile_ok = !s.once(*h) || tile.is_none_or(|t| t == l.work_tile);
            (part == MmaPart::Body || l.read_by == part) && tile_ok
        })
        .map(|(h, _)| h)
        .collect()
}

/// Fails unless `r`'s wait on `bar` starts at parity `expected`.
fn starts_at(
    s: &Sched,
    r: &Role,
    bar: BarrierId,
    start: u32,
    expected: u32,
) -> Result<(), ProtocolError> {
    if start == expected {
        return Ok(());
    }
    Err(ProtocolError::StartPhase {
        role: r.kind.to_string(),
        bar: s.barriers[bar].to_string(),
        start,
        expected,
    })
}

/// The producer's rules: each ring load once per iteration, after the wait on its free
/// barrier (from parity 1); the bytes announced on each barrier those of its loads; nothing
/// of a reader's.
fn check_producer(s: &Sched, p: &Role) -> Result<(), ProtocolError> {
    let role = p.kind.to_string();
    let it = &p.program.iteration;
    let reader_op =
        |op: &Op| is_mma(*op) || matches!(op, Op::Sync { .. } | Op::Signal { .. } | Op::Run(_));
    if let Some(op) = p.program.ops().find(reader_op) {
        return Err(ProtocolError::Rotation(format!(
            "the producer cannot run `{}`",
            s.name(op)
        )));
    }
    let frees: BTreeSet<BarrierId> = s.ring_loads().filter_map(|(_, l)| l.free).collect();
    let mut waited = BTreeSet::new();
    for &op in it {
        match op {
            Op::Wait { bar, start, .. } => {
                if frees.contains(&bar) {
                    starts_at(s, p, bar, start, 1)?;
                }
                waited.insert(bar);
            }
            Op::Tma { load } if !s.once(load) => {
                if let Some(free) = s.loads[load].free
                    && !waited.contains(&free)
                {
                    return Err(ProtocolError::BeforeWait {
                        role,
                        op: s.name(op),
                        bar: s.barriers[free].to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    for (h, _) in s.ring_loads() {
        issued_once(it, h, "iteration")?;
    }
    // In the 2-SM pair every CTA's loads complete on the leader's barrier, which announces
    // them all.
    let ctas = s
        .cluster
        .as_ref()
        .and_then(|c| c.pair.map(|_| c.ctas))
        .unwrap_or(1);
    // Per barrier, the bytes announced on it and those of the boxes completing on it.
    let mut tx: BTreeMap<BarrierId, (u32, u32)> = BTreeMap::new();
    for op in it {
        if let Op::ExpectTx { bar, bytes } = *op {
            tx.entry(bar).or_default().0 += bytes;
        }
    }
    for (_, l) in s.ring_loads() {
        tx.entry(l.barrier).or_default().1 += ctas * l.tma.tile_bytes();
    }
    for (bar, (announced, boxes)) in tx {
        if announced != boxes {
            return Err(ProtocolError::TxBytes {
                bar: s.barriers[bar].to_string(),
                announced,
                boxes,
            });
        }
    }
    Ok(())
}

/// Fails unless `ops` issue `load` exactly once (per `per`: `iteration` or `tile`).
fn issued_once(ops: &[Op], load: LoadId, per: &'static str) -> Result<(), ProtocolError> {
    let times = ops.iter().filter(|&&op| op == Op::Tma { load }).count();
    if times == 1 {
        return Ok(());
    }
    let load = load.to_string();
    Err(ProtocolError::LoadCount { load, times, per })
}

/// A reader's rules: its waits on a ring load's barrier start at parity 0 and come before
/// the mmas of the iteration that read it (a rotated tail's reads, of the iteration before,
/// the machine proves); a wgmma role waits on no per-iteration barrier no load lands on.
fn check_reader(s: &Sched, r: &Role) -> Result<(), ProtocolError> {
    let before_wait = |op: Op, bar: String| {
        let (role, op) = (r.kind.to_string(), s.name(op));
        Err(ProtocolError::BeforeWait { role, op, bar })
    };
    let data: BTreeSet<BarrierId> = s.ring_loads().map(|(_, l)| l.barrier).collect();
    let frees: BTreeSet<BarrierId> = s.loads.iter().filter_map(|(_, l)| l.free).collect();
    let mut waited = BTreeSet::new();
    for &op in &r.program.iteration {
        match op {
            Op::Wait { bar, start, .. } => {
                if data.contains(&bar) {
                    starts_at(s, r, bar, start, 0)?;
                }
                let landing = s.mbarrier(bar).is_some_and(|m| m.phase == Phase::Iteration)
                    && !data.contains(&bar)
                    && !frees.contains(&bar);
                if landing && wgmma_role(r) {
                    return Err(ProtocolError::Split(format!(
                        "`{}` waits for a barrier no load lands on",
                        s.name(op)
                    )));
                }
                waited.insert(bar);
            }
            Op::Wgmma(MmaPart::Tail) if r.program.rotated => {}
            Op::Wgmma(_) | Op::Tcgen05Mma { .. } | Op::Run(Region::Between) => {
                for load in reads(s, op).into_iter().filter(|&l| !s.once(l)) {
                    let bar = s.loads[load].barrier;
                    if !waited.contains(&bar) {
                        return before_wait(op, s.barriers[bar].to_string());
                    }
                }
                if op == Op::Run(Region::Between)
                    && wgmma_role(r)
                    && !waited.iter().any(|b| data.contains(b))
                {
                    let bar = data
                        .iter()
                        .next()
                        .map_or_else(String::new, |&b| s.barriers[b].to_string());
                    return before_wait(op, bar);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every generic write must be fenced before an op that lets the async proxy read it.
fn check_fences(s: &Sched, r: &Role) -> Result<(), ProtocolError> {
    let mut unfenced: Option<LoadId> = None;
    let err = |load: LoadId, op: String| ProtocolError::Unfenced {
        role: r.kind.to_string(),
        load: load.to_string(),
        op,
    };
    for &op in &r.program.iteration {
        match op {
            Op::GenericWrite { load } => unfenced = Some(load),
            Op::FenceProxyAsync => unfenced = None,
            Op::Wgmma(_)
            | Op::Tcgen05Mma { .. }
            | Op::Tcgen05Commit { .. }
            | Op::Arrive { .. }
            | Op::ArrivePeer { .. }
            | Op::ExpectTx { .. }
            | Op::Tma { .. } => {
                if let Some(load) = unfenced {
                    return Err(err(load, s.name(op)));
                }
            }
            _ => {}
        }
    }
    match unfenced {
        Some(load) => Err(err(load, "the end of the iteration".into())),
        None => Ok(()),
    }
}

/// The ops of a rotated wgmma program, each once per round.
const ROTATED: [Op; 4] = [
    Op::Wgmma(MmaPart::Head),
    Op::Wgmma(MmaPart::Tail),
    Op::Run(Region::Between),
    Op::Run(Region::Handoff),
];

/// A rotated wgmma program runs each rotated op once per round, and only a rotated program
/// has any; turn barriers only where the replicas take turns; a wgmma role runs only turn
/// hand-overs once per CTA (and, at exit, its stores' and the cluster's waits).
fn check_rotation(s: &Sched) -> Result<(), ProtocolError> {
    let err = |op: Op, why: &str| Err(ProtocolError::Rotation(format!("`{}` {why}", s.name(op))));
    let turn = |op: &Op| matches!(op, Op::Sync { .. } | Op::Signal { .. });
    for r in s.roles.iter().filter(|r| wgmma_role(r)) {
        let p = &r.program;
        let outside = p
            .start
            .iter()
            .chain(&p.exit)
            .find(|op| !turn(op) && !matches!(op, Op::BulkWaitAll | Op::ClusterSync));
        if let Some(&op) = outside {
            return err(
                op,
                "once per CTA: only turn hand-overs run outside the tiles",
            );
        }
        let body: Vec<Op> = p.ops_except(&["release", "end"]).collect();
        if !p.rotated {
            if let Some(&op) = body.iter().find(|op| turn(op) || ROTATED.contains(op)) {
                return err(op, "in a loop the overlap pass did not rotate");
            }
            continue;
        }
        for op in ROTATED {
            let n = p.iteration.iter().filter(|&&x| x == op).count();
            if n != 1 {
                return err(
                    op,
                    &format!("runs {n} times per iteration; it must run once"),
                );
            }
        }
        if let Some(&op) = body.iter().find(|&&op| op == Op::Wgmma(MmaPart::Body)) {
            return err(op, "in a rotated loop (its mmas are head and tail)");
        }
        if r.replicas < 2
            && let Some(&op) = body.iter().find(|op| turn(op))
        {
            return err(op, "without ping-pong turn barriers");
        }
    }
    Ok(())
}

/// The once loads' rules (see `docs/pipeline.md`).
fn check_once(s: &Sched) -> Result<(), ProtocolError> {
    let once: Vec<LoadId> = s.once_loads().collect();
    let Some(p) = producer(s) else {
        return Ok(());
    };
    if once.is_empty() {
        if !p.program.tile.is_empty() {
            return Err(OnceError::ProgramsWithoutLoads.into());
        }
        return Ok(());
    }
    let bars: BTreeSet<BarrierId> = once.iter().map(|&l| s.loads[l].barrier).collect();
    let frees: BTreeSet<BarrierId> = once.iter().filter_map(|&l| s.loads[l].free).collect();
    let touches = |op: &Op| match *op {
        Op::Tma { load } => once.contains(&load),
        _ => op
            .barrier()
            .is_some_and(|b| bars.contains(&b) || frees.contains(&b)),
    };
    for r in std::iter::once(p).chain(readers(s)) {
        let mut every = r.program.ops_except(&["tile", "release", "end"]);
        if let Some(op) = every.find(|op| touches(op)) {
            return Err(OnceError::EveryIteration { op: s.name(op) }.into());
        }
    }
    let persistent = s.persistent();
    let mut announced = 0;
    for (k, &op) in p.program.tile.iter().enumerate() {
        match op {
            Op::Wait { bar, start, .. } if frees.contains(&bar) && k == 0 => {
                starts_at(s, p, bar, start, 1)?;
            }
            Op::ExpectTx { bar, bytes } if bars.contains(&bar) => announced += bytes,
            Op::Tma { load } if once.contains(&load) => {}
            other => return Err(OnceError::ProducerStep { op: s.name(other) }.into()),
        }
    }
    let mut boxes = 0;
    for &l in &once {
        issued_once(&p.program.tile, l, "tile")?;
        boxes += s.loads[l].tma.tile_bytes();
    }
    if announced != boxes {
        return Err(OnceError::TxBytes { announced, boxes }.into());
    }
    for r in readers(s).filter(|r| {
        r.program
            .ops()
            .any(|op| reads(s, op).iter().any(|l| once.contains(l)))
    }) {
        let role = r.kind.to_string();
        let mut waits = false;
        for &op in &r.program.tile {
            match op {
                Op::Wait { bar, start: 0, .. } if bars.contains(&bar) => waits = true,
                Op::Sync { .. } | Op::Signal { .. } => {}
                other if wgmma_role(r) || touches(&other) => {
                    return Err(OnceError::ConsumerStep {
                        role,
                        op: s.name(other),
                    }
                    .into());
                }
                _ => {}
            }
        }
        if !waits {
            return Err(OnceError::NoWait { role }.into());
        }
        // A reader of once loads in a persistent schedule releases them once per tile on
        // their free barrier (a commit, from an MMA thread); no other schedule releases them.
        let expected: Vec<Op> = match frees.first() {
            Some(&bar) if persistent => vec![if wgmma_role(r) {
                Op::arrive(bar)
            } else {
                Op::commit(bar)
            }],
            _ => Vec::new(),
        };
        if r.program.release != expected {
            return Err(OnceError::Release {
                role,
                got: s.names(&r.program.release),
                expected: s.names(&expected),
            }
            .into());
        }
    }
    let reload = p
        .program
        .tile
        .iter()
        .any(|op| matches!(*op, Op::Wait { bar, .. } if frees.contains(&bar)));
    if reload != persistent {
        return Err(OnceError::ReloadWait { waits: reload }.into());
    }
    Ok(())
}
