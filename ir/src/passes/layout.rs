//! The `layout` pass: gives every tile value a [`Layout`] in `kernel.schedule.layouts`.
//!
//! Anchors: an `mma` result gets the accumulator layout of the kernel's warp grid; a `load`
//! read only by `mma` (directly or through `transpose`) is staged in shared memory. Layouts
//! then flow forward through elementwise ops, reductions (slice layouts) and reshapes, and
//! backward into values that have none of their own (`splat`, `iota`, loop-carried initial
//! values, register `load`s), until nothing changes; then the first register `load` still
//! without one (in op order; else the first value) gets a blocked layout vectorised to 16
//! bytes and the rules run again. A register `load` combined elementwise with an
//! accumulator (a GEMM epilogue's `beta * c`) thus reads in the accumulator's layout instead
//! of converting it, which keeps the epilogue's store in the layout the sm_90a TMA store
//! takes.
//!
//! Warp grid: when a reduction or a register-resident `mma` A operand exists (attention's
//! `P @ V`), every warp owns whole rows (`num_warps x 1`), so row reductions stay inside a
//! warp and the accumulator converts to an A operand in registers. Otherwise (GEMM) the grid
//! is the most square split of the tile. Likewise, blocked layouts of kernels with a reduction
//! along a dimension never spread that dimension over warps.
//!
//! In: canonicalized IR. Out: the same ops; every tile value has a layout.

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::schedule::Layout;
use crate::target::Target;
use crate::types::{Shape, Type};

use super::walk::{all_aligned16, defining_op, ops_in_order, uses};

/// Assigns layouts; fails only on a combination the backends cannot realise.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let order = ops_in_order(kernel);
    let uses = uses(kernel);
    let all_aligned = all_aligned16(kernel);
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
                reduce_dims[if rank == 1 { 1 } else { dim.min(1) }] = true;
            }
            OpKind::Mma => {
                let (a_def, _) = defining_op(kernel, op.operands[0]);
                if !matches!(kernel.ops[a_def].kind, OpKind::Load { .. }) {
                    register_a = true;
                }
            }
            _ => {}
        }
    }
    let rows_per_warp = register_a || reduce_dims[1];
    let mut layouts: BTreeMap<ValueId, Layout> = BTreeMap::new();

    // Shared-memory operands.
    for &id in &order {
        let op = &kernel.ops[id];
        if !matches!(op.kind, OpKind::Load { .. }) {
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
        let is_transposed_b = |u: &crate::kernel::OpId| {
            kernel.ops[*u].kind == OpKind::Transpose && only_mma(kernel.ops[*u].results[0], &[1])
        };
        let all_uses = uses.get(&r).cloned().unwrap_or_default();
        let staged = !all_uses.is_empty()
            && all_uses.iter().all(|u| {
                (kernel.ops[*u].kind == OpKind::Mma
                    && kernel.ops[*u].operands.iter().position(|&x| x == r) < Some(2))
                    || is_transposed_b(u)
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
                    let l = if tcgen05 {
                        crate::tmem::accumulator_layout(warps)
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
                OpKind::Unary(_) | OpKind::Cast { .. } => {
                    flow_same(&mut layouts, op.operands[0], op.results[0]);
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
                            } else if let Some(dim) = broadcast_dim(&vs, &shape) {
                                layouts.insert(
                                    *v,
                                    Layout::Slice {
                                        dim,
                                        keep_dim: true,
                                        parent: Box::new(l.clone()),
                                        parent_shape: shape.clone(),
                                    },
                                );
                            }
                        }
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
                OpKind::Reshape { .. } => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    if let (Some(l), false) = (layouts.get(&x).cloned(), layouts.contains_key(&r)) {
                        if let Some(nl) = reshape_layout(&l, true) {
                            layouts.insert(r, nl);
                        }
                    } else if let (Some(l), false) =
                        (layouts.get(&r).cloned(), layouts.contains_key(&x))
                        && let Some(nl) = reshape_layout(&l, false)
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
                | OpKind::Load { .. }
                | OpKind::Splat { .. }
                | OpKind::Iota { .. }
                | OpKind::Transpose
                | OpKind::Store { .. }
                | OpKind::Print { .. }
                | OpKind::Yield => {}
            }
        }
        if layouts.len() == before {
            // A register `load` first: it is the tile the others derive from (softmax's
            // row statistics are slices of its input's layout, not blocked of their own).
            let unset = |v: &ValueId| kernel.ty(*v).shape().is_some() && !layouts.contains_key(v);
            let load = order.iter().find_map(|&id| {
                let op = &kernel.ops[id];
                matches!(op.kind, OpKind::Load { .. })
                    .then(|| op.results[0])
                    .filter(unset)
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
                    .map_err(|e| Diagnostic::new(op.loc, e.to_string()))?;
            }
        }
    }
    kernel.schedule.layouts = layouts;
    Ok(())
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

/// Layout after `reshape`: `to_keep` adds the unit dimension of a slice (`.col()`/`.row()`),
/// otherwise removes it.
fn reshape_layout(l: &Layout, to_keep: bool) -> Option<Layout> {
    match l {
        Layout::Slice {
            dim,
            keep_dim,
            parent,
            parent_shape,
        } if *keep_dim != to_keep => Some(Layout::Slice {
            dim: *dim,
            keep_dim: to_keep,
            parent: parent.clone(),
            parent_shape: parent_shape.clone(),
        }),
        _ => None,
    }
}

/// The warp grid of an mma accumulator of `shape`.
fn warp_grid(shape: &Shape, warps: u32, rows_per_warp: bool) -> [u32; 2] {
    let (m, n) = (shape.rows() as u32, shape.cols() as u32);
    if rows_per_warp {
        return [warps, 1];
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

/// A blocked layout for a tile of `ty`: 16-byte vectors along the contiguous dimension, lanes
/// along it first, warps along the rows. A dimension that is reduced somewhere in the kernel
/// is never split over warps.
fn blocked(ty: &Type, warps: u32, reduce_dims: [bool; 2]) -> Layout {
    let shape = ty.shape().cloned().unwrap_or(Shape(Vec::new()));
    let (rows, cols) = if shape.rank() == 1 {
        (1, shape.rows() as u32)
    } else {
        (shape.rows() as u32, shape.cols() as u32)
    };
    let vec = pow2_div(cols, (16 / ty.dtype().size_bytes().max(1)) as u32);
    let tc = pow2_div(cols / vec, 32);
    let tr = pow2_div(rows, 32 / tc);
    let (mut wr, mut wc) = (1, 1);
    if !(reduce_dims[0] && shape.rank() == 2) {
        wr = pow2_div(rows / tr, warps);
    }
    if !reduce_dims[1] {
        wc = pow2_div(cols / (vec * tc), warps / wr);
    }
    if wr * wc < warps && !reduce_dims[1] && shape.rank() == 2 && reduce_dims[0] {
        wc = pow2_div(cols / (vec * tc), warps);
    }
    // Leftover warps hold replicas along the rows (a row split would need a cross-warp
    // exchange); `Distribution` wraps the warp index modulo the grid.
    Layout::Blocked {
        size_per_thread: [1, vec],
        threads_per_warp: [tr, tc],
        warps: [wr.max(1), wc.max(1)],
    }
}
