//! The `pipeline` pass (sm_90a, sm_100a): turns a GEMM- or attention-shaped pipelined loop
//! into the kernel's schedule IR ([`crate::sched`]): a TMA stage ring of `full`/`empty`
//! mbarrier arrays, its loads, and the producer's and the consumers' programs.
//!
//! It runs after `memory_plan`. Exactly one top-level `for` with `stages >= 2`, whose mmas take
//! shapes and operands wgmma (or `tcgen05.mma`) takes from TMA-loaded tiles, becomes a ring;
//! any other loop keeps the sm_80 `cp.async` lowering. The operand conditions and the
//! producer's and consumers' programs: `docs/pipeline.md`, "Inside the passes".

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Const, Kernel, OpId, OpKind, Param, ValueDef, ValueId};
use crate::sched::tma::{Operand, REGISTER_TILE_ALIGN, SWIZZLE_ATOM, TmaLoad};
use crate::sched::{
    BarrierId, Issue, Load, Mbarrier, MmaPart, Op, Phase, Region, Role, RoleKind, Sched,
};
use crate::schedule::{Layout, SmemBuffer, StagedOperand};
use crate::target::Target;
use crate::types::DType;

use super::memory_plan::check_smem;
use super::walk::{hoistable, sched_loc};

/// Plans the schedule IR on sm_90a and sm_100a; does nothing on other targets.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if !matches!(target, Target::Sm90a | Target::Sm100a) || !kernel.options.warp_specialize {
        return Ok(());
    }
    let warps = kernel.options.num_warps;
    let mut planned = Vec::new();
    for &id in &kernel.body.ops {
        if let Some(s) = plan_loop(kernel, id, warps, target) {
            planned.push(s);
        }
    }
    // The producer warpgroup exits after its ring, so the kernel may have one ring and no
    // other shared-memory tile (whose cp.async path synchronises all threads with bar.sync).
    let [sched] = &planned[..] else {
        return Ok(());
    };
    // Every shared tile is a ring load (the tiles read into registers have no buffer).
    let staged = sched
        .loads
        .iter()
        .filter(|(_, l)| l.tma.operand != Operand::Registers)
        .count();
    if staged != kernel.schedule.buffers.len() {
        return Ok(());
    }
    // An mma outside the ring runs as mma.sync, whose operands may go through shared memory
    // with block-wide barriers the exited producer would never reach: the whole kernel then
    // takes the sm_80 lowering (the `lower` pass notes why).
    let ring = super::walk::ops_in_block_regions(kernel, sched.for_op);
    if super::walk::ops_in_order(kernel)
        .into_iter()
        .any(|o| kernel.ops[o].kind == OpKind::Mma && !ring.contains(&o))
    {
        return Ok(());
    }
    // sm_100a's tcgen05 reads its A operands its own way (`crate::tmem`).
    if target == Target::Sm90a {
        kernel.schedule.staged = staged_operands(kernel, sched.for_op);
    }
    kernel.schedule.sched = Some(sched.clone());
    place(kernel)
}

/// The register operands of ring loop `for_op`'s mmas that the consumers stage through
/// shared memory ([`staged_register`]): one buffer each, row-major as the tile is held,
/// swizzled, in column boxes where its rows are wider than the swizzle span (the canonical
/// layout a wgmma descriptor reads); [`place`] puts them after the ring.
fn staged_operands(kernel: &Kernel, for_op: OpId) -> Vec<StagedOperand> {
    let mut staged: Vec<StagedOperand> = Vec::new();
    for m in super::walk::mmas(kernel, &kernel.ops[for_op].regions[0]) {
        for slot in 0..2 {
            let operand = kernel.ops[m].operands[slot];
            let Some((source, transposed)) = staged_register(kernel, operand, slot) else {
                continue;
            };
            if staged.iter().any(|s| s.operand == operand) {
                continue;
            }
            let ty = kernel.ty(source);
            let Some(shape) = ty.shape() else {
                continue;
            };
            let row_bytes = (shape.cols() * ty.dtype().size_bytes()) as u32;
            let mut buffer = SmemBuffer {
                load: m,
                offset: 0,
                stage_bytes: row_bytes * shape.rows() as u32,
                stages: 1,
                row_bytes,
                swizzled: true,
                boxed: false,
            };
            buffer.boxed = buffer.span().is_some_and(|span| row_bytes > span);
            staged.push(StagedOperand {
                operand,
                source,
                transposed,
                slot,
                buffer,
                at_source: false,
            });
        }
    }
    staged
}

