//! sm_90a epilogue stores through shared memory and TMA.
//!
//! A register tile stored by the consumers of a persistent kernel is written into a staging
//! tile in shared memory, in 128-byte swizzled boxes, and one thread stores the boxes with
//! `cp.async.bulk.tensor` (the tensor map clips what lies outside the tensor, so a ragged last
//! tile needs no masks). Global memory then sees whole 128-byte rows instead of the scattered
//! pairs of the accumulator layout, and the consumers go on to the next work tile while the
//! copy engine drains the staging tile. Per store:
//! 1. the issuing thread waits until the previous store from the staging tile has read it
//!    (`cp.async.bulk.wait_group.read 0`), and the storing threads meet at a named barrier;
//! 2. every thread writes its elements (an mma accumulator's as 8x8 matrices, four per
//!    `stmatrix.x4` of a warp; other layouts a pair per 32-bit store), then
//!    `fence.proxy.async.shared::cta` makes them visible to the copy engine, and the threads
//!    meet again;
//! 3. the issuing thread stores every box and commits the bulk group.
//!
//!
//! When shared memory has no room for the whole tile, the staging tile holds a part of it
//! (`1 / rounds` of the boxes) and the three steps run once per part.
//!
//! When each consumer warpgroup holds its own rows of the tile (sm_90a, an accumulator over
//! several warpgroups), each stores them alone: its threads meet at a named barrier of their
//! own and its first thread issues boxes of its rows and waits for its own bulk groups. A
//! warpgroup then goes on to its next work tile without waiting for the others, so the
//! ping-pong of an attention kernel's warpgroups runs on across tiles.
//!
//! Before the consumers exit the issuing thread waits for every bulk group.

use std::fmt;

use crate::kernel::{Kernel, OpId};
use crate::print::join_steps;
use crate::ring::TmaBox;
use crate::schedule::Layout;
use crate::schedule::Term;
use crate::tmem::epilogue;

/// One step of a TMA store's round (the protocol in the module doc), as the PTX writer emits
/// it and the `protocol_check` pass proves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreStep {
    /// The issuing thread waits until every earlier bulk store has read its staging tile
    /// (`cp.async.bulk.wait_group.read 0`).
    WaitRead,
    /// The storing threads meet at the store's named barrier.
    Sync,
    /// Every thread writes its elements of the round's boxes into the staging tile.
    Write,
    /// Every thread makes its writes visible to the async proxy
    /// (`fence.proxy.async.shared::cta`).
    Fence,
    /// The issuing thread stores the round's boxes (`cp.async.bulk.tensor`).
    Issue,
    /// The issuing thread closes the round's bulk group (`cp.async.bulk.commit_group`).
    Commit,
    /// The issuing thread waits until every bulk store has completed
    /// (`cp.async.bulk.wait_group 0`): before the consumers exit.
    WaitAll,
}

impl fmt::Display for StoreStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreStep::WaitRead => "wait_group.read 0",
            StoreStep::Sync => "bar.sync",
            StoreStep::Write => "write",
            StoreStep::Fence => "fence.proxy.async",
            StoreStep::Issue => "tma store",
            StoreStep::Commit => "commit_group",
            StoreStep::WaitAll => "wait_group 0",
        })
    }
}

/// The protocol of one round: the staging tile is free, written, visible, stored.
pub const ROUND: [StoreStep; 7] = [
    StoreStep::WaitRead,
    StoreStep::Sync,
    StoreStep::Write,
    StoreStep::Fence,
    StoreStep::Sync,
    StoreStep::Issue,
    StoreStep::Commit,
];

/// Columns of one 128-byte box of 2-byte elements.
pub const BOX_COLUMNS: u32 = 64;

/// Registers of a consumer thread kept for what the epilogue needs besides its tiles
/// (addresses, indices, the store's staging offsets).
const EPILOGUE_SCALAR_REGISTERS: u32 = 48;

