//! sm_90a, sm_100a: persistent CTAs. A warp-specialised kernel whose stage ring is a loop of
//! its top level becomes persistent: the launch runs as many CTAs as fit on the GPU, and each
//! walks work tiles (blocks of the kernel's logical grid) in the order of [`TileScheduler`].
//! The producer issues the next tile's loads while the consumers finish the current one (its
//! epilogue), instead of a new CTA starting cold. A kernel that asks for clusters of 2
//! ([`crate::dsl::cluster`]) gets them here when its ring has the structure
//! [`crate::sched::cluster`] needs. Ring state across tiles and the cluster conditions:
//! `docs/pipeline.md`, "Inside the passes".

use crate::diag::Diagnostic;
use crate::kernel::{Axis, Kernel, OpId, OpKind, ValueId};
use crate::sched::cluster::{CTAS, Cluster, Multicast, Pair};
use crate::sched::tiles::TileScheduler;
use crate::sched::tma::{Operand, TmaBox, TmaLoad};
use crate::sched::{LoadId, Mbarrier, Op, Phase, RoleKind, Sched, Scope};
use crate::target::Target;

use super::walk;

/// Makes the schedule's loop persistent when it qualifies (see `docs/pipeline.md`); clusters it
/// when the kernel asks and the schedule can share a load.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    if !matches!(target, Target::Sm90a | Target::Sm100a) {
        return Ok(());
    }
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let id = s.for_op;
    let Some(at) = kernel.body.ops.iter().position(|&o| o == id) else {
        return Ok(());
    };
    let before = &kernel.body.ops[..at];
    if before
        .iter()
        .flat_map(|&o| std::iter::once(o).chain(walk::ops_in_block_regions(kernel, o)))
        .any(|o| {
            matches!(
                kernel.ops[o].kind,
                OpKind::Store { .. }
                    | OpKind::Scatter { .. }
                    | OpKind::Atomic { .. }
                    | OpKind::ScalarAtomic { .. }
            )
        })
    {
        return Ok(());
    }
    let order = order(kernel, s);
    let saved = kernel.schedule.clone();
    if let Some(s) = kernel.schedule.sched.as_mut() {
        persist(s, order);
    }
    // Without room for the `once_free` barrier the kernel stays as it was.
    if super::pipeline::place(kernel).is_err() {
        kernel.schedule = saved;
        return Ok(());
    }
    if kernel.options.cluster > 1 {
        cluster_pairs(kernel, target)?;
    }
    Ok(())
}

/// Clusters the schedule when the kernel asks for clusters (see `docs/pipeline.md`); a request
/// it cannot meet is a diagnostic at the request.
fn cluster_pairs(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let (ctas, loc) = (kernel.options.cluster, kernel.options.cluster_loc);
    let fail = |why: String| {
        Diagnostic::new(
            loc,
            format!("this kernel cannot run in clusters of {ctas}: {why}"),
        )
        .note("ask for `cluster(1)`, or leave clusters to the autotuner, which skips this")
    };
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let once = s.loads.iter().any(|(h, _)| s.once(h));
    let split = s
        .ring_loads()
        .map(|(_, l)| l.barrier)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1;
    let why = if !matches!(target, Target::Sm90a | Target::Sm100a) {
        Some(format!(
            "clusters are scheduled on sm_90a and sm_100a only, not {target}"
        ))
    } else if ctas != CTAS {
        Some(format!("clusters have {CTAS} CTAs"))
    } else if once || s.overlap.is_some() || split {
        Some("its pipelined loop is not a GEMM mainloop (once loads, rotated or split)".into())
    } else if !matches!(s.tiles, Some(TileScheduler::Grouped { .. })) {
        Some("its loads do not reuse tiles along both x and y as a GEMM's do".into())
    } else {
        None
    };
    if let Some(why) = why {
        return Err(fail(why));
    }
    let ring: Vec<LoadId> = s.ring_loads().map(|(h, _)| h).collect();
    let shared: Vec<LoadId> = ring
        .iter()
        .copied()
        .filter(|&l| !load_reads(kernel, s.loads[l].tma.load, Axis::X))
        .collect();
    let [shared] = shared[..] else {
        return Err(fail(format!(
            "{} of its {} loads read no `block_id().x`; the pair of x-adjacent tiles must \
             share exactly one",
            shared.len(),
            ring.len()
        )));
    };
    let Some(s) = kernel.schedule.sched.as_mut() else {
        return Ok(());
    };
    // sm_100a pairs the CTAs in the 2-SM form (one `tcgen05.mma.cta_group::2` over both),
    // sm_90a multicasts the shared tile into both CTAs' rings.
    let (multicast, pair) = match target {
        Target::Sm100a => (Vec::new(), Some(pair(s, shared).map_err(fail)?)),
        _ => (multicast(s, shared).map_err(fail)?, None),
    };
    // A clustered set-up synchronises the cluster, not the CTA, after the barrier inits:
    // every CTA's barriers are initialised before any CTA arrives on a peer's or multicasts
    // into it.
    for op in &mut s.setup {
        if *op == Op::CtaSync {
            *op = Op::ClusterSync;
        }
    }
    s.cluster = Some(Cluster {
        ctas: CTAS,
        shared: shared.index(),
        multicast,
        exit_sync: true,
        pair,
    });
    // The scheduler deals pairs: a group of GROUP_ROWS x blocks is GROUP_ROWS / 2 pairs.
    s.tiles = Some(TileScheduler::Grouped {
        rows: GROUP_ROWS / CTAS,
    });
    Ok(())
}

