//! sm_90a: the schedule IR's roles (`kiln_ir::sched`) as a warp-specialised loop.
//!
//! The block is the kernel's consumer warps (threads `0..32 * consumer_warps`, which run the
//! kernel's code unchanged) plus one producer warpgroup after them. At the ring's `for`, the
//! producer warpgroup gives registers back (`setmaxnreg.dec`), one elected thread runs the
//! producer's program (wait `empty`, `arrive.expect_tx` on `full`, `cp.async.bulk.tensor`
//! boxes) over the loop's iteration space and exits; the consumers take the registers
//! (`setmaxnreg.inc`) and run their program around the loop body, whose `mma`s become
//! wgmmas ([`wgmma`]) reading the stage. Tiles loaded once per work tile (attention's `Q`) are
//! issued by the producer before its loop and waited for by the consumers before theirs; the
//! load op itself, earlier in the kernel, only names the tile's shared address. Every op
//! comes from the role programs, the data the `protocol_check` pass proved.
//!
//! A clustered schedule (`kiln_ir::sched::cluster`): the entry requires clusters of 2
//! (`.reqnctapercluster`), the set-up ends on a cluster barrier instead of `bar.sync`, each
//! CTA issues its boxes of the shared load with `.multicast::cluster` (the others' are
//! predicated off by `%cluster_ctarank`), the consumers' peer releases arrive through `mapa`
//! on the other CTA's `empty`, which the producer waits on with cluster scope, and the
//! consumers meet at a cluster barrier before they exit.

pub(crate) mod persistent;
mod rotated;
mod tma_store;
mod wgmma;

pub(crate) use rotated::TurnRegs;
pub(crate) use wgmma::RingBody;

use std::collections::BTreeSet;
use std::fmt::Display;

use kiln_ir::sched::tma::TmaLoad;
use kiln_ir::sched::{BarrierId, BarrierKind, LoadId, Mbarrier, Op, Phase, Role, RoleKind, Sched};
use kiln_ir::{Kernel, OpId};

use crate::CodegenError;
use crate::TensorMapSpec;
use crate::types::{Class, Reg};
use crate::writer::Writer;

/// The longest a `try_wait` may suspend its thread, in nanoseconds (10 ms, far beyond any
/// wait's length: the thread wakes when the phase completes, the limit only bounds a sleep).
const SUSPEND_TIME_HINT_NS: u32 = 10_000_000;

/// The tensor maps the runtime builds for `k`, one per tensor parameter TMA loads or stores,
/// in parameter order.
pub(crate) fn tensor_maps(k: &Kernel) -> Vec<TensorMapSpec> {
    let Some(s) = &k.schedule.sched else {
        return Vec::new();
    };
    let mut maps: Vec<TensorMapSpec> = s
        .loads
        .iter()
        .map(|(_, l)| TensorMapSpec {
            param: l.tma.param,
            box_dims: l.tma.map_box(),
            swizzle_bytes: l.tma.swizzle,
        })
        .chain(s.stores.iter().map(|st| TensorMapSpec {
            param: st.param,
            box_dims: st.map_box(),
            swizzle_bytes: st.swizzle,
        }))
        .collect();
    maps.sort_by_key(|m| m.param);
    maps.dedup();
    maps
}

/// The load ring's barriers: those the producer's program names (its stage arrays, the once
/// tiles' barriers). The others hand tensor memory or registers between roles.
pub(crate) fn ring_barriers(s: &Sched) -> BTreeSet<BarrierId> {
    s.role(RoleKind::Producer)
        .into_iter()
        .flat_map(|r| r.program.ops())
        .filter_map(Op::barrier)
        .collect()
}

/// Whether `bar` is a stage array of the ring: a per-iteration barrier of the load ring,
/// whose stage `i % stages` iteration `i` uses.
pub(crate) fn staged(s: &Sched, bar: BarrierId) -> bool {
    s.mbarrier(bar).is_some_and(|m| m.phase == Phase::Iteration) && ring_barriers(s).contains(&bar)
}

/// The mbarrier `bar`, or an internal error at `at`.
pub(crate) fn mbarrier(
    w: &Writer<'_>,
    s: &Sched,
    bar: BarrierId,
    at: OpId,
) -> Result<Mbarrier, CodegenError> {
    s.mbarrier(bar)
        .copied()
        .ok_or_else(|| w.internal(at, format!("`{}` is not an mbarrier", s.barriers[bar])))
}

