//! sm_100a attention: the FlashAttention-4-style schedule of [`kiln_ir::tmem::attention`] as
//! the schedule IR gives it, every role following its program op by op.
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
//! barrier of one stage is waited with parity `start ^ (it & 1)`, the previous iteration's
//! with the bit flipped; a per-tile barrier uses the tile walk's parity.

mod correction;
mod mma;
mod softmax;

use kiln_ir::OpId;
use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::sched::tmem::{ACC_ROWS, Tmem, TmemTileId};
use kiln_ir::sched::{Op, Phase, Role, RoleKind, Sched};

use crate::CodegenError;
use crate::sm90a::persistent::{TileLoop, scalar_only};
use crate::sm90a::{Cursor, named};
use crate::types::{Class, Reg};
use crate::writer::Writer;

/// The parts of the kernel every role shares: the schedule, the ops before and after the
/// ring loop.
pub(super) struct Parts<'s> {
    pub(super) id: OpId,
    pub(super) s: &'s Sched,
    pub(super) tmem: &'s Tmem,
    pub(super) tiles: TileScheduler,
    pub(super) before: Vec<OpId>,
    pub(super) after: Vec<OpId>,
}

impl Parts<'_> {
    /// The TMEM column of tile `name` (`S`, `O`) of Q tile `g`.
    pub(super) fn column(&self, name: &str, g: u32) -> Option<u32> {
        self.tmem
            .tile(name, Some(g))
            .map(|TmemTileId(t)| self.tmem.tiles[t].column)
    }

    /// Shared byte offset of Q tile `g`'s rescale factors (one f32 per row).
    pub(super) fn factors(&self, g: u32) -> u32 {
        self.s.factors_offset.unwrap_or(0) + ACC_ROWS * 4 * g
    }

    /// Whether column `c` of the score tile takes the polynomial exponential.
    pub(super) fn poly_column(&self, c: u32) -> bool {
        let (num, den) = self.s.poly_share;
        den > 0 && c % den < num
    }
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
    /// Writes the body of a persistent kernel with an attention schedule.
    pub(crate) fn write_attention(&mut self, tiles: TileScheduler) -> Result<(), CodegenError> {
        let (id, before, after) = self.persistent_parts()?;
        let k: &kiln_ir::Kernel = self.k;
        let s = k
            .schedule
            .sched
            .as_ref()
            .ok_or_else(|| self.internal(id, "an attention kernel without its schedule"))?;
        let tmem = s
            .tmem
            .as_ref()
            .ok_or_else(|| self.internal(id, "an attention schedule without TMEM"))?;
        let p = Parts {
            id,
            s,
            tmem,
            tiles,
            before,
            after,
        };
        let role = |kind| {
            s.role(kind).ok_or_else(|| {
                self.internal(id, format!("an attention schedule without its {kind} role"))
            })
        };
        let softmax = [role(RoleKind::Softmax(0))?, role(RoleKind::Softmax(1))?];
        let (correction, load, mma) = (
            role(RoleKind::Correction)?,
            role(RoleKind::Producer)?,
            role(RoleKind::Mma)?,
        );
        let warp = self.new_reg(Class::B32);
        self.ins(format!("shr.u32 {warp}, {}, 5", self.tid));
        let labels: Vec<String> = (0..3).map(|_| self.new_label()).collect();
        for (r, label) in [softmax[0], softmax[1], correction].iter().zip(&labels) {
            let below = self.new_reg(Class::Pred);
            self.ins(format!("setp.lt.u32 {below}, {warp}, {}", r.end_warp()));
            self.ins(format!("@{below} bra {label}"));
        }
        self.comment("last warpgroup: the load warp, the mma warp, two idle warps");
        if let Some(regs) = load.regs {
            self.ins(format!("setmaxnreg.dec.sync.aligned.u32 {regs}"));
        }
        let (is_mma, idle) = (self.new_reg(Class::Pred), self.new_reg(Class::Pred));
        let mma_label = self.new_label();
        self.ins(format!("setp.eq.u32 {is_mma}, {warp}, {}", mma.first_warp));
        self.ins(format!("@{is_mma} bra {mma_label}"));
        self.ins(format!(
            "setp.ne.u32 {idle}, {}, {}",
            self.tid,
            32 * load.first_warp
        ));
        self.ins(format!("@{idle} exit"));
        self.comment("load warp: one thread issues the Q tiles' and every stage's TMA");
        self.write_load_warp(&p, load)?;
        self.ins("exit");
        self.label(&mma_label);
        self.comment("mma warp: one thread issues the tcgen05.mmas; the warp owns TMEM");
        self.write_attention_mma(&p, mma)?;
        self.ins("exit");
        for (g, (label, role)) in labels.iter().zip(softmax).enumerate() {
            self.label(label);
            self.comment(&format!(
                "softmax warpgroup {g}: Q tile {g}'s rows, one a thread"
            ));
            if let Some(regs) = role.regs {
                self.ins(format!("setmaxnreg.inc.sync.aligned.u32 {regs}"));
            }
            self.write_softmax(&p, role, g as u32)?;
            self.ins("exit");
        }
        self.label(&labels[2]);
        self.comment("correction warpgroup: rescales O in TMEM");
        if let Some(regs) = correction.regs {
            self.ins(format!("setmaxnreg.dec.sync.aligned.u32 {regs}"));
        }
        self.write_correction(&p, correction)
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
        let walk = self.open_tile_loop(p.s, p.tiles, c);
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
    pub(super) fn attention_tmem(&mut self, p: &Parts) -> (Reg, Reg) {
        let base = self.tmem_base(p.tmem.slot_offset);
        // TMEM address = (lane << 16) | column: lane 32 (w % 4) is `(w % 4) << 21`.
        let lanes = self.new_reg(Class::B32);
        self.ins(format!("shr.u32 {lanes}, {}, 5", self.tid));
        self.ins(format!("and.b32 {lanes}, {lanes}, 3"));
        self.ins(format!("shl.b32 {lanes}, {lanes}, 21"));
        self.ins(format!("add.u32 {lanes}, {lanes}, {base}"));
        (base, lanes)
    }

    /// A parity wait of op `op`: on a ring barrier as the ring waits (its stage's phase bit,
    /// or the tile's parity); on one of the schedule's own barriers per iteration with
    /// parity `start ^ ((it - lag) & 1)`, per tile `start ^` the tile walk's parity.
    /// `aligned`: the warp reconverges after a wait on the schedule's own barriers (lanes
    /// may leave the wait loop apart; the `.sync.aligned` tcgen05 ops after it need the
    /// whole warp).
    pub(super) fn attn_wait(
        &mut self,
        p: &Parts,
        op: Op,
        it: Reg,
        c: &Cursor,
        aligned: bool,
    ) -> Result<(), CodegenError> {
        let s = p.s;
        let Op::Wait { bar, start, lag } = op else {
            return Err(self.internal(p.id, format!("`{}` is not a wait", named(s, op))));
        };
        if crate::sm90a::ring_barriers(s).contains(&bar) {
            return self.wait(s, c, bar, start, false);
        }
        let m = crate::sm90a::mbarrier(self, s, bar, p.id)?;
        let phase = self.new_reg(Class::B32);
        if m.phase == Phase::Tile {
            let parity = c
                .tile_parity
                .ok_or_else(|| self.internal(p.id, "a per-tile wait outside a tile walk"))?;
            self.ins(format!("xor.b32 {phase}, {parity}, {start}"));
        } else {
            self.ins(format!("and.b32 {phase}, {it}, 1"));
            self.ins(format!("xor.b32 {phase}, {phase}, {}", (start ^ lag) & 1));
        }
        let a = self.bar_at(s, bar)?;
        self.parity_wait_loop("", a, phase);
        if aligned {
            self.ins("bar.warp.sync -1");
        }
        Ok(())
    }

    /// Ops every role writes the same way.
    pub(super) fn attn_common(&mut self, p: &Parts, op: Op) -> Result<(), CodegenError> {
        match op {
            Op::Tcgen05FenceAfter => self.ins("tcgen05.fence::after_thread_sync"),
            Op::Tcgen05FenceBefore => self.ins("tcgen05.fence::before_thread_sync"),
            Op::TmemWaitLoad => self.ins("tcgen05.wait::ld.sync.aligned"),
            Op::TmemWaitStore => self.ins("tcgen05.wait::st.sync.aligned"),
            Op::Arrive { bar, .. } => {
                // One arrival per warp (lane 0).
                let a = self.bar_at(p.s, bar)?;
                let lane0 = self.lane0();
                self.ins(format!("@{lane0} mbarrier.arrive.shared::cta.b64 _, [{a}]"));
            }
            other => {
                return Err(
                    self.internal(p.id, format!("`{}` outside its role", named(p.s, other)))
                );
            }
        }
        Ok(())
    }

    /// The load warp's thread: per pair of tiles its per-tile program (both Q tiles, each at
    /// its tile's coordinates), then its iteration program over the pair's iterations.
    fn write_load_warp(&mut self, p: &Parts, load: &Role) -> Result<(), CodegenError> {
        let s = p.s;
        let mut c = self.cursor(s, &load.program.iteration);
        let pair = self.open_pair(p, &mut c)?;
        for &op in &load.program.tile {
            match op {
                Op::Tma { load: l } if s.once(l) => {
                    self.enter_pair_tile(p, &pair, s.loads[l].work_tile, true)?;
                    self.issue_tma_once(s, l, &c)?;
                }
                // Neither reads the induction variable.
                Op::Wait { .. } | Op::ExpectTx { .. } => self.producer_op(s, &c, op, c.stage)?,
                other => {
                    return Err(self.internal(p.id, format!("load warp op `{}`", named(s, other))));
                }
            }
        }
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        let counted = self.open_counted_loop(iv, hi, step);
        for &op in &load.program.iteration {
            self.producer_op(s, &c, op, iv)?;
        }
        self.advance(&c, s.stages);
        self.close_counted_loop(&counted);
        self.close_pair(&pair, &c);
        Ok(())
    }
}
