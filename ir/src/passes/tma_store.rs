//! sm_90a: the epilogue stores of a persistent kernel go through shared memory and TMA
//! ([`crate::tma_store`]). sm_100a: those of any ring kernel, whose epilogue warps
//! (the kernel's warps, `crate::tmem`) each hold whole accumulator rows, which stored
//! directly would scatter every warp's store over 32 rows.
//!
//! A `store` after the ring loop qualifies when it has no runtime bound (TMA clips only at the
//! tensor's extent), its tensor is 16-byte aligned (TMA's
//! requirement), its elements are 2 bytes, and its tile is `rows x cols` with `rows <= 256`,
//! `cols` a multiple of 64 (128-byte boxes), laid out in registers as the mma accumulator
//! is: every register's row a multiple of 8 from the thread's (so a thread's rows share one
//! swizzle phase), register pairs on adjacent even columns, and a thread's columns inside one
//! 16-byte chunk of each 8 but for whole boxes (the second of two sm_100a epilogue
//! warpgroups starts its columns a block of boxes further; such a tile is staged whole, so each
//! round's boxes stay those of one thread-independent range). Its staging tile goes after the rings when shared memory has room,
//! if need be in place of the stage `overlap` added to a rotated ring (which is then split
//! instead), else staged in parts; otherwise the store stays as it is. On sm_90a, when each
//! consumer warpgroup holds a band of whole 8-row groups of the tile's rows (the accumulator
//! of several warpgroups), each warpgroup stores its band itself, on a named barrier of its
//! own after the ping-pong's turn barriers.

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, Param};
use crate::ring::{NAMED_BARRIERS, TmaBox};
use crate::schedule::Distribution;
use crate::target::Target;
use crate::tma_store::{BOX_COLUMNS, TmaStore};
use crate::types::DType;

/// Named barrier id of the ping-pong's first turn (`overlap`); the store takes the next free.
const FIRST_FREE_BARRIER: u32 = 1;

/// Lowers every qualifying epilogue store; does nothing on other targets.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let consumer_warps = match (target, kernel.schedule.roles) {
        (Target::Sm90a, Some(roles)) if kernel.schedule.tiles.is_some() => roles.consumer_warps,
        (Target::Sm100a, _) => kernel.options.num_warps,
        _ => return Ok(()),
    };
    let Some((&id, ring)) = kernel.schedule.rings.iter().next() else {
        return Ok(());
    };
    let barrier = ring
        .overlap
        .as_ref()
        .and_then(|o| o.turns)
        .map_or(FIRST_FREE_BARRIER, |t| t.first_barrier + t.warpgroups);
    let Some(at) = kernel.body.ops.iter().position(|&o| o == id) else {
        return Ok(());
    };
    let stores: Vec<OpId> = kernel.body.ops[at + 1..]
        .iter()
        .copied()
        .filter(|&o| matches!(kernel.ops[o].kind, OpKind::Store { .. }))
        .collect();
    // sm_100a's epilogue warps hold whole rows each; only sm_90a's consumer warpgroups split.
    let split = target == Target::Sm90a;
    for op in stores {
        let Some((store, whole)) = candidate(kernel, op, 32 * consumer_warps, barrier, split)
        else {
            continue;
        };
        place_store(kernel, id, store, whole)?;
    }
    if target == Target::Sm90a {
        kernel.schedule.epilogue_columns = crate::tma_store::epilogue_columns(kernel, id);
    }
    Ok(())
}

/// Places `store`'s staging tile, in as few rounds as shared memory allows; at each count,
/// first with the ring as it is, then in place of the stage `overlap` added to a rotated ring,
/// which the staging tile is worth more than (H200, attention d = 128 with 128-key blocks:
/// 522 TFLOP/s at s = 1k without the stage, 416 with it and register stores; 598 against 621
/// at s = 8k). Only in one round when `whole`. Leaves the kernel as it was when no count fits.
fn place_store(
    kernel: &mut Kernel,
    ring: OpId,
    store: TmaStore,
    whole: bool,
) -> Result<(), Diagnostic> {
    let saved = kernel.schedule.clone();
    let boxes = if whole { 1 } else { store.boxes.len() as u32 };
    let counts = std::iter::successors(Some(1u32), |r| Some(r * 2)).take_while(|&r| r <= boxes);
    for rounds in counts.filter(|&r| boxes.is_multiple_of(r)) {
        for undeepen in [false, true] {
            kernel.schedule = saved.clone();
            if undeepen {
                super::overlap::undeepen(kernel, ring)?;
            }
            kernel
                .schedule
                .tma_stores
                .insert(store.store, store.in_rounds(rounds));
            if super::pipeline::place(kernel).is_ok() {
                return Ok(());
            }
        }
    }
    kernel.schedule = saved;
    Ok(())
}

