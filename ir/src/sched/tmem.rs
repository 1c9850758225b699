//! Tensor memory (sm_100a): the CTA's one allocation of TMEM columns, the tiles placed in it
//! (an accumulator; an attention pair's `S`/`P` and `O` per Q tile), and the descriptors the
//! `tcgen05.mma`s read their operands with (docs/ptx.md §7).
//!
//! The MMA warp allocates the columns before the roles split and publishes their address
//! through a 4-byte shared slot; it frees them after its last tile. A tile is a range of
//! columns over all 128 lanes, f32 (or packed bf16 pairs for `P` over `S`).

use std::fmt;

use super::region::MmaPart;
use super::tma::{Operand, TmaLoad};
use crate::types::DType;

/// Columns of tensor memory per CTA (128 lanes of 32-bit cells each).
pub const TMEM_COLUMNS: u32 = 512;
/// Rows of the accumulator: one per TMEM lane (`tcgen05.mma` M = 128, `cta_group::1`).
pub const ACC_ROWS: u32 = 128;
/// Columns one `tcgen05.ld.32x32b` of the epilogue copies (`.x32`: 32 registers a thread).
pub const LOAD_COLUMNS: u32 = 32;

/// How `tcgen05.mma` reads one operand's stage: the shared-memory descriptor's constant
/// fields and, per k16 step of a stage, the byte offset of its start from the stage base.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// Bits 14..=63 of the descriptor (LBO, SBO, bit 46, swizzle); the start address goes
    /// into bits 0..=13.
    pub template: u64,
    /// Leading and stride byte offsets, and the swizzle span, as encoded.
    pub lbo: u32,
    /// See [`Descriptor::lbo`].
    pub sbo: u32,
    /// Swizzle span in bytes (32, 64 or 128).
    pub swizzle: u32,
    /// Byte offset of each k16 step's start from the stage base.
    pub steps: Vec<u32>,
}

impl Descriptor {
    /// The descriptor of ring load `l` (docs/ptx.md §7: the Hopper fields plus bit 46, the
    /// swizzle code in bits 61..=63). K-major tiles (A, B stored `[N, K]`) are boxes of
    /// `chunk` K columns; SBO is 8 rows, LBO unused (16 B), and a k16 step moves 32 bytes
    /// inside a box. An MN-major B (stored `[K, N]`) is one box of all K rows per `span / 2`
    /// columns of N, its rows the swizzle span (128 B for N a multiple of 64; 96 takes three
    /// 64-B boxes): LBO is the boxes' distance, SBO 8 K-rows (`8 span`), a k16 step 16 rows
    /// (the canonical MN-major layouts, as on sm_90a).
    pub fn of(l: &TmaLoad) -> Descriptor {
        let (rows, chunk) = (l.box_dims[0], l.box_dims[1]);
        let (lbo, sbo, steps) = match l.operand {
            Operand::KMajorA | Operand::KMajorB => {
                let bk = chunk * l.boxes.len() as u32;
                let steps = (0..bk / 16)
                    .map(|s| {
                        let (b, within) = ((16 * s) / chunk, (16 * s) % chunk);
                        b * rows * chunk * 2 + within * 2
                    })
                    .collect();
                (16, 8 * chunk * 2, steps)
            }
            Operand::MnMajorA | Operand::MnMajorB => {
                let span = l.swizzle;
                let steps = (0..rows / 16).map(|s| s * 16 * span).collect();
                (rows * span, 8 * span, steps)
            }
            // Read by threads, never through a descriptor.
            Operand::Registers => (16, 16, Vec::new()),
        };
        let code: u64 = match l.swizzle {
            128 => 2,
            64 => 4,
            _ => 6,
        };
        Descriptor {
            template: (code << 61)
                | (1 << 46)
                | (u64::from(sbo >> 4) << 32)
                | (u64::from(lbo >> 4) << 16),
            lbo,
            sbo,
            swizzle: l.swizzle,
            steps,
        }
    }
}

/// The 32-bit instruction descriptor of `tcgen05.mma.kind::f16` (docs/ptx.md §7): f32 D,
/// `dtype` A and B, K-major A, B transposed when it is MN-major, `N >> 3`, `M >> 4`.
pub fn instruction_descriptor(dtype: DType, m: u32, n: u32, b_mn_major: bool) -> u32 {
    let ab = u32::from(dtype == DType::Bf16);
    (1 << 4)
        | (ab << 7)
        | (ab << 10)
        | (u32::from(b_mn_major) << 16)
        | ((n >> 3) << 17)
        | ((m >> 4) << 24)
}

/// A tile of [`Tmem::tiles`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TmemTileId(pub usize);

/// A range of TMEM columns holding one tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmemTile {
    /// What it holds (`acc`, `S`, `O`).
    pub name: &'static str,
    /// Which Q tile of an attention pair it belongs to, if any.
    pub index: Option<u32>,
    /// First column.
    pub column: u32,
    /// Columns (f32 each).
    pub columns: u32,
}

