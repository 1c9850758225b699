//! sm_90a: the epilogue stores of a persistent kernel go through shared memory and TMA
//! ([`crate::sched::store`]). sm_100a: those of any ring kernel, whose epilogue warps
//! (the kernel's warps, `crate::tmem`) each hold whole accumulator rows, which stored
//! directly would scatter every warp's store over 32 rows.
//!
//! A `store` after the ring loop qualifies when TMA can write its tile as the accumulator's
//! registers hold it (no runtime bound, 16-byte aligned 2-byte elements, whole 128-byte boxes);
//! otherwise it stays as it is. The conditions in full: `docs/pipeline.md`, "Inside the passes".

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, Param};
use crate::sched::overlap::NAMED_BARRIERS;
use crate::sched::store::BOX_COLUMNS;
use crate::sched::tma::TmaBox;
use crate::sched::{BarrierId, Op, RoleKind, TmaStore};
use crate::schedule::{Distribution, Layout, Term};
use crate::target::Target;
use crate::tmem::epilogue;
use crate::types::DType;

/// Lowers every qualifying epilogue store; does nothing on other targets.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let consumer_warps = match (target, s.role(RoleKind::Consumer)) {
        (Target::Sm90a, Some(c)) if s.persistent() => c.warps,
        (Target::Sm100a, _) => kernel.options.num_warps,
        _ => return Ok(()),
    };
    let id = s.for_op;
    // After the warpgroups' turn barriers.
    let barrier = s.free_named_barrier();
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
        place_store(kernel, store, whole, barrier)?;
    }
    if target == Target::Sm90a {
        let columns = epilogue_columns(kernel);
        if let Some(s) = kernel.schedule.sched.as_mut() {
            s.epilogue_columns = columns;
        }
    }
    Ok(())
}

/// Adds `store` to the schedule in the fewest rounds whose staging tile fits (a rotated
/// ring's added stage given back first where that makes room, `whole`: one round) beside the
/// staging the loop's f32 atomic adds will take ([`super::bulk_add::staging_bytes`]: they
/// run every iteration, the store once a tile), its groups' named barriers from id
/// `barrier` on; leaves the store as it is where none fits.
fn place_store(
    kernel: &mut Kernel,
    store: TmaStore,
    whole: bool,
    barrier: u32,
) -> Result<(), Diagnostic> {
    let reserve = super::bulk_add::staging_bytes(kernel);
    let leaves_room = |k: &Kernel| {
        reserve == 0
            || k.schedule.smem_bytes.next_multiple_of(128) + reserve
                <= super::memory_plan::SMEM_LIMIT
    };
    let saved = kernel.schedule.clone();
    let boxes = if whole { 1 } else { store.boxes.len() as u32 };
    let counts = std::iter::successors(Some(1u32), |r| Some(r * 2)).take_while(|&r| r <= boxes);
    for rounds in counts.filter(|&r| boxes.is_multiple_of(r)) {
        for undeepen in [false, true] {
            kernel.schedule = saved.clone();
            if undeepen {
                super::overlap::undeepen(kernel)?;
            }
            if let Some(s) = kernel.schedule.sched.as_mut() {
                add_store(s, &store, rounds, barrier);
            }
            if super::pipeline::place(kernel).is_ok() && leaves_room(kernel) {
                return Ok(());
            }
        }
    }
    kernel.schedule = saved;
    Ok(())
}

/// Adds `store` staged in `rounds` parts to `s`: its named barrier (ids from `first` on), its
/// round program, and the storing role's wait for every store before it exits (before the
/// cluster's barrier).
fn add_store(s: &mut crate::sched::Sched, store: &TmaStore, rounds: u32, first: u32) {
    let mut st = store.clone();
    st.set_barrier(s.add_named("store", None, (first, st.groups, st.threads)));
    st.set_rounds(rounds);
    s.stores.push(st);
    for r in s.roles.iter_mut().filter(|r| r.kind == RoleKind::Consumer) {
        if !r.program.exit.contains(&Op::BulkWaitAll) {
            let at = r
                .program
                .exit
                .iter()
                .position(|&op| op == Op::ClusterSync)
                .unwrap_or(r.program.exit.len());
            r.program.exit.insert(at, Op::BulkWaitAll);
        }
    }
    s.sort_barriers();
}

/// The TMA store `op` lowers to when it qualifies (see `docs/pipeline.md`), before its barrier
/// and round program are in the schedule ([`add_store`]), and whether it is staged whole.
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
    let (box_terms, chunk_terms) = column_terms(&d.terms[1]);
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
        offset: 0,
        barrier: BarrierId::from_index(0),
        threads: threads / groups,
        groups,
        round: Vec::new(),
        work_tile: 0,
    };
    Some((store, whole))
}

/// Threads of a warpgroup.
const WARPGROUP_THREADS: u32 = 128;

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

/// Registers of a consumer thread kept for what the epilogue needs besides its tiles
/// (addresses, indices, the store's staging offsets).
const EPILOGUE_SCALAR_REGISTERS: u32 = 48;

/// sm_90a: the columns of the accumulator carried out of the schedule's loop that the
/// consumers run the code after the loop on at a time, or `None` for all of them.
///
/// A consumer warpgroup holds 64 rows of the accumulator, so a thread holds half of each
/// accumulator-wide tile's columns. The code after the loop keeps the accumulator and its
/// own tiles (a bias row, an activation's temporaries, a `c` tile) live at once
/// (`tmem::epilogue::live_columns`, the estimate sm_100a's epilogue also uses); when they do
/// not fit the consumers' `setmaxnreg` count and that code computes each column from the
/// same column alone ([`epilogue::column_local`]), it runs on the fewest equal chunks of
/// whole TMA-store boxes whose own tiles fit beside the accumulator, which stays live until
/// its last chunk is read. Calibrated by ptxas 13.0 on `gemm_epilogue.rs`: at 256 columns
/// gelu, silu and alpha/beta spilled whole and relu did not.
fn epilogue_columns(kernel: &Kernel) -> Option<u32> {
    let s = kernel.schedule.sched.as_ref()?;
    let for_op = s.for_op;
    let regs = s.role(RoleKind::Consumer)?.regs?;
    let acc = kernel.ops[for_op].results.iter().copied().find(|&v| {
        kernel
            .schedule
            .layouts
            .get(&v)
            .is_some_and(|l| matches!(l, Layout::Mma { .. }))
    })?;
    let n = kernel.ty(acc).shape()?.dims().last().copied()? as u32;
    let budget = regs.saturating_sub(EPILOGUE_SCALAR_REGISTERS);
    let need = epilogue::live_columns(kernel, for_op);
    if need / 2 <= budget || !epilogue::column_local(kernel, for_op) {
        return None;
    }
    // Chunk of `c` columns: the accumulator's n / 2 registers beside a thread's share of
    // the other tiles' columns of the chunk.
    let fits = |c: u32| n / 2 + need.saturating_sub(n) * c / n / 2 <= budget;
    (1..=n / BOX_COLUMNS)
        .filter(|&k| n.is_multiple_of(k * BOX_COLUMNS))
        .map(|k| n / k)
        .find(|&c| fits(c))
        .or(Some(BOX_COLUMNS).filter(|&c| c < n))
}

/// A staged tile's thread-dependent column terms, split into those that move a thread by
/// whole boxes and the rest (which stay inside a box).
pub fn column_terms(terms: &[Term]) -> (Vec<Term>, Vec<Term>) {
    terms
        .iter()
        .partition(|t| t.mul.is_multiple_of(BOX_COLUMNS))
}
