//! The `pipeline` pass (sm_90a): turns each GEMM-shaped pipelined loop into a TMA stage
//! [`Ring`] with `full`/`empty` mbarrier arrays and the producer and consumer programs
//! (see [`crate::ring`]).
//!
//! In a kernel whose mma tile has 128 rows (two consumer warpgroups of 4 warps, the count the
//! layout pass sets on sm_90a), a top-level `for` with `stages >= 2` becomes a ring when its
//! body holds exactly one accumulating `mma(x, y, acc)` whose operands are tiles loaded in the body, staged in shared
//! memory, from rank-2 `aligned16` tensors with coordinates computable for any iteration, and
//! whose shapes wgmma takes: `x` is `[64 * warpgroups, BK]` (K-major, one TMA box per 64
//! columns, swizzled by the box row's bytes), `y` is `[BK, BN]` (MN-major, one 128-B-swizzled
//! box per 64 columns) or the transpose `t.t()` of a `[BN, BK]` tile `t` (B stored
//! column-major: K-major, boxed like `x`), `BK % 16 == 0`, `BN % 64 == 0`, `BN <= 256`, and each load's column
//! coordinate a provable multiple of 8 elements (TMA's innermost coordinate must be a whole
//! number of 16-byte chunks, or the load dies with an illegal-instruction error on the H200;
//! see `kiln_runtime::TensorMap`). Any other loop keeps the
//! sm_80 cp.async lowering (the `lower` pass plans it), so tensors that are not 16-byte aligned
//! still compile. Every shared buffer is then re-placed at 1024-byte alignment (the SW128 atom),
//! and the barriers follow the buffers.
//!
//! The kernel gets a ring only when exactly one loop qualifies and every shared buffer is
//! one of its stages: the producer warpgroup exits after the ring, so no later code may
//! synchronise the whole block.
//!
//! Per iteration the producer waits on `empty` (parity from 1), announces the stage's bytes on
//! `full` and issues the boxes; the consumers wait on `full` (parity from 0), run the body's
//! wgmmas, commit, keep one group in flight and release the previous iteration's stage.

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Const, Kernel, OpId, OpKind, Param, ValueDef, ValueId};
use crate::ring::{Bar, InitStep, Operand, Ring, SWIZZLE_ATOM, Step, TmaLoad};
use crate::schedule::Layout;
use crate::target::Target;
use crate::types::DType;

use super::lower::hoistable;

/// Plans rings on sm_90a; does nothing on other targets.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if target != Target::Sm90a {
        return Ok(());
    }
    let warps = kernel.options.num_warps;
    let mut rings = BTreeMap::new();
    for &id in &kernel.body.ops {
        if let Some(ring) = plan_loop(kernel, id, warps) {
            rings.insert(id, ring);
        }
    }
    // The producer warpgroup exits after its ring, so the kernel may have one ring and no
    // other shared-memory tile (whose cp.async path synchronises all threads with bar.sync).
    let ring_loads = rings.values().map(|r| r.loads.len()).sum::<usize>();
    if rings.len() != 1 || ring_loads != kernel.schedule.buffers.len() {
        return Ok(());
    }
    // Re-place every buffer on the swizzle atom, ring loads at their stride.
    let stride = |l: &TmaLoad| (l.load, l.stage_stride);
    let strides: BTreeMap<OpId, u32> = rings
        .values()
        .flat_map(|r: &Ring| r.loads.iter().map(stride))
        .collect();
    let mut offset = 0u32;
    let mut offsets = BTreeMap::new();
    for b in &mut kernel.schedule.buffers {
        b.offset = offset;
        let per_stage = strides
            .get(&b.load)
            .copied()
            .unwrap_or(b.stage_bytes.next_multiple_of(SWIZZLE_ATOM));
        offsets.insert(b.load, offset);
        offset += per_stage * b.stages;
        offset = offset.next_multiple_of(SWIZZLE_ATOM);
    }
    for ring in rings.values_mut() {
        for l in &mut ring.loads {
            l.offset = offsets.get(&l.load).copied().unwrap_or_default();
        }
        ring.full_offset = offset;
        ring.empty_offset = offset + 8 * ring.stages;
        offset += 16 * ring.stages;
    }
    if offset > super::memory_plan::SMEM_LIMIT {
        let loc = rings
            .keys()
            .next()
            .map(|&f| kernel.ops[f].loc)
            .unwrap_or_default();
        return Err(Diagnostic::new(
            loc,
            format!(
                "the TMA stage rings need {offset} bytes of shared memory; at most {} are available",
                super::memory_plan::SMEM_LIMIT
            ),
        )
        .note("use smaller tiles or fewer pipeline stages"));
    }
    kernel.schedule.smem_bytes = offset;
    kernel.schedule.rings = rings;
    Ok(())
}

