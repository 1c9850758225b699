//! The `occupancy` pass (sm_90a): a warp-specialised kernel is built for two CTAs per
//! multiprocessor where their shared memory and the consumers' registers fit, so one CTA's
//! epilogue, ring start and softmax run under the other's wgmmas (what two ping-ponging consumer
//! warpgroups give within a CTA, across CTAs). In: the final shared-memory plan (`tma_store`'s
//! staging tile included), the roles and the layouts. Out: the CTAs per multiprocessor and the
//! register split ([`run`]), or an error at the user's loop where the consumers' accumulators fit
//! not even one CTA's split (three consumer warpgroups of attention at d = 128, or of a 192 x 256
//! gemm tile).

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueDef};
use crate::sched::{MmaPart, Op, RoleKind, Sched};
use crate::target::Target;

use super::walk;
use super::warp_specialise::{check_register_file, entry_regs, set_registers};

/// Shared memory per multiprocessor on sm_90a (228 KiB), of which the driver reserves 1 KiB
/// per CTA.
const SMEM_PER_SM: u32 = 228 * 1024;
const SMEM_RESERVED_PER_CTA: u32 = 1024;

/// The producer warpgroup's `setmaxnreg.dec` target when two CTAs share the registers.
const SHARED_PRODUCER_REGS: u32 = 24;

/// Registers per consumer thread besides the mma accumulators: addresses and descriptors,
/// loop counters and phases, row statistics. Calibrated on ptxas 13.5: attention at d = 64
/// with 64-key blocks (accumulators 32 + 16 + 32 by the count below) assembles without spills
/// at 112 registers and spills at 104 (so it keeps one CTA per multiprocessor).
pub(crate) const NON_ACCUMULATOR_REGS: u32 = 32;

/// Builds kernels for two CTAs per multiprocessor where they fit.
///
/// Two CTAs share the 64K registers: each thread gets at most half the file's share at entry
/// (`.minnctapersm 2`, a multiple of 8: 128 for 256 threads, 80 for 384), then the producer
/// warpgroup gives back down to 24 and the consumer warpgroups share the rest
/// ([`shared_split`]: 232 for one consumer warpgroup, 104 for two), which `setmaxnreg.inc`
/// finds in the CTA's own pool: what its warps hold from launch, never more (a larger split
/// hangs the consumers in `setmaxnreg.inc`, as 112 for two did on the H200). The consumers
/// must fit that count: their mma accumulators (counted per thread from their layouts; a
/// rotated head's one and a half times, as the `overlap` pass keeps the next block's product
/// in flight while the current one is read as a 16-bit operand) and a fixed allowance for
/// addresses, row statistics and the loop's state; and ptxas places each wgmma's accumulator
/// within the registers a thread has at entry, so the largest accumulator and the allowance
/// must fit those too. Two CTAs are chosen by the sum of every accumulator (the margin a
/// second CTA's tighter split needs); a kernel is refused only when the accumulators live
/// at once (`live_accumulator_regs`: attention's backward holds its dK and dV across the
/// loop, its scores, dP and dQ one after another) cannot fit one CTA's split.
/// Every other kernel keeps one CTA per multiprocessor.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a {
        return Ok(());
    }
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let Some(roles) = Split::of(s) else {
        return Ok(());
    };
    let acc = accumulator_regs(kernel, s);
    // Refused only when the accumulators live at once cannot fit one CTA's split: a kernel
    // of several short-lived products (attention's backward) needs far fewer registers than
    // their sum, which the choice of two CTAs below keeps as its margin.
    let live = AccumulatorRegs {
        total: live_accumulator_regs(kernel, s).min(acc.total),
        largest: acc.largest,
    };
    check_consumers_fit(kernel, &roles, &live)?;
    let fits_smem = 2 * (kernel.schedule.smem_bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM;
    let shared = Split {
        ctas_per_sm: 2,
        producer_regs: SHARED_PRODUCER_REGS,
        consumer_regs: shared_split(roles.consumer_warps, roles.producer_warps),
        ..roles
    };
    if !fits_smem || !acc.fits(&shared) {
        return Ok(());
    }
    if let Some(s) = kernel.schedule.sched.as_mut() {
        s.ctas_per_sm = 2;
        set_registers(s, (shared.producer_regs, shared.consumer_regs));
    }
    check_register_file(kernel)
}

/// The warps and registers of a warp-specialised schedule's two roles.
#[derive(Clone, Copy)]
struct Split {
    consumer_warps: u32,
    producer_warps: u32,
    consumer_regs: u32,
    producer_regs: u32,
    ctas_per_sm: u32,
}

