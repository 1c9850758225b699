//! The `lower` pass: target-specific lowering plans (which loads a loop issues ahead, which
//! mma operands go through shared memory, which mmas run on which instruction, which whole-tile
//! f32 atomic adds go through shared memory and bulk reductions), recorded in
//! `kernel.schedule`. Rewrites no op.

use std::collections::BTreeSet;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind};
use crate::schedule::{Layout, LoopPlan, Scratch};
use crate::target::Target;
use crate::types::Shape;

use super::walk::{all_aligned16, hoistable, ops_in_order};

/// Records the lowering plans of `target`; fails for targets without a backend.
///
/// sm_80: for every `for` with `stages = Some(n)`, records in `kernel.schedule.loops` which
/// loads of its body (those staged in shared memory, with coordinates computed from the
/// induction variable and values defined before the loop) the writer issues `n - 1`
/// iterations ahead as cp.async groups (a loop without mma holds the plan `prefetch` gave
/// it), and which register mma operands are read through
/// shared memory ([`super::mma_operands`]). sm_90a: the same, except for the loop the
/// `pipeline` pass scheduled as a TMA ring; a kernel with an mma it did not take (an mma
/// outside any loop, in a nested or unpipelined loop, in a second mma loop, with operands
/// wgmma does not read from a ring) is lowered the sm_80 way (mma.sync, cp.async), with a
/// note saying why ([`crate::schedule::Note`]); its mmas whose shapes and operands wgmma
/// reads run on wgmma without warp roles ([`super::wgmma_plain`]), each other one is noted.
/// sm_100a: a kernel whose `mma`s are not all in rings (which the `tmem` pass lowers to
/// tcgen05.mma) is reported as not implemented unless a tensor is not 16-byte aligned (then
/// the sm_80 lowering is the documented fallback).
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target == Target::Sm100a {
        check_covered(kernel, target)?;
    }
    super::accumulators::check(kernel)?;
    let ring: BTreeSet<OpId> = match &kernel.schedule.sched {
        Some(s) => super::walk::ops_in_block_regions(kernel, s.for_op)
            .into_iter()
            .collect(),
        None => BTreeSet::new(),
    };
    super::mma_operands::plan(kernel, &ring)?;
    if target == Target::Sm90a {
        let first_note = kernel.schedule.notes.len();
        super::wgmma_plain::plan(kernel, &ring);
        note_plain_lowering(kernel, first_note);
    }
    // The `persistent` pass clusters the rings that can be; a request it did not meet (no
    // ring, or a target without the pass) is reported here.
    let clustered = kernel
        .schedule
        .sched
        .as_ref()
        .is_some_and(|s| s.cluster.is_some());
    if kernel.options.cluster > 1 && !clustered {
        return Err(Diagnostic::new(
            kernel.options.cluster_loc,
            format!(
                "this kernel cannot run in clusters of {} on {target}: only a persistent \
                 sm_90a or sm_100a GEMM-shaped TMA ring is clustered",
                kernel.options.cluster
            ),
        )
        .note("ask for `cluster(1)`, or leave clusters to the autotuner, which skips this"));
    }
    place_scratch(kernel, target)?;
    super::bulk_add::plan(kernel, target)?;
    super::consumer_barriers::plan(kernel, target);
    // The loops without mma already hold their plans (`prefetch`).
    let mut loops = std::mem::take(&mut kernel.schedule.loops);
    for id in ops_in_order(kernel) {
        let OpKind::For { stages: Some(n) } = kernel.ops[id].kind else {
            continue;
        };
        if kernel
            .schedule
            .sched
            .as_ref()
            .is_some_and(|s| s.for_op == id)
        {
            continue;
        }
        if n < 2 {
            continue;
        }
        let body = &kernel.ops[id].regions[0];
        let inside: BTreeSet<OpId> = body.ops.iter().copied().collect();
        let prefetched: Vec<OpId> = body
            .ops
            .iter()
            .copied()
            .filter(|&l| {
                kernel.schedule.buffer(l).is_some()
                    && super::staged_load::of(kernel, l).is_some_and(|s| {
                        s.scalars()
                            .iter()
                            .all(|&c| hoistable(kernel, c, id, &inside))
                    })
            })
            .collect();
        if !prefetched.is_empty() {
            loops.insert(
                id,
                LoopPlan {
                    stages: n,
                    prefetched,
                },
            );
        }
    }
    kernel.schedule.loops = loops;
    Ok(())
}

/// sm_90a: when a kernel with tensors TMA could read has an mma but no ring, a note at its
/// first mma saying why it is lowered without warp roles (and how), placed at `at`, before
/// the notes of its mmas.
fn note_plain_lowering(kernel: &mut Kernel, at: usize) {
    if !all_aligned16(kernel) || kernel.schedule.sched.is_some() {
        return;
    }
    let order = ops_in_order(kernel);
    let Some(&first) = order.iter().find(|&&o| kernel.ops[o].kind == OpKind::Mma) else {
        return;
    };
    let how = if kernel.schedule.wgmma.is_empty() {
        "mma.sync and cp.async"
    } else {
        "cp.async and wgmma issued by every warpgroup (no warp roles)"
    };
    let text = format!(
        "sm_90a: lowered with {how}, not the warp-specialised wgmma schedule: {}",
        why_no_ring(kernel, first)
    );
    let loc = kernel.ops[first].loc;
    let at = at.min(kernel.schedule.notes.len());
    kernel
        .schedule
        .notes
        .insert(at, crate::schedule::Note { loc, text });
}

