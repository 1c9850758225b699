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
const NON_ACCUMULATOR_REGS: u32 = 32;

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
/// must fit those too.
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
    check_consumers_fit(kernel, &roles, &acc)?;
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
