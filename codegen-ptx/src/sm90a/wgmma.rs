//! `mma` inside a ring's body as `wgmma.mma_async.m64nNk16` with shared-memory descriptors
//! (docs/ptx.md §4). Each consumer warpgroup `g` computes rows `64 g .. 64 g + 63` of the
//! accumulator, whose `#mma(num_warps x 1)` layout is exactly the wgmma accumulator layout of
//! each warpgroup (row `16 w + l / 4 + 8 v1`, column `8 v2 + 2 (l % 4) + v0` for register
//! `4 v2 + 2 v1 + v0`), so the registers are passed in layout order.
//! How each operand's descriptor walks its stage: [`RingBody`].

use kiln_ir::passes::pipeline::overlaps;
use kiln_ir::sched::Sched;
use kiln_ir::sched::tma::TmaLoad;
use kiln_ir::schedule::{Layout, StagedOperand};
use kiln_ir::{Kernel, OpId};

use super::descriptor::{Walk, advance_descriptor};
use crate::emit::{Emitter, InFlight, StageSync, Val};
use crate::error::CodegenError;
use crate::sched::{self, RingMma};
use crate::types::{Class, Reg, half_ty};
use kiln_ir::sched::RoleKind;

/// The ring loop's body as its wgmmas read it: the loads whose stages they read, and whether
/// each is committed where it is issued and waited for where needed.
///
/// A is K-major: box `c` of the stage holds columns `chunk c ..` of every row (`chunk` = 64,
/// 32 or 16, [`kiln_ir::sched::tma::box_columns`]), rows of `swizzle = 2 chunk` bytes; warpgroup
/// `g` starts `64 g` rows in, SBO = 8 rows, and each k16 step moves the start address by 32
/// bytes inside a box. B stored `[K, N]` is MN-major: one box of `BK` rows x `chunk` columns
/// per `chunk` columns of N, swizzled by its `span = 2 chunk`-byte rows (128 B for N a
/// multiple of 64; 96 takes three 64-B boxes), LBO = the box stride, SBO = 8 K-rows
/// (`8 span`), each k16 step is 16 rows (`16 span` bytes), and `imm-trans-b = 1`. B
/// stored `[N, K]` (the body's `y.t()`) is K-major exactly like A, all `BN` rows in one
/// descriptor, and `imm-trans-b = 0`. A read as the transposed view of a staged or once
/// load (`x.t()`, attention backward's `dS^T` as `dQ`'s A) is MN-major, walked like an
/// MN-major B with `imm-trans-a = 1`. A register A (attention's `P`, in the accumulator
/// layout) is packed into the RS form's four bf16-pair registers per k16 step, the same
/// fragment `mma.sync` takes. A register operand the consumers stage (`StagedOperand`: a
/// B, or a transposed A or B) is read from its one swizzled buffer after the ring, MN- or
/// K-major as it is viewed, by the same descriptor walk ([`Walk`]).
#[derive(Clone, Debug)]
pub(crate) struct RingBody {
    /// Every TMA load of the schedule (ring and once loads).
    loads: Vec<TmaLoad>,
    /// Whether each wgmma is committed where it is issued and waited for where the body
    /// needs it: in an unrotated body that reads its products (not the GEMM mainloop,
    /// [`overlaps`]). A rotated loop's program commits and waits itself.
    inline_wait: bool,
}

impl RingBody {
    /// The body of `s`'s ring loop, `unrotated` or not.
    pub(crate) fn new(k: &Kernel, s: &Sched, unrotated: bool) -> RingBody {
        RingBody {
            loads: s.loads.iter().map(|(_, l)| l.tma.clone()).collect(),
            inline_wait: unrotated && !overlaps(k, s.for_op),
        }
    }

    /// Whether the body commits every wgmma group it issues (and, drained at its end,
    /// leaves none for the program's own commit and wait).
    pub(crate) fn commits_inline(&self) -> bool {
        self.inline_wait
    }
}

impl RingMma for Option<RingBody> {
    fn mma(
        &mut self,
        e: &mut Emitter<'_>,
        warpgroup: Option<Reg>,
        id: OpId,
    ) -> Result<bool, CodegenError> {
        match self {
            Some(body) => write(e, body, warpgroup, id).map(|()| true),
            None => Ok(false),
        }
    }
}

