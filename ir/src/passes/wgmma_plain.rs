//! Part of the `lower` pass on sm_90a: which `mma`s outside a warp-specialised ring still run
//! on wgmma, issued by every warpgroup of the block in program order (no warp roles, no
//! mbarrier ring: the operands arrive by cp.async or by the register staging of
//! [`super::mma_operands`], exactly as for mma.sync).
//!
//! An mma not taken stays on mma.sync with a note at its line saying why; the conditions for
//! taking one are listed at [`plan`].

use std::collections::{BTreeMap, BTreeSet};

use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::schedule::{Layout, Note};
use crate::types::DType;

use super::memory_plan::SMEM_LIMIT;
use super::walk::{defining_op, ops_in_block_regions, ops_in_order};

/// Where a shared mma operand lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Buffer {
    /// The buffer of a load (the operand is the load or its transpose).
    Load(OpId),
    /// The buffer of a register operand staged through shared memory.
    Staged(ValueId),
}

/// Decides which mmas outside `ring` are lowered to wgmma, boxes and re-places the buffers
/// they read, and notes at each other mma why it stays on mma.sync.
///
/// An mma is taken when its shape and operands are what `wgmma.mma_async.m64nNk16` reads:
/// - its accumulator is laid out `#mma(W x 1)` with `W` a multiple of 4 and 16 rows per
///   warp (`M = 16 W`), which is the wgmma accumulator layout of each warpgroup, so the
///   accumulator stays in its registers, carried across loops as it is for mma.sync;
/// - `N` is a multiple of 8 up to 256, `K` a multiple of 16, the operands bf16 or f16 and the
///   accumulator f32;
/// - B is a shared tile (a staged load, its transpose, or a staged register tile), A a shared
///   tile or a register tile in the accumulator layout (the RS form, attention's `P` or
///   `dS`); either orientation of a shared operand is read (K-major, or MN-major with the
///   descriptor's transpose bit);
/// - each shared operand's buffer is swizzled, with rows in multiples of 8. Rows wider than
///   the swizzle span (a 128-column bf16 tile) are stored in column boxes
///   ([`crate::schedule::SmemBuffer::boxed_offset`]), which only wgmma reads, so every mma
///   reading such a buffer must be taken.
///
/// A register A loaded (or gathered) before a loop the wgmma runs in would stay live in
/// registers for every iteration (a decode block's queries across its key loop, which costs
/// ptxas spills): it is written once into a swizzled buffer right after its load
/// ([`crate::schedule::StagedOperand::at_source`]), and every wgmma reading it takes it
/// from there (the SS form); any other reader keeps its registers. A gathered tile's rows
/// are routed through index tiles held in the registers' layout, so the copy goes through
/// the registers rather than cp.async; masked rows are already the load's fill there.
///
/// Buffers wgmma reads start on 1024 bytes (the 128-byte swizzle repeats every 1024 bytes of
/// address). An mma not taken stays on mma.sync with a note at its line saying why.
pub fn plan(kernel: &mut Kernel, ring: &BTreeSet<OpId>) {
    kernel.schedule.wgmma.clear();
    let mmas: Vec<OpId> = ops_in_order(kernel)
        .into_iter()
        .filter(|&o| kernel.ops[o].kind == OpKind::Mma && !ring.contains(&o))
        .collect();
    if mmas.is_empty() {
        return;
    }
    let mut notes: BTreeMap<OpId, String> = BTreeMap::new();
    let mut taken: BTreeSet<OpId> = BTreeSet::new();
    let mut reads: BTreeMap<OpId, Vec<Buffer>> = BTreeMap::new();
    // The taken mmas whose A is staged once where it is loaded.
    let mut held: BTreeMap<OpId, ValueId> = BTreeMap::new();
    for &id in &mmas {
        let mut buffers = shared_operands(kernel, id);
        let verdict = if kernel.schedule.sched.is_some() {
            Err(
                "the kernel's warp-specialised loop runs on its own warp roles; mmas outside it \
                 stay on mma.sync"
                    .to_string(),
            )
        } else {
            takes(kernel, id)
        };
        match verdict.and_then(|a| stage_held(kernel, id, a).map(|()| a)) {
            Ok(a) => {
                taken.insert(id);
                if let Some(a) = a {
                    held.insert(id, a);
                    buffers.push(Buffer::Staged(a));
                }
            }
            Err(why) => {
                notes.insert(id, why);
            }
        }
        reads.insert(id, buffers);
    }
    drop_boxed_conflicts(kernel, &mmas, &reads, &mut taken, &mut notes);
    held.retain(|m, _| taken.contains(m));
    drop_unread_held(kernel, &held);
    if !held.is_empty() && !place(kernel, &taken, &reads) {
        // The held operands' buffers are what does not fit: their mmas keep A in registers
        // on mma.sync, and the others are placed without them.
        for &m in held.keys() {
            taken.remove(&m);
            notes.insert(
                m,
                "its A operand, a tile loaded into registers before its loop, would be staged \
                 once in shared memory for wgmma, which does not fit beside the other shared \
                 tiles"
                    .into(),
            );
        }
        held.clear();
        drop_unread_held(kernel, &held);
        drop_boxed_conflicts(kernel, &mmas, &reads, &mut taken, &mut notes);
    }
    for (id, why) in notes {
        let loc = kernel.ops[id].loc;
        kernel.schedule.notes.push(Note {
            loc,
            text: format!("sm_90a: this mma is lowered with mma.sync, not wgmma: {why}"),
        });
    }
    if taken.is_empty() {
        return;
    }
    if !place(kernel, &taken, &reads) {
        // The 1024-byte alignment would not fit: the buffers stay as they were, and no
        // operand is staged for a wgmma.
        drop_unread_held(kernel, &BTreeMap::new());
        for &id in &taken {
            let loc = kernel.ops[id].loc;
            kernel.schedule.notes.push(Note {
                loc,
                text: "sm_90a: this mma is lowered with mma.sync, not wgmma: the shared tiles \
                       wgmma reads, each aligned to 1024 bytes, would not fit in shared memory"
                    .into(),
            });
        }
        return;
    }
    kernel.schedule.wgmma = taken;
}

