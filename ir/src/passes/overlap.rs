//! The `overlap` pass (sm_90a): overlaps a ring body's register code with its tensor-core work.
//!
//! A ring loop whose body has, by structure, the shape of an attention step (a head `mma`
//! feeding register code, which feeds a tail `mma` accumulating into a carried value) is
//! rotated ([`crate::sched::Program::rotated`]) so the code between runs for block `t` while
//! the tail mma of block `t - 1` runs; two or three consumer warpgroups take turns ([`Turns`])
//! and the running maximum's growth may be deferred ([`crate::sched::overlap::Deferral`]).
//! The schedule, its register split and when a body qualifies: `docs/pipeline.md`.

use std::collections::BTreeSet;

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Const, Kernel, OpId, OpKind, ReduceOp, UnaryOp, ValueDef, ValueId};
use crate::sched::overlap::{Deferral, Overlap, Turns};
use crate::sched::{BarrierId, Index, Mbarrier, MmaPart, Op, Region, RoleKind, Sched, Who};
use crate::target::Target;

/// Warps per warpgroup.
const WARPGROUP: u32 = 4;
/// Named barrier id of warpgroup 0's turn; `bar.sync 0` is the block-wide set-up barrier.
const FIRST_TURN_BARRIER: u32 = 1;

/// Rotates the schedule's loop when it has the right shape; does nothing on other targets.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a {
        return Ok(());
    }
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let id = s.for_op;
    let Some(warps) = s.role(RoleKind::Consumer).map(|r| r.warps) else {
        return Ok(());
    };
    let Some(mut overlap) = plan(kernel, id) else {
        return Ok(());
    };
    // The rotated ring releases a stage per part: a tile both the head and the tail read
    // (one load serving two operands) would be refilled before the tail's read.
    let uses = super::walk::uses(kernel);
    let shared = s.loads.iter().any(|(_, l)| {
        let r = readers(kernel, &uses, l.tma.load);
        r.contains(&overlap.tail) && r.iter().any(|&u| u != overlap.tail)
    });
    // Operands the consumers stage through shared memory are written between barriers of
    // their own, which a rotated body would split across iterations.
    if shared || !kernel.schedule.staged.is_empty() {
        return Ok(());
    }
    let warpgroups = warps / WARPGROUP;
    // Ping-pong needs a partner; two or three warpgroups (the most `pipeline` plans) take
    // turns through a barrier each.
    overlap.turns = (warpgroups >= 2).then_some(Turns {
        first_barrier: FIRST_TURN_BARRIER,
        warpgroups,
    });
    let tail_only: Vec<bool> = s
        .loads
        .iter()
        .map(|(_, l)| only_read_by(kernel, &uses, l.tma.load, overlap.tail))
        .collect();
    let loc = kernel.ops[id].loc;
    let s = kernel
        .schedule
        .sched
        .as_mut()
        .ok_or_else(|| Diagnostic::internal(loc, "a schedule vanished"))?;
    for ((_, l), tail) in s.loads.iter_mut().zip(tail_only) {
        l.read_by = if tail { MmaPart::Tail } else { MmaPart::Head };
    }
    let turn = overlap.turns.map(|t| {
        let threads = Turns::MEETING * 32 * WARPGROUP;
        s.add_named("turn", None, (t.first_barrier, t.warpgroups, threads))
    });
    let program = rotated_program(s, turn);
    if let Some(c) = s.roles.iter_mut().find(|r| r.kind == RoleKind::Consumer) {
        c.program.iteration = program;
        c.program.rotated = true;
        c.program.drain = Vec::new();
        if let Some(bar) = turn {
            // The last warpgroup hands the leader its first turn (one turn goes round, so one
            // warpgroup issues at a time); the leader takes the last pass. Once per CTA: a
            // persistent CTA's turns go round across its tiles, so the leader starts a tile
            // while the others finish the one before.
            c.program.start = vec![Op::Signal {
                bar,
                index: Index::Next,
                who: Who::Last,
            }];
            c.program.exit = vec![Op::Sync {
                bar,
                index: Index::Own,
                who: Who::Leader,
            }];
        }
    }
    s.overlap = Some(overlap);
    s.sort_barriers();
    let split = super::warp_specialise::register_split(true, warps);
    super::warp_specialise::set_registers(s, split);
    deepen(kernel)?;
    split_ring(kernel)?;
    super::warp_specialise::check_register_file(kernel)
}