/// The ring of loop `id`, when it has the shape described in the module doc.
fn plan_loop(kernel: &Kernel, id: OpId, warps: u32) -> Option<Ring> {
    let OpKind::For {
        stages: Some(stages),
    } = kernel.ops[id].kind
    else {
        return None;
    };
    // Two consumer warpgroups plus the producer: the 384-thread block whose register split
    // (entry 168, then 40 / 232) ptx-notes §5 verified on the H200.
    if stages < 2 || warps != 8 {
        return None;
    }
    let body = &kernel.ops[id].regions[0];
    let inside: BTreeSet<OpId> = body.ops.iter().copied().collect();
    let staged: Vec<OpId> = body
        .ops
        .iter()
        .copied()
        .filter(|&o| kernel.schedule.buffer(o).is_some())
        .collect();
    let mmas: Vec<OpId> = body
        .ops
        .iter()
        .copied()
        .filter(|&o| kernel.ops[o].kind == OpKind::Mma)
        .collect();
    let [mma] = mmas[..] else { return None };
    let mma_op = &kernel.ops[mma];
    if mma_op.operands.len() != 3 {
        return None;
    }
    let def = |v| match kernel.values[v].def {
        ValueDef::Op(o, 0) if staged.contains(&o) => Some(o),
        _ => None,
    };
    // B is a staged tile (`[BK, BN]`, MN-major) or the transposed view of one (`[BN, BK]`
    // stored, K-major).
    let b_view = mma_op.operands[1];
    let (b, b_k_major) = match kernel.values[b_view].def {
        ValueDef::Op(t, 0) if kernel.ops[t].kind == OpKind::Transpose && inside.contains(&t) => {
            (def(kernel.ops[t].operands[0])?, true)
        }
        _ => (def(b_view)?, false),
    };
    let a = def(mma_op.operands[0])?;
    if staged.len() != 2 {
        return None;
    }
    let a_shape = kernel.ty(mma_op.operands[0]).shape()?.clone();
    let b_shape = kernel.ty(mma_op.operands[1]).shape()?.clone();
    let (bm, bk, bn) = (
        a_shape.rows() as u32,
        a_shape.cols() as u32,
        b_shape.cols() as u32,
    );
    let dtype = kernel.ty(mma_op.operands[0]).dtype();
    let wgmma_shape = bm == 16 * warps
        && bk.is_multiple_of(16)
        && (bk * 2 == 32 || bk * 2 == 64 || bk.is_multiple_of(64))
        && bn.is_multiple_of(64)
        && bn <= 256;
    let wgmma_layout = matches!(
        kernel.schedule.layouts.get(&mma_op.results[0]),
        Some(Layout::Mma { warps: [8, 1] })
    );
    if !wgmma_shape || !wgmma_layout || !matches!(dtype, DType::Bf16 | DType::F16) {
        return None;
    }
    let tma_ok = |l: OpId| {
        let OpKind::Load { tensor, ref shape } = kernel.ops[l].kind else {
            return false;
        };
        let aligned = matches!(
            kernel.params.get(tensor),
            Some(Param::Tensor {
                rank: 2,
                aligned16: true,
                ..
            })
        );
        aligned
            && shape.rank() == 2
            && kernel.ops[l]
                .operands
                .get(1)
                .is_some_and(|&c| known_multiple(kernel, c).is_multiple_of(8))
            && kernel.ops[l]
                .operands
                .iter()
                .all(|&c| hoistable(kernel, c, id, &inside))
    };
    if !tma_ok(a) || !tma_ok(b) {
        return None;
    }
    let param = |l: OpId| match kernel.ops[l].kind {
        OpKind::Load { tensor, .. } => tensor,
        _ => 0,
    };
    let a_load = TmaLoad::k_major(a, param(a), Operand::KMajorA, bm, bk);
    let b_load = if b_k_major {
        TmaLoad::k_major(b, param(b), Operand::KMajorB, bn, bk)
    } else {
        TmaLoad::mn_major_b(b, param(b), bk, bn)
    };
    let bytes = a_load.tile_bytes() + b_load.tile_bytes();
    Some(Ring {
        for_op: id,
        stages,
        loads: vec![a_load, b_load],
        full_offset: 0,
        empty_offset: 0,
        full_count: 1,
        empty_count: warps,
        init: vec![
            InitStep::InitBarriers,
            InitStep::FenceMbarrierInit,
            InitStep::BarSync,
        ],
        producer: vec![
            Step::Wait {
                bar: Bar::Empty,
                start: 1,
            },
            Step::ArriveExpectTx {
                bar: Bar::Full,
                bytes,
            },
            Step::Tma { load: 0 },
            Step::Tma { load: 1 },
        ],
        consumer: vec![
            Step::Wait {
                bar: Bar::Full,
                start: 0,
            },
            Step::Mma,
            Step::Commit,
            Step::WaitGroup(1),
            Step::Arrive {
                bar: Bar::Empty,
                lag: 1,
            },
        ],
        consumer_drain: vec![Step::WaitGroup(0)],
    })
}

