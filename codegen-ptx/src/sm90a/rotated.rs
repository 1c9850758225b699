//! sm_90a: the consumers' side of a ring loop the `overlap` pass rotated
//! ([`kiln_ir::sched::Program::rotated`]).
//!
//! The loop is written as a prologue (iteration `t = 0`: block 0's head mma and code between),
//! a steady loop (`t` in `1..trips`: block `t`'s head mma, block `t - 1`'s tail mma, block
//! `t`'s code between under the tail) and an epilogue (`t = trips`: the last block's tail).
//! Each section writes the ops of the consumers' iteration program that run in it
//! ([`Op::runs_rotated`]), so the PTX is the program the `protocol_check` pass proved.
//!
//! The body's other ops (constants, index arithmetic on the induction variable, the stage
//! loads) are written again in each part that reads them, bound to that part's iteration and
//! stage. A warp skips the tail's rescale of the accumulator when all its factors are 1. The
//! values of the code between that the tail reads (`P`, packed two elements per
//! register, and the rescale factors) are handed to the next section's tail in registers of
//! their own, after the tail that read the previous ones has completed.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::sched::overlap::{Deferral, Overlap};
use kiln_ir::sched::{BarrierId, Index, MmaPart, Op, Region, Role, Sched, Who};
use kiln_ir::{Block, DType, Kernel, OpId, ValueDef, ValueId};

use super::{Cursor, RingBody, named, named_barrier};
use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

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

/// The registers of a named barrier array the consumer warpgroups take turns at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TurnRegs {
    /// The array.
    bar: BarrierId,
    /// This warpgroup's barrier id, and the next warpgroup's.
    own: Reg,
    next: Reg,
    /// Whether this is warpgroup 0.
    leader: Reg,
    /// Whether this is not the last warpgroup of the turn order.
    not_last: Reg,
    /// Threads meeting at each barrier of the array.
    threads: u32,
}

/// The state of one rotated loop being written.
struct Rotation<'s> {
    s: &'s Sched,
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