/// The register tile the consumers write into shared memory for operand `slot` (0: A, 1:
/// B) `v` of a ring mma, and whether `v` is its transpose, when they can stage it for
/// wgmma: a 16-bit register tile computed in the kernel (not loaded), whose rows are a
/// multiple of 8 and whose row bytes whole swizzle spans (32, 64 or 128 bytes). As A, `t.t()`
/// (wgmma reads a register A only in its accumulator layout, RS; attention backward's `dQ =
/// dS K` from a keys-major `dS^T`), read MN-major. As B, the tile itself (read MN-major:
/// `dQ^T = K^T dS^T`, the form whose M is the head dimension) or `t.t()` (read K-major). A
/// transpose must be read by mmas only, in that slot: its elements are never written to
/// registers.
fn staged_register(kernel: &Kernel, v: ValueId, slot: usize) -> Option<(ValueId, bool)> {
    let (source, transposed) = match kernel.values[v].def {
        ValueDef::Op(t, 0) if kernel.ops[t].kind == OpKind::Transpose => {
            (kernel.ops[t].operands[0], true)
        }
        _ if slot == 1 => (v, false),
        _ => return None,
    };
    // A loaded tile is read from its own buffer, not restaged.
    let computed = match kernel.values[source].def {
        ValueDef::Op(d, _) => !matches!(
            kernel.ops[d].kind,
            OpKind::Load { .. } | OpKind::Gather { .. }
        ),
        ValueDef::BlockArg { .. } => false,
    };
    let layout = kernel.schedule.layouts.get(&source)?;
    let ty = kernel.ty(source);
    let shape = ty.shape()?;
    let only_mma = !transposed
        || super::walk::uses(kernel).get(&v).is_some_and(|us| {
            us.iter()
                .all(|&u| kernel.ops[u].kind == OpKind::Mma && kernel.ops[u].operands[slot] == v)
        });
    let fits = shape.rank() == 2
        && shape.rows().is_multiple_of(8)
        && (shape.cols() * 2).is_multiple_of(32)
        && matches!(ty.dtype(), DType::Bf16 | DType::F16);
    (computed && !layout.is_shared() && only_mma && fits).then_some((source, transposed))
}

/// The stage ring's barriers of `s`: those its loads complete on or are released on,
/// per-iteration ones first (each array its stages), then the per-tile ones.
fn ring_barriers(s: &Sched) -> Vec<BarrierId> {
    let mut bars: Vec<BarrierId> = Vec::new();
    for (_, l) in s.loads.iter() {
        for b in std::iter::once(l.barrier).chain(l.free) {
            if !bars.contains(&b) {
                bars.push(b);
            }
        }
    }
    let per_tile = |b: &BarrierId| s.mbarrier(*b).is_some_and(|m| m.phase == Phase::Tile);
    let (mut ring, mut tile): (Vec<BarrierId>, Vec<BarrierId>) =
        bars.into_iter().partition(|b| !per_tile(b));
    ring.sort();
    tile.sort();
    ring.extend(tile);
    ring
}