/// The operands of one `tcgen05.mma` part.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TmemMma {
    /// Which part of the loop body it computes.
    pub part: MmaPart,
    /// The instruction descriptor.
    pub idesc: u32,
    /// A's shared-memory descriptor, or `None` when A is read from TMEM (an attention
    /// pair's `P`).
    pub a: Option<Descriptor>,
    /// B's shared-memory descriptor.
    pub b: Descriptor,
}

/// The CTA's tensor memory (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tmem {
    /// Columns allocated (a power of 2, 32..=512).
    pub columns: u32,
    /// Shared byte offset of the 4-byte slot the address is published through.
    pub slot_offset: u32,
    /// The tiles placed in it.
    pub tiles: Vec<TmemTile>,
    /// The mmas writing them.
    pub mmas: Vec<TmemMma>,
}

impl Tmem {
    /// The tile called `name` of Q tile `index`.
    pub fn tile(&self, name: &str, index: Option<u32>) -> Option<TmemTileId> {
        self.tiles
            .iter()
            .position(|t| t.name == name && t.index == index)
            .map(TmemTileId)
    }

    /// The mma computing `part`.
    pub fn mma(&self, part: MmaPart) -> Option<&TmemMma> {
        self.mmas.iter().find(|m| m.part == part)
    }
}

impl fmt::Display for TmemTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)?;
        if let Some(i) = self.index {
            write!(f, "{i}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps: Vec<String> = self.steps.iter().map(u32::to_string).collect();
        write!(
            f,
            "0x{:016X} (lbo {} sbo {} sw{}), k16 steps at +{}",
            self.template,
            self.lbo,
            self.sbo,
            self.swizzle,
            steps.join(" +")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entities::OpId;

    #[test]
    fn descriptors_match_ptx_notes() {
        // docs/ptx.md §7: bf16 x bf16 -> f32, K-major A and B.
        assert_eq!(
            instruction_descriptor(DType::Bf16, 128, 128, false),
            0x0820_0490
        );
        assert_eq!(
            instruction_descriptor(DType::Bf16, 128, 256, false),
            0x0840_0490
        );
        // K-major SW128 = 0x4000404000010000 | addr >> 4; k16 steps 32 bytes apart.
        let a = TmaLoad::new(OpId::from_index(0), 0, Operand::KMajorA, 128, 64);
        let d = Descriptor::of(&a);
        assert_eq!(d.template, 0x4000_4040_0001_0000);
        assert_eq!(d.steps, [0, 32, 64, 96]);
        // 64-byte swizzle (BK = 32): swizzle code 4, SBO = 8 rows of 64 bytes.
        let d = Descriptor::of(&TmaLoad::new(
            OpId::from_index(0),
            0,
            Operand::KMajorA,
            128,
            32,
        ));
        assert_eq!(d.template >> 61, 4);
        assert_eq!(d.sbo, 512);
        // BK = 128: two 64-column boxes; steps 4.. start in the second box.
        let d = Descriptor::of(&TmaLoad::new(
            OpId::from_index(0),
            0,
            Operand::KMajorA,
            128,
            128,
        ));
        assert_eq!(d.steps[4], 128 * 64 * 2);
        // MN-major B (stored [K, N]): LBO = the 64-column boxes' distance, SBO = 8 K-rows,
        // a k16 step is 16 rows of 128 bytes.
        let d = Descriptor::of(&TmaLoad::new(
            OpId::from_index(1),
            1,
            Operand::MnMajorB,
            64,
            128,
        ));
        assert_eq!((d.lbo, d.sbo), (64 * 128, 1024));
        assert_eq!(d.steps, [0, 2048, 4096, 6144]);
        // N = 96: three 32-column boxes of 64-byte rows; LBO = their distance (64 K-rows of
        // 64 bytes), SBO = 8 K-rows of 64 bytes, a k16 step 16 such rows, swizzle code 4.
        let d = Descriptor::of(&TmaLoad::new(
            OpId::from_index(1),
            1,
            Operand::MnMajorB,
            64,
            96,
        ));
        assert_eq!((d.lbo, d.sbo, d.swizzle), (64 * 64, 512, 64));
        assert_eq!(d.steps, [0, 1024, 2048, 3072]);
        assert_eq!(d.template >> 61, 4);
        // K = 96 (K-major): three 32-column boxes; step 2 starts the second box.
        let d = Descriptor::of(&TmaLoad::new(
            OpId::from_index(0),
            0,
            Operand::KMajorA,
            128,
            96,
        ));
        assert_eq!(
            d.steps,
            [
                0,
                32,
                128 * 32 * 2,
                128 * 32 * 2 + 32,
                2 * 128 * 32 * 2,
                2 * 128 * 32 * 2 + 32
            ]
        );
    }
}
