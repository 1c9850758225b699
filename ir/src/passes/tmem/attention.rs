//! The `tmem` pass's attention schedule ([`crate::tmem::attention`]): a persistent ring with
//! one once load (Q) whose body the `overlap` analysis finds attention-shaped (head mma,
//! code between, rescale, tail mma into a carried accumulator).
//!
//! A CTA runs two work tiles along x over one walk of the key blocks, from the earlier of
//! their starts to the later of their ends, so the loop's step may not depend on
//! `block_id().x`, and its start only with a step of 1.
//!
//! It checks what the schedule needs and says why where it cannot: both mmas have 128 rows,
//! Q and K are K-major and V MN-major, the key block is 32, 64 or 128 keys (one `tcgen05.ld`
//! of a score row) and the head dimension a multiple of 32 (the correction's copies), and
//! both Q tiles' `S` and `O` fit TMEM's 512 columns (d = 256 does not: `2 x (256 + 64) =
//! 640`). Then it places Q tile 1, the TMEM address slot, the schedule's barriers and the
//! rescale factors after the rest of shared memory, and the epilogue store's staging tile
//! (planned by `tma_store` for one 128-thread epilogue) once per softmax warpgroup after
//! them, each with its own named barrier, in as few rounds as fit; where none fits, the
//! stores stay register stores.

use crate::diag::Diagnostic;
use crate::kernel::{Axis, Const, Kernel, Loc, OpId, OpKind, ValueDef, ValueId};
use crate::ring::{Operand, SWIZZLE_ATOM};
use crate::tma_store::TmaStore;
use crate::tmem::attention::{
    AttentionPlan, AttentionRoles, AttnBar, Programs, Q_TILES, RESCALE_COLUMNS, TileColumns,
    WARPGROUP_WARPS,
};
use crate::tmem::{ACC_ROWS, Descriptor, TMEM_COLUMNS, instruction_descriptor};

/// Pass options of the attention schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionOptions {
    /// The share of the score tile's exponentials computed by the FMA polynomial
    /// ([`crate::tmem::exp2`]): columns `c` with `c % den < num` (`(0, 1)`: none).
    pub poly_exp2_share: (u32, u32),
}

impl Default for AttentionOptions {
    /// One column in four on the FMA pipes, three on the MUFU: FlashAttention-4 emulates a
    /// similar fraction, enough to take the exponentials off the MUFU's critical path.
    fn default() -> Self {
        AttentionOptions {
            poly_exp2_share: (1, 4),
        }
    }
}

/// `setmaxnreg` of the softmax, correction and last warpgroups: `128 * (2 * 192 + 80 + 48)`
/// is the whole register file; a softmax thread holds a score row (up to 128 f32) and its
/// output row after the loop, a correction thread 32 columns of `O`.
const REGS: [u32; 3] = [192, 80, 48];

/// Whether ring loop `id` is attention-shaped (see the module doc).
pub(super) fn is_attention(kernel: &Kernel, id: OpId) -> bool {
    kernel.schedule.rings[&id].once.len() == 1 && super::super::overlap::plan(kernel, id).is_some()
}