/// Places every shared buffer on the swizzle atom (ring loads at their stage stride, each
/// buffer with its ring's stage count), the ring's barriers after them, then the TMA
/// stores' staging tiles; fails when the total exceeds the shared-memory limit.
pub fn place(kernel: &mut Kernel) -> Result<(), Diagnostic> {
    let loc = sched_loc(kernel);
    let schedule = &mut kernel.schedule;
    let Some(sched) = schedule.sched.as_mut() else {
        return Ok(());
    };
    // Re-place every buffer on the swizzle atom, ring loads at their stride.
    let stages = sched.stages;
    let strides: BTreeMap<OpId, u32> = sched
        .ring_loads()
        .map(|(_, l)| (l.tma.load, l.tma.stage_stride))
        .collect();
    let mut offset = 0u32;
    let mut offsets = BTreeMap::new();
    for b in &mut schedule.buffers {
        b.offset = offset;
        let per_stage = match strides.get(&b.load) {
            Some(&stride) => {
                b.stages = stages;
                stride
            }
            None => b.stage_bytes.next_multiple_of(SWIZZLE_ATOM),
        };
        offsets.insert(b.load, offset);
        offset += per_stage * b.stages;
        offset = offset.next_multiple_of(SWIZZLE_ATOM);
    }
    // The tiles read into registers (no buffer of the memory plan) after the buffers.
    for (_, l) in sched.loads.iter_mut() {
        if l.tma.operand == Operand::Registers {
            offset = offset.next_multiple_of(REGISTER_TILE_ALIGN);
            offsets.insert(l.tma.load, offset);
            offset += l.tma.stage_stride * stages;
        }
    }
    offset = offset.next_multiple_of(8);
    for (_, l) in sched.loads.iter_mut() {
        if l.work_tile == 0 {
            l.tma.offset = offsets.get(&l.tma.load).copied().unwrap_or_default();
        }
    }
    for b in ring_barriers(sched) {
        if let Some(m) = sched.barriers[b].as_mbarrier_mut() {
            if m.phase == Phase::Iteration {
                m.stages = stages;
            }
            m.offset = offset;
            offset += 8 * m.stages;
        }
    }
    // Staging tiles of TMA stores after the rings (their barriers are 8-byte aligned).
    for store in &mut sched.stores {
        offset = offset.next_multiple_of(SWIZZLE_ATOM);
        store.offset = offset;
        offset += store.bytes();
    }
    // The consumers' staged operands last, each on the swizzle atom.
    for st in &mut schedule.staged {
        offset = offset.next_multiple_of(SWIZZLE_ATOM);
        st.buffer.offset = offset;
        offset += st.buffer.stage_bytes;
    }
    sched.sort_barriers();
    let rings = "the TMA stage rings";
    check_smem(
        loc,
        offset,
        rings,
        "use smaller tiles or fewer pipeline stages",
    )?;
    schedule.smem_bytes = offset;
    Ok(())
}

/// How one `mma` of a ring body reads its operands.
struct MmaPlan {
    /// A from shared memory (a staged load, in the body or a once load before the loop, and
    /// whether it is read transposed: `[K, M]` stored, MN-major), or `None` for a register A
    /// (wgmma RS, or staged by the consumers).
    a: Option<(OpId, bool)>,
    /// B's staged load, and whether it is read transposed (`[N, K]` stored: K-major), or
    /// `None` for a register B the consumers stage.
    b: Option<(OpId, bool)>,
    /// `K` and `N` of the product.
    k: u32,
    n: u32,
}

/// Accumulator rows of `warps` consumer warps: 16 a warp for wgmma (64 per warpgroup); on
/// sm_100a the 128 TMEM lanes, which each epilogue warpgroup reads in full (each warp its 32,
/// `crate::tmem`).
fn acc_rows(target: Target, warps: u32) -> u32 {
    if target == Target::Sm100a {
        crate::tmem::ACC_ROWS
    } else {
        16 * warps
    }
}

