//! Addressed global accesses: masked loads with a fill value and gathers (`ld.global` under
//! a per-element predicate), masked stores and scatters (`st.global`), and atomics
//! (`atom`/`red`, or a `atom.cas` loop where the hardware has no such read-modify-write).

use std::collections::BTreeMap;

use kiln_ir::schedule::{Distribution, Term};
use kiln_ir::{Access, Addr, AtomicOp, DType, MemScope, MemSem, OpId, OpKind, Target, ValueId};

use super::vector::{reg_list, vec_suffix};
use super::{Emitter, ParamRegs, Val};
use crate::error::CodegenError;
use crate::types::{Class, Reg, mem_ty};

/// How one atomic element is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AtomicForm {
    /// One `atom` (or `red`) instruction of this PTX type.
    Native(&'static str),
    /// A `atom.cas.b32` loop on the element (32-bit elements without the operation).
    Cas32,
    /// An `atom.cas.b16` loop on a 16-bit element.
    Cas16,
}

/// The instruction form of atomic `op` on `dtype` elements; `None` if the IR
/// does not allow it (the verifier rejects it first). A new dtype is one more arm.
pub(super) fn atomic_form(op: AtomicOp, dtype: DType) -> Option<AtomicForm> {
    use AtomicForm::*;
    Some(match (dtype, op) {
        (DType::I32, AtomicOp::Add | AtomicOp::Max | AtomicOp::Min) => Native("s32"),
        (DType::U32, AtomicOp::Add | AtomicOp::Max | AtomicOp::Min) => Native("u32"),
        (DType::I32 | DType::U32 | DType::F32, AtomicOp::Xchg | AtomicOp::Cas) => Native("b32"),
        (DType::F32, AtomicOp::Add) => Native("f32"),
        // A float max/min atom is sm_90 only, and its NaN handling is not documented to be
        // the IR's NaN-ignoring max; the loop computes exactly the IR's with `max.f32`.
        (DType::F32, AtomicOp::Max | AtomicOp::Min) => Cas32,
        // A lone 16-bit add: ptxas would emulate `atom.add.noftz.{b,}f16` with a 32-bit
        // compare-and-swap loop that spills; our own loop swaps the 16 bits in place. Pairs
        // take the packed form ([`Emitter::packed_pairs`]).
        (DType::F16 | DType::Bf16, AtomicOp::Add) => Cas16,
        _ => return None,
    })
}

/// `.sem.scope` as PTX spells them on `atom`/`red`/`ld`.
fn order(sem: MemSem, scope: MemScope) -> String {
    format!(".{}.{}", sem.name(), scope.name())
}

/// Where the accessed tile's elements are, per register of its layout.
pub(super) struct Element {
    /// The global address (`.b64`) of the element, less `imm` bytes.
    pub(super) addr: Reg,
    /// A constant byte offset: the element's offset along the contiguous dimension, so the
    /// elements of one row share their address register.
    pub(super) imm: u32,
    /// Whether it is accessed (inside the tensor, mask on, and for atomics owned).
    pub(super) on: Reg,
}

impl Element {
    /// The address operand, `%rd+imm`.
    fn at(&self) -> String {
        format!("{}+{}", self.addr, self.imm)
    }
}

/// The per-access state of [`Emitter::address`]: the tensor's registers, what does not
/// vary over the tile, and the coordinate offsets and addresses written so far (shared by
/// the elements of one row).
struct Addressing {
    id: OpId,
    /// How each tensor dimension is addressed.
    dims_of: Vec<Addr>,
    /// Per tensor dimension, its coordinate or index tile.
    addr: Vec<ValueId>,
    mask: Option<ValueId>,
    /// The tensor's extents (`.b32`) and strides (`.b64`).
    dims: Vec<Reg>,
    strides: Vec<Reg>,
    esize: usize,
    tile_rank: usize,
    /// The address of the outer (non-tile) coordinates and whether they are inside (and the
    /// thread owns the elements).
    base: Reg,
    fixed_ok: Option<Reg>,
    /// Per tensor dimension the tile covers by a coordinate: the thread's first coordinate.
    starts: BTreeMap<usize, Reg>,
    /// Per (dimension, register offset): byte offset and predicate.
    along: BTreeMap<(usize, u32), (Reg, Reg)>,
    /// Per contiguous-dimension offset: its predicate; and the dimension's byte offset.
    inner_ok: BTreeMap<u32, Reg>,
    inner_off: Option<Reg>,
    /// Address registers by the coordinates they combine (the contiguous one aside).
    rows: BTreeMap<Vec<Part>, Reg>,
    /// Per (dimension, index register): byte offset and predicate.
    indexed: BTreeMap<(usize, Reg), (Reg, Reg)>,
}

