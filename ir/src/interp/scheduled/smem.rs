//! Shared memory of the scheduled execution: the block's dynamic shared memory as 2-byte cells
//! (an f32 takes two), written and read in TMA boxes at their buffer's base plus their own
//! offset ([`Boxes`]), with CUDA's swizzles (none for a tile read into registers). So what the execution checks is the plan itself: the boxes cover their tile
//! exactly, stay inside the block's shared memory, and nothing else is written over a buffer
//! between its write and its last read. Cells start as NaN, so a tile read from cells no box
//! wrote is NaN, not zero.

use std::ops::Range;

use half::{bf16, f16};

use crate::host::HostTensor;
use crate::kernel::OpId;
use crate::sched::TmaStore;
use crate::sched::tma::{TmaBox, TmaLoad};
use crate::types::DType;

use super::super::memory;
use super::super::value::{Elems, Value};

/// Why boxes do not fit the plan.
pub(super) type PlanError = String;

/// The bits of a NaN in bf16 and in f16 alike.
const POISON: u16 = 0xFFFF;

/// Boxes of one tile in one buffer: a stage of a TMA load, or a round of a TMA store's
/// staging tile.
pub(super) struct Boxes<'a> {
    /// The load or store op (for messages).
    op: OpId,
    box_dims: [u32; 2],
    swizzle: u32,
    elem_bytes: u32,
    boxes: &'a [TmaBox],
    /// Byte offset the boxes' shared offsets count from.
    base: u32,
}

impl<'a> Boxes<'a> {
    /// Stage `stage` of the ring (or once) load `l`.
    pub(super) fn load(l: &'a TmaLoad, stage: u32) -> Boxes<'a> {
        Boxes {
            op: l.load,
            box_dims: l.box_dims,
            swizzle: l.swizzle,
            elem_bytes: l.elem_bytes,
            boxes: &l.boxes,
            base: l.offset + stage * l.stage_stride,
        }
    }

    /// Box `b` alone (a clustered ring's CTA issues some boxes of a load, into several
    /// CTAs' shared memory).
    pub(super) fn single(&self, b: usize) -> Boxes<'a> {
        Boxes {
            boxes: &self.boxes[b..=b],
            ..*self
        }
    }

    /// Boxes `range` of the TMA store `st`, in its staging tile.
    pub(super) fn store(st: &'a TmaStore, range: Range<usize>) -> Boxes<'a> {
        Boxes {
            op: st.store,
            box_dims: st.box_dims,
            swizzle: st.swizzle,
            elem_bytes: 2,
            boxes: &st.boxes[range],
            base: st.offset,
        }
    }

    /// The coordinates of box `b`'s first element, for a tile at `coords` (one per tensor
    /// dimension; the box moves the last two).
    pub(super) fn at(&self, b: usize, coords: &[i32]) -> Vec<i32> {
        let rank = coords.len();
        let mut at = coords.to_vec();
        at[rank - 2] += self.boxes[b].origin[0] as i32;
        at[rank - 1] += self.boxes[b].origin[1] as i32;
        at
    }

    fn dims(&self) -> [usize; 2] {
        self.box_dims.map(|d| d as usize)
    }
}

/// The block's dynamic shared memory.
pub(super) struct SharedMemory {
    cells: Vec<u16>,
}

impl SharedMemory {
    /// `bytes` of shared memory, every cell NaN.
    pub(super) fn new(bytes: u32) -> SharedMemory {
        SharedMemory {
            cells: vec![POISON; bytes as usize / 2],
        }
    }

    /// A TMA load: every box of the tile at `coords` of `tensor`; elements outside the
    /// tensor are written as 0, as TMA fills them.
    pub(super) fn load(
        &mut self,
        boxes: &Boxes,
        tensor: &HostTensor,
        coords: &[i32],
    ) -> Result<(), PlanError> {
        for b in 0..boxes.boxes.len() {
            let data = memory::load(tensor, &boxes.at(b, coords), &boxes.dims());
            self.write_box(boxes, b, &data, [0, 0])?;
        }
        Ok(())
    }

