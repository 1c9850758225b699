//! The `tmem` pass (sm_100a): plans the Blackwell roles, the tensor-memory accumulator and the
//! tcgen05 descriptors of a kernel's ring loop ([`crate::tmem`]).
//!
//! A ring (persistent or not: the plan's programs run per work tile) qualifies when its loop
//! carries exactly one value, the accumulator of its single mma (`acc = mma(x, y, acc)`, the
//! GEMM mainloop), which starts as zeros (the first `tcgen05.mma` of a tile overwrites instead
//! of accumulating) and has 128 rows (and at most 256 columns, the ring's), and the ring has
//! no once loads. Its epilogue warps are the kernel's (one or two warpgroups, chosen by the
//! layout pass: [`crate::tmem::epilogue`]); each warp copies its warpgroup's column block of
//! its 32 lanes, whole or chunk by chunk ([`crate::tmem::epilogue::program`]). The
//! accumulator takes the next power of 2 of its columns (at least 32) of the 512; the TMEM
//! address slot and the `acc_full` / `acc_empty` barriers go after the rest of shared memory.
//! A ring with a once load whose body is attention-shaped gets the FlashAttention-4-style
//! schedule instead ([`crate::tmem::attention`], `schedule.attention`). Any other ring is
//! reported as not implemented on sm_100a.
//!
//! A ring the `persistent` pass paired in the 2-SM form ([`crate::cluster::Pair`]) gets the
//! pair's plan ([`crate::tmem::TmemPair`]): an mma of M = 256 over both CTAs' rows, the
//! `acc_full` commit multicast to both, `acc_empty` counting both CTAs' epilogue warps, and a
//! cluster barrier before each CTA's MMA warp frees its columns.
//!
//! In: the final rings and shared-memory plan (`pipeline`, `tma_store`). Out: the same ops;
//! `schedule.tmem` or `schedule.attention` set. Leaves kernels without rings alone.

mod attention;

pub use attention::AttentionOptions;

use crate::cluster::Pair;
use crate::diag::Diagnostic;
use crate::kernel::{Const, Kernel, OpKind, ValueDef};
use crate::ring::Operand;
use crate::target::Target;
use crate::tmem::{
    ACC_ROWS, AccBar, Descriptor, Roles, TmemPair, TmemPlan, TmemStep, instruction_descriptor,
};

use super::walk::first_ring_loc;

/// Plans the ring loop's TMEM accumulator; does nothing on other targets or without rings.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    run_with(kernel, target, AttentionOptions::default())
}