/// A boxed buffer is read by wgmma only: drops from `taken` every mma reading one that an
/// mma on mma.sync reads too, until none is left, noting why.
fn drop_boxed_conflicts(
    kernel: &Kernel,
    mmas: &[OpId],
    reads: &BTreeMap<OpId, Vec<Buffer>>,
    taken: &mut BTreeSet<OpId>,
    notes: &mut BTreeMap<OpId, String>,
) {
    loop {
        let on_sync: BTreeSet<Buffer> = mmas
            .iter()
            .filter(|m| !taken.contains(m))
            .flat_map(|m| reads[m].iter().copied())
            .collect();
        let dropped: Vec<OpId> = taken
            .iter()
            .copied()
            .filter(|m| {
                reads[m]
                    .iter()
                    .any(|b| on_sync.contains(b) && needs_boxes(kernel, *b))
            })
            .collect();
        if dropped.is_empty() {
            return;
        }
        for m in dropped {
            taken.remove(&m);
            notes.insert(
                m,
                "an operand tile wider than one 128-byte swizzle row is also read by an mma \
                 that stays on mma.sync, and wgmma needs it stored in column boxes"
                    .into(),
            );
        }
    }
}

/// Boxes the buffers the `taken` mmas read that need it and lays every buffer out again
/// (see [`replace_buffers`]).
fn place(kernel: &mut Kernel, taken: &BTreeSet<OpId>, reads: &BTreeMap<OpId, Vec<Buffer>>) -> bool {
    let boxed: BTreeSet<Buffer> = taken
        .iter()
        .flat_map(|m| reads[m].iter().copied())
        .filter(|&b| needs_boxes(kernel, b))
        .collect();
    replace_buffers(kernel, &boxed)
}

/// Removes the operands staged once where they are loaded that no mma of `held` reads.
fn drop_unread_held(kernel: &mut Kernel, held: &BTreeMap<OpId, ValueId>) {
    kernel
        .schedule
        .staged
        .retain(|s| !s.at_source || held.values().any(|&a| a == s.operand));
}

/// For mma `id`, taken with `a` its A operand to stage once where it is loaded: adds the
/// operand's buffer (shared by every mma reading it) unless it has one, and checks that wgmma
/// can read it.
fn stage_held(kernel: &mut Kernel, id: OpId, a: Option<ValueId>) -> Result<(), String> {
    let Some(a) = a else {
        return Ok(());
    };
    if kernel.schedule.staged_at_source(a).is_none() {
        let ty = kernel.ty(a);
        let Some(shape) = ty.shape() else {
            return Err("a scalar A operand".into());
        };
        let row_bytes = (shape.cols() * ty.dtype().size_bytes()) as u32;
        let buffer = crate::schedule::SmemBuffer {
            load: id,
            offset: 0,
            stage_bytes: row_bytes * shape.rows() as u32,
            stages: 1,
            row_bytes,
            swizzled: row_bytes.is_multiple_of(32),
            boxed: false,
        };
        kernel.schedule.staged.push(crate::schedule::StagedOperand {
            operand: a,
            source: a,
            transposed: false,
            slot: 0,
            buffer,
            at_source: true,
        });
    }
    // The check depends on the buffer alone: failing, it fails for every mma reading it.
    let checked = check_buffer(kernel, Buffer::Staged(a), "A");
    if checked.is_err() {
        kernel
            .schedule
            .staged
            .retain(|s| !(s.at_source && s.operand == a));
    }
    checked
}

