//! The protocol checker on the schedules the scheduling passes write for a GEMM and an
//! attention loop (plain, rotated, three warpgroups taking turns, persistent, split), built
//! here as schedule IR, and on broken copies of them: each break is rejected with its rule's
//! error.

use super::*;
use crate::entities::OpId;
use crate::sched::barrier::{BarrierId, BarrierKind, Index, Mbarrier, Phase};
use crate::sched::op::{Op, Who};
use crate::sched::overlap::{Overlap, Turns};
use crate::sched::role::{Issue, Program, Role, RoleKind};
use crate::sched::tiles::TileScheduler;
use crate::sched::tma::{Load, LoadId, Operand, TmaBox, TmaLoad};
use crate::sched::{MmaPart, Region};

// --- building schedules ---

/// The tile of ring load `index`: A (K-major) for 0, an MN-major B otherwise.
fn tile(index: u32, box_dims: [u32; 2], boxes: u32) -> TmaLoad {
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
        elem_bytes: 2,
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

/// Appends an mbarrier array after the last one.
fn mbarrier(s: &mut Sched, name: &'static str, count: u32, stages: u32, phase: Phase) -> BarrierId {
    let offset = s.barriers.iter().map(|(_, b)| b.bytes()).sum();
    let m = Mbarrier {
        offset,
        ..Mbarrier::new(count, stages, phase)
    };
    s.add_mbarrier(name, None, m)
}

/// The barrier called `name`.
fn bar(s: &Sched, name: &str) -> BarrierId {
    s.barriers
        .iter()
        .find(|(_, b)| b.name == name)
        .map(|(h, _)| h)
        .unwrap_or_else(|| panic!("no barrier `{name}`"))
}

/// The mbarrier called `name`, to edit.
fn mbar<'s>(s: &'s mut Sched, name: &str) -> &'s mut Mbarrier {
    let h = bar(s, name);
    s.barriers[h].as_mbarrier_mut().expect("an mbarrier")
}

/// The ring's stages: `s.stages` and every per-iteration barrier array's, each array moved
/// after the one before.
fn restage(s: &mut Sched, stages: u32) {
    s.stages = stages;
    let mut offset = 0;
    for k in 0..s.barriers.len() {
        if let Some(m) = s.barriers[BarrierId::from_index(k)].as_mbarrier_mut() {
            if m.phase == Phase::Iteration {
                m.stages = stages;
            }
            m.offset = offset;
            offset += 8 * m.stages;
        }
    }
}

fn role(s: &mut Sched, kind: RoleKind) -> &mut Role {
    s.roles
        .iter_mut()
        .find(|r| r.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} role"))
}

fn consumer(s: &mut Sched) -> &mut Program {
    &mut role(s, RoleKind::Consumer).program
}

fn producer(s: &mut Sched) -> &mut Program {
    &mut role(s, RoleKind::Producer).program
}

fn overlap(s: &mut Sched) -> &mut Overlap {
    s.overlap.as_mut().expect("a rotated loop")
}

fn wait(bar: BarrierId, start: u32) -> Op {
    Op::Wait { bar, start, lag: 0 }
}

fn arrive(bar: BarrierId, lag: u32) -> Op {
    Op::Arrive { bar, lag }
}

fn turn_wait(s: &Sched, who: Who) -> Op {
    Op::Sync {
        bar: bar(s, "turn"),
        index: Index::Own,
        who,
    }
}

fn turn_pass(s: &Sched, who: Who) -> Op {
    Op::Signal {
        bar: bar(s, "turn"),
        index: Index::Next,
        who,
    }
}

/// Index of `op` in `ops`.
fn at(ops: &[Op], op: Op) -> usize {
    ops.iter()
        .position(|&x| x == op)
        .unwrap_or_else(|| panic!("no `{op:?}` in the program"))
}

fn load_id(index: usize) -> LoadId {
    LoadId::from_index(index)
}