/// The TMA store of `op`, when it qualifies (see the module doc), and whether it must be
/// staged whole (its threads' columns start boxes apart); stored by warpgroups apart when
/// `split` and the tile's rows allow ([`warpgroup_bands`]).
fn candidate(
    kernel: &Kernel,
    op: OpId,
    threads: u32,
    barrier: u32,
    split: bool,
) -> Option<(TmaStore, bool)> {
    let o = &kernel.ops[op];
    // A bounded store clips at its limit, a tensor map only at the tensor's extent.
    let OpKind::Store {
        tensor,
        bound: None,
    } = o.kind
    else {
        return None;
    };
    let Param::Tensor {
        dtype,
        rank,
        aligned16: true,
        ..
    } = kernel.params[tensor]
    else {
        return None;
    };
    let &v = o.operands.last()?;
    let shape = kernel.ty(v).shape()?;
    let (&[rows, cols], true) = (shape.dims(), matches!(dtype, DType::Bf16 | DType::F16)) else {
        return None;
    };
    let (rows, cols) = (u32::try_from(rows).ok()?, u32::try_from(cols).ok()?);
    if rows == 0 || rows > 256 || cols == 0 || !cols.is_multiple_of(BOX_COLUMNS) || rank < 2 {
        return None;
    }
    let d = kernel.distribution(v).ok()?;
    // Pairs, every row a multiple of 8 from the thread's (one swizzle phase), every pair
    // inside one 16-byte chunk whatever the thread's column within its box.
    let (box_terms, chunk_terms) = crate::tma_store::column_terms(&d.terms[1]);
    let accumulator_like = d.column_pairs() && {
        let col_span: u32 = chunk_terms.iter().map(|t| (t.modulo - 1) * t.mul).sum();
        d.regs
            .chunks(2)
            .all(|p| p[0][0].is_multiple_of(8) && p[0][1] % 8 + col_span + 1 < 8)
    };
    if !accumulator_like {
        return None;
    }
    let whole = !box_terms.is_empty();
    let groups = if split && !whole {
        warpgroup_bands(&d, rows, threads, barrier)
    } else {
        1
    };
    let store = TmaStore {
        store: op,
        param: tensor,
        lead_dims: u32::try_from(rank - 2).ok()?,
        box_dims: [rows, BOX_COLUMNS],
        swizzle: 128,
        boxes: (0..cols / BOX_COLUMNS)
            .map(|j| TmaBox {
                origin: [0, j * BOX_COLUMNS],
                smem_offset: j * rows * 128,
            })
            .collect(),
        rounds: 1,
        round: crate::tma_store::ROUND.to_vec(),
        finish: vec![crate::tma_store::StoreStep::WaitAll],
        offset: 0,
        barrier,
        threads: threads / groups,
        groups,
    };
    Some((store, whole))
}

/// Threads of a warpgroup.
const WARPGROUP_THREADS: u32 = 32 * crate::tmem::attention::WARPGROUP_WARPS;

/// How many warpgroups store their own rows of `d`'s `rows`-row tile: each of the `threads`
/// holders' warpgroups, when every warpgroup holds one band of `rows / groups` rows alone (a
/// multiple of 8, so a band is whole 1024-byte swizzle atoms of each box) and their barriers
/// from `barrier` on are named-barrier ids; otherwise 1.
fn warpgroup_bands(d: &Distribution, rows: u32, threads: u32, barrier: u32) -> u32 {
    let groups = threads / WARPGROUP_THREADS;
    if groups < 2 || !rows.is_multiple_of(8 * groups) || barrier + groups > NAMED_BARRIERS {
        return 1;
    }
    let band = rows / groups;
    let banded = (0..threads).all(|t| {
        d.coords(t)
            .iter()
            .all(|c| c[0] / band == t / WARPGROUP_THREADS)
    });
    if banded { groups } else { 1 }
}
