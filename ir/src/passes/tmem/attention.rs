//! The `tmem` pass's attention schedule, in the style of FlashAttention-4: a persistent loop
//! with one once load (Q) whose body the `overlap` analysis finds attention-shaped (head mma
//! `S = Q K^T`, an online softmax, rescale, tail mma `O = O * alpha + P V`).
//!
//! A CTA runs a pair of 128-row query tiles over one key walk with 16 warps (two softmax
//! warpgroups, a correction warpgroup, load and MMA warps); `S`, `P` and `O` live in tensor
//! memory, and the rescale is conditional as in FlashAttention-4. Work split, roles, TMEM
//! columns, handoffs and the checks it makes: `docs/targets.md`, sm_100a.

use crate::diag::Diagnostic;
use crate::kernel::{Axis, Const, Kernel, OpId, OpKind, ValueDef, ValueId};
use crate::passes::memory_plan::check_smem;
use crate::sched::overlap::Overlap;
use crate::sched::tma::{Operand, SWIZZLE_ATOM};
use crate::sched::tmem::{
    ACC_ROWS, Descriptor, TMEM_COLUMNS, Tmem, TmemMma, TmemTile, TmemTileId, instruction_descriptor,
};
use crate::sched::{
    BarrierId, Issue, Load, LoadId, Mbarrier, MmaPart, Op, Phase, Region, Role, RoleKind, Sched,
    TmaStore,
};

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

/// Query tiles a CTA runs at once (one per softmax warpgroup).
const Q_TILES: u32 = 2;
/// Warps of a warpgroup.
const WARPGROUP_WARPS: u32 = 4;
/// Columns one `tcgen05.ld`/`st` of the correction copies (`32x32b.x32`).
const RESCALE_COLUMNS: u32 = 32;
/// `setmaxnreg` of the softmax, correction and last warpgroups: `128 * (2 * 192 + 80 + 48)`
/// is the whole register file; a softmax thread holds a score row (up to 128 f32) and its
/// output row after the loop, a correction thread 32 columns of `O`.
const REGS: [u32; 3] = [192, 80, 48];
/// Named barrier of softmax warpgroup 0's store (`bar.sync 0` is the set-up's); warpgroup 1
/// takes the next.
const FIRST_STORE_BARRIER: u32 = 1;

/// The overlap of the schedule's loop when it is attention-shaped (see the module doc).
pub(super) fn attention_overlap(kernel: &Kernel, s: &Sched) -> Option<Overlap> {
    let once = s.loads.iter().filter(|(h, _)| s.once(*h)).count();
    (once == 1)
        .then(|| super::super::overlap::plan(kernel, s.for_op))
        .flatten()
}

/// The handoff barriers of one Q tile.
#[derive(Clone, Copy)]
struct TileBars {
    s_full: BarrierId,
    scale_full: BarrierId,
    p_full: BarrierId,
    o_ready: BarrierId,
    o_full: BarrierId,
    o_empty: BarrierId,
}