/// A rotated iteration holds stage `t - 1` (its tail) while it waits for stage `t`, one stage
/// more than the loop it replaces: add that stage when shared memory allows, so TMA still
/// loads a block ahead; otherwise keep the ring as it is.
fn deepen(kernel: &mut Kernel) -> Result<(), Diagnostic> {
    let before = kernel.schedule.clone();
    if let Some(s) = kernel.schedule.sched.as_mut() {
        s.stages += 1;
        if let Some(o) = &mut s.overlap {
            o.deepened = true;
        }
    }
    if super::pipeline::place(kernel).is_err() {
        kernel.schedule = before;
        super::pipeline::place(kernel)?;
    }
    Ok(())
}

/// Takes back the stage [`deepen`] added and splits the ring instead, freeing a stage of
/// shared memory for a later pass (the `tma_store` pass's staging tile, which is worth more
/// than the stage); does nothing to a ring that was not deepened.
pub(crate) fn undeepen(kernel: &mut Kernel) -> Result<(), Diagnostic> {
    let Some(s) = kernel.schedule.sched.as_mut() else {
        return Ok(());
    };
    let Some(o) = s.overlap.as_mut().filter(|o| o.deepened) else {
        return Ok(());
    };
    o.deepened = false;
    s.stages -= 1;
    split_ring(kernel)
}

/// Gives the loads that only the tail mma reads barrier arrays of their own (see the module
/// doc) when the ring has no extra stage; leaves the ring as it is when no load or every
/// load is the tail's, or the arrays do not fit.
fn split_ring(kernel: &mut Kernel) -> Result<(), Diagnostic> {
    let before = kernel.schedule.clone();
    let Some(s) = kernel.schedule.sched.as_mut() else {
        return Ok(());
    };
    if s.overlap.as_ref().is_none_or(|o| o.deepened) {
        return Ok(());
    }
    let ring: Vec<_> = s.ring_loads().map(|(h, _)| h).collect();
    let tail: Vec<_> = ring
        .iter()
        .copied()
        .filter(|&h| s.loads[h].read_by == MmaPart::Tail)
        .collect();
    let (Some(&first), false) = (ring.first(), tail.is_empty() || tail.len() == ring.len()) else {
        return Ok(());
    };
    let (full, Some(empty)) = (s.loads[first].barrier, s.loads[first].free) else {
        return Ok(());
    };
    let copy = |s: &mut Sched, name, of: BarrierId| {
        let m: Option<Mbarrier> = s.mbarrier(of).copied();
        m.map(|m| s.add_mbarrier(name, None, m))
    };
    let (Some(tail_full), Some(tail_empty)) =
        (copy(s, "tail_full", full), copy(s, "tail_empty", empty))
    else {
        return Ok(());
    };
    for &h in &tail {
        s.loads[h].barrier = tail_full;
        s.loads[h].free = Some(tail_empty);
    }
    let mut producer = Vec::new();
    for (empty, full) in [(empty, full), (tail_empty, tail_full)] {
        let loads: Vec<_> = ring
            .iter()
            .copied()
            .filter(|&h| s.loads[h].barrier == full)
            .collect();
        producer.push(Op::wait(empty, 1));
        producer.push(Op::ExpectTx {
            bar: full,
            bytes: loads.iter().map(|&h| s.loads[h].tma.tile_bytes()).sum(),
        });
        producer.extend(loads.into_iter().map(|load| Op::Tma { load }));
    }
    let turn = s
        .barriers
        .iter()
        .find_map(|(h, b)| (b.name == "turn").then_some(h));
    let program = rotated_program(s, turn);
    for r in &mut s.roles {
        match r.kind {
            RoleKind::Producer => r.program.iteration = producer.clone(),
            RoleKind::Consumer => r.program.iteration = program.clone(),
            _ => {}
        }
    }
    if super::pipeline::place(kernel).is_err() {
        kernel.schedule = before;
    }
    Ok(())
}

