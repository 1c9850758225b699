//! The tile scheduler's walk of a persistent kernel (`kiln_ir::sched::tiles`): each role walks
//! the work tiles of the logical grid (its `kiln_grid_*` parameters) in the scheduler's order
//! and decodes, per tile, the block index the kernel's `block_id()` reads. A role's cursor is
//! made once, before the tile loop, so stages and phases carry over; each tile flips the
//! per-tile barriers' parity and, in a rotated loop, restarts the iteration count its release
//! lags test.

use kiln_ir::OpId;
use kiln_ir::sched::tiles::TileScheduler;

use super::barrier::{Cursor, cluster_rank};
use super::ops::{Ops, RingMma};
use super::view::View;
use crate::emit::Emitter;
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// The registers of a role's walk over the work tiles.
pub(crate) struct TileLoop {
    /// `k * nctaid.x`: where the role's `k`-th wave starts in the tile order.
    wave: Reg,
    ctas: Reg,
    top: String,
    done: String,
}

impl View<'_> {
    /// In a persistent kernel, opens a role's walk over the work tiles and writes the ops
    /// before the ring loop (`before`) for each, only the scalar ones when `scalars`; in
    /// another the CTA has one tile, whose ops before the loop every thread wrote before the
    /// roles split.
    pub(crate) fn open_tile<M: RingMma>(
        &self,
        e: &mut Emitter<'_>,
        ops: &mut Ops<'_, M>,
        c: &mut Cursor,
        before: &[OpId],
        scalars: bool,
    ) -> Result<Option<TileLoop>, CodegenError> {
        if !self.s.persistent() {
            return Ok(None);
        }
        let (walk, block) = self.open_tile_loop(e, ops.grid, c)?;
        ops.block = Some(block);
        ops.write_before(e, self.k, before, scalars)?;
        Ok(Some(walk))
    }

    /// Closes a role's walk over the work tiles, if it opened one.
    pub(crate) fn close_tile<M>(
        &self,
        e: &mut Emitter<'_>,
        ops: &mut Ops<'_, M>,
        walk: Option<&TileLoop>,
        c: &Cursor,
    ) {
        if let Some(walk) = walk {
            self.close_tile_loop(e, walk, c);
            ops.block = None;
        }
    }

    /// Opens a role's walk over the work tiles of logical grid `grid` (its `k`-th tile is in
    /// wave `k`, see `kiln_ir::sched::tiles`); the loop ends past the last tile. Returns the
    /// walk and the tile's block index. The cursor gets the wave's parity (which also flips
    /// the per-tile barriers' phase).
    ///
    /// A clustered schedule (`kiln_ir::sched::cluster`) walks tile pairs: the order runs over
    /// the grid of `cdiv(nx, 2)` x pairs, cluster `%clusterid.x` of `%nclusterid.x` taking the
    /// places a CTA would, and CTA `r` of the pair runs x block `2 px + r` (past the grid in a
    /// ragged last pair: its loads read zeros, its stores are masked off).
    pub(crate) fn open_tile_loop(
        &self,
        e: &mut Emitter<'_>,
        grid: Option<[Reg; 3]>,
        c: &mut Cursor,
    ) -> Result<(TileLoop, [Reg; 3]), CodegenError> {
        let id = self.for_op();
        let (Some([blocks_x, ny, nz]), Some(tiles)) = (grid, self.s.tiles) else {
            return Err(e.internal(id, "a tile walk without its grid or order"));
        };
        let [cta, ctas, wave, total, parity] = e.new_regs(Class::B32);
        let cluster = self.s.cluster.as_ref().map(|c| c.ctas);
        // A cluster walks the grid of x pairs in the places a CTA would walk the blocks.
        let nx = match cluster {
            Some(n) => {
                let pairs = e.new_reg(Class::B32);
                e.comment("tile pairs: clusters walk the grid of x pairs");
                e.ins(format!("add.u32 {pairs}, {blocks_x}, {}", n - 1));
                e.ins(format!("div.u32 {pairs}, {pairs}, {n}"));
                e.ins(format!("mov.u32 {cta}, %clusterid.x"));
                e.ins(format!("mov.u32 {ctas}, %nclusterid.x"));
                pairs
            }
            None => {
                e.ins(format!("mov.u32 {cta}, %ctaid.x"));
                e.ins(format!("mov.u32 {ctas}, %nctaid.x"));
                blocks_x
            }
        };
        e.ins(format!("mov.u32 {wave}, 0"));
        e.ins(format!("mul.lo.u32 {total}, {nx}, {ny}"));
        e.ins(format!("mul.lo.u32 {total}, {total}, {nz}"));
        e.ins(format!("mov.u32 {parity}, 0"));
        c.tile_parity = Some(parity);
        let (top, done) = (e.new_label(), e.new_label());
        e.label(&top);
        let (tile, finished) = (e.new_reg(Class::B32), e.new_reg(Class::Pred));
        match tiles {
            TileScheduler::Strided | TileScheduler::Grouped { .. } => {
                e.ins(format!("add.u32 {tile}, {wave}, {cta}"))
            }
            TileScheduler::LongestFirst => {
                // Odd waves deal the tiles from the last CTA down.
                let mirrored = e.new_reg(Class::B32);
                e.ins(format!("sub.u32 {mirrored}, {ctas}, {cta}"));
                e.ins(format!("sub.u32 {mirrored}, {mirrored}, 1"));
                let odd = e.setp("ne.u32", parity, 0);
                e.ins(format!("selp.u32 {tile}, {mirrored}, {cta}, {odd}"));
                e.ins(format!("add.u32 {tile}, {tile}, {wave}"));
            }
        }
        e.ins(format!("setp.ge.u32 {finished}, {tile}, {total}"));
        e.ins(format!("@{finished} bra {done}"));
        let [x, y, z] = e.new_regs(Class::B32);
        match tiles {
            TileScheduler::Strided => {
                e.comment("work tile: its block index (x fastest)");
                let yz = e.new_reg(Class::B32);
                e.ins(format!("rem.u32 {x}, {tile}, {nx}"));
                e.ins(format!("div.u32 {yz}, {tile}, {nx}"));
                e.ins(format!("rem.u32 {y}, {yz}, {ny}"));
                e.ins(format!("div.u32 {z}, {yz}, {ny}"));
            }
            TileScheduler::LongestFirst => {
                e.comment(
                    "work tile: the wave's run of tiles in plane order (x fastest), by \
                     decreasing x (kiln_ir::sched::tiles::WaveRun)",
                );
                let plane = wave_run_tile(e, [wave, tile], [ctas, total, nx], x);
                e.ins(format!("rem.u32 {y}, {plane}, {ny}"));
                e.ins(format!("div.u32 {z}, {plane}, {ny}"));
            }
            TileScheduler::Grouped { rows } => {
                e.comment(&format!(
                    "work tile: its block index (groups of {rows} x blocks, x fastest within)"
                ));
                let [plane, r, first, width, within] = e.new_regs(Class::B32);
                e.ins(format!("mul.lo.u32 {plane}, {nx}, {ny}"));
                e.ins(format!("div.u32 {z}, {tile}, {plane}"));
                e.ins(format!("rem.u32 {r}, {tile}, {plane}"));
                e.ins(format!("mul.lo.u32 {first}, {ny}, {rows}"));
                e.ins(format!("div.u32 {first}, {r}, {first}"));
                e.ins(format!("mul.lo.u32 {first}, {first}, {rows}"));
                e.ins(format!("sub.u32 {width}, {nx}, {first}"));
                e.ins(format!("min.u32 {width}, {width}, {rows}"));
                e.ins(format!("mul.lo.u32 {within}, {first}, {ny}"));
                e.ins(format!("sub.u32 {within}, {r}, {within}"));
                e.ins(format!("rem.u32 {x}, {within}, {width}"));
                e.ins(format!("add.u32 {x}, {x}, {first}"));
                e.ins(format!("div.u32 {y}, {within}, {width}"));
            }
        }
        if let Some(n) = cluster {
            let rank = cluster_rank(e);
            e.ins(format!("mad.lo.u32 {x}, {x}, {n}, {rank}"));
        }
        // A rotated loop's release lags count from the tile's start; an unrotated one's run on
        // (its first release frees the previous tile's last stage).
        if self.s.roles.iter().any(|r| r.program.rotated) {
            e.ins(format!("mov.u32 {}, 0", c.count));
        }
        let walk = TileLoop {
            wave,
            ctas,
            top,
            done,
        };
        Ok((walk, [x, y, z]))
    }

    /// Moves to the role's next wave and closes the walk.
    pub(crate) fn close_tile_loop(&self, e: &mut Emitter<'_>, tl: &TileLoop, c: &Cursor) {
        e.ins(format!("add.u32 {0}, {0}, {1}", tl.wave, tl.ctas));
        if let Some(parity) = c.tile_parity {
            e.ins(format!("xor.b32 {parity}, {parity}, 1"));
        }
        e.ins(format!("bra.uni {}", tl.top));
        e.label(&tl.done);
    }
}