/// Plans the attention schedule (see the module doc) of the loop whose overlap is `overlap`.
pub(super) fn plan(
    kernel: &mut Kernel,
    overlap: Overlap,
    options: AttentionOptions,
) -> Result<(), Diagnostic> {
    let Some(s) = kernel.schedule.sched.clone() else {
        return Ok(());
    };
    let id = s.for_op;
    let loc = kernel.ops[id].loc;
    let unsupported = |why: String| {
        Diagnostic::unsupported(
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
    if !s.persistent() {
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
    let once: Vec<LoadId> = s.once_loads().collect();
    let ring: Vec<LoadId> = s.ring_loads().map(|(h, _)| h).collect();
    let [q] = once[..] else {
        return Err(Diagnostic::internal(loc, "an attention ring without its Q"));
    };
    let [k, v] = ring[..] else {
        return Err(unsupported("its body stages more than K and V".into()));
    };
    let tma = |h: LoadId| s.loads[h].tma.clone();
    let (qt, kt, vt) = (tma(q), tma(k), tma(v));
    if m != ACC_ROWS || mo != ACC_ROWS {
        return Err(unsupported(format!(
            "its query tile has {m} rows; tcgen05.mma's accumulator has {ACC_ROWS}"
        )));
    }
    if (qt.operand, kt.operand, vt.operand)
        != (Operand::KMajorA, Operand::KMajorB, Operand::MnMajorB)
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
    let dtype = kernel.ty(kernel.ops[qt.load].results[0]).dtype();
    let p_dtype = kernel.ty(kernel.ops[overlap.tail].operands[0]).dtype();
    if p_dtype != dtype {
        return Err(unsupported(format!(
            "its P is {p_dtype:?} but Q, K and V are {dtype:?}; one tcgen05.mma kind reads both"
        )));
    }
    // Each softmax warpgroup stores its own tile: the `tma_store` pass planned one staging
    // tile; take it out, place the rest, and give each warpgroup its own after everything.
    let store = s.stores.first().cloned();
    if let Some(sched) = kernel.schedule.sched.as_mut() {
        sched.stores.clear();
        let store_bars: Vec<BarrierId> = store.iter().map(|st| st.barrier).collect();
        sched.remove_barriers(&store_bars);
    }
    super::super::pipeline::place(kernel)?;
    let q_bytes = qt.tile_bytes();
    let q1_offset = kernel.schedule.smem_bytes.next_multiple_of(SWIZZLE_ATOM);
    let slot_offset = q1_offset + qt.stage_stride.max(q_bytes.next_multiple_of(SWIZZLE_ATOM));
    let bars_offset = slot_offset + 8;
    let scale_offset = bars_offset + 8 * 6 * Q_TILES;
    let mut smem_bytes = scale_offset + Q_TILES * ACC_ROWS * 4;
    let needs = "the attention schedule's two Q tiles, K/V stages and barriers";
    check_smem(
        loc,
        smem_bytes,
        needs,
        "use a smaller key block (`block_n`)",
    )?;
    let columns = TMEM_COLUMNS.min(needed.next_power_of_two());
    let Some(s) = kernel.schedule.sched.as_mut() else {
        return Ok(());
    };
    for (h, l) in s.loads.iter_mut() {
        l.read_by = if h == v { MmaPart::Tail } else { MmaPart::Head };
    }
    let (q_bar, q_free) = (s.loads[q].barrier, s.loads[q].free);
    let mut q1 = qt.clone();
    q1.offset = q1_offset;
    let q1 = s.loads.append(Load {
        tma: q1,
        barrier: q_bar,
        free: q_free,
        work_tile: 1,
        read_by: MmaPart::Head,
    });
    let bars: Vec<TileBars> = (0..Q_TILES)
        .map(|g| tile_bars(s, g, bars_offset + 48 * g))
        .collect();
    let stores = store
        .and_then(|st| staging(s, st, smem_bytes))
        .unwrap_or_default();
    if let Some(last) = stores.last() {
        smem_bytes = last.offset + last.bytes();
    }
    s.stores = stores;
    s.tmem = Some(Tmem {
        columns,
        slot_offset,
        tiles: (0..Q_TILES)
            .flat_map(|g| {
                [
                    TmemTile {
                        name: "O",
                        index: Some(g),
                        column: g * d,
                        columns: d,
                    },
                    TmemTile {
                        name: "S",
                        index: Some(g),
                        column: Q_TILES * d + g * block_n,
                        columns: block_n,
                    },
                ]
            })
            .collect(),
        mmas: vec![
            TmemMma {
                part: MmaPart::Head,
                idesc: instruction_descriptor(dtype, ACC_ROWS, block_n, false),
                a: Some(Descriptor::of(&qt)),
                b: Descriptor::of(&kt),
            },
            TmemMma {
                part: MmaPart::Tail,
                idesc: instruction_descriptor(dtype, ACC_ROWS, d, true),
                a: None,
                b: Descriptor::of(&vt),
            },
        ],
    });
    s.setup = super::tmem_setup(&s.setup, columns);
    s.work_tiles = Q_TILES;
    s.factors_offset = Some(scale_offset);
    s.poly_share = options.poly_exp2_share;
    s.overlap = Some(overlap);
    roles(s, &bars, (q, q1), (columns, d, block_n));
    s.sort_barriers();
    kernel.schedule.smem_bytes = smem_bytes;
    Ok(())
}

/// Q tile `g`'s handoff barriers, 8 bytes each from `offset` (see the module doc).
fn tile_bars(s: &mut Sched, g: u32, offset: u32) -> TileBars {
    let mut at = offset;
    let mut bar = |s: &mut Sched, name, count, phase, hands_tmem| {
        let m = Mbarrier {
            offset: at,
            hands_tmem,
            ..Mbarrier::new(count, 1, phase)
        };
        at += 8;
        s.add_mbarrier(name, Some(g), m)
    };
    let it = Phase::Iteration;
    TileBars {
        s_full: bar(s, "s_full", 1, it, true),
        scale_full: bar(s, "scale_full", WARPGROUP_WARPS, it, false),
        p_full: bar(s, "p_full", WARPGROUP_WARPS, it, true),
        o_ready: bar(s, "o_ready", WARPGROUP_WARPS, it, true),
        o_full: bar(s, "o_full", 1, it, true),
        o_empty: bar(s, "o_empty", WARPGROUP_WARPS, Phase::Tile, true),
    }
}

/// Both softmax warpgroups' copies of the epilogue's TMA store `st`, their staging tiles after
/// `end` in as few rounds as shared memory holds, each with a named barrier of its own; `None`
/// when no split fits.
fn staging(s: &mut Sched, st: TmaStore, end: u32) -> Option<Vec<TmaStore>> {
    let limit = super::super::memory_plan::SMEM_LIMIT;
    let boxes = st.boxes.len() as u32;
    let rounds = (0..=boxes.trailing_zeros()).map(|k| 1 << k);
    let fit = rounds
        .map(|r| {
            let mut x = st.clone();
            x.set_rounds(r);
            x
        })
        .find(|x| {
            let each = x.bytes().next_multiple_of(SWIZZLE_ATOM);
            end.next_multiple_of(SWIZZLE_ATOM) + Q_TILES * each <= limit
        })?;
    let each = fit.bytes().next_multiple_of(SWIZZLE_ATOM);
    let threads = 32 * WARPGROUP_WARPS;
    Some(
        (0..Q_TILES)
            .map(|g| {
                let barrier = s.add_named("store", Some(g), (FIRST_STORE_BARRIER + g, 1, threads));
                let mut x = fit.clone();
                x.offset = end.next_multiple_of(SWIZZLE_ATOM) + g * each;
                x.set_barrier(barrier);
                x.threads = threads;
                x.groups = 1;
                x.work_tile = g;
                x
            })
            .collect(),
    )
}

/// The roles and their programs (see the module doc).
fn roles(
    s: &mut Sched,
    bars: &[TileBars],
    (q0, q1): (LoadId, LoadId),
    (columns, d, block_n): (u32, u32, u32),
) {
    let (Some(once), Some(once_free)) = (Some(s.loads[q0].barrier), s.loads[q0].free) else {
        return;
    };
    let ring: Vec<LoadId> = s.ring_loads().map(|(h, _)| h).collect();
    let (full, empty) = match ring.first() {
        Some(&h) => (
            s.loads[h].barrier,
            s.loads[h].free.unwrap_or(s.loads[h].barrier),
        ),
        None => return,
    };
    let tmem = s.tmem.clone();
    let tile = |name: &str, g: u32| {
        tmem.as_ref()
            .and_then(|t| t.tile(name, Some(g)))
            .unwrap_or(TmemTileId(0))
    };
    // A wait for the previous iteration's `O += P V`.
    let previous_o = |bar| Op::Wait {
        bar,
        start: 0,
        lag: 1,
    };
    let q_bytes = 2 * s.loads[q0].tma.tile_bytes();
    let producer_iteration = s
        .role(RoleKind::Producer)
        .map(|r| r.program.iteration.clone())
        .unwrap_or_default();
    let o_copies = |g: u32| {
        (0..d.div_ceil(RESCALE_COLUMNS)).map(move |c| Op::TmemLoad {
            tile: tile("O", g),
            column: c * RESCALE_COLUMNS,
            columns: RESCALE_COLUMNS.min(d - c * RESCALE_COLUMNS),
        })
    };
    let mut roles = Vec::new();
    for (g, b) in (0..Q_TILES).zip(bars) {
        let mut softmax = Role::new(
            RoleKind::Softmax(g),
            g * WARPGROUP_WARPS,
            WARPGROUP_WARPS,
            Issue::Warps,
        );
        softmax.regs = Some(REGS[0]);
        // A softmax warpgroup starts a tile only once its Q is loaded: the load follows the
        // MMA thread's previous tile (`once_free`), so the warpgroup never runs through empty
        // tiles more than one `o_empty` phase ahead of the MMA thread's wait on it.
        softmax.program.tile = vec![Op::wait(once, 0)];
        softmax.program.iteration = vec![
            Op::wait(b.s_full, 0),
            Op::Tcgen05FenceAfter,
            Op::TmemLoad {
                tile: tile("S", g),
                column: 0,
                columns: block_n,
            },
            Op::TmemWaitLoad,
            Op::Run(Region::Between),
            Op::FactorStore { tile: g },
            Op::arrive(b.scale_full),
            Op::TmemStore { tile: tile("S", g) },
            Op::TmemWaitStore,
            Op::Tcgen05FenceBefore,
            Op::arrive(b.p_full),
        ];
        let mut end = vec![previous_o(b.o_full), Op::Tcgen05FenceAfter];
        end.extend(o_copies(g));
        end.extend([
            Op::TmemWaitLoad,
            Op::Tcgen05FenceBefore,
            Op::arrive(b.o_empty),
            Op::Run(Region::Epilogue(None)),
        ]);
        softmax.program.end = end;
        if s.stores.iter().any(|st| st.work_tile == g) {
            softmax.program.exit = vec![Op::BulkWaitAll];
        }
        roles.push(softmax);
    }
    let mut correction = Role::new(
        RoleKind::Correction,
        Q_TILES * WARPGROUP_WARPS,
        WARPGROUP_WARPS,
        Issue::Warps,
    );
    correction.regs = Some(REGS[1]);
    for (g, b) in (0..Q_TILES).zip(bars) {
        correction.program.iteration.extend([
            Op::wait(b.scale_full, 0),
            Op::FactorLoad { tile: g },
            previous_o(b.o_full),
            Op::Tcgen05FenceAfter,
            Op::RescaleBegin { tile: g },
        ]);
        for load in o_copies(g) {
            correction.program.iteration.extend([
                load,
                Op::TmemWaitLoad,
                Op::Rescale { tile: g },
                Op::TmemStore { tile: tile("O", g) },
            ]);
        }
        correction.program.iteration.extend([
            Op::TmemWaitStore,
            Op::RescaleEnd,
            Op::Tcgen05FenceBefore,
            Op::arrive(b.o_ready),
        ]);
    }
    roles.push(correction);
    let first_other = (Q_TILES + 1) * WARPGROUP_WARPS;
    let mut load = Role::new(RoleKind::Producer, first_other, 1, Issue::Thread);
    load.regs = Some(REGS[2]);
    load.program.tile = vec![
        Op::wait(once_free, 1),
        Op::ExpectTx {
            bar: once,
            bytes: q_bytes,
        },
        Op::Tma { load: q0 },
        Op::Tma { load: q1 },
    ];
    load.program.iteration = producer_iteration;
    roles.push(load);
    let mut mma = Role::new(RoleKind::Mma, first_other + 1, 1, Issue::Thread);
    mma.regs = Some(REGS[2]);
    // O_g is overwritten by the tile's first PV mma only once the previous tile's O_g was
    // copied out (a fresh barrier passes parity 1 at once).
    mma.program.tile = bars.iter().map(|b| Op::wait(b.o_empty, 1)).collect();
    mma.program
        .tile
        .extend([Op::wait(once, 0), Op::Tcgen05FenceAfter]);
    mma.program.iteration = vec![Op::wait(full, 0), Op::Tcgen05FenceAfter];
    for (g, b) in (0..Q_TILES).zip(bars) {
        mma.program.iteration.extend([
            Op::Tcgen05Mma {
                part: MmaPart::Head,
                tile: g,
            },
            Op::commit(b.s_full),
        ]);
    }
    for (g, b) in (0..Q_TILES).zip(bars) {
        mma.program.iteration.extend([
            Op::wait(b.p_full, 0),
            Op::wait(b.o_ready, 0),
            Op::Tcgen05FenceAfter,
            Op::Tcgen05Mma {
                part: MmaPart::Tail,
                tile: g,
            },
            Op::commit(b.o_full),
        ]);
    }
    // The last mma reading the stage (tile 1's PV) was just issued: the commit frees the
    // stage once it, and everything before it, completes.
    mma.program.iteration.push(Op::commit(empty));
    mma.program.release = vec![Op::commit(once_free)];
    mma.program.exit = bars.iter().map(|b| Op::wait(b.o_empty, 1)).collect();
    mma.program
        .exit
        .extend([Op::Tcgen05FenceAfter, Op::TmemDealloc { columns }]);
    roles.push(mma);
    s.roles = roles;
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
