//! sm_100a attention: the FlashAttention-4-style schedule (`docs/targets.md`
//! explains it) as the schedule IR gives it, every role following its program op by op.
//!
//! Before the roles split, thread 0 inits the barriers and the MMA warp allocates TMEM; then
//! each role walks the CTA's pairs of work tiles ([`Pair`]).

mod correction;
mod softmax;

use kiln_ir::sched::tmem::{ACC_ROWS, TmemTileId};
use kiln_ir::sched::{Op, Role, RoleKind};

use super::Sm100a;
use crate::error::CodegenError;
use crate::sched::{self, Cursor, TileLoop};
use crate::types::{Class, Reg};

/// A role's walk over the CTA's pairs of work tiles.
///
/// Before the roles split, thread 0 inits the schedule's barriers and the MMA warp allocates
/// TMEM (under the ring's set-up barrier, which publishes the address). Then the warpgroups
/// take their registers (`setmaxnreg`) and each role walks the CTA's pairs of work tiles
/// ([`Pair`]): a pair is the kernel's tiles `2 p` and `2 p + 1` along x, so the tile scheduler
/// walks a grid of half the x extent. Per pair, each role decodes the block index the
/// kernel's `block_id()` reads for the tile it serves: the load warp for each Q tile in turn,
/// every role for both tiles to learn the pair's walk (from the earlier start to the later
/// end), a softmax warpgroup for its own tile (its scalars, its mask, its own range) before
/// it runs the pair's walk, the iterations outside its own range as no-ops (no score copied,
/// `P = 0`, factors 1: the tile's result is its own loop's).
///
/// Every role counts its loop iterations across tiles (`it`): phase `it` of a per-iteration
/// barrier of one stage is waited with parity `start ^ (it & 1)`, the previous iteration's
/// with the bit flipped; a per-tile barrier uses the tile walk's parity.
pub(super) struct Pair {
    pub(super) walk: TileLoop,
    /// The pair's index along x (the tile walk's x).
    xp: Reg,
    y: Reg,
    z: Reg,
}

impl Sm100a<'_, '_> {
    /// The TMEM column of tile `name` (`S`, `O`) of Q tile `g`.
    pub(super) fn column(&self, name: &str, g: u32) -> Result<u32, CodegenError> {
        self.tmem
            .tile(name, Some(g))
            .map(|TmemTileId(t)| self.tmem.tiles[t].column)
            .ok_or_else(|| {
                self.e.internal(
                    self.v.for_op(),
                    format!("an attention schedule without its {name}{g} tile"),
                )
            })
    }

    /// Shared byte offset of Q tile `g`'s rescale factors (one f32 per row).
    fn factors(&self, g: u32) -> u32 {
        self.v.s.factors_offset.unwrap_or(0) + ACC_ROWS * 4 * g
    }

    /// The roles of an attention schedule (see the module doc).
    pub(super) fn attention(&mut self) -> Result<(), CodegenError> {
        let softmax = [
            self.v.role(self.e, RoleKind::Softmax(0))?,
            self.v.role(self.e, RoleKind::Softmax(1))?,
        ];
        let correction = self.v.role(self.e, RoleKind::Correction)?;
        let load = self.v.role(self.e, RoleKind::Producer)?;
        let mma = self.v.role(self.e, RoleKind::Mma)?;
        let e = &mut *self.e;
        let warp = e.new_reg(Class::B32);
        e.ins(format!("shr.u32 {warp}, {}, 5", e.tid));
        let labels: Vec<String> = (0..3).map(|_| e.new_label()).collect();
        for (r, label) in [softmax[0], softmax[1], correction].iter().zip(&labels) {
            let below = e.setp("lt.u32", warp, r.end_warp());
            e.ins(format!("@{below} bra {label}"));
        }
        e.comment("last warpgroup: the load warp, the mma warp, two idle warps");
        sched::set_registers(e, load, "dec");
        let mma_label = e.branch_if("eq.u32", warp, mma.first_warp);
        sched::elect(e, load);
        e.comment("load warp: one thread issues the Q tiles' and every stage's TMA");
        self.load_warp(load)?;
        self.e.ins("exit");
        self.e.label(&mma_label);
        self.mma_warp(mma)?;
        for (g, (label, role)) in labels.iter().zip(softmax).enumerate() {
            self.e.label(label);
            self.e.comment(&format!(
                "softmax warpgroup {g}: Q tile {g}'s rows, one a thread"
            ));
            sched::set_registers(self.e, role, "inc");
            self.softmax(role, g as u32)?;
            self.e.ins("exit");
        }
        self.e.label(&labels[2]);
        self.e.comment("correction warpgroup: rescales O in TMEM");
        sched::set_registers(self.e, correction, "dec");
        self.correction(correction)
    }

