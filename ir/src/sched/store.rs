//! TMA stores of the schedule: the epilogue's stores that drain a swizzled staging tile into
//! global memory. Threads write a register tile into the staging tile in rounds and one thread
//! stores its boxes (`cp.async.bulk.tensor`); the round program ([`TmaStore::round`]) runs
//! where the kernel's code stores the tile.

use crate::entities::OpId;

use super::barrier::BarrierId;
use super::op::Op;
use super::tma::TmaBox;

/// Columns of one 128-byte box of a TMA store (2-byte elements).
pub const BOX_COLUMNS: u32 = 64;

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
    /// Byte offset of the staging tile in dynamic shared memory (1024-aligned).
    pub offset: u32,
    /// The named barrier array the storing threads meet at (one element per group).
    pub barrier: BarrierId,
    /// Threads of one group, which meet at its barrier: all that hold the tile when
    /// `groups` is 1.
    pub threads: u32,
    /// The groups of threads that store the tile: group `g` (threads `g * threads ..`, one
    /// warpgroup) holds rows `g * rows / groups ..` of every box and stores them itself.
    pub groups: u32,
    /// The ops of each round: the staging tile is free, written, visible, stored.
    pub round: Vec<Op>,
    /// Which of the work tiles a CTA runs at once stores through it (0; `g` for Q tile `g`
    /// of an sm_100a attention pair, whose softmax warpgroup stores its own tile).
    pub work_tile: u32,
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

    /// Stages the tile in `rounds` parts (a power of two dividing the box count): box `j`
    /// takes its place in the staging tile in round `j / (boxes / rounds)`.
    pub fn set_rounds(&mut self, rounds: u32) {
        self.rounds = rounds;
        let (per, bytes) = (self.boxes_per_round(), self.box_bytes());
        for (j, b) in self.boxes.iter_mut().enumerate() {
            b.smem_offset = (j as u32 % per) * bytes;
        }
    }

    /// Puts the store's groups on named barrier array `barrier`, with the round program that
    /// meets there: the staging tile is free, written, visible, stored.
    pub fn set_barrier(&mut self, barrier: BarrierId) {
        let sync = Op::sync(barrier);
        self.barrier = barrier;
        self.round = vec![
            Op::BulkWaitRead,
            sync,
            Op::StagingWrite,
            Op::FenceProxyAsync,
            sync,
            Op::BulkStore,
            Op::BulkCommit,
        ];
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
