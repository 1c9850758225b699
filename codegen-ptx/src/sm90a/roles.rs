//! The sm_90a walk over the roles' programs: the role split, the producer's sections, the
//! consumers' sections around the loop body (an unrotated loop here, a rotated one in
//! [`super::rotated`]) and the code after the loop, per work tile of a persistent kernel.

use kiln_ir::OpId;
use kiln_ir::sched::{BarrierId, Index, MmaPart, Op, Region, Role, RoleKind, Who};
use kiln_ir::tmem::epilogue::holds_columns;

use super::wgmma::RingBody;
use super::{Sm90a, TurnRegs};
use crate::emit::Val;
use crate::error::CodegenError;
use crate::sched::{self, Cursor};
use crate::types::{Class, Reg};

impl Sm90a<'_, '_> {
    /// The roles: the split, the producer's walk, the consumers' (see the module doc). A
    /// kernel that is not persistent runs the ops before the ring loop once, in every
    /// thread, before the roles split.
    pub(super) fn roles(&mut self) -> Result<(), CodegenError> {
        let (before, after) = self.v.parts(self.e)?;
        let consumer = self.v.role(self.e, RoleKind::Consumer)?;
        let producer = self.v.role(self.e, RoleKind::Producer)?;
        let persistent = self.v.s.persistent();
        if !persistent {
            if self.v.s.cluster.is_some() {
                return Err(self
                    .e
                    .internal(self.v.for_op(), "a clustered ring that is not persistent"));
            }
            for &op in &before {
                self.e.write_op(op, &mut self.ops)?;
            }
            self.e.op_comment(self.v.for_op());
        }
        let consumer_label = self.split(consumer, producer)?;
        let mut c = self.v.cursor(self.e, &producer.program.iteration);
        let walk = self
            .v
            .open_tile(self.e, &mut self.ops, &mut c, &before, true)?;
        let b = self.v.loop_bounds(self.e)?;
        self.v.producer(self.e, &mut self.ops, producer, &c, b)?;
        self.v.close_tile(self.e, &mut self.ops, walk.as_ref(), &c);
        self.e.ins("exit");

        self.e.label(&consumer_label);
        self.enter_consumers(consumer)?;
        // The turns go round across the tiles: handed over once before the first, taken
        // back once after the last (a CTA of one tile: around its rotated loop).
        if persistent {
            self.turn_ops(&consumer.program.start)?;
        }
        let mut c = self.v.cursor(self.e, &consumer.program.iteration);
        let walk = self
            .v
            .open_tile(self.e, &mut self.ops, &mut c, &before, false)?;
        let b = self.v.loop_bounds(self.e)?;
        let c = if consumer.program.rotated {
            // The rotated loop releases the once tiles itself, after its last head mma.
            self.rotated_loop(consumer, c, b)?
        } else {
            let c = self.consumer_loop(consumer, c, b)?;
            self.release(consumer, &c)?;
            c
        };
        for &op in &consumer.program.end {
            match op {
                Op::Run(Region::Epilogue(None)) => self.after_ring(&after)?,
                other => return Err(self.v.misplaced(self.e, other, "after the consumers' loop")),
            }
        }
        self.v.close_tile(self.e, &mut self.ops, walk.as_ref(), &c);
        for &op in &consumer.program.exit {
            match op {
                Op::Sync { .. } | Op::Signal { .. } if persistent => self.turn_ops(&[op])?,
                Op::Sync { .. } | Op::Signal { .. } => {}
                Op::BulkWaitAll | Op::ClusterSync => self.ops.exit(self.e, op)?,
                other => return Err(self.v.misplaced(self.e, other, "at the consumers' exit")),
            }
        }
        Ok(())
    }

    /// Branches the consumer warps to the returned label; the producer warpgroup falls
    /// through, gives registers back, and all its threads but the elected one exit.
    fn split(&mut self, consumer: &Role, producer: &Role) -> Result<String, CodegenError> {
        let e = &mut *self.e;
        let consumer_label = e.branch_if("lt.u32", e.tid, 32 * consumer.end_warp());
        // Producer warpgroup: give registers back; one thread issues every stage's TMA.
        sched::set_registers(e, producer, "dec");
        sched::elect(e, producer);
        Ok(consumer_label)
    }

