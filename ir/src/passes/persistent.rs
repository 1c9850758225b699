//! sm_90a, sm_100a: persistent CTAs. A warp-specialised kernel whose stage ring is a loop of its top
//! level becomes persistent: the launch runs as many CTAs as fit on the GPU, and each walks
//! work tiles (blocks of the kernel's logical grid) in the order of [`TileScheduler`]. The
//! producer issues the next tile's loads while the consumers finish the current one (its
//! epilogue), instead of a new CTA starting cold.
//!
//! Per tile the producer recomputes the scalars it needs from the ops before the loop, so
//! those may not write memory. The ring's stages and phases continue across tiles; once loads
//! get the `once_free` barrier, which the consumers arrive on when no wgmma reads them any
//! more and the producer waits on before reloading (see `kiln_ir::ring`).
//!
//! A kernel that asks for clusters of 2 ([`crate::dsl::cluster`]) gets them here when its
//! ring has the structure [`crate::cluster`] needs, decided from the loads alone: a
//! persistent sm_90a or sm_100a ring of two loads in the grouped tile order (no once loads, not rotated,
//! not split), of which exactly one reads no `block_id().x`, so the pair of tiles `(2p, y)`,
//! `(2p + 1, y)` reads the same tile of it; that load is multicast (sm_100a: split between
//! the pair of one 2-SM mma, [`cluster::pair_ring`]) and the tile scheduler
//! deals pairs (its groups of x blocks counted in pairs). Any other kernel asking for a
//! cluster is a diagnostic at the request.

use crate::cluster;
use crate::diag::Diagnostic;
use crate::kernel::{Axis, Kernel, OpId, OpKind, ValueId};
use crate::ring::{Bar, Ring, Step};
use crate::sched::tiles::TileScheduler;
use crate::target::Target;

use super::walk;

/// Makes the kernel persistent when it has the shape above; leaves it as it is otherwise.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    // sm_100a's roles are planned later (`tmem`), for any ring; its programs run per tile.
    let specialised = match target {
        Target::Sm90a => kernel.schedule.roles.is_some(),
        Target::Sm100a => !kernel.schedule.rings.is_empty(),
        Target::Sm80 => false,
    };
    if !specialised {
        return Ok(());
    }
    let ring_loops: Vec<OpId> = kernel.schedule.rings.keys().copied().collect();
    let [id] = ring_loops[..] else {
        return Ok(());
    };
    let Some(at) = kernel.body.ops.iter().position(|&o| o == id) else {
        return Ok(());
    };
    let before = &kernel.body.ops[..at];
    if before
        .iter()
        .flat_map(|&o| std::iter::once(o).chain(walk::ops_in_block_regions(kernel, o)))
        .any(|o| matches!(kernel.ops[o].kind, OpKind::Store { .. }))
    {
        return Ok(());
    }
    let order = order(kernel, id);
    let saved = kernel.schedule.clone();
    let ring = kernel
        .schedule
        .rings
        .get_mut(&id)
        .ok_or_else(|| Diagnostic::internal(kernel.ops[id].loc, "a ring vanished"))?;
    persist(ring);
    kernel.schedule.tiles = Some(order);
    // Without room for the `once_free` barrier the kernel stays as it was.
    if super::pipeline::place(kernel).is_err() {
        kernel.schedule = saved;
        return Ok(());
    }
    if kernel.options.cluster > 1 {
        cluster_pairs(kernel, id, target)?;
    }
    Ok(())
}