/// Makes `s` persistent in `order`: its producer issues each tile's first stage before it
/// waits to reload the once loads, which gain a `once_free` barrier the consumers release
/// once per tile.
pub(crate) fn persist(s: &mut Sched, order: TileScheduler) {
    s.tiles = Some(order);
    let once: Vec<LoadId> = s.once_loads().collect();
    let empty = s.ring_loads().find_map(|(_, l)| l.free);
    let count = empty.and_then(|e| s.mbarrier(e)).map_or(1, |m| m.count);
    for r in &mut s.roles {
        if r.kind == RoleKind::Producer {
            r.program.lead = 1;
        }
    }
    if once.is_empty() {
        return;
    }
    let once_free = s.add_mbarrier("once_free", None, Mbarrier::new(count, 1, Phase::Tile));
    for &l in &once {
        s.loads[l].free = Some(once_free);
    }
    for r in &mut s.roles {
        match r.kind {
            RoleKind::Producer => r.program.tile.insert(0, Op::wait(once_free, 1)),
            RoleKind::Consumer => r.program.release = vec![Op::arrive(once_free)],
            _ => {}
        }
    }
}

/// x blocks per group of the grouped tile order.
const GROUP_ROWS: u32 = 8;

/// How the schedule's CTAs walk the work tiles (see `docs/pipeline.md`).
fn order(kernel: &Kernel, s: &Sched) -> TileScheduler {
    let trips = &kernel.ops[s.for_op].operands[..2];
    if trips.iter().any(|&v| depends_on(kernel, v, Axis::X)) {
        return TileScheduler::LongestFirst;
    }
    let misses = |axis| {
        s.ring_loads()
            .any(|(_, l)| !load_reads(kernel, l.tma.load, axis))
    };
    if misses(Axis::X) && misses(Axis::Y) {
        TileScheduler::Grouped { rows: GROUP_ROWS }
    } else {
        TileScheduler::Strided
    }
}

/// Clusters `s` around ring load `shared` on sm_90a (see [`crate::sched::cluster`]): splits
/// each of its boxes into [`CTAS`] slabs of rows, each issued by one CTA into all; doubles
/// `empty`'s count and adds the peer release after every consumer release on it;
/// synchronises the cluster before the consumers exit; returns each box's multicast. Fails,
/// saying why, when a box's rows do not split into whole 8-row swizzle atoms.
fn multicast(s: &mut Sched, shared: LoadId) -> Result<Vec<Multicast>, String> {
    let load = &mut s.loads[shared].tma;
    let rows = load.box_dims[0];
    // A box's rows are 128-byte swizzled in atoms of 8: each slab must be whole atoms so the
    // slabs together write the box's image.
    if !rows.is_multiple_of(8 * CTAS) {
        return Err(format!(
            "the shared tile's boxes have {rows} rows, which do not split into {CTAS} slabs of \
             whole 8-row swizzle atoms"
        ));
    }
    let slab = rows / CTAS;
    let row_bytes = load.box_dims[1] * 2;
    load.box_dims[0] = slab;
    load.boxes = load
        .boxes
        .iter()
        .flat_map(|b| {
            (0..CTAS).map(move |r| TmaBox {
                origin: [b.origin[0] + r * slab, b.origin[1]],
                smem_offset: b.smem_offset + r * slab * row_bytes,
            })
        })
        .collect();
    let multicast = (0..load.boxes.len() as u32)
        .map(|b| Multicast {
            issuer: b % CTAS,
            mask: ((1u32 << CTAS) - 1) as u16,
        })
        .collect();
    let Some(empty) = s.loads[shared].free else {
        return Err("its shared load is never released".into());
    };
    if let Some(m) = s.barriers[empty].as_mbarrier_mut() {
        m.count *= CTAS;
        m.scope = Scope::Cluster;
    }
    for r in s.roles.iter_mut().filter(|r| r.kind == RoleKind::Consumer) {
        r.program.iteration = r
            .program
            .iteration
            .iter()
            .flat_map(|&op| match op {
                Op::Arrive { bar, lag } if bar == empty => {
                    vec![op, Op::ArrivePeer { bar, lag }]
                }
                _ => vec![op],
            })
            .collect();
        r.program.exit.push(Op::ClusterSync);
    }
    Ok(multicast)
}