/// The ring of loop `id`, when it has the shape described in `docs/pipeline.md`.
fn plan_loop(kernel: &Kernel, id: OpId, warps: u32, target: Target) -> Option<Sched> {
    let OpKind::For {
        stages: Some(stages),
    } = kernel.ops[id].kind
    else {
        return None;
    };
    // sm_90a: one to three consumer warpgroups (64 accumulator rows each) plus the producer
    // (three at FlashAttention-3's 160 registers each); sm_100a: one 128-row tcgen05
    // accumulator, read by one or two warpgroups of epilogue warps (`crate::tmem::epilogue`).
    let fits = match target {
        Target::Sm100a => matches!(warps, 4 | 8),
        _ => matches!(warps, 4 | 8 | 12),
    };
    if stages < 2 || !fits {
        return None;
    }
    let body = &kernel.ops[id].regions[0];
    let inside: BTreeSet<OpId> = super::walk::ops_in_block(kernel, body)
        .into_iter()
        .collect();
    let mmas = super::walk::mmas(kernel, body);
    if mmas.is_empty() {
        return None;
    }
    let plans = mmas
        .iter()
        .map(|&m| plan_mma(kernel, m, warps, target))
        .collect::<Option<Vec<MmaPlan>>>()?;
    // Ring loads in order of use (A before B), `[rows, cols]` as stored; once loads are
    // tiles loaded before the loop (attention's `Q` as A, a weight held across the loop as B).
    let mut ring_loads: Vec<(OpId, Operand, u32, u32)> = Vec::new();
    let mut once_loads: Vec<(OpId, Operand, u32, u32)> = Vec::new();
    for p in &plans {
        // As stored: A `[M, K]`, or `[K, M]` read transposed; B `[N, K]` when K-major, else
        // `[K, N]`.
        let m = acc_rows(target, warps);
        let a = p.a.map(|a| match a {
            (a, false) => (a, Operand::KMajorA, m, p.k),
            (a, true) => (a, Operand::MnMajorA, p.k, m),
        });
        let b = p.b.map(|b| match b {
            (b, true) => (b, Operand::KMajorB, p.n, p.k),
            (b, false) => (b, Operand::MnMajorB, p.k, p.n),
        });
        for load in a.into_iter().chain(b) {
            if inside.contains(&load.0) {
                ring_loads.push(load);
            } else {
                once_loads.push(load);
            }
        }
    }
    // A tile read by several operands is one load: its boxes depend only on the tile as stored,
    // and each wgmma's descriptor reads it in its own orientation. sm_100a's tcgen05
    // descriptors come from the load's first use, so there every tile has one reader.
    let repeated = dedupe(&mut ring_loads) | dedupe(&mut once_loads);
    if repeated && target != Target::Sm90a {
        return None;
    }
    // Every tile staged in the body is a ring load.
    let staged = body
        .ops
        .iter()
        .filter(|&&o| kernel.schedule.buffer(o).is_some())
        .count();
    let distinct: BTreeSet<OpId> = ring_loads.iter().map(|l| l.0).collect();
    let once_distinct: BTreeSet<OpId> = once_loads.iter().map(|l| l.0).collect();
    if ring_loads.is_empty() {
        return None;
    }
    if distinct.len() != ring_loads.len()
        || staged != ring_loads.len()
        || once_distinct.len() != once_loads.len()
    {
        return None;
    }
    let tma = |l: OpId, rows: u32, cols: u32, operand: Operand| {
        let (param, rank) = tma_source(kernel, l, id, &inside)?;
        let mut t = TmaLoad::new(l, param, operand, rows, cols);
        t.lead_dims = rank - 2;
        Some(t)
    };
    let mut loads = ring_loads
        .iter()
        .map(|&(l, operand, rows, cols)| tma(l, rows, cols, operand))
        .collect::<Option<Vec<_>>>()?;
    let once = once_loads
        .iter()
        .map(|&(l, operand, rows, cols)| {
            let mut t = tma(l, rows, cols, operand)?;
            t.stage_stride = 0;
            Some(t)
        })
        .collect::<Option<Vec<_>>>()?;
    if target == Target::Sm90a {
        loads.extend(register_loads(kernel, id, &inside));
    }
    Some(ring_sched(
        id,
        stages,
        loads,
        once,
        warps,
        target,
        overlaps(kernel, id),
    ))
}

/// Bytes of a stage the tiles read into registers may take: row statistics, not tiles.
const REGISTER_LOAD_BYTES: u32 = 4096;

/// The loads of ring loop `for_op`'s body (its own ops, not nested ones) read into registers
/// that the ring fetches ahead with its mma operands ([`Operand::Registers`]), in order, up to
/// [`REGISTER_LOAD_BYTES`] a stage: each a plain load of a 1-D or 2-D tile of a read-only,
/// 16-byte aligned tensor of rank 2..=5, of 2- or 4-byte elements, at most 256 along either
/// side, its rows whole 16-byte chunks, its column coordinate a provable multiple of 16 bytes
/// and every coordinate computable for any iteration (as [`tma_source`]'s). A 1-D tile is one
/// row: its tensor's next-to-last dimension takes a box of 1.
fn register_loads(kernel: &Kernel, for_op: OpId, inside: &BTreeSet<OpId>) -> Vec<TmaLoad> {
    let mut bytes = 0;
    let mut out = Vec::new();
    for &l in &kernel.ops[for_op].regions[0].ops {
        if kernel.schedule.buffer(l).is_some() {
            continue;
        }
        let Some(t) = register_load(kernel, l, for_op, inside) else {
            continue;
        };
        if bytes + t.tile_bytes() <= REGISTER_LOAD_BYTES {
            bytes += t.tile_bytes();
            out.push(t);
        }
    }
    out
}

