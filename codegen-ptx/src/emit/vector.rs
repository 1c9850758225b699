//! Register tiles moved to and from global memory in vectors of up to 16 bytes per thread
//! (`ld.global.v4.f32`, eight bf16 as `v4.b32`, ...).
//!
//! A thread's registers are grouped into runs of `w` consecutive columns of one row, the
//! first at a multiple of `w` ([`vector_width`]). Each run is one vector access where the
//! whole run lies inside the tensor and its address is aligned to the vector's size (known
//! at compile time for a 16-byte aligned tensor and a column coordinate that is a multiple
//! of `w`, else tested per row at run time); elsewhere (a tile's ragged edge, a row of an
//! unaligned tensor that happens to be misaligned) each element is moved on its own under
//! its own bounds check, so tails of any length stay exact.

use std::collections::BTreeMap;

use kiln_ir::schedule::Distribution;
use kiln_ir::{DType, OpId, Param, ValueId};

use super::Emitter;
use super::memory::mem_ty;
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// The widest access, in bytes.
const MAX_BYTES: u32 = 16;

/// One run of a thread's registers moved by one vector access.
struct Run {
    /// Row address (`.b64`) and byte offset of the run's first element.
    addr: Reg,
    off: u32,
    /// Whether the whole run lies inside the tensor and is aligned: one vector access.
    whole: Reg,
    /// Per element, where the run is not whole: whether the element lies inside.
    parts: Vec<Reg>,
    /// The run's first register index in the tile.
    first: usize,
}

/// The number of elements `w` (a power of two, at most 16 bytes) each vector access moves for
/// a tile in distribution `d` of `dtype`, or 1 when none fits: every thread's column
/// coordinate a multiple of `w`, and the registers in runs of `w` consecutive columns of one
/// row starting at multiples of `w`.
pub(crate) fn vector_width(d: &Distribution, dtype: DType) -> u32 {
    if !matches!(dtype, DType::F32 | DType::I32 | DType::Bf16 | DType::F16) {
        return 1;
    }
    let esize = dtype.size_bytes() as u32;
    let col = d.terms.len() - 1;
    let mut w = MAX_BYTES / esize;
    while w > 1 {
        let threads_ok = d.terms[col].iter().all(|t| t.mul.is_multiple_of(w));
        let runs_ok = d.regs.len().is_multiple_of(w as usize)
            && d.regs.chunks(w as usize).all(|run| {
                run[0][col].is_multiple_of(w)
                    && run
                        .iter()
                        .enumerate()
                        .all(|(k, r)| r[col] == run[0][col] + k as u32 && r[..col] == run[0][..col])
            });
        if threads_ok && runs_ok {
            return w;
        }
        w /= 2;
    }
    1
}

