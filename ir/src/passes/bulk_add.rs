//! sm_90a: which f32 atomic adds of a whole register tile the PTX writer applies with bulk
//! reductions instead of one `red.global.add.f32` per element. Such an add is staged in shared
//! memory and reduced into the tensor by the copy engine, so the L2 sees one request per row
//! or box instead of one per element (attention backward's dQ accumulation was bound by
//! them): where the tile's layout allows, as 128-byte swizzled boxes that one thread reduces
//! through the tensor's map ([`AddBoxes`]: a few instructions, the bounds clipped by the
//! engine), else as rows, one `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`
//! each. Every decision, either way, is a note at the user's line.

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, Param};
use crate::sched::RoleKind;
use crate::schedule::{AddBoxes, BulkAdds, Note};
use crate::target::Target;
use crate::{AtomicOp, DType, MemScope, MemSem};

use super::walk::{ops_in_order, uses};

/// Shared memory the driver reserves for each block (sm_90a).
const SMEM_RESERVED_PER_BLOCK: u32 = 1024;

/// Records the bulk-reduced adds and places their staging region after every other shared
/// buffer. Runs in `lower`, after the scratch region is placed.
pub fn plan(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    kernel.schedule.bulk_adds = None;
    if target != Target::Sm90a {
        return Ok(());
    }
    // A warp-specialised kernel's adds are the consumers' (warps from 0): they alone stage
    // and issue them, meeting at a named barrier; the block's threads count for occupancy.
    let (threads, consumers) = match &kernel.schedule.sched {
        None => (32 * kernel.options.num_warps, None),
        Some(s) => match s.role(RoleKind::Consumer) {
            Some(c) if c.first_warp == 0 => (s.threads(), Some(32 * c.warps)),
            _ => return Ok(()),
        },
    };
    let holders = consumers.unwrap_or(threads);
    // Each staged add's tile and its boxes, or why it goes in rows; the notes by the adds'
    // program order.
    let mut staged: Vec<StagedAdd> = Vec::new();
    let mut notes = Vec::new();
    let adds = candidates(kernel);
    let order: Vec<OpId> = adds.iter().map(|&(id, _)| id).collect();
    for (id, tile) in adds {
        let (rows, cols) = match tile {
            Ok(tile) => tile,
            Err(why) => {
                let text = format!(
                    "sm_90a: this f32 atomic add stays one red.global.add per element: {why}"
                );
                notes.push((id, text));
                continue;
            }
        };
        // Boxes only where the PTX writer puts shared memory on the 128-byte swizzle's
        // 1024-byte period (a ring's or a wgmma's kernel): the boxes of a kernel with
        // 128-byte aligned shared memory died on an H100 with an illegal instruction.
        let planned = if kernel.schedule.smem_align() == 1024 {
            tensor_boxes(kernel, id, (rows, cols), holders)
        } else {
            Err("the kernel's shared memory is not on the swizzle's 1024-byte period")
        };
        let planned = planned.and_then(|b| {
            let other = staged.iter().any(|(_, _, o)| {
                o.as_ref()
                    .is_ok_and(|o| o.param == b.param && o.map_box() != b.map_box())
            });
            if other {
                Err("another add maps its tensor with other boxes")
            } else {
                Ok(b)
            }
        });
        staged.push((id, (rows, cols), planned));
    }
    if !staged.is_empty() {
        // Blocks an SM holds by threads and shared memory, before and after the staging
        // region: a kernel that would fall to one block a multiprocessor (nothing left to
        // run during its barriers and waits) keeps its per-element adds.
        let fit = |smem: u32| {
            target
                .sm_limits()
                .blocks_per_sm(threads, 1, smem + SMEM_RESERVED_PER_BLOCK)
        };
        let before = fit(kernel.schedule.smem_bytes);
        // The staging region with the boxes (on the swizzle's 1024-byte period), or with
        // every add in rows.
        let region = |with_boxes: bool| {
            let boxed = with_boxes && staged.iter().any(|(_, _, b)| b.is_ok());
            let offset =
                kernel
                    .schedule
                    .smem_bytes
                    .next_multiple_of(if boxed { 1024 } else { 128 });
            let bytes = staged
                .iter()
                .map(|(_, (rows, cols), b)| match b {
                    Ok(b) if with_boxes => b.bytes(),
                    _ => *rows as u32 * BulkAdds::pitch(*cols),
                })
                .max()
                .unwrap_or(0);
            (offset, bytes)
        };
        let fits = |(offset, bytes): (u32, u32)| {
            let total = offset + bytes;
            total <= super::memory_plan::SMEM_LIMIT && fit(total) >= before.min(2)
        };
        let with_boxes = fits(region(true));
        let (offset, bytes) = region(with_boxes);
        if with_boxes || fits((offset, bytes)) {
            let mut boxes = BTreeMap::new();
            for (id, (rows, cols), planned) in staged.iter().cloned() {
                let planned = match planned {
                    Ok(_) if !with_boxes => Err("their 1024-byte aligned region does not fit"),
                    other => other,
                };
                let text = match planned {
                    Ok(b) => {
                        boxes.insert(id, b);
                        format!(
                            "sm_90a: this f32 atomic add of a [{rows}, {cols}] tile goes \
                             through shared memory, one TMA reduction a {}-column box \
                             (cp.reduce.async.bulk.tensor .add)",
                            AddBoxes::COLUMNS
                        )
                    }
                    Err(why) => format!(
                        "sm_90a: this f32 atomic add of a [{rows}, {cols}] tile goes through \
                         shared memory, one bulk reduction a row (cp.reduce.async.bulk \
                         .add.f32; not as tensor boxes: {why})"
                    ),
                };
                notes.push((id, text));
            }
            kernel.schedule.bulk_adds = Some(BulkAdds {
                ops: staged.iter().map(|(id, _, _)| *id).collect(),
                boxes,
                offset,
                bytes,
                consumers,
            });
            kernel.schedule.smem_bytes = offset + bytes;
        } else {
            let total = offset + bytes;
            let why = if total > super::memory_plan::SMEM_LIMIT {
                format!("does not fit beside the kernel's {offset} bytes of shared memory")
            } else {
                format!(
                    "would leave {} block(s) a multiprocessor instead of {before}",
                    fit(total)
                )
            };
            for &(id, _, _) in &staged {
                let text = format!(
                    "sm_90a: this f32 atomic add stays one red.global.add per element: its \
                     {bytes}-byte staging buffer {why}"
                );
                notes.push((id, text));
            }
        }
    }
    notes.sort_by_key(|(id, _)| order.iter().position(|o| o == id));
    let notes = notes.into_iter().map(|(id, text)| Note {
        loc: kernel.ops[id].loc,
        text,
    });
    kernel.schedule.notes.extend(notes);
    Ok(())
}

