//! The schedule's mbarriers: their shared addresses, their inits in the set-up, the roles'
//! cursors over the ring's stages and phases, parity waits and arrivals (docs/ptx.md §2).

use std::fmt::Display;

use kiln_ir::sched::{BarrierId, Mbarrier, Op, Phase, Scope};

use super::view::View;
use crate::emit::Emitter;
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// The longest a `try_wait` may suspend its thread, in nanoseconds (10 ms, far beyond any
/// wait's length: the thread wakes when the phase completes, the limit only bounds a sleep).
const SUSPEND_TIME_HINT_NS: u32 = 10_000_000;

/// Per-role loop state: stage index, one phase bit per waited stage array, the stage of
/// the previous iteration (for releases with lag 1) and the iterations run in this tile; in a
/// persistent kernel also the parity of the work tile (the per-tile barriers' phase).
pub(crate) struct Cursor {
    pub(crate) stage: Reg,
    pub(crate) prev: Reg,
    pub(crate) count: Reg,
    phases: Vec<(BarrierId, Reg)>,
    pub(crate) tile_parity: Option<Reg>,
}

impl View<'_> {
    /// Shared address of `bar`: its stage `stage` for a stage array of the ring, else the
    /// barrier itself.
    pub(crate) fn bar_addr(
        &self,
        e: &mut Emitter<'_>,
        bar: BarrierId,
        stage: Reg,
    ) -> Result<Reg, CodegenError> {
        let m = self.mbarrier(e, bar)?;
        let a = e.new_reg(Class::B32);
        if self.staged(bar) {
            e.ins(format!("mad.lo.u32 {a}, {stage}, 8, {}", e.smem));
            e.ins(format!("add.u32 {a}, {a}, {}", m.offset));
        } else {
            e.ins(format!("add.u32 {a}, {}, {}", e.smem, m.offset));
        }
        Ok(a)
    }

    /// Shared address of `bar`, a barrier that is not a stage array.
    pub(crate) fn bar_at(&self, e: &mut Emitter<'_>, bar: BarrierId) -> Result<Reg, CodegenError> {
        if self.staged(bar) {
            return Err(e.internal(
                self.for_op(),
                format!("`{}` without its stage", self.s.barriers[bar]),
            ));
        }
        let smem = e.smem;
        self.bar_addr(e, bar, smem)
    }

    /// One thread inits the mbarriers `bars` with their counts: first every stage array,
    /// stage by stage, then the single barriers.
    pub(crate) fn init_barriers(&self, e: &mut Emitter<'_>, bars: &[BarrierId]) {
        let skip = e.branch_if("ne.u32", e.tid, 0);
        let arrays: Vec<Mbarrier> = bars
            .iter()
            .filter_map(|&b| self.s.mbarrier(b).copied())
            .collect();
        let most = arrays.iter().map(|m| m.stages).max().unwrap_or(0);
        let staged = (0..most).flat_map(|st| {
            arrays
                .iter()
                .filter(move |m| m.stages > 1 && st < m.stages)
                .map(move |m| (m.at(st), m.count))
        });
        let single = arrays
            .iter()
            .filter(|m| m.stages <= 1)
            .map(|m| (m.offset, m.count));
        for (off, count) in staged.chain(single).collect::<Vec<_>>() {
            let a = e.new_reg(Class::B32);
            e.ins(format!("add.u32 {a}, {}, {off}", e.smem));
            e.ins(format!("mbarrier.init.shared::cta.b64 [{a}], {count}"));
        }
        e.label(&skip);
    }

    /// The set-up's barrier ([`Op::CtaSync`] or [`Op::ClusterSync`]); after it, a once
    /// load's op only names its tile (the producer issues it at the ring), so the tile's
    /// shared address is bound here.
    pub(crate) fn setup_barrier(&self, e: &mut Emitter<'_>, op: Op) {
        if op == Op::ClusterSync {
            cluster_barrier(e);
        } else {
            e.ins("bar.sync 0");
        }
        for (h, l) in self.s.loads.iter() {
            // The op names its own tile: that of the CTA's first work tile.
            if self.s.once(h) && l.work_tile == 0 {
                let base = e.new_reg(Class::B32);
                e.ins(format!("add.u32 {base}, {}, {}", e.smem, l.tma.offset));
                e.stage_bases.insert(l.tma.load, base);
            }
        }
    }

    /// A fresh cursor at stage 0 with a phase bit at its start for each stage array `ops`
    /// wait on.
    pub(crate) fn cursor(&self, e: &mut Emitter<'_>, ops: &[Op]) -> Cursor {
        let mut c = Cursor {
            stage: e.new_reg(Class::B32),
            prev: e.new_reg(Class::B32),
            count: e.new_reg(Class::B32),
            phases: Vec::new(),
            tile_parity: None,
        };
        e.ins(format!("mov.u32 {}, 0", c.stage));
        e.ins(format!("mov.u32 {}, 0", c.prev));
        e.ins(format!("mov.u32 {}, 0", c.count));
        for op in ops {
            if let Op::Wait { bar, start, .. } = *op
                && self.staged(bar)
            {
                let r = e.new_reg(Class::B32);
                e.ins(format!("mov.u32 {r}, {start}"));
                c.phases.push((bar, r));
            }
        }
        c
    }

    /// Moves a cursor to the next iteration: the stage wraps and flips every phase bit.
    pub(crate) fn advance(&self, e: &mut Emitter<'_>, c: &Cursor) {
        e.mov(c.prev, c.stage);
        e.ins(format!("add.u32 {}, {}, 1", c.count, c.count));
        e.ins(format!("add.u32 {}, {}, 1", c.stage, c.stage));
        let wrap = e.setp("eq.u32", c.stage, self.s.stages);
        e.ins(format!("selp.u32 {}, 0, {}, {wrap}", c.stage, c.stage));
        for &(_, r) in &c.phases {
            let flipped = e.new_reg(Class::B32);
            e.ins(format!("xor.b32 {flipped}, {r}, 1"));
            e.ins(format!("selp.u32 {r}, {flipped}, {r}, {wrap}"));
        }
    }

    /// A parity wait of [`Op::Wait`] `op` with cursor `c`: on a stage array at the cursor's
    /// stage and phase bit; on a per-tile barrier at the tile's phase (`after`: past the
    /// role's last tile; a kernel of one tile has no parity register, its parity is
    /// `start`, flipped after it); on a barrier of one stage per iteration at parity
    /// `start ^ ((it - lag) & 1)`, `it` counting the role's iterations. A barrier that hears
    /// other CTAs is acquired at cluster scope.
    pub(crate) fn wait(
        &self,
        e: &mut Emitter<'_>,
        c: &Cursor,
        op: Op,
        it: Option<Reg>,
        after: bool,
    ) -> Result<(), CodegenError> {
        let Op::Wait { bar, start, lag } = op else {
            return Err(self.misplaced(e, op, "is not a wait"));
        };
        let m = self.mbarrier(e, bar)?;
        let phase = if self.staged(bar) {
            c.phases
                .iter()
                .find(|(b, _)| *b == bar)
                .map(|&(_, r)| r.to_string())
                .ok_or_else(|| e.internal(self.for_op(), "a wait without a phase bit"))?
        } else if m.phase == Phase::Tile {
            match c.tile_parity {
                Some(p) => {
                    let r = e.new_reg(Class::B32);
                    e.ins(format!("xor.b32 {r}, {p}, {start}"));
                    r.to_string()
                }
                None => (start ^ u32::from(after)).to_string(),
            }
        } else {
            let it = it.ok_or_else(|| self.misplaced(e, op, "without an iteration count"))?;
            let r = e.new_reg(Class::B32);
            e.ins(format!("and.b32 {r}, {it}, 1"));
            e.ins(format!("xor.b32 {r}, {r}, {}", (start ^ lag) & 1));
            r.to_string()
        };
        let addr = self.bar_addr(e, bar, c.stage)?;
        // A clustered ring's `empty` also counts the peer's consumers: acquire at cluster
        // scope what their releases published (docs/ptx.md §2). The 2-SM form's `full` hears
        // the peer's TMA, its `empty` the leader's commit.
        let scope = if m.scope == Scope::Cta {
            ""
        } else {
            ".acquire.cluster"
        };
        parity_wait_loop(e, scope, addr, phase);
        Ok(())
    }

    /// One arrival of [`Op::Arrive`] (`peer`: [`Op::ArrivePeer`]) on `bar` at the stage used
    /// `lag` iterations ago (lag 0 or 1), by the thread(s) `elected` selects, skipped while
    /// fewer than `lag` iterations ran; `peer`: on the same barrier of the other CTA of the
    /// cluster, released at cluster scope.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release(
        &self,
        e: &mut Emitter<'_>,
        c: &Cursor,
        bar: BarrierId,
        lag: u32,
        elected: Option<Reg>,
        peer: bool,
    ) -> Result<(), CodegenError> {
        let stage = if lag == 0 { c.stage } else { c.prev };
        let a = self.bar_addr(e, bar, stage)?;
        let p = e.setp("ge.u32", c.count, lag);
        if let Some(el) = elected {
            e.ins(format!("and.pred {p}, {p}, {el}"));
        }
        if peer {
            let (other, remote) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
            let rank = cluster_rank(e);
            e.ins(format!("xor.b32 {other}, {rank}, 1"));
            e.ins(format!("mapa.shared::cluster.u32 {remote}, {a}, {other}"));
            e.ins(format!(
                "@{p} mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{remote}]"
            ));
        } else {
            e.ins(format!("@{p} mbarrier.arrive.shared::cta.b64 _, [{a}]"));
        }
        Ok(())
    }
}