/// Whether every read of `load`'s tile (through transposes) is by `mma`.
pub(crate) fn only_read_by(
    kernel: &Kernel,
    uses: &std::collections::BTreeMap<ValueId, Vec<OpId>>,
    load: OpId,
    mma: OpId,
) -> bool {
    let r = readers(kernel, uses, load);
    !r.is_empty() && r.iter().all(|&u| u == mma)
}

/// The ops that read `load`'s tile, through transposes.
fn readers(
    kernel: &Kernel,
    uses: &std::collections::BTreeMap<ValueId, Vec<OpId>>,
    load: OpId,
) -> Vec<OpId> {
    let mut values = vec![kernel.ops[load].results[0]];
    let mut found = Vec::new();
    while let Some(v) = values.pop() {
        for &u in uses.get(&v).into_iter().flatten() {
            match kernel.ops[u].kind {
                OpKind::Transpose => values.push(kernel.ops[u].results[0]),
                _ => found.push(u),
            }
        }
    }
    found
}

/// The consumers' rotated program of `s` (see `docs/pipeline.md`), with turn barriers around
/// the wgmma issue when the warpgroups ping-pong (`turn`). A split ring (the tail's loads on
/// barriers of their own) releases the head's stage after the head, the tail's after the
/// tail, and waits for the tail's loads of block `t` at the end of iteration `t`.
pub(crate) fn rotated_program(s: &Sched, turn: Option<BarrierId>) -> Vec<Op> {
    let part = |part: MmaPart| {
        s.ring_loads()
            .find(|(_, l)| l.read_by == part)
            .or(s.ring_loads().next())
            .map(|(_, l)| (l.barrier, l.free))
    };
    let (Some((full, Some(empty))), Some((tail_full, Some(tail_empty)))) =
        (part(MmaPart::Head), part(MmaPart::Tail))
    else {
        return Vec::new();
    };
    let split = tail_full != full;
    let mut p = vec![Op::wait(full, 0)];
    if let Some(bar) = turn {
        p.push(Op::sync(bar));
    }
    p.extend([
        Op::Wgmma(MmaPart::Head),
        Op::WgmmaCommit,
        Op::Wgmma(MmaPart::Tail),
        Op::WgmmaCommit,
    ]);
    if let Some(bar) = turn {
        p.push(Op::Signal {
            bar,
            index: Index::Next,
            who: Who::All,
        });
    }
    // The tail group (newest) may still run; the head group is complete.
    p.push(Op::WgmmaWait(1));
    if split {
        p.push(Op::arrive(empty));
    }
    p.extend([Op::Run(Region::Between), Op::WgmmaWait(0)]);
    if split {
        p.extend([
            Op::Arrive {
                bar: tail_empty,
                lag: 1,
            },
            Op::wait(tail_full, 0),
        ]);
    } else {
        p.push(Op::Arrive { bar: empty, lag: 1 });
    }
    p.push(Op::Run(Region::Handoff));
    p
}

/// Every value an op reads, its regions' ops included (minus values defined inside them).
fn reads(kernel: &Kernel, op: OpId) -> BTreeSet<ValueId> {
    let mut out: BTreeSet<ValueId> = kernel.ops[op].operands.iter().copied().collect();
    for o in super::walk::ops_in_block_regions(kernel, op) {
        out.extend(kernel.ops[o].operands.iter().copied());
    }
    out
}