/// The ring the `pipeline` pass plans for a 128x128x64 GEMM with 3 stages: a producer
/// warpgroup, two consumer warpgroups that keep one wgmma group in flight and release each
/// stage an iteration late.
fn good() -> Sched {
    let mut s = Sched::new(OpId::from_index(0), 3);
    let full = mbarrier(&mut s, "full", 1, 3, Phase::Iteration);
    let empty = mbarrier(&mut s, "empty", 8, 3, Phase::Iteration);
    let ring_load = |tma| Load {
        tma,
        barrier: full,
        free: Some(empty),
        work_tile: 0,
        read_by: MmaPart::Body,
    };
    let a = s.loads.append(ring_load(tile(0, [128, 64], 1)));
    let b = s.loads.append(ring_load(tile(1, [64, 64], 2)));
    let bytes = s.loads.iter().map(|(_, l)| l.tma.tile_bytes()).sum();
    s.setup = vec![Op::InitBarriers, Op::FenceBarrierInit, Op::CtaSync];
    let mut consumer = Role::new(RoleKind::Consumer, 0, 8, Issue::Warps);
    consumer.regs = Some(232);
    consumer.replicas = 2;
    consumer.program = Program {
        iteration: vec![
            wait(full, 0),
            Op::Wgmma(MmaPart::Body),
            Op::WgmmaCommit,
            Op::WgmmaWait(1),
            arrive(empty, 1),
        ],
        drain: vec![Op::WgmmaWait(0)],
        end: vec![Op::Run(Region::Epilogue(None))],
        ..Program::default()
    };
    let mut producer = Role::new(RoleKind::Producer, 8, 4, Issue::Thread);
    producer.regs = Some(40);
    producer.program.iteration = vec![
        wait(empty, 1),
        Op::ExpectTx { bar: full, bytes },
        Op::Tma { load: a },
        Op::Tma { load: b },
    ];
    s.roles = vec![consumer, producer];
    s
}

/// The ring the `pipeline` pass plans for attention: `Q` once per tile, `K` and `V` per
/// stage, two stages, each product waited for in the body and its stage released at once.
fn attention_like() -> Sched {
    let mut s = good();
    restage(&mut s, 2);
    let once = mbarrier(&mut s, "once", 1, 1, Phase::Tile);
    let mut q = tile(0, [128, 64], 1);
    q.stage_stride = 0;
    let bytes = q.tile_bytes();
    let q = s.loads.append(Load {
        tma: q,
        barrier: once,
        free: None,
        work_tile: 0,
        read_by: MmaPart::Body,
    });
    let (full, empty) = (bar(&s, "full"), bar(&s, "empty"));
    producer(&mut s).tile = vec![Op::ExpectTx { bar: once, bytes }, Op::Tma { load: q }];
    let c = consumer(&mut s);
    c.tile = vec![wait(once, 0)];
    c.iteration = vec![
        wait(full, 0),
        Op::Wgmma(MmaPart::Body),
        Op::WgmmaCommit,
        Op::WgmmaWait(0),
        arrive(empty, 0),
    ];
    c.drain.clear();
    s
}

/// The rotated consumer iteration the `overlap` pass writes (`rotated_program_is_the_passes`
/// pins it to the pass's), with ping-pong turns and on a split ring or not.
fn rotated_program(s: &Sched, turns: bool, split: bool) -> Vec<Op> {
    let (full, empty) = (bar(s, "full"), bar(s, "empty"));
    let mut p = vec![wait(full, 0)];
    if turns {
        p.push(turn_wait(s, Who::All));
    }
    p.extend([
        Op::Wgmma(MmaPart::Head),
        Op::WgmmaCommit,
        Op::Wgmma(MmaPart::Tail),
        Op::WgmmaCommit,
    ]);
    if turns {
        p.push(turn_pass(s, Who::All));
    }
    // The tail group (newest) may still run; the head group is complete.
    p.push(Op::WgmmaWait(1));
    if split {
        p.push(arrive(empty, 0));
    }
    p.extend([Op::Run(Region::Between), Op::WgmmaWait(0)]);
    if split {
        p.extend([
            arrive(bar(s, "tail_empty"), 1),
            wait(bar(s, "tail_full"), 0),
        ]);
    } else {
        p.push(arrive(empty, 1));
    }
    p.push(Op::Run(Region::Handoff));
    p
}

