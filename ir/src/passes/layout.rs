//! The `layout` pass: gives every tile value a [`Layout`] in `kernel.schedule.layouts`.
//!
//! Anchors (an `mma` result's accumulator layout; a `load` read only by `mma` staged in shared
//! memory) propagate forward and backward through the ops until nothing changes; a register
//! `load` still without one gets a blocked layout vectorised to 16 bytes, and the rules run
//! again. The warp grid gives every warp whole rows where a reduction or a register `mma` A
//! operand needs it, else the most square split. In: canonicalized IR. Out: the same ops;
//! every tile value has a layout. The rules in full: `docs/pipeline.md`, "Inside the passes".

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::schedule::Layout;
use crate::target::Target;
use crate::types::{Shape, Type};

use super::walk::{all_aligned16, defining_op, ops_in_order, uses};

mod conversions;

/// Assigns layouts; fails only on a combination the backends cannot realise.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let order = ops_in_order(kernel);
    let uses = uses(kernel);
    let all_aligned = all_aligned16(kernel);
    // Whether the warps are a ring's consumer warpgroups, the mma's rows their count.
    let mut ring_warps = false;
    // The warp count a kernel declares is its sm_80 schedule (mma.sync warp grid). On sm_90a
    // with every tensor TMA-able, wgmma fixes it instead: 16 accumulator rows per warp, 64 per
    // warpgroup, so the mma's rows decide how many consumer warps there are.
    if target == Target::Sm90a && all_aligned {
        let mma_rows = order
            .iter()
            .filter(|&&id| kernel.ops[id].kind == OpKind::Mma)
            .filter_map(|&id| {
                kernel
                    .ty(kernel.ops[id].results[0])
                    .shape()
                    .map(Shape::rows)
            })
            .max();
        // Only a kernel whose mmas all sit in one top-level pipelined loop can get a ring
        // (the `pipeline` pass), and only of up to three consumer warpgroups (192 rows):
        // any other is lowered the sm_80 way with the warps it declares.
        let mmas: Vec<OpId> = order
            .iter()
            .copied()
            .filter(|&id| kernel.ops[id].kind == OpKind::Mma)
            .collect();
        let one_loop = kernel.body.ops.iter().any(|&f| {
            matches!(kernel.ops[f].kind, OpKind::For { stages: Some(n) } if n >= 2) && {
                let inside = super::walk::ops_in_block_regions(kernel, f);
                mmas.iter().all(|m| inside.contains(m))
            }
        });
        if let Some(rows) = mma_rows.filter(|r| one_loop && r % 64 == 0 && r / 16 <= 12) {
            kernel.options.num_warps = (rows / 16) as u32;
            ring_warps = true;
        }
    }
    // sm_100a: a 128-row tcgen05 accumulator lives in the 128 TMEM lanes; the epilogue reads
    // it with one warp per 32 lanes, so those are the kernel's warps. The GEMM mainloop's (a
    // loop whose only mma it is) takes one or two warpgroups as its columns and the code
    // after the loop need registers (`kiln_ir::tmem::epilogue`).
    let tmem_acc = order.iter().find_map(|&id| {
        let shape = kernel
            .ty(kernel.ops[id].results.first().copied()?)
            .shape()?;
        (kernel.ops[id].kind == OpKind::Mma && shape.rows() == crate::tmem::ACC_ROWS as usize)
            .then_some((id, shape.cols() as u32))
    });
    if target == Target::Sm100a
        && all_aligned
        && let Some((mma, n)) = tmem_acc
    {
        let inside = |o: OpId| super::walk::ops_in_block_regions(kernel, o);
        let mainloop = kernel.body.ops.iter().copied().find(|&o| {
            let ops = inside(o);
            ops.contains(&mma)
                && ops
                    .iter()
                    .filter(|&&i| kernel.ops[i].kind == OpKind::Mma)
                    .count()
                    == 1
        });
        kernel.options.num_warps = match mainloop {
            Some(f) => crate::tmem::epilogue::epilogue_warps(kernel, f, n),
            None => crate::tmem::ACC_ROWS / 32,
        };
    }
    let warps = kernel.options.num_warps;
    let mut reduce_dims = [false; 2];
    let mut register_a = false;
    for &id in &order {
        let op = &kernel.ops[id];
        match op.kind {
            OpKind::Reduce { dim, .. } => {
                let rank = kernel.ty(op.operands[0]).shape().map_or(1, Shape::rank);
                // The last dimension is the blocked layout's columns; every other one
                // folds into its rows.
                reduce_dims[usize::from(dim + 1 >= rank)] = true;
            }
            OpKind::Mma => {
                let (a_def, is_result) = defining_op(kernel, op.operands[0]);
                if !is_result || super::staged_load::of(kernel, a_def).is_none() {
                    register_a = true;
                }
            }
            _ => {}
        }
    }
    let rows_per_warp = register_a || reduce_dims[1];
    let mut layouts: BTreeMap<ValueId, Layout> = BTreeMap::new();

    // Shared-memory operands: plain loads, and masked loads the copy can bound
    // (`staged_load`).
    for &id in &order {
        let op = &kernel.ops[id];
        if super::staged_load::of(kernel, id).is_none() {
            continue;
        }
        let r = op.results[0];
        let only_mma = |v: ValueId, slot: &[usize]| {
            uses.get(&v).is_some_and(|us| {
                us.iter().all(|&u| {
                    kernel.ops[u].kind == OpKind::Mma
                        && slot
                            .iter()
                            .any(|&s| kernel.ops[u].operands.get(s) == Some(&v))
                })
            })
        };
        // A transposed view read only as mma operands (`k.t()` as B; as A, `dQ^T = K^T dS^T`).
        let is_transposed_operand = |u: &crate::kernel::OpId| {
            kernel.ops[*u].kind == OpKind::Transpose && only_mma(kernel.ops[*u].results[0], &[0, 1])
        };
        let all_uses = uses.get(&r).cloned().unwrap_or_default();
        let staged = !all_uses.is_empty()
            && all_uses.iter().all(|u| {
                (kernel.ops[*u].kind == OpKind::Mma
                    && kernel.ops[*u].operands.iter().position(|&x| x == r) < Some(2))
                    || is_transposed_operand(u)
            });
        if staged {
            layouts.insert(r, Layout::Shared { transposed: false });
            for u in &all_uses {
                if kernel.ops[*u].kind == OpKind::Transpose {
                    layouts.insert(
                        kernel.ops[*u].results[0],
                        Layout::Shared { transposed: true },
                    );
                }
            }
        }
    }

    // A gather read only as an `mma` A operand (a MoE expert's routed rows) is loaded
    // straight into the accumulator layout that a register A operand takes. One read as a B
    // operand (or a masked load no copy can bound) is loaded into registers in the layout
    // the rules give it, and `mma_operands` stages it in shared memory from there.
    for &id in &order {
        let op = &kernel.ops[id];
        if !matches!(op.kind, OpKind::Gather { .. }) {
            continue;
        }
        let r = op.results[0];
        if layouts.get(&r).is_some_and(Layout::is_shared) {
            continue;
        }
        let only_a = uses.get(&r).is_some_and(|us| {
            us.iter().all(|&u| {
                kernel.ops[u].kind == OpKind::Mma && kernel.ops[u].operands.first() == Some(&r)
            })
        });
        if only_a {
            layouts.insert(r, Layout::Mma { warps: [warps, 1] });
        }
    }

    // Fixed point over forward and backward rules; then the first tile without a layout
    // gets a blocked one and the rules run again.
    loop {
        let before = layouts.len();
        for &id in &order {
            let op = kernel.ops[id].clone();
            let tile = |v: &ValueId| kernel.ty(*v).shape().is_some();
            match &op.kind {
                OpKind::Mma => {
                    let shape = kernel
                        .ty(op.results[0])
                        .shape()
                        .cloned()
                        .unwrap_or(Shape(Vec::new()));
                    // sm_90a: a warpgroup's wgmma accumulator is the `#mma(4x1)` layout of
                    // its 64 rows, so a tile of 16 rows per warp gets whole rows per warp,
                    // unless a tensor is not 16-byte aligned (no TMA: the sm_80 lowering).
                    let wgmma_rows =
                        target == Target::Sm90a && all_aligned && shape.rows() as u32 == 16 * warps;
                    let tcgen05 = target == Target::Sm100a
                        && all_aligned
                        && shape.rows() as u32 == crate::tmem::ACC_ROWS;
                    let col_blocks = if ring_warps {
                        wgmma_col_blocks(kernel, &op, &shape, warps)
                    } else {
                        None
                    };
                    let l = if tcgen05 {
                        crate::tmem::accumulator_layout(warps)
                    } else if let Some(col_blocks) = col_blocks {
                        Layout::WgmmaColumns { col_blocks }
                    } else {
                        Layout::Mma {
                            warps: warp_grid(&shape, warps, rows_per_warp || wgmma_rows),
                        }
                    };
                    if let Some(&c) = op.operands.get(2) {
                        set(&mut layouts, c, l.clone());
                    }
                    set(&mut layouts, op.results[0], l);
                }
                OpKind::Unary(_) | OpKind::Cast { .. } | OpKind::Bitcast { .. } => {
                    flow_same(&mut layouts, op.operands[0], op.results[0]);
                }
                // The result is in its indices' layout; the gathered tile keeps its own.
                OpKind::Take { .. } => {
                    flow_same(&mut layouts, op.operands[1], op.results[0]);
                }
                OpKind::Binary(_) | OpKind::Select => {
                    let r = op.results[0];
                    if !tile(&r) {
                        continue;
                    }
                    let shape = kernel.ty(r).shape().cloned().unwrap_or(Shape(Vec::new()));
                    if !layouts.contains_key(&r) {
                        let full = op.operands.iter().find(|v| {
                            kernel.ty(**v).shape() == Some(&shape) && layouts.contains_key(v)
                        });
                        if let Some(l) = full.and_then(|v| layouts.get(v)).cloned() {
                            layouts.insert(r, l);
                        }
                    }
                    if let Some(l) = layouts.get(&r).cloned() {
                        for v in op.operands.iter().filter(|v| tile(v)) {
                            let vs = kernel.ty(*v).shape().cloned().unwrap_or(Shape(Vec::new()));
                            if layouts.contains_key(v) {
                                continue;
                            }
                            if vs == shape {
                                layouts.insert(*v, l.clone());
                            } else if let Some(bl) = broadcast_layout(&vs, &shape, &l) {
                                layouts.insert(*v, bl);
                            }
                        }
                    }
                }
                OpKind::Gather { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
                    access_layouts(kernel, &op, &mut layouts);
                }
                // A register tile's transpose is a view: its elements stay where they are.
                OpKind::Transpose => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    if let (Some(l), false) = (layouts.get(&x), layouts.contains_key(&r))
                        && !l.is_shared()
                    {
                        layouts.insert(r, l.transposed());
                    }
                }
                OpKind::Reduce { dim, .. } => {
                    let x = op.operands[0];
                    if let (Some(l), false) = (
                        layouts.get(&x).cloned(),
                        layouts.contains_key(&op.results[0]),
                    ) {
                        let parent_shape =
                            kernel.ty(x).shape().cloned().unwrap_or(Shape(Vec::new()));
                        layouts.insert(
                            op.results[0],
                            Layout::Slice {
                                dim: *dim,
                                keep_dim: false,
                                parent: Box::new(l),
                                parent_shape,
                            },
                        );
                    }
                }
                OpKind::Reshape { .. } if !is_view(kernel, &op) => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    let (xs, rs) = (kernel.ty(x).shape(), kernel.ty(r).shape());
                    let (Some(xs), Some(rs)) = (xs.cloned(), rs.cloned()) else {
                        continue;
                    };
                    // A blocked layout folds every dimension but the last into rows: a
                    // reshape keeping the last dimension keeps every element where it was.
                    // Removing extents of 1 slices them away (the way back from
                    // `.unsqueeze(d)`). Any other reshape takes the layouts its neighbours
                    // give it and moves its elements where they differ.
                    let same_last = xs.dims().last() == rs.dims().last();
                    let carry = |l: &Layout, from: &Shape, to: &Shape| {
                        if same_last
                            && matches!(l, Layout::Blocked { .. })
                            && l.distribution(to).is_ok()
                        {
                            Some(l.clone())
                        } else {
                            drop_units(l, from, to)
                        }
                    };
                    match (layouts.get(&x).cloned(), layouts.get(&r).cloned()) {
                        (Some(l), None) => {
                            if let Some(nl) = carry(&l, &xs, &rs) {
                                layouts.insert(r, nl);
                            }
                        }
                        (None, Some(l)) => {
                            if let Some(nl) = carry(&l, &rs, &xs) {
                                layouts.insert(x, nl);
                            }
                        }
                        _ => {}
                    }
                }
                OpKind::Reshape { .. } => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    let (Some(xs), Some(rs)) =
                        (kernel.ty(x).shape().cloned(), kernel.ty(r).shape().cloned())
                    else {
                        continue;
                    };
                    if let (Some(l), false) = (layouts.get(&x).cloned(), layouts.contains_key(&r)) {
                        if let Some(nl) = view_layout(&l, &xs, &rs) {
                            layouts.insert(r, nl);
                        }
                    } else if let (Some(l), false) =
                        (layouts.get(&r).cloned(), layouts.contains_key(&x))
                        && let Some(nl) = view_layout(&l, &rs, &xs)
                    {
                        layouts.insert(x, nl);
                    }
                }
                OpKind::For { .. } => {
                    let body = &op.regions[0];
                    let yields = body
                        .ops
                        .last()
                        .map(|&y| kernel.ops[y].operands.clone())
                        .unwrap_or_default();
                    for (i, &res) in op.results.iter().enumerate() {
                        let group = [op.operands[3 + i], body.args[1 + i], yields[i], res];
                        unify(&mut layouts, &group);
                    }
                }
                OpKind::If => {
                    for (i, &res) in op.results.iter().enumerate() {
                        let mut group = vec![res];
                        for region in &op.regions {
                            if let Some(&y) = region.ops.last() {
                                group.push(kernel.ops[y].operands[i]);
                            }
                        }
                        unify(&mut layouts, &group);
                    }
                }
                OpKind::Const(_)
                | OpKind::ScalarParam(_)
                | OpKind::BlockId(_)
                | OpKind::GridDim(_)
                | OpKind::TensorDim { .. }
                | OpKind::LoadScalar { .. }
                | OpKind::ScalarAtomic { .. }
                | OpKind::Load { .. }
                | OpKind::Splat { .. }
                | OpKind::Iota { .. }
                | OpKind::Permute { .. }
                | OpKind::Convert
                | OpKind::Store { .. }
                | OpKind::Print { .. }
                | OpKind::Yield => {}
            }
        }
        if layouts.len() == before {
            // A register `load` first: it is the tile the others derive from (softmax's
            // row statistics are slices of its input's layout, not blocked of their own).
            let unset = |v: &ValueId| kernel.ty(*v).shape().is_some() && !layouts.contains_key(v);
            // The tile an addressed access runs over comes before them: its index tiles and
            // mask then follow its layout (a row gather's indices as its slice).
            let accessed = order.iter().find_map(|&id| {
                let op = &kernel.ops[id];
                match op.kind {
                    OpKind::Gather { .. } => Some(op.results[0]),
                    OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
                        op.access_operands().and_then(|p| p.value)
                    }
                    _ => None,
                }
                .filter(unset)
            });
            let load = accessed.or_else(|| {
                order.iter().find_map(|&id| {
                    let op = &kernel.ops[id];
                    matches!(op.kind, OpKind::Load { .. })
                        .then(|| op.results[0])
                        .filter(unset)
                })
            });
            let missing = load.or_else(|| {
                order.iter().find_map(|&id| {
                    let op = &kernel.ops[id];
                    let args = op.regions.iter().flat_map(|b| b.args.iter());
                    op.results.iter().chain(args).copied().find(unset)
                })
            });
            match missing {
                Some(v) => {
                    let ty = kernel.ty(v).clone();
                    layouts.insert(v, blocked(&ty, warps, reduce_dims));
                }
                None => break,
            }
        }
    }

    // Defaults for tiles no rule reached, then a check that every layout fits its tile.
    for &id in &order {
        let op = &kernel.ops[id];
        let args = op.regions.iter().flat_map(|b| b.args.iter());
        for &v in op.results.iter().chain(args) {
            let ty = kernel.ty(v).clone();
            if ty.shape().is_none() {
                continue;
            }
            let l = layouts
                .entry(v)
                .or_insert_with(|| blocked(&ty, warps, reduce_dims));
            if let (false, Some(shape)) = (l.is_shared(), ty.shape()) {
                l.distribution(shape)
                    .map_err(|e| misfit(op.loc, e, warps))?;
            }
        }
    }
    conversions::insert(kernel, &mut layouts);
    kernel.schedule.layouts = layouts;
    Ok(())
}