/// The role of `kind`, or an internal error at `at`.
pub(crate) fn role<'s>(
    w: &Writer<'_>,
    s: &'s Sched,
    kind: RoleKind,
    at: OpId,
) -> Result<&'s Role, CodegenError> {
    s.role(kind)
        .ok_or_else(|| w.internal(at, format!("a schedule without its {kind} role")))
}

/// Per-role loop state: stage index, one phase bit per waited stage array, the stage of
/// the previous iteration (for releases with lag 1) and the iterations run in this tile; in a
/// persistent kernel also the parity of the work tile (the per-tile barriers' phase).
pub(crate) struct Cursor {
    pub(crate) stage: Reg,
    prev: Reg,
    pub(crate) count: Reg,
    phases: Vec<(BarrierId, Reg)>,
    pub(crate) tile_parity: Option<Reg>,
}

impl Writer<'_> {
    /// Shared address of `bar`: its stage `stage` for a stage array of the ring, else the
    /// barrier itself.
    pub(crate) fn bar_addr(
        &mut self,
        s: &Sched,
        bar: BarrierId,
        stage: Reg,
        at: OpId,
    ) -> Result<Reg, CodegenError> {
        let m = mbarrier(self, s, bar, at)?;
        let a = self.new_reg(Class::B32);
        if staged(s, bar) {
            self.ins(format!("mad.lo.u32 {a}, {stage}, 8, {}", self.smem));
            self.ins(format!("add.u32 {a}, {a}, {}", m.offset));
        } else {
            self.ins(format!("add.u32 {a}, {}, {}", self.smem, m.offset));
        }
        Ok(a)
    }

    /// Shared address of `bar`, a barrier that is not a stage array.
    pub(crate) fn bar_at(&mut self, s: &Sched, bar: BarrierId) -> Result<Reg, CodegenError> {
        if staged(s, bar) {
            return Err(self.internal(s.for_op, format!("`{}` without its stage", s.barriers[bar])));
        }
        self.bar_addr(s, bar, self.smem, s.for_op)
    }

    /// One thread inits the mbarriers `bars` with their counts: first every stage array,
    /// stage by stage, then the single barriers.
    pub(crate) fn init_barriers(&mut self, s: &Sched, bars: &[BarrierId]) {
        let (p, skip) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!("setp.ne.u32 {p}, {}, 0", self.tid));
        self.ins(format!("@{p} bra {skip}"));
        let arrays: Vec<Mbarrier> = bars
            .iter()
            .filter_map(|&b| s.mbarrier(b).copied())
            .collect();
        let most = arrays.iter().map(|m| m.stages).max().unwrap_or(0);
        let staged = (0..most).flat_map(|st| {
            arrays
                .iter()
                .filter(move |m| m.stages > 1 && st < m.stages)
                .map(move |m| (m.at(st), m.count))
        });
        let single = arrays
            .iter()
            .filter(|m| m.stages <= 1)
            .map(|m| (m.offset, m.count));
        for (off, count) in staged.chain(single).collect::<Vec<_>>() {
            let a = self.new_reg(Class::B32);
            self.ins(format!("add.u32 {a}, {}, {off}", self.smem));
            self.ins(format!("mbarrier.init.shared::cta.b64 [{a}], {count}"));
        }
        self.label(&skip);
    }

    /// The set-up before the roles split ([`Sched::setup`]).
    pub(crate) fn write_ring_init(&mut self) -> Result<(), CodegenError> {
        let k: &Kernel = self.k;
        let Some(s) = &k.schedule.sched else {
            return Ok(());
        };
        if s.tmem.is_some() {
            return self.write_tmem_setup(s);
        }
        for &op in &s.setup {
            match op {
                Op::InitBarriers => {
                    let bars: Vec<BarrierId> = s.barriers.iter().map(|(h, _)| h).collect();
                    self.init_barriers(s, &bars);
                }
                Op::FenceBarrierInit => self.ins("fence.mbarrier_init.release.cluster"),
                Op::CtaSync => {
                    self.ins("bar.sync 0");
                    self.bind_once(s);
                }
                Op::ClusterSync => {
                    self.cluster_barrier();
                    self.bind_once(s);
                }
                other => {
                    return Err(
                        self.internal(s.for_op, format!("`{}` in the set-up", named(s, other)))
                    );
                }
            }
        }
        Ok(())
    }

    /// After the set-up barrier: a once load's op only names its tile (the producer issues
    /// it at the ring), so the tile's shared address is bound here.
    pub(crate) fn bind_once(&mut self, s: &Sched) {
        for (h, l) in s.loads.iter() {
            // The op names its own tile: that of the CTA's first work tile.
            if s.once(h) && l.work_tile == 0 {
                let base = self.new_reg(Class::B32);
                self.ins(format!("add.u32 {base}, {}, {}", self.smem, l.tma.offset));
                self.stage_bases.insert(l.tma.load, base);
            }
        }
    }

    /// A fresh cursor at stage 0 with a phase bit at its start for each stage array `ops`
    /// wait on.
    pub(crate) fn cursor(&mut self, s: &Sched, ops: &[Op]) -> Cursor {
        let c = Cursor {
            stage: self.new_reg(Class::B32),
            prev: self.new_reg(Class::B32),
            count: self.new_reg(Class::B32),
            phases: Vec::new(),
            tile_parity: None,
        };
        self.ins(format!("mov.u32 {}, 0", c.stage));
        self.ins(format!("mov.u32 {}, 0", c.prev));
        self.ins(format!("mov.u32 {}, 0", c.count));
        let mut c = c;
        for op in ops {
            if let Op::Wait { bar, start, .. } = *op
                && staged(s, bar)
            {
                let r = self.new_reg(Class::B32);
                self.ins(format!("mov.u32 {r}, {start}"));
                c.phases.push((bar, r));
            }
        }
        c
    }

    /// Moves a cursor to the next iteration: the stage wraps and flips every phase bit.
    pub(crate) fn advance(&mut self, c: &Cursor, stages: u32) {
        let wrap = self.new_reg(Class::Pred);
        self.mov(c.prev, c.stage);
        self.ins(format!("add.u32 {}, {}, 1", c.count, c.count));
        self.ins(format!("add.u32 {}, {}, 1", c.stage, c.stage));
        self.ins(format!("setp.eq.u32 {wrap}, {}, {stages}", c.stage));
        self.ins(format!("selp.u32 {}, 0, {}, {wrap}", c.stage, c.stage));
        for &(_, r) in &c.phases {
            let flipped = self.new_reg(Class::B32);
            self.ins(format!("xor.b32 {flipped}, {r}, 1"));
            self.ins(format!("selp.u32 {r}, {flipped}, {r}, {wrap}"));
        }
    }

    /// The parity of a wait on a per-tile barrier whose tile-0 parity is `start`: flipped
    /// by the work tile's parity (`parity`, none outside a tile loop) and, after the role's
    /// tiles (`after`), once more in a kernel that runs a single tile (whose parity register
    /// does not exist).
    pub(crate) fn tile_phase(&mut self, start: u32, parity: Option<Reg>, after: bool) -> String {
        match parity {
            Some(p) => {
                let r = self.new_reg(Class::B32);
                self.ins(format!("xor.b32 {r}, {p}, {start}"));
                r.to_string()
            }
            None => (start ^ u32::from(after)).to_string(),
        }
    }

    /// A parity wait loop on `bar`: a stage array at the cursor's stage and phase bit, a
    /// per-tile barrier at the tile's phase (`after`: past the role's last tile). A barrier
    /// that hears other CTAs is acquired at cluster scope.
    pub(crate) fn wait(
        &mut self,
        s: &Sched,
        c: &Cursor,
        bar: BarrierId,
        start: u32,
        after: bool,
    ) -> Result<(), CodegenError> {
        let m = mbarrier(self, s, bar, s.for_op)?;
        let phase = if staged(s, bar) {
            c.phases
                .iter()
                .find(|(b, _)| *b == bar)
                .map(|&(_, r)| r.to_string())
                .ok_or_else(|| self.internal(s.for_op, "a wait without a phase bit"))?
        } else if m.phase == Phase::Tile {
            self.tile_phase(start, c.tile_parity, after)
        } else {
            return Err(self.internal(
                s.for_op,
                format!("a wait on `{}` outside the ring", s.barriers[bar]),
            ));
        };
        let addr = self.bar_addr(s, bar, c.stage, s.for_op)?;
        // A clustered ring's `empty` also counts the peer's consumers: acquire at cluster
        // scope what their releases published (ptx-notes §2). The 2-SM form's `full` hears
        // the peer's TMA, its `empty` the leader's commit.
        let scope = if m.cluster { ".acquire.cluster" } else { "" };
        self.parity_wait_loop(scope, addr, phase);
        Ok(())
    }

    /// Loops on `mbarrier.try_wait.parity{scope}` until the phase of parity `phase` of the
    /// barrier at `addr` has completed. The suspend-time hint lets a waiting warp sleep until
    /// the barrier changes (ptxas writes `NANOSLEEP.SYNCS`) instead of retrying every few
    /// cycles: a producer that runs ahead otherwise spins hundreds of times per stage on the
    /// scheduler its consumers' warps issue from.
    pub(crate) fn parity_wait_loop(
        &mut self,
        scope: &str,
        addr: impl Display,
        phase: impl Display,
    ) {
        let (p, top) = (self.new_reg(Class::Pred), self.new_label());
        self.label(&top);
        self.ins(format!(
            "mbarrier.try_wait.parity{scope}.shared::cta.b64 {p}, [{addr}], {phase}, \
             {SUSPEND_TIME_HINT_NS}"
        ));
        self.ins(format!("@!{p} bra {top}"));
    }

    /// Writes the ring's `for` in a kernel that is not persistent: the role split, the
    /// producer loop, then the consumer loop with the body. See the module doc.
    pub(crate) fn write_ring_loop(&mut self, id: OpId) -> Result<(), CodegenError> {
        let k: &Kernel = self.k;
        let s = k
            .schedule
            .sched
            .as_ref()
            .ok_or_else(|| self.internal(id, "a ring loop without its schedule"))?;
        if s.cluster.is_some() {
            return Err(self.internal(id, "a clustered ring that is not persistent"));
        }
        let (consumer, producer) = (
            role(self, s, RoleKind::Consumer, id)?,
            role(self, s, RoleKind::Producer, id)?,
        );
        let bounds = self.loop_bounds(id)?;
        let consumer_label = self.split_roles(consumer, producer)?;
        let c = self.cursor(s, &producer.program.iteration);
        self.write_producer(s, producer, &c, bounds)?;
        self.ins("exit");
        self.label(&consumer_label);
        self.enter_consumers(s, consumer)?;
        let c = self.cursor(s, &consumer.program.iteration);
        self.write_consumers(s, consumer, c, bounds).map(drop)
    }

    /// The `for`'s lower bound, upper bound and step.
    pub(crate) fn loop_bounds(&mut self, id: OpId) -> Result<[Reg; 3], CodegenError> {
        let op = self.k.ops[id].clone();
        Ok([
            self.scalar(op.operands[0], id)?,
            self.scalar(op.operands[1], id)?,
            self.scalar(op.operands[2], id)?,
        ])
    }

    /// Branches the consumer warps to the returned label; the producer warpgroup falls
    /// through, gives registers back, and all its threads but the elected one exit.
    fn split_roles(&mut self, consumer: &Role, producer: &Role) -> Result<String, CodegenError> {
        let consumers = 32 * consumer.end_warp();
        let (is_consumer, consumer_label) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!(
            "setp.lt.u32 {is_consumer}, {}, {consumers}",
            self.tid
        ));
        self.ins(format!("@{is_consumer} bra {consumer_label}"));
        // Producer warpgroup: give registers back; one thread issues every stage's TMA.
        if let Some(regs) = producer.regs {
            self.ins(format!("setmaxnreg.dec.sync.aligned.u32 {regs}"));
        }
        let idle = self.new_reg(Class::Pred);
        self.ins(format!(
            "setp.ne.u32 {idle}, {}, {}",
            self.tid,
            32 * producer.first_warp
        ));
        self.ins(format!("@{idle} exit"));
        Ok(consumer_label)
    }

    /// The producer's side of the ring: its first `lead` iterations, its per-tile program,
    /// then its loop over the iterations. A persistent producer issues the first iteration
    /// before the per-tile program (its stage is free before the consumers release the
    /// previous tile's once tiles).
    pub(crate) fn write_producer(
        &mut self,
        s: &Sched,
        producer: &Role,
        c: &Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        for _ in 0..producer.program.lead {
            let (none, skip) = (self.new_reg(Class::Pred), self.new_label());
            self.ins(format!("setp.ge.s32 {none}, {iv}, {hi}"));
            self.ins(format!("@{none} bra {skip}"));
            self.producer_iteration(s, producer, c, iv)?;
            self.ins(format!("add.s32 {iv}, {iv}, {step}"));
            self.label(&skip);
        }
        for &op in &producer.program.tile {
            self.producer_op(s, c, op, iv)?;
        }
        let counted = self.open_counted_loop(iv, hi, step);
        self.producer_iteration(s, producer, c, iv)?;
        self.close_counted_loop(&counted);
        Ok(())
    }

    /// One iteration of the producer's program, then the cursor moves on.
    pub(crate) fn producer_iteration(
        &mut self,
        s: &Sched,
        producer: &Role,
        c: &Cursor,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        for &op in &producer.program.iteration {
            self.producer_op(s, c, op, iv)?;
        }
        self.advance(c, s.stages);
        Ok(())
    }

    /// Where the consumers start: they take the registers and learn their warpgroup.
    fn enter_consumers(&mut self, s: &Sched, consumer: &Role) -> Result<(), CodegenError> {
        if let Some(regs) = consumer.regs {
            self.ins(format!("setmaxnreg.inc.sync.aligned.u32 {regs}"));
        }
        // The warpgroup index through a lane-0 shuffle: ptxas then knows it is uniform and
        // keeps what derives from it (wgmma descriptors, barrier ids) in uniform registers.
        let (raw, wg) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("shr.u32 {raw}, {}, 7", self.tid));
        self.ins(format!("shfl.sync.idx.b32 {wg}, {raw}, 0, 31, -1"));
        self.warpgroup = Some(wg);
        // The named barriers the warpgroups take turns at, for the CTA's hand-overs and
        // every tile's loop.
        let turns = consumer.program.ops().find_map(|op| match op {
            Op::Sync { bar, .. } | Op::Signal { bar, .. } => Some(bar),
            _ => None,
        });
        self.turns = match turns {
            Some(bar) => Some(self.turn_regs(s, bar)?),
            None => None,
        };
        Ok(())
    }

    /// The consumers' side of the ring with cursor `c`, rotated or not, with the release of
    /// the once tiles; hands the cursor back.
    fn write_consumers(
        &mut self,
        s: &Sched,
        consumer: &Role,
        c: Cursor,
        bounds: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        if consumer.program.rotated {
            // The rotated loop releases the once tiles itself, after its last head mma.
            return self.write_rotated_loop(s, consumer, c, bounds);
        }
        let c = self.write_consumer_loop(s, consumer, c, bounds)?;
        self.write_release(s, consumer, &c)?;
        Ok(c)
    }

    /// The consumers' release of the once tiles ([`kiln_ir::sched::Program::release`]).
    pub(crate) fn write_release(
        &mut self,
        s: &Sched,
        consumer: &Role,
        c: &Cursor,
    ) -> Result<(), CodegenError> {
        let lane0 = self.lane0();
        for &op in &consumer.program.release {
            self.consumer_op(s, c, op, lane0)?;
        }
        Ok(())
    }

    /// One op of the producer's program (`iv`: the iteration's induction variable).
    pub(crate) fn producer_op(
        &mut self,
        s: &Sched,
        c: &Cursor,
        op: Op,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        match op {
            Op::Wait { bar, start, .. } => self.wait(s, c, bar, start, false)?,
            Op::ExpectTx { bar, bytes } => {
                let a = self.bar_addr(s, bar, c.stage, s.for_op)?;
                // The 2-SM form: the leader announces the pair's bytes on its own `full`.
                let guard = match s.cluster.as_ref().and_then(|c| c.pair) {
                    Some(p) => {
                        let (rank, lead) = (self.cluster_rank(), self.new_reg(Class::Pred));
                        self.ins(format!("setp.eq.u32 {lead}, {rank}, {}", p.leader));
                        format!("@{lead} ")
                    }
                    None => String::new(),
                };
                self.ins(format!(
                    "{guard}mbarrier.arrive.expect_tx.shared::cta.b64 _, [{a}], {bytes}"
                ));
            }
            Op::Tma { load } if s.once(load) => self.issue_tma_once(s, load, c)?,
            Op::Tma { load } => self.issue_tma(s, load, c, iv)?,
            Op::Arrive { bar, lag } => self.release(s, c, bar, lag, None, false)?,
            Op::FenceProxyAsync => self.ins("fence.proxy.async.shared::cta"),
            other => {
                return Err(self.internal(s.for_op, format!("producer op `{}`", named(s, other))));
            }
        }
        Ok(())
    }

    /// The consumers' loop: the consumer program around the body, then the drain; hands the
    /// cursor back.
    fn write_consumer_loop(
        &mut self,
        s: &Sched,
        consumer: &Role,
        c: Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        let id = s.for_op;
        let op = self.k.ops[id].clone();
        let body = op.regions[0].clone();
        let (iv, carried) = self.enter_loop(id, &op, &body, lo)?;
        let lane0 = self.lane0();
        for &o in &consumer.program.tile {
            self.consumer_op(s, &c, o, lane0)?;
        }
        let counted = self.open_counted_loop(iv, hi, step);
        for &o in &consumer.program.iteration {
            match o {
                Op::Wgmma(kiln_ir::sched::MmaPart::Body) => {
                    self.bind_stages(s, c.stage);
                    self.ring = Some(RingBody::new(self.k, s, true));
                    self.write_block(&body)?;
                    self.ring = None;
                    let yields = self.yielded(&body);
                    self.assign_all(&carried, &yields, id)?;
                }
                other => self.consumer_op(s, &c, other, lane0)?,
            }
        }
        self.advance(&c, s.stages);
        self.close_counted_loop(&counted);
        for &o in &consumer.program.drain {
            self.consumer_op(s, &c, o, lane0)?;
        }
        self.unbind_stages(s);
        for (r, v) in op.results.iter().zip(carried) {
            self.vals.insert(*r, v);
        }
        Ok(c)
    }

    /// Points every ring load at stage `stage`.
    pub(crate) fn bind_stages(&mut self, s: &Sched, stage: Reg) {
        for (_, l) in s.ring_loads() {
            let base = self.new_reg(Class::B32);
            self.ins(format!(
                "mad.lo.u32 {base}, {stage}, {}, {}",
                l.tma.stage_stride, self.smem
            ));
            self.ins(format!("add.u32 {base}, {base}, {}", l.tma.offset));
            self.stage_bases.insert(l.tma.load, base);
        }
    }

    /// Forgets the ring loads' stages after the loop.
    pub(crate) fn unbind_stages(&mut self, s: &Sched) {
        for (_, l) in s.ring_loads() {
            self.stage_bases.remove(&l.tma.load);
        }
    }

    /// A predicate true on lane 0 of each warp (the lane that arrives for its warp).
    pub(crate) fn lane0(&mut self) -> Reg {
        let (lane0, lane) = (self.new_reg(Class::Pred), self.new_reg(Class::B32));
        self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
        self.ins(format!("setp.eq.u32 {lane0}, {lane}, 0"));
        lane0
    }

    /// One op of the consumers' program outside the body.
    pub(crate) fn consumer_op(
        &mut self,
        s: &Sched,
        c: &Cursor,
        op: Op,
        lane0: Reg,
    ) -> Result<(), CodegenError> {
        match op {
            Op::WgmmaCommit => self.ins("wgmma.commit_group.sync.aligned"),
            Op::WgmmaWait(n) => self.ins(format!("wgmma.wait_group.sync.aligned {n}")),
            Op::Arrive { bar, lag } => self.release(s, c, bar, lag, Some(lane0), false)?,
            Op::ArrivePeer { bar, lag } => self.release(s, c, bar, lag, Some(lane0), true)?,
            Op::FenceProxyAsync => self.ins("fence.proxy.async.shared::cta"),
            Op::Wait { bar, start, .. } => self.wait(s, c, bar, start, false)?,
            other => {
                return Err(self.internal(
                    s.for_op,
                    format!("consumer op `{}` outside the body", named(s, other)),
                ));
            }
        }
        Ok(())
    }

    /// One arrival on `bar` of the stage used `lag` iterations ago (lag 0 or 1), by the
    /// thread(s) `elected` selects, skipped while fewer than `lag` iterations ran; `peer`:
    /// on the same barrier of the other CTA of the cluster, released at cluster scope.
    pub(crate) fn release(
        &mut self,
        s: &Sched,
        c: &Cursor,
        bar: BarrierId,
        lag: u32,
        elected: Option<Reg>,
        peer: bool,
    ) -> Result<(), CodegenError> {
        let stage = if lag == 0 { c.stage } else { c.prev };
        let a = self.bar_addr(s, bar, stage, s.for_op)?;
        let p = self.new_reg(Class::Pred);
        self.ins(format!("setp.ge.u32 {p}, {}, {lag}", c.count));
        if let Some(e) = elected {
            self.ins(format!("and.pred {p}, {p}, {e}"));
        }
        if peer {
            let (other, remote) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
            let rank = self.cluster_rank();
            self.ins(format!("xor.b32 {other}, {rank}, 1"));
            self.ins(format!("mapa.shared::cluster.u32 {remote}, {a}, {other}"));
            self.ins(format!(
                "@{p} mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{remote}]"
            ));
        } else {
            self.ins(format!("@{p} mbarrier.arrive.shared::cta.b64 _, [{a}]"));
        }
        Ok(())
    }

    /// This CTA's rank in its cluster (`%cluster_ctarank`).
    pub(crate) fn cluster_rank(&mut self) -> Reg {
        let r = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {r}, %cluster_ctarank"));
        r
    }

    /// Every thread of the cluster: what each wrote before (the barrier inits, its shared
    /// memory) is seen by every other CTA after.
    pub(crate) fn cluster_barrier(&mut self) {
        self.ins("barrier.cluster.arrive.release.aligned");
        self.ins("barrier.cluster.wait.acquire.aligned");
    }

    /// The TMA boxes of ring load `load` for the iteration whose induction variable is `iv`.
    fn issue_tma(
        &mut self,
        s: &Sched,
        load: LoadId,
        c: &Cursor,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        let id = s.for_op;
        let l = s.loads[load].clone();
        let ring_index = s.ring_loads().position(|(h, _)| h == load);
        let body_iv = self.k.ops[id].regions[0].args[0];
        let mut memo = std::collections::BTreeMap::new();
        let coords = self.k.ops[l.tma.load]
            .operands
            .clone()
            .into_iter()
            .map(|v| self.remat(v, body_iv, iv, &mut memo, l.tma.load))
            .collect::<Result<Vec<_>, _>>()?;
        let full = self.bar_addr(s, l.barrier, c.stage, id)?;
        let stage = self.new_reg(Class::B32);
        self.ins(format!(
            "mad.lo.u32 {stage}, {}, {}, {}",
            c.stage, l.tma.stage_stride, self.smem
        ));
        match &s.cluster {
            Some(cl) if let Some(p) = cl.pair => {
                // The 2-SM form: the CTA's own tile (of the shared load, its half) completes
                // on the leader's `full` (`.cta_group::2` may signal the peer CTA's barrier).
                let rank = self.cluster_rank();
                let leader_full = self.new_reg(Class::B32);
                self.ins(format!(
                    "mapa.shared::cluster.u32 {leader_full}, {full}, {}",
                    p.leader
                ));
                let mut coords = coords;
                if ring_index == Some(cl.shared) {
                    let n = coords.len();
                    for (k, &h) in p.half.iter().enumerate() {
                        if h != 0 {
                            let shifted = self.new_reg(Class::B32);
                            self.ins(format!(
                                "mad.lo.s32 {shifted}, {rank}, {h}, {}",
                                coords[n - 2 + k]
                            ));
                            coords[n - 2 + k] = shifted;
                        }
                    }
                }
                self.boxes(&l.tma, &coords, stage, leader_full, &[], ".cta_group::2")
            }
            Some(cl) if ring_index == Some(cl.shared) => {
                // Every CTA runs the same code; each box is issued where the rank is its
                // issuer's, into the stages of its mask's CTAs.
                let rank = self.cluster_rank();
                let cast = cl
                    .multicast
                    .iter()
                    .map(|m| {
                        let (p, mask) = (self.new_reg(Class::Pred), self.new_reg(Class::B16));
                        self.ins(format!("setp.eq.u32 {p}, {rank}, {}", m.issuer));
                        self.ins(format!("mov.b16 {mask}, {}", m.mask));
                        (p, mask)
                    })
                    .collect::<Vec<_>>();
                self.boxes(&l.tma, &coords, stage, full, &cast, "")
            }
            _ => self.tma_boxes(&l.tma, &coords, stage, full),
        }
    }

    /// The TMA boxes of once load `load` (its coordinates are computed before the loop).
    pub(crate) fn issue_tma_once(
        &mut self,
        s: &Sched,
        load: LoadId,
        c: &Cursor,
    ) -> Result<(), CodegenError> {
        let l = s.loads[load].clone();
        let coords = self.k.ops[l.tma.load]
            .operands
            .clone()
            .into_iter()
            .map(|v| self.scalar(v, l.tma.load))
            .collect::<Result<Vec<_>, _>>()?;
        let once = self.bar_addr(s, l.barrier, c.stage, l.tma.load)?;
        self.tma_boxes(&l.tma, &coords, self.smem, once)
    }

    /// `cp.async.bulk.tensor` of every box of `l` into the stage at `stage` (`l.offset` is
    /// added), the tile at `coords` (one per tensor dimension, outermost first), completing
    /// on the barrier at `bar`.
    pub(crate) fn tma_boxes(
        &mut self,
        l: &TmaLoad,
        coords: &[Reg],
        stage: Reg,
        bar: Reg,
    ) -> Result<(), CodegenError> {
        self.boxes(l, coords, stage, bar, &[], "")
    }

    /// [`Writer::tma_boxes`]; with `cast` (one `(predicate, ctaMask)` per box), box `b` is
    /// issued under `cast[b].0` with `.multicast::cluster` into the CTAs of `cast[b].1`;
    /// `group` qualifies every copy (`.cta_group::2` in the 2-SM form).
    fn boxes(
        &mut self,
        l: &TmaLoad,
        coords: &[Reg],
        stage: Reg,
        bar: Reg,
        cast: &[(Reg, Reg)],
        group: &str,
    ) -> Result<(), CodegenError> {
        if !cast.is_empty() && cast.len() != l.boxes.len() {
            return Err(self.internal(l.load, "a multicast plan that misses boxes"));
        }
        let map = *self
            .tmaps
            .get(&l.param)
            .ok_or_else(|| self.internal(l.load, "a TMA load without a tensor map"))?;
        let rank = l.lead_dims as usize + 2;
        let (lead, &[row, col]) = coords.split_at(coords.len().saturating_sub(2)) else {
            return Err(self.internal(l.load, "a TMA load with fewer than 2 coordinates"));
        };
        if coords.len() != rank {
            return Err(self.internal(l.load, "TMA coordinates that do not match the tensor map"));
        }
        for (k, b) in l.boxes.iter().enumerate() {
            let (dst, x, y) = (
                self.new_reg(Class::B32),
                self.new_reg(Class::B32),
                self.new_reg(Class::B32),
            );
            self.ins(format!(
                "add.u32 {dst}, {stage}, {}",
                l.offset + b.smem_offset
            ));
            self.ins(format!("add.s32 {x}, {col}, {}", b.origin[1]));
            self.ins(format!("add.s32 {y}, {row}, {}", b.origin[0]));
            // Innermost dimension first.
            let mut at = vec![x.to_string(), y.to_string()];
            at.extend(lead.iter().rev().map(Reg::to_string));
            let (guard, multicast, mask) = match cast.get(k) {
                Some((p, mask)) => (format!("@{p} "), ".multicast::cluster", format!(", {mask}")),
                None => (String::new(), "", String::new()),
            };
            self.ins(format!(
                "{guard}cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::\
                 bytes{multicast}{group} [{dst}], [{map}, {{{}}}], [{bar}]{mask}",
                at.join(", ")
            ));
        }
        Ok(())
    }
}

/// `op` as the schedule IR prints it, for messages.
pub(crate) fn named(s: &Sched, op: Op) -> String {
    kiln_ir::sched::op::Named { op, sched: s }.to_string()
}

/// The named barrier array `bar`: its first id, its ids and the threads meeting at each.
pub(crate) fn named_barrier(s: &Sched, bar: BarrierId) -> Option<(u32, u32, u32)> {
    match s.barriers[bar].kind {
        BarrierKind::Named {
            first,
            ids,
            threads,
        } => Some((first, ids, threads)),
        BarrierKind::Mbarrier(_) => None,
    }
}
