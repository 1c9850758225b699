//! Scheduling annotations the passes attach to a kernel: register-tile layouts, shared-memory
//! buffers and per-loop pipeline plans. They live in side tables ([`Schedule`]) so the semantic
//! ops stay untouched and the interpreter keeps working on a scheduled kernel. A layout says
//! which thread holds which element of a register tile; [`Layout::distribution`] turns it into
//! the one form every consumer works with ([`Distribution`]).

use std::collections::BTreeMap;
use std::fmt;

use crate::entities::{Loc, OpId, ValueId};
use crate::types::Shape;

/// How a register tile is spread over the threads of a block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Triton-style blocked layout, row-major order: each thread holds `size_per_thread`
    /// contiguous elements, a warp covers `threads_per_warp`, the block `warps`, and the
    /// pattern repeats over the tile. Rank-1 tiles use only the column entries; tiles of
    /// rank 3 and more fold every dimension but the last into the rows.
    Blocked {
        /// Elements per thread per repetition, `[rows, cols]`.
        size_per_thread: [u32; 2],
        /// Lanes along `[rows, cols]`; the product is 32.
        threads_per_warp: [u32; 2],
        /// Warps along `[rows, cols]`; the product is the block's warp count.
        warps: [u32; 2],
    },
    /// The accumulator of `mma.sync.m16n8k16` with a `warps[0] x warps[1]` warp grid: each
    /// warp owns a `(M / warps[0]) x (N / warps[1])` sub-tile made of 16x8 fragments.
    Mma {
        /// Warps along `[rows, cols]`.
        warps: [u32; 2],
    },
    /// A wgmma accumulator whose `M x N` tile the consumer warpgroups split into
    /// `col_blocks` column blocks as well as 64-row blocks (a tile of fewer rows than the
    /// consumers' `16 x warps`: attention backward's dQ of 64 query rows under two
    /// warpgroups): warpgroup `g` holds rows `64 (g / col_blocks) ..` and columns
    /// `(g % col_blocks) N / col_blocks ..`, each its `64 x N / col_blocks` block in the
    /// wgmma accumulator layout ([`Layout::Mma`]'s `#mma(4x1)`). With one column block it is
    /// `Mma { warps: [warps, 1] }`, the form the layout pass gives it then.
    WgmmaColumns {
        /// Column blocks, each one warpgroup's per row block.
        col_blocks: u32,
    },
    /// A `128 x n` accumulator copied out of tensor memory by `tcgen05.ld.32x32b`
    /// ([`crate::tmem`]): `4 * warpgroups` warps, warp `w` holding rows `32 (w % 4) ..` (the
    /// TMEM lanes a warp may reach) of column block `w / 4` (`n / warpgroups` columns),
    /// thread `t` of the warp one row, its block's columns in order.
    TmemRows {
        /// Column blocks, one per warpgroup.
        warpgroups: u32,
    },
    /// The parent layout with dimension `dim` reduced away (`keep_dim`: kept with extent 1,
    /// as after `.col()`/`.row()`).
    Slice {
        /// The reduced dimension of the parent.
        dim: usize,
        /// Whether the result keeps the dimension with extent 1.
        keep_dim: bool,
        /// The layout of the tile before the reduction.
        parent: Box<Layout>,
        /// The parent tile's shape.
        parent_shape: Shape,
    },
    /// The transpose of a 2-D register tile in `parent` (`x.t()` moving no element): element
    /// `(r, c)` is the parent's `(c, r)`, in the same thread and register.
    Transposed {
        /// The layout of the tile before the transpose.
        parent: Box<Layout>,
    },
    /// Not in registers: a loaded tile staged in shared memory, read by `mma` with `ldmatrix`.
    Shared {
        /// Whether the view is transposed (`k.t()`): element `(r, c)` is stored at `(c, r)`.
        transposed: bool,
    },
}

/// One thread-dependent term of a coordinate: `((tid / div) % modulo) * mul`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// Divisor applied to the thread index.
    pub div: u32,
    /// Modulus after the division.
    pub modulo: u32,
    /// Multiplier of the result.
    pub mul: u32,
}

impl Term {
    /// Thread `tid`'s coordinate along a dimension with thread terms `terms` (the sum of
    /// every term; the registers' offsets come on top).
    pub fn sum(terms: &[Term], tid: u32) -> u32 {
        terms
            .iter()
            .map(|t| ((tid / t.div) % t.modulo) * t.mul)
            .sum()
    }
}

/// A layout made concrete for one shape, the one form every consumer of a layout
/// (reductions, broadcasts, the PTX writer) works with: per dimension, a coordinate
/// `sum_t ((tid / div_t) % modulo_t) * mul_t` that depends on the thread, plus a compile-time
/// offset per register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distribution {
    /// Per dimension, the thread-dependent terms of the coordinate.
    pub terms: Vec<Vec<Term>>,
    /// Per register, the compile-time offset along each dimension.
    pub regs: Vec<Vec<u32>>,
}

impl Distribution {
    /// Whether a 2-D tile's registers come in pairs along a row, each at an even column and
    /// the next (every thread's column term even too): so every pair is one aligned vector
    /// access (a GEMM accumulator's layout).
    pub fn column_pairs(&self) -> bool {
        self.terms.len() == 2
            && self.terms[1].iter().all(|t| t.mul.is_multiple_of(2))
            && self.regs.len().is_multiple_of(2)
            && self
                .regs
                .chunks(2)
                .all(|p| p[0][0] == p[1][0] && p[0][1].is_multiple_of(2) && p[1][1] == p[0][1] + 1)
    }

    /// Thread `tid`'s coordinates of every register: its offsets plus the thread terms.
    pub fn coords(&self, tid: u32) -> Vec<Vec<u32>> {
        self.regs
            .iter()
            .map(|offs| {
                offs.iter()
                    .zip(&self.terms)
                    .map(|(o, terms)| o + Term::sum(terms, tid))
                    .collect()
            })
            .collect()
    }

    /// Whether every thread's register `k` holds the element of the same row-major index in
    /// this distribution over `shape` and in `other` over `other_shape`: a reshape between
    /// them moves nothing.
    pub fn same_elements(&self, shape: &Shape, other: &Distribution, other_shape: &Shape) -> bool {
        if self.regs.len() != other.regs.len()
            || self.terms.len() != shape.rank()
            || other.terms.len() != other_shape.rank()
        {
            return false;
        }
        let linear = |c: &[u32], s: &Shape| {
            c.iter()
                .zip(s.dims())
                .fold(0u64, |i, (&c, &n)| i * n as u64 + u64::from(c))
        };
        let period = self
            .terms
            .iter()
            .chain(&other.terms)
            .flatten()
            .map(|t| t.div.saturating_mul(t.modulo))
            .max()
            .unwrap_or(1)
            .min(1024);
        (0..period).all(|tid| {
            let (a, b) = (self.coords(tid), other.coords(tid));
            a.iter()
                .zip(&b)
                .all(|(x, y)| linear(x, shape) == linear(y, other_shape))
        })
    }