/// The wgmma view of one mma's shared operands: K and N of the product and how each
/// descriptor walks its stage or buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    /// K and N.
    bk: u32,
    bn: u32,
    /// B's walk.
    b: Walk,
    /// A's, when A is in shared memory (`None`: A from registers, wgmma RS).
    a: Option<Walk>,
}

impl Geometry {
    /// B walked as `b` over its tile `[rows, cols]` as stored (`[N, K]` when K-major, else
    /// `[K, N]`), A as `a`.
    fn new(a: Option<Walk>, b: Walk, [rows, cols]: [u32; 2]) -> Geometry {
        let (bk, bn) = if b.k_major {
            (cols, rows)
        } else {
            (rows, cols)
        };
        Geometry { bk, bn, b, a }
    }

    /// Byte offset, from B's base, of the column block of `block` columns that starts at
    /// column `block` (N rows of a K-major B; a whole number of boxes of an MN-major one,
    /// else `None`); the next blocks lie at its multiples.
    fn b_block_offset(&self, block: u32) -> Option<u32> {
        (self.b.k_major || (2 * block).is_multiple_of(self.b.span)).then(|| self.b.start(block, 0))
    }
}

/// How one wgmma reads a shared operand: its base, its walk, and its tile `[rows, cols]`
/// as stored.
type SharedOperand = (Reg, Walk, [u32; 2]);

/// How the wgmma at `id` reads operand `v` (`b_side`: B, else A) held as `val`: from a ring
/// or once load's stage, or from the buffer the consumers staged it in (`staged`); `None`
/// for an A in registers. A stored untransposed is K-major, B MN-major; their transposed
/// views the other. A tile several operands read is one load (its boxes are the same
/// whatever reads them), so the orientation is this use's, not the load's.
fn shared_operand(
    e: &Emitter<'_>,
    ring: &RingBody,
    (v, val): (kiln_ir::ValueId, &Val),
    staged: Option<&StagedOperand>,
    id: OpId,
    b_side: bool,
) -> Result<Option<SharedOperand>, CodegenError> {
    let Val::Smem {
        base,
        buf,
        transposed,
    } = val
    else {
        return if b_side {
            Err(e.internal(id, "a wgmma B operand that is not in shared memory"))
        } else {
            Ok(None)
        };
    };
    let k_major = transposed == &b_side;
    if staged.is_some() {
        let walk = Walk::of(buf, k_major)
            .ok_or_else(|| e.internal(id, "a staged wgmma operand in an unswizzled buffer"))?;
        let dims = [buf.stage_bytes / buf.row_bytes, buf.row_bytes / 2];
        return Ok(Some((*base, walk, dims)));
    }
    let load = ring
        .loads
        .iter()
        .find(|l| l.load == buf.load)
        .ok_or_else(|| e.internal(id, format!("{} is outside the ring", e.value_words(id, v))))?;
    Ok(Some((
        *base,
        Walk::of_load(load, k_major),
        load.tile_dims(),
    )))
}