/// Plans the attention schedule of ring loop `id`.
pub(super) fn plan(
    kernel: &mut Kernel,
    id: OpId,
    options: AttentionOptions,
) -> Result<(), Diagnostic> {
    let loc = kernel.ops[id].loc;
    let ring = kernel.schedule.rings[&id].clone();
    let overlap = super::super::overlap::plan(kernel, id)
        .ok_or_else(|| Diagnostic::internal(loc, "an attention loop lost its shape"))?;
    let unsupported = |why: String| {
        Diagnostic::new(
            loc,
            format!("target sm_100a cannot schedule this attention loop: {why}"),
        )
        .note("compile for sm_80 or sm_90a")
    };
    if overlap.rescale.is_none() {
        return Err(unsupported(
            "its accumulator is not rescaled by a factor of the code between the mmas".into(),
        ));
    }
    if kernel.schedule.tiles.is_none() || !ring.persistent {
        return Err(unsupported(
            "it is not persistent (its CTAs walk pairs of query tiles)".into(),
        ));
    }
    // Both query tiles of a CTA walk one sequence of key blocks, from the earlier start to the
    // later end (each runs the blocks outside its own range as no-ops): the step must be the
    // same for both, and where the starts differ, 1 (so both ranges lie on the walk).
    let [lo, _, step, ..] = kernel.ops[id].operands[..] else {
        return Err(Diagnostic::internal(loc, "a ring loop without bounds"));
    };
    let unit_step = matches!(kernel.values[step].def, ValueDef::Op(c, 0)
        if kernel.ops[c].kind == OpKind::Const(Const::Int(1)));
    if reads_block_x(kernel, step) || (reads_block_x(kernel, lo) && !unit_step) {
        return Err(unsupported(
            "its step depends on the query block (`block_id().x`), or its first key block does \
             and the step is not 1; the two query tiles of a CTA share one walk over the key \
             blocks"
                .into(),
        ));
    }
    let (s_shape, o_shape) = (shape(kernel, overlap.head), shape(kernel, overlap.tail));
    let (Some((m, block_n)), Some((mo, d))) = (s_shape, o_shape) else {
        return Err(Diagnostic::internal(
            loc,
            "an attention mma without a shape",
        ));
    };
    let [q] = &ring.once[..] else {
        return Err(Diagnostic::internal(loc, "an attention ring without its Q"));
    };
    let [k, v] = &ring.loads[..] else {
        return Err(unsupported("its body stages more than K and V".into()));
    };
    if m != ACC_ROWS || mo != ACC_ROWS {
        return Err(unsupported(format!(
            "its query tile has {m} rows; tcgen05.mma's accumulator has {ACC_ROWS}"
        )));
    }
    if (q.operand, k.operand, v.operand) != (Operand::KMajorA, Operand::KMajorB, Operand::MnMajorB)
    {
        return Err(unsupported(
            "its scores are not `Q K^T` from row-major Q and K, or its output not `P V` from \
             a row-major V"
                .into(),
        ));
    }
    if ![32, 64, 128].contains(&block_n) {
        return Err(unsupported(format!(
            "its key block is {block_n}; a softmax thread copies its score row with one \
             tcgen05.ld of 32, 64 or 128 columns"
        )));
    }
    if d % RESCALE_COLUMNS != 0 {
        return Err(unsupported(format!(
            "its head dimension {d} is not a multiple of {RESCALE_COLUMNS} (the correction \
             rescales O in copies of {RESCALE_COLUMNS} columns)"
        )));
    }
    let needed = Q_TILES * (d + block_n);
    if needed > TMEM_COLUMNS {
        return Err(unsupported(format!(
            "its two query tiles need {Q_TILES} x ({d} + {block_n}) = {needed} TMEM columns \
             (O and S of each); a CTA has {TMEM_COLUMNS}"
        ))
        .note("a smaller key block (`block_n`) does not help at d = 256: O alone takes 256 columns a tile"));
    }
    let dtype = kernel.ty(kernel.ops[q.load].results[0]).dtype();
    let p_dtype = kernel.ty(kernel.ops[overlap.tail].operands[0]).dtype();
    if p_dtype != dtype {
        return Err(unsupported(format!(
            "its P is {p_dtype:?} but Q, K and V are {dtype:?}; one tcgen05.mma kind reads both"
        )));
    }
    // Each softmax warpgroup stores its own tile: the `tma_store` pass planned one staging
    // tile; take it out, place the rest, and give each warpgroup its own after everything.
    let store = kernel.schedule.tma_stores.values().next().cloned();
    kernel.schedule.tma_stores.clear();
    super::super::pipeline::place(kernel)?;
    let q_bytes = q.tile_bytes();
    let q1_offset = kernel.schedule.smem_bytes.next_multiple_of(SWIZZLE_ATOM);
    let slot_offset = q1_offset + q.stage_stride.max(q_bytes.next_multiple_of(SWIZZLE_ATOM));
    let bars_offset = slot_offset + 8;
    let scale_offset = bars_offset + 8 * AttnBar::all().len() as u32;
    let mut smem_bytes = scale_offset + Q_TILES * ACC_ROWS * 4;
    check_smem(loc, smem_bytes)?;
    let stores = store
        .and_then(|st| staging(st, smem_bytes))
        .unwrap_or_default();
    if let Some(st) = stores.first() {
        kernel.schedule.tma_stores.insert(st.store, st.clone());
    }
    if let Some(last) = stores.last() {
        smem_bytes = last.offset + last.bytes();
    }
    let columns = TMEM_COLUMNS.min(needed.next_power_of_two());
    let tiles = (0..Q_TILES)
        .map(|g| TileColumns {
            o: g * d,
            s: Q_TILES * d + g * block_n,
        })
        .collect();
    let p = Programs::new(columns, d, Q_TILES * q_bytes);
    kernel.schedule.smem_bytes = smem_bytes;
    kernel.schedule.attention = Some(AttentionPlan {
        for_op: id,
        roles: AttentionRoles {
            softmax_warps: WARPGROUP_WARPS,
            correction_warp: Q_TILES * WARPGROUP_WARPS,
            load_warp: (Q_TILES + 1) * WARPGROUP_WARPS,
            mma_warp: (Q_TILES + 1) * WARPGROUP_WARPS + 1,
            warps: (Q_TILES + 2) * WARPGROUP_WARPS,
            regs: REGS,
        },
        columns,
        d,
        block_n,
        tiles,
        s_idesc: instruction_descriptor(dtype, ACC_ROWS, block_n, false),
        o_idesc: instruction_descriptor(dtype, ACC_ROWS, d, true),
        q: Descriptor::of(q),
        k: Descriptor::of(k),
        v: Descriptor::of(v),
        q1_offset,
        slot_offset,
        bars_offset,
        scale_offset,
        stores,
        poly_share: options.poly_exp2_share,
        setup: p.setup,
        load_tile: p.load_tile,
        load_iteration: p.load_iteration,
        mma_tile: p.mma_tile,
        mma_iteration: p.mma_iteration,
        mma_tile_end: p.mma_tile_end,
        mma_exit: p.mma_exit,
        softmax_tile: p.softmax_tile,
        softmax_iteration: p.softmax_iteration,
        softmax_end: p.softmax_end,
        correction_iteration: p.correction_iteration,
        overlap,
    });
    Ok(())
}

