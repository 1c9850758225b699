//! The schedule IR ([`crate::sched`]) of a kernel whose scheduling passes still write the
//! per-family plan types (`ring::Ring`, `tmem::TmemPlan`, `tmem::attention::AttentionPlan`,
//! `tma_store::TmaStore`): one translation, while the passes move to writing the IR itself
//! and the checker, the CPU execution and the writers move to reading it.

use std::collections::BTreeMap;

use crate::kernel::Kernel;
use crate::ring::{Bar, InitStep, Ring, Step, Turns};
use crate::sched::barrier::{Barrier, BarrierId, BarrierKind, Index, Mbarrier, Phase, Scope};
use crate::sched::role::{Issue, Program, Role, RoleKind, Who};
use crate::sched::tma::{Load, LoadId, TmaStore};
use crate::sched::tmem::{Tmem, TmemMma, TmemTile, TmemTileId};
use crate::sched::{MmaPart, Op, Region, Sched};
use crate::tma_store::StoreStep;
use crate::tmem::attention::{AttentionPlan, AttnBar, AttnStep, Q_TILES, WARPGROUP_WARPS};
use crate::tmem::{AccBar, TmemPlan, TmemStep};

/// Warps of a warpgroup.
const WARPGROUP: u32 = 4;

/// The schedule IR of `kernel`'s plans, or `None` without a ring.
pub(crate) fn sched_of(kernel: &Kernel) -> Option<Sched> {
    let ring = kernel.schedule.rings.values().next()?;
    let mut t = Translation::new(kernel, ring);
    t.barriers();
    t.loads();
    t.stores();
    t.setup();
    t.roles();
    t.tmem();
    Some(t.s)
}

struct Translation<'k> {
    kernel: &'k Kernel,
    ring: &'k Ring,
    s: Sched,
    bars: BTreeMap<Bar, BarrierId>,
    acc: BTreeMap<AccBar, BarrierId>,
    attn: BTreeMap<AttnBar, BarrierId>,
    turns: Option<BarrierId>,
    /// Ring load `i` is `loads[i]`, once load `j` is `once[j]`, an attention pair's second
    /// Q tile `q1`.
    loads: Vec<LoadId>,
    once: Vec<LoadId>,
    q1: Option<LoadId>,
}

impl<'k> Translation<'k> {
    fn new(kernel: &'k Kernel, ring: &'k Ring) -> Self {
        let mut s = Sched::new(ring.for_op, ring.stages);
        s.tiles = kernel.schedule.tiles;
        s.cluster = ring.cluster.clone();
        // One mask for every commit of the pair: the stages' and the accumulator's.
        let acc_mask = kernel.schedule.tmem.as_ref().and_then(|p| p.pair.as_ref());
        if let (Some(p), Some(acc)) = (s.cluster.as_mut().and_then(|c| c.pair.as_mut()), acc_mask) {
            p.commit_mask &= acc.commit_mask;
        }
        s.overlap = ring.overlap.clone().or_else(|| {
            kernel
                .schedule
                .attention
                .as_ref()
                .map(|p| p.overlap.clone())
        });
        s.ctas_per_sm = kernel.schedule.roles.map_or(1, |r| r.ctas_per_sm);
        s.epilogue_columns = kernel.schedule.epilogue_columns;
        if let Some(p) = &kernel.schedule.attention {
            s.work_tiles = Q_TILES;
            s.factors_offset = Some(p.scale_offset);
            s.poly_share = p.poly_share;
        }
        Translation {
            kernel,
            ring,
            s,
            bars: BTreeMap::new(),
            acc: BTreeMap::new(),
            attn: BTreeMap::new(),
            turns: None,
            loads: Vec::new(),
            once: Vec::new(),
            q1: None,
        }
    }

