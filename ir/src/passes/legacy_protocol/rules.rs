//! The static rules of the ring protocol (see the parent module's doc): set-up order, start
//! parities, steps after their waits, announced bytes, once loads and proxy fences.

use super::{OnceError, ProtocolError};
use crate::ring::{Bar, InitStep, Ring, Step, TmaLoad};

/// Set-up is `mbarrier.init`, then `fence.mbarrier_init`, then `bar.sync`.
pub(super) fn check_init(init: &[InitStep]) -> Result<(), ProtocolError> {
    let pos = |s: InitStep| init.iter().position(|&x| x == s);
    match (
        pos(InitStep::InitBarriers),
        pos(InitStep::FenceMbarrierInit),
        pos(InitStep::BarSync),
    ) {
        (Some(a), Some(b), Some(c)) if a < b && b < c => Ok(()),
        _ => Err(ProtocolError::Init(init.to_vec())),
    }
}

/// The per-iteration rules: start parities, steps after their waits, loads issued once and
/// announced bytes; then the once loads' rules.
pub(super) fn check_static(ring: &Ring) -> Result<(), ProtocolError> {
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
                Step::Tma { .. }
                | Step::Mma
                | Step::Tcgen05Mma
                | Step::IssueHead
                | Step::IssueTail
                | Step::Between
                    if first_wait.is_none_or(|w| w > i) =>
                {
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
    check_rotation(ring)?;
    issued_once(&ring.loads, &ring.producer, |load| Step::Tma { load })
        .map_err(|(load, times)| ProtocolError::LoadCount { load, times })?;
    check_split(ring)?;
    check_once(ring)
}

/// Per `full` array (one, or two in a split ring): the bytes announced on it are those of the
/// loads completing on it, each issued after the producer's wait on the matching `empty`;
/// the split arrays' waits start at the parities of the others.
fn check_split(ring: &Ring) -> Result<(), ProtocolError> {
    let split = !ring.tail_loads.is_empty();
    if ring.tail_loads.iter().any(|&l| l >= ring.loads.len()) {
        return Err(ProtocolError::Split(format!(
            "tail loads {:?} of a ring with {} loads",
            ring.tail_loads,
            ring.loads.len()
        )));
    }
    let uses_tail = |s: &Step| match *s {
        Step::Wait { bar, .. } | Step::ArriveExpectTx { bar, .. } | Step::Arrive { bar, .. } => {
            matches!(bar, Bar::TailFull | Bar::TailEmpty)
        }
        _ => false,
    };
    let programs = [
        &ring.producer,
        &ring.consumer,
        &ring.consumer_drain,
        &ring.consumer_start,
        &ring.consumer_exit,
    ];
    if !split
        && let Some(s) = programs
            .iter()
            .flat_map(|p| p.iter())
            .find(|s| uses_tail(s))
    {
        return Err(ProtocolError::Split(format!(
            "`{s}` in a ring without tail loads"
        )));
    }
    for (role, steps, bar, expected) in [
        ("producer", &ring.producer, Bar::TailEmpty, 1),
        ("consumer", &ring.consumer, Bar::TailFull, 0),
    ] {
        for s in steps {
            if let Step::Wait { bar: b, start } = *s
                && b == bar
                && start != expected
            {
                return Err(ProtocolError::StartPhase {
                    role,
                    bar,
                    start,
                    expected,
                });
            }
        }
    }
    for full in [Bar::Full, Bar::TailFull] {
        let announced: u32 = ring
            .producer
            .iter()
            .map(|s| match *s {
                Step::ArriveExpectTx { bar, bytes } if bar == full => bytes,
                _ => 0,
            })
            .sum();
        let loads: Vec<usize> = (0..ring.loads.len())
            .filter(|&l| ring.full_of(l) == full)
            .collect();
        // In the 2-SM form both CTAs' loads complete on the leader's `full`, which announces
        // them all.
        let ctas = ring
            .cluster
            .as_ref()
            .and_then(|c| c.pair.map(|_| c.ctas))
            .unwrap_or(1);
        let boxes = ctas
            * loads
                .iter()
                .map(|&l| ring.loads[l].tile_bytes())
                .sum::<u32>();
        if announced != boxes {
            return Err(ProtocolError::TxBytes { announced, boxes });
        }
        let empty = Ring::empty_of(full);
        for &load in &loads {
            let issued = ring.producer.iter().position(|s| *s == Step::Tma { load });
            let waited = ring
                .producer
                .iter()
                .position(|s| matches!(s, Step::Wait { bar, .. } if *bar == empty));
            if waited.is_none_or(|w| issued.is_some_and(|t| t < w)) {
                return Err(ProtocolError::BeforeWait {
                    role: "producer",
                    step: Step::Tma { load },
                    bar: empty,
                });
            }
        }
    }
    Ok(())
}

/// A rotated loop's consumer program has each rotated step once, and only a rotated loop has
/// any; turn barriers appear only where the warpgroups ping-pong, never in the producer's.
fn check_rotation(ring: &Ring) -> Result<(), ProtocolError> {
    let err = |m: String| Err(ProtocolError::Rotation(m));
    let rotated_steps = [
        Step::IssueHead,
        Step::IssueTail,
        Step::Between,
        Step::Handoff,
    ];
    let turn = |s: &Step| matches!(s, Step::TurnWait { .. } | Step::TurnPass { .. });
    let consumer = ring
        .consumer_start
        .iter()
        .chain(&ring.consumer_once)
        .chain(&ring.consumer)
        .chain(&ring.consumer_drain)
        .chain(&ring.consumer_exit);
    // A CTA's steps around its tiles hand the turn over; nothing else runs once per CTA.
    if let Some(s) = ring
        .consumer_start
        .iter()
        .chain(&ring.consumer_exit)
        .find(|s| !turn(s))
    {
        return err(format!(
            "`{s}` once per CTA: only turn hand-overs run outside the tiles"
        ));
    }
    if let Some(s) =
        ring.producer.iter().chain(&ring.producer_once).find(|s| {
            turn(s) || rotated_steps.contains(s) || matches!(s, Step::Mma | Step::Tcgen05Mma)
        })
    {
        return err(format!("the producer cannot run `{s}`"));
    }
    match &ring.overlap {
        None => {
            if let Some(s) = consumer
                .clone()
                .find(|s| turn(s) || rotated_steps.contains(s))
            {
                return err(format!("`{s}` in a loop the overlap pass did not rotate"));
            }
        }
        Some(o) => {
            for step in rotated_steps {
                let n = ring.consumer.iter().filter(|s| **s == step).count();
                if n != 1 {
                    return err(format!(
                        "`{step}` runs {n} times per iteration; it must run once"
                    ));
                }
            }
            if let Some(s) = consumer.clone().find(|s| **s == Step::Mma) {
                return err(format!(
                    "`{s}` in a rotated loop (its mmas are head and tail)"
                ));
            }
            if o.turns.is_none()
                && let Some(s) = consumer.clone().find(|s| turn(s))
            {
                return err(format!("`{s}` without ping-pong turn barriers"));
            }
        }
    }
    Ok(())
}

/// The once loads' rules (see the module doc).
fn check_once(ring: &Ring) -> Result<(), ProtocolError> {
    if ring.once.is_empty() && !(ring.producer_once.is_empty() && ring.consumer_once.is_empty()) {
        return Err(OnceError::ProgramsWithoutLoads.into());
    }
    let touches_once = |s: &Step| match *s {
        Step::Wait { bar, .. } | Step::ArriveExpectTx { bar, .. } | Step::Arrive { bar, .. } => {
            matches!(bar, Bar::Once | Bar::OnceFree)
        }
        Step::TmaOnce { .. } => true,
        _ => false,
    };
    let per_iteration = ring.producer.iter().chain(&ring.consumer);
    if let Some(s) = per_iteration
        .chain(&ring.consumer_drain)
        .chain(&ring.consumer_start)
        .chain(&ring.consumer_exit)
        .find(|s| touches_once(s))
    {
        return Err(OnceError::EveryIteration { step: *s }.into());
    }
    let mut announced = 0;
    for (k, s) in ring.producer_once.iter().enumerate() {
        match *s {
            // A persistent ring reloads the once tiles after the consumers released them.
            Step::Wait {
                bar: Bar::OnceFree,
                start,
            } if ring.persistent && k == 0 => {
                if start != 1 {
                    return Err(ProtocolError::StartPhase {
                        role: "producer",
                        bar: Bar::OnceFree,
                        start,
                        expected: 1,
                    });
                }
            }
            Step::ArriveExpectTx {
                bar: Bar::Once,
                bytes,
            } => announced += bytes,
            Step::TmaOnce { .. } => {}
            other => {
                return Err(OnceError::ProducerStep { step: other }.into());
            }
        }
    }
    let boxes = issued_once(&ring.once, &ring.producer_once, |load| Step::TmaOnce {
        load,
    })
    .map_err(|(load, times)| OnceError::LoadCount { load, times })?;
    if announced != boxes {
        return Err(OnceError::TxBytes { announced, boxes }.into());
    }
    // Turn steps (the followers handing the leader its first turn) are checked by the
    // machine; everything else the consumers run once is the wait on `once`.
    let waits = ring
        .consumer_once
        .iter()
        .filter(|s| !matches!(s, Step::TurnPass { .. } | Step::TurnWait { .. }))
        .map(|s| match *s {
            Step::Wait {
                bar: Bar::Once,
                start: 0,
            } => Ok(()),
            other => Err(OnceError::ConsumerStep { step: other }),
        })
        .collect::<Result<Vec<()>, _>>()?;
    if !ring.once.is_empty() && waits.is_empty() {
        return Err(OnceError::NoWait.into());
    }
    check_release(ring)
}

/// A persistent ring with once loads releases them once per tile, after the drain, on
/// `once_free` and waits for that release before reloading; no other ring has a release.
fn check_release(ring: &Ring) -> Result<(), ProtocolError> {
    let release = Step::Arrive {
        bar: Bar::OnceFree,
        lag: 0,
    };
    let expected: &[Step] = if ring.persistent && !ring.once.is_empty() {
        &[release]
    } else {
        &[]
    };
    if ring.consumer_release != expected {
        return Err(OnceError::Release {
            got: ring.consumer_release.clone(),
            expected: expected.to_vec(),
        }
        .into());
    }
    let waits = ring.producer_once.iter().any(|s| {
        matches!(
            s,
            Step::Wait {
                bar: Bar::OnceFree,
                ..
            }
        )
    });
    let must_wait = !expected.is_empty();
    if waits != must_wait {
        return Err(OnceError::ReloadWait { waits }.into());
    }
    Ok(())
}

/// The bytes of every box of `loads`, when `program` issues each load exactly once (as the
/// step `issue(index)`); otherwise the first load that is not, with its issue count.
fn issued_once(
    loads: &[TmaLoad],
    program: &[Step],
    issue: impl Fn(usize) -> Step,
) -> Result<u32, (usize, usize)> {
    let mut boxes = 0;
    for (l, load) in loads.iter().enumerate() {
        let times = program.iter().filter(|s| **s == issue(l)).count();
        if times != 1 {
            return Err((l, times));
        }
        boxes += load.tile_bytes();
    }
    Ok(boxes)
}

/// Every generic write must be fenced before a step that lets the async proxy read it.
fn check_fences(role: &'static str, steps: &[Step]) -> Result<(), ProtocolError> {
    let mut unfenced: Option<usize> = None;
    for s in steps {
        match s {
            Step::GenericWrite { load } => unfenced = Some(*load),
            Step::FenceProxyAsync => unfenced = None,
            Step::Mma
            | Step::Tcgen05Mma
            | Step::Tcgen05Commit { .. }
            | Step::IssueHead
            | Step::IssueTail
            | Step::Arrive { .. }
            | Step::ArrivePeer { .. }
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
            Step::Wait { .. }
            | Step::Commit
            | Step::WaitGroup(_)
            | Step::Between
            | Step::Handoff
            | Step::TurnWait { .. }
            | Step::TurnPass { .. } => {}
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