/// An addressed memory op's tiles (index tiles, mask, compare, values, result) share the
/// layout of the accessed tile (the result of a gather, the values of a scatter or atomic),
/// or its slice where they broadcast along a dimension, so each thread addresses the
/// elements it holds.
fn access_layouts(
    kernel: &Kernel,
    op: &crate::kernel::Op,
    layouts: &mut BTreeMap<ValueId, Layout>,
) {
    let Some(parts) = op.access_operands() else {
        return;
    };
    let anchor = match op.kind {
        OpKind::Gather { .. } => op.results[0],
        _ => match parts.value {
            Some(v) => v,
            None => return,
        },
    };
    // A masked load staged in shared memory is copied, bounded, without its mask tile.
    if layouts.get(&anchor).is_some_and(Layout::is_shared) {
        return;
    }
    let Some(shape) = kernel.ty(anchor).shape().cloned() else {
        return;
    };
    let tiles: Vec<ValueId> = parts
        .addr
        .iter()
        .copied()
        .chain(parts.compare)
        .chain(parts.mask)
        .chain(op.results.iter().copied())
        .chain(parts.value)
        .filter(|v| *v != anchor && kernel.ty(*v).shape().is_some())
        .collect();
    if !layouts.contains_key(&anchor)
        && let Some(l) = tiles
            .iter()
            .find(|v| kernel.ty(**v).shape() == Some(&shape) && layouts.contains_key(v))
            .and_then(|v| layouts.get(v))
            .cloned()
    {
        layouts.insert(anchor, l);
    }
    let Some(l) = layouts.get(&anchor).cloned() else {
        return;
    };
    for v in tiles {
        if layouts.contains_key(&v) {
            continue;
        }
        let vs = kernel.ty(v).shape().cloned().unwrap_or(Shape(Vec::new()));
        if vs == shape {
            layouts.insert(v, l.clone());
        } else if let Some(bl) = broadcast_layout(&vs, &shape, &l) {
            layouts.insert(v, bl);
        }
    }
}

