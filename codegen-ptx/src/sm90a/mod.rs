//! sm_90a: the stage rings of the `pipeline` pass as a warp-specialised loop.
//!
//! The block is the kernel's consumer warps (threads `0..32 * consumer_warps`, which run the
//! kernel's code unchanged) plus one producer warpgroup after them. At a ring's `for`, the
//! producer warpgroup gives registers back (`setmaxnreg.dec`), one elected thread runs the
//! ring's producer program (wait `empty`, `arrive.expect_tx` on `full`, `cp.async.bulk.tensor`
//! boxes) over the loop's iteration space and exits; the consumers take the registers
//! (`setmaxnreg.inc`) and run the consumer program around the loop body, whose `mma`s become
//! wgmmas ([`wgmma`]) reading the stage. Tiles the ring loads once (attention's `Q`) are
//! issued by the producer before its loop and waited for by the consumers before theirs; the
//! load op itself, earlier in the kernel, only names the tile's shared address. Every step
//! comes from [`kiln_ir::ring::Ring`], the data the `protocol_check` pass proved.
//!
//! A clustered ring ([`kiln_ir::cluster`]): the entry requires clusters of 2
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

use std::fmt::Display;

use kiln_ir::ring::{Bar, InitStep, Ring, Step, TmaLoad};
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
    let mut maps: Vec<TensorMapSpec> = k
        .schedule
        .rings
        .values()
        .flat_map(|r| r.loads.iter().chain(&r.once))
        .map(|l| TensorMapSpec {
            param: l.param,
            box_dims: l.map_box(),
            swizzle_bytes: l.swizzle,
        })
        .chain(k.schedule.tma_stores.values().map(|st| TensorMapSpec {
            param: st.param,
            box_dims: st.map_box(),
            swizzle_bytes: st.swizzle,
        }))
        .collect();
    maps.sort_by_key(|m| m.param);
    maps.dedup();
    maps
}

/// Per-role loop state: stage index, one phase bit per waited barrier array, the stage of
/// the previous iteration (for releases with lag 1) and the iterations run in this tile; in a
/// persistent kernel also the parity of the work tile (the once barriers' phase).
pub(crate) struct Cursor {
    pub(crate) stage: Reg,
    prev: Reg,
    count: Reg,
    phases: Vec<(Bar, Reg)>,
    pub(crate) tile_parity: Option<Reg>,
}