    /// Where the consumers start: they take the registers and learn their warpgroup.
    fn enter_consumers(&mut self, consumer: &Role) -> Result<(), CodegenError> {
        let e = &mut *self.e;
        sched::set_registers(e, consumer, "inc");
        // The warpgroup index through a lane-0 shuffle: ptxas then knows it is uniform and
        // keeps what derives from it (wgmma descriptors, barrier ids) in uniform registers.
        let (raw, wg) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
        e.ins(format!("shr.u32 {raw}, {}, 7", e.tid));
        e.ins(format!("shfl.sync.idx.b32 {wg}, {raw}, 0, 31, -1"));
        self.ops.warpgroup = Some(wg);
        // The named barriers the warpgroups take turns at, for the CTA's hand-overs and
        // every tile's loop.
        let turns = consumer.program.ops().find_map(|op| match op {
            Op::Sync { bar, .. } | Op::Signal { bar, .. } => Some(bar),
            _ => None,
        });
        self.turns = match turns {
            Some(bar) => Some(self.turn_regs(bar, wg)?),
            None => None,
        };
        Ok(())
    }

    /// The consumers' unrotated loop: their programs around the body, then the drain; hands
    /// the cursor back.
    fn consumer_loop(
        &mut self,
        consumer: &Role,
        c: Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        let id = self.v.for_op();
        let op = &self.v.k.ops[id];
        let body = &op.regions[0];
        let (iv, carried) = self.e.enter_loop(id, op, body, lo)?;
        let lane0 = sched::lane0(self.e);
        for &o in &consumer.program.tile {
            self.consumer_op(&c, o, lane0)?;
        }
        let counted = self.e.open_counted_loop(iv, hi, step);
        // A body that commits its groups where it issues them and drains them at its end
        // leaves the program's commit and wait nothing: an empty group costs ptxas a dummy
        // wgmma.
        let mut drained = false;
        for &o in &consumer.program.iteration {
            match o {
                Op::Wgmma(MmaPart::Body) => {
                    self.bind_stages(c.stage);
                    let ring = RingBody::new(self.v.k, self.v.s, true);
                    drained = ring.commits_inline();
                    self.ops.mma = Some(ring);
                    self.e.write_block(body, &mut self.ops)?;
                    self.e.wgmma_drain();
                    self.ops.mma = None;
                    let yields = self.e.yielded(body);
                    self.e.assign_all(&carried, &yields, id)?;
                }
                Op::WgmmaCommit | Op::WgmmaWait(_) if drained => {}
                other => self.consumer_op(&c, other, lane0)?,
            }
        }
        self.v.advance(self.e, &c);
        self.e.close_counted_loop(&counted);
        for &o in &consumer.program.drain {
            self.consumer_op(&c, o, lane0)?;
        }
        self.unbind_stages();
        for (r, v) in op.results.iter().zip(carried) {
            self.e.vals.insert(*r, v);
        }
        Ok(c)
    }

    /// The consumers' release of the once tiles ([`kiln_ir::sched::Program::release`]).
    pub(super) fn release(&mut self, consumer: &Role, c: &Cursor) -> Result<(), CodegenError> {
        let lane0 = sched::lane0(self.e);
        for &op in &consumer.program.release {
            self.consumer_op(c, op, lane0)?;
        }
        Ok(())
    }

    /// One op of the consumers' program outside the body.
    pub(super) fn consumer_op(
        &mut self,
        c: &Cursor,
        op: Op,
        lane0: Reg,
    ) -> Result<(), CodegenError> {
        match op {
            Op::WgmmaCommit => self.e.ins("wgmma.commit_group.sync.aligned"),
            Op::WgmmaWait(n) => self.e.ins(format!("wgmma.wait_group.sync.aligned {n}")),
            Op::Arrive { bar, lag } => self.v.release(self.e, c, bar, lag, Some(lane0), false)?,
            Op::ArrivePeer { bar, lag } => {
                self.v.release(self.e, c, bar, lag, Some(lane0), true)?
            }
            Op::FenceProxyAsync => self.e.ins("fence.proxy.async.shared::cta"),
            Op::Wait { .. } => self.v.wait(self.e, c, op, None, false)?,
            Op::Sync { .. } | Op::Signal { .. } => self.named_op(op)?,
            other => return Err(self.v.misplaced(self.e, other, "in the consumers' program")),
        }
        Ok(())
    }

    /// Points every ring load at stage `stage`.
    pub(super) fn bind_stages(&mut self, stage: Reg) {
        for (_, l) in self.v.s.ring_loads() {
            let base = sched::stage_address(self.e, stage, l.tma.stage_stride, l.tma.offset);
            self.e.stage_bases.insert(l.tma.load, base);
        }
    }

    /// Forgets the ring loads' stages after the loop.
    pub(super) fn unbind_stages(&mut self) {
        for (_, l) in self.v.s.ring_loads() {
            self.e.stage_bases.remove(&l.tma.load);
        }
    }

    /// Writes the consumers' ops once per CTA around their tiles: turn hand-overs.
    pub(super) fn turn_ops(&mut self, ops: &[Op]) -> Result<(), CodegenError> {
        for &o in ops {
            self.named_op(o)?;
        }
        Ok(())
    }

