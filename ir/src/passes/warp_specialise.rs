//! The `warp_specialise` pass (sm_90a): when the kernel has a schedule, gives its roles their
//! registers: the kernel's warps are the consumers (whole warpgroups, threads
//! `0..32 * num_warps`, so every register layout keeps its thread mapping) and one producer
//! warpgroup after them, whose elected thread issues the TMA loads. Registers move from the
//! producer to the consumers with `setmaxnreg` ([`register_split`]); the split is checked
//! against the 64K-register file.

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::sched::{RoleKind, Sched};
use crate::target::Target;

use super::walk::sched_loc;

/// Registers per multiprocessor on sm_90a.
pub const REGISTER_FILE: u32 = 65536;

/// Sets the roles' register split; does nothing without a schedule.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a {
        return Ok(());
    }
    let Some(s) = kernel.schedule.sched.as_mut() else {
        return Ok(());
    };
    let split = register_split(false, kernel.options.num_warps);
    set_registers(s, split);
    check_register_file(kernel)
}

/// Gives the producer and the consumer roles of `s` their `setmaxnreg` targets.
pub(crate) fn set_registers(s: &mut Sched, (producer, consumer): (u32, u32)) {
    for r in &mut s.roles {
        r.regs = match r.kind {
            RoleKind::Producer => Some(producer),
            RoleKind::Consumer => Some(consumer),
            _ => r.regs,
        };
    }
}

/// The `setmaxnreg` targets of the producer warpgroup and of each of `consumer_warps`'
/// warpgroups (one to three): CUTLASS's 40 / 232, or 24 / 240 for the `overlap` pass's deeper
/// schedule (`rotated`), which keeps more of the consumers' values live (docs/ptx.md §5); with
/// three consumer warpgroups each gets what the block's registers leave them, a multiple of 8
/// as `setmaxnreg` takes (160 rotated, FlashAttention-3's count for its three warpgroups).
pub fn register_split(rotated: bool, consumer_warps: u32) -> (u32, u32) {
    let (producer, most) = if rotated { (24, 240) } else { (40, 232) };
    let warps = PRODUCER_WARPS + consumer_warps;
    let left = warps * entry_regs(32 * warps, 1) - PRODUCER_WARPS * producer;
    (producer, most.min(left / consumer_warps.max(1) / 8 * 8))
}

/// Warps of the producer warpgroup.
const PRODUCER_WARPS: u32 = 4;

/// Registers each thread of a block of `threads` gets at launch when `ctas_per_sm` blocks
/// share the register file: a multiple of 8, as ptxas allocates them.
pub fn entry_regs(threads: u32, ctas_per_sm: u32) -> u32 {
    REGISTER_FILE / ctas_per_sm.max(1) / threads.max(1) / 8 * 8
}

/// Checks that the roles' register split fits the registers the block holds from launch:
/// `setmaxnreg.inc` takes only what the block's own warps gave back with `setmaxnreg.dec`, so
/// a split larger than `threads x` [`entry_regs`] leaves the consumers waiting for ever.
pub fn check_register_file(kernel: &Kernel) -> Result<(), Diagnostic> {
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let need: u32 = s
        .roles
        .iter()
        .map(|r| 32 * r.warps * r.regs.unwrap_or(0))
        .sum();
    let threads = s.threads();
    let pool = threads * entry_regs(threads, s.ctas_per_sm);
    if need > pool {
        let role = |kind| {
            s.role(kind)
                .map_or((0, 0), |r| (r.warps, r.regs.unwrap_or(0)))
        };
        let ((consumer_warps, consumer_regs), (_, producer_regs)) =
            (role(RoleKind::Consumer), role(RoleKind::Producer));
        return Err(Diagnostic::new(
            sched_loc(kernel),
            format!(
                "{consumer_warps} consumer warps at {consumer_regs} registers and a producer \
                 warpgroup at {producer_regs} need {need} registers; a block of {threads} \
                 threads at {} CTA(s) per multiprocessor holds {pool}",
                s.ctas_per_sm
            ),
        )
        .note(
            "use an mma tile of 64, 128 or 192 rows (one to three consumer warpgroups) on sm_90a",
        ));
    }
    Ok(())
}