/// A tile kiln cannot spread over the block's warps, in the user's terms (the layout's
/// name is kiln's): valid, but not lowered until layouts cover it.
fn misfit(loc: crate::kernel::Loc, e: crate::schedule::LayoutError, warps: u32) -> Diagnostic {
    let crate::schedule::LayoutError::Misfit { shape, why, .. } = e;
    Diagnostic::unsupported(
        loc,
        format!("kiln cannot spread this {shape} tile over the block's {warps} warps yet: {why}"),
    )
    .note("a larger tile, or fewer warps (`#[kernel(num_warps = N)]`), fits")
}

fn set(layouts: &mut BTreeMap<ValueId, Layout>, v: ValueId, l: Layout) {
    layouts.entry(v).or_insert(l);
}

fn flow_same(layouts: &mut BTreeMap<ValueId, Layout>, x: ValueId, r: ValueId) {
    match (layouts.get(&x).cloned(), layouts.get(&r).cloned()) {
        (Some(l), None) => {
            layouts.insert(r, l);
        }
        (None, Some(l)) => {
            layouts.insert(x, l);
        }
        _ => {}
    }
}

/// Gives every value of `group` the layout of the first one that has one.
fn unify(layouts: &mut BTreeMap<ValueId, Layout>, group: &[ValueId]) {
    if let Some(l) = group.iter().find_map(|v| layouts.get(v)).cloned() {
        for &v in group {
            layouts.entry(v).or_insert_with(|| l.clone());
        }
    }
}