/// [`kiln_ir::sched::tiles::WaveRun::tile`] in PTX: of the wave starting at position `start`
/// of `total` (`ctas` positions long, over a grid `nx` wide), the tile at position `at` (the
/// wave's `at - start`-th by decreasing x): writes its x into `x`, returns its plane.
fn wave_run_tile(
    e: &mut Emitter<'_>,
    [start, at]: [Reg; 2],
    [ctas, total, nx]: [Reg; 3],
    x: Reg,
) -> Reg {
    let [r, end, first, first_x, last, last_x, full] = e.new_regs(Class::B32);
    e.ins(format!("sub.u32 {r}, {at}, {start}"));
    e.ins(format!("add.u32 {end}, {start}, {ctas}"));
    e.ins(format!("min.u32 {end}, {end}, {total}"));
    e.ins(format!("div.u32 {first}, {start}, {nx}"));
    e.ins(format!("rem.u32 {first_x}, {start}, {nx}"));
    e.ins(format!("div.u32 {last}, {end}, {nx}"));
    e.ins(format!("rem.u32 {last_x}, {end}, {nx}"));
    e.ins(format!("sub.s32 {full}, {last}, {first}"));
    e.ins(format!("sub.s32 {full}, {full}, 1"));
    // The run's tiles with an x of x0 or more: (nx - x0) full + (nx - max(x0, first_x)) +
    // max(last_x - x0, 0), in signed arithmetic (`full` is -1 inside one plane).
    let at_or_above = |e: &mut Emitter<'_>, x0: Reg| {
        let [n, m, q] = e.new_regs(Class::B32);
        e.ins(format!("sub.s32 {n}, {nx}, {x0}"));
        e.ins(format!("mul.lo.s32 {n}, {n}, {full}"));
        e.ins(format!("max.u32 {m}, {x0}, {first_x}"));
        e.ins(format!("sub.s32 {m}, {nx}, {m}"));
        e.ins(format!("add.s32 {n}, {n}, {m}"));
        e.ins(format!("sub.s32 {q}, {last_x}, {x0}"));
        e.ins(format!("max.s32 {q}, {q}, 0"));
        e.ins(format!("add.s32 {n}, {n}, {q}"));
        n
    };
    // Bisection for the largest x whose tiles and those above it number more than r.
    let [lo, hi, mid, span] = e.new_regs(Class::B32);
    e.ins(format!("mov.u32 {lo}, 0"));
    e.ins(format!("mov.u32 {hi}, {nx}"));
    let (top, found) = (e.new_label(), e.new_label());
    e.label(&top);
    e.ins(format!("sub.u32 {span}, {hi}, {lo}"));
    let done = e.setp("le.u32", span, 1);
    e.ins(format!("@{done} bra {found}"));
    e.ins(format!("add.u32 {mid}, {lo}, {hi}"));
    e.ins(format!("shr.u32 {mid}, {mid}, 1"));
    let n = at_or_above(e, mid);
    let more = e.setp("gt.s32", n, r);
    e.ins(format!("selp.u32 {lo}, {mid}, {lo}, {more}"));
    e.ins(format!("selp.u32 {hi}, {hi}, {mid}, {more}"));
    e.ins(format!("bra.uni {top}"));
    e.label(&found);
    e.ins(format!("mov.u32 {x}, {lo}"));
    let above = e.new_reg(Class::B32);
    e.ins(format!("add.u32 {above}, {lo}, 1"));
    let n = at_or_above(e, above);
    let plane = e.new_reg(Class::B32);
    // Planes in order within one x: from `first` where the run holds this x of it.
    let before = e.setp("lt.u32", lo, first_x);
    e.ins(format!("selp.u32 {plane}, 1, 0, {before}"));
    e.ins(format!("add.u32 {plane}, {plane}, {first}"));
    e.ins(format!("sub.u32 {n}, {r}, {n}"));
    e.ins(format!("add.u32 {plane}, {plane}, {n}"));
    plane
}
