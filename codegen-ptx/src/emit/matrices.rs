//! Writing a register tile of 16-bit elements into 128-byte-swizzled boxes of shared memory
//! (the layout TMA and wgmma read): where the tile is laid out as an mma accumulator, as 8x8
//! matrices (`stmatrix`, four a store, [`MatrixPlan::of`] proving each register lands where
//! its own thread would put it); any other layout a pair of elements a store. The epilogue's
//! TMA store staging and the wgmma operands the consumers stage both write this way.

use std::collections::BTreeMap;

use kiln_ir::passes::tma_store::column_terms;
use kiln_ir::sched::store::BOX_COLUMNS;
use kiln_ir::schedule::{Distribution, Term};

use super::Emitter;
use crate::types::{Class, Reg};

/// Boxes of [`BOX_COLUMNS`] 16-bit columns and 128-byte rows, `box_bytes` apart: element
/// `(r, c)` at `(c / 64 % boxes) box_bytes + 128 r + ((c % 64 / 8) ^ (r % 8)) 16 + (c % 8) 2`
/// (column `c`'s box wraps around the `boxes` there are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SwizzledBoxes {
    /// Bytes from one box to the next.
    pub(crate) box_bytes: u32,
    /// Boxes side by side.
    pub(crate) boxes: u32,
}

impl SwizzledBoxes {
    /// The byte offset of element `(row, col)`.
    pub(crate) fn offset(&self, row: u32, col: u32) -> u32 {
        (col / BOX_COLUMNS % self.boxes) * self.box_bytes
            + row * 128
            + (((col % BOX_COLUMNS) / 8) ^ (row % 8)) * 16
            + (col % 8) * 2
    }
}

/// How a warp stores its registers as 8x8 matrices: `stmatrix` of `n` matrices (4, 2 or 1)
/// from `n` consecutive pairs, matrix `i` sitting `deltas[i]` (rows, 16-byte chunks) from the
/// group's first pair (entries past `n` repeat the first `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatrixPlan {
    pub(crate) n: usize,
    pub(crate) deltas: [(u32, u32); 4],
}

impl MatrixPlan {
    /// The plan for tile `d` of `threads` threads (whole warps) in `layout`, if there is one:
    /// each lane's consecutive pairs, `n` at a time, lie in one box with the same row and
    /// chunk steps in every group, rows in whole 8-row atoms (so a row's swizzle phase is its
    /// thread's), and every register lands in place ([`lands_in_place`]). `None` for any
    /// other layout, which is stored a pair at a time.
    pub(crate) fn of(d: &Distribution, threads: u32, layout: SwizzledBoxes) -> Option<MatrixPlan> {
        if d.terms.len() != 2 || !d.column_pairs() || threads == 0 || !threads.is_multiple_of(32) {
            return None;
        }
        let pairs = d.regs.len() / 2;
        let n = [4, 2, 1].into_iter().find(|n| pairs.is_multiple_of(*n))?;
        let mut deltas: Option<[(u32, u32); 4]> = None;
        for group in d.regs.chunks(2 * n) {
            let (r0, c0) = (group[0][0], group[0][1]);
            let mut these = [(0, 0); 4];
            for (i, pair) in group.chunks(2).enumerate() {
                let (r, c) = (pair[0][0], pair[0][1]);
                if r < r0 || c < c0 || !r.is_multiple_of(8) || !c.is_multiple_of(8) {
                    return None;
                }
                if c / BOX_COLUMNS != c0 / BOX_COLUMNS || (r - r0) / 8 >= 16 {
                    return None;
                }
                these[i] = (r - r0, (c - c0) / 8);
            }
            for i in n..4 {
                these[i] = these[i % n];
            }
            match deltas {
                Some(d) if d != these => return None,
                _ => deltas = Some(these),
            }
        }
        let plan = MatrixPlan { n, deltas: deltas? };
        lands_in_place(d, threads, layout, &plan).then_some(plan)
    }
}