    /// The `dims` tile of `dtype` the boxes hold, which they must cover exactly once (a 1-D
    /// tile is one row).
    pub(super) fn read_tile(
        &self,
        boxes: &Boxes,
        dtype: DType,
        dims: &[usize],
    ) -> Result<Value, PlanError> {
        let (tile_rows, tile_cols) = match *dims {
            [c] => (1, c),
            [r, c] => (r, c),
            _ => return Err(format!("{} is not a 1-d or 2-d tile", boxes.op)),
        };
        let [rows, cols] = boxes.dims();
        let mut out = vec![f32::NAN; tile_rows * tile_cols];
        let mut covered = vec![false; tile_rows * tile_cols];
        for (b, bx) in boxes.boxes.iter().enumerate() {
            let values = self.box_values(boxes, b, dtype)?;
            for r in 0..rows {
                for c in 0..cols {
                    let (tr, tc) = (bx.origin[0] as usize + r, bx.origin[1] as usize + c);
                    if tr >= tile_rows || tc >= tile_cols {
                        return Err(format!(
                            "a box of {} at {:?} reaches past its {tile_rows}x{tile_cols} tile",
                            boxes.op, bx.origin
                        ));
                    }
                    let e = tr * tile_cols + tc;
                    if std::mem::replace(&mut covered[e], true) {
                        return Err(format!(
                            "two boxes of {} cover element [{tr}, {tc}]",
                            boxes.op
                        ));
                    }
                    out[e] = values[r * cols + c];
                }
            }
        }
        if let Some(e) = covered.iter().position(|&c| !c) {
            return Err(format!(
                "no box of {} covers element [{}, {}]",
                boxes.op,
                e / tile_cols,
                e % tile_cols
            ));
        }
        Ok(Value {
            dtype,
            dims: dims.to_vec(),
            elems: Elems::F(out),
        })
    }

    /// A staging write: each box takes the part of register tile `tile` at its origin.
    pub(super) fn stage(&mut self, boxes: &Boxes, tile: &Value) -> Result<(), PlanError> {
        for (b, bx) in boxes.boxes.iter().enumerate() {
            self.write_box(boxes, b, tile, bx.origin.map(|o| o as usize))?;
        }
        Ok(())
    }

    /// Box `b` as a tile of its extents.
    pub(super) fn read_box(
        &self,
        boxes: &Boxes,
        b: usize,
        dtype: DType,
    ) -> Result<Value, PlanError> {
        Ok(Value {
            dtype,
            dims: boxes.dims().to_vec(),
            elems: Elems::F(self.box_values(boxes, b, dtype)?),
        })
    }

    /// Box `b`'s elements of `dtype` (bf16, f16 or f32), row by row.
    fn box_values(&self, boxes: &Boxes, b: usize, dtype: DType) -> Result<Vec<f32>, PlanError> {
        if stored_bytes(dtype) != Some(boxes.elem_bytes) {
            return Err(format!(
                "{} reads {dtype} elements from boxes of {}-byte ones",
                boxes.op, boxes.elem_bytes
            ));
        }
        let [rows, cols] = boxes.dims();
        let mut out = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let cell = self.cell(boxes, b, r, c)?;
                out.push(match dtype {
                    DType::F32 => f32::from_bits(
                        u32::from(self.cells[cell]) | (u32::from(self.cells[cell + 1]) << 16),
                    ),
                    _ => decode(dtype, self.cells[cell]),
                });
            }
        }
        Ok(out)
    }

    /// Writes into box `b` the part of `tile` whose first element is at `origin`.
    fn write_box(
        &mut self,
        boxes: &Boxes,
        b: usize,
        tile: &Value,
        origin: [usize; 2],
    ) -> Result<(), PlanError> {
        let Elems::F(values) = &tile.elems else {
            return Err(format!("{} moves elements that are not floats", boxes.op));
        };
        if stored_bytes(tile.dtype) != Some(boxes.elem_bytes) {
            return Err(format!(
                "{} moves {} elements into boxes of {}-byte ones",
                boxes.op, tile.dtype, boxes.elem_bytes
            ));
        }
        let (tile_rows, tile_cols) = tile.rows_cols();
        let [rows, cols] = boxes.dims();
        if origin[0] + rows > tile_rows || origin[1] + cols > tile_cols {
            return Err(format!(
                "a box of {} at {origin:?} reaches past its {tile_rows}x{tile_cols} tile",
                boxes.op
            ));
        }
        for r in 0..rows {
            for c in 0..cols {
                let x = values[(origin[0] + r) * tile_cols + origin[1] + c];
                let cell = self.cell(boxes, b, r, c)?;
                if tile.dtype == DType::F32 {
                    let bits = x.to_bits();
                    self.cells[cell] = bits as u16;
                    self.cells[cell + 1] = (bits >> 16) as u16;
                } else {
                    self.cells[cell] = encode(tile.dtype, x);
                }
            }
        }
        Ok(())
    }

    /// The (first) cell of element `[r, c]` of box `b`, swizzled: the box's rows are
    /// `swizzle` bytes apart and each 16-byte chunk of a row moves by the address's swizzle
    /// (CUDA's 32/64/128-byte swizzles: bits 4.. of the address XOR bits 7..); reading inverts
    /// the map. Unswizzled (`swizzle` 0) rows are packed.
    fn cell(&self, boxes: &Boxes, b: usize, r: usize, c: usize) -> Result<usize, PlanError> {
        let span = boxes.box_dims[1] * boxes.elem_bytes;
        if boxes.swizzle != 0 && span != boxes.swizzle {
            return Err(format!(
                "{}: a box row of {span} B under a {} B swizzle",
                boxes.op, boxes.swizzle
            ));
        }
        let addr =
            boxes.base + boxes.boxes[b].smem_offset + r as u32 * span + boxes.elem_bytes * c as u32;
        let mask = (boxes.swizzle / 16).max(1) - 1;
        let addr = addr ^ (((addr >> 7) & mask) << 4);
        let cell = addr as usize / 2;
        if cell + boxes.elem_bytes as usize / 2 > self.cells.len() {
            return Err(format!(
                "{} reaches byte {addr}, past the block's {} B of shared memory",
                boxes.op,
                self.cells.len() * 2
            ));
        }
        Ok(cell)
    }
}

