//! The protocol checker on the rings the `pipeline` pass plans, and on broken variants of them.

use super::*;
use crate::kernel::OpId;
use crate::ring::{InitStep, Operand, Overlap, TmaBox, TmaLoad, Turns, Who};

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
        consumer_start: Vec::new(),
        consumer_exit: Vec::new(),
        consumer_release: Vec::new(),
        persistent: false,
        once_free_offset: 0,
        tail_loads: Vec::new(),
        tail_full_offset: 0,
        tail_empty_offset: 0,
        overlap: None,
        cluster: None,
    };
    let roles = Roles {
        consumer_warps: 8,
        producer_warps: 4,
        producer_regs: 40,
        consumer_regs: 232,
        ctas_per_sm: 1,
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

/// The error for `base`'s ring after `edit`; panics if the edited ring is accepted.
fn rejected(base: fn() -> (Ring, Roles), edit: impl FnOnce(&mut Ring)) -> ProtocolError {
    let (mut ring, roles) = base();
    edit(&mut ring);
    check(&ring, &roles).expect_err("a broken protocol must be rejected")
}

fn broken_attention(edit: impl FnOnce(&mut Ring)) -> ProtocolError {
    rejected(attention_like, edit)
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
    rejected(good, edit)
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

/// The ring the `overlap` pass makes of [`attention_like`]: three stages, the rotated
/// program, and two consumer warpgroups taking turns.
fn rotated() -> (Ring, Roles) {
    let (mut ring, roles) = attention_like();
    ring.stages = 3;
    // Exactly the program the pass writes.
    ring.consumer = crate::passes::overlap::rotated_program(true, false);
    ring.consumer_drain.clear();
    ring.consumer_start = vec![Step::TurnPass { who: Who::Last }];
    ring.consumer_exit = vec![Step::TurnWait { who: Who::Leader }];
    ring.overlap = Some(Overlap {
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
    (ring, roles)
}

fn broken_rotated(edit: impl FnOnce(&mut Ring)) -> ProtocolError {
    rejected(rotated, edit)
}

/// Index of `step` in the rotated consumer program.
fn at(r: &Ring, step: Step) -> usize {
    r.consumer
        .iter()
        .position(|s| *s == step)
        .expect("step in the program")
}

#[test]
fn rotated_ping_pong_passes() {
    let (ring, roles) = rotated();
    check(&ring, &roles).expect("the rotated protocol is sound");
    // Without ping-pong, one consumer program stands for both warpgroups.
    let (mut ring, roles) = rotated();
    ring.consumer = crate::passes::overlap::rotated_program(false, false);
    ring.consumer_start.clear();
    ring.consumer_exit.clear();
    if let Some(o) = &mut ring.overlap {
        o.turns = None;
    }
    check(&ring, &roles).expect("the rotated protocol without turns is sound");
}

#[test]
fn rotated_register_hazards_are_rejected() {
    // The code between before the wait that completes the head.
    let e = broken_rotated(|r| {
        let (b, w) = (at(r, Step::Between), at(r, Step::WaitGroup(1)));
        r.consumer.swap(b, w);
    });
    assert_eq!(e, ProtocolError::ReadsInFlight { iteration: 0 });
    // The handoff (and the release) while the tail reading the previous P may run: with one
    // trip the release is caught first, with more the handoff.
    let e = broken_rotated(|r| {
        let (h, w) = (at(r, Step::Handoff), at(r, Step::WaitGroup(0)));
        r.consumer.swap(h, w);
    });
    assert!(matches!(e, ProtocolError::EarlyRelease { .. }), "{e}");
    let e = broken_rotated(|r| {
        let h = at(r, Step::Handoff);
        let handoff = r.consumer.remove(h);
        r.consumer.insert(at(r, Step::WaitGroup(0)), handoff);
    });
    assert!(matches!(e, ProtocolError::HandoffInFlight { .. }), "{e}");
    // The next rescale while the tail still accumulates: no wait for the tail at all.
    let e = broken_rotated(|r| {
        let w = at(r, Step::WaitGroup(0));
        r.consumer.remove(w);
        let a = r
            .consumer
            .iter()
            .position(|s| matches!(s, Step::Arrive { .. }))
            .expect("release");
        r.consumer.remove(a);
        r.consumer.retain(|s| *s != Step::Handoff);
        r.consumer.push(Step::Handoff);
    });
    assert!(
        matches!(
            e,
            ProtocolError::HandoffInFlight { .. } | ProtocolError::AccumulatorInFlight { .. }
        ),
        "{e}"
    );
}

#[test]
fn broken_turn_orders_are_rejected() {
    // Nobody gives the leader its first turn: both warpgroups wait for each other.
    let e = broken_rotated(|r| r.consumer_start.clear());
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // A turn passed twice completes a generation with nobody waiting for it.
    let e = broken_rotated(|r| r.consumer.push(Step::TurnPass { who: Who::All }));
    assert!(matches!(e, ProtocolError::TurnLost { .. }), "{e}");
    // The leader never takes the followers' last pass.
    let e = broken_rotated(|r| r.consumer_exit.clear());
    assert_eq!(e, ProtocolError::TurnUnbalanced { barrier: 0 });
    // Anything but a hand-over once per CTA is rejected.
    let e = broken_rotated(|r| r.consumer_start.push(Step::WaitGroup(0)));
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
}

/// [`rotated`] on three consumer warpgroups (a 192-row tile, 12 consumer warps, each arriving
/// on `empty`), taking turns in the order 0, 1, 2.
fn rotated_three() -> (Ring, Roles) {
    let (mut ring, mut roles) = rotated();
    roles.consumer_warps = 12;
    ring.empty_count = 12;
    if let Some(t) = ring.overlap.as_mut().and_then(|o| o.turns.as_mut()) {
        t.warpgroups = 3;
    }
    (ring, roles)
}

#[test]
fn three_warpgroups_taking_turns_pass() {
    let (ring, roles) = rotated_three();
    check(&ring, &roles).expect("the three-way turn order is sound");
    // Persistent: each tile starts and ends with the leader's turn.
    let (ring, roles) = persistent(rotated_three);
    check(&ring, &roles).expect("the persistent three-way turn order is sound");
}

#[test]
fn broken_three_way_turn_orders_are_rejected() {
    // Every warpgroup hands a turn on at the start (the two-warpgroup hand-over by each but
    // the leader, generalised wrongly): several turns go round, and a turn barrier is left
    // with arrivals or completes with nobody waiting.
    let e = rejected(rotated_three, |r| {
        r.consumer_start = vec![Step::TurnPass { who: Who::All }];
    });
    assert!(
        matches!(
            e,
            ProtocolError::TurnLost { .. } | ProtocolError::TurnUnbalanced { .. }
        ),
        "{e}"
    );
    // The leader hands itself no turn and the middle warpgroup starts: the order is 1, 2, 0,
    // and the leader's last wait never comes.
    let e = rejected(rotated_three, |r| {
        r.consumer_start = vec![Step::TurnPass { who: Who::Leader }];
    });
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // Nobody hands the leader its first turn.
    let e = rejected(rotated_three, |r| r.consumer_start.clear());
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // Each warpgroup releases a stage: 8 arrivals of 12 would never free it.
    let e = rejected(rotated_three, |r| r.empty_count = 8);
    assert!(
        matches!(
            e,
            ProtocolError::Phase { .. } | ProtocolError::TooManyArrivals { .. }
        ),
        "{e}"
    );
}

#[test]
fn rotation_steps_are_checked_statically() {
    let e = broken_rotated(|r| r.consumer.push(Step::Between));
    assert!(matches!(e, ProtocolError::Rotation(_)), "{e}");
    let e = broken_rotated(|r| r.overlap = None);
    assert!(e.to_string().contains("did not rotate"), "{e}");
    let e = broken_rotated(|r| r.producer.push(Step::TurnPass { who: Who::All }));
    assert!(e.to_string().contains("the producer cannot run"), "{e}");
    let e = broken_rotated(|r| {
        if let Some(o) = &mut r.overlap {
            o.turns = None;
        }
    });
    assert!(e.to_string().contains("without ping-pong"), "{e}");
}

/// `base`'s ring made persistent as the `persistent` pass does.
fn persistent(base: fn() -> (Ring, Roles)) -> (Ring, Roles) {
    let (mut ring, roles) = base();
    crate::passes::persistent::persist(&mut ring);
    (ring, roles)
}

/// [`attention_like`] with the lag-1 release of [`good`]: one wgmma group stays in flight
/// across iterations and the drain waits for it.
fn attention_lagged() -> (Ring, Roles) {
    let (mut ring, roles) = attention_like();
    let (good, _) = good();
    ring.consumer = good.consumer;
    ring.consumer_drain = good.consumer_drain;
    (ring, roles)
}

#[test]
fn persistent_rings_pass_over_tile_sequences() {
    for base in [good, attention_like, attention_lagged, rotated] {
        let (ring, roles) = persistent(base);
        check(&ring, &roles).expect("the persistent protocol is sound");
    }
}

#[test]
fn broken_persistent_protocols_are_rejected() {
    let rejected_persistent = |base: fn() -> (Ring, Roles), edit: &dyn Fn(&mut Ring)| {
        let (mut ring, roles) = persistent(base);
        edit(&mut ring);
        check(&ring, &roles).expect_err("a broken protocol must be rejected")
    };
    // A stage never released: a later tile's producer waits forever for it.
    let e = rejected_persistent(good, &|r| {
        r.consumer.pop();
    });
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    // The once tiles released while the last group may still read them.
    let e = rejected_persistent(attention_lagged, &|r| r.consumer_drain.clear());
    assert!(
        matches!(e, ProtocolError::OnceReleasedEarly { tile: 0 }),
        "{e}"
    );
    // No release, or a reload without waiting for it.
    let e = rejected_persistent(attention_like, &|r| r.consumer_release.clear());
    assert!(e.to_string().contains("release program"), "{e}");
    let e = rejected_persistent(attention_like, &|r| {
        r.producer_once.remove(0);
    });
    assert!(
        e.to_string().contains("does not wait on `once_free`"),
        "{e}"
    );
    let e = rejected_persistent(rotated, &|r| {
        r.producer_once[0] = Step::Wait {
            bar: Bar::OnceFree,
            start: 0,
        };
    });
    assert!(matches!(e, ProtocolError::StartPhase { .. }), "{e}");
}

/// [`rotated`] split as the `overlap` pass splits a ring it could not deepen: two stages,
/// load 1 (`V`) on `tail_full` / `tail_empty`.
fn split() -> (Ring, Roles) {
    let (mut ring, roles) = rotated();
    ring.stages = 2;
    if let Some(o) = &mut ring.overlap {
        o.deepened = false;
    }
    ring.tail_loads = vec![1];
    let bytes = |l: usize| ring.loads[l].tile_bytes();
    ring.producer = vec![
        Step::Wait {
            bar: Bar::Empty,
            start: 1,
        },
        Step::ArriveExpectTx {
            bar: Bar::Full,
            bytes: bytes(0),
        },
        Step::Tma { load: 0 },
        Step::Wait {
            bar: Bar::TailEmpty,
            start: 1,
        },
        Step::ArriveExpectTx {
            bar: Bar::TailFull,
            bytes: bytes(1),
        },
        Step::Tma { load: 1 },
    ];
    ring.consumer = crate::passes::overlap::rotated_program(true, true);
    (ring, roles)
}

#[test]
fn split_rings_pass() {
    let (ring, roles) = split();
    check(&ring, &roles).expect("the split protocol is sound");
    let (ring, roles) = persistent(split);
    check(&ring, &roles).expect("the persistent split protocol is sound");
}

#[test]
fn broken_split_protocols_are_rejected() {
    // V released while the tail reading it may still run; K before the head's group is
    // waited for.
    for (bar, lag, wait) in [(Bar::TailEmpty, 1, 0), (Bar::Empty, 0, 1)] {
        let e = rejected(split, |r| {
            let release = r.consumer.remove(at(r, Step::Arrive { bar, lag }));
            let before = at(r, Step::WaitGroup(wait));
            r.consumer.insert(before, release);
        });
        assert!(matches!(e, ProtocolError::EarlyRelease { .. }), "{e}");
    }
    // The tail reads V without waiting on `tail_full`.
    let e = rejected(split, |r| {
        r.consumer.retain(|s| {
            !matches!(
                s,
                Step::Wait {
                    bar: Bar::TailFull,
                    ..
                }
            )
        });
    });
    assert!(
        matches!(
            e,
            ProtocolError::ReadBeforeWait {
                bar: Bar::TailFull,
                ..
            }
        ),
        "{e}"
    );
    // V's bytes announced on `full`.
    let e = rejected(split, |r| {
        r.producer[4] = Step::ArriveExpectTx {
            bar: Bar::Full,
            bytes: r.loads[1].tile_bytes(),
        };
    });
    assert!(matches!(e, ProtocolError::TxBytes { .. }), "{e}");
    // V loaded before the producer waits on `tail_empty`.
    let e = rejected(split, |r| r.producer.swap(3, 5));
    assert!(
        matches!(
            e,
            ProtocolError::BeforeWait {
                bar: Bar::TailEmpty,
                ..
            }
        ),
        "{e}"
    );
    // Tail arrays named by a ring without tail loads.
    let e = rejected(split, |r| r.tail_loads.clear());
    assert!(matches!(e, ProtocolError::Split(_)), "{e}");
}