/// The overlap of ring loop `id`, when its body has the shape `docs/pipeline.md` gives.
pub(crate) fn plan(kernel: &Kernel, id: OpId) -> Option<Overlap> {
    let body = &kernel.ops[id].regions[0];
    let (&yield_op, ops) = body.ops.split_last()?;
    if kernel.ops[yield_op].kind != OpKind::Yield {
        return None;
    }
    let [head, tail] = super::walk::mmas(kernel, body)[..] else {
        return None;
    };
    let yields = &kernel.ops[yield_op].operands;
    let tail_result = kernel.ops[tail].results[0];
    let carried = yields.iter().position(|&v| v == tail_result)?;
    if yields.iter().filter(|&&v| v == tail_result).count() != 1 {
        return None;
    }
    let acc_arg = body.args[1 + carried];
    let other_args: BTreeSet<ValueId> = body.args[1..]
        .iter()
        .copied()
        .filter(|&a| a != acc_arg)
        .collect();

    // T: the forward slice of the accumulator and of the tail mma.
    let mut t_vals: BTreeSet<ValueId> = BTreeSet::from([acc_arg]);
    let mut t_ops = Vec::new();
    for &o in ops {
        if o == tail || !reads(kernel, o).is_disjoint(&t_vals) {
            t_ops.push(o);
            t_vals.extend(kernel.ops[o].results.iter().copied());
        }
    }
    // H: the forward slice of the head mma and of every other carried value, outside T.
    let mut h_vals: BTreeSet<ValueId> = other_args.clone();
    let mut h_ops = Vec::new();
    for &o in ops {
        if t_ops.contains(&o) {
            continue;
        }
        if o == head || !reads(kernel, o).is_disjoint(&h_vals) {
            h_ops.push(o);
            h_vals.extend(kernel.ops[o].results.iter().copied());
        }
    }
    let position = |o: OpId| ops.iter().position(|&x| x == o);
    let head_result = kernel.ops[head].results[0];
    let ok = h_ops.contains(&head)
        // The tail's products are waited for at the end of the iteration: nothing after it.
        && t_ops.last() == Some(&tail)
        && position(head) < position(tail)
        && ops
            .iter()
            .filter(|o| !t_ops.contains(o) && !h_ops.contains(o))
            .all(|&o| pure_local(kernel, o))
        && h_ops.iter().all(|&o| o == head || between_op(kernel, o))
        && t_ops.iter().all(|&o| {
            let operands = &kernel.ops[o].operands;
            (o == tail || elementwise(&kernel.ops[o].kind))
                && operands
                    .iter()
                    .all(|v| !other_args.contains(v) && *v != head_result)
        })
        // The tail's A is register code of the between part (P), never a staged tile.
        && kernel.ops[tail]
            .operands
            .first()
            .is_some_and(|&a| defined_by(kernel, a, &h_ops))
        && yields
            .iter()
            .enumerate()
            .all(|(i, &v)| i == carried || defined_by(kernel, v, &h_ops))
        // Nothing but T and the yield reads what T computes.
        && ops
            .iter()
            .filter(|o| !t_ops.contains(o))
            .all(|&o| reads(kernel, o).is_disjoint(&t_vals));
    if !ok {
        return None;
    }
    // The rescale: the accumulator times a factor the code between computed.
    let rescale = t_ops.iter().find_map(|&o| {
        let op = &kernel.ops[o];
        match (&op.kind, op.operands.as_slice()) {
            (OpKind::Binary(BinaryOp::Mul), &[a, b])
                if a == acc_arg && defined_by(kernel, b, &h_ops) =>
            {
                Some((o, b))
            }
            (OpKind::Binary(BinaryOp::Mul), &[a, b])
                if b == acc_arg && defined_by(kernel, a, &h_ops) =>
            {
                Some((o, a))
            }
            _ => None,
        }
    });
    let defer = rescale.and_then(|(op, factor)| deferral(kernel, id, op, factor));
    Some(Overlap {
        head,
        tail,
        carried,
        rescale,
        defer,
        deepened: false,
        between: h_ops.into_iter().filter(|&o| o != head).collect(),
        tail_ops: t_ops,
        turns: None,
    })
}

