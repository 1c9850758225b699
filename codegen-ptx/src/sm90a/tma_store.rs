//! sm_90a: an epilogue `store` through a swizzled staging tile and TMA
//! ([`kiln_ir::tma_store`], which gives the protocol).

use std::collections::BTreeMap;

use kiln_ir::schedule::Distribution;
use kiln_ir::tma_store::{StoreStep, TmaStore};
use kiln_ir::{OpId, OpKind};

use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::Writer;

impl Writer<'_> {
    /// Writes `store` `id` as the TMA store `st`.
    pub(crate) fn write_tma_store(&mut self, id: OpId, st: &TmaStore) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let OpKind::Store { .. } = op.kind else {
            return Err(self.internal(id, "not a store"));
        };
        let n = op.operands.len() - 1;
        let v = op.operands[n];
        let coords = op.operands[..n]
            .iter()
            .map(|&c| self.scalar(c, id))
            .collect::<Result<Vec<_>, _>>()?;
        let regs = self.tile(v, id)?;
        let d = self.dist(v, id)?;
        let group = self.store_group(id, st)?;
        let (leader, barrier, threads) = (group.leader, group.barrier.clone(), st.threads);
        let map = *self
            .tmaps
            .get(&st.param)
            .ok_or_else(|| self.internal(id, "a TMA store without a tensor map"))?;
        let rank = st.lead_dims as usize + 2;
        let (lead, &[row, col]) = coords.split_at(coords.len().saturating_sub(2)) else {
            return Err(self.internal(id, "a TMA store with fewer than 2 coordinates"));
        };
        // A group's rows: its band of the tile and of each staged box.
        let (row, smem) = match group.band {
            Some(band) => {
                let (y, src) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                self.ins(format!("add.s32 {y}, {row}, {band}"));
                self.ins(format!("mad.lo.u32 {src}, {band}, 128, {}", self.smem));
                (y, src)
            }
            None => (row, self.smem),
        };
        // Element (r, c) of box j sits at j * box + r * 128 + ((c / 8) ^ (r % 8)) * 16 +
        // (c % 8) * 2 (128-byte swizzle). A thread's rows differ by multiples of 8, so they
        // share the phase r % 8; its columns stay inside one 16-byte chunk per 8, but for a
        // start whole boxes further (a tile staged whole: its registers' boxes are those of
        // the one round, moved by the thread's).
        let (box_terms, chunk_terms) = kiln_ir::tma_store::column_terms(&d.terms[1]);
        if !box_terms.is_empty() && st.rounds != 1 {
            return Err(self.internal(id, "a TMA store in rounds whose threads start boxes apart"));
        }
        let (rb, cb) = (
            self.thread_coord(&d.terms[0]),
            self.thread_coord(&chunk_terms),
        );
        let (base, phase) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("add.u32 {base}, {}, {}", self.smem, st.offset));
        self.ins(format!("mad.lo.u32 {base}, {rb}, 128, {base}"));
        self.ins(format!("mad.lo.u32 {base}, {cb}, 2, {base}"));
        if !box_terms.is_empty() {
            // Column c of a thread's box start is box c / 64: c / 64 * box bytes.
            let bb = self.thread_coord(&box_terms);
            self.ins(format!(
                "mad.lo.u32 {base}, {bb}, {}, {base}",
                st.box_bytes() / kiln_ir::tma_store::BOX_COLUMNS
            ));
        }
        self.ins(format!("and.b32 {phase}, {rb}, 7"));
        let (box_bytes, per_round) = (st.box_bytes(), st.boxes_per_round());
        // The whole tile's columns: in an epilogue chunk `d` holds only the chunk's.
        let whole = self.k.distribution(v).map_err(|e| self.internal(id, e))?;
        let write_at = st.round.iter().position(|&s| s == StoreStep::Write);
        let mut chunks: BTreeMap<u32, Reg> = BTreeMap::new();
        for round in 0..st.rounds {
            let Some((opens, closes)) = round_ends(&whole, &d, round, per_round) else {
                continue;
            };
            if opens {
                self.comment(&format!(
                    "TMA store, part {} of {}: {}",
                    round + 1,
                    st.rounds,
                    st.round
                        .iter()
                        .map(|s| s.to_string())
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
                    StoreStep::WaitRead => {
                        self.ins(format!("@{leader} cp.async.bulk.wait_group.read 0"))
                    }
                    StoreStep::Sync => self.ins(format!("bar.sync {barrier}, {threads}")),
                    StoreStep::Write => {
                        for (offs, pair) in d.regs.chunks(2).zip(regs.chunks(2)) {
                            let (ro, co) = (offs[0][0], offs[0][1]);
                            let (box_index, c) = (co / 64, co % 64);
                            if box_index / per_round != round {
                                continue;
                            }
                            let chunk = c / 8;
                            let at = match chunks.get(&chunk) {
                                Some(&r) => r,
                                None => {
                                    let r = self.new_reg(Class::B32);
                                    self.ins(format!("xor.b32 {r}, {phase}, {chunk}"));
                                    self.ins(format!("mad.lo.u32 {r}, {r}, 16, {base}"));
                                    chunks.insert(chunk, r);
                                    r
                                }
                            };
                            let imm = (box_index % per_round) * box_bytes + ro * 128 + (c % 8) * 2;
                            let packed = self.new_reg(Class::B32);
                            self.ins(format!("mov.b32 {packed}, {{{}, {}}}", pair[0], pair[1]));
                            self.ins(format!("st.shared.b32 [{at}+{imm}], {packed}"));
                        }
                    }
                    StoreStep::Fence => self.ins("fence.proxy.async.shared::cta"),
                    StoreStep::Issue => {
                        let skip = self.new_label();
                        self.ins(format!("@!{leader} bra {skip}"));
                        let (first, last) = (round * per_round, (round + 1) * per_round);
                        for b in &st.boxes[first as usize..last as usize] {
                            let (src, x) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
                            self.ins(format!(
                                "add.u32 {src}, {smem}, {}",
                                st.offset + b.smem_offset
                            ));
                            self.ins(format!("add.s32 {x}, {col}, {}", b.origin[1]));
                            // Innermost dimension first.
                            let mut at = vec![x.to_string(), row.to_string()];
                            at.extend(lead.iter().rev().map(Reg::to_string));
                            self.ins(format!(
                                "cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group \
                                 [{map}, {{{}}}], [{src}]",
                                at.join(", ")
                            ));
                        }
                        self.label(&skip);
                    }
                    StoreStep::Commit => self.ins(format!("@{leader} cp.async.bulk.commit_group")),
                    StoreStep::WaitAll => self.ins(format!("@{leader} cp.async.bulk.wait_group 0")),
                }
            }
        }
        Ok(())
    }

    /// Before the consumers exit: the issuing thread waits for every TMA store, whose
    /// staging tile must outlive the copy.
    pub(crate) fn finish_tma_stores(&mut self) -> Result<(), CodegenError> {
        let stores: Vec<TmaStore> = self.k.schedule.tma_stores.values().cloned().collect();
        for st in stores {
            let leader = self.store_group(st.store, &st)?.leader;
            for &step in &st.finish {
                match step {
                    StoreStep::WaitAll => self.ins(format!("@{leader} cp.async.bulk.wait_group 0")),
                    StoreStep::WaitRead => {
                        self.ins(format!("@{leader} cp.async.bulk.wait_group.read 0"))
                    }
                    other => {
                        return Err(self.internal(
                            st.store,
                            format!("`{other}` in a TMA store's steps at exit"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// This thread's group of TMA store `st` (of `store` `id`): whether it issues the
    /// group's stores (the group's first thread; `tid == 0` when one group stores the
    /// tile), the group's named barrier, and, when warpgroups store apart, the first row of
    /// its band.
    fn store_group(&mut self, id: OpId, st: &TmaStore) -> Result<StoreGroup, CodegenError> {
        let leader = self.new_reg(Class::Pred);
        if st.groups == 1 {
            self.ins(format!("setp.eq.u32 {leader}, {}, 0", self.tid));
            return Ok(StoreGroup {
                leader,
                barrier: st.barrier.to_string(),
                band: None,
            });
        }
        let wg = self
            .warpgroup
            .ok_or_else(|| self.internal(id, "a warpgroup's TMA store outside the consumers"))?;
        let (lane, barrier, band) = (
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
            self.new_reg(Class::B32),
        );
        self.ins(format!("rem.u32 {lane}, {}, {}", self.tid, st.threads));
        self.ins(format!("setp.eq.u32 {leader}, {lane}, 0"));
        self.ins(format!("add.u32 {barrier}, {wg}, {}", st.barrier));
        self.ins(format!("mul.lo.u32 {band}, {wg}, {}", st.group_rows()));
        Ok(StoreGroup {
            leader,
            barrier: barrier.to_string(),
            band: Some(band),
        })
    }
}

/// One thread's group of a TMA store ([`Writer::store_group`]).
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
        .filter(|c| c / kiln_ir::tma_store::BOX_COLUMNS / per_round == round)
        .collect();
    let held = |c: u32| d.offsets(1).any(|o| o == c);
    let (&first, &last) = (columns.iter().min()?, columns.iter().max()?);
    columns
        .iter()
        .any(|&c| held(c))
        .then(|| (held(first), held(last)))
}