    /// The thread-independent part of coordinates in dimension `dim`, one per register.
    pub fn offsets(&self, dim: usize) -> impl Iterator<Item = u32> + '_ {
        self.regs.iter().map(move |r| r[dim])
    }

    /// Whether an operand of `shape` in this distribution can be read element by element by
    /// an elementwise op whose result, of `result_shape`, is in `result`: along every
    /// dimension the thread terms agree, or the operand is broadcast (extent 1, no thread
    /// terms). Each element the result needs is then in the same thread, in the register at
    /// the result register's offsets with broadcast dimensions at 0.
    pub fn broadcasts_to(
        &self,
        shape: &Shape,
        result: &Distribution,
        result_shape: &Shape,
    ) -> bool {
        shape.rank() == result_shape.rank()
            && (0..shape.rank()).all(|k| {
                if shape.dims()[k] == 1 && result_shape.dims()[k] != 1 {
                    self.terms[k].is_empty()
                } else {
                    self.terms[k] == result.terms[k]
                }
            })
    }

    /// The lane masks of a butterfly reduction over dimension `dim` (`shfl.sync.bfly` with
    /// each in turn): each thread term of `dim` spreads it over `modulo` groups of `div`
    /// consecutive threads. `None` when a term spans more than a warp (a reduction across
    /// warps, which shuffles cannot do) or is no power-of-two group of lanes.
    pub fn lane_masks(&self, dim: usize) -> Option<Vec<u32>> {
        match self.reduction_stages(dim)? {
            (masks, warps) if warps.is_empty() => Some(masks),
            _ => None,
        }
    }

    /// How a reduction over dimension `dim` meets: the lane masks of its butterfly inside a
    /// warp ([`Distribution::lane_masks`]), then the terms that spread `dim` over whole
    /// warps, whose partial results meet through shared memory. `None` when a term
    /// straddles lanes and warps or is no power-of-two group of lanes.
    pub fn reduction_stages(&self, dim: usize) -> Option<(Vec<u32>, Vec<Term>)> {
        let mut masks = Vec::new();
        let mut warps = Vec::new();
        for t in &self.terms[dim] {
            if t.div.is_multiple_of(32) {
                warps.push(*t);
                continue;
            }
            // A butterfly pairs lanes by XOR of one bit: only a power-of-two group of a
            // power-of-two stride is closed under it.
            if t.div * t.modulo > 32 || !t.div.is_power_of_two() || !t.modulo.is_power_of_two() {
                return None;
            }
            let mut m = t.div;
            while m < t.div * t.modulo {
                masks.push(m);
                m *= 2;
            }
        }
        Some((masks, warps))
    }
}

/// Why a layout cannot be made concrete for a shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The shape is not a multiple of the layout's footprint.
    #[error("a {shape} tile does not fit layout {layout}: {why}")]
    Misfit {
        /// The shape.
        shape: Shape,
        /// The layout.
        layout: String,
        /// What does not divide.
        why: String,
    },
}

impl Layout {
    /// The concrete thread/register map of this layout over `shape`.
    pub fn distribution(&self, shape: &Shape) -> Result<Distribution, LayoutError> {
        let misfit = |why: String| LayoutError::Misfit {
            shape: shape.clone(),
            layout: self.to_string(),
            why,
        };
        match self {
            Layout::Blocked {
                size_per_thread: spt,
                threads_per_warp: tpw,
                warps,
            } => {
                // Rank 3 and more: every dimension but the last folds into the rows.
                let (rows, cols) = match shape.dims().split_last() {
                    Some((&c, lead)) if !lead.is_empty() => {
                        (lead.iter().product::<usize>() as u32, c as u32)
                    }
                    _ => (1, shape.rows() as u32),
                };
                let cover = [spt[0] * tpw[0] * warps[0], spt[1] * tpw[1] * warps[1]];
                if rows % cover[0] != 0 || cols % cover[1] != 0 {
                    return Err(misfit(format!(
                        "the layout covers {}x{} elements",
                        cover[0], cover[1]
                    )));
                }
                let row_terms = vec![
                    term(tpw[1], tpw[0], spt[0]),
                    term(32 * warps[1], warps[0], spt[0] * tpw[0]),
                ];
                let col_terms = vec![term(1, tpw[1], spt[1]), term(32, warps[1], spt[1] * tpw[1])];
                let mut regs = Vec::new();
                for rr in 0..rows / cover[0] {
                    for i in 0..spt[0] {
                        for rc in 0..cols / cover[1] {
                            for j in 0..spt[1] {
                                regs.push(vec![rr * cover[0] + i, rc * cover[1] + j]);
                            }
                        }
                    }
                }
                if shape.rank() == 1 {
                    Ok(Distribution {
                        terms: vec![clean(col_terms)],
                        regs: regs.into_iter().map(|r| vec![r[1]]).collect(),
                    })
                } else if shape.rank() > 2 {
                    let lead: Vec<u32> = shape.dims()[..shape.rank() - 1]
                        .iter()
                        .map(|&d| d as u32)
                        .collect();
                    unfold_rows(clean(row_terms), clean(col_terms), regs, &lead).ok_or_else(|| {
                        misfit("its leading extents do not split the layout's rows evenly".into())
                    })
                } else {
                    Ok(Distribution {
                        terms: vec![clean(row_terms), clean(col_terms)],
                        regs,
                    })
                }
            }
            Layout::Mma { warps } => {
                if shape.rank() != 2 {
                    return Err(misfit("an mma accumulator is 2-D".into()));
                }
                let (m, n) = (shape.rows() as u32, shape.cols() as u32);
                let (wm, wn) = (m / warps[0].max(1), n / warps[1].max(1));
                if wm % 16 != 0 || wn % 8 != 0 || wm * warps[0] != m || wn * warps[1] != n {
                    return Err(misfit(format!(
                        "each of the {}x{} warps needs a multiple of 16x8 elements",
                        warps[0], warps[1]
                    )));
                }
                let row_terms = vec![term(4, 8, 1), term(32 * warps[1], warps[0], wm)];
                let col_terms = vec![term(1, 4, 2), term(32, warps[1], wn)];
                let mut regs = Vec::new();
                for mi in 0..wm / 16 {
                    for ni in 0..wn / 8 {
                        for v in 0..4 {
                            regs.push(vec![mi * 16 + (v / 2) * 8, ni * 8 + v % 2]);
                        }
                    }
                }
                Ok(Distribution {
                    terms: vec![clean(row_terms), clean(col_terms)],
                    regs,
                })
            }
            Layout::WgmmaColumns { col_blocks } => {
                let (m, n) = (shape.rows() as u32, shape.cols() as u32);
                let wn = (*col_blocks).max(1);
                let nb = n / wn;
                if shape.rank() != 2 || m % 64 != 0 || nb % 8 != 0 || nb * wn != n {
                    return Err(misfit(format!(
                        "each warpgroup needs 64 rows and a multiple of 8 of the {wn} column \
                         blocks' columns"
                    )));
                }
                // One column block: the warps' rows are one term, as `#mma(warps x 1)` has them.
                let row_terms = if wn == 1 {
                    vec![term(4, 8, 1), term(32, m / 16, 16)]
                } else {
                    vec![term(4, 8, 1), term(32, 4, 16), term(128 * wn, m / 64, 64)]
                };
                let col_terms = vec![term(1, 4, 2), term(128, wn, nb)];
                let regs = (0..nb / 8)
                    .flat_map(|ni| (0..4).map(move |v| vec![(v / 2) * 8, ni * 8 + v % 2]))
                    .collect();
                Ok(Distribution {
                    terms: vec![clean(row_terms), clean(col_terms)],
                    regs,
                })
            }
            Layout::TmemRows { warpgroups } => {
                let (rows, cols) = (shape.rows() as u32, shape.cols() as u32);
                let block = cols / (*warpgroups).max(1);
                if shape.rank() != 2 || rows != 128 || block * warpgroups != cols {
                    return Err(misfit(format!(
                        "a TMEM accumulator has 128 rows and {warpgroups} equal column blocks"
                    )));
                }
                Ok(Distribution {
                    terms: vec![
                        vec![term(1, 32, 1), term(32, 4, 32)],
                        clean(vec![term(128, *warpgroups, block)]),
                    ],
                    regs: (0..block).map(|j| vec![0, j]).collect(),
                })
            }
            Layout::Slice {
                dim,
                keep_dim,
                parent,
                parent_shape,
            } => {
                let p = parent.distribution(parent_shape)?;
                let mut regs: Vec<Vec<u32>> = Vec::new();
                for r in &p.regs {
                    let mut r = r.clone();
                    if *keep_dim {
                        r[*dim] = 0;
                    } else {
                        r.remove(*dim);
                    }
                    if !regs.contains(&r) {
                        regs.push(r);
                    }
                }
                let mut terms = p.terms;
                if *keep_dim {
                    terms[*dim].clear();
                } else {
                    terms.remove(*dim);
                }
                // The slice's rank is its parent's (less the dimension unless kept): a tile of
                // another rank does not fit it.
                if terms.len() != shape.rank() {
                    return Err(misfit(format!(
                        "a slice of rank {} holds no tile of rank {}",
                        terms.len(),
                        shape.rank()
                    )));
                }
                Ok(Distribution { terms, regs })
            }
            Layout::Transposed { parent } => {
                let [r, c] = shape.dims() else {
                    return Err(misfit("a transposed layout holds a 2-D tile".into()));
                };
                let mut p = parent.distribution(&Shape(vec![*c, *r]))?;
                p.terms.swap(0, 1);
                for offs in &mut p.regs {
                    offs.swap(0, 1);
                }
                Ok(p)
            }
            Layout::Shared { .. } => Err(misfit("a shared-memory tile has no registers".into())),
        }
    }