/// A staged add: its op, its `[rows, cols]` tile, and its boxes or why it goes in rows.
type StagedAdd = (OpId, (usize, usize), Result<AddBoxes, &'static str>);

/// The `[rows, cols]` tile an add stages, or why it cannot be staged.
type Staged = Result<(usize, usize), &'static str>;

/// Every f32 atomic add, in program order, with the tile it would stage or why it cannot be
/// staged ([`staged_tile`]).
fn candidates(kernel: &Kernel) -> Vec<(OpId, Staged)> {
    let used = uses(kernel);
    ops_in_order(kernel)
        .into_iter()
        .filter(|&id| match kernel.ops[id].kind {
            OpKind::Atomic {
                tensor,
                op: AtomicOp::Add,
                ..
            } => kernel.params[tensor].dtype() == DType::F32,
            _ => false,
        })
        .map(|id| {
            let read = used
                .get(&kernel.ops[id].results[0])
                .is_some_and(|u| !u.is_empty());
            (id, staged_tile(kernel, id, read))
        })
        .collect()
}

/// The bytes of the staging region [`plan`] would place for the kernel's f32 atomic adds
/// (0: none can be staged): what a pass placing shared memory before it (the epilogue's TMA
/// stores) leaves room for, since the adds run every iteration and the stores once a tile.
pub fn staging_bytes(kernel: &Kernel) -> u32 {
    candidates(kernel)
        .into_iter()
        .filter_map(|(_, tile)| tile.ok())
        .map(|(rows, cols)| rows as u32 * BulkAdds::pitch(cols))
        .max()
        .unwrap_or(0)
}

/// The `[rows, cols]` a bulk-reduced add `id` stages, or why it cannot be (`read`: its old
/// values are used). The copy needs 16-byte aligned global rows, so the tensor must be
/// specialised as 16-byte aligned and the tile's first column a known multiple of 4; it
/// returns no old values and orders nothing beyond the elements, so the add must be relaxed,
/// unmasked, addressed by plain coordinates, with its result unused.
fn staged_tile(kernel: &Kernel, id: OpId, read: bool) -> Staged {
    let op = &kernel.ops[id];
    let OpKind::Atomic {
        tensor,
        sem,
        scope,
        access,
        ..
    } = &op.kind
    else {
        return Err("not an atomic");
    };
    if read {
        return Err("its old values are read");
    }
    if *sem != MemSem::Relaxed || *scope == MemScope::Sys {
        return Err("a bulk reduction has no memory order or system scope");
    }
    if access.masked {
        return Err("it is masked");
    }
    if access.indexed() {
        return Err("it is addressed through index tiles");
    }
    if !kernel.params[*tensor].aligned16() {
        return Err("its tensor is not known to be 16-byte aligned");
    }
    let parts = op.access_operands().ok_or("malformed")?;
    let value = parts.value.ok_or("malformed")?;
    let dims = kernel
        .ty(value)
        .shape()
        .map(|s| s.dims().to_vec())
        .ok_or("it adds a scalar")?;
    let (rows, cols) = match dims[..] {
        [c] => (1, c),
        [r, c] => (r, c),
        _ => return Err("its tile has more than two dimensions"),
    };
    let rank = access.dims.len();
    if rank < dims.len() {
        return Err("its tile has more dimensions than its tensor");
    }
    if cols < 4 {
        return Err("its rows are shorter than 16 bytes");
    }
    let inner = *parts.addr.get(rank - 1).ok_or("malformed")?;
    if !super::pipeline::known_multiple(kernel, inner).is_multiple_of(4) {
        return Err("its first column is not known to be a multiple of 4 (16-byte aligned)");
    }
    Ok((rows, cols))
}

/// The boxes a bulk add `id` of a `[rows, cols]` tile held by `holders` threads stages, when
/// it can go as TMA tensor reductions ([`AddBoxes`]), or why not. Its tensor needs a map of
/// its own (no TMA load or store of the kernel maps it otherwise), the tile two dimensions
/// of at most 256 rows and whole 128-byte boxes, and its layout offsets that split into a
/// thread's part and a register's ([`AddBoxes::separable`]: an mma accumulator's do).
fn tensor_boxes(
    kernel: &Kernel,
    id: OpId,
    (rows, cols): (usize, usize),
    holders: u32,
) -> Result<AddBoxes, &'static str> {
    let op = &kernel.ops[id];
    let OpKind::Atomic { tensor, .. } = op.kind else {
        return Err("not an atomic");
    };
    let Some(Param::Tensor { rank, .. }) = kernel.params.get(tensor) else {
        return Err("not a tensor");
    };
    let value = op
        .access_operands()
        .and_then(|p| p.value)
        .ok_or("malformed")?;
    if kernel.ty(value).shape().map(|s| s.rank()) != Some(2) {
        return Err("its tile is not two-dimensional");
    }
    if rows > 256 {
        return Err("a box has at most 256 rows");
    }
    if !(cols as u32).is_multiple_of(AddBoxes::COLUMNS) {
        return Err("its rows are not whole 128-byte boxes");
    }
    let mapped = kernel.schedule.sched.as_ref().is_some_and(|s| {
        s.loads.iter().any(|(_, l)| l.tma.param == tensor)
            || s.stores.iter().any(|st| st.param == tensor)
    });
    if mapped {
        return Err("its tensor has a TMA map for other boxes");
    }
    let mut b = AddBoxes {
        param: tensor,
        lead_dims: u32::try_from(rank - 2).map_err(|_| "malformed")?,
        rows: rows as u32,
        boxes: cols as u32 / AddBoxes::COLUMNS,
        swap_odd_rows: false,
    };
    let d = kernel
        .distribution(value)
        .map_err(|_| "its layout is not known")?;
    if !b.separable(&d, holders) {
        return Err("its layout's rows and columns do not split into a thread's and a register's");
    }
    b.swap_odd_rows = b.odd_rows_swap(&d, holders);
    Ok(b)
}