/// The dimension along which `small` (extent 1 there) broadcasts to `full`.
fn broadcast_dim(small: &Shape, full: &Shape) -> Option<usize> {
    if small.rank() != 2 || full.rank() != 2 {
        return None;
    }
    (0..2).find(|&d| small.dims()[d] == 1 && full.dims()[d] != 1)
}

/// The layout in which `small` broadcasts to `full` in layout `l` without moving: `l` sliced
/// (keeping the unit dimension) along each dimension `small` broadcasts along. A 2-D tile
/// broadcasts along one dimension ([`broadcast_dim`]); one of rank 3 or more along any.
pub(super) fn broadcast_layout(small: &Shape, full: &Shape, l: &Layout) -> Option<Layout> {
    if full.rank() < 3 {
        let dim = broadcast_dim(small, full)?;
        return Some(Layout::Slice {
            dim,
            keep_dim: true,
            parent: Box::new(l.clone()),
            parent_shape: full.clone(),
        });
    }
    if small.rank() != full.rank() {
        return None;
    }
    let mut layout = l.clone();
    let mut shape = full.clone();
    for d in 0..full.rank() {
        if small.dims()[d] == 1 && full.dims()[d] != 1 {
            let parent_shape = shape.clone();
            shape.0[d] = 1;
            layout = Layout::Slice {
                dim: d,
                keep_dim: true,
                parent: Box::new(layout),
                parent_shape,
            };
        } else if small.dims()[d] != full.dims()[d] {
            return None;
        }
    }
    (shape != *full).then_some(layout)
}