    /// The layout of this 2-D register tile's transpose when no element moves: the view of
    /// it, or the layout a view transposes back to.
    pub fn transposed(&self) -> Layout {
        match self {
            Layout::Transposed { parent } => (**parent).clone(),
            other => Layout::Transposed {
                parent: Box::new(other.clone()),
            },
        }
    }

    /// Whether the tile lives in shared memory rather than registers.
    pub fn is_shared(&self) -> bool {
        matches!(self, Layout::Shared { .. })
    }
}

/// The distribution of a tile whose leading dimensions `lead` were folded into the rows of a
/// 2-D one (`row_terms`, `col_terms`, registers `[row, col]`): the row coordinate split
/// into one per leading dimension (row-major). `None` when a thread term straddles a
/// leading dimension's boundary in a way per-dimension terms cannot express.
fn unfold_rows(
    row_terms: Vec<Term>,
    col_terms: Vec<Term>,
    regs: Vec<Vec<u32>>,
    lead: &[u32],
) -> Option<Distribution> {
    let n = lead.len();
    let mut per_dim: Vec<Vec<Term>> = vec![Vec::new(); n];
    let mut rest = row_terms.clone();
    for k in (1..n).rev() {
        let b = lead[k];
        let (mut low, mut high) = (Vec::new(), Vec::new());
        for t in rest {
            if t.mul.is_multiple_of(b) {
                high.push(term(t.div, t.modulo, t.mul / b));
            } else if b.is_multiple_of(t.mul.checked_mul(t.modulo)?) {
                low.push(t);
            } else if b.is_multiple_of(t.mul) && (t.mul * t.modulo).is_multiple_of(b) {
                let q = b / t.mul;
                low.push(term(t.div, q, t.mul));
                high.push(term(t.div * q, t.modulo / q, 1));
            } else {
                return None;
            }
        }
        per_dim[k] = clean(low);
        rest = high;
    }
    per_dim[0] = clean(rest);
    let split = |mut r: u32| {
        let mut c = vec![0; n];
        for k in (1..n).rev() {
            c[k] = r % lead[k];
            r /= lead[k];
        }
        c[0] = r;
        c
    };
    let regs: Vec<Vec<u32>> = regs
        .iter()
        .map(|r| {
            let mut c = split(r[0]);
            c.push(r[1]);
            c
        })
        .collect();
    // Carries between a register's offset and a thread's terms would make the split wrong:
    // check it on every thread of a period of the terms.
    let period = row_terms
        .iter()
        .map(|t| t.div.saturating_mul(t.modulo))
        .max()
        .unwrap_or(1)
        .min(1024);
    for tid in 0..period {
        let base = Term::sum(&row_terms, tid);
        for (r2, r) in regs.iter().zip(&regs2d(&regs, lead)) {
            let want = split(base + r);
            if (0..n).any(|k| r2[k] + Term::sum(&per_dim[k], tid) != want[k]) {
                return None;
            }
        }
    }
    per_dim.push(col_terms);
    Some(Distribution {
        terms: per_dim,
        regs,
    })
}

/// The folded row offset of each register of an unfolded distribution.
fn regs2d(regs: &[Vec<u32>], lead: &[u32]) -> Vec<u32> {
    regs.iter()
        .map(|r| lead.iter().zip(r).fold(0u32, |acc, (&n, &c)| acc * n + c))
        .collect()
}

fn term(div: u32, modulo: u32, mul: u32) -> Term {
    Term { div, modulo, mul }
}

/// Drops terms that are always zero (`modulo == 1`).
fn clean(terms: Vec<Term>) -> Vec<Term> {
    terms.into_iter().filter(|t| t.modulo > 1).collect()
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Blocked {
                size_per_thread: s,
                threads_per_warp: t,
                warps: w,
            } => write!(
                f,
                "#blocked(spt={}x{},tpw={}x{},wpb={}x{})",
                s[0], s[1], t[0], t[1], w[0], w[1]
            ),
            Layout::Mma { warps } => write!(f, "#mma({}x{})", warps[0], warps[1]),
            Layout::WgmmaColumns { col_blocks } => write!(f, "#wgmma(cols={col_blocks})"),
            Layout::TmemRows { warpgroups } => write!(f, "#tmem(rows,wg={warpgroups})"),
            Layout::Slice {
                dim,
                keep_dim,
                parent,
                ..
            } => write!(
                f,
                "#slice(dim={dim}{},{parent})",
                if *keep_dim { ",keep" } else { "" }
            ),
            Layout::Transposed { parent } => write!(f, "#t({parent})"),
            Layout::Shared { transposed } => {
                f.write_str(if *transposed { "#smem.t" } else { "#smem" })
            }
        }
    }
}