impl Emitter<'_> {
    /// Whether loads of tensor parameter `tensor` may take the read-only (non-coherent) path:
    /// the kernel never writes it (`Tensor`, not `TensorMut`).
    pub(super) fn read_only(&self, tensor: usize) -> bool {
        matches!(
            self.k.params.get(tensor),
            Some(Param::Tensor { mutable: false, .. })
        )
    }

    /// The runs of `w` elements of register tile `v` at `coords` in `tensor` (`col_coord`: the
    /// IR value of the column coordinate, for its known alignment), with their predicates.
    #[allow(clippy::too_many_arguments)]
    fn runs(
        &mut self,
        tensor: usize,
        coords: &[Reg],
        col_coord: ValueId,
        clip: Option<(usize, Reg)>,
        d: &Distribution,
        w: u32,
        at: OpId,
    ) -> Result<Vec<Run>, CodegenError> {
        let tile_rank = d.terms.len();
        let o = self.origin(tensor, coords, tile_rank, clip, at)?;
        let col_dim = tile_rank - 1;
        let bytes = w * o.esize;
        // Base, outer strides (16-byte aligned tensor) and column (a multiple of `w`) all keep
        // every run aligned; otherwise each row's address is tested.
        let static_aligned =
            self.k.params[tensor].aligned16() && self.known_multiple(col_coord).is_multiple_of(w);
        let col_base = self.thread_coord(&d.terms[col_dim]);
        let col0 = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {col0}, {}, {col_base}", o.coords[col_dim]));
        let row_base = if tile_rank == 2 {
            let rb = self.thread_coord(&d.terms[0]);
            let r0 = self.new_reg(Class::B32);
            self.ins(format!("add.s32 {r0}, {}, {rb}", o.coords[0]));
            Some(r0)
        } else {
            None
        };
        // Per row offset: address, inside, inside and aligned. Per column offset: inside.
        let mut rows: BTreeMap<u32, (Reg, Reg, Reg)> = BTreeMap::new();
        let mut cols: BTreeMap<u32, Reg> = BTreeMap::new();
        let mut out = Vec::with_capacity(d.regs.len() / w as usize);
        for (i, run) in d.regs.chunks(w as usize).enumerate() {
            let (ro, co) = if tile_rank == 2 {
                (run[0][0], run[0][1])
            } else {
                (0, run[0][0])
            };
            if !rows.contains_key(&ro) {
                let (addr, ok) = match row_base {
                    Some(r0) => {
                        let r = self.new_reg(Class::B32);
                        self.ins(format!("add.s32 {r}, {r0}, {ro}"));
                        let ok = self.in_bounds(r, o.dims[0], o.outer_ok);
                        (self.element_addr(&o, Some(r), col0), ok)
                    }
                    None => {
                        let ok = self.new_reg(Class::Pred);
                        match o.outer_ok {
                            Some(q) => self.mov(ok, q),
                            None => self.ins(format!("setp.eq.u32 {ok}, 0, 0")),
                        }
                        (self.element_addr(&o, None, col0), ok)
                    }
                };
                let vec_ok = if static_aligned {
                    ok
                } else {
                    let low = self.new_reg(Class::B64);
                    self.ins(format!("and.b64 {low}, {addr}, {}", bytes - 1));
                    let p = self.setp("eq.u64", low, 0);
                    self.ins(format!("and.pred {p}, {p}, {ok}"));
                    p
                };
                rows.insert(ro, (addr, ok, vec_ok));
            }
            for c in co..co + w {
                if let std::collections::btree_map::Entry::Vacant(e) = cols.entry(c) {
                    let x = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {x}, {col0}, {c}"));
                    e.insert(self.in_bounds(x, o.dims[col_dim], None));
                }
            }
            let (addr, row_ok, vec_ok) = rows[&ro];
            // The first and the last element inside (unsigned compares: a negative column
            // is outside) put every element between them inside.
            let whole = self.new_reg(Class::Pred);
            self.ins(format!("and.pred {whole}, {vec_ok}, {}", cols[&co]));
            self.ins(format!(
                "and.pred {whole}, {whole}, {}",
                cols[&(co + w - 1)]
            ));
            let split = self.new_reg(Class::Pred);
            self.ins(format!("not.pred {split}, {whole}"));
            let mut parts = Vec::with_capacity(w as usize);
            for c in co..co + w {
                let p = self.new_reg(Class::Pred);
                self.ins(format!("and.pred {p}, {row_ok}, {}", cols[&c]));
                self.ins(format!("and.pred {p}, {p}, {split}"));
                parts.push(p);
            }
            out.push(Run {
                addr,
                off: co * o.esize,
                whole,
                parts,
                first: i * w as usize,
            });
        }
        Ok(out)
    }

    /// Loads register tile `v` of `dtype` from `tensor` in vectors of `w` elements: the
    /// tile's registers (0 outside the tensor).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vector_load(
        &mut self,
        tensor: usize,
        coords: &[Reg],
        col_coord: ValueId,
        d: &Distribution,
        dtype: DType,
        w: u32,
        at: OpId,
    ) -> Result<Vec<Reg>, CodegenError> {
        let space = if self.read_only(tensor) {
            "global.nc"
        } else {
            "global"
        };
        let esize = dtype.size_bytes() as u32;
        let mut regs = Vec::with_capacity(d.regs.len());
        for run in self.runs(tensor, coords, col_coord, None, d, w, at)? {
            let xs: Vec<Reg> = (0..w).map(|_| self.new_reg(Class::of(dtype))).collect();
            let (addr, off) = (run.addr, run.off);
            if esize == 2 {
                // Pairs of 16-bit elements travel packed in b32 registers.
                let packed: Vec<Reg> = (0..w / 2).map(|_| self.new_reg(Class::B32)).collect();
                for p in &packed {
                    self.ins(format!("mov.b32 {p}, 0"));
                }
                self.ins(format!(
                    "@{} ld.{space}{} {}, [{addr}+{off}]",
                    run.whole,
                    vec_suffix(packed.len(), "b32"),
                    reg_list(&packed)
                ));
                for (p, pair) in packed.iter().zip(xs.chunks(2)) {
                    self.ins(format!("mov.b32 {{{}, {}}}, {p}", pair[0], pair[1]));
                }
            } else {
                let ty = mem_ty(dtype);
                let zero = if dtype == DType::F32 {
                    "0f00000000"
                } else {
                    "0"
                };
                for x in &xs {
                    self.ins(format!("mov.{ty} {x}, {zero}"));
                }
                self.ins(format!(
                    "@{} ld.{space}{} {}, [{addr}+{off}]",
                    run.whole,
                    vec_suffix(xs.len(), ty),
                    reg_list(&xs)
                ));
            }
            for (k, (x, p)) in xs.iter().zip(&run.parts).enumerate() {
                self.ins(format!(
                    "@{p} ld.{space}.{} {x}, [{addr}+{}]",
                    mem_ty(dtype),
                    off + k as u32 * esize
                ));
            }
            regs.extend(xs);
        }
        Ok(regs)
    }

    /// Stores register tile `regs` (distribution `d`, `dtype`) into `tensor` in vectors of
    /// `w` elements, skipping elements outside it (clipped by `clip`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vector_store(
        &mut self,
        tensor: usize,
        coords: &[Reg],
        col_coord: ValueId,
        clip: Option<(usize, Reg)>,
        d: &Distribution,
        regs: &[Reg],
        dtype: DType,
        w: u32,
        at: OpId,
    ) -> Result<(), CodegenError> {
        let esize = dtype.size_bytes() as u32;
        for run in self.runs(tensor, coords, col_coord, clip, d, w, at)? {
            let xs = &regs[run.first..run.first + w as usize];
            let (addr, off) = (run.addr, run.off);
            if esize == 2 {
                let packed: Vec<Reg> = xs
                    .chunks(2)
                    .map(|pair| {
                        let p = self.new_reg(Class::B32);
                        self.ins(format!("mov.b32 {p}, {{{}, {}}}", pair[0], pair[1]));
                        p
                    })
                    .collect();
                self.ins(format!(
                    "@{} st.global{} [{addr}+{off}], {}",
                    run.whole,
                    vec_suffix(packed.len(), "b32"),
                    reg_list(&packed)
                ));
            } else {
                self.ins(format!(
                    "@{} st.global{} [{addr}+{off}], {}",
                    run.whole,
                    vec_suffix(xs.len(), mem_ty(dtype)),
                    reg_list(xs)
                ));
            }
            for (k, (x, p)) in xs.iter().zip(&run.parts).enumerate() {
                self.ins(format!(
                    "@{p} st.global.{} [{addr}+{}], {x}",
                    mem_ty(dtype),
                    off + k as u32 * esize
                ));
            }
        }
        Ok(())
    }
}