/// Why the `pipeline` pass gave the kernel of `mma` no ring, as far as its structure tells.
fn why_no_ring(kernel: &Kernel, mma: OpId) -> String {
    if !kernel.options.warp_specialize {
        return "the kernel turned it off (`warp_specialize(false)`)".to_string();
    }
    let top = kernel
        .body
        .ops
        .iter()
        .copied()
        .find(|&o| o == mma || super::walk::ops_in_block_regions(kernel, o).contains(&mma));
    let mma_loops = kernel
        .body
        .ops
        .iter()
        .filter(|&&o| {
            matches!(kernel.ops[o].kind, OpKind::For { .. })
                && super::walk::ops_in_block_regions(kernel, o)
                    .iter()
                    .any(|&i| kernel.ops[i].kind == OpKind::Mma)
        })
        .count();
    let mmas_outside = |f: OpId| {
        let inside = super::walk::ops_in_block_regions(kernel, f);
        ops_in_order(kernel)
            .into_iter()
            .any(|o| kernel.ops[o].kind == OpKind::Mma && !inside.contains(&o))
    };
    match top.map(|t| (t, &kernel.ops[t].kind)) {
        Some((t, _)) if t == mma => "the mma is outside any loop".into(),
        Some((_, OpKind::For { stages: Some(n) })) if *n >= 2 && mma_loops > 1 => format!(
            "the kernel has {mma_loops} loops with mmas; the warp-specialised schedule takes one"
        ),
        Some((t, OpKind::For { stages: Some(n) })) if *n >= 2 && mmas_outside(t) => {
            "the kernel has an mma outside its pipelined loop".into()
        }
        Some((t, OpKind::For { stages: Some(n) }))
            if *n >= 2 && !kernel.ops[t].regions[0].ops.contains(&mma) =>
        {
            "the mma is in a loop or `if` nested in the pipelined loop".into()
        }
        Some((_, OpKind::For { stages: Some(n) })) if *n >= 2 => {
            "its operands or shapes are not what wgmma reads from a TMA ring (A and B tiles \
             loaded in the loop, B possibly transposed, or A in registers in the accumulator \
             layout; 64, 128 or 192 rows; K and N multiples of 16, N at most 256; column \
             coordinates multiples of 8)"
                .into()
        }
        Some((_, OpKind::For { .. })) => {
            "its top-level loop is not `pipelined` with 2 or more stages (a persistent or \
             strided loop around the pipelined one included)"
                .into()
        }
        _ => "the mma is inside an `if`".into(),
    }
}

/// On sm_100a, every `mma` must sit in a ring unless some tensor is not 16-byte aligned (TMA
/// needs 16-byte strides; such kernels keep the sm_80 cp.async + mma.sync lowering).
fn check_covered(kernel: &Kernel, target: Target) -> Result<(), Diagnostic> {
    if !all_aligned16(kernel) {
        return Ok(());
    }
    let in_ring: BTreeSet<OpId> = kernel
        .schedule
        .sched
        .iter()
        .flat_map(|s| kernel.ops[s.for_op].regions[0].ops.iter().copied())
        .collect();
    let stray = super::walk::ops_in_order(kernel)
        .into_iter()
        .find(|&o| kernel.ops[o].kind == OpKind::Mma && !in_ring.contains(&o));
    match stray {
        None => Ok(()),
        Some(o) => Err(Diagnostic::unsupported(
            kernel.ops[o].loc,
            format!(
                "target {target} is not implemented yet for this kernel: only an accumulating \
                 mma of two TMA-loaded tiles in a top-level pipelined loop is scheduled"
            ),
        )
        .note(if target == Target::Sm100a {
            "sm_100a needs `x: [128, BK]` (one tcgen05 accumulator in the 128 TMEM lanes), BK \
             a multiple of 16, `y: [BK, BN]` with BN a multiple of 16 up to 256, and tile \
             column coordinates that are multiples of 8 elements"
        } else {
            "sm_90a needs `x: [BM, BK]` with BM 64, 128 or 192 (one to three consumer \
             warpgroups), BK a multiple of 16, `y: [BK, BN]` with BN a multiple of 16 up to \
             256, and tile column coordinates that are multiples of 8 elements"
        })
        .note(if target == Target::Sm100a {
            "compile for sm_80, which runs on Blackwell"
        } else {
            "compile for sm_80, which runs on Hopper"
        })),
    }
}