/// A shared-memory buffer: one per tile staged in shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmemBuffer {
    /// The `load` whose tile it holds.
    pub load: OpId,
    /// Byte offset in the block's dynamic shared memory (a multiple of 128).
    pub offset: u32,
    /// Bytes of one stage.
    pub stage_bytes: u32,
    /// Number of stages (copies) for a load inside a pipelined loop; 1 otherwise.
    pub stages: u32,
    /// Bytes of one tile row.
    pub row_bytes: u32,
    /// Whether 16-byte chunks are XOR-swizzled (see [`SmemBuffer::swizzle`]).
    pub swizzled: bool,
    /// Whether rows wider than the swizzle span are stored in column boxes (see
    /// [`SmemBuffer::boxed_offset`]): the layout sm_90a's wgmma descriptors read. Only mmas
    /// lowered to wgmma read a boxed buffer.
    pub boxed: bool,
}

impl SmemBuffer {
    /// The XOR swizzle of a swizzled buffer as `(shift, mask)`: 16-byte chunk `c` of row `r`
    /// is stored at chunk `c ^ ((r >> shift) & mask)`. Any 8 consecutive rows (what one
    /// `ldmatrix` 8x8 matrix reads) then hit 8 distinct 16-byte bank groups. The swizzle
    /// follows the largest power of two dividing the row's bytes, not the bytes themselves:
    /// rows of a multiple of 128 bytes use `(0, 7)`, of an odd multiple of 64 (64, 192: head
    /// dim 96) `(1, 3)`, of an odd multiple of 32 `(2, 1)`: with rows of `p 2^s` bytes (`p`
    /// odd) chunk `c` of row `r` is in 16-byte bank group `(p r 2^s / 16 + c) mod 8`, which
    /// tells 8 rows apart exactly as rows of `2^s` bytes do; and `mask + 1` divides the row's
    /// chunks, so the XOR stays inside the row.
    pub fn swizzle(&self) -> Option<(u32, u32)> {
        if !self.swizzled {
            return None;
        }
        match self.row_bytes {
            b if b.is_multiple_of(128) => Some((0, 7)),
            b if b.is_multiple_of(64) => Some((1, 3)),
            b if b.is_multiple_of(32) => Some((2, 1)),
            _ => None,
        }
    }

    /// The bytes one swizzle pattern spans along a row (128, 64 or 32): the XOR mixes the
    /// chunks of `span` consecutive bytes, the swizzle modes of TMA and wgmma of that name.
    pub fn span(&self) -> Option<u32> {
        self.swizzle().map(|(_, mask)| 16 * (mask + 1))
    }

    /// The bytes of every stage: `offset..offset + stages * stage_bytes`.
    pub fn bytes(&self) -> std::ops::Range<u32> {
        self.offset..self.offset + self.stages * self.stage_bytes
    }

    /// Bytes from one row to the next inside a box (the whole row when not boxed).
    pub fn pitch(&self) -> u32 {
        match (self.boxed, self.span()) {
            (true, Some(span)) => span,
            _ => self.row_bytes,
        }
    }

    /// Bytes of one column box: every row's `span` bytes (the whole stage when not boxed).
    pub fn box_bytes(&self) -> u32 {
        self.stage_bytes / (self.row_bytes / self.pitch()).max(1)
    }

    /// Byte offset in a stage of 16-byte chunk `chunk` of row `row`, swizzled. Boxed: the
    /// row is cut into boxes of `span` bytes, box `b` holding those bytes of every row
    /// (`span` bytes apart) at `b * box_bytes`; inside a box the chunk is XOR-swizzled with
    /// the row, so a box is exactly the swizzled canonical layout a wgmma descriptor reads
    /// (and TMA writes). Not boxed: rows of `row_bytes`, swizzled alike.
    pub fn boxed_offset(&self, row: u32, chunk: u32) -> u32 {
        let (shift, mask) = self.swizzle().unwrap_or((0, 0));
        let per_box = self.pitch() / 16;
        let (b, c) = (chunk / per_box, chunk % per_box);
        b * self.box_bytes() + row * self.pitch() + 16 * (c ^ ((row >> shift) & mask))
    }
}

/// A register tile an `mma` reads through shared memory (the `lower` pass,
/// [`crate::passes::mma_operands`]): a register B, an A not in the accumulator layout the
/// mma's warp grid gives, or the transpose of a register tile. Before each mma reading it,
/// every thread writes its elements into the buffer, row-major and swizzled as a staged load;
/// the mma then reads it with `ldmatrix` (`.trans` where the stored rows run along K for A or
/// along N for B). Written once where it is loaded instead (`at_source`): an sm_90a wgmma's
/// A loaded into registers before the loop of its wgmmas ([`crate::passes::wgmma_plain`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedOperand {
    /// The operand as the mma reads it.
    pub operand: ValueId,
    /// The register tile written to shared memory: the operand, or the tile it transposes.
    pub source: ValueId,
    /// Whether the operand is the transpose of the stored tile.
    pub transposed: bool,
    /// The mma operand it is, 0 (A) or 1 (B): a ring's wgmma reads a register A in place
    /// (RS) where the same tile is another's staged B. sm_80's buffers serve either.
    pub slot: usize,
    /// Its buffer: one stage, `load` naming the first mma that reads it.
    pub buffer: SmemBuffer,
    /// Written once, right after the op defining `source`, and read from there by every
    /// wgmma of `wgmma` reading `operand` (other readers keep reading the registers); else
    /// written before each mma reading it.
    pub at_source: bool,
}

/// A lowering decision the user may want to know about (a loop kept off the warp-specialised
/// schedule, and why), printed with the IR (`kiln ir --after lower`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Where in the user's source it applies.
    pub loc: Loc,
    /// What was decided and why.
    pub text: String,
}

/// The shared-memory ring through which a pipelined loop without mma reads a register tile
/// ahead ([`crate::passes::prefetch`]): each thread copies the elements of its own registers
/// (`cp.async`) and reads them back, so no barrier orders the ring and no thread waits for
/// another's copies. A thread's registers are cut into runs of `run_bytes`, the vector width
/// its loads would take; run `k` of thread `t` in stage `s` sits at
/// `offset + s * stage_bytes + (k * threads + t) * run_bytes`, so a warp's accesses are
/// consecutive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadSlab {
    /// The `load` whose tile it holds.
    pub load: OpId,
    /// Byte offset in the block's dynamic shared memory (a multiple of 128).
    pub offset: u32,
    /// Bytes of one stage: the registers' elements of every thread.
    pub stage_bytes: u32,
    /// Number of stages (the loop's `stages`).
    pub stages: u32,
}

/// How a pipelined `for` is software-pipelined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopPlan {
    /// Stages in flight (the loop's `stages`).
    pub stages: u32,
    /// The loads in the body issued `stages - 1` iterations ahead with cp.async: into their
    /// [`SmemBuffer`]s (loops with mma) or [`ThreadSlab`]s (loops without).
    pub prefetched: Vec<OpId>,
}

