//! TMA loads (`cp.async.bulk.tensor`): a load's boxes into its stage (or once buffer),
//! completing on its barrier; in a cluster the shared load's boxes multicast (sm_90a) or
//! split between the pair of one 2-SM mma (sm_100a).

use std::collections::BTreeMap;

use kiln_ir::sched::LoadId;
use kiln_ir::sched::tma::TmaLoad;

use super::barrier::{Cursor, cluster_rank};
use super::view::View;
use crate::emit::{Emitter, Lower};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

impl View<'_> {
    /// [`Op::Tma`](kiln_ir::sched::Op::Tma) of `load`: a ring load's boxes for the
    /// iteration whose induction variable is `iv` (its coordinates recomputed for that
    /// iteration, as `lower` writes the kernel's ops), a once load's at the coordinates
    /// written before the loop.
    pub(crate) fn tma(
        &self,
        e: &mut Emitter<'_>,
        lower: &mut dyn Lower,
        load: LoadId,
        c: &Cursor,
        iv: Reg,
    ) -> Result<(), CodegenError> {
        if self.s.once(load) {
            return self.tma_once(e, load, c);
        }
        let id = self.for_op();
        let l = &self.s.loads[load];
        let body_iv = self.k.ops[id].regions[0].args[0];
        let mut memo = BTreeMap::new();
        let coords = self.k.ops[l.tma.load]
            .operands
            .iter()
            .map(|&v| e.remat(v, body_iv, iv, &mut memo, l.tma.load, lower))
            .collect::<Result<Vec<_>, _>>()?;
        let full = self.bar_addr(e, l.barrier, c.stage)?;
        let stage = e.new_reg(Class::B32);
        e.ins(format!(
            "mad.lo.u32 {stage}, {}, {}, {}",
            c.stage, l.tma.stage_stride, e.smem
        ));
        let shared = self
            .s
            .cluster
            .as_ref()
            .is_some_and(|cl| self.ring_index(load) == Some(cl.shared));
        match &self.s.cluster {
            Some(cl) if let Some(p) = cl.pair => {
                // The 2-SM form: the CTA's own tile (of the shared load, its half) completes
                // on the leader's `full` (`.cta_group::2` may signal the peer CTA's barrier).
                let rank = cluster_rank(e);
                let leader_full = e.new_reg(Class::B32);
                e.ins(format!(
                    "mapa.shared::cluster.u32 {leader_full}, {full}, {}",
                    p.leader
                ));
                let mut coords = coords;
                if shared {
                    let n = coords.len();
                    for (k, &h) in p.half.iter().enumerate() {
                        if h != 0 {
                            let shifted = e.new_reg(Class::B32);
                            e.ins(format!(
                                "mad.lo.s32 {shifted}, {rank}, {h}, {}",
                                coords[n - 2 + k]
                            ));
                            coords[n - 2 + k] = shifted;
                        }
                    }
                }
                boxes(e, &l.tma, &coords, stage, leader_full, &[], ".cta_group::2")
            }
            Some(cl) if shared => {
                // Every CTA runs the same code; each box is issued where the rank is its
                // issuer's, into the stages of its mask's CTAs.
                let rank = cluster_rank(e);
                let cast = cl
                    .multicast
                    .iter()
                    .map(|m| {
                        let (p, mask) = (e.setp("eq.u32", rank, m.issuer), e.new_reg(Class::B16));
                        e.ins(format!("mov.b16 {mask}, {}", m.mask));
                        (p, mask)
                    })
                    .collect::<Vec<_>>();
                boxes(e, &l.tma, &coords, stage, full, &cast, "")
            }
            _ => boxes(e, &l.tma, &coords, stage, full, &[], ""),
        }
    }

    /// The TMA boxes of once load `load` (its coordinates are computed before the loop).
    fn tma_once(&self, e: &mut Emitter<'_>, load: LoadId, c: &Cursor) -> Result<(), CodegenError> {
        let l = &self.s.loads[load];
        let coords = self.k.ops[l.tma.load]
            .operands
            .iter()
            .map(|&v| e.scalar(v, l.tma.load))
            .collect::<Result<Vec<_>, _>>()?;
        let once = self.bar_addr(e, l.barrier, c.stage)?;
        let smem = e.smem;
        boxes(e, &l.tma, &coords, smem, once, &[], "")
    }
}

/// `cp.async.bulk.tensor` of every box of `l` into the stage at `stage` (`l.offset` is
/// added), the tile at `coords` (one per tensor dimension, outermost first), completing on
/// the barrier at `bar`. With `cast` (one `(predicate, ctaMask)` per box), box `b` is issued
/// under `cast[b].0` with `.multicast::cluster` into the CTAs of `cast[b].1`; `group`
/// qualifies every copy (`.cta_group::2` in the 2-SM form).
fn boxes(
    e: &mut Emitter<'_>,
    l: &TmaLoad,
    coords: &[Reg],
    stage: Reg,
    bar: Reg,
    cast: &[(Reg, Reg)],
    group: &str,
) -> Result<(), CodegenError> {
    if !cast.is_empty() && cast.len() != l.boxes.len() {
        return Err(e.internal(l.load, "a multicast plan that misses boxes"));
    }
    let map = e.tensor_map(l.param, l.load)?;
    let rank = l.lead_dims as usize + 2;
    let (lead, &[row, col]) = coords.split_at(coords.len().saturating_sub(2)) else {
        return Err(e.internal(l.load, "a TMA load with fewer than 2 coordinates"));
    };
    if coords.len() != rank {
        return Err(e.internal(l.load, "TMA coordinates that do not match the tensor map"));
    }
    for (k, b) in l.boxes.iter().enumerate() {
        let [dst, x, y] = e.new_regs(Class::B32);
        e.ins(format!(
            "add.u32 {dst}, {stage}, {}",
            l.offset + b.smem_offset
        ));
        e.ins(format!("add.s32 {x}, {col}, {}", b.origin[1]));
        e.ins(format!("add.s32 {y}, {row}, {}", b.origin[0]));
        // Innermost dimension first.
        let mut at = vec![x.to_string(), y.to_string()];
        at.extend(lead.iter().rev().map(Reg::to_string));
        let (guard, multicast, mask) = match cast.get(k) {
            Some((p, mask)) => (format!("@{p} "), ".multicast::cluster", format!(", {mask}")),
            None => (String::new(), "", String::new()),
        };
        e.ins(format!(
            "{guard}cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::\
             bytes{multicast}{group} [{dst}], [{map}, {{{}}}], [{bar}]{mask}",
            at.join(", ")
        ));
    }
    Ok(())
}

/// A shared-memory matrix descriptor (wgmma, tcgen05) of the matrix starting at shared
/// address `addr` with constant fields `template`.
pub(crate) fn descriptor(e: &mut Emitter<'_>, addr: Reg, template: u64) -> Reg {
    let d = e.new_reg(Class::B64);
    e.ins(format!("cvt.u64.u32 {d}, {addr}"));
    e.ins(format!("shr.u64 {d}, {d}, 4"));
    e.ins(format!("and.b64 {d}, {d}, 16383"));
    e.ins(format!("or.b64 {d}, {d}, 0x{template:016X}"));
    d
}

/// The shared address of a load's stage `stage` (`stride` bytes apart from `offset`).
pub(crate) fn stage_address(e: &mut Emitter<'_>, stage: Reg, stride: u32, offset: u32) -> Reg {
    let a = e.new_reg(Class::B32);
    e.ins(format!("mad.lo.u32 {a}, {stage}, {stride}, {}", e.smem));
    e.ins(format!("add.u32 {a}, {a}, {offset}"));
    a
}
