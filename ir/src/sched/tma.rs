//! TMA loads of the schedule: the loads that fill stage buffers (or a tile's once buffer)
//! box by box, and the boxes both loads and stores ([`super::store`]) are made of.
//!
//! A load's tile is made of boxes, each a sub-rectangle written at its own shared offset and
//! swizzled by its row's bytes; a stage of the load's buffer is `offset + stage *
//! stage_stride`. Its bytes complete on the load's barrier: a per-iteration stage ring's
//! `full` array, or a per-tile barrier for a tile loaded once per work tile (attention's `Q`).

use crate::arena::{EntityName, Handle};
use crate::entities::OpId;

use super::barrier::BarrierId;
use super::region::MmaPart;

/// Bytes of the 128-byte swizzle atom (8 rows of 128 B): the alignment of every stage.
pub const SWIZZLE_ATOM: u32 = 1024;

/// Alignment of an unswizzled [`Operand::Registers`] stage (TMA writes shared memory at
/// 128-byte aligned addresses).
pub const REGISTER_TILE_ALIGN: u32 = 128;

/// One TMA box of a load: a sub-rectangle of the tile written at its own shared offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaBox {
    /// Offset of the box inside the tile, `[row, col]` in elements.
    pub origin: [u32; 2],
    /// Byte offset of the box inside a stage.
    pub smem_offset: u32,
}

/// How the tile of a ring load is read by wgmma.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The A operand, stored `[M, K]` (K contiguous): K-major.
    KMajorA,
    /// The A operand stored `[K, M]` (M contiguous; the body multiplies the transposed view
    /// `x.t()` of the loaded tile): MN-major, `imm-trans-a = 1` (sm_90a).
    MnMajorA,
    /// The B operand stored `[K, N]` (N contiguous): MN-major, `imm-trans-b = 1`.
    MnMajorB,
    /// The B operand stored `[N, K]` (K contiguous; the body multiplies by the transposed
    /// view `y.t()` of the loaded tile): K-major like A, `imm-trans-b = 0`.
    KMajorB,
    /// No mma's: a tile the consumers' threads read into registers from the stage, unswizzled
    /// (row statistics beside the mmas, attention backward's log-sum-exp and `delta`),
    /// fetched ahead with the mma operands instead of from global memory in the body.
    Registers,
}

/// A tile loaded by TMA into a ring of stages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TmaLoad {
    /// The `load` op.
    pub load: OpId,
    /// The tensor parameter it reads (the one whose tensor map the runtime builds).
    pub param: usize,
    /// Tensor dimensions outside the tile's two (a rank-4 tensor's batch and head): box
    /// extent 1, coordinates the load's leading operands.
    pub lead_dims: u32,
    /// What the tile feeds.
    pub operand: Operand,
    /// Box extents, outermost first (`[rows, cols]`), as the runtime encodes the map.
    pub box_dims: [u32; 2],
    /// Swizzle span in bytes (32, 64 or 128): the box row's bytes; 0 for no swizzle (a
    /// [`Operand::Registers`] tile, rows packed).
    pub swizzle: u32,
    /// Bytes of one element (2; 4 for an f32 tile read into registers).
    pub elem_bytes: u32,
    /// The boxes that make up the tile.
    pub boxes: Vec<TmaBox>,
    /// Byte offset of stage 0 in dynamic shared memory (1024-aligned).
    pub offset: u32,
    /// Bytes between consecutive stages (a multiple of 1024).
    pub stage_stride: u32,
}

/// The columns of one box of a tile `extent` 2-byte elements wide along its contiguous
/// dimension: the widest of 64, 32 and 16 dividing it (box rows of 128, 64 or 32 bytes, each
/// swizzled by its own bytes), so the boxes tile it exactly (96: three of 32). Else `extent`
/// itself, one box whose row is no swizzle span: the pipeline pass plans rings only for
/// multiples of 16.
pub fn box_columns(extent: u32) -> u32 {
    [64, 32, 16]
        .into_iter()
        .find(|&c| extent.is_multiple_of(c))
        .unwrap_or(extent)
}