/// Why `id` cannot be a wgmma, if it cannot (its own shape and operands; the buffers'
/// sharing is judged by [`plan`]); else its A operand when that is a register tile loaded
/// before a loop the mma runs in, to stage once in shared memory where it is loaded.
fn takes(kernel: &Kernel, id: OpId) -> Result<Option<ValueId>, String> {
    let op = &kernel.ops[id];
    let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
    let warps = match kernel.schedule.layouts.get(&r) {
        Some(Layout::Mma { warps }) => *warps,
        _ => return Err("its accumulator is not in an mma layout".into()),
    };
    if warps[1] != 1 || !warps[0].is_multiple_of(4) {
        return Err(format!(
            "its accumulator's warp grid is {}x{}; wgmma needs whole warpgroups stacked along \
             the rows (4, 8 or 12 warps by 1)",
            warps[0], warps[1]
        ));
    }
    let (Some(rs), Some(as_)) = (kernel.ty(r).shape(), kernel.ty(a).shape()) else {
        return Err("a scalar mma".into());
    };
    let (m, n, k) = (rs.rows() as u32, rs.cols() as u32, as_.cols() as u32);
    if m != 16 * warps[0] {
        return Err(format!(
            "its {m} rows are not 16 per warp of its {} warps (wgmma gives each warp 16 rows \
             of its warpgroup's 64)",
            warps[0]
        ));
    }
    if !n.is_multiple_of(8) || !(8..=256).contains(&n) {
        return Err(format!("its {n} columns are not a multiple of 8 up to 256"));
    }
    // One wgmma keeps its whole `N / 2` accumulator registers a thread live at once (ptxas
    // cannot spill an instruction's operands), beside its descriptors and addresses; mma.sync
    // spills what does not fit.
    // What a thread gets at launch with the blocks the kernel asks to fit, at most 255.
    let cap = super::warp_specialise::entry_regs(
        32 * kernel.options.num_warps,
        kernel.options.blocks_per_sm,
    )
    .min(super::accumulators::THREAD_REGISTERS as u32);
    if n / 2 + WGMMA_WORKING_REGISTERS > cap {
        return Err(format!(
            "its {n} columns take {} accumulator registers a thread in one wgmma, and a block              of {} threads{} leaves each thread {cap}",
            n / 2,
            32 * kernel.options.num_warps,
            match kernel.options.blocks_per_sm {
                0 | 1 => String::new(),
                b => format!(" asked to fit {b} times a multiprocessor"),
            }
        ));
    }
    if !k.is_multiple_of(16) {
        return Err(format!("its depth K = {k} is not a multiple of 16"));
    }
    let (da, db) = (kernel.ty(a).dtype(), kernel.ty(b).dtype());
    if da != db || !matches!(da, DType::Bf16 | DType::F16) || kernel.ty(r).dtype() != DType::F32 {
        return Err("its operands are not both bf16 or both f16 with an f32 accumulator".into());
    }
    let b_buf = shared_buffer(kernel, b).ok_or("its B operand is not a tile in shared memory")?;
    check_buffer(kernel, b_buf, "B")?;
    match shared_buffer(kernel, a) {
        Some(a_buf) => check_buffer(kernel, a_buf, "A")?,
        None if kernel.schedule.layouts.get(&a) == Some(&Layout::Mma { warps }) => {
            // Loaded inside the loop (routed rows per k-step), A is not held: read from
            // registers (RS).
            let (def, is_result) = defining_op(kernel, a);
            if is_result
                && matches!(
                    kernel.ops[def].kind,
                    OpKind::Load { .. } | OpKind::Gather { .. }
                )
                && held_across_a_loop(kernel, def, id)
            {
                return Ok(Some(a));
            }
        }
        None => {
            return Err(
                "its A operand is neither in shared memory nor in the accumulator layout".into(),
            );
        }
    }
    Ok(None)
}