impl Writer<'_> {
    /// Writes the consumers' rotated loop (see the module doc) with cursor `cursor`; hands
    /// the cursor back.
    pub(super) fn write_rotated_loop(
        &mut self,
        s: &Sched,
        consumer: &Role,
        cursor: Cursor,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<Cursor, CodegenError> {
        let id = s.for_op;
        let op = self.k.ops[id].clone();
        let body = op.regions[0].clone();
        let overlap = s
            .overlap
            .clone()
            .ok_or_else(|| self.internal(id, "a rotated loop without its overlap schedule"))?;
        let parts = parts(self.k, &body, &overlap);
        let (head_iv, carried) = self.enter_loop(id, &op, &body, lo)?;
        let lane0 = self.lane0();
        if overlap.turns.is_some() && self.turns.is_none() {
            return Err(self.internal(id, "turn barriers the consumers did not set up"));
        }
        let tail_iv = self.new_reg(Class::B32);
        let mut r = Rotation {
            s,
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
        self.ring = Some(RingBody::new(self.k, s, false));
        // A CTA that walks no tiles runs its start and exit ops around the one loop.
        if !s.persistent() {
            self.cta_turn_ops(s, &consumer.program.start)?;
        }
        for &o in &consumer.program.tile {
            self.rotated_op(&mut r, o)?;
        }
        let (empty, skip) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!("setp.ge.s32 {empty}, {head_iv}, {hi}"));
        self.ins(format!("@{empty} bra {skip}"));
        self.comment("rotated loop: prologue (block 0's head and code between)");
        self.rotated_section(&mut r, Section::Prologue)?;
        self.advance(&r.cursor, s.stages);
        self.ins(format!("add.s32 {head_iv}, {head_iv}, {step}"));
        let counted = self.open_counted_loop(head_iv, hi, step);
        self.comment("rotated loop: steady state (block t's head, block t-1's tail)");
        self.rotated_section(&mut r, Section::Steady)?;
        self.advance(&r.cursor, s.stages);
        self.close_counted_loop(&counted);
        // The last head mma is done: the once tiles are free for the next work tile.
        self.write_release(s, consumer, &r.cursor)?;
        self.comment("rotated loop: epilogue (the last block's tail)");
        self.rotated_section(&mut r, Section::Epilogue)?;
        let done = self.new_label();
        self.ins(format!("bra.uni {done}"));
        self.label(&skip);
        self.write_release(s, consumer, &r.cursor)?;
        self.label(&done);
        for &o in &consumer.program.drain {
            self.rotated_op(&mut r, o)?;
        }
        if !s.persistent() {
            self.cta_turn_ops(s, &consumer.program.exit)?;
        }
        self.ring = None;
        self.unbind_stages(s);
        for (res, v) in op.results.iter().zip(r.carried) {
            self.vals.insert(*res, v);
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
                        self.ins("wgmma.fence.sync.aligned");
                    }
                    wgmma_written = true;
                }
                _ => {}
            }
            self.rotated_op(r, o)?;
        }
        if section != Section::Prologue {
            let i = r.overlap.carried;
            let y = self.yielded(&r.body)[i];
            self.assign_all(&r.carried[i..=i], &[y], r.s.for_op)?;
        }
        Ok(())
    }

    fn rotated_op(&mut self, r: &mut Rotation, o: Op) -> Result<(), CodegenError> {
        let iv = r.body.args[0];
        match o {
            Op::Wgmma(MmaPart::Head) => {
                self.bind_stages(r.s, r.cursor.stage);
                self.vals.insert(iv, Val::Scalar(r.head_iv));
                for o in r.parts.head.clone() {
                    self.write_op(o)?;
                }
            }
            Op::Wgmma(MmaPart::Tail) => {
                self.ins(format!("sub.s32 {}, {}, {}", r.tail_iv, r.head_iv, r.step));
                self.bind_stages(r.s, r.cursor.prev);
                self.vals.insert(iv, Val::Scalar(r.tail_iv));
                for (v, h) in &r.handoff {
                    self.vals.insert(*v, h.clone());
                }
                for o in r.parts.tail.clone() {
                    match r.overlap.rescale {
                        Some((op, factor)) if op == o => self.write_rescale(op, factor)?,
                        _ => self.write_op(o)?,
                    }
                }
            }
            Op::Run(Region::Between) => {
                self.vals.insert(iv, Val::Scalar(r.head_iv));
                for o in r.parts.between.clone() {
                    self.write_op(o)?;
                    if let Some(d) = r.overlap.defer
                        && d.max == o
                    {
                        self.write_deferral(d)?;
                    }
                }
            }
            Op::Run(Region::Handoff) => self.hand_off(r)?,
            Op::Sync { bar, index, who } => self.named_op(r.s, bar, index, who, true)?,
            Op::Signal { bar, index, who } => self.named_op(r.s, bar, index, who, false)?,
            Op::Wait { bar, start, .. } => self.wait(r.s, &r.cursor, bar, start, false)?,
            Op::WgmmaCommit
            | Op::WgmmaWait(_)
            | Op::Arrive { .. }
            | Op::ArrivePeer { .. }
            | Op::FenceProxyAsync => self.consumer_op(r.s, &r.cursor, o, r.lane0)?,
            other => {
                return Err(self.internal(
                    r.s.for_op,
                    format!("`{}` in a rotated consumer program", named(r.s, other)),
                ));
            }
        }
        Ok(())
    }

    /// The deferred running maximum ([`Deferral`]): a warp keeps its reference, the carried
    /// maximum, while every one of its rows' new maximum exceeds it by at most the threshold
    /// (a `-inf` reference never stays: `x - -inf` is not below it); what the body computes
    /// from the new maximum, the carried one included, then reads the reference.
    fn write_deferral(&mut self, d: Deferral) -> Result<(), CodegenError> {
        let m_new = self.k.ops[d.max].results[0];
        let layouts = &self.k.schedule.layouts;
        if layouts.get(&m_new) != layouts.get(&d.carried) {
            return Err(self.internal(d.max, "a deferred maximum laid out unlike its carried one"));
        }
        let new = self.tile(m_new, d.max)?;
        let old = self.tile(d.carried, d.max)?;
        let threshold = format!("0f{:08X}", Deferral::THRESHOLD.to_bits());
        let (near, keep) = (self.new_reg(Class::Pred), self.new_reg(Class::Pred));
        for (k, (n, o)) in new.iter().zip(&old).enumerate() {
            let growth = self.new_reg(Class::F32);
            self.ins(format!("sub.f32 {growth}, {n}, {o}"));
            if k == 0 {
                self.ins(format!("setp.le.f32 {near}, {growth}, {threshold}"));
            } else {
                self.ins(format!(
                    "setp.le.and.f32 {near}, {growth}, {threshold}, {near}"
                ));
            }
        }
        self.ins(format!("vote.sync.all.pred {keep}, {near}, 0xffffffff"));
        let chosen: Vec<Reg> = new
            .iter()
            .zip(&old)
            .map(|(n, o)| {
                let r = self.new_reg(Class::F32);
                self.ins(format!("selp.f32 {r}, {o}, {n}, {keep}"));
                r
            })
            .collect();
        self.vals.insert(m_new, Val::Tile(chosen));
        Ok(())
    }

    /// The tail's rescale `acc * factor`, skipped by a warp whose factors are all 1.
    fn write_rescale(&mut self, op: OpId, factor: ValueId) -> Result<(), CodegenError> {
        let acc_v = self.k.ops[op]
            .operands
            .iter()
            .copied()
            .find(|&v| v != factor)
            .ok_or_else(|| self.internal(op, "a rescale without its accumulator"))?;
        let acc = self.tile(acc_v, op)?;
        let factors = self.tile(factor, op)?;
        let (all, one) = (self.new_reg(Class::Pred), self.new_reg(Class::Pred));
        self.ins(format!("setp.eq.f32 {all}, {}, 0f3F800000", factors[0]));
        for f in &factors[1..] {
            self.ins(format!("setp.eq.and.f32 {all}, {f}, 0f3F800000, {all}"));
        }
        self.ins(format!("vote.sync.all.pred {one}, {all}, 0xffffffff"));
        let (skip, end) = (self.new_label(), self.new_label());
        self.ins(format!("@{one} bra.uni {skip}"));
        let result = self.k.ops[op].results[0];
        let distinct = acc.iter().collect::<BTreeSet<_>>().len() == acc.len();
        if self.dies_here(acc_v, op) && distinct && self.k.ty(acc_v).dtype() == DType::F32 {
            // In place: the accumulator keeps one set of registers through the loop, the
            // tail's wgmma accumulates into them and nothing is copied.
            let d = self.dist(result, op)?;
            for (a, offs) in acc.iter().zip(&d.regs) {
                let f = self.elem(factor, offs, op)?;
                self.ins(format!("mul.f32 {a}, {a}, {f}"));
            }
            self.label(&skip);
            self.vals.insert(result, Val::Tile(acc));
            return Ok(());
        }
        self.write_op(op)?;
        let out = self.tile(result, op)?;
        self.ins(format!("bra.uni {end}"));
        self.label(&skip);
        for (o, a) in out.iter().zip(&acc) {
            self.mov(*o, *a);
        }
        self.label(&end);
        Ok(())
    }

    /// Moves this iteration's handed values into the handoff registers (narrowed tiles packed
    /// two elements per register, as the tail's wgmma reads them) and its carried values but
    /// the accumulator into the carried registers.
    fn hand_off(&mut self, r: &mut Rotation) -> Result<(), CodegenError> {
        for v in r.parts.handed.clone() {
            let src = match self.val(v, r.s.for_op)? {
                Val::Affine { .. } | Val::Lazy(_) => Val::Tile(self.tile(v, r.s.for_op)?),
                other => other,
            };
            let dst = match (r.handoff.get(&v), &src) {
                (Some(d), _) => d.clone(),
                (None, Val::Narrowed { src, .. }) => Val::Packed(
                    (0..src.len() / 2)
                        .map(|_| self.new_reg(Class::B32))
                        .collect(),
                ),
                (None, other) => self.fresh_like(other, r.s.for_op)?,
            };
            match (&dst, &src) {
                (Val::Packed(pairs), Val::Narrowed { src, to }) => {
                    let cvt = match to {
                        kiln_ir::DType::F16 => "cvt.rn.f16x2.f32",
                        _ => "cvt.rn.bf16x2.f32",
                    };
                    for (k, p) in pairs.iter().enumerate() {
                        // The first source lands in the upper half (ptx-notes section 6).
                        self.ins(format!("{cvt} {p}, {}, {}", src[2 * k + 1], src[2 * k]));
                    }
                }
                _ => self.assign(&dst, &src, r.s.for_op)?,
            }
            r.handoff.insert(v, dst);
        }
        let yields = self.yielded(&r.body);
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
        self.assign_all(&dsts, &values, r.s.for_op)
    }

    /// Writes the consumers' ops once per CTA around their tiles ([`Program::start`],
    /// [`Program::exit`]): turn hand-overs.
    ///
    /// [`Program::start`]: kiln_ir::sched::Program::start
    /// [`Program::exit`]: kiln_ir::sched::Program::exit
    pub(super) fn cta_turn_ops(&mut self, s: &Sched, ops: &[Op]) -> Result<(), CodegenError> {
        for &o in ops {
            match o {
                Op::Sync { bar, index, who } => self.named_op(s, bar, index, who, true)?,
                Op::Signal { bar, index, who } => self.named_op(s, bar, index, who, false)?,
                other => {
                    return Err(
                        self.internal(s.for_op, format!("`{}` once per CTA", named(s, other)))
                    );
                }
            }
        }
        Ok(())
    }

    /// The registers of named barrier array `bar` for this consumer warpgroup (its replica).
    pub(super) fn turn_regs(
        &mut self,
        s: &Sched,
        bar: BarrierId,
    ) -> Result<TurnRegs, CodegenError> {
        let (first, ids, threads) = named_barrier(s, bar)
            .ok_or_else(|| self.internal(s.for_op, "a turn on an mbarrier"))?;
        let wg = self
            .warpgroup
            .ok_or_else(|| self.internal(s.for_op, "turn barriers outside the consumers"))?;
        let (own, next, leader) = (
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
            self.new_reg(Class::Pred),
        );
        self.ins(format!("add.u32 {own}, {wg}, {first}"));
        self.ins(format!("add.u32 {next}, {wg}, 1"));
        self.ins(format!("rem.u32 {next}, {next}, {ids}"));
        self.ins(format!("add.u32 {next}, {next}, {first}"));
        self.ins(format!("setp.eq.u32 {leader}, {wg}, 0"));
        // Of two warpgroups the last is the one that is not the leader.
        let not_last = if ids == 2 {
            leader
        } else {
            let p = self.new_reg(Class::Pred);
            self.ins(format!("setp.ne.u32 {p}, {wg}, {}", ids - 1));
            p
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

    /// `bar.sync` (`sync`) or `bar.arrive` on element `index` of named barrier array `bar`,
    /// by the warpgroups `who` names.
    fn named_op(
        &mut self,
        s: &Sched,
        bar: BarrierId,
        index: Index,
        who: Who,
        sync: bool,
    ) -> Result<(), CodegenError> {
        let t = self
            .turns
            .filter(|t| t.bar == bar)
            .ok_or_else(|| self.internal(s.for_op, "a turn op without turn barriers"))?;
        let id = match index {
            Index::Own => t.own,
            Index::Next => t.next,
        };
        let skip = match who {
            Who::All => None,
            Who::Leader => Some(format!("@!{}", t.leader)),
            Who::Last => Some(format!("@{}", t.not_last)),
        };
        let end = self.new_label();
        if let Some(guard) = &skip {
            self.ins(format!("{guard} bra {end}"));
        }
        let threads = t.threads;
        if sync {
            self.ins(format!("bar.sync {id}, {threads}"));
        } else {
            self.ins(format!("bar.arrive {id}, {threads}"));
        }
        if skip.is_some() {
            self.label(&end);
        }
        Ok(())
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
