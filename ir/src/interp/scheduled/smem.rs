//! Shared memory of the scheduled execution: the block's dynamic shared memory as 2-byte
//! cells, written by TMA boxes and read back as the tiles the tensor cores take.
//!
//! A box of a [`TmaLoad`] lands at `offset + stage * stage_stride + box.smem_offset` of
//! shared memory, its rows `swizzle` bytes apart, each 16-byte chunk of a row moved by the
//! address's swizzle (CUDA's 32/64/128-byte swizzles: bits 4.. of the address XOR bits 7..).
//! Reading a tile inverts the same map, box by box. So what the execution checks is the plan
//! itself: the boxes cover the tile exactly, stay inside the block's shared memory, and no
//! other buffer or stage is written over a stage between its load and its last read. Cells
//! start as NaN, so a tile read from cells no box wrote is NaN, not zero.

use half::{bf16, f16};

use crate::ring::TmaLoad;
use crate::types::DType;

use super::super::memory;
use super::super::value::{Elems, Value};
use crate::host::HostTensor;

/// Why a box or tile does not fit the plan.
pub(super) type PlanError = String;

/// The bits of a NaN in bf16 and in f16 alike.
const POISON: u16 = 0xFFFF;

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

    /// Every box of `load` for the tile at `coords` (one per tensor dimension) of `tensor`,
    /// into stage `stage`; elements outside the tensor are written as 0, as TMA fills them.
    pub(super) fn write_tile(
        &mut self,
        load: &TmaLoad,
        stage: u32,
        tensor: &HostTensor,
        coords: &[i32],
    ) -> Result<(), PlanError> {
        let rank = coords.len();
        let [rows, cols] = load.box_dims;
        for b in &load.boxes {
            let mut at = coords.to_vec();
            at[rank - 2] += b.origin[0] as i32;
            at[rank - 1] += b.origin[1] as i32;
            let data = memory::load(tensor, &at, &[rows as usize, cols as usize]);
            let (Elems::F(values), DType::Bf16 | DType::F16) = (&data.elems, data.dtype) else {
                return Err(format!("{} loads a tensor of 4-byte elements", load.load));
            };
            let base = stage_base(load, stage) + b.smem_offset;
            for r in 0..rows {
                for c in 0..cols {
                    let cell = self.cell(load, base, r, c)?;
                    let x = values[(r * cols + c) as usize];
                    self.cells[cell] = bits(data.dtype, x);
                }
            }
        }
        Ok(())
    }

    /// The `[rows, cols]` tile of `dtype` that `load`'s boxes hold in stage `stage`.
    pub(super) fn read_tile(
        &self,
        load: &TmaLoad,
        stage: u32,
        dtype: DType,
        dims: &[usize],
    ) -> Result<Value, PlanError> {
        let &[tile_rows, tile_cols] = dims else {
            return Err(format!("{} is not a 2-d tile", load.load));
        };
        let [rows, cols] = load.box_dims;
        let mut out = vec![f32::NAN; tile_rows * tile_cols];
        let mut covered = vec![false; tile_rows * tile_cols];
        for b in &load.boxes {
            let base = stage_base(load, stage) + b.smem_offset;
            for r in 0..rows {
                for c in 0..cols {
                    let (tr, tc) = ((b.origin[0] + r) as usize, (b.origin[1] + c) as usize);
                    if tr >= tile_rows || tc >= tile_cols {
                        return Err(format!(
                            "a box of {} at {:?} reaches past its {tile_rows}x{tile_cols} tile",
                            load.load, b.origin
                        ));
                    }
                    let e = tr * tile_cols + tc;
                    if std::mem::replace(&mut covered[e], true) {
                        return Err(format!(
                            "two boxes of {} cover element [{tr}, {tc}]",
                            load.load
                        ));
                    }
                    out[e] = value(dtype, self.cells[self.cell(load, base, r, c)?]);
                }
            }
        }
        if let Some(e) = covered.iter().position(|&c| !c) {
            return Err(format!(
                "no box of {} covers element [{}, {}]",
                load.load,
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

    /// The cell of element `[r, c]` of the box at byte `base`, swizzled.
    fn cell(&self, load: &TmaLoad, base: u32, r: u32, c: u32) -> Result<usize, PlanError> {
        let span = load.box_dims[1] * 2;
        if span != load.swizzle {
            return Err(format!(
                "{}: a box row of {span} B under a {} B swizzle",
                load.load, load.swizzle
            ));
        }
        let addr = base + r * span + 2 * c;
        let mask = load.swizzle / 16 - 1;
        let addr = addr ^ (((addr >> 7) & mask) << 4);
        let cell = addr as usize / 2;
        if cell >= self.cells.len() {
            return Err(format!(
                "{} writes byte {addr}, past the block's {} B of shared memory",
                load.load,
                self.cells.len() * 2
            ));
        }
        Ok(cell)
    }
}

/// Byte offset of stage `stage` of `load`'s buffer.
fn stage_base(load: &TmaLoad, stage: u32) -> u32 {
    load.offset + stage * load.stage_stride
}

/// The storage bits of `x` (already rounded to `dtype`).
fn bits(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        _ => bf16::from_f32(x).to_bits(),
    }
}

/// The value of storage bits `b` of `dtype`.
fn value(dtype: DType, b: u16) -> f32 {
    match dtype {
        DType::F16 => f16::from_bits(b).to_f32(),
        _ => bf16::from_bits(b).to_f32(),
    }
}
