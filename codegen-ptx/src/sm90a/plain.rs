//! `mma` outside a ring as wgmma issued by every warpgroup of the block, in program order
//! (`kiln_ir::passes::wgmma_plain` chose which): `wgmma.mma_async.m64nNk16` per k16 step,
//! warpgroup `g` computing rows `64 g ..` of the `#mma(W x 1)` accumulator (16 rows a warp:
//! exactly wgmma's accumulator layout, so the registers pass in layout order and stay where a
//! loop carries them). The operands sit where the sm_80 lowering puts them: loads staged by
//! cp.async, register tiles staged by every thread (`stage_operand`; an A loaded before the
//! loop once, where it is loaded), or, for A, registers in the accumulator layout (the RS
//! form).

use kiln_ir::{OpId, ValueId};

use super::descriptor::{Walk, advance_descriptor};
use crate::emit::{Emitter, Lower, Val};
use crate::error::CodegenError;
use crate::sched;
use crate::types::{Class, Reg, half_ty};

/// The generic lowering, with the mmas the plan took written as wgmma.
pub(crate) struct Wgmma;

impl Lower for Wgmma {
    fn mma(&mut self, e: &mut Emitter<'_>, id: OpId) -> Result<bool, CodegenError> {
        if !e.k.schedule.wgmma.contains(&id) {
            return Ok(false);
        }
        write(e, id).map(|()| true)
    }
}

/// An operand as the wgmma reads it.
enum Source {
    /// A shared stage at `base`.
    Shared(Reg, Walk),
    /// A register A in the accumulator layout.
    Registers(Val),
}

/// The operand `v` (slot 0: A, 1: B) of mma `id`: staged first when the lowering staged it.
fn operand(e: &mut Emitter<'_>, id: OpId, v: ValueId, slot: usize) -> Result<Source, CodegenError> {
    let val = if let Some(st) = e.k.schedule.staged(v).cloned() {
        e.stage_operand(id, &st)?
    } else if let Some(st) = e.k.schedule.staged_at_source(v).cloned() {
        e.staged_buffer(&st)
    } else {
        e.in_registers(v, id)?
    };
    match val {
        Val::Smem {
            base,
            buf,
            transposed,
        } => {
            // A stored `[M, K]` is K-major; B is K-major when stored `[N, K]` (read
            // transposed).
            let k_major = transposed == (slot == 1);
            let walk = Walk::of(&buf, k_major)
                .ok_or_else(|| e.internal(id, "a wgmma operand in an unswizzled buffer"))?;
            Ok(Source::Shared(base, walk))
        }
        v if slot == 0 => Ok(Source::Registers(v)),
        _ => Err(e.internal(id, "a register wgmma B operand")),
    }
}

