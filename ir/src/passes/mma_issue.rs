//! The `mma_issue` pass (sm_90a): issues each `mma` of an unrotated ring body as early as its
//! operands allow, so that its wgmma group runs while the body's register code does.
//!
//! The PTX writer commits each wgmma group of such a body where it is issued and waits for
//! it only where an op reads its result (`codegen-ptx`'s `emit::in_flight`). An mma written
//! after code it does not depend on (attention backward's `dP = dO V^T`, written after the
//! softmax of the scores it does not read) would wait for that code; moved up to just after
//! the previous mma (or its last operand), it runs beside it instead. Only the mmas move,
//! with the view ops (transposes, free reshapes, constants) defining their operands: the
//! mmas keep their order (wgmma groups run and complete in commit order), and every other op
//! keeps its place. Moving an mma up past an op is safe because an mma has no effect but its
//! result: what it reads in shared memory is a ring stage (filled before the body starts), a
//! once tile, or an operand it stages itself, and the values it reads are defined before it.
//!
//! The other way, a read of a ring stage into registers (a row statistic fetched with the
//! mma operands) moves down to just before its first reader, so that it is not held across
//! the mmas' issue (`sink_staged_reads`).

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueDef};
use crate::sched::RoleKind;
use crate::sched::tma::Operand;
use crate::target::Target;

use super::occupancy::{NON_ACCUMULATOR_REGS, live_accumulator_regs};
use super::pipeline::overlaps;
use super::warp_specialise::{register_split, set_registers};

/// Reorders the ring body's top-level ops; does nothing on other targets, without a ring,
/// for a rotated body (the `overlap` pass scheduled it) and for the GEMM mainloop (its one
/// mma stays in flight across iterations already). An mma moves only where the
/// accumulators then live at once still fit the consumers' registers (the `occupancy`
/// pass's count, which refuses a kernel they do not fit): an earlier product is held longer.
/// A body in which an mma moved takes the deeper register split of a rotated body (24 / 240,
/// [`register_split`]): with the scores and dP in flight together, attention backward's
/// keys-major consumers spilled 16 bytes at 232 registers and none at 240.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a {
        return Ok(());
    }
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let for_op = s.for_op;
    let Some(warps) = s
        .role(RoleKind::Consumer)
        .filter(|c| !c.program.rotated && c.regs.is_some())
        .map(|c| c.warps)
    else {
        return Ok(());
    };
    if overlaps(kernel, for_op) {
        return Ok(());
    }
    // A body whose products stay in flight across its register code holds more at once:
    // like the `overlap` pass's rotated schedule, it takes the deeper register split.
    let deeper = register_split(true, warps);
    let fits = |k: &Kernel| {
        k.schedule
            .sched
            .as_ref()
            .is_some_and(|s| live_accumulator_regs(k, s) + NON_ACCUMULATOR_REGS <= deeper.1)
    };
    if !fits(kernel) {
        return Ok(());
    }
    let original = kernel.ops[for_op].regions[0].ops.clone();
    let mmas = super::walk::mmas(kernel, &kernel.ops[for_op].regions[0]);
    for (i, &mma) in mmas.iter().enumerate() {
        let before = kernel.ops[for_op].regions[0].ops.clone();
        let after = i.checked_sub(1).map(|p| mmas[p]);
        kernel.ops[for_op].regions[0].ops = hoist(kernel, &before, mma, after);
        if !fits(kernel) {
            kernel.ops[for_op].regions[0].ops = before;
        }
    }
    let moved = kernel.ops[for_op].regions[0].ops != original;
    let body = kernel.ops[for_op].regions[0].ops.clone();
    kernel.ops[for_op].regions[0].ops = sink_staged_reads(kernel, &body);
    if moved && let Some(s) = kernel.schedule.sched.as_mut() {
        set_registers(s, deeper);
    }
    Ok(())
}

