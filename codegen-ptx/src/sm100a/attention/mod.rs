//! sm_100a attention: the FlashAttention-4-style schedule of [`kiln_ir::tmem::attention`],
//! every role following its plan's programs step by step.
//!
//! Before the roles split, thread 0 inits the schedule's barriers and the MMA warp allocates
//! TMEM (under the ring's set-up barrier, which publishes the address). Then the warpgroups
//! take their registers (`setmaxnreg`) and each role walks the CTA's pairs of work tiles
//! ([`Pair`]): a pair is the kernel's tiles `2 p` and `2 p + 1` along x, so the tile scheduler
//! walks a grid of half the x extent. Per pair, each role decodes the block index the
//! kernel's `block_id()` reads for the tile it serves: the load warp for each Q tile in turn,
//! every role for both tiles to learn the pair's walk (from the earlier start to the later
//! end), a softmax warpgroup for its own tile (its scalars, its mask, its own range) before
//! it runs the pair's walk, the iterations outside its own range as no-ops (no score copied,
//! `P = 0`, factors 1: the tile's result is its own loop's).
//!
//! Every role counts its loop iterations across tiles (`it`): phase `it` of a per-iteration
//! barrier is waited with parity `start ^ (it & 1)`, the previous iteration's with the bit
//! flipped; a per-tile barrier uses the tile walk's parity.

mod correction;
mod mma;
mod softmax;

use kiln_ir::OpId;
use kiln_ir::ring::Ring;
use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::tmem::attention::{AttentionPlan, AttnBar, AttnStep, WARPGROUP_WARPS};

use super::tmem::SetupStep;
use crate::CodegenError;
use crate::sm90a::Cursor;
use crate::sm90a::persistent::{TileLoop, scalar_only};
use crate::types::{Class, Reg};
use crate::writer::Writer;

/// The parts of the kernel every role shares: the ring loop, the ops before and after it.
pub(super) struct Parts {
    pub(super) id: OpId,
    pub(super) ring: Ring,
    pub(super) plan: AttentionPlan,
    pub(super) tiles: TileScheduler,
    pub(super) before: Vec<OpId>,
    pub(super) after: Vec<OpId>,
}

/// A role's walk over the CTA's pairs of work tiles.
pub(super) struct Pair {
    walk: TileLoop,
    /// The pair's index along x (the tile walk's x).
    xp: Reg,
    y: Reg,
    z: Reg,
}