impl Split {
    fn of(s: &Sched) -> Option<Split> {
        let (c, p) = (s.role(RoleKind::Consumer)?, s.role(RoleKind::Producer)?);
        Some(Split {
            consumer_warps: c.warps,
            producer_warps: p.warps,
            consumer_regs: c.regs?,
            producer_regs: p.regs?,
            ctas_per_sm: s.ctas_per_sm,
        })
    }

    fn threads(&self) -> u32 {
        32 * (self.consumer_warps + self.producer_warps)
    }
}

/// Checks that the consumers' accumulators fit the registers `roles` gives them at one CTA
/// per multiprocessor: a kernel they do not fit would spill or fail in ptxas (C7602), so it
/// is a compiler error at the user's loop.
fn check_consumers_fit(
    kernel: &Kernel,
    roles: &Split,
    acc: &AccumulatorRegs,
) -> Result<(), Diagnostic> {
    if acc.fits(roles) {
        return Ok(());
    }
    let warpgroups = roles.consumer_warps / 4;
    Err(Diagnostic::new(
        walk::sched_loc(kernel),
        format!(
            "{warpgroups} consumer warpgroup(s) of a {}-thread block: their mma accumulators \
             need {} registers a thread (the largest {}) besides {NON_ACCUMULATOR_REGS} for \
             addresses and row statistics, and they get {} (`setmaxnreg`), of which ptxas \
             places an accumulator within the {} a thread holds at launch",
            roles.threads(),
            acc.total,
            acc.largest,
            roles.consumer_regs,
            entry_regs(roles.threads(), roles.ctas_per_sm),
        ),
    )
    .note("use fewer rows per block (64 per consumer warpgroup) or a narrower tile"))
}

/// The `setmaxnreg.inc` target of each consumer warp when two CTAs of `consumer_warps` and
/// `producer_warps` share the register file and the producers keep
/// `SHARED_PRODUCER_REGS` (24): what is left of the registers the CTA's warps hold from launch,
/// a multiple of 8 as `setmaxnreg` takes.
pub fn shared_split(consumer_warps: u32, producer_warps: u32) -> u32 {
    let warps = consumer_warps + producer_warps;
    let held = warps * entry_regs(32 * warps, 2);
    let left = held.saturating_sub(producer_warps * SHARED_PRODUCER_REGS);
    (left / consumer_warps.max(1)) / 8 * 8
}

/// Registers per consumer thread of the mma accumulators in the kernel's ring loop.
struct AccumulatorRegs {
    /// All of them, and the largest one.
    total: u32,
    largest: u32,
}

impl AccumulatorRegs {
    /// Whether they fit the consumers' count and the largest one the count at entry.
    fn fits(&self, roles: &Split) -> bool {
        self.total + NON_ACCUMULATOR_REGS <= roles.consumer_regs
            && self.largest + NON_ACCUMULATOR_REGS <= entry_regs(roles.threads(), roles.ctas_per_sm)
    }
}

/// The mma accumulators' registers per consumer thread, from their register layouts (a
/// rotated head's one and a half times: see [`run`]), a chain of mmas accumulating into one
/// result counted once.
fn accumulator_regs(kernel: &Kernel, s: &Sched) -> AccumulatorRegs {
    let mut acc = AccumulatorRegs {
        total: 0,
        largest: 0,
    };
    let rotated = s
        .roles
        .iter()
        .any(|r| r.program.iteration.contains(&Op::Wgmma(MmaPart::Head)));
    let is_mma = |op: OpId| matches!(kernel.ops[op].kind, OpKind::Mma);
    for op in walk::ops_in_block_regions(kernel, s.for_op) {
        // An mma accumulating onto another's result (a product summed over column chunks)
        // adds into that accumulator's registers: a chain counts once.
        let chained = kernel.ops[op]
            .operands
            .get(2)
            .is_some_and(|&c| matches!(kernel.values[c].def, ValueDef::Op(d, _) if is_mma(d)));
        if !is_mma(op) || chained {
            continue;
        }
        let result = kernel.ops[op].results[0];
        let per_thread = kernel
            .schedule
            .layouts
            .get(&result)
            .zip(kernel.ty(result).shape())
            .and_then(|(layout, shape)| layout.distribution(shape).ok())
            .map_or(0, |d| d.regs.len() as u32);
        acc.largest = acc.largest.max(per_thread);
        acc.total += match &s.overlap {
            Some(o) if rotated && o.head == op => per_thread + per_thread / 2,
            _ => per_thread,
        };
    }
    acc
}

