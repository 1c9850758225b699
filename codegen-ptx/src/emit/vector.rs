//! Register tiles moved to and from global memory in vectors of up to 16 bytes per thread
//! (`ld.global.v4.f32`, eight bf16 as `v4.b32`, ...). A thread's registers are grouped into runs
//! of `w` consecutive columns of one row ([`vector_width`]); a run inside the tensor at an
//! aligned address (known at compile time for a 16-byte aligned tensor and a column coordinate
//! that is a multiple of `w`, else tested per row at run time) is one vector access, and any
//! other element moves on its own under its own bounds check, so tails of any length stay exact.

use std::collections::BTreeMap;

use kiln_ir::schedule::Distribution;
use kiln_ir::{DType, OpId, Param, ValueId};

use super::Emitter;
use crate::error::CodegenError;
use crate::types::{Class, Reg, mem_ty};

/// The widest access, in bytes.
const MAX_BYTES: u32 = 16;

/// Where a thread's runs of a tile sit, and whether all of them can move unchecked.
pub(super) struct Plan {
    /// Per run: its row offset, first column offset and first register index in the tile.
    pub(super) runs: Vec<(u32, u32, usize)>,
    /// Per row offset: the row's address (`.b64`, at the thread's first column), whether the
    /// row is inside, and whether it is inside with an aligned address.
    pub(super) rows: BTreeMap<u32, (Reg, Reg, Reg)>,
    /// The thread's first column in the tensor, and the columns' extent.
    pub(super) col0: Reg,
    pub(super) cols: Reg,
    /// Element size in bytes.
    pub(super) esize: u32,
    /// Every run of every lane of the warp whole: inside the tensor and aligned. Such a warp
    /// (every tile but the edges) branches, uniformly, to unpredicated vector accesses with no
    /// per-element work; the per-run checks ([`EdgeRun`]) live on the edge path.
    pub(super) fast: Reg,
}

/// The predicates of one run on a tile's edge.
pub(super) struct EdgeRun {
    /// The whole run inside and aligned: one vector access.
    pub(super) whole: Reg,
    /// Per element, where the run is not whole: whether the element is inside.
    pub(super) parts: Vec<Reg>,
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
    /// the kernel never writes it (`Tensor`, not `TensorMut`). Where a `Tensor` argument
    /// aliases a `TensorMut` one, a read of an element the kernel already wrote through the
    /// other may then see the old value (an in-place row kernel, which reads each element
    /// before writing it, is unaffected).
    pub(super) fn read_only(&self, tensor: usize) -> bool {
        matches!(
            self.k.params.get(tensor),
            Some(Param::Tensor { mutable: false, .. })
        )
    }