/// All scheduling annotations of a kernel. Empty until the passes run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Layout of every register or shared tile value (scalars have none).
    pub layouts: BTreeMap<ValueId, Layout>,
    /// Shared-memory buffers, in offset order.
    pub buffers: Vec<SmemBuffer>,
    /// Total dynamic shared memory in bytes.
    pub smem_bytes: u32,
    /// Plans of pipelined loops, keyed by their `for`.
    pub loops: BTreeMap<OpId, LoopPlan>,
    /// The rings of register tiles pipelined loops without mma read ahead, after the
    /// buffers.
    pub slabs: Vec<ThreadSlab>,
    /// sm_90a, sm_100a: the schedule IR of the ring loop: roles, their programs, barriers
    /// and the transfers they order ([`crate::sched`]).
    pub sched: Option<crate::sched::Sched>,
    /// Register tiles mmas read through shared memory, placed after every other buffer.
    pub staged: Vec<StagedOperand>,
    /// Lowering notes for the user.
    pub notes: Vec<Note>,
    /// sm_90a: the mmas outside any ring lowered to wgmma by every thread of the block, no
    /// warp roles ([`crate::passes::wgmma_plain`]).
    pub wgmma: std::collections::BTreeSet<OpId>,
    /// Shared memory through which tiles change layout (`convert`) and reductions cross
    /// warps; after every other buffer (the staged operands' too), reused by each such op in
    /// turn.
    pub scratch: Option<Scratch>,
    /// sm_90a: the whole-tile f32 atomic adds applied through shared memory with bulk
    /// reductions ([`crate::passes::bulk_add`]), and their staging region.
    pub bulk_adds: Option<BulkAdds>,
    /// sm_90a: the consumers' staging barriers of a ring body that another barrier of the
    /// body already implies ([`crate::passes::consumer_barriers`], planned in `lower`).
    pub implied_barriers: ImpliedBarriers,
}

/// The first barriers (write after read) of the consumers' staging writes in a ring body that
/// the PTX writer leaves out, each implied by another op's second barrier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImpliedBarriers {
    /// Mmas that write their staged A without first meeting: every reader of the buffer's
    /// previous contents has finished before another op's second barrier that precedes it.
    pub staged: std::collections::BTreeSet<OpId>,
    /// Bulk adds that write their tile without first meeting, each with the staged mma
    /// before whose second barrier the issuing threads wait for the previous add's reads of
    /// the region (`cp.async.bulk.wait_group.read`).
    pub bulk: BTreeMap<OpId, OpId>,
}

/// The atomic adds lowered to `cp.reduce.async.bulk` and the shared region they stage their
/// tiles in (after every other buffer, reused by each in turn).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BulkAdds {
    /// The `Atomic` ops so lowered.
    pub ops: std::collections::BTreeSet<OpId>,
    /// Those of `ops` applied as TMA tensor reductions of swizzled boxes; the others are
    /// staged in rows [`BulkAdds::pitch`] bytes apart and reduced a row at a time.
    pub boxes: BTreeMap<OpId, AddBoxes>,
    /// Offset of the staging region in dynamic shared memory (128-byte aligned; 1024 when
    /// any add stages boxes, the 128-byte swizzle's period).
    pub offset: u32,
    /// Its size in bytes: the largest staged tile.
    pub bytes: u32,
    /// In a warp-specialised kernel, the consumer warpgroups' threads (warps from 0), which
    /// alone hold the tiles, meet at a named barrier around the staging and issue the rows;
    /// `None`: every thread of the block, at `bar.sync 0`.
    pub consumers: Option<u32>,
}

impl BulkAdds {
    /// The staging buffer's row pitch for rows of `cols` f32 elements: 16-byte aligned (what
    /// a bulk copy's source needs) plus 16 bytes, so the eight rows of an accumulator
    /// fragment's store start on different banks.
    pub fn pitch(cols: usize) -> u32 {
        (cols as u32 * 4).next_multiple_of(16) + 16
    }
}

/// An f32 tile added through a tensor map: staged as [`AddBoxes::COLUMNS`]-column boxes of
/// `rows` 128-byte rows (box `j` at `j * rows * 128`, each 16-byte chunk `q` of row `r` at
/// chunk `q ^ (r % 8)`: the 128-byte swizzle), which one thread reduces into the tensor with
/// one `cp.reduce.async.bulk.tensor .add` each. The copy engine clips every box at the
/// tensor's bounds, so the add needs no row loop and no bounds arithmetic. The swizzle, with
/// the threads at odd rows storing the register half a box over
/// ([`AddBoxes::swap_odd_rows`]), keeps an accumulator fragment's staging stores free of
/// bank conflicts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AddBoxes {
    /// The tensor parameter (whose tensor map the runtime builds).
    pub param: usize,
    /// Tensor dimensions outside the tile's two: box extent 1.
    pub lead_dims: u32,
    /// Rows of the tile and of every box.
    pub rows: u32,
    /// Boxes, left to right.
    pub boxes: u32,
    /// Whether a thread at an odd row stores, at each staging store, the register
    /// [`AddBoxes::SWAP_COLUMNS`] columns over from the one the threads at even rows store
    /// ([`AddBoxes::odd_rows_swap`]).
    pub swap_odd_rows: bool,
}

impl AddBoxes {
    /// The column offset between the registers threads at odd and even rows store together
    /// when [`AddBoxes::swap_odd_rows`]: half a box, four chunks.
    pub const SWAP_COLUMNS: u32 = 16;

    /// The register a thread at an odd row stores in place of the one at offsets `offs`
    /// (row, column) when [`AddBoxes::swap_odd_rows`]: [`AddBoxes::SWAP_COLUMNS`] columns
    /// over, in the same box, so its 16-byte chunk is `SWAP_COLUMNS / 4` further.
    pub fn odd_row_register(offs: &[u32]) -> Vec<u32> {
        vec![offs[0], offs[1] ^ Self::SWAP_COLUMNS]
    }

    /// f32 columns of a box: one 128-byte swizzle span.
    pub const COLUMNS: u32 = 32;

    /// Bytes of one box.
    pub fn box_bytes(&self) -> u32 {
        self.rows * 128
    }

    /// Bytes of the staged tile.
    pub fn bytes(&self) -> u32 {
        self.box_bytes() * self.boxes
    }

    /// The tensor map's box extents, outermost first.
    pub fn map_box(&self) -> Vec<u32> {
        let mut dims = vec![1; self.lead_dims as usize];
        dims.extend([self.rows, Self::COLUMNS]);
        dims
    }

    /// Byte offset of element `(r, c)` of the staged tile.
    pub fn offset_of(&self, r: u32, c: u32) -> u32 {
        let (j, c) = (c / Self::COLUMNS, c % Self::COLUMNS);
        j * self.box_bytes() + r * 128 + ((c / 4) ^ (r % 8)) * 16 + (c % 4) * 4
    }