/// `ops` (a block, in program order) with `mma` moved up to just after `after` (the
/// previous mma) or the last definition among its operands, whichever is later, together
/// with the view ops it reads that sit below that point.
fn hoist(kernel: &Kernel, ops: &[OpId], mma: OpId, after: Option<OpId>) -> Vec<OpId> {
    let mut placed: Vec<OpId> = ops.iter().copied().filter(|&o| o != mma).collect();
    let index = |placed: &[OpId], o: OpId| placed.iter().position(|&p| p == o);
    // The view ops among the mma's operand definitions, transitively, and the earliest
    // index the rest of its operands (and the previous mma) allow. Nor does it move above a
    // load from global memory into registers: issued first, the load's latency runs under
    // the mma, and the registers it fills are not held across the mma's issue (moved above
    // such loads, attention backward's scores spilled at d = 128 with a chunked window).
    let mut at = after.and_then(|a| index(&placed, a)).map_or(0, |i| i + 1);
    let original = ops.iter().position(|&o| o == mma).unwrap_or(0);
    if let Some(i) = ops[..original]
        .iter()
        .rposition(|&o| loads_registers(kernel, o))
    {
        at = at.max(i + 1);
    }
    // Nor above a branch that divides integer tiles (a chunked window's chunk bounds): its
    // temporaries take registers the accumulator count does not see, and the mma's, held
    // across them, spilled (the keys-major backward's dP with `attention_chunk`: 104 bytes).
    if let Some(i) = ops[..original]
        .iter()
        .rposition(|&o| divides_tiles(kernel, o))
    {
        at = at.max(i + 1);
    }
    let mut views = Vec::new();
    let mut pending = vec![mma];
    while let Some(o) = pending.pop() {
        for &v in &kernel.ops[o].operands {
            let ValueDef::Op(def, _) = kernel.values[v].def else {
                continue;
            };
            let Some(i) = index(&placed, def) else {
                continue;
            };
            if !is_view(kernel, def) {
                at = at.max(i + 1);
            } else if !views.contains(&def) {
                views.push(def);
                pending.push(def);
            }
        }
    }
    // Views already above `at` stay; the others move to just before the mma, in their
    // program order.
    let mut moved: Vec<OpId> = views
        .into_iter()
        .filter(|&v| index(&placed, v).is_some_and(|i| i >= at))
        .collect();
    moved.sort_by_key(|&v| index(&placed, v));
    placed.retain(|p| !moved.contains(p));
    let at = at.min(placed.len());
    placed.splice(at..at, moved.into_iter().chain([mma]));
    placed
}

/// `ops` (a ring body, in program order) with each read of a ring stage into registers moved
/// down to just before its first reader, together with the register code that reads only
/// such values (a row statistic times a constant). Attention backward's keys-major form
/// reads the log-sum-exp and delta of each thread's query columns (32 each at 128 queries):
/// read where the body's first line reads them, they stayed live across both products'
/// issue and spilled; read where they are used, they live beside the finished scores only.
/// A stage is not overwritten before the consumers release it after the body, so a later
/// read sees the same bytes.
fn sink_staged_reads(kernel: &Kernel, ops: &[OpId]) -> Vec<OpId> {
    let mut sinks: Vec<OpId> = Vec::new();
    for &o in ops {
        let op = &kernel.ops[o];
        let reads_stage = kernel.schedule.sched.as_ref().is_some_and(|s| {
            s.loads
                .iter()
                .any(|(_, l)| l.tma.load == o && l.tma.operand == Operand::Registers)
        });
        let derived = op.regions.is_empty()
            && matches!(op.kind, OpKind::Binary(_) | OpKind::Unary(_))
            && op.operands.iter().any(|&v| defined_by(kernel, v, &sinks))
            && op
                .operands
                .iter()
                .all(|&v| defined_by(kernel, v, &sinks) || kernel.ty(v).shape().is_none());
        if reads_stage || derived {
            sinks.push(o);
        }
    }
    let mut placed: Vec<OpId> = ops.to_vec();
    // Last first, so that a chain's reader has its place before the values it reads move.
    for &o in sinks.iter().rev() {
        let from = placed.iter().position(|&p| p == o).expect("a body op");
        let results = &kernel.ops[o].results;
        let reads = |p: OpId| {
            std::iter::once(p)
                .chain(super::walk::ops_in_block_regions(kernel, p))
                .any(|q| kernel.ops[q].operands.iter().any(|v| results.contains(v)))
        };
        let Some(first) = placed[from + 1..].iter().position(|&p| reads(p)) else {
            continue;
        };
        let to = from + first;
        placed.remove(from);
        placed.insert(to, o);
    }
    placed
}

/// Whether `v` is a result of one of `ops`.
fn defined_by(kernel: &Kernel, v: crate::kernel::ValueId, ops: &[OpId]) -> bool {
    matches!(kernel.values[v].def, ValueDef::Op(d, _) if ops.contains(&d))
}

/// A load from global memory into registers (not a tile staged in shared memory).
fn loads_registers(kernel: &Kernel, op: OpId) -> bool {
    matches!(
        kernel.ops[op].kind,
        OpKind::Load { .. } | OpKind::LoadScalar { .. } | OpKind::Gather { .. }
    ) && kernel.schedule.buffer(op).is_none()
}

/// An `if` whose branches divide or take the remainder of integer tiles.
fn divides_tiles(kernel: &Kernel, op: OpId) -> bool {
    use crate::entities::BinaryOp;
    kernel.ops[op].kind == OpKind::If
        && super::walk::ops_in_block_regions(kernel, op)
            .into_iter()
            .any(|o| {
                let x = &kernel.ops[o];
                matches!(x.kind, OpKind::Binary(BinaryOp::Div | BinaryOp::Rem))
                    && x.results.iter().any(|&r| kernel.ty(r).shape().is_some())
            })
}

/// An op that only renames or reinterprets values (no instruction, or a constant), which
/// may move with the mma reading it.
fn is_view(kernel: &Kernel, op: OpId) -> bool {
    let o = &kernel.ops[op];
    o.regions.is_empty()
        && match &o.kind {
            OpKind::Const(_) => true,
            OpKind::Transpose => !super::lower::transpose_moves(kernel, o),
            OpKind::Reshape { .. } => super::lower::reshape_is_free(kernel, o),
            _ => false,
        }
}