/// Whether `plan` puts every register of `d` where the pair's own thread would store it. The
/// PTX ISA's rule: lane `8 i + r` gives the address of row `r` of matrix `i`, and lane
/// `4 r + w` holds word `w` of that row in its register `i`. The address a lane gives is the
/// one [`MatrixWriter`] computes: its row-giving thread's base (lane `4 (lane % 8)` of its
/// warp), moved by matrix `lane / 8 % 4`'s deltas and the group's first pair.
fn lands_in_place(
    d: &Distribution,
    threads: u32,
    layout: SwizzledBoxes,
    plan: &MatrixPlan,
) -> bool {
    let (box_terms, chunk_terms) = column_terms(&d.terms[1]);
    let given = |lane_tid: u32, first: &[u32]| {
        let giver = (lane_tid & !31) + 4 * (lane_tid & 7);
        let (rows, chunks) = plan.deltas[((lane_tid >> 3) & 3) as usize];
        let rb = Term::sum(&d.terms[0], giver);
        let base = rb * 128
            + Term::sum(&chunk_terms, giver) * 2
            + Term::sum(&box_terms, giver) * (layout.box_bytes / BOX_COLUMNS)
            + rows * 128;
        let chunk = (first[1] % BOX_COLUMNS) / 8;
        (((chunk + chunks) ^ (rb % 8)) * 16 + base)
            + (first[1] / BOX_COLUMNS % layout.boxes) * layout.box_bytes
            + first[0] * 128
    };
    let n = plan.n;
    (0..threads).all(|t| {
        let coords = d.coords(t);
        coords
            .chunks(2 * n)
            .zip(d.regs.chunks(2 * n))
            .all(|(mine, group)| {
                mine.chunks(2).enumerate().all(|(i, pair)| {
                    let giver = (t & !31) + 8 * i as u32 + (t % 32) / 4;
                    given(giver, &group[0]) + 4 * (t % 4) == layout.offset(pair[0][0], pair[0][1])
                })
            })
    })
}

/// One thread's writer of a tile into a [`SwizzledBoxes`] layout: the thread's (or, storing
/// matrices, its row-giving thread's) row start and swizzle phase, and the addresses of the
/// 16-byte chunks its stores have reached so far.
pub(crate) struct MatrixWriter {
    layout: SwizzledBoxes,
    plan: Option<MatrixPlan>,
    /// The thread's first element's row start: the layout's origin, its rows and columns.
    base: Reg,
    /// Its rows' swizzle phase, `row % 8`.
    phase: Reg,
    /// Storing matrices: the 16-byte chunks the lane's matrix sits from its group's first.
    chunk_delta: Option<Reg>,
    chunks: BTreeMap<u32, Reg>,
}