    /// The part of the offsets of the tile's elements that depends on the thread at row `rb`
    /// and column `cb` (its coordinates without the registers' offsets), in the form the
    /// staging stores compute it: `(base, phase)`, where `base` moves the thread to its row,
    /// its box and its column inside a chunk, and `phase` is its chunk XOR its row's swizzle
    /// phase. Register `(ro, co)` then sits at `base + (phase ^ k) * 16 + imm` with
    /// [`AddBoxes::register_part`]'s `(k, imm)`.
    pub fn thread_part(&self, rb: u32, cb: u32) -> (u32, u32) {
        let base = rb * 128 + cb / Self::COLUMNS * self.box_bytes() + (cb % 4) * 4;
        (base, ((cb % Self::COLUMNS) / 4) ^ (rb % 8))
    }

    /// A register's part of its offset, for one at `(ro, co)` in the tile: its chunk within
    /// the box `k` (XOR its rows' swizzle phase, which a transposed accumulator's registers
    /// a row apart change) and the constant `imm`.
    pub fn register_part(&self, ro: u32, co: u32) -> (u32, u32) {
        let (j, c) = (co / Self::COLUMNS, co % Self::COLUMNS);
        (
            (c / 4) ^ (ro % 8),
            j * self.box_bytes() + ro * 128 + (c % 4) * 4,
        )
    }

    /// Whether the staging stores of a tile laid out as `d` (held by `threads` threads) take
    /// fewer shared-memory wavefronts when the threads at odd rows store the register
    /// [`AddBoxes::SWAP_COLUMNS`] columns over (in the same box) from the even rows' one. An
    /// accumulator fragment's 8-byte stores are served a half-warp at a time: its rows `r`
    /// and `r ^ 1` land on the same pair of chunks under the 128-byte swizzle (two
    /// wavefronts where one would do); half a box over, they land on distinct chunks. Every
    /// register's partner must be the thread's own register.
    pub fn odd_rows_swap(&self, d: &Distribution, threads: u32) -> bool {
        let partner = Self::odd_row_register;
        let step = if d.column_pairs() { 2 } else { 1 };
        if d.terms.len() != 2 || !d.regs.iter().all(|o| d.regs.contains(&partner(o))) {
            return false;
        }
        let wavefronts = |swap: bool| -> u32 {
            let mut total = 0;
            for warp in 0..threads.div_ceil(32) {
                for group in d.regs.chunks(step) {
                    let addrs: Vec<u32> = (warp * 32..(warp * 32 + 32).min(threads))
                        .map(|tid| {
                            let rb = Term::sum(&d.terms[0], tid);
                            let cb = Term::sum(&d.terms[1], tid);
                            let offs = if swap && rb % 2 == 1 {
                                partner(&group[0])
                            } else {
                                group[0].clone()
                            };
                            self.offset_of(rb + offs[0], cb + offs[1])
                        })
                        .collect();
                    total += store_wavefronts(&addrs, 4 * step as u32);
                }
            }
            total
        };
        wavefronts(true) < wavefronts(false)
    }

    /// Whether the split offsets of [`AddBoxes::thread_part`] and
    /// [`AddBoxes::register_part`] are every element's [`AddBoxes::offset_of`], for each of
    /// the `threads` threads holding a 2-D tile laid out as `d` (thread and register
    /// coordinates never carry into each other's bits), and every register inside the tile.
    pub fn separable(&self, d: &Distribution, threads: u32) -> bool {
        let cols = self.boxes * Self::COLUMNS;
        d.terms.len() == 2
            && (0..threads).all(|tid| {
                let (rb, cb) = (Term::sum(&d.terms[0], tid), Term::sum(&d.terms[1], tid));
                let (base, phase) = self.thread_part(rb, cb);
                d.regs.iter().zip(d.coords(tid)).all(|(offs, at)| {
                    let (k, imm) = self.register_part(offs[0], offs[1]);
                    at[0] < self.rows
                        && at[1] < cols
                        && base + (phase ^ k) * 16 + imm == self.offset_of(at[0], at[1])
                })
            })
    }
}

/// Shared-memory wavefronts of one warp's store of `bytes` (4, 8 or 16) a thread at byte
/// addresses `addrs` (one a lane): the lanes are served in groups of `128 / bytes` (a whole
/// warp for 4 bytes, a half-warp for 8), each group taking as many wavefronts as the most
/// distinct 4-byte words any of the 32 banks holds.
fn store_wavefronts(addrs: &[u32], bytes: u32) -> u32 {
    let lanes = (128 / bytes.clamp(4, 16)) as usize;
    addrs
        .chunks(lanes)
        .map(|group| {
            let mut words: Vec<u32> = group
                .iter()
                .flat_map(|&a| (0..bytes / 4).map(move |w| a / 4 + w))
                .collect();
            words.sort_unstable();
            words.dedup();
            let mut per_bank = [0u32; 32];
            for w in words {
                per_bank[(w % 32) as usize] += 1;
            }
            per_bank.into_iter().max().unwrap_or(0)
        })
        .sum()
}

/// A shared-memory region for exchanging register tiles between threads, in two slots: the
/// first as large as the largest exchange, the second (`small` bytes, 0 for none) as large as
/// the largest small one (a reduction's partials). Exchanges one after another in
/// straight-line code alternate between them where they fit, so such an exchange needs no
/// barrier before its writes: the barrier between the previous exchange's writes and reads
/// already ordered every read of its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scratch {
    /// Offset in dynamic shared memory (128-byte aligned).
    pub offset: u32,
    /// The size of the first slot in bytes.
    pub bytes: u32,
    /// The size of the second slot in bytes (0: there is none).
    pub small: u32,
}

impl Scratch {
    /// The offset of the second slot (128-byte aligned).
    pub fn second(&self) -> u32 {
        self.offset + self.bytes.next_multiple_of(128)
    }

    /// The bytes both slots take, from the first's start.
    pub fn total_bytes(&self) -> u32 {
        if self.small == 0 {
            self.bytes
        } else {
            self.second() + self.small - self.offset
        }
    }
}

impl Schedule {
    /// The alignment of the kernel's dynamic shared memory: the 128-byte swizzle's 1024-byte
    /// period where TMA or wgmma read it (a ring's stages, wgmma operands), else 128.
    pub fn smem_align(&self) -> u32 {
        if self.sched.is_none() && self.wgmma.is_empty() {
            128
        } else {
            1024
        }
    }

    /// The buffer holding the tile loaded by `load`.
    pub fn buffer(&self, load: OpId) -> Option<&SmemBuffer> {
        self.buffers.iter().find(|b| b.load == load)
    }

    /// The ring through which `load`'s register tile is read ahead, if it is.
    pub fn slab(&self, load: OpId) -> Option<&ThreadSlab> {
        self.slabs.iter().find(|b| b.load == load)
    }

    /// How `operand`, an mma operand in registers, is staged in shared memory before each
    /// mma reading it, if it is.
    pub fn staged(&self, operand: ValueId) -> Option<&StagedOperand> {
        self.staged
            .iter()
            .find(|s| s.operand == operand && !s.at_source)
    }