/// Registers a wgmma needs a thread besides its accumulator: descriptors, addresses, the
/// loop's counters (ptxas asked for 90 for a 128-column wgmma: 64 and 26).
const WGMMA_WORKING_REGISTERS: u32 = 32;

/// Whether a buffer's stage is something a swizzled wgmma descriptor addresses.
fn check_buffer(kernel: &Kernel, buffer: Buffer, which: &str) -> Result<(), String> {
    let Some(buf) = buffer_of(kernel, buffer) else {
        return Err(format!("its {which} operand has no shared buffer"));
    };
    let Some(span) = buf.span() else {
        return Err(format!(
            "its {which} tile's rows ({} bytes) are not a multiple of 32 bytes, so not swizzled",
            buf.row_bytes
        ));
    };
    let rows = buf.stage_bytes / buf.row_bytes.max(1);
    if !rows.is_multiple_of(8) || !buf.row_bytes.is_multiple_of(span) {
        return Err(format!(
            "its {which} tile has {rows} rows, not a multiple of 8"
        ));
    }
    Ok(())
}

/// Whether `mma` runs in a loop that `def` is outside of, so `def`'s result is read by every
/// iteration.
fn held_across_a_loop(kernel: &Kernel, def: OpId, mma: OpId) -> bool {
    ops_in_order(kernel).into_iter().any(|l| {
        matches!(kernel.ops[l].kind, OpKind::For { .. }) && {
            let inside = ops_in_block_regions(kernel, l);
            inside.contains(&mma) && !inside.contains(&def)
        }
    })
}

/// The shared buffer operand `v` is read from, if it is a shared tile.
fn shared_buffer(kernel: &Kernel, v: ValueId) -> Option<Buffer> {
    if kernel.schedule.staged(v).is_some() {
        return Some(Buffer::Staged(v));
    }
    let mut v = v;
    loop {
        if !kernel
            .schedule
            .layouts
            .get(&v)
            .is_some_and(Layout::is_shared)
        {
            return None;
        }
        let (def, is_result) = defining_op(kernel, v);
        if !is_result {
            return None;
        }
        match kernel.ops[def].kind {
            OpKind::Transpose => v = kernel.ops[def].operands[0],
            // A masked load bounded along one dimension is copied like a plain one
            // (`staged_load`), into the same buffer layouts.
            OpKind::Load { .. } | OpKind::Gather { .. }
                if kernel.schedule.buffer(def).is_some() =>
            {
                return Some(Buffer::Load(def));
            }
            _ => return None,
        }
    }
}

/// The buffers `id`'s operands are read from.
fn shared_operands(kernel: &Kernel, id: OpId) -> Vec<Buffer> {
    kernel.ops[id].operands[..2]
        .iter()
        .filter_map(|&v| shared_buffer(kernel, v))
        .collect()
}

fn buffer_of(kernel: &Kernel, b: Buffer) -> Option<&crate::schedule::SmemBuffer> {
    match b {
        Buffer::Load(l) => kernel.schedule.buffer(l),
        Buffer::Staged(v) => kernel
            .schedule
            .staged
            .iter()
            .find(|s| s.operand == v)
            .map(|s| &s.buffer),
    }
}

/// Whether wgmma can read `b` only once it is stored in column boxes.
fn needs_boxes(kernel: &Kernel, b: Buffer) -> bool {
    buffer_of(kernel, b).is_some_and(|buf| buf.span().is_some_and(|s| buf.row_bytes > s))
}

/// Marks the `boxed` buffers and lays every buffer out again in its order (loads, then
/// staged operands), each on 1024 bytes; `false`, changing nothing, when they no longer fit.
fn replace_buffers(kernel: &mut Kernel, boxed: &BTreeSet<Buffer>) -> bool {
    let mut sched = kernel.schedule.clone();
    let mut offset = 0u32;
    for buf in &mut sched.buffers {
        buf.boxed = boxed.contains(&Buffer::Load(buf.load));
        offset = offset.next_multiple_of(1024);
        buf.offset = offset;
        offset += buf.stage_bytes * buf.stages;
    }
    for st in &mut sched.staged {
        st.buffer.boxed = boxed.contains(&Buffer::Staged(st.operand));
        offset = offset.next_multiple_of(1024);
        st.buffer.offset = offset;
        offset += st.buffer.stage_bytes * st.buffer.stages;
    }
    let offset = offset.next_multiple_of(128);
    if offset > SMEM_LIMIT {
        return false;
    }
    sched.smem_bytes = offset;
    kernel.schedule = sched;
    true
}
