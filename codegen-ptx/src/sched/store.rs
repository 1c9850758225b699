//! An epilogue `store` through a swizzled staging tile and TMA ([`TmaStore`], whose round
//! program gives the protocol), on sm_90a and sm_100a alike. The tile goes to the staging
//! tile as [`crate::emit::matrices`] writes one: as 8x8 matrices where it is laid out as an
//! mma accumulator, else a pair at a time.

use kiln_ir::sched::op::Named;
use kiln_ir::sched::store::BOX_COLUMNS;
use kiln_ir::sched::{BarrierKind, Op, Sched, TmaStore};
use kiln_ir::schedule::Distribution;
use kiln_ir::{OpId, OpKind};

use crate::emit::Emitter;
use crate::emit::matrices::{MatrixPlan, MatrixWriter, SwizzledBoxes};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// Writes `store` `id` as the TMA store `st` (`warpgroup`: the consumer warpgroup's index,
/// where warpgroups store apart).
pub(crate) fn write(
    e: &mut Emitter<'_>,
    s: &Sched,
    id: OpId,
    st: &TmaStore,
    warpgroup: Option<Reg>,
) -> Result<(), CodegenError> {
    let op = e.k.ops[id].clone();
    let OpKind::Store { .. } = op.kind else {
        return Err(e.internal(id, "not a store"));
    };
    let n = op.operands.len() - 1;
    let v = op.operands[n];
    let coords = op.operands[..n]
        .iter()
        .map(|&c| e.scalar(c, id))
        .collect::<Result<Vec<_>, _>>()?;
    let regs = e.tile(v, id)?;
    let d = e.dist(v, id)?;
    let group = store_group(e, s, id, st, warpgroup)?;
    let (leader, barrier, threads) = (group.leader, group.barrier.clone(), st.threads);
    let map = e.tensor_map(st.param, id)?;
    let rank = st.lead_dims as usize + 2;
    let (lead, &[row, col]) = coords.split_at(coords.len().saturating_sub(2)) else {
        return Err(e.internal(id, "a TMA store with fewer than 2 coordinates"));
    };
    // A group's rows: its band of the tile and of each staged box.
    let (row, smem) = match group.band {
        Some(band) => {
            let (y, src) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
            e.ins(format!("add.s32 {y}, {row}, {band}"));
            e.ins(format!("mad.lo.u32 {src}, {band}, 128, {}", e.smem));
            (y, src)
        }
        None => (row, e.smem),
    };
    let (box_terms, _) = kiln_ir::passes::tma_store::column_terms(&d.terms[1]);
    if !box_terms.is_empty() && st.rounds != 1 {
        return Err(e.internal(id, "a TMA store in rounds whose threads start boxes apart"));
    }
    let layout = SwizzledBoxes {
        box_bytes: st.box_bytes(),
        boxes: st.boxes_per_round(),
    };
    // A column-chunked epilogue runs at the register limit, where holding the pairs of
    // even two matrices spilled (gemm_alpha_beta at BN = 256): it stores pairs.
    let matrices = if e.chunked() {
        None
    } else {
        MatrixPlan::of(&d, st.threads * st.groups, layout)
    };
    // The thread's rows count from the tile's first (a group's band among them).
    let origin = (e.smem, st.offset);
    let mut writer = MatrixWriter::new(e, &d, matrices, layout, origin);
    let per_round = st.boxes_per_round();
    // The whole tile's columns: in an epilogue chunk `d` holds only the chunk's.
    let whole = e.k.distribution(v).map_err(|err| e.internal(id, err))?;
    let write_at = st.round.iter().position(|&o| o == Op::StagingWrite);
    for round in 0..st.rounds {
        let Some((opens, closes)) = round_ends(&whole, &d, round, per_round) else {
            continue;
        };
        if opens {
            e.comment(&format!(
                "TMA store, part {} of {}: {}",
                round + 1,
                st.rounds,
                st.round
                    .iter()
                    .map(|&o| round_op_str(s, o))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        // A chunk of the tile opens its round (the steps before the write) if it holds
        // the round's first column and closes it (those after) if it holds the last.
        let steps = st
            .round
            .iter()
            .enumerate()
            .filter(|&(i, _)| match write_at {
                Some(w) if i < w => opens,
                Some(w) if i > w => closes,
                Some(_) | None => true,
            });
        for (_, &step) in steps {
            match step {
                Op::BulkWaitRead => e.ins(format!("@{leader} cp.async.bulk.wait_group.read 0")),
                Op::Sync { .. } => e.ins(format!("bar.sync {barrier}, {threads}")),
                Op::StagingWrite => {
                    // A pair per store, or n pairs as the n 8x8 matrices a warp stores
                    // together.
                    let per_store = writer.regs_per_store();
                    for (offs, group) in d.regs.chunks(per_store).zip(regs.chunks(per_store)) {
                        let (ro, co) = (offs[0][0], offs[0][1]);
                        if co / BOX_COLUMNS / per_round != round {
                            continue;
                        }
                        let place = writer.place(e, (ro, co));
                        let packed: Vec<Reg> = group
                            .chunks(2)
                            .map(|pair| {
                                let p = e.new_reg(Class::B32);
                                e.ins(format!("mov.b32 {p}, {{{}, {}}}", pair[0], pair[1]));
                                p
                            })
                            .collect();
                        writer.store(e, place, &packed);
                    }
                }
                Op::FenceProxyAsync => e.ins("fence.proxy.async.shared::cta"),
                Op::BulkStore => {
                    let skip = e.new_label();
                    e.ins(format!("@!{leader} bra {skip}"));
                    let (first, last) = (round * per_round, (round + 1) * per_round);
                    for b in &st.boxes[first as usize..last as usize] {
                        let (src, x) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
                        e.ins(format!(
                            "add.u32 {src}, {smem}, {}",
                            st.offset + b.smem_offset
                        ));
                        e.ins(format!("add.s32 {x}, {col}, {}", b.origin[1]));
                        // Innermost dimension first.
                        let mut at = vec![x.to_string(), row.to_string()];
                        at.extend(lead.iter().rev().map(Reg::to_string));
                        e.ins(format!(
                            "cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group \
                                 [{map}, {{{}}}], [{src}]",
                            at.join(", ")
                        ));
                    }
                    e.label(&skip);
                }
                Op::BulkCommit => e.ins(format!("@{leader} cp.async.bulk.commit_group")),
                Op::BulkWaitAll => e.ins(format!("@{leader} cp.async.bulk.wait_group 0")),
                other => {
                    return Err(e.internal(
                        id,
                        format!(
                            "`{}` in a TMA store's round",
                            Named {
                                op: other,
                                sched: s
                            }
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Before the storing threads exit: the issuing thread of each of `stores` waits for every
/// bulk store, whose staging tile must outlive the copy.
pub(crate) fn finish(
    e: &mut Emitter<'_>,
    s: &Sched,
    stores: &[TmaStore],
    warpgroup: Option<Reg>,
) -> Result<(), CodegenError> {
    for st in stores {
        let leader = store_group(e, s, st.store, st, warpgroup)?.leader;
        e.ins(format!("@{leader} cp.async.bulk.wait_group 0"));
    }
    Ok(())
}

/// This thread's group of TMA store `st` (of `store` `id`): whether it issues the
/// group's stores (the group's first thread; `tid == 0` when one group stores the
/// tile), the group's named barrier, and, when warpgroups store apart, the first row of
/// its band.
fn store_group(
    e: &mut Emitter<'_>,
    s: &Sched,
    id: OpId,
    st: &TmaStore,
    warpgroup: Option<Reg>,
) -> Result<StoreGroup, CodegenError> {
    let BarrierKind::Named { first, .. } = s.barriers[st.barrier].kind else {
        return Err(e.internal(id, "a TMA store at an mbarrier"));
    };
    if st.groups == 1 {
        return Ok(StoreGroup {
            leader: e.setp("eq.u32", e.tid, 0),
            barrier: first.to_string(),
            band: None,
        });
    }
    let wg =
        warpgroup.ok_or_else(|| e.internal(id, "a warpgroup's TMA store outside the consumers"))?;
    let [lane, barrier, band] = e.new_regs(Class::B32);
    e.ins(format!("rem.u32 {lane}, {}, {}", e.tid, st.threads));
    let leader = e.setp("eq.u32", lane, 0);
    e.ins(format!("add.u32 {barrier}, {wg}, {first}"));
    e.ins(format!("mul.lo.u32 {band}, {wg}, {}", st.group_rows()));
    Ok(StoreGroup {
        leader,
        barrier: barrier.to_string(),
        band: Some(band),
    })
}

/// A round op as the comment before a round names it.
fn round_op_str(s: &Sched, op: Op) -> String {
    match op {
        Op::BulkWaitRead => "wait_group.read 0".to_string(),
        Op::Sync { .. } => "bar.sync".to_string(),
        Op::StagingWrite => "write".to_string(),
        Op::FenceProxyAsync => "fence.proxy.async".to_string(),
        Op::BulkStore => "tma store".to_string(),
        Op::BulkCommit => "commit_group".to_string(),
        Op::BulkWaitAll => "wait_group 0".to_string(),
        other => Named {
            op: other,
            sched: s,
        }
        .to_string(),
    }
}

/// One thread's group of a TMA store ([`store_group`]).
struct StoreGroup {
    /// Whether this thread issues the group's stores and waits for them.
    leader: Reg,
    /// The group's named barrier id: an immediate or a register.
    barrier: String,
    /// The first row of the group's band, when warpgroups store apart.
    band: Option<Reg>,
}

/// Whether the registers `d` of a staged tile, whose whole distribution is `whole`, hold the
/// first and the last column of round `round` (`per_round` boxes each); `None` when they hold
/// none of its columns. The whole tile holds both ends of every round; an epilogue chunk
/// those it reaches, in column order.
fn round_ends(
    whole: &Distribution,
    d: &Distribution,
    round: u32,
    per_round: u32,
) -> Option<(bool, bool)> {
    let columns: Vec<u32> = whole
        .offsets(1)
        .filter(|c| c / BOX_COLUMNS / per_round == round)
        .collect();
    let held = |c: u32| d.offsets(1).any(|o| o == c);
    let (&first, &last) = (columns.iter().min()?, columns.iter().max()?);
    columns
        .iter()
        .any(|&c| held(c))
        .then(|| (held(first), held(last)))
}