/// Whether reshape `op` is a view of the same registers between tiles of at most 2
/// dimensions that only adds or removes extents of 1 (`.col()`), as opposed to a general
/// reshape (any other, and every one of a tile of rank 3 or more), which keeps the
/// registers where the layouts agree and otherwise moves the elements.
pub(crate) fn is_view(kernel: &Kernel, op: &crate::kernel::Op) -> bool {
    let squeeze = |v: ValueId| {
        kernel
            .ty(v)
            .shape()
            .filter(|s| s.rank() <= 2)
            .map(|s| s.0.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>())
    };
    let (a, b) = (squeeze(op.operands[0]), squeeze(op.results[0]));
    a.is_some() && a == b
}

/// Layout `l` of a tile of shape `from` with the extents of 1 that `to` lacks sliced away,
/// when `to` is `from` without some of its extents of 1.
fn drop_units(l: &Layout, from: &Shape, to: &Shape) -> Option<Layout> {
    if to.rank() >= from.rank() {
        return None;
    }
    let mut removed = Vec::new();
    let mut j = 0;
    for (i, &n) in from.dims().iter().enumerate() {
        if to.dims().get(j) == Some(&n) {
            j += 1;
        } else if n == 1 {
            removed.push(i);
        } else {
            return None;
        }
    }
    if j != to.rank() || l.is_shared() {
        return None;
    }
    let mut layout = l.clone();
    let mut shape = from.clone();
    for &d in removed.iter().rev() {
        let parent_shape = shape.clone();
        shape.0.remove(d);
        layout = Layout::Slice {
            dim: d,
            keep_dim: false,
            parent: Box::new(layout),
            parent_shape,
        };
    }
    Some(layout)
}