/// Pairs `s` in the 2-SM form around ring load `shared` on sm_100a (see
/// [`crate::sched::cluster`]): CTA `r` loads half `r` of it along N, into the same offset of
/// its own stage; every TMA completes on the leader's `full`, which announces both CTAs'
/// bytes; commits reach both CTAs' `empty`; returns the pair. Fails, saying why, when the
/// tile's N does not split into whole boxes.
fn pair(s: &mut Sched, shared: LoadId) -> Result<Pair, String> {
    let load = &s.loads[shared].tma;
    let [rows, cols] = load.tile_dims();
    let halved = match load.operand {
        // Stored `[N, K]`: N is the box rows, whole 8-row swizzle atoms each half.
        Operand::KMajorB if rows % (8 * CTAS) == 0 => {
            TmaLoad::new(load.load, load.param, Operand::KMajorB, rows / CTAS, cols)
        }
        // Stored `[K, N]`: N is the 64-column boxes, whole boxes each half.
        Operand::MnMajorB if cols % (64 * CTAS) == 0 => {
            TmaLoad::new(load.load, load.param, Operand::MnMajorB, rows, cols / CTAS)
        }
        Operand::KMajorB | Operand::MnMajorB => {
            return Err(format!(
                "the shared tile is {rows} x {cols}; its N does not split into {CTAS} halves of \
                 whole TMA boxes"
            ));
        }
        Operand::KMajorA | Operand::MnMajorA | Operand::Registers => {
            return Err("the shared tile is not an mma's B operand".into());
        }
    };
    let half = match load.operand {
        Operand::KMajorB => [rows / CTAS, 0],
        _ => [0, cols / CTAS],
    };
    // The stage keeps the place the pipeline planned for the whole tile.
    s.loads[shared].tma = TmaLoad {
        lead_dims: load.lead_dims,
        offset: load.offset,
        stage_stride: load.stage_stride,
        ..halved
    };
    let (full, empty) = (s.loads[shared].barrier, s.loads[shared].free);
    let bytes: u32 = s.ring_loads().map(|(_, l)| l.tma.tile_bytes()).sum::<u32>() * CTAS;
    for r in s.roles.iter_mut().filter(|r| r.kind == RoleKind::Producer) {
        for op in &mut r.program.iteration {
            if let Op::ExpectTx { bar, bytes: b } = op
                && *bar == full
            {
                *b = bytes;
            }
        }
    }
    for (bar, scope) in [(Some(full), Scope::Leader), (empty, Scope::Cluster)] {
        if let Some(m) = bar.and_then(|b| s.barriers[b].as_mbarrier_mut()) {
            m.scope = scope;
        }
    }
    Ok(Pair {
        leader: 0,
        half,
        commit_mask: ((1u32 << CTAS) - 1) as u16,
    })
}

/// Whether an operand of `load` (its coordinates) is computed from the block index along
/// `axis`.
fn load_reads(kernel: &Kernel, load: OpId, axis: Axis) -> bool {
    let coords = &kernel.ops[load].operands;
    coords.iter().any(|&v| depends_on(kernel, v, axis))
}

/// Whether `v` is computed from the block index along `axis`.
fn depends_on(kernel: &Kernel, v: ValueId, axis: Axis) -> bool {
    let mut stack = vec![v];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        let (op, is_result) = walk::defining_op(kernel, v);
        if !is_result {
            continue;
        }
        let op = &kernel.ops[op];
        if op.kind == OpKind::BlockId(axis) {
            return true;
        }
        stack.extend(op.operands.iter().copied());
        // A value yielded by an `if` depends on what its branches yield.
        for region in &op.regions {
            if let Some(&last) = region.ops.last() {
                stack.extend(kernel.ops[last].operands.iter().copied());
            }
        }
    }
    false
}