/// [`run`] with the attention schedule's options.
pub fn run_with(
    kernel: &mut Kernel,
    target: Target,
    options: AttentionOptions,
) -> Result<(), Diagnostic> {
    if target != Target::Sm100a || kernel.schedule.rings.is_empty() {
        return Ok(());
    }
    if let Some(&id) = kernel.schedule.rings.keys().next()
        && attention::is_attention(kernel, id)
    {
        return attention::plan(kernel, id, options);
    }
    let loc = first_ring_loc(kernel, &kernel.schedule.rings);
    let unsupported = |why: &str| {
        Diagnostic::new(
            loc,
            format!("target sm_100a is not implemented yet for this loop: {why}"),
        )
        .note("sm_100a schedules the GEMM mainloop `acc = mma(x, y, acc)` from zeros")
        .note("compile for sm_80, which runs on Blackwell")
    };
    let (&id, ring) = kernel
        .schedule
        .rings
        .iter()
        .next()
        .ok_or_else(|| Diagnostic::internal(loc, "a ring vanished"))?;
    let op = &kernel.ops[id];
    if !ring.once.is_empty() || !super::pipeline::overlaps(kernel, id) {
        return Err(unsupported(
            "it has tiles loaded before it or reads its mma's products",
        ));
    }
    let [_, _, _, init] = op.operands[..] else {
        return Err(unsupported("it carries more than the accumulator"));
    };
    let zero = match kernel.values[init].def {
        ValueDef::Op(s, 0) if matches!(kernel.ops[s].kind, OpKind::Splat { .. }) => {
            match kernel.values[kernel.ops[s].operands[0]].def {
                ValueDef::Op(c, 0) => {
                    matches!(kernel.ops[c].kind, OpKind::Const(Const::Float(f)) if f == 0.0)
                }
                ValueDef::BlockArg { .. } | ValueDef::Op(..) => false,
            }
        }
        ValueDef::BlockArg { .. } | ValueDef::Op(..) => false,
    };
    let shape = kernel.ty(init).shape().cloned();
    let (Some(shape), true) = (shape, zero) else {
        return Err(unsupported("its accumulator does not start as zeros"));
    };
    let (m, n) = (shape.rows() as u32, shape.cols() as u32);
    let [a, b] = &ring.loads[..] else {
        return Err(unsupported("its mma does not read two staged tiles"));
    };
    if m != ACC_ROWS || a.operand != Operand::KMajorA {
        return Err(unsupported("its accumulator does not have 128 rows"));
    }
    let columns = n.next_power_of_two().max(32);
    let dtype = kernel.ty(kernel.ops[a.load].results[0]).dtype();
    // The 2-SM form's mma covers both CTAs' rows (M = 256, each TMEM its 128).
    let pair = ring.cluster.as_ref().and_then(|c| c.pair);
    let mma_m = m * pair.map_or(1, |_| crate::cluster::CTAS);
    let idesc = instruction_descriptor(dtype, mma_m, n, b.operand == Operand::MnMajorB);
    let (a, b) = (Descriptor::of(a), Descriptor::of(b));
    let slot_offset = kernel.schedule.smem_bytes.next_multiple_of(8);
    let smem_bytes = slot_offset + 24;
    if smem_bytes > super::memory_plan::SMEM_LIMIT {
        return Err(Diagnostic::new(
            loc,
            format!(
                "the TMA stage rings and the TMEM barriers need {smem_bytes} bytes of shared \
                 memory; at most {} are available",
                super::memory_plan::SMEM_LIMIT
            ),
        )
        .note("use smaller tiles or fewer pipeline stages"));
    }
    // Every epilogue warpgroup reads all 128 lanes (a warp only its 32) of its column block.
    let epilogue_warps = kernel.options.num_warps;
    let block = n / (epilogue_warps / 4).max(1);
    if !epilogue_warps.is_multiple_of(4) || block * (epilogue_warps / 4) != n {
        return Err(Diagnostic::internal(
            loc,
            format!("{epilogue_warps} epilogue warps for a {n}-column TMEM accumulator"),
        ));
    }
    let roles = Roles {
        epilogue_warps,
        producer_warp: epilogue_warps,
        mma_warp: epilogue_warps + 1,
    };
    let chunk = crate::tmem::epilogue::chunk_columns(kernel, id, n, epilogue_warps);
    let epilogue = crate::tmem::epilogue::program(block, chunk);
    let plan = TmemPlan {
        for_op: id,
        roles,
        columns,
        acc_columns: n,
        idesc,
        a,
        b,
        slot_offset,
        acc_full_offset: slot_offset + 8,
        acc_empty_offset: slot_offset + 16,
        setup: vec![
            TmemStep::Alloc { columns },
            TmemStep::Relinquish,
            TmemStep::Publish,
        ],
        // The accumulator is overwritten only once the previous tile's copy is out (a fresh
        // barrier passes parity 1 at once), and freed once the last one is.
        mma_tile: vec![
            TmemStep::Wait {
                bar: AccBar::Empty,
                start: 1,
            },
            TmemStep::FenceAfter,
            TmemStep::Mainloop,
            TmemStep::CommitAcc,
        ],
        mma_exit: vec![
            TmemStep::Wait {
                bar: AccBar::Empty,
                start: 1,
            },
            TmemStep::FenceAfter,
        ],
        epilogue,
        pair: None,
    };
    let plan = pair_plan(plan, pair);
    kernel.schedule.smem_bytes = smem_bytes;
    kernel.schedule.tmem = Some(plan);
    Ok(())
}

/// Ends the MMA warp's exit with the dealloc; in the 2-SM form a cluster barrier comes first,
/// in both CTAs (the peer's MMA warp runs only these two steps), and the `acc_full` commit
/// multicasts to the pair.
fn pair_plan(mut plan: TmemPlan, pair: Option<Pair>) -> TmemPlan {
    let dealloc = TmemStep::Dealloc {
        columns: plan.columns,
    };
    match pair {
        Some(p) => {
            let exit = [TmemStep::ClusterSync, dealloc];
            plan.mma_exit.extend(exit);
            plan.pair = Some(TmemPair {
                leader: p.leader,
                commit_mask: p.commit_mask,
                peer_exit: exit.to_vec(),
            });
        }
        None => plan.mma_exit.push(dealloc),
    }
    plan
}
