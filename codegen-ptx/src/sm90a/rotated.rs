//! sm_90a: the consumers' side of a ring loop the `overlap` pass rotated
//! ([`kiln_ir::sched::Program::rotated`]): a prologue, a steady loop and an epilogue, each
//! writing the ops of the consumers' iteration program that run in it.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::sched::overlap::{Deferral, Overlap};
use kiln_ir::sched::{MmaPart, Op, Region, Role};
use kiln_ir::{Block, DType, Kernel, OpId, ValueDef, ValueId};

use super::Sm90a;
use super::wgmma::RingBody;
use crate::emit::Val;
use crate::error::CodegenError;
use crate::sched::{self, Cursor};
use crate::types::{Class, Reg};

/// Where in the rotated loop an op is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Prologue,
    Steady,
    Epilogue,
}

impl Section {
    /// Whether `op` runs here: the section as an iteration of a two-trip loop.
    fn runs(self, op: Op) -> bool {
        let t = match self {
            Section::Prologue => 0,
            Section::Steady => 1,
            Section::Epilogue => 2,
        };
        op.runs_rotated(t, 2)
    }
}

/// The ops each part of the body writes, in block order: its own ops and the other body ops
/// they read.
struct Parts {
    head: Vec<OpId>,
    between: Vec<OpId>,
    tail: Vec<OpId>,
    /// Values of the code between that the tail reads.
    handed: Vec<ValueId>,
}

/// The state of one rotated loop being written.
struct Rotation<'s> {
    consumer: &'s Role,
    overlap: Overlap,
    body: Block,
    parts: Parts,
    cursor: Cursor,
    lane0: Reg,
    /// Induction variables of the head's and the tail's iteration, and the step.
    head_iv: Reg,
    tail_iv: Reg,
    step: Reg,
    carried: Vec<Val>,
    /// Registers handing each value of [`Parts::handed`] to the next tail.
    handoff: BTreeMap<ValueId, Val>,
}

impl Sm90a<'_, '_> {
    /// Writes the consumers' rotated loop with cursor `cursor`; hands the cursor back.
    ///
    /// The loop is written as a prologue (iteration `t = 0`: block 0's head mma and code
    /// between), a steady loop (`t` in `1..trips`: block `t`'s head mma, block `t - 1`'s tail
    /// mma, block `t`'s code between under the tail) and an epilogue (`t = trips`: the last
    /// block's tail). Each section writes the ops of the consumers' iteration program that run
    /// in it ([`Op::runs_rotated`]), so the PTX is the program the `protocol_check` pass
    /// proved.
    ///
    /// The body's other ops (constants, index arithmetic on the induction variable, the stage
    /// loads) are written again in each part that reads them, bound to that part's iteration
    /// and stage. A warp skips the tail's rescale of the accumulator when all its factors
    /// are 1. The values of the code between that the tail reads (`P`, packed two elements
    /// per register, and the rescale factors) are handed to the next section's tail in
    /// registers of their own, after the tail that read the previous ones has completed.
    pub(super) fn rotated_loop(
        &mut self,
        consumer: &Role,
        cursor: Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        let (k, s) = (self.v.k, self.v.s);
        let id = s.for_op;
        let op = &k.ops[id];
        let body = op.regions[0].clone();
        let overlap = s.overlap.clone().ok_or_else(|| {
            self.e
                .internal(id, "a rotated loop without its overlap schedule")
        })?;
        let parts = parts(k, &body, &overlap);
        let (head_iv, carried) = self.e.enter_loop(id, op, &body, lo)?;
        let lane0 = sched::lane0(self.e);
        if overlap.turns.is_some() && self.turns.is_none() {
            return Err(self
                .e
                .internal(id, "turn barriers the consumers did not set up"));
        }
        let tail_iv = self.e.new_reg(Class::B32);
        let mut r = Rotation {
            consumer,
            overlap,
            body,
            parts,
            cursor,
            lane0,
            head_iv,
            tail_iv,
            step,
            carried,
            handoff: BTreeMap::new(),
        };
        self.ops.mma = Some(RingBody::new(k, s, false));
        // A CTA that walks no tiles runs its start and exit ops around the one loop.
        if !s.persistent() {
            self.turn_ops(&consumer.program.start)?;
        }
        for &o in &consumer.program.tile {
            self.rotated_op(&mut r, o)?;
        }
        let skip = self.e.branch_if("ge.s32", head_iv, hi);
        self.e
            .comment("rotated loop: prologue (block 0's head and code between)");
        self.rotated_section(&mut r, Section::Prologue)?;
        self.v.advance(self.e, &r.cursor);
        self.e.ins(format!("add.s32 {head_iv}, {head_iv}, {step}"));
        let counted = self.e.open_counted_loop(head_iv, hi, step);
        self.e
            .comment("rotated loop: steady state (block t's head, block t-1's tail)");
        self.rotated_section(&mut r, Section::Steady)?;
        self.v.advance(self.e, &r.cursor);
        self.e.close_counted_loop(&counted);
        // The last head mma is done: the once tiles are free for the next work tile.
        self.release(consumer, &r.cursor)?;
        self.e
            .comment("rotated loop: epilogue (the last block's tail)");
        self.rotated_section(&mut r, Section::Epilogue)?;
        let done = self.e.new_label();
        self.e.ins(format!("bra.uni {done}"));
        self.e.label(&skip);
        self.release(consumer, &r.cursor)?;
        self.e.label(&done);
        for &o in &consumer.program.drain {
            self.rotated_op(&mut r, o)?;
        }
        if !s.persistent() {
            let turns: Vec<Op> = consumer
                .program
                .exit
                .iter()
                .copied()
                .filter(|o| matches!(o, Op::Sync { .. } | Op::Signal { .. }))
                .collect();
            self.turn_ops(&turns)?;
        }
        self.ops.mma = None;
        self.unbind_stages();
        for (res, v) in op.results.iter().zip(r.carried) {
            self.e.vals.insert(*res, v);
        }
        Ok(r.cursor)
    }