/// On sm_90a, every `mma` must sit in a ring unless some tensor is not 16-byte aligned (TMA
/// needs 16-byte strides; such kernels keep the sm_80 cp.async + mma.sync lowering).
pub fn check_covered(kernel: &Kernel) -> Result<(), Diagnostic> {
    let all_aligned = kernel.params.iter().all(|p| match p {
        Param::Tensor { aligned16, .. } => *aligned16,
        Param::Scalar { .. } => true,
    });
    if !all_aligned {
        return Ok(());
    }
    let in_ring: BTreeSet<OpId> = kernel
        .schedule
        .rings
        .keys()
        .flat_map(|&f| kernel.ops[f].regions[0].ops.iter().copied())
        .collect();
    let stray = super::walk::ops_in_order(kernel)
        .into_iter()
        .find(|&o| kernel.ops[o].kind == OpKind::Mma && !in_ring.contains(&o));
    match stray {
        None => Ok(()),
        Some(o) => Err(Diagnostic::new(
            kernel.ops[o].loc,
            "target sm_90a is not implemented yet for this kernel: only an accumulating mma \
             of two TMA-loaded tiles in a top-level pipelined loop is scheduled",
        )
        .note(
            "sm_90a needs `x: [128, BK]` (two consumer warpgroups), BK a multiple of 16 (16, \
             32 or a multiple of 64), `y: [BK, BN]` with BN a multiple of 64 up to 256, and \
             tile column coordinates that are multiples of 8 elements",
        )
        .note("compile for sm_80, which runs on Hopper")),
    }
}

/// A number that statically divides scalar `v` (1 when nothing is known; zero divides by
/// anything, capped at 2^16).
fn known_multiple(kernel: &Kernel, v: ValueId) -> u32 {
    const ANY: u32 = 1 << 16;
    match kernel.values[v].def {
        ValueDef::Op(op, _) => {
            let o = &kernel.ops[op];
            match &o.kind {
                OpKind::Const(Const::Int(0)) => ANY,
                OpKind::Const(Const::Int(c)) => c.unsigned_abs().min(u64::from(ANY)) as u32,
                OpKind::Binary(BinaryOp::Mul) => known_multiple(kernel, o.operands[0])
                    .saturating_mul(known_multiple(kernel, o.operands[1]))
                    .min(ANY),
                OpKind::Binary(BinaryOp::Add | BinaryOp::Sub) => gcd(
                    known_multiple(kernel, o.operands[0]),
                    known_multiple(kernel, o.operands[1]),
                ),
                _ => 1,
            }
        }
        ValueDef::BlockArg { op, index: 0, .. }
            if matches!(kernel.ops[op].kind, OpKind::For { .. }) =>
        {
            let o = &kernel.ops[op];
            gcd(
                known_multiple(kernel, o.operands[0]),
                known_multiple(kernel, o.operands[2]),
            )
        }
        ValueDef::BlockArg { .. } => 1,
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}