/// Load `l` as a ring load read into registers, when it qualifies ([`register_loads`]).
fn register_load(
    kernel: &Kernel,
    l: OpId,
    for_op: OpId,
    inside: &BTreeSet<OpId>,
) -> Option<TmaLoad> {
    let OpKind::Load { tensor, ref shape } = kernel.ops[l].kind else {
        return None;
    };
    let Some(&Param::Tensor {
        rank,
        dtype,
        aligned16: true,
        mutable: false,
        ..
    }) = kernel.params.get(tensor)
    else {
        return None;
    };
    let elem = dtype.size_bytes() as u32;
    let (rows, cols) = match *shape.dims() {
        [c] => (1, c as u32),
        [r, c] => (r as u32, c as u32),
        _ => return None,
    };
    let coords = &kernel.ops[l].operands;
    let ok = matches!(elem, 2 | 4)
        && (2..=5).contains(&rank)
        && coords.len() == rank
        && (1..=256).contains(&rows)
        && (1..=256).contains(&cols)
        && (cols * elem).is_multiple_of(16)
        && coords
            .last()
            .is_some_and(|&c| known_multiple(kernel, c).is_multiple_of(16 / elem))
        && coords.iter().all(|&c| hoistable(kernel, c, for_op, inside));
    ok.then(|| {
        let mut t = TmaLoad::registers(l, tensor, rows, cols, elem);
        t.lead_dims = rank as u32 - 2;
        t
    })
}

/// Drops the later uses of a load already in `loads`; whether there were any.
fn dedupe(loads: &mut Vec<(OpId, Operand, u32, u32)>) -> bool {
    let mut seen = BTreeSet::new();
    let before = loads.len();
    loads.retain(|l| seen.insert(l.0));
    loads.len() != before
}

/// The schedule of a ring of `stages` over `loads` (and `once` loads before the loop) with
/// `warps` kernel warps: the producer waits on `empty` (parity from 1), announces the stage's
/// bytes on `full` and issues the boxes; the consumers wait on `full` (parity from 0) and run
/// the body's mmas. A GEMM mainloop (one mma, its result only carried: `lag`) commits, keeps
/// one group in flight and releases the previous iteration's stage; any other body waits for
/// each wgmma where it is issued and releases the stage it just used. sm_100a: one thread
/// issues the tcgen05.mmas, and a commit releases the stage when they complete, so nothing
/// is kept in flight by hand and nothing drains.
fn ring_sched(
    id: OpId,
    stages: u32,
    loads: Vec<TmaLoad>,
    once: Vec<TmaLoad>,
    warps: u32,
    target: Target,
    lag: bool,
) -> Sched {
    let mut s = Sched::new(id, stages);
    let tcgen05 = target == Target::Sm100a;
    let empty_count = if tcgen05 { 1 } else { warps };
    let full = s.add_mbarrier("full", None, Mbarrier::new(1, stages, Phase::Iteration));
    let empty = s.add_mbarrier(
        "empty",
        None,
        Mbarrier::new(empty_count, stages, Phase::Iteration),
    );
    let bytes = loads.iter().map(TmaLoad::tile_bytes).sum();
    let once_bytes = once.iter().map(TmaLoad::tile_bytes).sum();
    let ring: Vec<_> = loads
        .into_iter()
        .map(|tma| {
            s.loads.append(Load {
                tma,
                barrier: full,
                free: Some(empty),
                work_tile: 0,
                read_by: MmaPart::Body,
            })
        })
        .collect();
    let once_bar =
        (!once.is_empty()).then(|| s.add_mbarrier("once", None, Mbarrier::new(1, 1, Phase::Tile)));
    let once: Vec<_> = once
        .into_iter()
        .map(|tma| {
            s.loads.append(Load {
                tma,
                barrier: once_bar.unwrap_or(full),
                free: None,
                work_tile: 0,
                read_by: MmaPart::Body,
            })
        })
        .collect();
    s.setup = vec![Op::InitBarriers, Op::FenceBarrierInit, Op::CtaSync];
    let mut producer = Role::new(
        RoleKind::Producer,
        warps,
        if tcgen05 { 1 } else { 4 },
        Issue::Thread,
    );
    producer.program.iteration = vec![Op::wait(empty, 1), Op::ExpectTx { bar: full, bytes }];
    producer
        .program
        .iteration
        .extend(ring.iter().map(|&load| Op::Tma { load }));
    let lag = u32::from(lag);
    let mut consumer = if tcgen05 {
        let mut mma = Role::new(RoleKind::Mma, warps + 1, 1, Issue::Thread);
        mma.program.iteration = vec![
            Op::wait(full, 0),
            Op::Tcgen05Mma {
                part: MmaPart::Body,
                tile: 0,
            },
            Op::commit(empty),
        ];
        mma
    } else {
        let mut c = Role::new(RoleKind::Consumer, 0, warps, Issue::Warps);
        c.replicas = (warps / 4).max(1);
        c.program.iteration = vec![
            Op::wait(full, 0),
            Op::Wgmma(MmaPart::Body),
            Op::WgmmaCommit,
            Op::WgmmaWait(lag),
            Op::Arrive { bar: empty, lag },
        ];
        if lag > 0 {
            c.program.drain = vec![Op::WgmmaWait(0)];
        }
        c.program.end = vec![Op::Run(Region::Epilogue(None))];
        c
    };
    if let Some(bar) = once_bar {
        producer.program.tile = vec![Op::ExpectTx {
            bar,
            bytes: once_bytes,
        }];
        producer
            .program
            .tile
            .extend(once.iter().map(|&load| Op::Tma { load }));
        consumer.program.tile = vec![Op::wait(bar, 0)];
    }
    s.roles = if tcgen05 {
        vec![producer, consumer]
    } else {
        vec![consumer, producer]
    };
    s
}