/// Clusters persistent ring `id` as the kernel asked (see the module doc), or fails at the
/// request saying why it cannot.
fn cluster_pairs(kernel: &mut Kernel, id: OpId, target: Target) -> Result<(), Diagnostic> {
    let (ctas, loc) = (kernel.options.cluster, kernel.options.cluster_loc);
    let fail = |why: String| {
        Diagnostic::new(
            loc,
            format!("this kernel cannot run in clusters of {ctas}: {why}"),
        )
        .note("ask for `cluster(1)`, or leave clusters to the autotuner, which skips this")
    };
    let ring = &kernel.schedule.rings[&id];
    let why = if !matches!(target, Target::Sm90a | Target::Sm100a) {
        Some(format!(
            "clusters are scheduled on sm_90a and sm_100a only, not {target}"
        ))
    } else if ctas != cluster::CTAS {
        Some(format!("clusters have {} CTAs", cluster::CTAS))
    } else if !ring.once.is_empty() || ring.overlap.is_some() || !ring.tail_loads.is_empty() {
        Some("its pipelined loop is not a GEMM mainloop (once loads, rotated or split)".into())
    } else if !matches!(kernel.schedule.tiles, Some(TileScheduler::Grouped { .. })) {
        Some("its loads do not reuse tiles along both x and y as a GEMM's do".into())
    } else {
        None
    };
    if let Some(why) = why {
        return Err(fail(why));
    }
    let reads_x = |load: OpId| {
        kernel.ops[load]
            .operands
            .iter()
            .any(|&v| depends_on(kernel, v, Axis::X))
    };
    let shared: Vec<usize> = (0..ring.loads.len())
        .filter(|&l| !reads_x(ring.loads[l].load))
        .collect();
    let [shared] = shared[..] else {
        return Err(fail(format!(
            "{} of its {} loads read no `block_id().x`; the pair of x-adjacent tiles must              share exactly one",
            shared.len(),
            ring.loads.len()
        )));
    };
    let ring = kernel
        .schedule
        .rings
        .get_mut(&id)
        .ok_or_else(|| Diagnostic::internal(loc, "a ring vanished"))?;
    // sm_100a pairs the CTAs in the 2-SM form (one `tcgen05.mma.cta_group::2` over both),
    // sm_90a multicasts the shared tile into both CTAs' rings.
    match target {
        Target::Sm100a => cluster::pair_ring(ring, shared),
        _ => cluster::cluster_ring(ring, shared),
    }
    .map_err(fail)?;
    // The scheduler deals pairs: a group of GROUP_ROWS x blocks is GROUP_ROWS / 2 pairs.
    kernel.schedule.tiles = Some(TileScheduler::Grouped {
        rows: GROUP_ROWS / cluster::CTAS,
    });
    Ok(())
}

/// Makes `ring` run once per work tile: with once loads, the producer waits on `once_free`
/// before reloading them and the consumers release them.
pub(crate) fn persist(ring: &mut Ring) {
    ring.persistent = true;
    if !ring.once.is_empty() {
        ring.producer_once.insert(
            0,
            Step::Wait {
                bar: Bar::OnceFree,
                start: 1,
            },
        );
        ring.consumer_release = vec![Step::Arrive {
            bar: Bar::OnceFree,
            lag: 0,
        }];
    }
}

/// x blocks per group of [`TileScheduler::Grouped`] (Triton's default).
const GROUP_ROWS: u32 = 8;

/// The tile order of ring loop `id`'s kernel: longest first when the loop's trip count grows
/// with x; grouped when some ring load does not read x and another does not read y (each
/// operand is reused along one axis, as a GEMM's); otherwise x fastest, so the CTAs running
/// at once share y and z.
fn order(kernel: &Kernel, id: OpId) -> TileScheduler {
    let trips = &kernel.ops[id].operands[..2];
    if trips.iter().any(|&v| depends_on(kernel, v, Axis::X)) {
        return TileScheduler::LongestFirst;
    }
    let loads = &kernel.schedule.rings[&id].loads;
    let reads = |load: OpId, axis| {
        kernel.ops[load]
            .operands
            .iter()
            .any(|&v| depends_on(kernel, v, axis))
    };
    let misses = |axis| loads.iter().any(|l| !reads(l.load, axis));
    if misses(Axis::X) && misses(Axis::Y) {
        TileScheduler::Grouped { rows: GROUP_ROWS }
    } else {
        TileScheduler::Strided
    }
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