/// The most registers a consumer thread holds at once in the ring loop for the mma
/// accumulators and the tiles computed elementwise from them (the probabilities from the
/// scores), each from where it is made to its last read in program order, the loop's carried
/// accumulators throughout; 16-bit tiles count half. Inside a branch, a read in another
/// branch of the same `if` does not keep a value live (no path runs both): the masked
/// scores' `select` ends the unmasked scores' life in its branch.
pub(crate) fn live_accumulator_regs(kernel: &Kernel, s: &Sched) -> u32 {
    use std::collections::BTreeMap;

    use crate::kernel::ValueId;
    use crate::schedule::Layout;

    let ops = walk::ops_in_block_regions(kernel, s.for_op);
    // Half-registers of a tile value held in an accumulator layout.
    let halves = |v: ValueId| -> Option<u32> {
        let layout = kernel.schedule.layouts.get(&v)?;
        if !matches!(layout, Layout::Mma { .. } | Layout::WgmmaColumns { .. }) {
            return None;
        }
        let ty = kernel.ty(v);
        let regs = layout.distribution(ty.shape()?).ok()?.regs.len() as u32;
        Some(regs * (ty.dtype().size_bytes() as u32).div_ceil(2))
    };
    let end = ops.len();
    let paths = branch_paths(kernel, s.for_op, &ops);
    let mut reads: BTreeMap<ValueId, Vec<usize>> = BTreeMap::new();
    for (i, &op) in ops.iter().enumerate() {
        for &v in &kernel.ops[op].operands {
            reads.entry(v).or_default().push(i);
        }
    }
    // The loop's carried values: its body's arguments, live from the start, and what it
    // yields, live to the end.
    let body = &kernel.ops[s.for_op].regions[0];
    let mut live: BTreeMap<ValueId, u32> = BTreeMap::new();
    for &a in body.args.iter().skip(1) {
        if let Some(h) = halves(a) {
            live.insert(a, h);
        }
    }
    if let Some(&y) = body.ops.last() {
        for &v in &kernel.ops[y].operands {
            reads.entry(v).or_default().push(end);
        }
    }
    // Whether position `j` may run after position `i`: not in another branch of an `if`
    // that holds both (the body's end follows everything).
    let follows = |i: usize, j: usize| {
        j > i
            && (j == end
                || paths[i]
                    .iter()
                    .all(|(x, r)| paths[j].iter().all(|(y, q)| x != y || r == q)))
    };
    // A branch's merged tiles (the masked scores) are made where its regions end.
    let mut merged: BTreeMap<usize, Vec<ValueId>> = BTreeMap::new();
    let mut most = live.values().sum::<u32>();
    for (i, &op) in ops.iter().enumerate() {
        let o = &kernel.ops[op];
        if o.kind == OpKind::If {
            let inner = walk::ops_in_block_regions(kernel, op).len();
            merged.entry(i + inner).or_default().extend(&o.results);
        }
        // An mma's result, or an elementwise op's on a held tile.
        let derived = o.kind == OpKind::Mma
            || matches!(
                o.kind,
                OpKind::Unary(_) | OpKind::Binary(_) | OpKind::Select | OpKind::Cast { .. }
            ) && o.operands.iter().any(|v| live.contains_key(v));
        let made: &[ValueId] = if derived { &o.results } else { &[] };
        for &r in made.iter().chain(merged.remove(&i).iter().flatten()) {
            if let Some(h) = halves(r) {
                live.insert(r, h);
            }
        }
        // What this op reads last is given back as it writes (an mma accumulating in place,
        // an elementwise op register by register).
        live.retain(|v, _| {
            reads
                .get(v)
                .is_some_and(|at| at.iter().any(|&j| follows(i, j)))
        });
        most = most.max(live.values().sum());
    }
    most.div_ceil(2)
}

/// For each of `ops` (the ops inside `for_op`'s regions, in program order), the branches it
/// sits in: `(if, region)` pairs, outermost first.
fn branch_paths(kernel: &Kernel, for_op: OpId, ops: &[OpId]) -> Vec<Vec<(OpId, usize)>> {
    use std::collections::BTreeMap;

    let mut at: BTreeMap<OpId, Vec<(OpId, usize)>> = BTreeMap::new();
    fn visit(
        kernel: &Kernel,
        op: OpId,
        path: &[(OpId, usize)],
        at: &mut BTreeMap<OpId, Vec<(OpId, usize)>>,
    ) {
        let o = &kernel.ops[op];
        for (r, region) in o.regions.iter().enumerate() {
            let mut inner = path.to_vec();
            if o.kind == OpKind::If {
                inner.push((op, r));
            }
            for &x in &region.ops {
                at.insert(x, inner.clone());
                visit(kernel, x, &inner, at);
            }
        }
    }
    visit(kernel, for_op, &[], &mut at);
    ops.iter()
        .map(|o| at.get(o).cloned().unwrap_or_default())
        .collect()
}