/// sm_90a: the columns of the accumulator carried out of ring loop `for_op` that the
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
pub fn epilogue_columns(kernel: &Kernel, for_op: OpId) -> Option<u32> {
    let roles = kernel.schedule.roles?;
    let acc = kernel.ops[for_op].results.iter().copied().find(|&v| {
        kernel
            .schedule
            .layouts
            .get(&v)
            .is_some_and(|l| matches!(l, Layout::Mma { .. }))
    })?;
    let n = kernel.ty(acc).shape()?.dims().last().copied()? as u32;
    let budget = roles
        .consumer_regs
        .saturating_sub(EPILOGUE_SCALAR_REGISTERS);
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

/// A `store` of a register tile lowered to a TMA store from a staging tile.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TmaStore {
    /// The `store` op.
    pub store: OpId,
    /// The tensor parameter it writes (the one whose tensor map the runtime builds).
    pub param: usize,
    /// Tensor dimensions outside the tile's two: box extent 1.
    pub lead_dims: u32,
    /// Box extents, outermost first (`[rows, cols]`): the tile's rows by 128 bytes.
    pub box_dims: [u32; 2],
    /// Swizzle span in bytes (the box row's bytes, 128).
    pub swizzle: u32,
    /// The boxes that make up the tile, left to right; their shared offsets are inside the
    /// staging tile, which box `j` takes in round `j / (boxes / rounds)`.
    pub boxes: Vec<TmaBox>,
    /// How many parts the tile is staged in (a power of two dividing the box count).
    pub rounds: u32,
    /// The steps of each round ([`ROUND`]).
    pub round: Vec<StoreStep>,
    /// The steps before the consumers exit (a [`StoreStep::WaitAll`]).
    pub finish: Vec<StoreStep>,
    /// Byte offset of the staging tile in dynamic shared memory (1024-aligned).
    pub offset: u32,
    /// Named barrier id the storing threads meet at (group `g`'s: `barrier + g`).
    pub barrier: u32,
    /// Threads of one group, which meet at its barrier: all that hold the tile when
    /// `groups` is 1.
    pub threads: u32,
    /// The groups of threads that store the tile: group `g` (threads `g * threads ..`, one
    /// warpgroup) holds rows `g * rows / groups ..` of every box and stores them itself.
    pub groups: u32,
}

impl TmaStore {
    /// Bytes of one box.
    pub fn box_bytes(&self) -> u32 {
        self.box_dims[0] * self.box_dims[1] * 2
    }

    /// Boxes staged at once.
    pub fn boxes_per_round(&self) -> u32 {
        self.boxes.len() as u32 / self.rounds
    }

    /// Bytes of the staging tile.
    pub fn bytes(&self) -> u32 {
        self.box_bytes() * self.boxes_per_round()
    }

    /// This store staged in `rounds` parts (a power of two dividing the box count).
    pub fn in_rounds(&self, rounds: u32) -> TmaStore {
        let mut st = self.clone();
        st.rounds = rounds;
        let (per, bytes) = (st.boxes_per_round(), st.box_bytes());
        for (j, b) in st.boxes.iter_mut().enumerate() {
            b.smem_offset = (j as u32 % per) * bytes;
        }
        st
    }

    /// Rows of a box that one group stores.
    pub fn group_rows(&self) -> u32 {
        self.box_dims[0] / self.groups
    }

    /// The tensor map's box extents, outermost first: 1 for every lead dimension, then a
    /// group's rows by [`TmaStore::box_dims`]' columns.
    pub fn map_box(&self) -> Vec<u32> {
        let mut dims = vec![1; self.lead_dims as usize];
        dims.extend([self.group_rows(), self.box_dims[1]]);
        dims
    }
}

impl fmt::Display for TmaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  tma store {} param{} via smem @{} ({} B): {} box(es) {}x{} sw{} in {} round(s); ",
            self.store,
            self.param,
            self.offset,
            self.bytes(),
            self.boxes.len(),
            self.box_dims[0],
            self.box_dims[1],
            self.swizzle,
            self.rounds,
        )?;
        if self.groups == 1 {
            write!(f, "{} threads meet at bar {}", self.threads, self.barrier)?;
        } else {
            write!(
                f,
                "each of {} warpgroups stores its {} rows, its {} threads meeting at bar {} + its index",
                self.groups,
                self.group_rows(),
                self.threads,
                self.barrier
            )?;
        }
        write!(
            f,
            "\n    round: {}; at exit: {}",
            join_steps(&self.round),
            join_steps(&self.finish)
        )
    }
}