    /// Where the runs of `w` elements of a tile in distribution `d` at `coords` in `tensor` sit
    /// (`col_coord`: the IR value of the column coordinate, for its known alignment), and
    /// whether every one of them is whole.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan(
        &mut self,
        tensor: usize,
        coords: &[Reg],
        col_coord: ValueId,
        clip: Option<(usize, Reg)>,
        d: &Distribution,
        w: u32,
        at: OpId,
    ) -> Result<Plan, CodegenError> {
        let tile_rank = d.terms.len();
        let o = self.origin(tensor, coords, tile_rank, clip, at)?;
        let col_dim = tile_rank - 1;
        let bytes = w * o.esize;
        // Base, outer strides (16-byte aligned tensor) and column (a multiple of `w`) all keep
        // every run aligned; otherwise each row's address is tested.
        let static_aligned =
            self.k.params[tensor].aligned16() && self.known_multiple(col_coord).is_multiple_of(w);
        let (col0, row_base) = self.thread_origin(&o, d, tile_rank);
        let runs: Vec<(u32, u32, usize)> = d
            .regs
            .chunks(w as usize)
            .enumerate()
            .map(|(i, run)| {
                let (ro, co) = if tile_rank == 2 {
                    (run[0][0], run[0][1])
                } else {
                    (0, run[0][0])
                };
                (ro, co, i * w as usize)
            })
            .collect();
        let mut rows: BTreeMap<u32, (Reg, Reg, Reg)> = BTreeMap::new();
        for &(ro, _, _) in &runs {
            if rows.contains_key(&ro) {
                continue;
            }
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
        // The thread's first and last columns inside (unsigned compares: a negative column is
        // outside) put every column between them inside.
        let first = runs.iter().map(|r| r.1).min().unwrap_or(0);
        let last = runs.iter().map(|r| r.1).max().unwrap_or(0) + w - 1;
        let cols = o.dims[col_dim];
        let fast = self.new_reg(Class::Pred);
        self.ins(format!("setp.eq.u32 {fast}, 0, 0"));
        for c in [first, last] {
            let x = self.new_reg(Class::B32);
            self.ins(format!("add.s32 {x}, {col0}, {c}"));
            let ok = self.in_bounds(x, cols, None);
            self.ins(format!("and.pred {fast}, {fast}, {ok}"));
        }
        for &(_, _, vec_ok) in rows.values() {
            self.ins(format!("and.pred {fast}, {fast}, {vec_ok}"));
        }
        // Decided per warp, so the warp never diverges (the paths reconverge trivially
        // before the shuffles, mma or barriers that follow).
        self.ins(format!("vote.sync.all.pred {fast}, {fast}, 0xffffffff"));
        Ok(Plan {
            runs,
            rows,
            col0,
            cols,
            esize: o.esize,
            fast,
        })
    }

    /// Whether column `c` of `plan`'s tile is inside the tensor (an unsigned compare: a
    /// negative column is outside), made once per column in `seen`.
    pub(super) fn column_inside(
        &mut self,
        plan: &Plan,
        c: u32,
        seen: &mut BTreeMap<u32, Reg>,
    ) -> Reg {
        if let Some(&p) = seen.get(&c) {
            return p;
        }
        let x = self.new_reg(Class::B32);
        self.ins(format!("add.s32 {x}, {}, {c}", plan.col0));
        let p = self.in_bounds(x, plan.cols, None);
        seen.insert(c, p);
        p
    }

    /// Whether the `w`-element run at row `ro`, column `co` of `plan` is whole: inside the
    /// tensor and aligned, so one vector access moves it.
    pub(super) fn run_whole(
        &mut self,
        plan: &Plan,
        (ro, co): (u32, u32),
        w: u32,
        seen: &mut BTreeMap<u32, Reg>,
    ) -> Reg {
        let first = self.column_inside(plan, co, seen);
        let last = self.column_inside(plan, co + w - 1, seen);
        let (_, _, vec_ok) = plan.rows[&ro];
        let whole = self.new_reg(Class::Pred);
        self.ins(format!("and.pred {whole}, {vec_ok}, {first}"));
        self.ins(format!("and.pred {whole}, {whole}, {last}"));
        whole
    }

    /// The predicates of every run of `plan` on a tile's edge, in run order.
    pub(super) fn edge_runs(&mut self, plan: &Plan, w: u32) -> Vec<EdgeRun> {
        let mut cols: BTreeMap<u32, Reg> = BTreeMap::new();
        let mut out = Vec::with_capacity(plan.runs.len());
        for &(ro, co, _) in &plan.runs {
            for c in co..co + w {
                self.column_inside(plan, c, &mut cols);
            }
            let (_, row_ok, _) = plan.rows[&ro];
            let whole = self.run_whole(plan, (ro, co), w, &mut cols);
            let split = self.new_reg(Class::Pred);
            self.ins(format!("not.pred {split}, {whole}"));
            let parts = (co..co + w)
                .map(|c| {
                    let p = self.new_reg(Class::Pred);
                    self.ins(format!("and.pred {p}, {row_ok}, {}", cols[&c]));
                    self.ins(format!("and.pred {p}, {p}, {split}"));
                    p
                })
                .collect();
            out.push(EdgeRun { whole, parts });
        }
        out
    }

    /// Loads register tile `v` (distribution `d`, `dtype`) from `tensor` in vectors of `w`
    /// elements: the tile's registers (0 outside the tensor). A warp whose runs are all whole
    /// (every tile but the edges) takes unpredicated vector loads; on an edge each run is a
    /// predicated vector or, where it is not whole, its elements one by one.
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
        let plan = self.plan(tensor, coords, col_coord, None, d, w, at)?;
        let esize = plan.esize;
        let regs: Vec<Reg> = (0..d.regs.len())
            .map(|_| self.new_reg(Class::of(dtype)))
            .collect();
        // 16-bit elements travel in pairs packed in b32 registers.
        let packed: Vec<Reg> = if esize == 2 {
            (0..d.regs.len() / 2)
                .map(|_| self.new_reg(Class::B32))
                .collect()
        } else {
            Vec::new()
        };
        // bf16 elements also arrive widened to f32 (see `Emitter::widened`); unused, ptxas
        // drops them.
        let widened: Option<Vec<Reg>> = (dtype == DType::Bf16).then(|| {
            (0..d.regs.len())
                .map(|_| self.new_reg(Class::F32))
                .collect()
        });
        let (edge, done) = (self.new_label(), self.new_label());
        self.ins(format!("@!{} bra.uni {edge}", plan.fast));
        for &(ro, co, first) in &plan.runs {
            let addr = plan.rows[&ro].0;
            let off = co * esize;
            let xs = &regs[first..first + w as usize];
            if esize == 2 {
                let ps = &packed[first / 2..(first + w as usize) / 2];
                self.ins(format!(
                    "ld.{space}{} {}, [{addr}+{off}]",
                    vec_suffix(ps.len(), "b32"),
                    reg_list(ps)
                ));
                self.unpack(ps, xs);
                if let Some(fs) = &widened {
                    self.widen_words(ps, &fs[first..first + w as usize]);
                }
            } else {
                self.ins(format!(
                    "ld.{space}{} {}, [{addr}+{off}]",
                    vec_suffix(xs.len(), mem_ty(dtype)),
                    reg_list(xs)
                ));
            }
        }
        self.ins(format!("bra.uni {done}"));
        self.label(&edge);
        let edges = self.edge_runs(&plan, w);
        for (&(ro, co, first), e) in plan.runs.iter().zip(&edges) {
            let addr = plan.rows[&ro].0;
            let off = co * esize;
            let xs = &regs[first..first + w as usize];
            if esize == 2 {
                let ps = &packed[first / 2..(first + w as usize) / 2];
                for p in ps {
                    self.ins(format!("mov.b32 {p}, 0"));
                }
                self.ins(format!(
                    "@{} ld.{space}{} {}, [{addr}+{off}]",
                    e.whole,
                    vec_suffix(ps.len(), "b32"),
                    reg_list(ps)
                ));
                self.unpack(ps, xs);
            } else {
                let ty = mem_ty(dtype);
                let zero = if dtype == DType::F32 {
                    "0f00000000"
                } else {
                    "0"
                };
                for x in xs {
                    self.ins(format!("mov.{ty} {x}, {zero}"));
                }
                self.ins(format!(
                    "@{} ld.{space}{} {}, [{addr}+{off}]",
                    e.whole,
                    vec_suffix(xs.len(), ty),
                    reg_list(xs)
                ));
            }
            for (k, (x, p)) in xs.iter().zip(&e.parts).enumerate() {
                self.ins(format!(
                    "@{p} ld.{space}.{} {x}, [{addr}+{}]",
                    mem_ty(dtype),
                    off + k as u32 * esize
                ));
            }
            if let Some(fs) = &widened {
                for (f, x) in fs[first..first + w as usize].iter().zip(xs) {
                    self.ins(format!("cvt.f32.bf16 {f}, {x}"));
                }
            }
        }
        self.label(&done);
        if let Some(fs) = widened {
            self.widened.extend(regs.iter().copied().zip(fs));
        }
        Ok(regs)
    }

    /// A bf16 element is the high half of the f32 with its bits: from the words of a fast
    /// vector load, `fs` (f32 registers) keep each word's high half or shift its low half
    /// there, one instruction an element.
    pub(super) fn widen_words(&mut self, words: &[Reg], fs: &[Reg]) {
        for (word, f) in words.iter().zip(fs.chunks(2)) {
            self.ins(format!("shl.b32 {}, {word}, 16", f[0]));
            self.ins(format!("and.b32 {}, {word}, -65536", f[1]));
        }
    }

    /// `xs` (16-bit registers) from the b32 pairs `packed`.
    pub(super) fn unpack(&mut self, packed: &[Reg], xs: &[Reg]) {
        for (p, pair) in packed.iter().zip(xs.chunks(2)) {
            self.ins(format!("mov.b32 {{{}, {}}}, {p}", pair[0], pair[1]));
        }
    }

    /// `xs` (16-bit registers) packed in pairs into new b32 registers.
    pub(super) fn pack(&mut self, xs: &[Reg]) -> Vec<Reg> {
        xs.chunks(2)
            .map(|pair| {
                let p = self.new_reg(Class::B32);
                self.ins(format!("mov.b32 {p}, {{{}, {}}}", pair[0], pair[1]));
                p
            })
            .collect()
    }

    /// Stores register tile `regs` (distribution `d`, `dtype`) into `tensor` in vectors of
    /// `w` elements, skipping elements outside it (clipped by `clip`): as
    /// [`Emitter::vector_load`], unpredicated vectors unless the thread is on an edge.
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
        let plan = self.plan(tensor, coords, col_coord, clip, d, w, at)?;
        let esize = plan.esize;
        let (edge, done) = (self.new_label(), self.new_label());
        self.ins(format!("@!{} bra.uni {edge}", plan.fast));
        for guarded in [false, true] {
            let edges = if guarded {
                self.label(&edge);
                self.edge_runs(&plan, w)
            } else {
                Vec::new()
            };
            for (i, &(ro, co, first)) in plan.runs.iter().enumerate() {
                let addr = plan.rows[&ro].0;
                let off = co * esize;
                let xs = &regs[first..first + w as usize];
                let guard = edges
                    .get(i)
                    .map_or(String::new(), |e| format!("@{} ", e.whole));
                let (n, ty, list) = if esize == 2 {
                    let ps = self.pack(xs);
                    (ps.len(), "b32", reg_list(&ps))
                } else {
                    (xs.len(), mem_ty(dtype), reg_list(xs))
                };
                self.ins(format!(
                    "{guard}st.global{} [{addr}+{off}], {list}",
                    vec_suffix(n, ty)
                ));
                if let Some(e) = edges.get(i) {
                    for (k, (x, p)) in xs.iter().zip(&e.parts).enumerate() {
                        self.ins(format!(
                            "@{p} st.global.{} [{addr}+{}], {x}",
                            mem_ty(dtype),
                            off + k as u32 * esize
                        ));
                    }
                }
            }
            if !guarded {
                self.ins(format!("bra.uni {done}"));
            }
        }
        self.label(&done);
        Ok(())
    }
}

/// `.v2.f32`, `.v4.b32`, or `.b32` for a single register.
pub(super) fn vec_suffix(n: usize, ty: &str) -> String {
    if n == 1 {
        format!(".{ty}")
    } else {
        format!(".v{n}.{ty}")
    }
}

/// `{%r1, %r2}`, or `%r1` for a single register.
pub(super) fn reg_list(regs: &[Reg]) -> String {
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