/// Bytes of one stored element of `dtype`, for the floats shared memory holds.
fn stored_bytes(dtype: DType) -> Option<u32> {
    match dtype {
        DType::Bf16 | DType::F16 => Some(2),
        DType::F32 => Some(4),
        _ => None,
    }
}

/// The storage bits of `x` (already rounded to `dtype`, bf16 or f16).
fn encode(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        _ => bf16::from_f32(x).to_bits(),
    }
}

/// The value of storage bits `b` of `dtype` (bf16 or f16).
fn decode(dtype: DType, b: u16) -> f32 {
    match dtype {
        DType::F16 => f16::from_bits(b).to_f32(),
        _ => bf16::from_bits(b).to_f32(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A K-major load of an `8 x 64` bf16 tile (one 128-byte-swizzled box) at `offset`.
    fn load_8x64(offset: u32) -> TmaLoad {
        let mut l = TmaLoad::new(
            OpId::from_index(0),
            0,
            crate::sched::tma::Operand::KMajorA,
            8,
            64,
        );
        l.offset = offset;
        l
    }

    #[test]
    fn the_128_byte_swizzle_moves_chunk_j_of_row_r_to_chunk_j_xor_r() {
        let l = load_8x64(1024);
        // Element i holds i mod 256, exact in bf16.
        let t = HostTensor::from_fn(&[8, 64], DType::Bf16, |i| (i % 256) as f64);
        let mut smem = SharedMemory::new(4096);
        smem.load(&Boxes::load(&l, 0), &t, &[0, 0]).expect("fits");
        for r in 0..8 {
            for c in 0..64 {
                let byte = 1024 + r * 128 + ((c / 8) ^ r) * 16 + (c % 8) * 2;
                let got = bf16::from_bits(smem.cells[byte / 2]).to_f64();
                assert_eq!(got, ((r * 64 + c) % 256) as f64, "element [{r}, {c}]");
            }
        }
    }

    #[test]
    fn a_tile_reads_back_with_zeros_outside_the_tensor() {
        let l = load_8x64(0);
        let t = HostTensor::from_fn(&[5, 40], DType::Bf16, |i| 1.0 + (i % 200) as f64);
        let mut smem = SharedMemory::new(1024);
        smem.load(&Boxes::load(&l, 0), &t, &[2, 8]).expect("fits");
        let tile = smem
            .read_tile(&Boxes::load(&l, 0), DType::Bf16, &[8, 64])
            .expect("covered");
        let Elems::F(got) = tile.elems else {
            panic!("floats")
        };
        for r in 0..8 {
            for c in 0..64 {
                let want = if r + 2 < 5 && c + 8 < 40 {
                    1.0 + (((r + 2) * 40 + c + 8) % 200) as f32
                } else {
                    0.0
                };
                assert_eq!(got[r * 64 + c], want, "element [{r}, {c}]");
            }
        }
    }

    #[test]
    fn boxes_that_miss_their_tile_or_shared_memory_are_plan_errors() {
        let mut l = load_8x64(0);
        let smem = SharedMemory::new(1024);
        let gap = smem.read_tile(&Boxes::load(&l, 0), DType::Bf16, &[8, 128]);
        assert!(
            gap.is_err_and(|e| e.contains("no box")),
            "a tile wider than its box"
        );
        l.offset = 1024;
        let outside = smem.read_tile(&Boxes::load(&l, 0), DType::Bf16, &[8, 64]);
        assert!(outside.is_err_and(|e| e.contains("past the block")));
    }
}