/// Writes `d = a @ b (+ c)` as one wgmma per k16 step and warpgroup, accumulating in
/// place (from zeros without `c`); A is a shared stage or buffer (SS) or the registers of an
/// accumulator-layout tile (RS, docs/ptx.md §4 "The RS A fragment"). Outside the GEMM mainloop
/// ([`overlaps`]) the wgmmas are committed here and stay in flight until an op needs them
/// ([`crate::emit::InFlight`]).
fn write(
    e: &mut Emitter<'_>,
    ring: &RingBody,
    warpgroup: Option<Reg>,
    id: OpId,
) -> Result<(), CodegenError> {
    let op = e.k.ops[id].clone();
    let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
    // Register operands the consumers stage (`pipeline::staged_operands`: A `t.t()`, B `t`
    // or `t.t()`) are written into their buffers here, between one pair of barriers of the
    // consumers alone.
    let staged_a = e.k.schedule.staged_as(a, 0).cloned();
    let staged_b = e.k.schedule.staged_as(b, 1).cloned();
    let staged: Vec<&StagedOperand> = staged_a.iter().chain(&staged_b).collect();
    let mut written = if staged.is_empty() {
        Vec::new()
    } else {
        if ring.inline_wait {
            for st in &staged {
                e.wgmma_before_staging(st.buffer.bytes());
            }
        }
        let sync = consumers_sync(e, id)?;
        e.stage_operands_among(id, &staged, sync)?
    }
    .into_iter();
    let mut form = |e: &Emitter<'_>, v, is_staged: bool| match is_staged {
        true => written
            .next()
            .ok_or_else(|| e.internal(id, "a staged wgmma operand not written")),
        false => e.val(v, id),
    };
    let a_val = form(e, a, staged_a.is_some())?;
    let b_val = form(e, b, staged_b.is_some())?;
    let (b_base, b_walk, b_dims) =
        shared_operand(e, ring, (b, &b_val), staged_b.as_ref(), id, true)?
            .ok_or_else(|| e.internal(id, "a wgmma B operand that is not in shared memory"))?;
    let a_smem = shared_operand(e, ring, (a, &a_val), staged_a.as_ref(), id, false)?;
    let g = Geometry::new(a_smem.map(|(_, w, _)| w), b_walk, b_dims);
    // A's K: the columns of a K-major A, the rows of an MN-major one.
    if let Some((_, walk, [rows, cols])) = a_smem
        && (if walk.k_major { cols } else { rows }) != g.bk
    {
        return Err(e.internal(id, "wgmma A and B of different K"));
    }
    // Consumers split a tile of fewer rows than they have into column blocks
    // (`Layout::WgmmaColumns`): warpgroup `wg` computes rows `64 (wg / blocks) ..`, columns
    // `bn (wg % blocks) ..`, each block its own `m64n{bn}` wgmma over all of K.
    let col_blocks = match e.k.schedule.layouts.get(&r) {
        Some(Layout::WgmmaColumns { col_blocks }) => *col_blocks,
        _ => 1,
    };
    let bn = g.bn / col_blocks;
    let b_block_bytes = g
        .b_block_offset(bn)
        .filter(|_| bn * col_blocks == g.bn)
        .ok_or_else(|| e.internal(id, "a wgmma column block that starts inside a B box"))?;
    let Some(elem) = half_ty(e.k.ty(a).dtype()) else {
        return Err(e.internal(id, "wgmma operands must be bf16 or f16"));
    };
    // Without `c` the first k16 step ignores the accumulator (scale-d = 0), so its
    // registers need no zeroing.
    let zero_init = op.operands.get(2).is_none();
    let acc = match op.operands.get(2) {
        Some(&c) => {
            let mut acc = e.tile(c, id)?;
            let distinct = acc.iter().collect::<std::collections::BTreeSet<_>>().len() == acc.len();
            if !(e.dies_here(c, id) && distinct) {
                let fresh: Vec<Reg> = acc.iter().map(|_| e.new_reg(Class::F32)).collect();
                for (d, s) in fresh.iter().zip(&acc) {
                    e.mov(*d, *s);
                }
                acc = fresh;
            }
            acc
        }
        None => (0..bn / 2).map(|_| e.new_reg(Class::F32)).collect(),
    };
    if acc.len() as u32 != bn / 2 {
        return Err(e.internal(id, "accumulator registers do not match m64nNk16"));
    }
    // Warp-uniform: the warpgroup's row block (its first rows of A) and column block (its
    // first columns of B).
    let (wg_rows, wg_cols) = match (warpgroup, col_blocks) {
        (Some(wg), 1) => (Some(wg), None),
        (Some(wg), blocks) => {
            let (rows, cols) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
            e.ins(format!("div.u32 {rows}, {wg}, {blocks}"));
            e.ins(format!("rem.u32 {cols}, {wg}, {blocks}"));
            (Some(rows), Some(cols))
        }
        (None, _) => (None, None),
    };
    let da = match a_smem {
        Some((a_base, walk, _)) => {
            // Warp-uniform: the warpgroup's 64 rows (K-major) or columns (MN-major) of A.
            let wg = wg_rows.ok_or_else(|| e.internal(id, "a wgmma outside the consumers"))?;
            let a_addr = e.new_reg(Class::B32);
            e.ins(format!(
                "mad.lo.u32 {a_addr}, {wg}, {}, {a_base}",
                walk.start(64, 0)
            ));
            let desc = sched::descriptor(e, a_addr, walk.template());
            Some((desc, walk))
        }
        None if col_blocks > 1 => {
            return Err(e.internal(id, "a register A operand of a wgmma split in columns"));
        }
        None => {
            check_register_a(e, a, id)?;
            None
        }
    };
    let b_addr = match wg_cols {
        Some(cols) => {
            let addr = e.new_reg(Class::B32);
            e.ins(format!(
                "mad.lo.u32 {addr}, {cols}, {b_block_bytes}, {b_base}"
            ));
            addr
        }
        None => b_base,
    };
    let db = sched::descriptor(e, b_addr, g.b.template());
    // RS: the A fragments of every k16 step, packed before the fence.
    let a_frags = match da {
        Some(_) => Vec::new(),
        None => (0..g.bk / 16)
            .map(|s| e.pack_a_fragment(id, &a_val, g.bk / 8, 0, s))
            .collect::<Result<Vec<_>, _>>()?,
    };
    e.ins("wgmma.fence.sync.aligned");
    let regs: Vec<String> = acc.iter().map(Reg::to_string).collect();
    let regs = regs.join(", ");
    let trans_b = u32::from(!g.b.k_major);
    let shape = format!("m64n{bn}k16.f32.{elem}.{elem}");
    for s in 0..g.bk / 16 {
        let scale_d = u32::from(!(zero_init && s == 0));
        // Only the start address moves (base offset stays 0, docs/ptx.md §4).
        let dbs = advance_descriptor(e, db, g.b.start(0, s) >> 4);
        match (da, a_frags.get(s as usize)) {
            (Some((da, walk)), _) => {
                let trans_a = u32::from(!walk.k_major);
                let das = advance_descriptor(e, da, walk.start(0, s) >> 4);
                e.ins(format!(
                    "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, {das}, {dbs}, {scale_d}, \
                         1, 1, {trans_a}, {trans_b}"
                ));
            }
            (None, Some([a0, a1, a2, a3])) => e.ins(format!(
                "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, {{{a0}, {a1}, {a2}, {a3}}}, \
                     {dbs}, {scale_d}, 1, 1, {trans_b}"
            )),
            (None, None) => return Err(e.internal(id, "a k16 step without A fragments")),
        }
    }
    if ring.inline_wait {
        // Waited for where something needs it (`Emitter::wgmma_before`).
        e.ins("wgmma.commit_group.sync.aligned");
        let mut values = vec![r];
        values.extend(op.operands.get(2).copied());
        if matches!(a_val, Val::Tile(_)) {
            // RS: the A fragment's registers stay the wgmma's until it completes.
            values.push(a);
        }
        e.wgmma_in_flight(InFlight {
            values,
            staged: staged.iter().map(|st| st.buffer.bytes()).collect(),
        });
    }
    e.vals.insert(r, Val::Tile(acc));
    Ok(())
}