/// What one dimension contributes to an address: a register offset along a coordinate, or
/// the register of an index tile's element (the same for the elements it broadcasts to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Off(u32),
    Index(Reg),
}

impl Emitter<'_> {
    /// Writes a gather, scatter or atomic.
    ///
    /// Each thread addresses the elements its registers hold in the accessed tile's layout
    /// (the gather's result, the scatter's or atomic's values); index tiles and masks are read
    /// in the same layout, or broadcast along a dimension. An element is accessed only where
    /// every coordinate lies inside the tensor (unsigned compares, so negative indices are
    /// outside) and the mask holds. Where a thread's registers hold 16 consecutive bytes of a
    /// row (a row gather or scatter), one vector access moves them unless the group straddles
    /// an edge; adjacent 16-bit atomic adds pair into one packed `bf16x2`/`f16x2` add likewise.
    ///
    /// A layout may hold one element in several threads (a tile smaller than the block); an
    /// atomic then runs in one of them only, the one whose index has every replicating digit
    /// at zero, and the old values reach the others by shuffle (copies in other warps would
    /// need shared memory: a diagnostic).
    pub(crate) fn write_access(&mut self, id: OpId) -> Result<(), CodegenError> {
        if self.write_staged_load(id)? || self.write_bulk_add(id)? {
            return Ok(());
        }
        let op = self.k.ops[id].clone();
        let parts = op
            .access_operands()
            .ok_or_else(|| self.internal(id, "malformed memory access"))?;
        let (tensor, access) = match &op.kind {
            OpKind::Gather { tensor, access, .. }
            | OpKind::Scatter { tensor, access }
            | OpKind::Atomic { tensor, access, .. } => (*tensor, access.clone()),
            _ => return Err(self.internal(id, "not a memory access")),
        };
        let anchor = match op.kind {
            OpKind::Gather { .. } => op.results[0],
            _ => parts
                .value
                .ok_or_else(|| self.internal(id, "no value operand"))?,
        };
        let shape = self
            .k
            .ty(anchor)
            .shape()
            .cloned()
            .ok_or_else(|| self.internal(id, "an access of a scalar"))?;
        let d = self.dist(anchor, id)?;
        let tiles: Vec<ValueId> = parts
            .addr
            .iter()
            .copied()
            .chain(parts.compare)
            .chain(parts.mask)
            .chain(parts.value)
            .collect();
        for v in tiles {
            self.check_broadcast(v, &shape, &d, id)?;
        }
        let owner = match op.kind {
            OpKind::Atomic { .. } => self.owner(&d),
            _ => None,
        };
        let mut ad = self.addressing(id, tensor, &access, parts.addr, parts.mask, &d, owner)?;
        let dtype = self.k.params[tensor].dtype();
        match &op.kind {
            OpKind::Gather { .. } => {
                let other = self.scalar(
                    parts
                        .other
                        .ok_or_else(|| self.internal(id, "no fill value"))?,
                    id,
                )?;
                let group = self.vector_group(tensor, &access, &parts, &d);
                let mut regs = Vec::with_capacity(d.regs.len());
                for chunk in d.regs.chunks(group) {
                    let mut es = Vec::with_capacity(group);
                    for offs in chunk {
                        es.push(self.address(&mut ad, offs)?);
                    }
                    let xs: Vec<Reg> = es
                        .iter()
                        .map(|_| {
                            let x = self.new_reg(Class::of(dtype));
                            self.mov(x, other);
                            x
                        })
                        .collect();
                    let rest = self.whole_group(&es, |e, all| {
                        e.group_load(dtype, all, &es[0], &xs);
                    });
                    for ((e, x), on) in es.iter().zip(&xs).zip(rest) {
                        self.ins(format!(
                            "@{on} ld.global.{} {x}, [{}]",
                            mem_ty(dtype),
                            e.at()
                        ));
                    }
                    regs.extend(xs);
                }
                self.vals.insert(op.results[0], Val::Tile(regs));
            }
            OpKind::Scatter { .. } => {
                let group = self.vector_group(tensor, &access, &parts, &d);
                for chunk in d.regs.chunks(group) {
                    let mut es = Vec::with_capacity(group);
                    let mut xs = Vec::with_capacity(group);
                    for offs in chunk {
                        es.push(self.address(&mut ad, offs)?);
                        xs.push(self.elem(anchor, offs, id)?);
                    }
                    let rest = self.whole_group(&es, |e, all| {
                        e.group_store(dtype, all, &es[0], &xs);
                    });
                    for ((e, x), on) in es.iter().zip(&xs).zip(rest) {
                        self.ins(format!(
                            "@{on} st.global.{} [{}], {x}",
                            mem_ty(dtype),
                            e.at()
                        ));
                    }
                }
            }
            OpKind::Atomic {
                op: aop,
                sem,
                scope,
                ..
            } => {
                let form = atomic_form(*aop, dtype)
                    .ok_or_else(|| self.internal(id, "an atomic the verifier should reject"))?;
                let used = self.uses.get(&op.results[0]).is_some_and(|u| !u.is_empty());
                let mut old = Vec::with_capacity(d.regs.len());
                if let Some(x2) = self.packed_pairs(tensor, &access, parts.addr, &d, *aop, form) {
                    let mut elements = Vec::with_capacity(d.regs.len());
                    let mut values = Vec::with_capacity(d.regs.len());
                    for offs in &d.regs {
                        elements.push(self.address(&mut ad, offs)?);
                        values.push(self.elem(anchor, offs, id)?);
                    }
                    let order = (*sem, *scope);
                    old = self.atomic_pairs(x2, form, order, dtype, &elements, &values, used);
                }
                for offs in d.regs.iter().skip(old.len()) {
                    let e = self.address(&mut ad, offs)?;
                    let v = self.elem(anchor, offs, id)?;
                    let cmp = match parts.compare {
                        Some(c) => Some(self.elem(c, offs, id)?),
                        None => None,
                    };
                    let o =
                        self.atomic_element(*aop, form, (*sem, *scope), dtype, &e, v, cmp, used);
                    old.push(o);
                }
                if used && let Some((_, Some(lane))) = owner {
                    for o in &mut old {
                        *o = self.read_lane(*o, lane);
                    }
                } else if used && owner.is_some() {
                    // One thread applies each element; copies of it in other warps would need
                    // its old value through shared memory, which this lowering does not use.
                    let msg = "the old values of this atomic are not available on the GPU: its \
                               tile has fewer elements than the block has threads, so other \
                               warps hold copies of them";
                    return Err(CodegenError::Diagnostic(
                        kiln_ir::Diagnostic::new(op.loc, msg).note(
                            "use a tile of at least as many elements as threads, or drop the result",
                        ),
                    ));
                }
                self.vals.insert(op.results[0], Val::Tile(old));
            }
            _ => {}
        }
        Ok(())
    }

    /// How many consecutive registers of `d` one 16-byte access can move for a gather or
    /// scatter (1: element by element): the tensor is 16-byte aligned, its contiguous
    /// dimension is addressed by a coordinate known to be a multiple of the group, the
    /// layout holds groups of that many consecutive columns at such multiples, and index
    /// tiles and the mask do not vary along the columns (a row gather's, a row mask).
    fn vector_group(
        &self,
        tensor: usize,
        access: &Access,
        parts: &kiln_ir::AccessOperands<'_>,
        d: &Distribution,
    ) -> usize {
        let esize = self.k.params[tensor].dtype().size_bytes();
        let g = 16 / esize.max(1);
        let rank = access.dims.len();
        let (Some(inner), Some(last)) = (rank.checked_sub(1), d.terms.len().checked_sub(1)) else {
            return 1;
        };
        let gu = g as u32;
        let layout_groups = d.terms[last].iter().all(|t| t.mul.is_multiple_of(gu))
            && d.regs.len().is_multiple_of(g)
            && d.regs.chunks(g).all(|c| {
                c[0][last].is_multiple_of(gu)
                    && c.iter()
                        .enumerate()
                        .all(|(k, o)| o[..last] == c[0][..last] && o[last] == c[0][last] + k as u32)
            });
        // A tile operand must hold one value per row of the group.
        let along_rows = |v: ValueId| {
            self.k
                .ty(v)
                .shape()
                .is_none_or(|s| s.dims().last() == Some(&1))
        };
        let indexed = access
            .dims
            .iter()
            .zip(parts.addr)
            .filter(|(a, _)| **a == Addr::Index)
            .all(|(_, &v)| along_rows(v));
        let ok = g > 1
            && self.k.params[tensor].aligned16()
            && access.dims.get(inner) == Some(&Addr::Coord)
            && kiln_ir::access::tile_dim(inner, rank, d.terms.len()) == Some(last)
            && parts
                .addr
                .get(inner)
                .is_some_and(|&c| self.known_multiple(c).is_multiple_of(gu))
            && layout_groups
            && indexed
            && parts.mask.is_none_or(along_rows);
        if ok { g } else { 1 }
    }

    /// For a group of consecutive elements: `whole(self, all)` writes the one vector access
    /// made under predicate `all` (every element of the group accessed, which the first and
    /// the last decide: the columns in between lie between them, and the row and mask are
    /// the group's); returns, per element, the predicate of its own access where the group
    /// is not whole. A single element is its own group.
    fn whole_group(&mut self, es: &[Element], whole: impl FnOnce(&mut Self, Reg)) -> Vec<Reg> {
        if es.len() == 1 {
            return vec![es[0].on];
        }
        let all = self.new_reg(Class::Pred);
        let (first, last) = (es[0].on, es[es.len() - 1].on);
        self.ins(format!("and.pred {all}, {first}, {last}"));
        whole(self, all);
        let not_all = self.new_reg(Class::Pred);
        self.ins(format!("not.pred {not_all}, {all}"));
        es.iter()
            .map(|e| {
                let p = self.new_reg(Class::Pred);
                self.ins(format!("and.pred {p}, {}, {not_all}", e.on));
                p
            })
            .collect()
    }

    /// `@all ld.global.v4` of a 16-byte group at `at` into `xs` (16-bit elements arrive in
    /// pairs and are split).
    fn group_load(&mut self, dtype: DType, all: Reg, at: &Element, xs: &[Reg]) {
        if xs[0].class == Class::B16 {
            let words: Vec<Reg> = (0..xs.len() / 2)
                .map(|_| self.new_reg(Class::B32))
                .collect();
            self.ins(format!(
                "@{all} ld.global{} {}, [{}]",
                vec_suffix(words.len(), "b32"),
                reg_list(&words),
                at.at()
            ));
            // Only a loaded group replaces the fill value the registers hold.
            for (w, pair) in words.iter().zip(xs.chunks(2)) {
                self.ins(format!("@{all} mov.b32 {{{}, {}}}, {w}", pair[0], pair[1]));
            }
        } else {
            self.ins(format!(
                "@{all} ld.global{} {}, [{}]",
                vec_suffix(xs.len(), mem_ty(dtype)),
                reg_list(xs),
                at.at()
            ));
        }
    }

    /// `@all st.global.v4` of a 16-byte group from `xs` at `at`.
    fn group_store(&mut self, dtype: DType, all: Reg, at: &Element, xs: &[Reg]) {
        let (n, ty, list) = if xs[0].class == Class::B16 {
            let words = self.pack(xs);
            (words.len(), "b32", reg_list(&words))
        } else {
            (xs.len(), mem_ty(dtype), reg_list(xs))
        };
        self.ins(format!(
            "@{all} st.global{} [{}], {list}",
            vec_suffix(n, ty),
            at.at()
        ));
    }

    /// For a layout that holds some elements in several threads: a predicate true in exactly
    /// one thread per element, and (when every copy is in the owner's warp) a register
    /// holding the owner's lane. `None` when no element is repeated.
    fn owner(&mut self, d: &Distribution) -> Option<(Reg, Option<Reg>)> {
        let threads = 32 * self.k.options.num_warps;
        let terms: Vec<Term> = d.terms.iter().flatten().copied().collect();
        let covered: u32 = terms.iter().map(|t| t.modulo).product();
        if covered >= threads {
            return None;
        }
        // The layout's digits of the thread index, each in place: the owner has every other
        // digit at zero.
        let digits: Vec<Term> = terms
            .iter()
            .map(|t| Term {
                div: t.div,
                modulo: t.modulo,
                mul: t.div,
            })
            .collect();
        let canon = self.thread_coord(&digits);
        let own = self.setp("eq.u32", canon, self.tid);
        // Whether every copy of an element is in its owner's warp: then the owner's lane
        // shares the old values by shuffle.
        let same_warp = (0..threads).all(|t| Term::sum(&digits, t) / 32 == t / 32);
        let lane = same_warp.then(|| {
            let l = self.new_reg(Class::B32);
            self.ins(format!("and.b32 {l}, {canon}, 31"));
            l
        });
        Some((own, lane))
    }

    /// `x` as lane `lane` of the warp holds it.
    fn read_lane(&mut self, x: Reg, lane: Reg) -> Reg {
        let bits = match x.class {
            Class::B32 => x,
            Class::F32 => {
                let b = self.new_reg(Class::B32);
                self.ins(format!("mov.b32 {b}, {x}"));
                b
            }
            _ => {
                let b = self.new_reg(Class::B32);
                self.ins(format!("cvt.u32.u16 {b}, {x}"));
                b
            }
        };
        let got = self.new_reg(Class::B32);
        self.ins(format!(
            "shfl.sync.idx.b32 {got}, {bits}, {lane}, 31, 0xffffffff"
        ));
        match x.class {
            Class::B32 => got,
            Class::F32 => {
                let f = self.new_reg(Class::F32);
                self.ins(format!("mov.b32 {f}, {got}"));
                f
            }
            _ => {
                let h = self.new_reg(Class::B16);
                self.ins(format!("cvt.u16.u32 {h}, {got}"));
                h
            }
        }
    }

    /// What addressing the elements of an access needs, computed once: see
    /// [`Addressing`]; [`Emitter::address`] then addresses one register's element.
    #[allow(clippy::too_many_arguments)]
    fn addressing(
        &mut self,
        id: OpId,
        tensor: usize,
        access: &Access,
        addr: &[ValueId],
        mask: Option<ValueId>,
        d: &Distribution,
        owner: Option<(Reg, Option<Reg>)>,
    ) -> Result<Addressing, CodegenError> {
        let (ptr, dims, strides) = match self.params.get(tensor) {
            Some(ParamRegs::Tensor {
                ptr, dims, strides, ..
            }) => (*ptr, dims.clone(), strides.clone()),
            _ => return Err(self.internal(id, "not a tensor parameter")),
        };
        let esize = self.k.params[tensor].dtype().size_bytes();
        let rank = dims.len();
        let tile_rank = d.terms.len();
        // The coordinates that do not vary over the tile: one address and predicate.
        let mut base = ptr;
        let mut fixed_ok: Option<Reg> = owner.map(|(o, _)| o);
        // Per tile dimension addressed by a coordinate: the thread's first coordinate.
        let mut starts: BTreeMap<usize, Reg> = BTreeMap::new();
        for (dim, (a, &v)) in access.dims.iter().zip(addr).enumerate() {
            if *a != Addr::Coord {
                continue;
            }
            let c = self.scalar(v, id)?;
            match kiln_ir::access::tile_dim(dim, rank, tile_rank) {
                Some(t) => {
                    let tc = self.thread_coord(&d.terms[t]);
                    let s = self.new_reg(Class::B32);
                    self.ins(format!("add.s32 {s}, {c}, {tc}"));
                    starts.insert(dim, s);
                }
                None => {
                    let ok = self.setp("lt.u32", c, dims[dim]);
                    base = self.add_scaled(base, c, strides[dim], esize);
                    fixed_ok = Some(self.and(ok, fixed_ok));
                }
            }
        }
        Ok(Addressing {
            id,
            dims_of: access.dims.clone(),
            addr: addr.to_vec(),
            mask,
            dims,
            strides,
            esize,
            tile_rank,
            base,
            fixed_ok,
            starts,
            along: BTreeMap::new(),
            inner_ok: BTreeMap::new(),
            inner_off: None,
            rows: BTreeMap::new(),
            indexed: BTreeMap::new(),
        })
    }

    /// The element at register offsets `offs`: its address and whether it is accessed.
    /// Written just before its access, so that only the registers of the rows in use live
    /// (across an atomic's compare-and-swap loops too).
    fn address(&mut self, ad: &mut Addressing, offs: &[u32]) -> Result<Element, CodegenError> {
        let (id, esize, rank) = (ad.id, ad.esize, ad.dims.len());
        // The contiguous dimension (stride 1, checked at launch) contributes its offset as
        // an immediate, so only its predicate depends on the register.
        let inner = rank.checked_sub(1);
        let mut parts: Vec<Reg> = Vec::new();
        // What the address combines, to share it between elements.
        let mut key: Vec<Part> = Vec::new();
        let mut imm = 0;
        let mut on = ad.fixed_ok;
        for dim in 0..rank {
            let (kind, v) = (ad.dims_of[dim], ad.addr[dim]);
            let (extent, stride) = (ad.dims[dim], ad.strides[dim]);
            let (off, ok) = match (kind, ad.starts.get(&dim).copied()) {
                (Addr::Coord, Some(s)) => {
                    let t = kiln_ir::access::tile_dim(dim, rank, ad.tile_rank)
                        .ok_or_else(|| self.internal(id, "a tile dimension out of range"))?;
                    if Some(dim) == inner {
                        imm = offs[t] * esize as u32;
                        let ok = match ad.inner_ok.get(&offs[t]) {
                            Some(&p) => p,
                            None => {
                                let c = self.new_reg(Class::B32);
                                self.ins(format!("add.s32 {c}, {s}, {}", offs[t]));
                                let p = self.setp("lt.u32", c, extent);
                                ad.inner_ok.insert(offs[t], p);
                                p
                            }
                        };
                        let off = match ad.inner_off {
                            Some(o) => o,
                            None => {
                                let (o, _) = self.coordinate(s, extent, stride, esize);
                                ad.inner_off = Some(o);
                                o
                            }
                        };
                        (off, ok)
                    } else {
                        key.push(Part::Off(offs[t]));
                        match ad.along.get(&(dim, offs[t])) {
                            Some(&hit) => hit,
                            None => {
                                let c = self.new_reg(Class::B32);
                                self.ins(format!("add.s32 {c}, {s}, {}", offs[t]));
                                let entry = self.coordinate(c, extent, stride, esize);
                                ad.along.insert((dim, offs[t]), entry);
                                entry
                            }
                        }
                    }
                }
                (Addr::Coord, None) => continue,
                (Addr::Index, _) => {
                    let c = self.elem(v, offs, id)?;
                    key.push(Part::Index(c));
                    match ad.indexed.get(&(dim, c)) {
                        Some(&hit) => hit,
                        None => {
                            let entry = self.coordinate(c, extent, stride, esize);
                            ad.indexed.insert((dim, c), entry);
                            entry
                        }
                    }
                }
            };
            parts.push(off);
            on = Some(self.and(ok, on));
        }
        let cached = ad.rows.get(&key).copied();
        let a = match cached {
            Some(a) => a,
            None => {
                let mut a = ad.base;
                for off in parts {
                    let next = self.new_reg(Class::B64);
                    self.ins(format!("add.s64 {next}, {a}, {off}"));
                    a = next;
                }
                ad.rows.insert(key, a);
                a
            }
        };
        if let Some(m) = ad.mask {
            let m = self.elem(m, offs, id)?;
            on = Some(self.and(m, on));
        }
        let on = match on {
            Some(p) => p,
            None => {
                let p = self.new_reg(Class::Pred);
                self.ins(format!("setp.eq.u32 {p}, 0, 0"));
                p
            }
        };
        Ok(Element { addr: a, imm, on })
    }

    /// A coordinate's byte offset (`c * stride * esize`, `.b64`) and whether it is inside
    /// `extent`.
    fn coordinate(&mut self, c: Reg, extent: Reg, stride: Reg, esize: usize) -> (Reg, Reg) {
        let ok = self.setp("lt.u32", c, extent);
        let c64 = self.new_reg(Class::B64);
        self.ins(format!("cvt.s64.s32 {c64}, {c}"));
        let off = self.new_reg(Class::B64);
        self.ins(format!("mul.lo.s64 {off}, {c64}, {stride}"));
        self.ins(format!("mul.lo.s64 {off}, {off}, {esize}"));
        (off, ok)
    }

    /// `base + c * stride * esize` (`.b64`).
    fn add_scaled(&mut self, base: Reg, c: Reg, stride: Reg, esize: usize) -> Reg {
        let c64 = self.new_reg(Class::B64);
        self.ins(format!("cvt.s64.s32 {c64}, {c}"));
        let off = self.new_reg(Class::B64);
        self.ins(format!("mul.lo.s64 {off}, {c64}, {stride}"));
        let nb = self.new_reg(Class::B64);
        self.ins(format!("mad.lo.s64 {nb}, {off}, {esize}, {base}"));
        nb
    }

    /// `p && q` (just `p` without `q`), in a fresh predicate.
    pub(super) fn and(&mut self, p: Reg, q: Option<Reg>) -> Reg {
        let r = self.new_reg(Class::Pred);
        match q {
            Some(q) => self.ins(format!("and.pred {r}, {p}, {q}")),
            None => self.mov(r, p),
        }
        r
    }

    /// The packed type (`noftz.bf16x2`, `noftz.f16x2`) when a 16-bit float add's registers
    /// come in pairs of adjacent, 4-byte aligned elements: the tensor is 16-byte aligned,
    /// the tile's first column even, and each register pair holds columns `2j, 2j + 1` of
    /// one row, so one packed atomic serves both.
    #[allow(clippy::too_many_arguments)]
    fn packed_pairs(
        &self,
        tensor: usize,
        access: &Access,
        addr: &[ValueId],
        d: &Distribution,
        op: AtomicOp,
        form: AtomicForm,
    ) -> Option<&'static str> {
        let x2 = match (form, op, self.k.params[tensor].dtype(), self.target) {
            (AtomicForm::Cas16, AtomicOp::Add, DType::F16, _) => "noftz.f16x2",
            (AtomicForm::Cas16, AtomicOp::Add, DType::Bf16, t) if t != Target::Sm80 => {
                "noftz.bf16x2"
            }
            _ => return None,
        };
        let rank = access.dims.len();
        let last = d.terms.len().checked_sub(1)?;
        let inner = rank.checked_sub(1)?;
        let inner_is_tile = kiln_ir::access::tile_dim(inner, rank, d.terms.len()) == Some(last);
        let pairs = d.regs.len().is_multiple_of(2)
            && d.terms[last].iter().all(|t| t.mul.is_multiple_of(2))
            && d.regs.chunks(2).all(|p| {
                p[0][..last] == p[1][..last]
                    && p[0][last].is_multiple_of(2)
                    && p[1][last] == p[0][last] + 1
            });
        (op == AtomicOp::Add
            && access.dims.get(inner) == Some(&Addr::Coord)
            && inner_is_tile
            && self.k.params[tensor].aligned16()
            && addr
                .get(inner)
                .is_some_and(|&c| self.known_multiple(c).is_multiple_of(2))
            && pairs)
            .then_some(x2)
    }

    /// Packed adds of adjacent element pairs when the thread accesses all its elements
    /// (every tile but the edges), else one add per accessed element; returns the old
    /// values. Two whole paths rather than a choice per pair: ptxas spilled on the mixture.
    #[allow(clippy::too_many_arguments)]
    fn atomic_pairs(
        &mut self,
        x2: &str,
        form: AtomicForm,
        (sem, scope): (MemSem, MemScope),
        dtype: DType,
        elements: &[Element],
        values: &[Reg],
        used: bool,
    ) -> Vec<Reg> {
        let all = self.new_reg(Class::Pred);
        self.ins(format!("setp.eq.u32 {all}, 0, 0"));
        for e in elements {
            self.ins(format!("and.pred {all}, {all}, {}", e.on));
        }
        let out: Vec<Reg> = elements.iter().map(|_| self.new_reg(Class::B16)).collect();
        let (singles, done) = (self.new_label(), self.new_label());
        self.ins(format!("@!{all} bra {singles}"));
        let ord = order(sem, scope);
        let red = !used && matches!(sem, MemSem::Relaxed | MemSem::Release);
        for (k, (e, v)) in elements.chunks(2).zip(values.chunks(2)).enumerate() {
            let packed = self.new_reg(Class::B32);
            self.ins(format!("mov.b32 {packed}, {{{}, {}}}", v[0], v[1]));
            if red {
                self.ins(format!(
                    "red{ord}.global.add.{x2} [{}], {packed}",
                    e[0].at()
                ));
            } else {
                let o = self.new_reg(Class::B32);
                self.ins(format!(
                    "atom{ord}.global.add.{x2} {o}, [{}], {packed}",
                    e[0].at()
                ));
                self.ins(format!(
                    "mov.b32 {{{}, {}}}, {o}",
                    out[2 * k],
                    out[2 * k + 1]
                ));
            }
        }
        self.ins(format!("bra {done}"));
        self.label(&singles);
        for (k, (e, &v)) in elements.iter().zip(values).enumerate() {
            let single =
                self.atomic_element(AtomicOp::Add, form, (sem, scope), dtype, e, v, None, used);
            self.mov(out[k], single);
        }
        self.label(&done);
        out
    }

    /// One atomic element: returns the register holding the value read (0 where skipped).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic_element(
        &mut self,
        op: AtomicOp,
        form: AtomicForm,
        (sem, scope): (MemSem, MemScope),
        dtype: DType,
        e: &Element,
        v: Reg,
        cmp: Option<Reg>,
        used: bool,
    ) -> Reg {
        let old = self.new_reg(Class::of(dtype));
        match old.class {
            Class::F32 => self.ins(format!("mov.f32 {old}, 0f00000000")),
            Class::B16 => self.ins(format!("mov.b16 {old}, 0")),
            _ => self.ins(format!("mov.b32 {old}, 0")),
        }
        let ord = order(sem, scope);
        let (on, addr) = (e.on, e.at());
        match form {
            AtomicForm::Native(ty) => {
                // `red` has no result and no acquire: it only serves relaxed or release
                // updates whose old values nobody reads.
                let red = !used
                    && matches!(sem, MemSem::Relaxed | MemSem::Release)
                    && matches!(op, AtomicOp::Add | AtomicOp::Max | AtomicOp::Min);
                let name = match op {
                    AtomicOp::Xchg => "exch",
                    other => other.name(),
                };
                if red {
                    self.ins(format!("@{on} red{ord}.global.{name}.{ty} [{addr}], {v}"));
                } else if let Some(c) = cmp {
                    self.ins(format!(
                        "@{on} atom{ord}.global.{name}.{ty} {old}, [{addr}], {c}, {v}"
                    ));
                } else {
                    self.ins(format!(
                        "@{on} atom{ord}.global.{name}.{ty} {old}, [{addr}], {v}"
                    ));
                }
            }
            AtomicForm::Cas32 => {
                let skip = self.new_label();
                self.ins(format!("@!{on} bra {skip}"));
                let cur = self.new_reg(Class::B32);
                self.ins(format!(
                    "ld.relaxed.{}.global.b32 {cur}, [{addr}]",
                    scope.name()
                ));
                let top = self.new_label();
                self.label(&top);
                let (f, n) = (self.new_reg(Class::F32), self.new_reg(Class::F32));
                self.ins(format!("mov.b32 {f}, {cur}"));
                self.ins(format!("{}.f32 {n}, {f}, {v}", op.name()));
                let new = self.new_reg(Class::B32);
                self.ins(format!("mov.b32 {new}, {n}"));
                self.cas_step(&ord, addr, cur, new, &top);
                self.ins(format!("mov.b32 {old}, {cur}"));
                self.label(&skip);
            }
            AtomicForm::Cas16 => {
                // A 16-bit compare-and-swap on the element itself: a wider word could reach
                // past the tensor's last element.
                let skip = self.new_label();
                self.ins(format!("@!{on} bra {skip}"));
                let addr = self.new_reg(Class::B64);
                self.ins(format!("add.s64 {addr}, {}, {}", e.addr, e.imm));
                let cur = self.new_reg(Class::B16);
                self.ins(format!(
                    "ld.relaxed.{}.global.b16 {cur}, [{addr}]",
                    scope.name()
                ));
                let vf = self.widen(v, dtype);
                let top = self.new_label();
                self.label(&top);
                let s = self.new_reg(Class::F32);
                let f = self.widen(cur, dtype);
                self.ins(format!("add.f32 {s}, {f}, {vf}"));
                let h = self.narrow(s, dtype);
                let prev = self.new_reg(Class::B16);
                self.ins(format!(
                    "atom{ord}.global.cas.b16 {prev}, [{addr}], {cur}, {h}"
                ));
                let retry = self.setp("ne.b16", prev, cur);
                self.ins(format!("mov.b16 {cur}, {prev}"));
                self.ins(format!("@{retry} bra {top}"));
                self.ins(format!("mov.b16 {old}, {cur}"));
                self.label(&skip);
            }
        }
        old
    }

    /// The end of a compare-and-swap loop: swaps `new` in where the word still holds
    /// `cur`, else retries from `top` with what it holds now (left in `cur`).
    fn cas_step(&mut self, ord: &str, addr: impl std::fmt::Display, cur: Reg, new: Reg, top: &str) {
        let prev = self.new_reg(Class::B32);
        self.ins(format!(
            "atom{ord}.global.cas.b32 {prev}, [{addr}], {cur}, {new}"
        ));
        let retry = self.setp("ne.b32", prev, cur);
        self.ins(format!("mov.b32 {cur}, {prev}"));
        self.ins(format!("@{retry} bra {top}"));
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::Shape;
    use kiln_ir::schedule::{Layout, Term};

    /// Every element of a tile is owned by exactly one of `threads` threads: the one whose
    /// index equals its layout digits in place ([`super::Emitter::owner`]).
    fn owners_are_unique(layout: &Layout, shape: &[usize], threads: u32) {
        let d = layout.distribution(&Shape(shape.to_vec())).unwrap();
        let digits: Vec<Term> = d
            .terms
            .iter()
            .flatten()
            .map(|t| Term {
                div: t.div,
                modulo: t.modulo,
                mul: t.div,
            })
            .collect();
        let mut owner = std::collections::BTreeMap::new();
        let mut holders = std::collections::BTreeMap::new();
        for tid in 0..threads {
            for c in d.coords(tid) {
                *holders.entry(c.clone()).or_insert(0) += 1;
                if Term::sum(&digits, tid) == tid {
                    assert!(owner.insert(c.clone(), tid).is_none(), "{c:?} owned twice");
                }
            }
        }
        let n: usize = shape.iter().product();
        assert_eq!(
            holders.len(),
            n,
            "{layout} over {shape:?}: every element held"
        );
        assert_eq!(
            owner.len(),
            n,
            "{layout} over {shape:?}: every element owned"
        );
    }

    #[test]
    fn replicated_layouts_have_one_owner_per_element() {
        let blocked = |spt, tpw, warps| Layout::Blocked {
            size_per_thread: spt,
            threads_per_warp: tpw,
            warps,
        };
        // A 256-element vector over 2 of 4 warps; 64 elements over half a warp.
        owners_are_unique(&blocked([1, 4], [1, 32], [1, 2]), &[256], 128);
        owners_are_unique(&blocked([1, 4], [1, 16], [1, 1]), &[64], 128);
        owners_are_unique(&blocked([1, 4], [8, 4], [4, 1]), &[32, 16], 128);
        // A row vector sliced out of an mma accumulator: four lanes and the column warps
        // hold each row.
        let acc = Layout::Mma { warps: [2, 2] };
        let rows = Layout::Slice {
            dim: 1,
            keep_dim: false,
            parent: Box::new(acc.clone()),
            parent_shape: Shape(vec![64, 64]),
        };
        owners_are_unique(&rows, &[64], 128);
        owners_are_unique(&acc, &[64, 64], 128);
    }
}