/// Whether reshape `op` leaves every element in the register it was in (a view that adds
/// or removes extents of 1, or a reshape between layouts that agree): it exchanges nothing.
/// The PTX writer moves the elements of any other through the scratch region.
pub fn reshape_is_free(kernel: &Kernel, op: &crate::kernel::Op) -> bool {
    let (x, r) = (op.operands[0], op.results[0]);
    if super::layout::is_view(kernel, op) {
        return true;
    }
    let (Some(xs), Some(rs)) = (kernel.ty(x).shape(), kernel.ty(r).shape()) else {
        return true;
    };
    match (kernel.distribution(x), kernel.distribution(r)) {
        (Ok(a), Ok(b)) => a.same_elements(xs, &b, rs),
        _ => false,
    }
}

/// Whether transpose `op` moves a register tile's elements between threads (the PTX writer
/// exchanges them through the scratch region): its operand is not in shared memory (the
/// transposed view of a staged load), its result not staged for `mma`, and its result's
/// layout not the view of its operand's ([`Layout::transposed`]).
pub fn transpose_moves(kernel: &Kernel, op: &crate::kernel::Op) -> bool {
    let (x, r) = (op.operands[0], op.results[0]);
    let layouts = &kernel.schedule.layouts;
    let shared = layouts.get(&x).is_some_and(Layout::is_shared);
    let view = layouts
        .get(&x)
        .is_some_and(|l| layouts.get(&r) == Some(&l.transposed()));
    !shared && !view && kernel.schedule.staged(r).is_none()
}

/// The largest exchange the scratch region's second slot takes ([`Scratch::small`]): a
/// reduction's partials or a few rows, which a barrier would otherwise separate from the
/// exchange before; a tile changing layout takes the first.
pub const SMALL_EXCHANGE_BYTES: u32 = 2048;

/// Places the shared scratch region that tiles changing layout (`convert`) and reductions
/// across warps exchange elements through: after every other buffer, as large as the
/// largest exchange, with a second slot for the small ones ([`Scratch`]). Role-specialised
/// kernels have no block-wide barrier to order it, so a conversion in one is reported at the
/// user's op.
fn place_scratch(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let (mut bytes, mut small) = (0u32, 0u32);
    let mut first = None;
    for id in ops_in_order(kernel) {
        let op = &kernel.ops[id];
        let need = match op.kind {
            // `take` writes its whole operand there, as a conversion does.
            OpKind::Take { .. } => {
                let ty = kernel.ty(op.operands[0]);
                let elems = ty.shape().map_or(1, Shape::numel);
                elems as u32 * ty.dtype().size_bytes() as u32
            }
            // A general reshape whose elements stay in their registers moves nothing.
            OpKind::Reshape { .. } if reshape_is_free(kernel, op) => continue,
            OpKind::Transpose if !transpose_moves(kernel, op) => continue,
            OpKind::Convert
            | OpKind::Permute { .. }
            | OpKind::Reshape { .. }
            | OpKind::Transpose => {
                let ty = kernel.ty(op.results[0]);
                let elems = ty.shape().map_or(1, Shape::numel);
                elems as u32 * ty.dtype().size_bytes() as u32
            }
            OpKind::Reduce { dim, .. } => {
                let Ok(d) = kernel.distribution(op.operands[0]) else {
                    continue;
                };
                let warps: u32 = match d.reduction_stages(dim) {
                    Some((_, w)) => w.iter().map(|t| t.modulo).product(),
                    None => 1,
                };
                if warps <= 1 {
                    continue;
                }
                let ty = kernel.ty(op.results[0]);
                let elems = ty.shape().map_or(1, Shape::numel);
                // 16-bit floats meet as their f32 partial sums.
                warps * elems as u32 * ty.dtype().size_bytes().max(4) as u32
            }
            // The one thread that applies it hands the old value to the others.
            OpKind::ScalarAtomic { .. } => 4,
            _ => continue,
        };
        first.get_or_insert(id);
        bytes = bytes.max(need);
        if need <= SMALL_EXCHANGE_BYTES {
            small = small.max(need);
        }
    }
    let Some(first) = first else {
        kernel.schedule.scratch = None;
        return Ok(());
    };
    let loc = kernel.ops[first].loc;
    if kernel.schedule.sched.is_some() {
        if let OpKind::ScalarAtomic { .. } = kernel.ops[first].kind {
            return Err(Diagnostic::new(
                loc,
                format!(
                    "on {target}, this warp-specialised kernel cannot apply a scalar atomic \
                     once for the whole block here"
                ),
            )
            .note("apply it after the kernel's main loop, or compile for sm_80"));
        }
        return Err(Diagnostic::new(
            loc,
            format!(
                "on {target}, this warp-specialised kernel cannot move a tile between threads \
                 here (a layout change or a reduction across warps)"
            ),
        )
        .note("compute this value in the layout the loop produces it in, or compile for sm_80"));
    }
    let offset = kernel.schedule.smem_bytes.next_multiple_of(128);
    let scratch = Scratch {
        offset,
        bytes,
        small,
    };
    let total = offset + scratch.total_bytes();
    super::memory_plan::check_smem(
        loc,
        total,
        "the kernel's shared buffers and the exchange of this tile between threads",
        "use smaller tiles",
    )?;
    kernel.schedule.scratch = Some(scratch);
    kernel.schedule.smem_bytes = total;
    Ok(())
}