impl MatrixWriter {
    /// Sets up thread registers for writing tile `d` into `layout` at shared address
    /// `origin` (a register and bytes past it), as matrices where `plan` says how. Element `(r, c)` of box `j` sits at `j *
    /// box + r * 128 + ((c / 8) ^ (r % 8)) * 16 + (c % 8) * 2`. A thread's rows differ by
    /// multiples of 8, so they share the phase `r % 8`; its columns stay inside one 16-byte
    /// chunk per 8, but for a start whole boxes further.
    pub(crate) fn new(
        e: &mut Emitter<'_>,
        d: &Distribution,
        plan: Option<MatrixPlan>,
        layout: SwizzledBoxes,
        (origin, offset): (Reg, u32),
    ) -> MatrixWriter {
        let (box_terms, chunk_terms) = column_terms(&d.terms[1]);
        // The thread whose row start this thread gives: itself for pairs; for 8x8 matrices,
        // lane 8 i + r gives row r of its warp's matrix i, which lane 4 r holds.
        let at_tid = match plan {
            None => e.tid,
            Some(_) => {
                let (warp, r) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
                e.ins(format!("and.b32 {warp}, {}, -32", e.tid));
                e.ins(format!("and.b32 {r}, {}, 7", e.tid));
                e.ins(format!("mad.lo.u32 {r}, {r}, 4, {warp}"));
                r
            }
        };
        let (rb, cb) = (
            e.thread_coord_of(&d.terms[0], at_tid),
            e.thread_coord_of(&chunk_terms, at_tid),
        );
        let (base, phase) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
        e.ins(format!("add.u32 {base}, {origin}, {offset}"));
        e.ins(format!("mad.lo.u32 {base}, {rb}, 128, {base}"));
        e.ins(format!("mad.lo.u32 {base}, {cb}, 2, {base}"));
        if !box_terms.is_empty() {
            // Column c of a thread's box start is box c / 64: c / 64 * box bytes.
            let bb = e.thread_coord_of(&box_terms, at_tid);
            let per_column = layout.box_bytes / BOX_COLUMNS;
            e.ins(format!("mad.lo.u32 {base}, {bb}, {per_column}, {base}"));
        }
        e.ins(format!("and.b32 {phase}, {rb}, 7"));
        // Matrix lane / 8 % 4 of a group sits rows and 16-byte chunks from the group's first
        // pair: looked up in two tables of 4-bit fields (row deltas in units of 8).
        let chunk_delta = plan.map(|plan| {
            let table = |f: fn(&(u32, u32)) -> u32| {
                plan.deltas
                    .iter()
                    .enumerate()
                    .fold(0u32, |t, (i, x)| t | (f(x) << (4 * i)))
            };
            let [shift, rows, chunks] = e.new_regs(Class::B32);
            e.ins(format!("shr.u32 {shift}, {}, 1", e.tid));
            e.ins(format!("and.b32 {shift}, {shift}, 12"));
            e.ins(format!("shr.u32 {rows}, {}, {shift}", table(|x| x.0 / 8)));
            e.ins(format!("and.b32 {rows}, {rows}, 15"));
            e.ins(format!("mad.lo.u32 {base}, {rows}, 1024, {base}"));
            e.ins(format!("shr.u32 {chunks}, {}, {shift}", table(|x| x.1)));
            e.ins(format!("and.b32 {chunks}, {chunks}, 15"));
            chunks
        });
        MatrixWriter {
            layout,
            plan,
            base,
            phase,
            chunk_delta,
            chunks: BTreeMap::new(),
        }
    }

    /// Registers of the tile one store takes: `n` pairs as `n` matrices, else one pair.
    pub(crate) fn regs_per_store(&self) -> usize {
        2 * self.plan.map_or(1, |p| p.n)
    }

    /// Where the store whose first element is at `(row, col)` of the thread's tile offsets
    /// goes: an address register and bytes past it.
    pub(crate) fn place(&mut self, e: &mut Emitter<'_>, (row, col): (u32, u32)) -> (Reg, u32) {
        let (box_index, c) = (col / BOX_COLUMNS, col % BOX_COLUMNS);
        let chunk = c / 8;
        let at = match self.chunks.get(&chunk) {
            Some(&r) => r,
            None => {
                let r = e.new_reg(Class::B32);
                match self.chunk_delta {
                    Some(dc) => {
                        e.ins(format!("add.u32 {r}, {dc}, {chunk}"));
                        e.ins(format!("xor.b32 {r}, {r}, {}", self.phase));
                    }
                    None => e.ins(format!("xor.b32 {r}, {}, {chunk}", self.phase)),
                }
                e.ins(format!("mad.lo.u32 {r}, {r}, 16, {}", self.base));
                self.chunks.insert(chunk, r);
                r
            }
        };
        let imm = (box_index % self.layout.boxes) * self.layout.box_bytes + row * 128 + (c % 8) * 2;
        (at, imm)
    }