    /// One section: the ops of the consumers' iteration program that run in it, then (after
    /// the tail) the carried accumulator.
    fn rotated_section(&mut self, r: &mut Rotation, section: Section) -> Result<(), CodegenError> {
        // Whether this section has written a wgmma instruction yet.
        let mut wgmma_written = false;
        for &o in &r.consumer.program.iteration {
            if !section.runs(o) {
                continue;
            }
            match o {
                Op::Wgmma(MmaPart::Head | MmaPart::Tail) => wgmma_written = true,
                Op::WgmmaCommit => {
                    // The epilogue opens with the absent head's commit, an empty group that
                    // keeps the wait_group counts of every section the same. The CUDA 13.0
                    // JIT fences that commit itself (advisory C7519: the registers were
                    // written since the last wait); the fence is written here instead.
                    if !wgmma_written {
                        self.e.ins("wgmma.fence.sync.aligned");
                    }
                    wgmma_written = true;
                }
                _ => {}
            }
            self.rotated_op(r, o)?;
        }
        if section != Section::Prologue {
            let i = r.overlap.carried;
            let y = self.e.yielded(&r.body)[i];
            self.e
                .assign_all(&r.carried[i..=i], &[y], self.v.for_op())?;
        }
        Ok(())
    }

    fn rotated_op(&mut self, r: &mut Rotation, o: Op) -> Result<(), CodegenError> {
        let iv = r.body.args[0];
        match o {
            Op::Wgmma(MmaPart::Head) => {
                self.bind_stages(r.cursor.stage);
                self.e.vals.insert(iv, Val::Scalar(r.head_iv));
                for o in r.parts.head.clone() {
                    self.e.write_op(o, &mut self.ops)?;
                }
            }
            Op::Wgmma(MmaPart::Tail) => {
                self.e
                    .ins(format!("sub.s32 {}, {}, {}", r.tail_iv, r.head_iv, r.step));
                self.bind_stages(r.cursor.prev);
                self.e.vals.insert(iv, Val::Scalar(r.tail_iv));
                for (v, h) in &r.handoff {
                    self.e.vals.insert(*v, h.clone());
                }
                for o in r.parts.tail.clone() {
                    match r.overlap.rescale {
                        Some((op, factor)) if op == o => self.write_rescale(op, factor)?,
                        _ => self.e.write_op(o, &mut self.ops)?,
                    }
                }
            }
            Op::Run(Region::Between) => {
                self.e.vals.insert(iv, Val::Scalar(r.head_iv));
                for o in r.parts.between.clone() {
                    self.e.write_op(o, &mut self.ops)?;
                    if let Some(d) = r.overlap.defer
                        && d.max == o
                    {
                        self.write_deferral(d)?;
                    }
                }
            }
            Op::Run(Region::Handoff) => self.hand_off(r)?,
            Op::Sync { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::WgmmaCommit
            | Op::WgmmaWait(_)
            | Op::Arrive { .. }
            | Op::ArrivePeer { .. }
            | Op::FenceProxyAsync => self.consumer_op(&r.cursor, o, r.lane0)?,
            other => {
                return Err(self
                    .v
                    .misplaced(self.e, other, "in a rotated consumer program"));
            }
        }
        Ok(())
    }

    /// The deferred running maximum ([`Deferral`]): a warp keeps its reference, the carried
    /// maximum, while every one of its rows' new maximum exceeds it by at most the threshold
    /// (a `-inf` reference never stays: `x - -inf` is not below it); what the body computes
    /// from the new maximum, the carried one included, then reads the reference.
    fn write_deferral(&mut self, d: Deferral) -> Result<(), CodegenError> {
        let m_new = self.v.k.ops[d.max].results[0];
        let layouts = &self.v.k.schedule.layouts;
        if layouts.get(&m_new) != layouts.get(&d.carried) {
            return Err(self
                .e
                .internal(d.max, "a deferred maximum laid out unlike its carried one"));
        }
        let new = self.e.tile(m_new, d.max)?;
        let old = self.e.tile(d.carried, d.max)?;
        let threshold = format!("0f{:08X}", Deferral::THRESHOLD.to_bits());
        let (near, keep) = (self.e.new_reg(Class::Pred), self.e.new_reg(Class::Pred));
        for (k, (n, o)) in new.iter().zip(&old).enumerate() {
            let growth = self.e.new_reg(Class::F32);
            self.e.ins(format!("sub.f32 {growth}, {n}, {o}"));
            if k == 0 {
                self.e
                    .ins(format!("setp.le.f32 {near}, {growth}, {threshold}"));
            } else {
                self.e.ins(format!(
                    "setp.le.and.f32 {near}, {growth}, {threshold}, {near}"
                ));
            }
        }
        self.e
            .ins(format!("vote.sync.all.pred {keep}, {near}, 0xffffffff"));
        let chosen: Vec<Reg> = new
            .iter()
            .zip(&old)
            .map(|(n, o)| {
                let r = self.e.new_reg(Class::F32);
                self.e.ins(format!("selp.f32 {r}, {o}, {n}, {keep}"));
                r
            })
            .collect();
        self.e.vals.insert(m_new, Val::Tile(chosen));
        Ok(())
    }

    /// The tail's rescale `acc * factor`, skipped by a warp whose factors are all 1.
    fn write_rescale(&mut self, op: OpId, factor: ValueId) -> Result<(), CodegenError> {
        let acc_v = self.v.k.ops[op]
            .operands
            .iter()
            .copied()
            .find(|&v| v != factor)
            .ok_or_else(|| self.e.internal(op, "a rescale without its accumulator"))?;
        let acc = self.e.tile(acc_v, op)?;
        let factors = self.e.tile(factor, op)?;
        let all = self.e.setp("eq.f32", factors[0], "0f3F800000");
        for f in &factors[1..] {
            self.e
                .ins(format!("setp.eq.and.f32 {all}, {f}, 0f3F800000, {all}"));
        }
        let one = self.e.new_reg(Class::Pred);
        self.e
            .ins(format!("vote.sync.all.pred {one}, {all}, 0xffffffff"));
        let (skip, end) = (self.e.new_label(), self.e.new_label());
        self.e.ins(format!("@{one} bra.uni {skip}"));
        let result = self.v.k.ops[op].results[0];
        let distinct = acc.iter().collect::<BTreeSet<_>>().len() == acc.len();
        if self.e.dies_here(acc_v, op) && distinct && self.v.k.ty(acc_v).dtype() == DType::F32 {
            // In place: the accumulator keeps one set of registers through the loop, the
            // tail's wgmma accumulates into them and nothing is copied.
            let d = self.e.dist(result, op)?;
            for (a, offs) in acc.iter().zip(&d.regs) {
                let f = self.e.elem(factor, offs, op)?;
                self.e.ins(format!("mul.f32 {a}, {a}, {f}"));
            }
            self.e.label(&skip);
            self.e.vals.insert(result, Val::Tile(acc));
            return Ok(());
        }
        self.e.write_op(op, &mut self.ops)?;
        let out = self.e.tile(result, op)?;
        self.e.ins(format!("bra.uni {end}"));
        self.e.label(&skip);
        for (o, a) in out.iter().zip(&acc) {
            self.e.mov(*o, *a);
        }
        self.e.label(&end);
        Ok(())
    }

    /// Moves this iteration's handed values into the handoff registers (narrowed tiles packed
    /// two elements per register, as the tail's wgmma reads them) and its carried values but
    /// the accumulator into the carried registers.
    fn hand_off(&mut self, r: &mut Rotation) -> Result<(), CodegenError> {
        for v in r.parts.handed.clone() {
            let src = self.e.in_registers(v, self.v.for_op())?;
            let dst = match (r.handoff.get(&v), &src) {
                (Some(d), _) => d.clone(),
                (None, Val::Narrowed { src, .. }) => Val::Packed(
                    (0..src.len() / 2)
                        .map(|_| self.e.new_reg(Class::B32))
                        .collect(),
                ),
                (None, other) => self.e.fresh_like(other, self.v.for_op())?,
            };
            match (&dst, &src) {
                (Val::Packed(pairs), Val::Narrowed { src, to }) => {
                    let cvt = match to {
                        kiln_ir::DType::F16 => "cvt.rn.f16x2.f32",
                        _ => "cvt.rn.bf16x2.f32",
                    };
                    for (k, p) in pairs.iter().enumerate() {
                        // The first source lands in the upper half (docs/ptx.md §6).
                        self.e
                            .ins(format!("{cvt} {p}, {}, {}", src[2 * k + 1], src[2 * k]));
                    }
                }
                _ => self.e.assign(&dst, &src, self.v.for_op())?,
            }
            r.handoff.insert(v, dst);
        }
        let yields = self.e.yielded(&r.body);
        let keep = r.overlap.carried;
        let (dsts, values): (Vec<Val>, Vec<ValueId>) = r
            .carried
            .iter()
            .cloned()
            .zip(yields)
            .enumerate()
            .filter(|(i, _)| *i != keep)
            .map(|(_, p)| p)
            .unzip();
        self.e.assign_all(&dsts, &values, self.v.for_op())
    }
}

/// Every value `op` reads, its regions' ops included.
fn reads(k: &Kernel, op: OpId) -> Vec<ValueId> {
    let mut out = k.ops[op].operands.clone();
    for region in &k.ops[op].regions {
        for &o in &region.ops {
            out.extend(reads(k, o));
        }
    }
    out
}

/// The parts of `body` (see [`Parts`]).
fn parts(k: &Kernel, body: &Block, o: &Overlap) -> Parts {
    let own: BTreeSet<OpId> = o
        .between
        .iter()
        .chain(&o.tail_ops)
        .copied()
        .chain([o.head])
        .collect();
    let top: BTreeSet<OpId> = body.ops.iter().copied().collect();
    // The other body ops `ops` read, transitively, with `ops` themselves, in block order.
    let closure = |ops: &[OpId]| {
        let mut need: BTreeSet<OpId> = ops.iter().copied().collect();
        let mut work: Vec<OpId> = ops.to_vec();
        while let Some(x) = work.pop() {
            for v in reads(k, x) {
                if let ValueDef::Op(d, _) = k.values[v].def
                    && top.contains(&d)
                    && !own.contains(&d)
                    && need.insert(d)
                {
                    work.push(d);
                }
            }
        }
        body.ops
            .iter()
            .copied()
            .filter(|x| need.contains(x))
            .collect::<Vec<_>>()
    };
    let between: BTreeSet<ValueId> = o
        .between
        .iter()
        .flat_map(|&x| k.ops[x].results.iter().copied())
        .collect();
    let mut handed: Vec<ValueId> = Vec::new();
    for &x in &o.tail_ops {
        for v in reads(k, x) {
            if between.contains(&v) && !handed.contains(&v) {
                handed.push(v);
            }
        }
    }
    Parts {
        head: closure(&[o.head]),
        between: closure(&o.between),
        tail: closure(&o.tail_ops),
        handed,
    }
}