/// How `mma` reads its operands, when wgmma (or, on sm_100a, tcgen05.mma) can run it (see
/// `docs/pipeline.md`).
fn plan_mma(kernel: &Kernel, mma: OpId, warps: u32, target: Target) -> Option<MmaPlan> {
    let op = &kernel.ops[mma];
    let (a_v, b_v) = (*op.operands.first()?, *op.operands.get(1)?);
    let staged = |v: ValueId| match kernel.values[v].def {
        ValueDef::Op(o, 0) if kernel.schedule.buffer(o).is_some() => Some(o),
        _ => None,
    };
    // The transposed view of a staged tile.
    let transposed_load = |v: ValueId| match kernel.values[v].def {
        ValueDef::Op(t, 0) if kernel.ops[t].kind == OpKind::Transpose => {
            staged(kernel.ops[t].operands[0])
        }
        _ => None,
    };
    // A is a staged tile (K-major) or, on sm_90a, the transposed view of one (MN-major).
    let a = match kernel.values[a_v].def {
        ValueDef::Op(o, 0) if matches!(kernel.ops[o].kind, OpKind::Load { .. }) => {
            Some((staged(a_v)?, false))
        }
        _ if target == Target::Sm90a => transposed_load(a_v).map(|o| (o, true)),
        _ => None,
    };
    // B is a staged tile (`[K, N]`, MN-major) or the transposed view of one (`[N, K]`
    // stored, K-major), of the body or loaded once before the loop; on sm_90a also a
    // register tile the consumers stage.
    let b = match (transposed_load(b_v), staged(b_v)) {
        (Some(t), _) => Some((t, true)),
        (None, Some(b)) => Some((b, false)),
        (None, None) if target == Target::Sm90a => {
            staged_register(kernel, b_v, 1)?;
            None
        }
        (None, None) => return None,
    };
    let a_shape = kernel.ty(a_v).shape()?;
    let b_shape = kernel.ty(b_v).shape()?;
    let (m, k, n) = (
        a_shape.rows() as u32,
        a_shape.cols() as u32,
        b_shape.cols() as u32,
    );
    // Boxes are the widest of 64, 32 or 16 columns that tile the operand (`box_columns`), so K
    // and an MN-major B's N need only be multiples of 16 (both targets' descriptors read boxes
    // of any of those spans: `kiln_ptx`'s wgmma geometry, `crate::tmem::Descriptor`). An
    // MN-major B box holds all K rows (at most 256).
    let b_k_major = match b {
        Some((_, t)) => t,
        None => staged_register(kernel, b_v, 1).is_some_and(|(_, t)| t),
    };
    let k_ok = k.is_multiple_of(16) && (b_k_major || k <= 256);
    let layout = kernel.schedule.layouts.get(&op.results[0]);
    // Column blocks of the consumers' split of a tile of fewer rows (`layout`'s rule).
    let col_blocks = match layout {
        Some(Layout::WgmmaColumns { col_blocks }) if target == Target::Sm90a => *col_blocks,
        _ => 1,
    };
    let shape_ok = m * col_blocks == acc_rows(target, warps)
        && k_ok
        && n.is_multiple_of(16)
        && n / col_blocks <= 256;
    let layout_ok = if target == Target::Sm100a {
        layout == Some(&crate::tmem::accumulator_layout(warps))
    } else {
        col_blocks > 1 || layout == Some(&Layout::Mma { warps: [warps, 1] })
    };
    // A register A (wgmma RS) is read in the accumulator layout; any other is no ring's. A
    // gathered A (MoE routed rows) gave wrong sums on the H200 under compute-sanitizer's
    // timing, so it keeps the mma.sync lowering until the ring's ordering of its loads is
    // proved.
    let gathered = matches!(
        kernel.values[a_v].def,
        crate::kernel::ValueDef::Op(d, _) if matches!(kernel.ops[d].kind, OpKind::Gather { .. })
    );
    let a_ok = (a.is_some()
        || target == Target::Sm100a
        || kernel.schedule.layouts.get(&a_v) == Some(&Layout::Mma { warps: [warps, 1] })
        || target == Target::Sm90a && staged_register(kernel, a_v, 0).is_some())
        && !gathered;
    let dtype_ok = a_ok
        && matches!(kernel.ty(a_v).dtype(), DType::Bf16 | DType::F16)
        && kernel.ty(a_v).dtype() == kernel.ty(b_v).dtype();
    (shape_ok && layout_ok && dtype_ok).then_some(MmaPlan { a, b, k, n })
}