/// A shape seen as the blocked layout's `(rows, cols)`: a 1-D tile is one row; every
/// dimension but the last folds into the rows.
fn fold2(shape: &Shape) -> (u32, u32) {
    match shape.dims().split_last() {
        Some((&c, lead)) => (lead.iter().product::<usize>() as u32, c as u32),
        None => (1, 1),
    }
}

/// Layout `l` of a tile of shape `from` seen as shape `to` by a view reshape: the same
/// layout where the shapes agree; a slice gains its unit dimension (`.col()`/`.row()`) where
/// `to` adds an extent of 1 at the sliced dimension, and loses it where `to` removes that
/// extent. `None` for any other view: its neighbours give it a layout.
pub(super) fn view_layout(l: &Layout, from: &Shape, to: &Shape) -> Option<Layout> {
    if from == to {
        return Some(l.clone());
    }
    let Layout::Slice {
        dim,
        keep_dim,
        parent,
        parent_shape,
    } = l
    else {
        return None;
    };
    let unit_at_dim = |s: &Shape| s.dims().get(*dim) == Some(&1);
    let to_keep = if to.rank() == from.rank() + 1 && !*keep_dim && unit_at_dim(to) {
        true
    } else if from.rank() == to.rank() + 1 && *keep_dim && unit_at_dim(from) {
        false
    } else {
        return None;
    };
    Some(Layout::Slice {
        dim: *dim,
        keep_dim: to_keep,
        parent: parent.clone(),
        parent_shape: parent_shape.clone(),
    })
}

/// The column blocks over which a ring's consumer warpgroups (`warps` warps) split the
/// accumulator of `mma` (of `shape`), when it has fewer rows than they do (64 query rows
/// under two warpgroups): each warpgroup then computes its rows' block of `N / blocks`
/// columns with its own wgmma, which needs A in shared memory (a staged load, or a
/// register tile's transpose the consumers stage) and each block's first column at the
/// start of one of B's TMA boxes (B stored `[K, N]`: `N / blocks` a multiple of the box's
/// columns; stored `[N, K]`, read through `.t()`: any 8 rows). `None`: no split.
fn wgmma_col_blocks(
    kernel: &Kernel,
    mma: &crate::kernel::Op,
    shape: &Shape,
    warps: u32,
) -> Option<u32> {
    let (m, n) = (shape.rows() as u32, shape.cols() as u32);
    let rows = 16 * warps;
    if m == 0 || !m.is_multiple_of(64) || m >= rows || !rows.is_multiple_of(m) {
        return None;
    }
    let blocks = rows / m;
    let block = n / blocks;
    let defined_by = |v: ValueId| defining_op(kernel, v);
    let (a_def, a_is_result) = defined_by(mma.operands[0]);
    let half = matches!(
        kernel.ty(mma.operands[0]).dtype(),
        crate::types::DType::Bf16 | crate::types::DType::F16
    );
    let a_shared = half
        && a_is_result
        && (kernel.ops[a_def].kind == OpKind::Transpose
            || super::staged_load::of(kernel, a_def).is_some());
    let (b_def, b_is_result) = defined_by(mma.operands[1]);
    let b_k_major = b_is_result && kernel.ops[b_def].kind == OpKind::Transpose;
    let b_boxes_align = if b_k_major {
        block.is_multiple_of(8)
    } else {
        block.is_multiple_of(crate::sched::tma::box_columns(n))
    };
    (a_shared && block * blocks == n && block.is_multiple_of(16) && b_boxes_align).then_some(blocks)
}