    fn tmem_plan(&self) -> Option<&'k TmemPlan> {
        self.kernel.schedule.tmem.as_ref()
    }

    fn attention(&self) -> Option<&'k AttentionPlan> {
        self.kernel.schedule.attention.as_ref()
    }

    fn mbarrier(&mut self, name: &'static str, index: Option<u32>, m: Mbarrier) -> BarrierId {
        self.s.barriers.append(Barrier::mbarrier(name, index, m))
    }

    fn barriers(&mut self) {
        let r = self.ring;
        let stages = r.stages;
        let clustered = r.cluster.is_some();
        let paired = r.cluster.as_ref().is_some_and(|c| c.pair.is_some());
        let it = Phase::Iteration;
        let full = self.mbarrier(
            "full",
            None,
            Mbarrier {
                count: r.full_count,
                stages,
                phase: it,
                offset: r.full_offset,
                scope: if paired { Scope::Leader } else { Scope::Cta },
                hands_tmem: false,
            },
        );
        let empty = self.mbarrier(
            "empty",
            None,
            Mbarrier {
                count: r.empty_count,
                stages,
                phase: it,
                offset: r.empty_offset,
                scope: if clustered {
                    Scope::Cluster
                } else {
                    Scope::Cta
                },
                hands_tmem: false,
            },
        );
        self.bars.insert(Bar::Full, full);
        self.bars.insert(Bar::Empty, empty);
        if !r.tail_loads.is_empty() {
            let tf = self.mbarrier(
                "tail_full",
                None,
                Mbarrier {
                    count: r.full_count,
                    stages,
                    phase: it,
                    offset: r.tail_full_offset,
                    scope: Scope::Cta,
                    hands_tmem: false,
                },
            );
            let te = self.mbarrier(
                "tail_empty",
                None,
                Mbarrier {
                    count: r.empty_count,
                    stages,
                    phase: it,
                    offset: r.tail_empty_offset,
                    scope: Scope::Cta,
                    hands_tmem: false,
                },
            );
            self.bars.insert(Bar::TailFull, tf);
            self.bars.insert(Bar::TailEmpty, te);
        }
        if !r.once.is_empty() {
            let once = self.mbarrier(
                "once",
                None,
                Mbarrier {
                    count: 1,
                    stages: 1,
                    phase: Phase::Tile,
                    offset: r.once_offset,
                    scope: Scope::Cta,
                    hands_tmem: false,
                },
            );
            self.bars.insert(Bar::Once, once);
            if r.persistent {
                let free = self.mbarrier(
                    "once_free",
                    None,
                    Mbarrier {
                        count: r.empty_count,
                        stages: 1,
                        phase: Phase::Tile,
                        offset: r.once_free_offset,
                        scope: Scope::Cta,
                        hands_tmem: false,
                    },
                );
                self.bars.insert(Bar::OnceFree, free);
            }
        }
        if let Some(p) = self.tmem_plan() {
            let pair = p.pair.is_some();
            // The 2-SM pair's commit reaches both CTAs' `acc_full`; both hand back on the
            // leader's `acc_empty`.
            let scopes = if pair {
                [Scope::Cluster, Scope::Leader]
            } else {
                [Scope::Cta; 2]
            };
            for ((bar, name), scope) in [(AccBar::Full, "acc_full"), (AccBar::Empty, "acc_empty")]
                .into_iter()
                .zip(scopes)
            {
                let h = self.mbarrier(
                    name,
                    None,
                    Mbarrier {
                        count: p.count(bar),
                        stages: 1,
                        phase: Phase::Tile,
                        offset: p.offset(bar),
                        scope,
                        hands_tmem: true,
                    },
                );
                self.acc.insert(bar, h);
            }
        }
        if let Some(p) = self.attention() {
            for bar in AttnBar::all() {
                let (name, g) = match bar {
                    AttnBar::SFull(g) => ("s_full", g),
                    AttnBar::ScaleFull(g) => ("scale_full", g),
                    AttnBar::PFull(g) => ("p_full", g),
                    AttnBar::OReady(g) => ("o_ready", g),
                    AttnBar::OFull(g) => ("o_full", g),
                    AttnBar::OEmpty(g) => ("o_empty", g),
                };
                let phase = if bar.per_tile() {
                    Phase::Tile
                } else {
                    Phase::Iteration
                };
                let h = self.mbarrier(
                    name,
                    Some(g),
                    Mbarrier {
                        count: p.count(bar),
                        stages: 1,
                        phase,
                        offset: p.offset(bar),
                        scope: Scope::Cta,
                        hands_tmem: bar.hands_tmem(),
                    },
                );
                self.attn.insert(bar, h);
            }
        }
        if let Some(t) = r.overlap.as_ref().and_then(|o| o.turns) {
            self.turns = Some(self.s.barriers.append(Barrier {
                name: "turn",
                index: None,
                kind: BarrierKind::Named {
                    first: t.first_barrier,
                    ids: t.warpgroups,
                    threads: Turns::MEETING * 32 * WARPGROUP,
                },
            }));
        }
    }

    fn loads(&mut self) {
        let r = self.ring;
        let overlap = r.overlap.as_ref().or(self.attention().map(|p| &p.overlap));
        let uses = super::walk::uses(self.kernel);
        let read_by = |op| match overlap {
            None => MmaPart::Body,
            Some(o) if super::overlap::only_read_by(self.kernel, &uses, op, o.tail) => {
                MmaPart::Tail
            }
            Some(_) => MmaPart::Head,
        };
        for (i, l) in r.loads.iter().enumerate() {
            let barrier = self.bars[&r.full_of(i)];
            let free = self.bars.get(&Ring::empty_of(r.full_of(i))).copied();
            let h = self.s.loads.append(Load {
                tma: l.clone(),
                barrier,
                free,
                work_tile: 0,
                read_by: read_by(l.load),
            });
            self.loads.push(h);
        }
        for l in &r.once {
            let barrier = self.bars[&Bar::Once];
            let h = self.s.loads.append(Load {
                tma: l.clone(),
                barrier,
                free: self.bars.get(&Bar::OnceFree).copied(),
                work_tile: 0,
                read_by: read_by(l.load),
            });
            self.once.push(h);
        }
        if let (Some(p), Some(q)) = (self.attention(), r.once.first()) {
            let mut tma = q.clone();
            tma.offset = p.q1_offset;
            let barrier = self.bars[&Bar::Once];
            self.q1 = Some(self.s.loads.append(Load {
                tma,
                barrier,
                free: self.bars.get(&Bar::OnceFree).copied(),
                work_tile: 1,
                read_by: MmaPart::Head,
            }));
        }
    }

    fn stores(&mut self) {
        let legacy: Vec<&crate::tma_store::TmaStore> = match self.attention() {
            Some(p) => p.stores.iter().collect(),
            None => self.kernel.schedule.tma_stores.values().collect(),
        };
        let attention = self.attention().is_some();
        for (g, st) in legacy.into_iter().enumerate() {
            let barrier = self.s.barriers.append(Barrier {
                name: "store",
                index: attention.then_some(g as u32),
                kind: BarrierKind::Named {
                    first: st.barrier,
                    ids: st.groups,
                    threads: st.threads,
                },
            });
            let round = st.round.iter().map(|&s| store_op(s, barrier)).collect();
            self.s.stores.push(TmaStore {
                store: st.store,
                param: st.param,
                lead_dims: st.lead_dims,
                box_dims: st.box_dims,
                swizzle: st.swizzle,
                boxes: st.boxes.clone(),
                rounds: st.rounds,
                offset: st.offset,
                barrier,
                threads: st.threads,
                groups: st.groups,
                round,
                work_tile: if attention { g as u32 } else { 0 },
            });
        }
    }

    fn setup(&mut self) {
        let init: Vec<Op> = self.ring.init.iter().map(|&s| init_op(s)).collect();
        // The MMA warp allocates before the set-up barrier, which publishes the address.
        let tmem: Option<Vec<Op>> = match (self.tmem_plan(), self.attention()) {
            (Some(p), _) => Some(self.tmem_ops(&p.setup)),
            (None, Some(p)) => Some(self.attn_ops(&p.setup)),
            (None, None) => None,
        };
        let Some(tmem) = tmem else {
            self.s.setup = init;
            return;
        };
        let mut setup = vec![Op::InitBarriers];
        setup.extend(tmem);
        setup.push(Op::Tcgen05FenceBefore);
        setup.extend(init.into_iter().filter(|&o| o != Op::InitBarriers));
        setup.push(Op::Tcgen05FenceAfter);
        self.s.setup = setup;
    }

    fn ring_op(&self, s: Step) -> Op {
        let bar = |b: Bar| self.bars[&b];
        match s {
            Step::Wait { bar: b, start } => Op::Wait {
                bar: bar(b),
                start,
                lag: 0,
            },
            Step::ArriveExpectTx { bar: b, bytes } => Op::ExpectTx { bar: bar(b), bytes },
            Step::Tma { load } => Op::Tma {
                load: self.loads[load],
            },
            Step::TmaOnce { load } => Op::Tma {
                load: self.once[load],
            },
            Step::GenericWrite { load } => Op::GenericWrite {
                load: self.loads[load],
            },
            Step::FenceProxyAsync => Op::FenceProxyAsync,
            Step::Mma => Op::Wgmma(MmaPart::Body),
            Step::Commit => Op::WgmmaCommit,
            Step::WaitGroup(n) => Op::WgmmaWait(n),
            Step::Arrive { bar: b, lag } => Op::Arrive { bar: bar(b), lag },
            Step::ArrivePeer { bar: b, lag } => Op::ArrivePeer { bar: bar(b), lag },
            Step::IssueHead => Op::Wgmma(MmaPart::Head),
            Step::IssueTail => Op::Wgmma(MmaPart::Tail),
            Step::Between => Op::Run(Region::Between),
            Step::Handoff => Op::Run(Region::Handoff),
            Step::TurnWait { who } => Op::Sync {
                bar: self.turn(),
                index: Index::Own,
                who,
            },
            Step::TurnPass { who } => Op::Signal {
                bar: self.turn(),
                index: Index::Next,
                who,
            },
            Step::Tcgen05Mma => Op::Tcgen05Mma {
                part: MmaPart::Body,
                tile: 0,
            },
            Step::Tcgen05Commit { bar: b, lag } => Op::Tcgen05Commit { bar: bar(b), lag },
        }
    }

    fn turn(&self) -> BarrierId {
        self.turns
            .unwrap_or_else(|| BarrierId::from_index(usize::MAX >> 33))
    }

    fn ring_ops(&self, steps: &[Step]) -> Vec<Op> {
        steps.iter().map(|&s| self.ring_op(s)).collect()
    }

    fn acc_tile(&self) -> TmemTileId {
        TmemTileId(0)
    }

    fn tmem_op(&self, s: TmemStep) -> Option<Op> {
        Some(match s {
            TmemStep::Alloc { columns } => Op::TmemAlloc { columns },
            TmemStep::Relinquish => Op::TmemRelinquish,
            TmemStep::Publish | TmemStep::Mainloop => return None,
            TmemStep::CommitAcc => Op::Tcgen05Commit {
                bar: self.acc[&AccBar::Full],
                lag: 0,
            },
            TmemStep::Wait { bar, start } => Op::Wait {
                bar: self.acc[&bar],
                start,
                lag: 0,
            },
            TmemStep::Arrive { bar } => Op::Arrive {
                bar: self.acc[&bar],
                lag: 0,
            },
            TmemStep::FenceAfter => Op::Tcgen05FenceAfter,
            TmemStep::FenceBefore => Op::Tcgen05FenceBefore,
            TmemStep::Load { column, columns } => Op::TmemLoad {
                tile: self.acc_tile(),
                column,
                columns,
            },
            TmemStep::WaitLoad => Op::TmemWaitLoad,
            TmemStep::Read { column, columns } => {
                Op::Run(Region::Epilogue(Some((column, columns))))
            }
            TmemStep::Dealloc { columns } => Op::TmemDealloc { columns },
            TmemStep::ClusterSync => Op::ClusterSync,
        })
    }

    fn tmem_ops(&self, steps: &[TmemStep]) -> Vec<Op> {
        steps.iter().filter_map(|&s| self.tmem_op(s)).collect()
    }

    /// The TMEM tile `S` or `O` of Q tile `g` (tiles are placed O0, S0, O1, S1).
    fn attn_tile(&self, name: &str, g: u32) -> TmemTileId {
        TmemTileId(2 * g as usize + usize::from(name == "S"))
    }

    fn attn_ops(&self, steps: &[AttnStep]) -> Vec<Op> {
        let mut out = Vec::new();
        for &s in steps {
            let bar = |b: Bar| self.bars[&b];
            out.push(match s {
                AttnStep::Alloc { columns } => Op::TmemAlloc { columns },
                AttnStep::Relinquish => Op::TmemRelinquish,
                AttnStep::Publish => continue,
                AttnStep::Dealloc { columns } => Op::TmemDealloc { columns },
                AttnStep::RingWait { bar: b, start } => Op::Wait {
                    bar: bar(b),
                    start,
                    lag: 0,
                },
                AttnStep::ExpectQ { bytes } => Op::ExpectTx {
                    bar: bar(Bar::Once),
                    bytes,
                },
                AttnStep::LoadQ { tile } => Op::Tma {
                    load: match tile {
                        0 => self.once[0],
                        _ => self.q1.unwrap_or(self.once[0]),
                    },
                },
                AttnStep::LoadKv => {
                    out.extend(self.ring_ops(&self.ring.producer));
                    continue;
                }
                AttnStep::RingCommit { bar: b } => Op::Tcgen05Commit {
                    bar: bar(b),
                    lag: 0,
                },
                AttnStep::Wait { bar: b, start, lag } => Op::Wait {
                    bar: self.attn[&b],
                    start,
                    lag,
                },
                AttnStep::Arrive { bar: b } => Op::Arrive {
                    bar: self.attn[&b],
                    lag: 0,
                },
                AttnStep::Commit { bar: b } => Op::Tcgen05Commit {
                    bar: self.attn[&b],
                    lag: 0,
                },
                AttnStep::FenceAfter => Op::Tcgen05FenceAfter,
                AttnStep::FenceBefore => Op::Tcgen05FenceBefore,
                AttnStep::MmaS { tile } => Op::Tcgen05Mma {
                    part: MmaPart::Head,
                    tile,
                },
                AttnStep::MmaO { tile } => Op::Tcgen05Mma {
                    part: MmaPart::Tail,
                    tile,
                },
                AttnStep::LoadS { tile } => Op::TmemLoad {
                    tile: self.attn_tile("S", tile),
                    column: 0,
                    columns: self.attention().map_or(0, |p| p.block_n),
                },
                AttnStep::Softmax => Op::Run(Region::Between),
                AttnStep::StoreScale { tile } => Op::FactorStore { tile },
                AttnStep::StoreP { tile } => Op::TmemStore {
                    tile: self.attn_tile("S", tile),
                },
                AttnStep::LoadScale { tile } => Op::FactorLoad { tile },
                AttnStep::BeginRescale { tile } => Op::RescaleBegin { tile },
                AttnStep::LoadO {
                    tile,
                    column,
                    columns,
                } => Op::TmemLoad {
                    tile: self.attn_tile("O", tile),
                    column,
                    columns,
                },
                AttnStep::ScaleO { tile } => Op::Rescale { tile },
                AttnStep::StoreO { tile } => Op::TmemStore {
                    tile: self.attn_tile("O", tile),
                },
                AttnStep::EndRescale => Op::RescaleEnd,
                AttnStep::WaitLd => Op::TmemWaitLoad,
                AttnStep::WaitSt => Op::TmemWaitStore,
                AttnStep::Epilogue => Op::Run(Region::Epilogue(None)),
            });
        }
        out
    }

    /// The exit of a role that runs the code after the loop: every bulk store has completed
    /// (when the epilogue stores through TMA), then the cluster barrier before exit.
    fn storing_exit(&self, mut exit: Vec<Op>) -> Vec<Op> {
        if !self.s.stores.is_empty() {
            exit.push(Op::BulkWaitAll);
        }
        if self.ring.cluster.as_ref().is_some_and(|c| c.exit_sync) {
            exit.push(Op::ClusterSync);
        }
        exit
    }

    fn roles(&mut self) {
        let r = self.ring;
        if let Some(p) = self.attention() {
            let roles = p.roles;
            for g in 0..Q_TILES {
                let mut role = Role::new(
                    RoleKind::Softmax(g),
                    g * roles.softmax_warps,
                    roles.softmax_warps,
                    Issue::Warps,
                );
                role.regs = Some(roles.regs[0]);
                role.program = Program {
                    tile: self.attn_ops(&p.softmax_tile[g as usize]),
                    iteration: self.attn_ops(&p.softmax_iteration[g as usize]),
                    end: self.attn_ops(&p.softmax_end[g as usize]),
                    exit: if p.stores.is_empty() {
                        Vec::new()
                    } else {
                        vec![Op::BulkWaitAll]
                    },
                    ..Program::default()
                };
                self.s.roles.push(role);
            }
            let mut correction = Role::new(
                RoleKind::Correction,
                roles.correction_warp,
                WARPGROUP_WARPS,
                Issue::Warps,
            );
            correction.regs = Some(roles.regs[1]);
            correction.program.iteration = self.attn_ops(&p.correction_iteration);
            self.s.roles.push(correction);
            let mut load = Role::new(RoleKind::Producer, roles.load_warp, 1, Issue::Thread);
            load.regs = Some(roles.regs[2]);
            load.program.tile = self.attn_ops(&p.load_tile);
            load.program.iteration = self.attn_ops(&p.load_iteration);
            self.s.roles.push(load);
            let mut mma = Role::new(RoleKind::Mma, roles.mma_warp, 1, Issue::Thread);
            mma.regs = Some(roles.regs[2]);
            mma.program = Program {
                tile: self.attn_ops(&p.mma_tile),
                iteration: self.attn_ops(&p.mma_iteration),
                release: self.attn_ops(&p.mma_tile_end),
                exit: self.attn_ops(&p.mma_exit),
                ..Program::default()
            };
            self.s.roles.push(mma);
            return;
        }
        let producer_program = Program {
            tile: self.ring_ops(&r.producer_once),
            lead: u32::from(r.persistent),
            iteration: self.ring_ops(&r.producer),
            ..Program::default()
        };
        if let Some(p) = self.tmem_plan() {
            let roles = p.roles;
            let mut epilogue = Role::new(RoleKind::Epilogue, 0, roles.epilogue_warps, Issue::Warps);
            epilogue.program.end = self.tmem_ops(&p.epilogue);
            epilogue.program.exit = self.storing_exit(Vec::new());
            self.s.roles.push(epilogue);
            let mut producer = Role::new(RoleKind::Producer, roles.producer_warp, 1, Issue::Thread);
            producer.program = producer_program;
            self.s.roles.push(producer);
            let main = p
                .mma_tile
                .iter()
                .position(|&s| s == TmemStep::Mainloop)
                .unwrap_or(p.mma_tile.len());
            let mut mma = Role::new(RoleKind::Mma, roles.mma_warp, 1, Issue::Thread);
            mma.rank = p.pair.as_ref().map(|x| x.leader);
            mma.program = Program {
                tile: self.tmem_ops(&p.mma_tile[..main]),
                iteration: self.ring_ops(&r.consumer),
                drain: self.ring_ops(&r.consumer_drain),
                release: self.ring_ops(&r.consumer_release),
                end: self.tmem_ops(&p.mma_tile[main..]),
                exit: self.tmem_ops(&p.mma_exit),
                ..Program::default()
            };
            self.s.roles.push(mma);
            if let Some(pair) = &p.pair {
                let mut peer = Role::new(RoleKind::Mma, roles.mma_warp, 1, Issue::Thread);
                peer.rank = Some(1 - pair.leader);
                peer.program.exit = self.tmem_ops(&pair.peer_exit);
                self.s.roles.push(peer);
            }
            return;
        }
        let Some(roles) = self.kernel.schedule.roles else {
            return;
        };
        let mut consumer = Role::new(RoleKind::Consumer, 0, roles.consumer_warps, Issue::Warps);
        consumer.regs = Some(roles.consumer_regs);
        consumer.replicas = (roles.consumer_warps / WARPGROUP).max(1);
        consumer.program = Program {
            start: self.ring_ops(&r.consumer_start),
            tile: self.ring_ops(&r.consumer_once),
            iteration: self.ring_ops(&r.consumer),
            rotated: r.overlap.is_some(),
            drain: self.ring_ops(&r.consumer_drain),
            release: self.ring_ops(&r.consumer_release),
            end: vec![Op::Run(Region::Epilogue(None))],
            exit: self.storing_exit(self.ring_ops(&r.consumer_exit)),
            lead: 0,
        };
        self.s.roles.push(consumer);
        let mut producer = Role::new(
            RoleKind::Producer,
            roles.consumer_warps,
            roles.producer_warps,
            Issue::Thread,
        );
        producer.regs = Some(roles.producer_regs);
        producer.program = producer_program;
        self.s.roles.push(producer);
    }

    fn tmem(&mut self) {
        if let Some(p) = self.tmem_plan() {
            self.s.tmem = Some(Tmem {
                columns: p.columns,
                slot_offset: p.slot_offset,
                tiles: vec![TmemTile {
                    name: "acc",
                    index: None,
                    column: 0,
                    columns: p.acc_columns,
                }],
                mmas: vec![TmemMma {
                    part: MmaPart::Body,
                    idesc: p.idesc,
                    a: Some(p.a.clone()),
                    b: p.b.clone(),
                }],
            });
        }
        if let Some(p) = self.attention() {
            let tiles = p
                .tiles
                .iter()
                .enumerate()
                .flat_map(|(g, t)| {
                    let g = Some(g as u32);
                    [
                        TmemTile {
                            name: "O",
                            index: g,
                            column: t.o,
                            columns: p.d,
                        },
                        TmemTile {
                            name: "S",
                            index: g,
                            column: t.s,
                            columns: p.block_n,
                        },
                    ]
                })
                .collect();
            self.s.tmem = Some(Tmem {
                columns: p.columns,
                slot_offset: p.slot_offset,
                tiles,
                mmas: vec![
                    TmemMma {
                        part: MmaPart::Head,
                        idesc: p.s_idesc,
                        a: Some(p.q.clone()),
                        b: p.k.clone(),
                    },
                    TmemMma {
                        part: MmaPart::Tail,
                        idesc: p.o_idesc,
                        a: None,
                        b: p.v.clone(),
                    },
                ],
            });
        }
    }
}

fn init_op(s: InitStep) -> Op {
    match s {
        InitStep::InitBarriers => Op::InitBarriers,
        InitStep::FenceMbarrierInit => Op::FenceBarrierInit,
        InitStep::BarSync => Op::CtaSync,
        InitStep::ClusterSync => Op::ClusterSync,
    }
}

fn store_op(s: StoreStep, barrier: BarrierId) -> Op {
    match s {
        StoreStep::WaitRead => Op::BulkWaitRead,
        StoreStep::Sync => Op::Sync {
            bar: barrier,
            index: Index::Own,
            who: Who::All,
        },
        StoreStep::Write => Op::StagingWrite,
        StoreStep::Fence => Op::FenceProxyAsync,
        StoreStep::Issue => Op::BulkStore,
        StoreStep::Commit => Op::BulkCommit,
        StoreStep::WaitAll => Op::BulkWaitAll,
    }
}