/// `.v2.f32`, `.v4.b32`, or `.b32` for a single register.
fn vec_suffix(n: usize, ty: &str) -> String {
    if n == 1 {
        format!(".{ty}")
    } else {
        format!(".v{n}.{ty}")
    }
}

/// `{%r1, %r2}`, or `%r1` for a single register.
fn reg_list(regs: &[Reg]) -> String {
    if let [one] = regs {
        return one.to_string();
    }
    let names: Vec<String> = regs.iter().map(Reg::to_string).collect();
    format!("{{{}}}", names.join(", "))
}

#[cfg(test)]
mod tests {
    use kiln_ir::DType;
    use kiln_ir::schedule::Layout;
    use kiln_ir::types::Shape;

    use super::vector_width;

    fn blocked(spt: u32, tpw: [u32; 2], warps: [u32; 2]) -> Layout {
        Layout::Blocked {
            size_per_thread: [1, spt],
            threads_per_warp: tpw,
            warps,
        }
    }

    #[test]
    fn width_is_the_run_each_thread_holds_up_to_16_bytes() {
        let shape = Shape(vec![4, 512]);
        let d = blocked(4, [1, 32], [4, 1])
            .distribution(&shape)
            .expect("fits");
        assert_eq!(vector_width(&d, DType::F32), 4);
        assert_eq!(vector_width(&d, DType::Bf16), 4, "8 bytes of bf16");
        assert_eq!(vector_width(&d, DType::Bool), 1);
        let d = blocked(8, [1, 32], [4, 1])
            .distribution(&shape)
            .expect("fits");
        assert_eq!(vector_width(&d, DType::Bf16), 8);
        assert_eq!(vector_width(&d, DType::F32), 4, "two vectors of 16 bytes");
        let d = blocked(1, [1, 32], [4, 1])
            .distribution(&shape)
            .expect("fits");
        assert_eq!(vector_width(&d, DType::F32), 1);
        // An mma accumulator: pairs of columns.
        let d = Layout::Mma { warps: [2, 2] }
            .distribution(&Shape(vec![64, 64]))
            .expect("fits");
        assert_eq!(vector_width(&d, DType::Bf16), 2);
        // Rank 1.
        let d = blocked(4, [1, 32], [1, 4])
            .distribution(&Shape(vec![1024]))
            .expect("fits");
        assert_eq!(vector_width(&d, DType::F32), 4);
    }
}