/// The barrier the consumer warpgroups alone meet at around a staging write: the first
/// named barrier id the schedule leaves free, with every consumer thread.
fn consumers_sync(e: &Emitter<'_>, id: OpId) -> Result<StageSync, CodegenError> {
    let s = e.k.schedule.sched.as_ref();
    let consumers = s.and_then(|s| s.role(RoleKind::Consumer));
    match (s, consumers) {
        (Some(s), Some(c)) => Ok(StageSync::Consumers {
            id: s.free_named_barrier(),
            threads: 32 * c.warps,
        }),
        _ => Err(e.internal(id, "a staged wgmma operand outside a ring's consumers")),
    }
}

/// A register A operand must be in the wgmma accumulator layout: 16 rows per warp.
fn check_register_a(e: &Emitter<'_>, a: kiln_ir::ValueId, id: OpId) -> Result<(), CodegenError> {
    let warps = e.k.options.num_warps;
    match e.k.schedule.layouts.get(&a) {
        Some(Layout::Mma { warps: w }) if *w == [warps, 1] => Ok(()),
        _ => Err(e.internal(
            id,
            "a register wgmma A operand not in the accumulator layout",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::Geometry;
    use crate::sm90a::descriptor::{Walk, template};
    use kiln_ir::OpId;
    use kiln_ir::sched::tma::{Operand, TmaLoad};

    /// The loads the `pipeline` pass plans for a `bm x bk` A and a `bk x bn` B tile, B
    /// stored `[N, K]` when `b_k_major`.
    fn loads(bm: u32, bn: u32, bk: u32, b_k_major: bool) -> (TmaLoad, TmaLoad) {
        let (a, b) = (OpId::from_index(0), OpId::from_index(1));
        let b = if b_k_major {
            TmaLoad::new(b, 1, Operand::KMajorB, bn, bk)
        } else {
            TmaLoad::new(b, 1, Operand::MnMajorB, bk, bn)
        };
        (TmaLoad::new(a, 0, Operand::KMajorA, bm, bk), b)
    }

    /// The geometry of a wgmma reading `a` K-major and `b` as stored.
    fn geometry(a: Option<&TmaLoad>, b: &TmaLoad) -> Geometry {
        let walk = Walk::of_load(b, b.operand == Operand::KMajorB);
        Geometry::new(a.map(|a| Walk::of_load(a, true)), walk, b.tile_dims())
    }

    /// Where TMA puts tile element `(r, c)` before swizzling: its box's offset plus the
    /// row-major position inside the box (rows of the box's inner extent).
    fn tma_offset(l: &TmaLoad, r: u32, c: u32) -> u32 {
        let b = l
            .boxes
            .iter()
            .find(|b| {
                (b.origin[0]..b.origin[0] + l.box_dims[0]).contains(&r)
                    && (b.origin[1]..b.origin[1] + l.box_dims[1]).contains(&c)
            })
            .expect("every element is in a box");
        b.smem_offset + (r - b.origin[0]) * l.box_dims[1] * 2 + (c - b.origin[1]) * 2
    }

    /// The swizzle pattern both TMA and wgmma apply to absolute shared addresses (16-byte
    /// chunk bits `[4, 4 + b)` XOR row bits `[7, 7 + b)`, `b = log2(span / 16)`); stages are
    /// 1024-aligned, so offsets from the stage base swizzle alike.
    fn swizzle(addr: u32, span: u32) -> u32 {
        let bits = (span / 16).trailing_zeros();
        let mask = ((1 << bits) - 1) << 4;
        addr ^ ((addr >> 3) & mask)
    }

    /// The PTX ISA's canonical layouts, as descriptors address them (before swizzling):
    /// K-major (8-row groups SBO apart, rows of the swizzle span; A, or B by its rows `n`),
    /// B MN-major (chunks of `span / 2` columns LBO apart, 8-K-row groups SBO apart, rows of
    /// the swizzle span: CUTLASS's `((T, span / 16, m), (8, k)) : ((1, T, LBO), (span / 2,
    /// SBO))` in elements, `T = 8`).
    fn wgmma_k_major(start: u32, (_, sbo, span): (u32, u32, u32), m: u32, k: u32) -> u32 {
        start + (m / 8) * sbo + (m % 8) * span + k * 2
    }
    fn wgmma_mn_major(start: u32, (lbo, sbo, span): (u32, u32, u32), k: u32, n: u32) -> u32 {
        let t = span / 2;
        start + (n / t) * lbo + (k / 8) * sbo + (k % 8) * span + (n % t) * 2
    }

    /// Every element every wgmma of every warpgroup reads is the one TMA wrote there, for
    /// every tile shape the pipeline pass accepts and both B layouts.
    #[test]
    fn wgmma_reads_what_tma_wrote() {
        for b_k_major in [false, true] {
            for (bm, bn, bk) in [
                (128, 128, 16),
                (128, 128, 32),
                (128, 128, 64),
                (128, 256, 64),
                (128, 64, 128),
                (128, 192, 32),
                // Multiples of 32 that are not powers of two: head dim 96 as K (three 64-B
                // K-major boxes) and as an MN-major N (three 64-B boxes), 192 rows.
                (128, 96, 96),
                (64, 96, 128),
                (192, 128, 96),
                (128, 160, 64),
                (128, 48, 16),
            ] {
                let (a, b) = loads(bm, bn, bk, b_k_major);
                let g = geometry(Some(&a), &b);
                let av = g.a.expect("A in shared memory");
                assert_eq!((a.tile_dims(), g.bk, g.bn), ([bm, bk], bk, bn));
                let shape = format!("{bm}x{bn}x{bk} B K-major {b_k_major}");
                for s in 0..bk / 16 {
                    for wg in 0..bm / 64 {
                        let start = av.start(64 * wg, s);
                        for m in 0..64 {
                            for k in 0..16 {
                                let read =
                                    swizzle(wgmma_k_major(start, av.fields(), m, k), a.swizzle);
                                let wrote =
                                    swizzle(tma_offset(&a, 64 * wg + m, 16 * s + k), a.swizzle);
                                assert_eq!(read, wrote, "A {shape}: wg {wg} k-step {s} ({m},{k})");
                            }
                        }
                    }
                    for k in 0..16 {
                        for n in 0..bn {
                            let (read, wrote) = if b_k_major {
                                (
                                    wgmma_k_major(g.b.start(0, s), g.b.fields(), n, k),
                                    tma_offset(&b, n, 16 * s + k),
                                )
                            } else {
                                (
                                    wgmma_mn_major(g.b.start(0, s), g.b.fields(), k, n),
                                    tma_offset(&b, 16 * s + k, n),
                                )
                            };
                            let (read, wrote) =
                                (swizzle(read, b.swizzle), swizzle(wrote, b.swizzle));
                            assert_eq!(read, wrote, "B {shape}: k-step {s} ({k},{n})");
                        }
                    }
                }
            }
        }
    }

    /// An A read transposed from its load (`k.t()`, stored `[K, M]`: MN-major, as attention
    /// backward's `dQ^T = K^T dS^T` reads K): every warpgroup's 64 columns of M at every k16
    /// step are the elements TMA wrote, for 64- and 128-byte boxes.
    #[test]
    fn a_transposed_load_reads_mn_major_what_tma_wrote() {
        for (bk, bm) in [(128, 128), (64, 128), (128, 64), (96, 192), (64, 96)] {
            let a = TmaLoad::new(OpId::from_index(0), 0, Operand::MnMajorA, bk, bm);
            let walk = Walk::of_load(&a, false);
            let groups = if bm % 64 == 0 { bm / 64 } else { 1 };
            for wg in 0..groups {
                for s in 0..bk / 16 {
                    let start = walk.start(64 * wg, 0) + walk.start(0, s);
                    for m in 0..64.min(bm) {
                        for k in 0..16 {
                            let read = wgmma_mn_major(start, walk.fields(), k, m);
                            let wrote = tma_offset(&a, 16 * s + k, 64 * wg + m);
                            assert_eq!(
                                swizzle(read, a.swizzle),
                                swizzle(wrote, a.swizzle),
                                "{bk}x{bm}: wg {wg} k-step {s} ({m},{k})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A tile split into column blocks over the consumer warpgroups (`WgmmaColumns`): each
    /// block's wgmma, its descriptor started `b_block_offset` bytes on per block, reads the
    /// B elements of its own columns that TMA wrote, both B layouts; a block that starts
    /// inside an MN-major box is refused.
    #[test]
    fn column_blocks_read_their_own_columns_of_b() {
        for b_k_major in [false, true] {
            for (bn, bk, blocks) in [(128, 64, 2), (256, 64, 2), (256, 128, 4), (128, 128, 2)] {
                let (_, b) = loads(64, bn, bk, b_k_major);
                let g = geometry(None, &b);
                let block = bn / blocks;
                let step = g.b_block_offset(block).expect("whole boxes");
                for c in 0..blocks {
                    for s in 0..bk / 16 {
                        let start = c * step + g.b.start(0, s);
                        for k in 0..16 {
                            for n in 0..block {
                                let col = c * block + n;
                                let (read, wrote) = if b_k_major {
                                    (
                                        wgmma_k_major(start, g.b.fields(), n, k),
                                        tma_offset(&b, col, 16 * s + k),
                                    )
                                } else {
                                    (
                                        wgmma_mn_major(start, g.b.fields(), k, n),
                                        tma_offset(&b, 16 * s + k, col),
                                    )
                                };
                                assert_eq!(
                                    swizzle(read, b.swizzle),
                                    swizzle(wrote, b.swizzle),
                                    "{bn}x{bk} / {blocks} K-major {b_k_major}: block {c} \
                                     k-step {s} ({k},{n})"
                                );
                            }
                        }
                    }
                }
            }
        }
        // 96 columns are three 32-column boxes: a block of 48 starts inside one.
        let (_, b) = loads(64, 96, 64, false);
        assert_eq!(geometry(None, &b).b_block_offset(48), None);
    }

    /// The descriptor constants of docs/ptx.md §4, as run on an H200.
    #[test]
    fn templates_match_the_verified_descriptors() {
        // K-major SW128 bf16: LBO field 1, SBO 1024, swizzle 1.
        assert_eq!(template(16, 1024, 128), 0x4000_0040_0001_0000);
        // MN-major SW128, N = 128 as two boxes of Ktile = 64 rows: LBO 8192, SBO 1024.
        assert_eq!(template(64 * 128, 1024, 128), 0x4000_0040_0200_0000);
        // K-major SW64 (BK = 32): SBO = 8 rows of 64 B, swizzle 2.
        assert_eq!(template(16, 512, 64), 0x8000_0020_0001_0000);
    }
}