impl TmaLoad {
    /// A tile of `rows x cols` elements as stored (`cols` contiguous: K of a K-major A or B
    /// stored `[N, K]`, N of an MN-major B stored `[K, N]`): one box of `rows` rows by
    /// `chunk = box_columns(cols)` columns per `chunk` columns, the boxes `rows * chunk * 2`
    /// bytes apart, each swizzled by its row's bytes (`chunk * 2`: 128 for `cols` a multiple
    /// of 64, else 64 or 32). `cols` is a multiple of 16 (the pipeline pass checks). `offset`
    /// is left 0 for the pass to place.
    pub fn new(load: OpId, param: usize, operand: Operand, rows: u32, cols: u32) -> TmaLoad {
        let chunk = box_columns(cols);
        TmaLoad {
            load,
            param,
            lead_dims: 0,
            operand,
            box_dims: [rows, chunk],
            swizzle: chunk * 2,
            elem_bytes: 2,
            boxes: (0..cols / chunk)
                .map(|c| TmaBox {
                    origin: [0, c * chunk],
                    smem_offset: c * rows * chunk * 2,
                })
                .collect(),
            offset: 0,
            stage_stride: (rows * cols * 2).next_multiple_of(SWIZZLE_ATOM),
        }
    }

    /// A `rows x cols` tile of `elem_bytes` elements the consumers read into registers
    /// ([`Operand::Registers`]): one unswizzled box, rows packed (`cols * elem_bytes` a
    /// multiple of 16, at most 256 elements either way: the pipeline pass checks).
    pub fn registers(load: OpId, param: usize, rows: u32, cols: u32, elem_bytes: u32) -> TmaLoad {
        TmaLoad {
            load,
            param,
            lead_dims: 0,
            operand: Operand::Registers,
            box_dims: [rows, cols],
            swizzle: 0,
            elem_bytes,
            boxes: vec![TmaBox {
                origin: [0, 0],
                smem_offset: 0,
            }],
            offset: 0,
            stage_stride: (rows * cols * elem_bytes).next_multiple_of(REGISTER_TILE_ALIGN),
        }
    }

    /// The tensor map's box extents, outermost first: 1 for every lead dimension, then
    /// [`TmaLoad::box_dims`].
    pub fn map_box(&self) -> Vec<u32> {
        let mut dims = vec![1; self.lead_dims as usize];
        dims.extend(self.box_dims);
        dims
    }

    /// The tile's extent `[rows, cols]`: what its boxes cover together (a clustered ring's
    /// shared load issues each box of the tile as slabs of rows, [`super::cluster`]).
    pub fn tile_dims(&self) -> [u32; 2] {
        let extent = |d: usize| {
            self.boxes
                .iter()
                .map(|b| b.origin[d] + self.box_dims[d])
                .max()
                .unwrap_or(0)
        };
        [extent(0), extent(1)]
    }

    /// Bytes of one box.
    pub fn box_bytes(&self) -> u32 {
        self.box_dims[0] * self.box_dims[1] * self.elem_bytes
    }

    /// Transaction bytes of the whole tile (every box counts in full, even out of bounds).
    pub fn tile_bytes(&self) -> u32 {
        self.box_bytes() * self.boxes.len() as u32
    }
}

/// A handle to a load of [`super::Sched::loads`].
pub type LoadId = Handle<Load>;

impl EntityName for Load {
    const PREFIX: &'static str = "tma";
}

/// A TMA load of the schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Load {
    /// The tile and its boxes.
    pub tma: TmaLoad,
    /// The barrier its bytes complete on (its phase per iteration: a stage of the ring; per
    /// tile: loaded once per work tile).
    pub barrier: BarrierId,
    /// The barrier its readers release its buffer on, which the producer waits on before
    /// refilling it (`None`: loaded once and never refilled).
    pub free: Option<BarrierId>,
    /// Which of the work tiles a CTA runs at once the load's coordinates are those of (0; 1
    /// for the second Q tile of an sm_100a attention pair, loaded at its block's coordinates).
    pub work_tile: u32,
    /// The part of the loop body whose mmas read it: the whole body of an unrotated loop;
    /// the head (attention's `Q` and `K`) or the tail (`V`) of a rotated one.
    pub read_by: MmaPart,
}
