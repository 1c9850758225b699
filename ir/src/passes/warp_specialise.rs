//! The `warp_specialise` pass (sm_90a): when the kernel has stage rings, splits the block into
//! the kernel's warps as consumers (whole warpgroups, threads `0..32 * num_warps`, so every
//! register layout keeps its thread mapping) and one producer warpgroup after them, whose
//! elected thread issues the TMA loads. Registers move from the producer to the consumers with
//! `setmaxnreg` ([`register_split`]); the split is checked against the 64K-register file.

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::ring::Roles;
use crate::target::Target;

use super::walk::first_ring_loc;

/// Registers per multiprocessor on sm_90a.
pub const REGISTER_FILE: u32 = 65536;

/// Warps of the producer warpgroup.
const PRODUCER_WARPS: u32 = 4;

/// Records the warp roles; does nothing without rings.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a || kernel.schedule.rings.is_empty() {
        return Ok(());
    }
    let consumer_warps = kernel.options.num_warps;
    let (producer_regs, consumer_regs) = register_split(false, consumer_warps);
    let roles = Roles {
        consumer_warps,
        producer_warps: PRODUCER_WARPS,
        producer_regs,
        consumer_regs,
        ctas_per_sm: 1,
    };
    check_register_file(kernel, &roles)?;
    kernel.schedule.roles = Some(roles);
    Ok(())
}

/// The `setmaxnreg` targets of the producer warpgroup and of each of `consumer_warps`'
/// warpgroups (one to three): CUTLASS's 40 / 232, or 24 / 240 for the `overlap` pass's deeper
/// schedule (`rotated`), which keeps more of the consumers' values live (ptx-notes §5); with
/// three consumer warpgroups each gets what the block's registers leave them, a multiple of 8
/// as `setmaxnreg` takes (160 rotated, FlashAttention-3's count for its three warpgroups).
pub fn register_split(rotated: bool, consumer_warps: u32) -> (u32, u32) {
    let (producer, most) = if rotated { (24, 240) } else { (40, 232) };
    let warps = PRODUCER_WARPS + consumer_warps;
    let left = warps * entry_regs(32 * warps, 1) - PRODUCER_WARPS * producer;
    (producer, most.min(left / consumer_warps.max(1) / 8 * 8))
}

/// Registers each thread of a block of `threads` gets at launch when `ctas_per_sm` blocks
/// share the register file: a multiple of 8, as ptxas allocates them.
pub fn entry_regs(threads: u32, ctas_per_sm: u32) -> u32 {
    REGISTER_FILE / ctas_per_sm.max(1) / threads.max(1) / 8 * 8
}

/// Checks that `roles`' register split fits the registers the block holds from launch:
/// `setmaxnreg.inc` takes only what the block's own warps gave back with `setmaxnreg.dec`, so a
/// split larger than `threads x` [`entry_regs`] leaves the consumers waiting for ever.
pub fn check_register_file(kernel: &Kernel, roles: &Roles) -> Result<(), Diagnostic> {
    let need = 32
        * (roles.consumer_warps * roles.consumer_regs + roles.producer_warps * roles.producer_regs);
    let pool = roles.threads() * entry_regs(roles.threads(), roles.ctas_per_sm);
    if need > pool {
        return Err(Diagnostic::new(
            first_ring_loc(kernel, &kernel.schedule.rings),
            format!(
                "{} consumer warps at {} registers and a producer warpgroup at {} need {need} \
                 registers; a block of {} threads at {} CTA(s) per multiprocessor holds {pool}",
                roles.consumer_warps,
                roles.consumer_regs,
                roles.producer_regs,
                roles.threads(),
                roles.ctas_per_sm
            ),
        )
        .note(
            "use an mma tile of 64, 128 or 192 rows (one to three consumer warpgroups) on sm_90a",
        ));
    }
    Ok(())
}