/// The schedule the `overlap` pass makes of [`attention_like`]: three stages, `K` (and `Q`)
/// read by the head, `V` by the tail, the rotated program, and the two consumer warpgroups
/// taking turns.
fn rotated() -> Sched {
    let mut s = attention_like();
    restage(&mut s, 3);
    s.loads[load_id(0)].read_by = MmaPart::Head;
    s.loads[load_id(1)].read_by = MmaPart::Tail;
    s.loads[load_id(2)].read_by = MmaPart::Head;
    s.add_named("turn", None, (1, 2, Turns::MEETING * 128));
    s.overlap = Some(Overlap {
        head: OpId::from_index(1),
        tail: OpId::from_index(2),
        carried: 0,
        between: Vec::new(),
        tail_ops: vec![OpId::from_index(2)],
        rescale: None,
        defer: None,
        deepened: true,
        turns: Some(Turns {
            first_barrier: 1,
            warpgroups: 2,
        }),
    });
    let program = rotated_program(&s, true, false);
    let (start, exit) = (turn_pass(&s, Who::Last), turn_wait(&s, Who::Leader));
    let c = consumer(&mut s);
    c.iteration = program;
    c.rotated = true;
    c.drain.clear();
    c.start = vec![start];
    c.exit = vec![exit];
    s
}

/// [`rotated`] on three consumer warpgroups (a 192-row tile, 12 consumer warps, each arriving
/// on `empty`), taking turns in the order 0, 1, 2.
fn rotated_three() -> Sched {
    let mut s = rotated();
    let c = role(&mut s, RoleKind::Consumer);
    c.warps = 12;
    c.replicas = 3;
    role(&mut s, RoleKind::Producer).first_warp = 12;
    mbar(&mut s, "empty").count = 12;
    let turn = bar(&s, "turn");
    if let BarrierKind::Named { ids, .. } = &mut s.barriers[turn].kind {
        *ids = 3;
    }
    if let Some(t) = overlap(&mut s).turns.as_mut() {
        t.warpgroups = 3;
    }
    s
}

/// `base` made persistent as the `persistent` pass makes it: CTAs walk work tiles, the
/// producer issues a tile's first stage before it reloads the once loads, which the
/// consumers release on `once_free` after each tile.
fn persistent(base: fn() -> Sched) -> Sched {
    let mut s = base();
    s.tiles = Some(TileScheduler::Strided);
    producer(&mut s).lead = 1;
    let once: Vec<LoadId> = s.once_loads().collect();
    if !once.is_empty() {
        let count = mbar(&mut s, "empty").count;
        let free = mbarrier(&mut s, "once_free", count, 1, Phase::Tile);
        for l in once {
            s.loads[l].free = Some(free);
        }
        producer(&mut s).tile.insert(0, wait(free, 1));
        consumer(&mut s).release = vec![arrive(free, 0)];
    }
    s
}

/// [`attention_like`] with the lag-1 release of [`good`]: one wgmma group stays in flight
/// across iterations and the drain waits for it.
fn attention_lagged() -> Sched {
    let mut s = attention_like();
    let (full, empty) = (bar(&s, "full"), bar(&s, "empty"));
    let c = consumer(&mut s);
    c.iteration = vec![
        wait(full, 0),
        Op::Wgmma(MmaPart::Body),
        Op::WgmmaCommit,
        Op::WgmmaWait(1),
        arrive(empty, 1),
    ];
    c.drain = vec![Op::WgmmaWait(0)];
    s
}

/// [`rotated`] split as the `overlap` pass splits a ring it could not deepen: two stages,
/// `V` (load 1) on `tail_full` / `tail_empty`.
fn split() -> Sched {
    let mut s = rotated();
    restage(&mut s, 2);
    overlap(&mut s).deepened = false;
    let tail_full = mbarrier(&mut s, "tail_full", 1, 2, Phase::Iteration);
    let tail_empty = mbarrier(&mut s, "tail_empty", 8, 2, Phase::Iteration);
    let (k, v) = (load_id(0), load_id(1));
    s.loads[v].barrier = tail_full;
    s.loads[v].free = Some(tail_empty);
    let bytes = |l: LoadId| s.loads[l].tma.tile_bytes();
    let (full, empty) = (bar(&s, "full"), bar(&s, "empty"));
    let iteration = vec![
        wait(empty, 1),
        Op::ExpectTx {
            bar: full,
            bytes: bytes(k),
        },
        Op::Tma { load: k },
        wait(tail_empty, 1),
        Op::ExpectTx {
            bar: tail_full,
            bytes: bytes(v),
        },
        Op::Tma { load: v },
    ];
    producer(&mut s).iteration = iteration;
    let program = rotated_program(&s, true, true);
    consumer(&mut s).iteration = program;
    s
}