    /// Opens a role's walk over pairs of work tiles (the tile scheduler over the grid with
    /// x halved, rounded up).
    pub(super) fn open_pair(&mut self, c: &mut Cursor) -> Result<Pair, CodegenError> {
        let grid = self.ops.grid.ok_or_else(|| {
            self.e
                .internal(self.v.for_op(), "a persistent kernel without its grid")
        })?;
        let pairs = self.e.new_reg(Class::B32);
        self.e.ins(format!("add.u32 {pairs}, {}, 1", grid[0]));
        self.e.ins(format!("shr.u32 {pairs}, {pairs}, 1"));
        let (walk, [xp, y, z]) =
            self.v
                .open_tile_loop(self.e, Some([pairs, grid[1], grid[2]]), c)?;
        self.ops.block = Some([xp, y, z]);
        Ok(Pair { walk, xp, y, z })
    }

    /// Closes the walk.
    fn close_pair(&mut self, pair: &Pair, c: &Cursor) {
        self.v
            .close_tile(self.e, &mut self.ops, Some(&pair.walk), c);
    }

    /// Points `block_id()` at tile `g` of the pair and writes the ops before the loop (only
    /// the scalar ones when `scalars`).
    fn enter_pair_tile(&mut self, pair: &Pair, g: u32, scalars: bool) -> Result<(), CodegenError> {
        let x = self.e.new_reg(Class::B32);
        self.e.ins(format!("mad.lo.u32 {x}, {}, 2, {g}", pair.xp));
        self.ops.block = Some([x, pair.y, pair.z]);
        self.ops
            .write_before(self.e, self.v.k, &self.before, scalars)
    }

    /// The pair's loop bounds, from the scalar ops before the loop: the earlier of the tiles'
    /// starts, the later of their ends and the step they share (the `tmem` pass checked it
    /// does not depend on x, and is 1 where the starts may differ); a softmax warpgroup runs the
    /// iterations outside its own tile's range as no-ops.
    pub(super) fn pair_bounds(&mut self, pair: &Pair) -> Result<[Reg; 3], CodegenError> {
        self.enter_pair_tile(pair, 0, true)?;
        let [lo0, hi0, _] = self.v.loop_bounds(self.e)?;
        self.enter_pair_tile(pair, 1, true)?;
        let [lo1, hi1, step] = self.v.loop_bounds(self.e)?;
        let (lo, hi) = (self.e.new_reg(Class::B32), self.e.new_reg(Class::B32));
        self.e.ins(format!("min.s32 {lo}, {lo0}, {lo1}"));
        self.e.ins(format!("max.s32 {hi}, {hi0}, {hi1}"));
        Ok([lo, hi, step])
    }

    /// The TMEM base address (lane 0, column 0), read from the shared slot, and the address
    /// of the executing thread's lane: warp `w` reaches lanes `32 (w % 4) ..`, thread `t` of
    /// it lane `32 (w % 4) + t`; returns `(base, lane address)`.
    pub(super) fn lanes(&mut self) -> (Reg, Reg) {
        let base = self.tmem_base();
        let e = &mut *self.e;
        // TMEM address = (lane << 16) | column: lane 32 (w % 4) is `(w % 4) << 21`.
        let lanes = e.new_reg(Class::B32);
        e.ins(format!("shr.u32 {lanes}, {}, 5", e.tid));
        e.ins(format!("and.b32 {lanes}, {lanes}, 3"));
        e.ins(format!("shl.b32 {lanes}, {lanes}, 21"));
        e.ins(format!("add.u32 {lanes}, {lanes}, {base}"));
        (base, lanes)
    }

    /// The load warp's thread: per pair of tiles its per-tile program (both Q tiles, each at
    /// its tile's coordinates), then its iteration program over the pair's iterations.
    fn load_warp(&mut self, load: &Role) -> Result<(), CodegenError> {
        let s = self.v.s;
        let mut c = self.v.cursor(self.e, &load.program.iteration);
        let pair = self.open_pair(&mut c)?;
        for &op in &load.program.tile {
            if let Op::Tma { load: l } = op {
                self.enter_pair_tile(&pair, s.loads[l].work_tile, true)?;
            }
            // Neither reads the induction variable.
            let iv = c.stage;
            self.v.producer_op(self.e, &mut self.ops, &c, op, iv)?;
        }
        let [lo, hi, step] = self.pair_bounds(&pair)?;
        let iv = self.e.new_reg(Class::B32);
        self.e.mov(iv, lo);
        let counted = self.e.open_counted_loop(iv, hi, step);
        self.v
            .producer_iteration(self.e, &mut self.ops, load, &c, iv)?;
        self.e.close_counted_loop(&counted);
        self.close_pair(&pair, &c);
        Ok(())
    }
}