    /// Writes one store at `place` ([`Self::place`]): `words`, each a `.b32` pair (first
    /// element low), [`Self::regs_per_store`] registers of the tile.
    pub(crate) fn store(&self, e: &mut Emitter<'_>, (at, imm): (Reg, u32), words: &[Reg]) {
        let words = words
            .iter()
            .map(Reg::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        match self.plan {
            Some(p) => e.ins(format!(
                "stmatrix.sync.aligned.m8n8.x{}.shared.b16 [{at}+{imm}], {{{words}}}",
                p.n
            )),
            None => e.ins(format!("st.shared.b32 [{at}+{imm}], {words}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(div: u32, modulo: u32, mul: u32) -> Term {
        Term { div, modulo, mul }
    }

    /// `boxes` boxes of 64 rows, staged whole.
    fn boxes(boxes: u32) -> SwizzledBoxes {
        SwizzledBoxes {
            box_bytes: 64 * 128,
            boxes,
        }
    }

    /// The layout of a `64 x n` wgmma accumulator over one warpgroup: warp `w` holds rows
    /// `16 w ..`, lane `l` rows `l / 4` and `l / 4 + 8` at columns `8 j + 2 (l % 4)` and the
    /// next.
    fn wgmma_accumulator(n: u32, rows: Vec<Term>) -> Distribution {
        let mut regs = Vec::new();
        for j in 0..n / 8 {
            for row in [0, 8] {
                regs.push(vec![row, 8 * j]);
                regs.push(vec![row, 8 * j + 1]);
            }
        }
        Distribution {
            terms: vec![rows, vec![term(1, 4, 2)]],
            regs,
        }
    }

    #[test]
    fn a_wgmma_accumulator_is_stored_as_matrices() {
        for n in [64, 128, 256] {
            let d = wgmma_accumulator(n, vec![term(32, 4, 16), term(4, 8, 1)]);
            assert_eq!(
                MatrixPlan::of(&d, 128, boxes(n / 64)),
                Some(MatrixPlan {
                    n: 4,
                    deltas: [(0, 0), (8, 0), (0, 1), (8, 1)]
                }),
                "n = {n}"
            );
        }
    }

    #[test]
    fn other_layouts_are_stored_a_pair_at_a_time() {
        let layout = boxes(1);
        // Threads along the rows only: a lane's columns are not a quad's words.
        let rows = Distribution {
            terms: vec![vec![term(1, 128, 1)], vec![]],
            regs: (0..16)
                .flat_map(|j| [vec![0, 2 * j], vec![0, 2 * j + 1]])
                .collect(),
        };
        assert_eq!(MatrixPlan::of(&rows, 128, layout), None);
        // The accumulator's registers, but a quad's lanes on eight rows, not one row's words.
        let mut columns = wgmma_accumulator(64, vec![term(32, 4, 16), term(1, 8, 1)]);
        columns.terms[1] = vec![term(8, 4, 2)];
        assert_eq!(MatrixPlan::of(&columns, 128, layout), None);
        // Any order of a warp's rows is stored in place: each row's address is its own.
        let shuffled = wgmma_accumulator(64, vec![term(32, 4, 16), term(4, 4, 2), term(16, 2, 1)]);
        assert!(MatrixPlan::of(&shuffled, 128, layout).is_some());
        // An 8-column chunk of the accumulator: two matrices a store.
        let mut chunk = wgmma_accumulator(64, vec![term(32, 4, 16), term(4, 8, 1)]);
        chunk.regs.truncate(4);
        assert_eq!(
            MatrixPlan::of(&chunk, 128, layout),
            Some(MatrixPlan {
                n: 2,
                deltas: [(0, 0), (8, 0), (0, 0), (8, 0)]
            })
        );
        // Not whole warps.
        let d = wgmma_accumulator(64, vec![term(32, 4, 16), term(4, 8, 1)]);
        assert_eq!(MatrixPlan::of(&d, 48, layout), None);
    }

    #[test]
    fn two_warpgroups_rows_are_stored_as_matrices() {
        // The keys-major backward's dS: 128 rows over two warpgroups, 64 columns.
        let d = wgmma_accumulator(64, vec![term(32, 8, 16), term(4, 8, 1)]);
        let layout = SwizzledBoxes {
            box_bytes: 128 * 128,
            boxes: 1,
        };
        assert_eq!(MatrixPlan::of(&d, 256, layout).map(|p| p.n), Some(4));
    }
}
