//! An epilogue `store` through a swizzled staging tile and TMA ([`TmaStore`], whose round
//! program gives the protocol), on sm_90a and sm_100a alike. A register tile laid out as an mma
//! accumulator goes to the staging tile as 8x8 matrices (`stmatrix`, where
//! [`matrices_land_in_place`] proves each register lands where its thread would store it);
//! any other a pair at a time.

use std::collections::BTreeMap;

use kiln_ir::sched::op::Named;
use kiln_ir::sched::store::BOX_COLUMNS;
use kiln_ir::sched::{BarrierKind, Op, Sched, TmaStore};
use kiln_ir::schedule::{Distribution, Term};
use kiln_ir::{OpId, OpKind};

use crate::emit::Emitter;
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
    // Element (r, c) of box j sits at j * box + r * 128 + ((c / 8) ^ (r % 8)) * 16 +
    // (c % 8) * 2 (128-byte swizzle). A thread's rows differ by multiples of 8, so they
    // share the phase r % 8; its columns stay inside one 16-byte chunk per 8, but for a
    // start whole boxes further (a tile staged whole: its registers' boxes are those of
    // the one round, moved by the thread's).
    let (box_terms, chunk_terms) = kiln_ir::passes::tma_store::column_terms(&d.terms[1]);
    if !box_terms.is_empty() && st.rounds != 1 {
        return Err(e.internal(id, "a TMA store in rounds whose threads start boxes apart"));
    }
    let box_col_bytes = st.box_bytes() / BOX_COLUMNS;
    // A column-chunked epilogue runs at the register limit, where holding the pairs of
    // even two matrices spilled (gemm_alpha_beta at BN = 256): it stores pairs.
    let matrices = if e.chunked() {
        None
    } else {
        matrix_deltas(&d, st.threads * st.groups, st)
    };
    // The thread whose row start this thread gives: itself for pairs; for 8x8 matrices,
    // lane 8 i + r gives row r of its warp's matrix i, which lane 4 r holds.
    let at_tid = match matrices {
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
    e.ins(format!("add.u32 {base}, {}, {}", e.smem, st.offset));
    e.ins(format!("mad.lo.u32 {base}, {rb}, 128, {base}"));
    e.ins(format!("mad.lo.u32 {base}, {cb}, 2, {base}"));
    if !box_terms.is_empty() {
        // Column c of a thread's box start is box c / 64: c / 64 * box bytes.
        let bb = e.thread_coord_of(&box_terms, at_tid);
        e.ins(format!("mad.lo.u32 {base}, {bb}, {box_col_bytes}, {base}"));
    }
    e.ins(format!("and.b32 {phase}, {rb}, 7"));
    // Matrix lane / 8 % 4 of a group sits rows and 16-byte chunks from the group's first
    // pair: looked up in two tables of 4-bit fields (row deltas in units of 8).
    let chunk_delta = match matrices {
        None => None,
        Some((n, deltas)) => {
            let table = |f: fn(&(u32, u32)) -> u32| {
                deltas
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
            Some((n, chunks))
        }
    };
    let (box_bytes, per_round) = (st.box_bytes(), st.boxes_per_round());
    // The whole tile's columns: in an epilogue chunk `d` holds only the chunk's.
    let whole = e.k.distribution(v).map_err(|err| e.internal(id, err))?;
    let write_at = st.round.iter().position(|&o| o == Op::StagingWrite);
    let mut chunks: BTreeMap<u32, Reg> = BTreeMap::new();
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
                    // A pair per 32-bit store, or n pairs as the n 8x8 matrices a warp
                    // stores together, each at its group's first chunk moved by its own.
                    let per_store = chunk_delta.map_or(2, |(n, _)| 2 * n);
                    for (offs, group) in d.regs.chunks(per_store).zip(regs.chunks(per_store)) {
                        let (ro, co) = (offs[0][0], offs[0][1]);
                        let (box_index, c) = (co / 64, co % 64);
                        if box_index / per_round != round {
                            continue;
                        }
                        let chunk = c / 8;
                        let at = match chunks.get(&chunk) {
                            Some(&r) => r,
                            None => {
                                let r = e.new_reg(Class::B32);
                                match chunk_delta {
                                    Some((_, dc)) => {
                                        e.ins(format!("add.u32 {r}, {dc}, {chunk}"));
                                        e.ins(format!("xor.b32 {r}, {r}, {phase}"));
                                    }
                                    None => e.ins(format!("xor.b32 {r}, {phase}, {chunk}")),
                                }
                                e.ins(format!("mad.lo.u32 {r}, {r}, 16, {base}"));
                                chunks.insert(chunk, r);
                                r
                            }
                        };
                        let imm = (box_index % per_round) * box_bytes + ro * 128 + (c % 8) * 2;
                        let packed: Vec<String> = group
                            .chunks(2)
                            .map(|pair| {
                                let p = e.new_reg(Class::B32);
                                e.ins(format!("mov.b32 {p}, {{{}, {}}}", pair[0], pair[1]));
                                p.to_string()
                            })
                            .collect();
                        if let Some((n, _)) = chunk_delta {
                            e.ins(format!(
                                "stmatrix.sync.aligned.m8n8.x{n}.shared.b16 [{at}+{imm}], {{{}}}",
                                packed.join(", ")
                            ));
                        } else {
                            e.ins(format!("st.shared.b32 [{at}+{imm}], {}", packed[0]));
                        }
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

/// How a warp stores the staged tile `d` of `threads` (whole warps) as 8x8 matrices, if it
/// can: `stmatrix` of `n` matrices (4, else 2, else 1: as many as the pairs allow), and where
/// matrix `i` sits from the first, `(rows, 16-byte chunks)`, at `i % n` of four. Each lane's
/// consecutive pairs, `n` at a time, must lie in one box with the same row and chunk steps in
/// every group, rows in whole 8-row atoms (so a row's swizzle phase is its thread's), and
/// [`matrices_land_in_place`]. `None` for any other layout, which is stored a pair at a
/// time.
fn matrix_deltas(
    d: &Distribution,
    threads: u32,
    st: &TmaStore,
) -> Option<(usize, [(u32, u32); 4])> {
    if d.terms.len() != 2 || !d.column_pairs() || threads == 0 || !threads.is_multiple_of(32) {
        return None;
    }
    let pairs = d.regs.len() / 2;
    let n = [4, 2, 1].into_iter().find(|n| pairs.is_multiple_of(*n))?;
    let columns = BOX_COLUMNS;
    let mut deltas: Option<[(u32, u32); 4]> = None;
    for group in d.regs.chunks(2 * n) {
        let (r0, c0) = (group[0][0], group[0][1]);
        let mut these = [(0, 0); 4];
        for (i, pair) in group.chunks(2).enumerate() {
            let (r, c) = (pair[0][0], pair[0][1]);
            if r < r0 || c < c0 || !r.is_multiple_of(8) || !c.is_multiple_of(8) {
                return None;
            }
            if c / columns != c0 / columns || (r - r0) / 8 >= 16 {
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
    let deltas = deltas?;
    matrices_land_in_place(d, threads, st, n, &deltas).then_some((n, deltas))
}

/// Whether `stmatrix` of `n` matrices with `deltas` puts every register of `d` where the
/// pair's own thread would store it. The PTX ISA's rule: lane `8 i + r` gives the address of
/// row `r` of matrix `i`, and lane `4 r + w` holds word `w` of that row in its register `i`.
/// The address a lane gives is the one [`write()`] computes: its row-giving
/// thread's base (lane `4 (lane % 8)` of its warp), moved by matrix `lane / 8 % 4`'s deltas
/// and the group's first pair; the place a pair belongs is element `(row, col)` of the
/// 128-byte swizzled boxes.
fn matrices_land_in_place(
    d: &Distribution,
    threads: u32,
    st: &TmaStore,
    n: usize,
    deltas: &[(u32, u32); 4],
) -> bool {
    let columns = BOX_COLUMNS;
    let (box_bytes, per_round) = (st.box_bytes(), st.boxes_per_round());
    let (box_terms, chunk_terms) = kiln_ir::passes::tma_store::column_terms(&d.terms[1]);
    let swizzled = |row: u32, col: u32| {
        (col / columns % per_round) * box_bytes
            + row * 128
            + (((col % columns) / 8) ^ (row % 8)) * 16
            + (col % 8) * 2
    };
    let given = |lane_tid: u32, first: &[u32]| {
        let giver = (lane_tid & !31) + 4 * (lane_tid & 7);
        let (rows, chunks) = deltas[((lane_tid >> 3) & 3) as usize];
        let rb = Term::sum(&d.terms[0], giver);
        let base = rb * 128
            + Term::sum(&chunk_terms, giver) * 2
            + Term::sum(&box_terms, giver) * (box_bytes / columns)
            + rows * 128;
        let chunk = (first[1] % columns) / 8;
        (((chunk + chunks) ^ (rb % 8)) * 16 + base)
            + (first[1] / columns % per_round) * box_bytes
            + first[0] * 128
    };
    (0..threads).all(|t| {
        let coords = d.coords(t);
        coords
            .chunks(2 * n)
            .zip(d.regs.chunks(2 * n))
            .all(|(mine, group)| {
                mine.chunks(2).enumerate().all(|(i, pair)| {
                    let giver = (t & !31) + 8 * i as u32 + (t % 32) / 4;
                    given(giver, &group[0]) + 4 * (t % 4) == swizzled(pair[0][0], pair[0][1])
                })
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(div: u32, modulo: u32, mul: u32) -> Term {
        Term { div, modulo, mul }
    }

    /// A 64-row store of one warpgroup into `boxes` boxes of 64 x 128 bytes, staged whole.
    fn store(boxes: u32) -> TmaStore {
        TmaStore {
            store: OpId::from_index(0),
            param: 0,
            lead_dims: 0,
            box_dims: [64, BOX_COLUMNS],
            swizzle: 128,
            boxes: (0..boxes)
                .map(|j| kiln_ir::sched::tma::TmaBox {
                    origin: [0, j * BOX_COLUMNS],
                    smem_offset: j * 64 * 128,
                })
                .collect(),
            rounds: 1,
            offset: 0,
            barrier: kiln_ir::sched::BarrierId::from_index(0),
            threads: 128,
            groups: 1,
            round: Vec::new(),
            work_tile: 0,
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
                matrix_deltas(&d, 128, &store(n / 64)),
                Some((4, [(0, 0), (8, 0), (0, 1), (8, 1)])),
                "n = {n}"
            );
        }
    }

    #[test]
    fn other_layouts_are_stored_a_pair_at_a_time() {
        let st = store(1);
        // Threads along the rows only: a lane's columns are not a quad's words.
        let rows = Distribution {
            terms: vec![vec![term(1, 128, 1)], vec![]],
            regs: (0..16)
                .flat_map(|j| [vec![0, 2 * j], vec![0, 2 * j + 1]])
                .collect(),
        };
        assert_eq!(matrix_deltas(&rows, 128, &st), None);
        // The accumulator's registers, but a quad's lanes on eight rows, not one row's words.
        let mut columns = wgmma_accumulator(64, vec![term(32, 4, 16), term(1, 8, 1)]);
        columns.terms[1] = vec![term(8, 4, 2)];
        assert_eq!(matrix_deltas(&columns, 128, &st), None);
        // Any order of a warp's rows is stored in place: each row's address is its own.
        let shuffled = wgmma_accumulator(64, vec![term(32, 4, 16), term(4, 4, 2), term(16, 2, 1)]);
        assert!(matrix_deltas(&shuffled, 128, &st).is_some());
        // An 8-column chunk of the accumulator: two matrices a store.
        let mut chunk = wgmma_accumulator(64, vec![term(32, 4, 16), term(4, 8, 1)]);
        chunk.regs.truncate(4);
        assert_eq!(
            matrix_deltas(&chunk, 128, &st),
            Some((2, [(0, 0), (8, 0), (0, 0), (8, 0)]))
        );
        // Not whole warps.
        let d = wgmma_accumulator(64, vec![term(32, 4, 16), term(4, 8, 1)]);
        assert_eq!(matrix_deltas(&d, 48, &st), None);
    }
}