/// Writes `d = a @ b (+ c)` as wgmmas of every warpgroup, committed and waited for.
///
/// A shared operand is read by a swizzled descriptor straight from its buffer: a stage is
/// column boxes of `span` bytes (one box when the row is no wider), each box `rows x span`
/// with the chunks of row `r` XOR-swizzled by `r`, which is the canonical swizzled layout
/// (docs/ptx.md §4). Stored along K (A `[M, K]`, B `[N, K]` read as `k.t()`) it is K-major:
/// SBO = 8 rows, and k16 step `s` starts `32 s` bytes along the row (in box `32 s / span`).
/// Stored along M or N (B `[K, N]`, A `[K, M]` read as `p.t()`) it is MN-major with the
/// transpose bit: LBO = the box stride, SBO = 8 K-rows, k16 step `s` starting 16 rows down.
///
/// Every thread's stores into those buffers were fenced into the async proxy before the
/// barrier that published them (`async_proxy_fence`). The group is committed and waited for
/// here, before any other instruction touches the accumulator or a buffer is written again.
pub(crate) fn write(e: &mut Emitter<'_>, id: OpId) -> Result<(), CodegenError> {
    let op = e.k.ops[id].clone();
    let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
    let (Some(rs), Some(a_shape)) = (e.k.ty(r).shape().cloned(), e.k.ty(a).shape().cloned()) else {
        return Err(e.internal(id, "a scalar wgmma"));
    };
    let (m, n, k) = (rs.rows() as u32, rs.cols() as u32, a_shape.cols() as u32);
    let warps = e.k.options.num_warps;
    if m != 16 * warps || !warps.is_multiple_of(4) || !n.is_multiple_of(8) || n > 256 {
        return Err(e.internal(id, "a wgmma of a shape the plan does not take"));
    }
    let Some(elem) = half_ty(e.k.ty(a).dtype()) else {
        return Err(e.internal(id, "wgmma operands must be bf16 or f16"));
    };
    let acc: Vec<Reg> = match op.operands.get(2) {
        Some(&c) => {
            let regs = e.tile(c, id)?;
            let distinct =
                regs.iter().collect::<std::collections::BTreeSet<_>>().len() == regs.len();
            if e.dies_here(c, id) && distinct {
                regs
            } else {
                let fresh: Vec<Reg> = regs.iter().map(|_| e.new_reg(Class::F32)).collect();
                for (d, s) in fresh.iter().zip(&regs) {
                    e.mov(*d, *s);
                }
                fresh
            }
        }
        None => (0..n / 2).map(|_| e.new_reg(Class::F32)).collect(),
    };
    if acc.len() as u32 != n / 2 {
        return Err(e.internal(id, "accumulator registers do not match m64nNk16"));
    }
    let a_src = operand(e, id, a, 0)?;
    let Source::Shared(b_base, b_walk) = operand(e, id, b, 1)? else {
        return Err(e.internal(id, "a register wgmma B operand"));
    };
    let db = sched::descriptor(e, b_base, b_walk.template());
    let a_form = match &a_src {
        Source::Shared(a_base, a_walk) => {
            // The warpgroup's rows (K-major) or columns (MN-major) of A.
            let at = if warps > 4 {
                let (wg, at) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
                e.ins(format!("shr.u32 {wg}, {}, 7", e.tid));
                e.ins(format!(
                    "mad.lo.u32 {at}, {wg}, {}, {a_base}",
                    a_walk.start(64, 0)
                ));
                at
            } else {
                *a_base
            };
            AForm::Shared(sched::descriptor(e, at, a_walk.template()), *a_walk)
        }
        Source::Registers(v) => AForm::Registers(
            (0..k / 16)
                .map(|s| e.pack_a_fragment(id, v, k / 8, 0, s))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    e.ins("wgmma.fence.sync.aligned");
    let regs = acc
        .iter()
        .map(Reg::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let shape = format!("m64n{n}k16.f32.{elem}.{elem}");
    let trans_b = u32::from(!b_walk.k_major);
    let zero_init = op.operands.get(2).is_none();
    for s in 0..k / 16 {
        // Without `c` the first step ignores the accumulator's undefined registers.
        let scale_d = u32::from(!(zero_init && s == 0));
        let dbs = advance_descriptor(e, db, b_walk.start(0, s) >> 4);
        match &a_form {
            AForm::Shared(da, a_walk) => {
                let das = advance_descriptor(e, *da, a_walk.start(0, s) >> 4);
                let trans_a = u32::from(!a_walk.k_major);
                e.ins(format!(
                    "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, {das}, {dbs}, {scale_d}, \
                     1, 1, {trans_a}, {trans_b}"
                ));
            }
            AForm::Registers(frags) => {
                let [a0, a1, a2, a3] = frags[s as usize];
                e.ins(format!(
                    "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, {{{a0}, {a1}, {a2}, \
                     {a3}}}, {dbs}, {scale_d}, 1, 1, {trans_b}"
                ));
            }
        }
    }
    e.ins("wgmma.commit_group.sync.aligned");
    e.ins("wgmma.wait_group.sync.aligned 0");
    e.vals.insert(r, Val::Tile(acc));
    Ok(())
}

/// A in the form the instruction takes.
enum AForm {
    /// A descriptor of the warpgroup's A at k step 0.
    Shared(Reg, Walk),
    /// The packed fragments of every k16 step.
    Registers(Vec<[Reg; 4]>),
}