impl Writer<'_> {
    /// Writes the body of a persistent kernel with an attention plan.
    pub(crate) fn write_attention(&mut self, tiles: TileScheduler) -> Result<(), CodegenError> {
        let (id, before, after) = self.persistent_parts()?;
        let plan = self
            .k
            .schedule
            .attention
            .clone()
            .ok_or_else(|| self.internal(id, "an attention kernel without its plan"))?;
        let p = Parts {
            id,
            ring: self.k.schedule.rings[&id].clone(),
            plan,
            tiles,
            before,
            after,
        };
        let r = p.plan.roles;
        let warp = self.new_reg(Class::B32);
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        let labels: Vec<String> = (0..3).map(|_| self.new_label()).collect();
        for (g, label) in labels.iter().enumerate() {
            let below = self.new_reg(Class::Pred);
            let first = if g < 2 {
                r.softmax_warps * (g as u32 + 1)
            } else {
                r.correction_warp + WARPGROUP_WARPS
            };
            self.ins(format!("setp.lt.u32 {below}, {warp}, {first}"));
            self.ins(format!("@{below} bra {label}"));
        }
        self.comment("last warpgroup: the load warp, the mma warp, two idle warps");
        self.ins(format!("setmaxnreg.dec.sync.aligned.u32 {}", r.regs[2]));
        let (is_mma, idle) = (self.new_reg(Class::Pred), self.new_reg(Class::Pred));
        let mma = self.new_label();
        self.ins(format!("setp.eq.u32 {is_mma}, {warp}, {}", r.mma_warp));
        self.ins(format!("@{is_mma} bra {mma}"));
        self.ins(format!(
            "setp.ne.u32 {idle}, {}, {}",
            self.tid,
            32 * r.load_warp
        ));
        self.ins(format!("@{idle} exit"));
        self.comment("load warp: one thread issues the Q tiles' and every stage's TMA");
        self.write_load_warp(&p)?;
        self.ins("exit");
        self.label(&mma);
        self.comment("mma warp: one thread issues the tcgen05.mmas; the warp owns TMEM");
        self.write_attention_mma(&p)?;
        self.ins("exit");
        for (g, label) in labels.iter().enumerate().take(2) {
            self.label(label);
            self.comment(&format!(
                "softmax warpgroup {g}: Q tile {g}'s rows, one a thread"
            ));
            self.ins(format!("setmaxnreg.inc.sync.aligned.u32 {}", r.regs[0]));
            self.write_softmax(&p, g as u32)?;
            self.ins("exit");
        }
        self.label(&labels[2]);
        self.comment("correction warpgroup: rescales O in TMEM");
        self.ins(format!("setmaxnreg.dec.sync.aligned.u32 {}", r.regs[1]));
        self.write_correction(&p)
    }

    /// Opens a role's walk over pairs of work tiles (the tile scheduler over the grid with
    /// x halved, rounded up).
    pub(super) fn open_pair(&mut self, p: &Parts, c: &mut Cursor) -> Result<Pair, CodegenError> {
        let grid = self
            .grid
            .ok_or_else(|| self.internal(p.id, "a persistent kernel without its grid"))?;
        let pairs = self.new_reg(Class::B32);
        self.ins(format!("add.u32 {pairs}, {}, 1", grid[0]));
        self.ins(format!("shr.u32 {pairs}, {pairs}, 1"));
        self.grid = Some([pairs, grid[1], grid[2]]);
        let walk = self.open_tile_loop(p.id, p.tiles, c);
        self.grid = Some(grid);
        let walk = walk?;
        let [xp, y, z] = self
            .block
            .ok_or_else(|| self.internal(p.id, "a tile walk without its block index"))?;
        Ok(Pair { walk, xp, y, z })
    }

    /// Closes the walk.
    pub(super) fn close_pair(&mut self, pair: &Pair, c: &Cursor) {
        self.close_tile_loop(&pair.walk, c);
    }

    /// Points `block_id()` at tile `g` of the pair and writes the ops before the loop (only
    /// the scalar ones when `scalars`).
    pub(super) fn enter_pair_tile(
        &mut self,
        p: &Parts,
        pair: &Pair,
        g: u32,
        scalars: bool,
    ) -> Result<(), CodegenError> {
        let x = self.new_reg(Class::B32);
        self.ins(format!("mad.lo.u32 {x}, {}, 2, {g}", pair.xp));
        self.block = Some([x, pair.y, pair.z]);
        for &op in &p.before {
            if !scalars || scalar_only(self.k, op) {
                self.write_op(op)?;
            }
        }
        Ok(())
    }

    /// The pair's loop bounds, from the scalar ops before the loop: the earlier of the tiles'
    /// starts, the later of their ends and the step they share (the `tmem` pass checked it
    /// does not depend on x, and is 1 where the starts may differ); a softmax warpgroup runs the
    /// iterations outside its own tile's range as no-ops.
    pub(super) fn pair_bounds(&mut self, p: &Parts, pair: &Pair) -> Result<[Reg; 3], CodegenError> {
        self.enter_pair_tile(p, pair, 0, true)?;
        let [lo0, hi0, _] = self.loop_bounds(p.id)?;
        self.enter_pair_tile(p, pair, 1, true)?;
        let [lo1, hi1, step] = self.loop_bounds(p.id)?;
        let (lo, hi) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("min.s32 {lo}, {lo0}, {lo1}"));
        self.ins(format!("max.s32 {hi}, {hi0}, {hi1}"));
        Ok([lo, hi, step])
    }

    /// The TMEM base address (lane 0, column 0), read from the shared slot, and the address
    /// of the executing thread's lane: warp `w` reaches lanes `32 (w % 4) ..`, thread `t` of
    /// it lane `32 (w % 4) + t`; returns `(base, lane address)`.
    pub(super) fn attention_tmem(&mut self, plan: &AttentionPlan) -> (Reg, Reg) {
        let base = self.tmem_base(plan.slot_offset);
        // TMEM address = (lane << 16) | column: lane 32 (w % 4) is `(w % 4) << 21`.
        let lanes = self.new_reg(Class::B32);
        self.ins(format!("shr.u32 {lanes}, {}, 5", self.tid));
        self.ins(format!("and.b32 {lanes}, {lanes}, 3"));
        self.ins(format!("shl.b32 {lanes}, {lanes}, 21"));
        self.ins(format!("add.u32 {lanes}, {lanes}, {base}"));
        (base, lanes)
    }

    /// Shared address of a schedule barrier.
    pub(super) fn attn_bar(&mut self, plan: &AttentionPlan, bar: AttnBar) -> Reg {
        self.shared_at(plan.offset(bar))
    }

    /// A parity wait on a schedule barrier: per iteration, parity `start ^ ((it - lag) & 1)`;
    /// per tile, `start ^` the tile walk's parity. `aligned`: the warp reconverges after it
    /// (lanes may leave the wait loop apart; the `.sync.aligned` tcgen05 ops after it need the
    /// whole warp).
    pub(super) fn attn_wait(
        &mut self,
        plan: &AttentionPlan,
        step: AttnStep,
        it: Reg,
        c: &Cursor,
        aligned: bool,
    ) -> Result<(), CodegenError> {
        let AttnStep::Wait { bar, start, lag } = step else {
            return Err(self.internal(plan.for_op, format!("`{step}` is not a wait")));
        };
        let phase = self.new_reg(Class::B32);
        if bar.per_tile() {
            let parity = c
                .tile_parity
                .ok_or_else(|| self.internal(plan.for_op, "a per-tile wait outside a tile walk"))?;
            self.ins(format!("xor.b32 {phase}, {parity}, {start}"));
        } else {
            self.ins(format!("and.b32 {phase}, {it}, 1"));
            self.ins(format!("xor.b32 {phase}, {phase}, {}", (start ^ lag) & 1));
        }
        let a = self.attn_bar(plan, bar);
        self.parity_wait_loop("", a, phase);
        if aligned {
            self.ins("bar.warp.sync -1");
        }
        Ok(())
    }

    /// One arrival per warp (lane 0) on a schedule barrier.
    pub(super) fn attn_arrive(&mut self, plan: &AttentionPlan, bar: AttnBar) {
        let a = self.attn_bar(plan, bar);
        let lane0 = self.lane0();
        self.ins(format!("@{lane0} mbarrier.arrive.shared::cta.b64 _, [{a}]"));
    }

    /// Steps every role writes the same way.
    pub(super) fn attn_common(
        &mut self,
        plan: &AttentionPlan,
        s: AttnStep,
    ) -> Result<(), CodegenError> {
        match s {
            AttnStep::FenceAfter => self.ins("tcgen05.fence::after_thread_sync"),
            AttnStep::FenceBefore => self.ins("tcgen05.fence::before_thread_sync"),
            AttnStep::WaitLd => self.ins("tcgen05.wait::ld.sync.aligned"),
            AttnStep::WaitSt => self.ins("tcgen05.wait::st.sync.aligned"),
            AttnStep::Arrive { bar } => self.attn_arrive(plan, bar),
            other => {
                return Err(self.internal(plan.for_op, format!("`{other}` outside its role")));
            }
        }
        Ok(())
    }

    /// The load warp's thread: per pair of tiles both Q tiles, then the ring's producer
    /// program over the pair's iterations.
    fn write_load_warp(&mut self, p: &Parts) -> Result<(), CodegenError> {
        let mut c = self.cursor(&p.ring.producer);
        let pair = self.open_pair(p, &mut c)?;
        let q = p.ring.once[0].clone();
        for &s in &p.plan.load_tile {
            match s {
                AttnStep::RingWait { bar, start } => self.wait(&p.ring, &c, bar, start)?,
                AttnStep::ExpectQ { bytes } => {
                    let once = self.bar_addr(&p.ring, kiln_ir::ring::Bar::Once, c.stage);
                    self.ins(format!(
                        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{once}], {bytes}"
                    ));
                }
                AttnStep::LoadQ { tile } => {
                    self.enter_pair_tile(p, &pair, tile, true)?;
                    let coords = self.k.ops[q.load]
                        .operands
                        .clone()
                        .into_iter()
                        .map(|v| self.scalar(v, q.load))
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut at = q.clone();
                    if tile > 0 {
                        at.offset = p.plan.q1_offset;
                    }
                    let once = self.bar_addr(&p.ring, kiln_ir::ring::Bar::Once, c.stage);
                    self.tma_boxes(&at, &coords, self.smem, once)?;
                }
                other => {
                    return Err(self.internal(p.id, format!("load warp step `{other}`")));
                }
            }
        }
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        for &s in &p.plan.load_iteration {
            match s {
                AttnStep::LoadKv => {
                    for rs in p.ring.producer.clone() {
                        self.producer_step(&p.ring, &c, rs, iv, p.id)?;
                    }
                }
                other => {
                    return Err(self.internal(p.id, format!("load warp step `{other}`")));
                }
            }
        }
        self.advance(&c, p.ring.stages);
        self.close_counted_loop(&counted);
        self.close_pair(&pair, &c);
        Ok(())
    }

    /// Before the ring's set-up: thread 0 inits the schedule's barriers, the MMA warp
    /// allocates TMEM and gives up the permit, and every thread orders its tcgen05 ops before
    /// the set-up barrier.
    pub(crate) fn write_attention_setup(
        &mut self,
        plan: &AttentionPlan,
    ) -> Result<(), CodegenError> {
        let bars: Vec<(u32, u32)> = AttnBar::all()
            .into_iter()
            .map(|b| (plan.offset(b), plan.count(b)))
            .collect();
        let setup = plan.setup.iter().map_while(|s| match *s {
            AttnStep::Alloc { columns } => Some(Ok(SetupStep::Alloc(columns))),
            AttnStep::Relinquish => Some(Ok(SetupStep::Relinquish)),
            AttnStep::Publish => None,
            other => Some(Err(other.to_string())),
        });
        let setup = setup.collect::<Vec<_>>();
        self.write_tmem_alloc(
            plan.for_op,
            &bars,
            plan.roles.mma_warp,
            plan.slot_offset,
            setup,
        )
    }
}