    /// How a ring's consumers stage `operand` where an mma reads it as operand `slot` (0: A,
    /// 1: B), if they do.
    pub fn staged_as(&self, operand: ValueId, slot: usize) -> Option<&StagedOperand> {
        self.staged(operand).filter(|s| s.slot == slot)
    }

    /// How `operand`, a register tile, is written once into shared memory where it is
    /// defined, for the wgmmas that read it, if it is ([`StagedOperand::at_source`]).
    pub fn staged_at_source(&self, operand: ValueId) -> Option<&StagedOperand> {
        self.staged
            .iter()
            .find(|s| s.operand == operand && s.at_source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mma_layout_covers_every_element_once() {
        let shape = Shape(vec![64, 32]);
        let d = Layout::Mma { warps: [2, 2] }
            .distribution(&shape)
            .expect("fits");
        let mut seen = vec![0u32; 64 * 32];
        for tid in 0..128 {
            for c in d.coords(tid) {
                seen[(c[0] * 32 + c[1]) as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        // Lane 5 of warp 0 holds row 1, columns 2 and 3 of the first fragment (PTX ISA
        // m16n8 accumulator layout: row = lane / 4, col = 2 * (lane % 4)).
        assert_eq!(d.coords(5)[..2], [vec![1, 2], vec![1, 3]]);
    }

    /// Each warpgroup's column block is the wgmma accumulator of its rows (register `4 ni +
    /// 2 v1 + v0` of lane `l` of warp `w`: row `16 (w % 4) + l / 4 + 8 v1`, column `8 ni +
    /// 2 (l % 4) + v0` of the block), every element held once; one column block is
    /// `#mma(warps x 1)`.
    #[test]
    fn wgmma_column_blocks_are_each_warpgroups_accumulator() {
        for (m, n, wn) in [(64, 128, 2), (64, 256, 4), (128, 64, 2), (64, 96, 2)] {
            let shape = Shape(vec![m, n]);
            let d = Layout::WgmmaColumns { col_blocks: wn }
                .distribution(&shape)
                .expect("fits");
            let threads = 128 * wn * m as u32 / 64;
            let nb = n as u32 / wn;
            let mut seen = vec![0u32; m * n];
            for tid in 0..threads {
                let (w, l) = (tid / 32, tid % 32);
                let g = w / 4;
                let (r0, c0) = (64 * (g / wn), nb * (g % wn));
                let coords = d.coords(tid);
                assert_eq!(coords.len() as u32, nb / 2);
                for (i, c) in coords.iter().enumerate() {
                    let (ni, v1, v0) = (i as u32 / 4, (i as u32 / 2) % 2, i as u32 % 2);
                    let want = vec![
                        r0 + 16 * (w % 4) + l / 4 + 8 * v1,
                        c0 + 8 * ni + 2 * (l % 4) + v0,
                    ];
                    assert_eq!(c, &want, "{m}x{n}/{wn}: thread {tid} register {i}");
                    seen[(c[0] * n as u32 + c[1]) as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&k| k == 1), "{m}x{n}/{wn}");
        }
        for shape in [Shape(vec![64, 128]), Shape(vec![128, 64])] {
            let warps = shape.rows() as u32 / 16;
            assert_eq!(
                Layout::WgmmaColumns { col_blocks: 1 }.distribution(&shape),
                Layout::Mma { warps: [warps, 1] }.distribution(&shape)
            );
        }
        for (m, n) in [(64, 72), (32, 128)] {
            let misfit = Layout::WgmmaColumns { col_blocks: 2 }.distribution(&Shape(vec![m, n]));
            assert!(misfit.is_err(), "{m}x{n}: {misfit:?}");
        }
    }

    /// An accumulator fragment's 8-byte staging stores: with every thread storing the same
    /// register, a half-warp's rows `r` and `r ^ 1` share their chunks under the swizzle (2
    /// wavefronts a half-warp); threads at odd rows storing the register half a box over
    /// take 1, and the stores still put every element at its own offset, once.
    #[test]
    fn odd_rows_half_a_box_over_stage_an_accumulator_in_one_wavefront_a_half_warp() {
        for (rows, cols, warps) in [(128, 64, 8), (64, 64, 4), (64, 128, 4)] {
            let shape = Shape(vec![rows, cols]);
            let d = Layout::Mma { warps: [warps, 1] }
                .distribution(&shape)
                .expect("fits");
            let b = AddBoxes {
                param: 0,
                lead_dims: 2,
                rows: rows as u32,
                boxes: cols as u32 / AddBoxes::COLUMNS,
                swap_odd_rows: false,
            };
            let threads = 32 * warps;
            assert!(b.separable(&d, threads));
            assert!(b.odd_rows_swap(&d, threads), "{rows}x{cols}");
            let mut written = vec![0u32; rows * cols];
            for warp in 0..warps {
                for pair in d.regs.chunks(2) {
                    let (mut plain, mut swapped) = (Vec::new(), Vec::new());
                    for tid in warp * 32..warp * 32 + 32 {
                        let rb = Term::sum(&d.terms[0], tid);
                        let cb = Term::sum(&d.terms[1], tid);
                        let (r, c) = (rb + pair[0][0], cb + pair[0][1]);
                        plain.push(b.offset_of(r, c));
                        let c = if rb % 2 == 1 {
                            c ^ AddBoxes::SWAP_COLUMNS
                        } else {
                            c
                        };
                        swapped.push(b.offset_of(r, c));
                        for w in [c, c + 1] {
                            written[r as usize * cols + w as usize] += 1;
                        }
                    }
                    assert_eq!(store_wavefronts(&plain, 8), 4, "{rows}x{cols}");
                    assert_eq!(store_wavefronts(&swapped, 8), 2, "{rows}x{cols}");
                }
            }
            assert!(written.iter().all(|&n| n == 1), "{rows}x{cols}");
        }
        // A 32-column tile has no register half a box over in its own box.
        let d = Layout::Mma { warps: [4, 1] }
            .distribution(&Shape(vec![64, 16]))
            .expect("fits");
        let b = AddBoxes {
            param: 0,
            lead_dims: 0,
            rows: 64,
            boxes: 1,
            swap_odd_rows: false,
        };
        assert!(!b.odd_rows_swap(&d, 128));
    }

    /// A transposed accumulator (`dQ = (K^T dS^T)^T`, the `[80, 128]` of `[128, 80]` under
    /// two warpgroups): thread and register `i` hold the parent's element `(c, r)` at `(r,
    /// c)`, every element once; its registers a row apart split into a thread's and a
    /// register's offset in the add's swizzled boxes, one wavefront a store.
    #[test]
    fn a_transposed_accumulator_is_its_parents_registers_at_swapped_offsets() {
        let parent = Layout::Mma { warps: [8, 1] };
        let (m, n) = (128u32, 80u32);
        let p = parent
            .distribution(&Shape(vec![m as usize, n as usize]))
            .expect("fits");
        let t = parent.transposed();
        assert_eq!(t.transposed(), parent);
        assert_eq!(t.to_string(), "#t(#mma(8x1))");
        let d = t
            .distribution(&Shape(vec![n as usize, m as usize]))
            .expect("fits");
        assert!(
            t.distribution(&Shape(vec![m as usize, n as usize]))
                .is_err()
        );
        let mut seen = vec![0u32; (m * n) as usize];
        for tid in 0..256 {
            for (pc, tc) in p.coords(tid).iter().zip(d.coords(tid)) {
                assert_eq!(tc, vec![pc[1], pc[0]], "thread {tid}");
                seen[(tc[0] * m + tc[1]) as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&k| k == 1));
        let b = AddBoxes {
            param: 0,
            lead_dims: 2,
            rows: n,
            boxes: m / AddBoxes::COLUMNS,
            swap_odd_rows: false,
        };
        assert!(b.separable(&d, 256));
        assert!(!b.odd_rows_swap(&d, 256));
        for warp in 0..8 {
            for offs in &d.regs {
                let addrs: Vec<u32> = (warp * 32..warp * 32 + 32)
                    .map(|tid| {
                        let rb = Term::sum(&d.terms[0], tid);
                        let cb = Term::sum(&d.terms[1], tid);
                        b.offset_of(rb + offs[0], cb + offs[1])
                    })
                    .collect();
                assert_eq!(store_wavefronts(&addrs, 4), 1, "warp {warp} {offs:?}");
            }
        }
    }

    #[test]
    fn tmem_rows_follow_the_lane_quarters_of_each_warp() {
        let shape = Shape(vec![128, 256]);
        let d = Layout::TmemRows { warpgroups: 2 }
            .distribution(&shape)
            .expect("fits");
        let mut seen = vec![0u32; 128 * 256];
        for tid in 0..256 {
            for c in d.coords(tid) {
                seen[(c[0] * 256 + c[1]) as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        // Warp 5 (thread 163): TMEM lanes 32 (5 % 4) .., the second warpgroup's columns.
        let c = d.coords(5 * 32 + 3);
        assert_eq!(
            (c.len(), &c[0], &c[127]),
            (128, &vec![35, 128], &vec![35, 255])
        );
    }

    #[test]
    fn row_slice_keeps_the_rows_of_each_thread() {
        let parent = Layout::Mma { warps: [4, 1] };
        let shape = Shape(vec![128, 64]);
        let slice = Layout::Slice {
            dim: 1,
            keep_dim: false,
            parent: Box::new(parent.clone()),
            parent_shape: shape.clone(),
        };
        let d = slice.distribution(&Shape(vec![128])).expect("fits");
        let p = parent.distribution(&shape).expect("fits");
        for tid in [0, 37, 127] {
            let mut rows: Vec<u32> = p.coords(tid).into_iter().map(|c| c[0]).collect();
            rows.sort();
            rows.dedup();
            let mut got: Vec<u32> = d.coords(tid).into_iter().map(|c| c[0]).collect();
            got.sort();
            assert_eq!(got, rows);
        }
    }

    #[test]
    fn row_reduction_shuffles_within_the_warp_and_broadcasts_back() {
        // softmax's [4, 512] tile: one warp per row, its 32 lanes x 4 registers along it.
        let l = Layout::Blocked {
            size_per_thread: [1, 4],
            threads_per_warp: [1, 32],
            warps: [4, 1],
        };
        let shape = Shape(vec![4, 512]);
        let d = l.distribution(&shape).expect("fits");
        assert_eq!(d.lane_masks(1), Some(vec![1, 2, 4, 8, 16]));
        assert_eq!(d.lane_masks(0), None, "the rows are spread over warps");
        let col = Shape(vec![4, 1]);
        let m = Layout::Slice {
            dim: 1,
            keep_dim: true,
            parent: Box::new(l),
            parent_shape: shape.clone(),
        }
        .distribution(&col)
        .expect("fits");
        assert!(m.broadcasts_to(&col, &d, &shape), "x - m.col()");
        assert!(!d.broadcasts_to(&shape, &m, &col));
        assert!(
            !d.broadcasts_to(&shape, &d, &Shape(vec![2048])),
            "ranks differ"
        );
    }

    #[test]
    fn blocked_layout_that_does_not_divide_is_an_error() {
        let l = Layout::Blocked {
            size_per_thread: [1, 4],
            threads_per_warp: [1, 32],
            warps: [4, 1],
        };
        assert!(l.distribution(&Shape(vec![4, 96])).is_err());
        assert!(l.distribution(&Shape(vec![4, 128])).is_ok());
    }

    /// A tile of rank 3 or 4 is laid out as its leading dimensions folded into rows: every
    /// thread holds the same elements as in the folded 2-D tile, coordinates split per
    /// dimension.
    #[test]
    fn blocked_layouts_of_rank_3_and_4_tiles_unfold_the_rows() {
        let layouts = [
            ([1, 4], [4, 8], [4, 1]),
            ([1, 2], [8, 4], [2, 2]),
            ([1, 1], [32, 1], [1, 4]),
            ([1, 8], [2, 16], [4, 1]),
        ];
        let shapes: [&[usize]; 5] = [
            &[2, 8, 32],
            &[4, 4, 64],
            &[8, 2, 2, 32],
            &[1, 32, 32],
            &[32, 1, 64],
        ];
        for (spt, tpw, warps) in layouts {
            let l = Layout::Blocked {
                size_per_thread: spt,
                threads_per_warp: tpw,
                warps,
            };
            for dims in shapes {
                let (lead, last) = dims.split_at(dims.len() - 1);
                let rows: usize = lead.iter().product();
                let flat = Shape(vec![rows, last[0]]);
                let (Ok(d2), Ok(dn)) =
                    (l.distribution(&flat), l.distribution(&Shape(dims.to_vec())))
                else {
                    continue;
                };
                assert_eq!(dn.terms.len(), dims.len());
                for tid in 0..32 * warps[0] * warps[1] {
                    let folded: Vec<Vec<u32>> = dn
                        .coords(tid)
                        .into_iter()
                        .map(|c| {
                            let row = lead
                                .iter()
                                .zip(&c)
                                .fold(0u32, |acc, (&n, &x)| acc * n as u32 + x);
                            vec![row, c[dims.len() - 1]]
                        })
                        .collect();
                    assert_eq!(folded, d2.coords(tid), "{l} over {dims:?}, thread {tid}");
                }
            }
        }
    }

    /// A split that per-dimension thread terms cannot express is a misfit, not a wrong map.
    #[test]
    fn a_leading_extent_the_terms_cannot_split_is_a_misfit() {
        let l = Layout::Blocked {
            size_per_thread: [1, 1],
            threads_per_warp: [32, 1],
            warps: [2, 1],
        };
        // 64 rows per repetition: whole repetitions per leading index split evenly.
        assert!(l.distribution(&Shape(vec![3, 64, 1])).is_ok());
        // Warp 1's rows 32..64 of the second repetition are rows 96..128: across the
        // boundary at 96 of `[2, 96, 1]`, which no term per dimension can say.
        assert!(l.distribution(&Shape(vec![2, 96, 1])).is_err());
        assert!(l.distribution(&Shape(vec![4, 48, 1])).is_err());
    }
}