impl Writer<'_> {
    /// Shared address of `bar[stage]` of `ring` (the `once` barrier has no stages).
    pub(crate) fn bar_addr(&mut self, ring: &Ring, bar: Bar, stage: Reg) -> Reg {
        let a = self.new_reg(Class::B32);
        let off = match bar {
            Bar::Full => ring.full_offset,
            Bar::Empty => ring.empty_offset,
            Bar::TailFull => ring.tail_full_offset,
            Bar::TailEmpty => ring.tail_empty_offset,
            Bar::Once | Bar::OnceFree => {
                let off = if bar == Bar::Once {
                    ring.once_offset
                } else {
                    ring.once_free_offset
                };
                self.ins(format!("add.u32 {a}, {}, {off}", self.smem));
                return a;
            }
        };
        self.ins(format!("mad.lo.u32 {a}, {stage}, 8, {}", self.smem));
        self.ins(format!("add.u32 {a}, {a}, {off}"));
        a
    }

    /// The set-up of every ring, before the roles split (the ring's `init` steps).
    pub(crate) fn write_ring_init(&mut self) {
        let rings: Vec<Ring> = self.k.schedule.rings.values().cloned().collect();
        let Some(first) = rings.first() else { return };
        for step in first.init.clone() {
            match step {
                InitStep::InitBarriers => {
                    let (p, skip) = (self.new_reg(Class::Pred), self.new_label());
                    self.ins(format!("setp.ne.u32 {p}, {}, 0", self.tid));
                    self.ins(format!("@{p} bra {skip}"));
                    for ring in &rings {
                        let mut arrays = vec![
                            (ring.full_offset, ring.full_count),
                            (ring.empty_offset, ring.empty_count),
                        ];
                        if !ring.tail_loads.is_empty() {
                            arrays.push((ring.tail_full_offset, ring.full_count));
                            arrays.push((ring.tail_empty_offset, ring.empty_count));
                        }
                        let mut bars: Vec<(u32, u32)> = (0..ring.stages)
                            .flat_map(|s| arrays.iter().map(move |&(at, n)| (at + 8 * s, n)))
                            .collect();
                        if !ring.once.is_empty() {
                            bars.push((ring.once_offset, 1));
                            if ring.persistent {
                                bars.push((ring.once_free_offset, ring.empty_count));
                            }
                        }
                        for (off, count) in bars {
                            let a = self.new_reg(Class::B32);
                            self.ins(format!("add.u32 {a}, {}, {off}", self.smem));
                            self.ins(format!("mbarrier.init.shared::cta.b64 [{a}], {count}"));
                        }
                    }
                    self.label(&skip);
                }
                InitStep::FenceMbarrierInit => self.ins("fence.mbarrier_init.release.cluster"),
                InitStep::BarSync => self.ins("bar.sync 0"),
                InitStep::ClusterSync => self.cluster_barrier(),
            }
        }
        // A once load's op only names its tile; the producer issues it at the ring.
        for l in rings.iter().flat_map(|r| r.once.iter()) {
            let base = self.new_reg(Class::B32);
            self.ins(format!("add.u32 {base}, {}, {}", self.smem, l.offset));
            self.stage_bases.insert(l.load, base);
        }
    }

    /// A fresh cursor at stage 0 with each waited barrier's phase bit at its start.
    pub(crate) fn cursor(&mut self, steps: &[Step]) -> Cursor {
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
        for s in steps {
            if let Step::Wait { bar, start } = *s
                && matches!(bar, Bar::Full | Bar::Empty | Bar::TailFull | Bar::TailEmpty)
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

    /// A parity wait loop on `bar[stage]`; the once barriers are waited on at parity `start`,
    /// flipped per work tile in a persistent kernel.
    pub(crate) fn wait(
        &mut self,
        ring: &Ring,
        c: &Cursor,
        bar: Bar,
        start: u32,
    ) -> Result<(), CodegenError> {
        let phase = match (bar, c.tile_parity) {
            (Bar::Once | Bar::OnceFree, None) => start.to_string(),
            (Bar::Once | Bar::OnceFree, Some(parity)) => {
                let r = self.new_reg(Class::B32);
                self.ins(format!("xor.b32 {r}, {parity}, {start}"));
                r.to_string()
            }
            (Bar::Full | Bar::Empty | Bar::TailFull | Bar::TailEmpty, _) => c
                .phases
                .iter()
                .find(|(b, _)| *b == bar)
                .map(|&(_, r)| r.to_string())
                .ok_or_else(|| self.internal(ring.for_op, "a wait without a phase bit"))?,
        };
        let addr = self.bar_addr(ring, bar, c.stage);
        // A clustered ring's `empty` also counts the peer's consumers: acquire at cluster
        // scope what their releases published (ptx-notes §2).
        // The 2-SM form's `full` hears the peer's TMA, its `empty` the leader's commit.
        let pair = ring.cluster.as_ref().is_some_and(|c| c.pair.is_some());
        let scope = if ring.cluster.is_some() && (bar == Bar::Empty || pair) {
            ".acquire.cluster"
        } else {
            ""
        };
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

    /// Writes a ring's `for`: the role split, the producer loop, then the consumer loop with
    /// the body. See the module doc.
    pub(crate) fn write_ring_loop(&mut self, id: OpId) -> Result<(), CodegenError> {
        let ring = self.k.schedule.rings[&id].clone();
        if ring.cluster.is_some() {
            return Err(self.internal(id, "a clustered ring that is not persistent"));
        }
        let bounds = self.loop_bounds(id)?;
        let consumer_label = self.split_roles(id)?;
        let c = self.cursor(&ring.producer);
        self.write_producer(id, &ring, &c, bounds)?;
        self.ins("exit");
        self.label(&consumer_label);
        self.enter_consumers(id)?;
        let c = self.cursor(&ring.consumer);
        self.write_consumers(id, &ring, c, bounds).map(drop)
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
    fn split_roles(&mut self, id: OpId) -> Result<String, CodegenError> {
        let roles = self
            .k
            .schedule
            .roles
            .ok_or_else(|| self.internal(id, "a stage ring without warp roles"))?;
        let consumers = 32 * roles.consumer_warps;
        let (is_consumer, consumer_label) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!(
            "setp.lt.u32 {is_consumer}, {}, {consumers}",
            self.tid
        ));
        self.ins(format!("@{is_consumer} bra {consumer_label}"));
        // Producer warpgroup: give registers back; one thread issues every stage's TMA.
        self.ins(format!(
            "setmaxnreg.dec.sync.aligned.u32 {}",
            roles.producer_regs
        ));
        let idle = self.new_reg(Class::Pred);
        self.ins(format!("setp.ne.u32 {idle}, {}, {consumers}", self.tid));
        self.ins(format!("@{idle} exit"));
        Ok(consumer_label)
    }

    /// The producer's side of the ring: its once program, then its loop over the iterations;
    /// a persistent ring issues the first iteration before the once program (its stage is
    /// free before the consumers release the previous tile's once tiles).
    pub(crate) fn write_producer(
        &mut self,
        id: OpId,
        ring: &Ring,
        c: &Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        if ring.persistent {
            let (none, skip) = (self.new_reg(Class::Pred), self.new_label());
            self.ins(format!("setp.ge.s32 {none}, {iv}, {hi}"));
            self.ins(format!("@{none} bra {skip}"));
            self.producer_iteration(id, ring, c, iv)?;
            self.ins(format!("add.s32 {iv}, {iv}, {step}"));
            self.label(&skip);
        }
        for s in ring.producer_once.clone() {
            self.producer_step(ring, c, s, iv, id)?;
        }
        let counted = self.open_counted_loop(iv, hi, step);
        self.producer_iteration(id, ring, c, iv)?;
        self.close_counted_loop(&counted);
        Ok(())
    }

    /// One iteration of the producer's program, then the cursor moves on.
    pub(crate) fn producer_iteration(
        &mut self,
        id: OpId,
        ring: &Ring,
        c: &Cursor,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        for s in ring.producer.clone() {
            self.producer_step(ring, c, s, iv, id)?;
        }
        self.advance(c, ring.stages);
        Ok(())
    }

    /// Where the consumers start: they take the registers and learn their warpgroup.
    fn enter_consumers(&mut self, id: OpId) -> Result<(), CodegenError> {
        let roles = self
            .k
            .schedule
            .roles
            .ok_or_else(|| self.internal(id, "a stage ring without warp roles"))?;
        self.ins(format!(
            "setmaxnreg.inc.sync.aligned.u32 {}",
            roles.consumer_regs
        ));
        // The warpgroup index through a lane-0 shuffle: ptxas then knows it is uniform and
        // keeps what derives from it (wgmma descriptors, barrier ids) in uniform registers.
        let (raw, wg) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("shr.u32 {raw}, {}, 7", self.tid));
        self.ins(format!("shfl.sync.idx.b32 {wg}, {raw}, 0, 31, -1"));
        self.warpgroup = Some(wg);
        // The ping-pong's turn barriers, for the CTA's hand-overs and every tile's loop.
        let turns = self
            .k
            .schedule
            .rings
            .get(&id)
            .and_then(|r| r.overlap.as_ref()?.turns);
        self.turns = turns.map(|t| self.turn_regs(t, id)).transpose()?;
        Ok(())
    }

    /// The consumers' side of the ring with cursor `c`, rotated or not, with the release of
    /// the once tiles; hands the cursor back.
    fn write_consumers(
        &mut self,
        id: OpId,
        ring: &Ring,
        c: Cursor,
        bounds: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        if ring.overlap.is_some() {
            // The rotated loop releases the once tiles itself, after its last head mma.
            return self.write_rotated_loop(id, ring, c, bounds);
        }
        let c = self.write_consumer_loop(id, ring, c, bounds)?;
        self.write_release(id, ring, &c)?;
        Ok(c)
    }

    /// The consumers' release of the once tiles ([`Ring::consumer_release`]).
    pub(crate) fn write_release(
        &mut self,
        id: OpId,
        ring: &Ring,
        c: &Cursor,
    ) -> Result<(), CodegenError> {
        let lane0 = self.lane0();
        for s in ring.consumer_release.clone() {
            self.consumer_step(ring, c, s, lane0, id)?;
        }
        Ok(())
    }

    /// One step of the producer's programs (`iv`: the iteration's induction variable).
    pub(crate) fn producer_step(
        &mut self,
        ring: &Ring,
        c: &Cursor,
        s: Step,
        iv: Reg,
        id: OpId,
    ) -> Result<(), CodegenError> {
        match s {
            Step::Wait { bar, start } => self.wait(ring, c, bar, start)?,
            Step::ArriveExpectTx { bar, bytes } => {
                let a = self.bar_addr(ring, bar, c.stage);
                // The 2-SM form: the leader announces the pair's bytes on its own `full`.
                let guard = match ring.cluster.as_ref().and_then(|c| c.pair) {
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
            Step::Tma { load } => self.issue_tma(ring, load, c, iv, id)?,
            Step::TmaOnce { load } => self.issue_tma_once(ring, load, c, id)?,
            Step::Arrive { bar, lag } => self.release(ring, c, bar, lag, None, false),
            Step::FenceProxyAsync => self.ins("fence.proxy.async.shared::cta"),
            Step::ArrivePeer { .. }
            | Step::GenericWrite { .. }
            | Step::Mma
            | Step::Commit
            | Step::WaitGroup(_)
            | Step::IssueHead
            | Step::IssueTail
            | Step::Between
            | Step::Handoff
            | Step::TurnWait { .. }
            | Step::TurnPass { .. }
            | Step::Tcgen05Mma
            | Step::Tcgen05Commit { .. } => {
                return Err(self.internal(id, format!("producer step `{s}`")));
            }
        }
        Ok(())
    }

    /// The consumers' loop: the consumer program around the body, then the drain; hands the
    /// cursor back.
    fn write_consumer_loop(
        &mut self,
        id: OpId,
        ring: &Ring,
        c: Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        let op = self.k.ops[id].clone();
        let body = op.regions[0].clone();
        let (iv, carried) = self.enter_loop(id, &op, &body, lo)?;
        let lane0 = self.lane0();
        for s in ring.consumer_once.clone() {
            self.consumer_step(ring, &c, s, lane0, id)?;
        }
        let counted = self.open_counted_loop(iv, hi, step);
        for s in ring.consumer.clone() {
            match s {
                Step::Wait { bar, start } => self.wait(ring, &c, bar, start)?,
                Step::Mma => {
                    for l in &ring.loads {
                        let base = self.new_reg(Class::B32);
                        self.ins(format!(
                            "mad.lo.u32 {base}, {}, {}, {}",
                            c.stage, l.stage_stride, self.smem
                        ));
                        self.ins(format!("add.u32 {base}, {base}, {}", l.offset));
                        self.stage_bases.insert(l.load, base);
                    }
                    self.ring = Some(ring.clone());
                    self.write_block(&body)?;
                    self.ring = None;
                    let yields = self.yielded(&body);
                    self.assign_all(&carried, &yields, id)?;
                }
                other => self.consumer_step(ring, &c, other, lane0, id)?,
            }
        }
        self.advance(&c, ring.stages);
        self.close_counted_loop(&counted);
        for s in ring.consumer_drain.clone() {
            self.consumer_step(ring, &c, s, lane0, id)?;
        }
        for l in &ring.loads {
            self.stage_bases.remove(&l.load);
        }
        for (r, v) in op.results.iter().zip(carried) {
            self.vals.insert(*r, v);
        }
        Ok(c)
    }

    /// A predicate true on lane 0 of each warp (the lane that arrives for its warp).
    pub(crate) fn lane0(&mut self) -> Reg {
        let (lane0, lane) = (self.new_reg(Class::Pred), self.new_reg(Class::B32));
        self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
        self.ins(format!("setp.eq.u32 {lane0}, {lane}, 0"));
        lane0
    }

    pub(crate) fn consumer_step(
        &mut self,
        ring: &Ring,
        c: &Cursor,
        s: Step,
        lane0: Reg,
        id: OpId,
    ) -> Result<(), CodegenError> {
        match s {
            Step::Commit => self.ins("wgmma.commit_group.sync.aligned"),
            Step::WaitGroup(n) => self.ins(format!("wgmma.wait_group.sync.aligned {n}")),
            Step::Arrive { bar, lag } => self.release(ring, c, bar, lag, Some(lane0), false),
            Step::ArrivePeer { bar, lag } => self.release(ring, c, bar, lag, Some(lane0), true),
            Step::FenceProxyAsync => self.ins("fence.proxy.async.shared::cta"),
            Step::Wait { bar, start } => self.wait(ring, c, bar, start)?,
            Step::ArriveExpectTx { .. }
            | Step::Tma { .. }
            | Step::TmaOnce { .. }
            | Step::GenericWrite { .. }
            | Step::Mma
            | Step::IssueHead
            | Step::IssueTail
            | Step::Between
            | Step::Handoff
            | Step::TurnWait { .. }
            | Step::TurnPass { .. }
            | Step::Tcgen05Mma
            | Step::Tcgen05Commit { .. } => {
                return Err(self.internal(id, format!("consumer step `{s}` outside the body")));
            }
        }
        Ok(())
    }

    /// One arrival on `bar` of the stage used `lag` iterations ago (lag 0 or 1), by the
    /// thread(s) `elected` selects, skipped while fewer than `lag` iterations ran; `peer`:
    /// on the same barrier of the other CTA of the cluster, released at cluster scope.
    pub(crate) fn release(
        &mut self,
        ring: &Ring,
        c: &Cursor,
        bar: Bar,
        lag: u32,
        elected: Option<Reg>,
        peer: bool,
    ) {
        let stage = if lag == 0 { c.stage } else { c.prev };
        let a = self.bar_addr(ring, bar, stage);
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
        ring: &Ring,
        load: usize,
        c: &Cursor,
        iv: Reg,
        id: OpId,
    ) -> Result<(), CodegenError> {
        let l = ring
            .loads
            .get(load)
            .cloned()
            .ok_or_else(|| self.internal(id, "a TMA step without its load"))?;
        let body_iv = self.k.ops[id].regions[0].args[0];
        let mut memo = std::collections::BTreeMap::new();
        let coords = self.k.ops[l.load]
            .operands
            .clone()
            .into_iter()
            .map(|v| self.remat(v, body_iv, iv, &mut memo, l.load))
            .collect::<Result<Vec<_>, _>>()?;
        let full = self.bar_addr(ring, ring.full_of(load), c.stage);
        let stage = self.new_reg(Class::B32);
        self.ins(format!(
            "mad.lo.u32 {stage}, {}, {}, {}",
            c.stage, l.stage_stride, self.smem
        ));
        match &ring.cluster {
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
                if cl.shared == load {
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
                self.boxes(&l, &coords, stage, leader_full, &[], ".cta_group::2")
            }
            Some(cl) if cl.shared == load => {
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
                self.boxes(&l, &coords, stage, full, &cast, "")
            }
            _ => self.tma_boxes(&l, &coords, stage, full),
        }
    }

    /// The TMA boxes of once load `load` (its coordinates are computed before the loop).
    fn issue_tma_once(
        &mut self,
        ring: &Ring,
        load: usize,
        c: &Cursor,
        id: OpId,
    ) -> Result<(), CodegenError> {
        let l = ring
            .once
            .get(load)
            .cloned()
            .ok_or_else(|| self.internal(id, "a TMA step without its once load"))?;
        let coords = self.k.ops[l.load]
            .operands
            .clone()
            .into_iter()
            .map(|v| self.scalar(v, l.load))
            .collect::<Result<Vec<_>, _>>()?;
        let once = self.bar_addr(ring, Bar::Once, c.stage);
        self.tma_boxes(&l, &coords, self.smem, once)
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