    /// The registers of named barrier array `bar` for consumer warpgroup (replica) `wg`.
    fn turn_regs(&mut self, bar: BarrierId, wg: Reg) -> Result<TurnRegs, CodegenError> {
        let (first, ids, threads) = self.v.named_barrier(self.e, bar)?;
        let e = &mut *self.e;
        let [own, next] = e.new_regs(Class::B32);
        e.ins(format!("add.u32 {own}, {wg}, {first}"));
        e.ins(format!("add.u32 {next}, {wg}, 1"));
        e.ins(format!("rem.u32 {next}, {next}, {ids}"));
        e.ins(format!("add.u32 {next}, {next}, {first}"));
        let leader = e.setp("eq.u32", wg, 0);
        // Of two warpgroups the last is the one that is not the leader.
        let not_last = if ids == 2 {
            leader
        } else {
            e.setp("ne.u32", wg, ids - 1)
        };
        Ok(TurnRegs {
            bar,
            own,
            next,
            leader,
            not_last,
            threads,
        })
    }

    /// `bar.sync` ([`Op::Sync`]) or `bar.arrive` ([`Op::Signal`]) on element `index` of named
    /// barrier array `bar`, by the warpgroups `who` names.
    fn named_op(&mut self, op: Op) -> Result<(), CodegenError> {
        let (Op::Sync { bar, index, who } | Op::Signal { bar, index, who }) = op else {
            return Err(self.v.misplaced(self.e, op, "is not a turn op"));
        };
        let e = &mut *self.e;
        let t = self
            .turns
            .filter(|t| t.bar == bar)
            .ok_or_else(|| e.internal(self.v.for_op(), "a turn op without turn barriers"))?;
        let id = match index {
            Index::Own => t.own,
            Index::Next => t.next,
        };
        let skip = match who {
            Who::All => None,
            Who::Leader => Some(format!("@!{}", t.leader)),
            Who::Last => Some(format!("@{}", t.not_last)),
        };
        let end = e.new_label();
        if let Some(guard) = &skip {
            e.ins(format!("{guard} bra {end}"));
        }
        let ins = if matches!(op, Op::Sync { .. }) {
            "bar.sync"
        } else {
            "bar.arrive"
        };
        e.ins(format!("{ins} {id}, {}", t.threads));
        if skip.is_some() {
            e.label(&end);
        }
        Ok(())
    }

    /// The consumers' code after the ring loop (`after`, the epilogue): whole, or when the
    /// schedule says so ([`kiln_ir::sched::Sched::epilogue_columns`]) on each chunk of that
    /// many accumulator columns in turn. For a chunk the loop's accumulator is its registers
    /// in the chunk's columns, and every tile whose layout holds the accumulator's columns
    /// has only the chunk's registers ([`crate::emit::Lower::columns`]), so each
    /// chunk's bias row, temporaries and staged store take only its columns. Ops that
    /// compute only scalars are written with the first chunk; the later ones reuse their
    /// registers.
    fn after_ring(&mut self, after: &[OpId]) -> Result<(), CodegenError> {
        let (k, id) = (self.v.k, self.v.for_op());
        let Some(columns) = self.v.s.epilogue_columns else {
            return self.ops.write_after(self.e, k, after, None, true);
        };
        let acc = k.ops[id]
            .results
            .iter()
            .copied()
            .find(|v| k.schedule.layouts.get(v).is_some_and(holds_columns))
            .ok_or_else(|| {
                self.e
                    .internal(id, "a chunked epilogue without an mma accumulator")
            })?;
        let whole = self.e.tile(acc, id)?;
        let d = k
            .distribution(acc)
            .map_err(|err| self.e.internal(id, err))?;
        let n = d
            .regs
            .iter()
            .filter_map(|o| o.last())
            .max()
            .map_or(0, |c| c + 1);
        for (i, start) in (0..n).step_by(columns.max(1) as usize).enumerate() {
            let chunk = start..(start + columns).min(n);
            self.e.comment(&format!(
                "the code after the loop on accumulator columns {}..{}",
                chunk.start, chunk.end
            ));
            let regs: Vec<Reg> = d
                .regs
                .iter()
                .zip(&whole)
                .filter(|(o, _)| o.last().is_some_and(|c| chunk.contains(c)))
                .map(|(_, &r)| r)
                .collect();
            self.e.vals.insert(acc, Val::Tile(regs));
            self.ops
                .write_after(self.e, k, after, Some(chunk), i == 0)?;
        }
        self.e.vals.insert(acc, Val::Tile(whole));
        Ok(())
    }
}