/// The warp grid of an mma accumulator of `shape`: with `rows_per_warp`, whole rows a warp
/// (`[warps, 1]`) where the tile has 16 rows for each warp, else as many warps along the
/// rows as it fills and the rest along the columns (a 64-row tile over 8 warps: `[4, 2]`).
fn warp_grid(shape: &Shape, warps: u32, rows_per_warp: bool) -> [u32; 2] {
    let (m, n) = (shape.rows() as u32, shape.cols() as u32);
    if rows_per_warp {
        let fits = |wm: u32| m.is_multiple_of(16 * wm) && n.is_multiple_of(8 * (warps / wm));
        let mut wm = warps;
        while wm > 1 && !fits(wm) {
            wm /= 2;
        }
        // A tile no grid fits keeps whole rows a warp: the layout check reports it.
        return if fits(wm) {
            [wm, warps / wm]
        } else {
            [warps, 1]
        };
    }
    let mut best = [warps, 1];
    let mut best_cost = u32::MAX;
    let mut wm = 1;
    while wm <= warps {
        let wn = warps / wm;
        if wm * wn == warps && m % (16 * wm) == 0 && n % (8 * wn) == 0 {
            let cost = (m / wm).abs_diff(n / wn);
            if cost < best_cost {
                best = [wm, wn];
                best_cost = cost;
            }
        }
        wm *= 2;
    }
    best
}

/// The largest power of two dividing `x` (and at most `cap`).
fn pow2_div(x: u32, cap: u32) -> u32 {
    let mut p = 1;
    while p * 2 <= cap && x.is_multiple_of(p * 2) {
        p *= 2;
    }
    p
}

/// A blocked layout for a tile of `ty`: vectors of up to 16 bytes along the contiguous
/// dimension, lanes along it first (a warp's accesses then cover one contiguous run of up to
/// 512 bytes), warps along the rows. A dimension that is reduced somewhere in the kernel is
/// never split over warps. The vector narrows (8, 4 bytes, ...) when that leaves fewer
/// threads holding copies of what another holds (a tile too small for full vectors on every
/// thread): loads then read each element once where the tile allows it.
fn blocked(ty: &Type, warps: u32, reduce_dims: [bool; 2]) -> Layout {
    let shape = ty.shape().cloned().unwrap_or(Shape(Vec::new()));
    let (_, cols) = fold2(&shape);
    let widest = pow2_div(cols, (16 / ty.dtype().size_bytes().max(1)) as u32);
    // The vector is chosen on the layouts without split reductions (warps spread over a
    // reduced dimension only take what the chosen vector leaves them), unless even those
    // leave some warps holding replicas of a tile with an element for every thread: then on
    // the split layouts. A row of 4608 columns over 16 warps takes 8-element vectors on 2
    // warps (576 vectors are 18 warps' worth, of which a power of two divides only 2) but
    // single elements on all 16; a tile too small for every thread keeps its vector (64
    // bf16 over 4 warps: pairs on one warp, no reduction across warps).
    let narrowest = |split: bool| {
        let mut vec = widest;
        let mut best = (vec, blocked_with(&shape, vec, warps, reduce_dims, split));
        while vec > 1 {
            vec /= 2;
            let l = blocked_with(&shape, vec, warps, reduce_dims, split);
            if replicas(&l, warps) < replicas(&best.1, warps) {
                best = (vec, l);
            }
        }
        best
    };
    let unsplit = narrowest(false).0;
    let wide = blocked_with(&shape, unsplit, warps, reduce_dims, true);
    let every_thread = shape.numel() >= (32 * warps) as usize;
    let vec = if every_thread && replicas(&wide, warps) > 1 {
        narrowest(true).0
    } else {
        unsplit
    };
    let l = blocked_with(&shape, vec, warps, reduce_dims, true);
    // A tile of rank 3 or more whose folded rows the threads cannot split per dimension
    // (`[2, 96, D]`): the threads' rows stay inside the largest power of two dividing the
    // innermost leading extent, and repetitions cover the rest.
    if shape.rank() >= 3 && l.distribution(&shape).is_err() {
        let inner = shape.dims()[shape.rank() - 2] as u32;
        let within = Shape(vec![pow2_div(inner, inner) as usize, cols as usize]);
        return blocked(&Type::tile(ty.dtype(), within.dims()), warps, reduce_dims);
    }
    l
}

/// How many threads of layout `l` hold each element (1: none is replicated).
fn replicas(l: &Layout, warps: u32) -> u32 {
    match l {
        Layout::Blocked {
            threads_per_warp: t,
            warps: w,
            ..
        } => 32 / (t[0] * t[1]).max(1) * (warps / (w[0] * w[1]).max(1)).max(1),
        _ => 1,
    }
}

