//! The `occupancy` pass (sm_90a): a warp-specialised kernel with one consumer warpgroup (a
//! 64-row mma tile) is built for two CTAs per multiprocessor when their shared memory fits
//! beside each other, so one CTA's epilogue and ring start run under the other's wgmmas (the
//! overlap that two ping-ponging consumer warpgroups give a 128-row tile, across CTAs).
//!
//! Two CTAs of 256 threads share the 64K registers: 128 each at entry (`.minnctapersm 2`),
//! then the producer warpgroup gives back down to 24 and the consumer warpgroup takes 232,
//! which `setmaxnreg.inc` finds in the CTA's own pool (24 + 232 = 2 x 128). Every other kernel
//! keeps one CTA per multiprocessor.
//!
//! In: the final shared-memory plan (`tma_store`'s staging tile included) and the roles. Out:
//! [`crate::ring::Roles::ctas_per_sm`] and the register split.

use crate::diag::Diagnostic;
use crate::kernel::Kernel;
use crate::target::Target;

use super::warp_specialise::check_register_file;

/// Shared memory per multiprocessor on sm_90a (228 KiB), of which the driver reserves 1 KiB
/// per CTA.
const SMEM_PER_SM: u32 = 228 * 1024;
const SMEM_RESERVED_PER_CTA: u32 = 1024;

/// The split of two CTAs' registers: the producer warpgroup's and the consumer's targets.
const SHARED_SPLIT: (u32, u32) = (24, 232);

/// Builds one-warpgroup kernels for two CTAs per multiprocessor where they fit.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let Some(roles) = kernel.schedule.roles.as_mut() else {
        return Ok(());
    };
    let fits = 2 * (kernel.schedule.smem_bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM;
    if target != Target::Sm90a || roles.consumer_warps != 4 || !fits {
        return Ok(());
    }
    roles.ctas_per_sm = 2;
    (roles.producer_regs, roles.consumer_regs) = SHARED_SPLIT;
    let roles = *roles;
    check_register_file(kernel, &roles)
}