/// The deferrable maximum of ring loop `id` (see [`Deferral`]), found from its rescale `op`
/// (`acc * factor`): every value on the way is checked to have exactly the uses the shape
/// allows, so scaling `p`, `alpha`, `l` and `acc` by one factor per row cannot change what
/// the kernel computes.
fn deferral(kernel: &Kernel, id: OpId, rescale: OpId, factor: ValueId) -> Option<Deferral> {
    let uses = super::walk::uses(kernel);
    let body = &kernel.ops[id].regions[0];
    let yield_op = *body.ops.last()?;
    let yields = &kernel.ops[yield_op].operands;
    let def = |v: ValueId| match kernel.values[v].def {
        ValueDef::Op(o, 0) => Some(o),
        _ => None,
    };
    let kind = |o: OpId| &kernel.ops[o].kind;
    let ops = |o: OpId| kernel.ops[o].operands.as_slice();
    let result = |o: OpId| kernel.ops[o].results[0];
    let users =
        |v: ValueId| -> BTreeSet<OpId> { uses.get(&v).into_iter().flatten().copied().collect() };
    let only = |v: ValueId, allowed: &[OpId]| users(v) == allowed.iter().copied().collect();
    let sole_user = |v: ValueId| match users(v).into_iter().collect::<Vec<_>>()[..] {
        [o] => Some(o),
        _ => None,
    };
    let reduces = |o: OpId, r: ReduceOp| matches!(kind(o), OpKind::Reduce { op, .. } if *op == r);
    let is_float = |v: ValueId, x: f64| {
        def(v).is_some_and(|o| matches!(kind(o), OpKind::Const(Const::Float(c)) if *c == x))
    };
    let arg_slot = |v: ValueId| body.args.iter().position(|&a| a == v).filter(|&i| i > 0);

    // factor = reshape(alpha); alpha = exp2(m - m_use).
    let reshape_alpha = def(factor).filter(|&o| matches!(kind(o), OpKind::Reshape { .. }))?;
    let alpha_op =
        def(ops(reshape_alpha)[0]).filter(|&o| *kind(o) == OpKind::Unary(UnaryOp::Exp2))?;
    let alpha = result(alpha_op);
    let alpha_exponent =
        def(ops(alpha_op)[0]).filter(|&o| *kind(o) == OpKind::Binary(BinaryOp::Sub))?;
    let (m, m_use_v) = (ops(alpha_exponent)[0], ops(alpha_exponent)[1]);
    let m_slot = arg_slot(m)?;
    // m_use = select(m_new == -inf, 0, m_new), or m_new itself.
    let m_use = def(m_use_v)?;
    let (max, guard) = match kind(m_use) {
        OpKind::Select => {
            let &[cond, zero, m_new] = ops(m_use) else {
                return None;
            };
            let eq = def(cond).filter(|&o| *kind(o) == OpKind::Binary(BinaryOp::Eq))?;
            let &[a, b] = ops(eq) else { return None };
            (a == m_new
                && is_float(b, f64::NEG_INFINITY)
                && is_float(zero, 0.0)
                && only(cond, &[m_use]))
            .then_some(())?;
            (def(m_new)?, Some(eq))
        }
        _ => (m_use, None),
    };
    // m_new = max(m, row_max(s)), carried as the next m.
    (*kind(max) == OpKind::Binary(BinaryOp::Max)).then_some(())?;
    let row_max = ops(max).iter().copied().find(|&v| v != m)?;
    (ops(max).contains(&m)
        && def(row_max).is_some_and(|o| reduces(o, ReduceOp::Max))
        && yields.get(m_slot - 1) == Some(&result(max)))
    .then_some(())?;
    let m_new_users: Vec<OpId> = [Some(m_use), guard, Some(yield_op)]
        .into_iter()
        .flatten()
        .filter(|&o| o != max)
        .collect();
    only(result(max), &m_new_users).then_some(())?;
    only(m, &[max, alpha_exponent]).then_some(())?;
    // m_use feeds alpha's exponent and p = exp2(s - reshape(m_use)) only.
    let reshape_m = users(m_use_v).into_iter().find(|&o| o != alpha_exponent)?;
    (matches!(kind(reshape_m), OpKind::Reshape { .. })
        && only(m_use_v, &[alpha_exponent, reshape_m]))
    .then_some(())?;
    let p_exponent = sole_user(result(reshape_m))?;
    (*kind(p_exponent) == OpKind::Binary(BinaryOp::Sub) && ops(p_exponent)[1] == result(reshape_m))
        .then_some(())?;
    let p_op = sole_user(result(p_exponent))?;
    (*kind(p_op) == OpKind::Unary(UnaryOp::Exp2)).then_some(())?;
    // p: summed into l and, cast, the tail's A; alpha: into l and the rescale's factor.
    let p_users: Vec<OpId> = users(result(p_op)).into_iter().collect();
    let [first, second] = p_users[..] else {
        return None;
    };
    let (row_sum, cast) = if reduces(first, ReduceOp::Sum) {
        (first, second)
    } else {
        (second, first)
    };
    let tail = kernel.ops[rescale].results[0];
    let tail_mma = users(tail).into_iter().next()?;
    (reduces(row_sum, ReduceOp::Sum)
        && matches!(kind(cast), OpKind::Cast { .. })
        && only(result(cast), &[tail_mma])
        && ops(tail_mma).first() == Some(&result(cast)))
    .then_some(())?;
    let l_scale = users(alpha).into_iter().find(|&o| o != reshape_alpha)?;
    only(alpha, &[reshape_alpha, l_scale]).then_some(())?;
    let &[l, a] = ops(l_scale) else { return None };
    let l = if a == alpha { l } else { a };
    let l_slot = arg_slot(l)?;
    let l_new = sole_user(result(l_scale))?;
    (*kind(l_scale) == OpKind::Binary(BinaryOp::Mul)
        && *kind(l_new) == OpKind::Binary(BinaryOp::Add)
        && ops(l_new).contains(&result(row_sum))
        && only(result(row_sum), &[l_new])
        && only(l, &[l_scale])
        && yields.get(l_slot - 1) == Some(&result(l_new))
        && only(result(l_new), &[yield_op]))
    .then_some(())?;
    // After the loop: m unread; l only as the divisor of acc: acc * reshape(recip(select(l == 0, 1, l))).
    let loop_results = &kernel.ops[id].results;
    let acc_out =
        loop_results.get(body.args.iter().position(|&a| ops(rescale).contains(&a))? - 1)?;
    let (m_out, l_out) = (loop_results[m_slot - 1], loop_results[l_slot - 1]);
    users(m_out).is_empty().then_some(())?;
    let l_users: Vec<OpId> = users(l_out).into_iter().collect();
    let [x, y] = l_users[..] else { return None };
    let (zero_test, safe) = if *kind(x) == OpKind::Select {
        (y, x)
    } else {
        (x, y)
    };
    let &[cond, one, l_again] = ops(safe) else {
        return None;
    };
    (*kind(zero_test) == OpKind::Binary(BinaryOp::Eq)
        && result(zero_test) == cond
        && l_again == l_out
        && is_float(one, 1.0)
        && ops(zero_test).iter().any(|&v| is_float(v, 0.0)))
    .then_some(())?;
    let recip = sole_user(result(safe))?;
    let reshape_inv = sole_user(result(recip))?;
    let normalise = sole_user(result(reshape_inv))?;
    (*kind(recip) == OpKind::Unary(UnaryOp::Recip)
        && matches!(kind(reshape_inv), OpKind::Reshape { .. })
        && *kind(normalise) == OpKind::Binary(BinaryOp::Mul)
        && only(*acc_out, &[normalise]))
    .then_some(())?;
    Some(Deferral {
        max,
        carried: m,
        m_use,
        alpha_exponent,
    })
}