/// [`blocked`] with `vec` elements per thread along the columns; `split_reduced`: warps the
/// tile leaves over split a reduced dimension.
fn blocked_with(
    shape: &Shape,
    vec: u32,
    warps: u32,
    reduce_dims: [bool; 2],
    split_reduced: bool,
) -> Layout {
    let (rows, cols) = fold2(shape);
    let tc = pow2_div(cols / vec, 32);
    let tr = pow2_div(rows, 32 / tc);
    let (mut wr, mut wc) = (1, 1);
    if !(reduce_dims[0] && shape.rank() >= 2) {
        wr = pow2_div(rows / tr, warps);
    }
    if !reduce_dims[1] {
        wc = pow2_div(cols / (vec * tc), warps / wr);
    }
    if wr * wc < warps && !reduce_dims[1] && shape.rank() >= 2 && reduce_dims[0] {
        wc = pow2_div(cols / (vec * tc), warps);
    }
    // Warps the other dimension cannot take split a reduced one: their partial results
    // meet in shared memory (a one-row softmax uses every warp, not one). Any left hold
    // replicas; `Distribution` wraps the warp index modulo the grid.
    if split_reduced && wr * wc < warps {
        wc *= pow2_div(cols / (vec * tc * wc), warps / (wr * wc));
    }
    if split_reduced && wr * wc < warps && shape.rank() >= 2 {
        wr *= pow2_div(rows / (tr * wr), warps / (wr * wc));
    }
    Layout::Blocked {
        size_per_thread: [1, vec],
        threads_per_warp: [tr, tc],
        warps: [wr.max(1), wc.max(1)],
    }
}

#[cfg(test)]
mod tests {
    use super::{Layout, blocked, warp_grid};
    use crate::types::{DType, Shape, Type};

    fn tile(dtype: DType, dims: &[usize]) -> Type {
        Type::Tile {
            dtype,
            shape: Shape(dims.to_vec()),
        }
    }

    fn layout(spt: u32, tpw: [u32; 2], warps: [u32; 2]) -> Layout {
        Layout::Blocked {
            size_per_thread: [1, spt],
            threads_per_warp: tpw,
            warps,
        }
    }

    #[test]
    fn blocked_layouts_take_16_byte_vectors_and_spare_replicas() {
        // Row kernels (reductions along the rows): 16 bytes a thread, a warp per row.
        let rows = [false, true];
        assert_eq!(
            blocked(&tile(DType::F32, &[4, 512]), 4, rows),
            layout(4, [1, 32], [4, 1])
        );
        assert_eq!(
            blocked(&tile(DType::Bf16, &[4, 1024]), 4, rows),
            layout(8, [1, 32], [4, 1])
        );
        // A vector: warps side by side along it.
        assert_eq!(
            blocked(&tile(DType::F32, &[1024]), 4, [false; 2]),
            layout(4, [1, 32], [1, 4])
        );
        // 64 bf16 in one row: eight a lane would leave 24 lanes copying; two a lane use all
        // 32 (the warps copy one another: too few columns are left to split).
        assert_eq!(
            blocked(&tile(DType::Bf16, &[1, 64]), 4, rows),
            layout(2, [1, 32], [1, 1])
        );
        // Rows no power of two long: whole vectors would reach only the warps a power of two
        // of them divides (4608 bf16 are 576 vectors of 8, 18 warps' worth: 2 of 16); single
        // elements reach every warp.
        assert_eq!(
            blocked(&tile(DType::Bf16, &[1, 4608]), 16, rows),
            layout(1, [1, 32], [1, 16])
        );
        assert_eq!(
            blocked(&tile(DType::F32, &[1, 4352]), 8, rows),
            layout(1, [1, 32], [1, 8])
        );
        // 6144 bf16 over 16 warps: 4-element vectors are the widest that reach them all.
        assert_eq!(
            blocked(&tile(DType::Bf16, &[1, 6144]), 16, rows),
            layout(4, [1, 32], [1, 16])
        );
        // A long row: 16 bytes a lane, every warp on a quarter of it.
        assert_eq!(
            blocked(&tile(DType::F32, &[1, 4096]), 4, rows),
            layout(4, [1, 32], [1, 4])
        );
        // 4 x 32 f32 without reductions: one element a thread covers it exactly.
        assert_eq!(
            blocked(&tile(DType::F32, &[4, 32]), 4, [false; 2]),
            layout(1, [1, 32], [4, 1])
        );
    }

    #[test]
    fn accumulators_keep_whole_rows_a_warp_where_the_rows_allow() {
        let shape = |m, n| Shape(vec![m, n]);
        // 16 rows for each warp: whole rows a warp.
        assert_eq!(warp_grid(&shape(128, 64), 8, true), [8, 1]);
        // 64 rows over 8 warps (dQ beside 128 keys): 16 rows a warp, two warps a row.
        assert_eq!(warp_grid(&shape(64, 128), 8, true), [4, 2]);
        assert_eq!(warp_grid(&shape(16, 64), 4, true), [1, 4]);
        // No grid fits: whole rows, which the layout check then reports.
        assert_eq!(warp_grid(&shape(16, 8), 4, true), [4, 1]);
        // Without the need, the squarest blocks.
        assert_eq!(warp_grid(&shape(128, 128), 4, false), [2, 2]);
    }
}