/// Named barrier of softmax warpgroup 0's store (`bar.sync 0` is the set-up's); warpgroup 1
/// takes the next.
const FIRST_STORE_BARRIER: u32 = 1;

/// Both softmax warpgroups' copies of the epilogue's TMA store `st`, their staging tiles after
/// `end` in as few rounds as shared memory holds; `None` when no split fits.
fn staging(st: TmaStore, end: u32) -> Option<Vec<TmaStore>> {
    let limit = super::super::memory_plan::SMEM_LIMIT;
    let boxes = st.boxes.len() as u32;
    let rounds = (0..=boxes.trailing_zeros()).map(|k| 1 << k);
    let fit = rounds.map(|r| st.in_rounds(r)).find(|s| {
        let each = s.bytes().next_multiple_of(SWIZZLE_ATOM);
        end.next_multiple_of(SWIZZLE_ATOM) + Q_TILES * each <= limit
    })?;
    let each = fit.bytes().next_multiple_of(SWIZZLE_ATOM);
    Some(
        (0..Q_TILES)
            .map(|g| {
                let mut s = fit.clone();
                s.offset = end.next_multiple_of(SWIZZLE_ATOM) + g * each;
                s.barrier = FIRST_STORE_BARRIER + g;
                s.threads = 32 * WARPGROUP_WARPS;
                s
            })
            .collect(),
    )
}

/// Whether scalar `v` is computed from `block_id().x`.
fn reads_block_x(kernel: &Kernel, v: ValueId) -> bool {
    match kernel.values[v].def {
        ValueDef::BlockArg { .. } => false,
        ValueDef::Op(op, _) => {
            let o = &kernel.ops[op];
            o.kind == OpKind::BlockId(Axis::X)
                || !o.regions.is_empty()
                || o.operands.iter().any(|&x| reads_block_x(kernel, x))
        }
    }
}

/// `[rows, cols]` of an mma's result.
fn shape(kernel: &Kernel, mma: OpId) -> Option<(u32, u32)> {
    let s = kernel.ty(kernel.ops[mma].results[0]).shape()?;
    Some((s.rows() as u32, s.cols() as u32))
}

/// Fails when the schedule's shared memory exceeds the limit.
fn check_smem(loc: Loc, bytes: u32) -> Result<(), Diagnostic> {
    let limit = super::super::memory_plan::SMEM_LIMIT;
    if bytes > limit {
        return Err(Diagnostic::new(
            loc,
            format!(
                "the attention schedule's two Q tiles, K/V stages and barriers need {bytes} bytes \
                 of shared memory; at most {limit} are available"
            ),
        )
        .note("use a smaller key block (`block_n`)"));
    }
    Ok(())
}