/// Checks a schedule that must pass, structurally and by the protocol.
fn sound(s: &Sched, what: &str) {
    if let Err(e) = crate::sched::verify::verify(s) {
        panic!("{what}: malformed: {e:?}");
    }
    check(s).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// The error for `base`'s schedule after `edit`; panics if the edited one is accepted.
fn rejected(base: fn() -> Sched, edit: impl FnOnce(&mut Sched)) -> ProtocolError {
    let mut s = base();
    edit(&mut s);
    check(&s).expect_err("a broken protocol must be rejected")
}

fn broken(edit: impl FnOnce(&mut Sched)) -> ProtocolError {
    rejected(good, edit)
}

fn broken_attention(edit: impl FnOnce(&mut Sched)) -> ProtocolError {
    rejected(attention_like, edit)
}

fn broken_rotated(edit: impl FnOnce(&mut Sched)) -> ProtocolError {
    rejected(rotated, edit)
}

// --- the GEMM ring ---

#[test]
fn planned_ring_passes() {
    sound(&good(), "the planned protocol");
}

#[test]
fn missing_consumer_release_deadlocks() {
    let e = broken(|s| {
        consumer(s)
            .iteration
            .retain(|op| !matches!(op, Op::Arrive { .. }))
    });
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    assert!(e.to_string().contains("wait empty"), "{e}");
}

#[test]
fn wrong_tx_bytes_are_rejected() {
    let e = broken(|s| {
        if let Op::ExpectTx { bytes, .. } = &mut producer(s).iteration[1] {
            *bytes -= 2048;
        }
    });
    assert_eq!(
        e,
        ProtocolError::TxBytes {
            bar: "full".into(),
            announced: 30720,
            boxes: 32768
        }
    );
}

#[test]
fn producer_empty_phase_must_start_at_one() {
    let e = broken(|s| {
        let empty = bar(s, "empty");
        producer(s).iteration[0] = wait(empty, 0);
    });
    assert_eq!(
        e,
        ProtocolError::StartPhase {
            role: "producer".into(),
            bar: "empty".into(),
            start: 0,
            expected: 1
        }
    );
}

#[test]
fn release_before_wgmma_completes_is_rejected() {
    let e = broken(|s| {
        let empty = bar(s, "empty");
        consumer(s).iteration[4] = arrive(empty, 0);
    });
    assert_eq!(
        e,
        ProtocolError::EarlyRelease {
            iteration: 0,
            released: 0,
            bar: "empty".into()
        }
    );
}

#[test]
fn wrong_empty_count_is_rejected() {
    // Too small a count: each consumer warpgroup's 4 arrivals complete a phase of 4 on their
    // own (the old checker arrived for both warpgroups at once, 8 of 4: `TooManyArrivals`),
    // so `empty` completes two phases per iteration and the producer's parity wait would
    // pass on the wrong one.
    let e = broken(|s| mbar(s, "empty").count = 4);
    assert!(
        matches!(&e, ProtocolError::Phase { role, bar, .. } if role == "producer" && bar == "empty"),
        "{e}"
    );
    let e = broken(|s| mbar(s, "empty").count = 16);
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
}

#[test]
fn unfenced_generic_write_is_rejected() {
    let write = Op::GenericWrite { load: load_id(0) };
    let e = broken(|s| consumer(s).iteration.insert(1, write));
    assert!(
        matches!(
            &e,
            ProtocolError::Unfenced { role, load, .. } if role == "consumer" && load == "tma0"
        ),
        "{e}"
    );
    let mut s = good();
    consumer(&mut s).iteration.insert(1, write);
    consumer(&mut s).iteration.insert(2, Op::FenceProxyAsync);
    sound(&s, "a fenced generic write");
}

#[test]
fn set_up_without_fence_is_rejected() {
    let e = broken(|s| s.setup.retain(|&op| op != Op::FenceBarrierInit));
    assert!(matches!(e, ProtocolError::Init(_)), "{e}");
}

#[test]
fn tma_before_empty_wait_is_rejected() {
    let e = broken(|s| producer(s).iteration.swap(0, 2));
    assert!(
        matches!(
            &e,
            ProtocolError::BeforeWait { role, bar, .. } if role == "producer" && bar == "empty"
        ),
        "{e}"
    );
}

#[test]
fn missing_producer_arrive_is_rejected() {
    let e = broken(|s| {
        producer(s).iteration.remove(1);
        mbar(s, "full").count = 1;
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
    let e = broken(|s| {
        let empty = bar(s, "empty");
        consumer(s).iteration.push(arrive(empty, 1));
        mbar(s, "empty").count = 8;
    });
    assert!(
        matches!(
            e,
            ProtocolError::Phase { .. } | ProtocolError::TooManyArrivals { .. }
        ),
        "{e}"
    );
}

// --- once loads ---

#[test]
fn once_loads_and_immediate_release_pass() {
    sound(&attention_like(), "the attention protocol");
}

#[test]
fn broken_once_protocols_are_rejected() {
    let e = broken_attention(|s| consumer(s).tile.clear());
    assert!(
        matches!(&e, ProtocolError::Once(OnceError::NoWait { role }) if role == "consumer"),
        "{e}"
    );
    assert!(e.to_string().contains("without waiting on `once`"), "{e}");
    let e = broken_attention(|s| {
        producer(s).tile.pop();
    });
    assert!(
        matches!(
            e,
            ProtocolError::LoadCount {
                times: 0,
                per: "tile",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("issued 0 times"), "{e}");
    let e = broken_attention(|s| {
        if let Op::ExpectTx { bytes, .. } = &mut producer(s).tile[0] {
            *bytes += 16;
        }
    });
    assert!(
        matches!(e, ProtocolError::Once(OnceError::TxBytes { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("on `once`"), "{e}");
    // A wait on `once` every iteration: malformed (the structural verifier rejects an
    // iteration's op on a per-tile barrier), and the protocol rule says why.
    let every = |s: &mut Sched| {
        let w = consumer(s).tile[0];
        consumer(s).iteration.push(w);
    };
    let e = broken_attention(every);
    assert!(
        matches!(e, ProtocolError::Once(OnceError::EveryIteration { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("single phase"), "{e}");
    let mut s = attention_like();
    every(&mut s);
    assert!(crate::sched::verify::verify(&s).is_err());
    // Releasing the stage just used while its wgmma may still run.
    let e = broken_attention(|s| consumer(s).iteration[3] = Op::WgmmaWait(1));
    assert!(matches!(e, ProtocolError::EarlyRelease { .. }), "{e}");
}

// --- the rotated loop and its turns ---

#[test]
fn rotated_program_is_the_passes() {
    for (s, split) in [(rotated(), false), (split(), true)] {
        for turns in [false, true] {
            let turn = turns.then(|| bar(&s, "turn"));
            assert_eq!(
                crate::passes::overlap::rotated_program(&s, turn),
                rotated_program(&s, turns, split),
                "turns {turns}, split {split}"
            );
        }
    }
}

#[test]
fn rotated_ping_pong_passes() {
    sound(&rotated(), "the rotated protocol");
    // Without ping-pong, the warpgroups run the rotated program side by side.
    let mut s = rotated();
    let program = rotated_program(&s, false, false);
    let c = consumer(&mut s);
    c.iteration = program;
    c.start.clear();
    c.exit.clear();
    overlap(&mut s).turns = None;
    sound(&s, "the rotated protocol without turns");
}

#[test]
fn rotated_register_hazards_are_rejected() {
    // The code between before the wait that completes the head.
    let e = broken_rotated(|s| {
        let it = &mut consumer(s).iteration;
        let (b, w) = (at(it, Op::Run(Region::Between)), at(it, Op::WgmmaWait(1)));
        it.swap(b, w);
    });
    assert!(
        matches!(e, ProtocolError::InFlight { iteration: 0, .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("reads the head mma's products"),
        "{e}"
    );
    // The handoff (and the release) while the tail reading the previous P may run: with one
    // trip the release is caught first, with more the handoff.
    let e = broken_rotated(|s| {
        let it = &mut consumer(s).iteration;
        let (h, w) = (at(it, Op::Run(Region::Handoff)), at(it, Op::WgmmaWait(0)));
        it.swap(h, w);
    });
    assert!(matches!(e, ProtocolError::EarlyRelease { .. }), "{e}");
    let e = broken_rotated(|s| {
        let it = &mut consumer(s).iteration;
        let handoff = it.remove(at(it, Op::Run(Region::Handoff)));
        it.insert(at(it, Op::WgmmaWait(0)), handoff);
    });
    assert!(
        e.to_string().contains("P is handed to the next tail"),
        "{e}"
    );
    // The next rescale while the tail still accumulates: no wait for the tail at all.
    let e = broken_rotated(|s| {
        let it = &mut consumer(s).iteration;
        it.remove(at(it, Op::WgmmaWait(0)));
        let release = it
            .iter()
            .position(|op| matches!(op, Op::Arrive { .. }))
            .expect("release");
        it.remove(release);
        it.retain(|&op| op != Op::Run(Region::Handoff));
        it.push(Op::Run(Region::Handoff));
    });
    assert!(matches!(e, ProtocolError::InFlight { .. }), "{e}");
}

#[test]
fn broken_turn_orders_are_rejected() {
    // Nobody gives the leader its first turn: both warpgroups wait for each other.
    let e = broken_rotated(|s| consumer(s).start.clear());
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // A turn passed twice completes a generation with nobody waiting for it.
    let e = broken_rotated(|s| {
        let pass = turn_pass(s, Who::All);
        consumer(s).iteration.push(pass);
    });
    assert!(matches!(e, ProtocolError::Turn { lost: true, .. }), "{e}");
    // The leader never takes the followers' last pass.
    let e = broken_rotated(|s| consumer(s).exit.clear());
    assert_eq!(
        e,
        ProtocolError::Turn {
            barrier: 0,
            lost: false
        }
    );
    // Anything but a hand-over once per CTA is rejected.
    let e = broken_rotated(|s| consumer(s).start.push(Op::WgmmaWait(0)));
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
}

#[test]
fn three_warpgroups_taking_turns_pass() {
    sound(&rotated_three(), "the three-way turn order");
    // Persistent: each tile starts and ends with the leader's turn.
    sound(
        &persistent(rotated_three),
        "the persistent three-way turn order",
    );
}

#[test]
fn broken_three_way_turn_orders_are_rejected() {
    // Every warpgroup hands a turn on at the start (the two-warpgroup hand-over by each but
    // the leader, generalised wrongly): several turns go round, and a turn barrier is left
    // with arrivals or completes with nobody waiting.
    let e = rejected(rotated_three, |s| {
        consumer(s).start = vec![turn_pass(s, Who::All)];
    });
    assert!(matches!(e, ProtocolError::Turn { .. }), "{e}");
    // The leader hands itself no turn and the middle warpgroup starts: the order is 1, 2, 0,
    // and the leader's last wait never comes.
    let e = rejected(rotated_three, |s| {
        consumer(s).start = vec![turn_pass(s, Who::Leader)];
    });
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // Nobody hands the leader its first turn.
    let e = rejected(rotated_three, |s| consumer(s).start.clear());
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // Each warpgroup releases a stage, but `empty` counts two warpgroups' arrivals: the
    // first two complete the phase and the producer refills the stage while the third may
    // still read it. (The old checker, which had no vector clocks, saw the phases drift
    // later: `Phase` or `TooManyArrivals`; the refill comes first and is the bug.)
    let e = rejected(rotated_three, |s| mbar(s, "empty").count = 8);
    assert!(
        matches!(
            &e,
            ProtocolError::Race(r)
                if r.first == "read" && r.second == "written" && r.second_role == "producer"
        ),
        "{e}"
    );
}

#[test]
fn rotation_steps_are_checked_statically() {
    let e = broken_rotated(|s| consumer(s).iteration.push(Op::Run(Region::Between)));
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
    // The overlap pass did not rotate the loop, but the program has the rotation's ops.
    let e = broken_rotated(|s| {
        s.overlap = None;
        consumer(s).rotated = false;
    });
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
    assert!(e.to_string().contains("did not rotate"), "{e}");
    let e = broken_rotated(|s| {
        let pass = turn_pass(s, Who::All);
        producer(s).iteration.push(pass);
    });
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
    assert!(e.to_string().contains("the producer cannot run"), "{e}");
    // Turns without warpgroups to take them. The old ring could keep its turn steps while
    // its overlap had no turns; the schedule IR has no such switch (a turn is its named
    // barrier and the ops on it, `Overlap::turns` only describes them), so the nearest
    // mistake is a turn program on a single consumer warpgroup.
    let e = broken_rotated(|s| {
        let c = role(s, RoleKind::Consumer);
        c.warps = 4;
        c.replicas = 1;
        mbar(s, "empty").count = 4;
        overlap(s).turns = None;
    });
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
    assert!(e.to_string().contains("without ping-pong"), "{e}");
}

// --- persistent schedules ---

#[test]
fn persistent_rings_pass_over_tile_sequences() {
    for (base, what) in [
        (good as fn() -> Sched, "gemm"),
        (attention_like, "attention"),
        (attention_lagged, "attention, lagged release"),
        (rotated, "rotated"),
    ] {
        sound(&persistent(base), what);
    }
}

#[test]
fn broken_persistent_protocols_are_rejected() {
    let rejected_persistent = |base: fn() -> Sched, edit: &dyn Fn(&mut Sched)| {
        let mut s = persistent(base);
        edit(&mut s);
        check(&s).expect_err("a broken protocol must be rejected")
    };
    // A stage never released: a later tile's producer waits forever for it.
    let e = rejected_persistent(good, &|s| {
        consumer(s).iteration.pop();
    });
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // The once tiles released while the last group may still read them.
    let e = rejected_persistent(attention_lagged, &|s| consumer(s).drain.clear());
    assert!(
        matches!(e, ProtocolError::OnceReleasedEarly { tile: 0 }),
        "{e}"
    );
    // No release, or a reload without waiting for it.
    let e = rejected_persistent(attention_like, &|s| consumer(s).release.clear());
    assert!(
        matches!(e, ProtocolError::Once(OnceError::Release { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("release program"), "{e}");
    let e = rejected_persistent(attention_like, &|s| {
        producer(s).tile.remove(0);
    });
    assert!(
        matches!(
            e,
            ProtocolError::Once(OnceError::ReloadWait { waits: false })
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("does not wait on `once_free`"),
        "{e}"
    );
    let e = rejected_persistent(rotated, &|s| {
        let free = bar(s, "once_free");
        producer(s).tile[0] = wait(free, 0);
    });
    assert!(
        matches!(
            &e,
            ProtocolError::StartPhase { bar, start: 0, expected: 1, .. } if bar == "once_free"
        ),
        "{e}"
    );
}

// --- split rings ---

#[test]
fn split_rings_pass() {
    sound(&split(), "the split protocol");
    sound(&persistent(split), "the persistent split protocol");
}

#[test]
fn broken_split_protocols_are_rejected() {
    // V released while the tail reading it may still run; K before the head's group is
    // waited for.
    for (name, lag, group) in [("tail_empty", 1, 0), ("empty", 0, 1)] {
        let e = rejected(split, |s| {
            let release = arrive(bar(s, name), lag);
            let it = &mut consumer(s).iteration;
            let op = it.remove(at(it, release));
            it.insert(at(it, Op::WgmmaWait(group)), op);
        });
        assert!(
            matches!(&e, ProtocolError::EarlyRelease { bar, .. } if bar == name),
            "{e}"
        );
    }
    // The tail reads V without waiting on `tail_full`.
    let e = rejected(split, |s| {
        let tail_full = bar(s, "tail_full");
        consumer(s)
            .iteration
            .retain(|op| !matches!(*op, Op::Wait { bar, .. } if bar == tail_full));
    });
    assert!(
        matches!(&e, ProtocolError::ReadBeforeWait { bar, .. } if bar == "tail_full"),
        "{e}"
    );
    // V's bytes announced on `full`.
    let e = rejected(split, |s| {
        let (full, v) = (bar(s, "full"), load_id(1));
        let bytes = s.loads[v].tma.tile_bytes();
        producer(s).iteration[4] = Op::ExpectTx { bar: full, bytes };
    });
    assert!(matches!(e, ProtocolError::TxBytes { .. }), "{e}");
    // V loaded before the producer waits on `tail_empty`.
    let e = rejected(split, |s| producer(s).iteration.swap(3, 5));
    assert!(
        matches!(&e, ProtocolError::BeforeWait { bar, .. } if bar == "tail_empty"),
        "{e}"
    );
    // The consumer waits on the tail arrays of a ring whose tail loads went back on `full`.
    // (The old ring named its tail arrays apart from the loads, and could drop its tail loads
    // while its programs kept the arrays; in the schedule IR a load names its barriers, so
    // the nearest mistake is V moved back onto `full`, its bytes with K's, and the consumer
    // still waiting on `tail_full`, which no load completes.)
    let e = rejected(split, |s| {
        let (full, v) = (bar(s, "full"), load_id(1));
        s.loads[v].barrier = full;
        let bytes = s.loads[v].tma.tile_bytes();
        producer(s).iteration[4] = Op::ExpectTx { bar: full, bytes };
    });
    assert!(matches!(e, ProtocolError::Split(_)), "{e}");
    assert!(e.to_string().contains("no load lands on"), "{e}");
}