/// Loops on `mbarrier.try_wait.parity{scope}` until the phase of parity `phase` of the
/// barrier at `addr` has completed. The suspend-time hint lets a waiting warp sleep until
/// the barrier changes (ptxas writes `NANOSLEEP.SYNCS`) instead of retrying every few
/// cycles: a producer that runs ahead otherwise spins hundreds of times per stage on the
/// scheduler its consumers' warps issue from.
fn parity_wait_loop(e: &mut Emitter<'_>, scope: &str, addr: impl Display, phase: impl Display) {
    let (p, top) = (e.new_reg(Class::Pred), e.new_label());
    e.label(&top);
    e.ins(format!(
        "mbarrier.try_wait.parity{scope}.shared::cta.b64 {p}, [{addr}], {phase}, \
         {SUSPEND_TIME_HINT_NS}"
    ));
    e.ins(format!("@!{p} bra {top}"));
}

/// A predicate true on lane 0 of each warp (the lane that arrives for its warp).
pub(crate) fn lane0(e: &mut Emitter<'_>) -> Reg {
    let lane = e.new_reg(Class::B32);
    e.ins(format!("and.b32 {lane}, {}, 31", e.tid));
    e.setp("eq.u32", lane, 0)
}

/// This CTA's rank in its cluster (`%cluster_ctarank`).
pub(crate) fn cluster_rank(e: &mut Emitter<'_>) -> Reg {
    let r = e.new_reg(Class::B32);
    e.ins(format!("mov.u32 {r}, %cluster_ctarank"));
    r
}

/// Every thread of the cluster: what each wrote before (the barrier inits, its shared
/// memory) is seen by every other CTA after.
pub(crate) fn cluster_barrier(e: &mut Emitter<'_>) {
    e.ins("barrier.cluster.arrive.release.aligned");
    e.ins("barrier.cluster.wait.acquire.aligned");
}