/// Whether `v` is a result of one of `ops`.
fn defined_by(kernel: &Kernel, v: ValueId, ops: &[OpId]) -> bool {
    matches!(kernel.values[v].def, ValueDef::Op(o, _) if ops.contains(&o))
}

/// Ops that may be written once per section of the rotated loop: no side effect, no region.
fn pure_local(kernel: &Kernel, o: OpId) -> bool {
    match kernel.ops[o].kind {
        OpKind::Load { .. } => kernel.schedule.buffer(o).is_some(),
        OpKind::Const(_)
        | OpKind::ScalarParam(_)
        | OpKind::BlockId(_)
        | OpKind::GridDim(_)
        | OpKind::TensorDim { .. }
        | OpKind::Transpose => true,
        _ => elementwise(&kernel.ops[o].kind),
    }
}

/// Elementwise and shape ops on registers or scalars.
fn elementwise(kind: &OpKind) -> bool {
    kind.is_elementwise() || matches!(kind, OpKind::Reshape { .. })
}

/// Ops the code between may hold: register code, reductions and branches of it; no mma,
/// store, load or loop.
fn between_op(kernel: &Kernel, o: OpId) -> bool {
    let allowed = |k: &OpKind| {
        elementwise(k)
            || matches!(
                k,
                OpKind::Reduce { .. } | OpKind::Const(_) | OpKind::If | OpKind::Yield
            )
    };
    allowed(&kernel.ops[o].kind)
        && super::walk::ops_in_block_regions(kernel, o)
            .into_iter()
            .all(|x| allowed(&kernel.ops[x].kind))
}