/// The tensor parameter and its rank, when load `l` can be a TMA box load: a 2-D tile of a
/// rank 2..=5 `aligned16` tensor, its column coordinate a provable multiple of 8 elements,
/// and (for a load in loop `for_op`) coordinates computable for any iteration.
fn tma_source(
    kernel: &Kernel,
    l: OpId,
    for_op: OpId,
    inside: &BTreeSet<OpId>,
) -> Option<(usize, u32)> {
    let OpKind::Load { tensor, ref shape } = kernel.ops[l].kind else {
        return None;
    };
    let Some(Param::Tensor {
        rank,
        aligned16: true,
        ..
    }) = kernel.params.get(tensor)
    else {
        return None;
    };
    let rank = u32::try_from(*rank).ok()?;
    let coords = &kernel.ops[l].operands;
    let ok = (2..=5).contains(&rank)
        && shape.rank() == 2
        && coords.len() == rank as usize
        && coords
            .last()
            .is_some_and(|&c| known_multiple(kernel, c).is_multiple_of(8))
        && coords.iter().all(|&c| hoistable(kernel, c, for_op, inside));
    ok.then_some((tensor, rank))
}

/// Whether ring loop `for_op` keeps a wgmma group in flight into the next iteration: its body
/// has a single `mma`, whose result only the loop's `yield` reads (the GEMM mainloop), and
/// which stages no operand from registers (the next iteration would write its one buffer
/// while the group still reads it). In any other ring body the PTX writer waits for every
/// wgmma where something needs it.
pub fn overlaps(kernel: &Kernel, for_op: OpId) -> bool {
    let mmas = super::walk::mmas(kernel, &kernel.ops[for_op].regions[0]);
    let stages = |m: OpId| {
        let ops = &kernel.ops[m].operands;
        staged_register(kernel, ops[0], 0).is_some() || staged_register(kernel, ops[1], 1).is_some()
    };
    matches!(mmas[..], [m] if !completes_in_body(kernel, for_op, m) && !stages(m))
}

/// Whether the result of `mma`, in loop `for_op`, is read by an op of the body other than
/// the loop's `yield` (which only carries it to the next iteration).
fn completes_in_body(kernel: &Kernel, for_op: OpId, mma: OpId) -> bool {
    let r = kernel.ops[mma].results[0];
    let body = &kernel.ops[for_op].regions[0];
    let carry = body.ops.last().copied();
    super::walk::ops_in_block(kernel, body)
        .into_iter()
        .any(|o| Some(o) != carry && kernel.ops[o].operands.contains(&r))
}

/// A number that statically divides scalar `v` (1 when nothing is known; zero divides by
/// anything, capped at 2^16).
pub(crate) fn known_multiple(kernel: &Kernel, v: ValueId) -> u32 {
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
