//! sm_90a: the body of a persistent kernel (`kiln_ir::sched::tiles`).
//!
//! The roles split at the start. Each walks the work tiles of the logical grid (its
//! `kiln_grid_*` parameters) in the scheduler's order and, per tile, decodes the block index the
//! kernel's `block_id()` reads, runs the ops before the ring loop (the producer only those
//! computing scalars: its TMA coordinates and trip count need nothing else), and its side of
//! the ring; the consumers then run the ops after the loop (the epilogue) while the producer
//! already loads the next tile. The ring's cursors are made once, before the tile loop, so
//! stages and phases carry over; each tile flips the once barriers' parity and, in a rotated
//! loop, restarts the iteration count its release lags test.
//!
//! A clustered ring ([`kiln_ir::cluster`]) walks tile pairs: the scheduler's order runs over
//! the grid of `cdiv(nx, 2)` x pairs, cluster `%clusterid.x` of `%nclusterid.x` taking the
//! places a CTA would, and CTA `r` of the pair runs x block `2 px + r` (past the grid in a
//! ragged last pair: its loads read zeros, its stores are masked off). The consumers meet at
//! a cluster barrier after their last tile.

use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::sched::{Op, Region, Role, RoleKind, Sched};
use kiln_ir::{Kernel, OpId, Type};

use super::Cursor;
use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

/// The registers of a role's walk over the work tiles.
pub(crate) struct TileLoop {
    /// `k * nctaid.x`: where the role's `k`-th wave starts in the tile order.
    wave: Reg,
    ctas: Reg,
    top: String,
    done: String,
}

impl Writer<'_> {
    /// A persistent kernel's ring loop and the top-level ops before and after it.
    pub(crate) fn persistent_parts(&self) -> Result<(OpId, Vec<OpId>, Vec<OpId>), CodegenError> {
        let body = &self.k.body;
        let id = self
            .k
            .schedule
            .sched
            .as_ref()
            .map(|s| s.for_op)
            .ok_or_else(|| {
                CodegenError::Diagnostic(kiln_ir::Diagnostic::internal(
                    Default::default(),
                    "a persistent kernel without its schedule",
                ))
            })?;
        let at = body
            .ops
            .iter()
            .position(|&op| op == id)
            .ok_or_else(|| self.internal(id, "a persistent kernel's ring loop is nested"))?;
        Ok((id, body.ops[..at].to_vec(), body.ops[at + 1..].to_vec()))
    }

    /// Writes the body of a persistent kernel (see the module doc).
    pub(crate) fn write_persistent(&mut self, tiles: TileScheduler) -> Result<(), CodegenError> {
        let (id, before, after) = self.persistent_parts()?;
        let k: &Kernel = self.k;
        let s = k
            .schedule
            .sched
            .as_ref()
            .ok_or_else(|| self.internal(id, "a persistent kernel without its schedule"))?;
        let (consumer, producer) = (
            super::role(self, s, RoleKind::Consumer, id)?,
            super::role(self, s, RoleKind::Producer, id)?,
        );

        let consumer_label = self.split_roles(consumer, producer)?;
        let mut c = self.cursor(s, &producer.program.iteration);
        let tl = self.open_tile_loop(s, tiles, &mut c)?;
        for &op in &before {
            if scalar_only(self.k, op) {
                self.write_op(op)?;
            }
        }
        let bounds = self.loop_bounds(id)?;
        self.write_producer(s, producer, &c, bounds)?;
        self.close_tile_loop(&tl, &c);
        self.ins("exit");

        self.label(&consumer_label);
        self.enter_consumers(s, consumer)?;
        // The turns go round across the tiles: handed over once before the first, taken
        // back once after the last.
        self.cta_turn_ops(s, &consumer.program.start)?;
        let mut c = self.cursor(s, &consumer.program.iteration);
        let tl = self.open_tile_loop(s, tiles, &mut c)?;
        for &op in &before {
            self.write_op(op)?;
        }
        let bounds = self.loop_bounds(id)?;
        let c = self.write_consumers(s, consumer, c, bounds)?;
        for &op in &consumer.program.end {
            match op {
                Op::Run(Region::Epilogue(None)) => self.write_after_ring(s, &after)?,
                other => {
                    return Err(self.internal(
                        id,
                        format!("consumer op `{}` after the loop", super::named(s, other)),
                    ));
                }
            }
        }
        self.close_tile_loop(&tl, &c);
        self.consumer_exit(s, consumer)
    }

    /// The consumers' ops after their last tile: the turn hand-overs, every TMA store's last
    /// wait, the cluster barrier.
    pub(crate) fn consumer_exit(&mut self, s: &Sched, consumer: &Role) -> Result<(), CodegenError> {
        for &op in &consumer.program.exit {
            match op {
                Op::Sync { .. } | Op::Signal { .. } => self.cta_turn_ops(s, &[op])?,
                Op::BulkWaitAll => self.finish_tma_stores(s, &s.stores)?,
                Op::ClusterSync => {
                    self.comment(
                        "no CTA exits while its peer may still write into it or arrive on it",
                    );
                    self.cluster_barrier();
                }
                other => {
                    return Err(self.internal(
                        s.for_op,
                        format!("consumer op `{}` at exit", super::named(s, other)),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The consumers' code after ring loop `id` (`after`, the epilogue): whole, or when the
    /// kernel says so ([`Sched::epilogue_columns`]) on each chunk of that many
    /// accumulator columns in turn. For a chunk the loop's accumulator is its registers in the
    /// chunk's columns, and every tile whose layout holds the accumulator's columns has only
    /// the chunk's registers ([`Writer::columns`]), so each chunk's bias row, temporaries and
    /// staged store take only its columns. Ops that compute only scalars are written with the
    /// first chunk; the later ones reuse their registers.
    fn write_after_ring(&mut self, s: &Sched, after: &[OpId]) -> Result<(), CodegenError> {
        let id = s.for_op;
        let ops: Vec<OpId> = after
            .iter()
            .copied()
            .filter(|&o| self.k.ops[o].kind != kiln_ir::OpKind::Yield)
            .collect();
        let Some(columns) = s.epilogue_columns else {
            return ops.iter().try_for_each(|&op| self.write_op(op));
        };
        let acc = self.k.ops[id]
            .results
            .iter()
            .copied()
            .find(|v| {
                self.k
                    .schedule
                    .layouts
                    .get(v)
                    .is_some_and(kiln_ir::tmem::epilogue::holds_columns)
            })
            .ok_or_else(|| self.internal(id, "a chunked epilogue without an mma accumulator"))?;
        let whole = self.tile(acc, id)?;
        let d = self.k.distribution(acc).map_err(|e| self.internal(id, e))?;
        let n = d
            .regs
            .iter()
            .filter_map(|o| o.last())
            .max()
            .map_or(0, |c| c + 1);
        for (i, start) in (0..n).step_by(columns.max(1) as usize).enumerate() {
            let chunk = start..(start + columns).min(n);
            self.comment(&format!(
                "the code after the loop on accumulator columns {}..{}",
                chunk.start, chunk.end
            ));
            let regs: Vec<Reg> = d
                .regs
                .iter()
                .zip(&whole)
                .filter(|(o, _)| o.last().is_some_and(|c| chunk.contains(c)))
                .map(|(_, &r)| r)
                .collect();
            self.vals.insert(acc, Val::Tile(regs));
            self.columns = Some(chunk);
            // The tiles of another chunk have other registers.
            self.reg_index.clear();
            for &op in &ops {
                if i == 0 || !scalar_only(self.k, op) {
                    self.write_op(op)?;
                }
            }
        }
        self.columns = None;
        self.reg_index.clear();
        self.vals.insert(acc, Val::Tile(whole));
        Ok(())
    }

    /// Opens a role's walk over the work tiles (its `k`-th tile is in wave `k`, see
    /// `kiln_ir::sched::tiles`); the loop ends past the last tile, and the block index of
    /// the tile is decoded into [`Writer::block`]. The cursor gets the wave's parity (which
    /// also flips the once barriers' phase).
    pub(crate) fn open_tile_loop(
        &mut self,
        s: &Sched,
        tiles: TileScheduler,
        c: &mut Cursor,
    ) -> Result<TileLoop, CodegenError> {
        let id = s.for_op;
        let [blocks_x, ny, nz] = self
            .grid
            .ok_or_else(|| self.internal(id, "a persistent kernel without its grid"))?;
        let [cta, ctas, wave, total, parity] = [(); 5].map(|_| self.new_reg(Class::B32));
        let cluster = s.cluster.as_ref().map(|c| c.ctas);
        // A cluster walks the grid of x pairs in the places a CTA would walk the blocks.
        let nx = match cluster {
            Some(n) => {
                let pairs = self.new_reg(Class::B32);
                self.comment("tile pairs: clusters walk the grid of x pairs");
                self.ins(format!("add.u32 {pairs}, {blocks_x}, {}", n - 1));
                self.ins(format!("div.u32 {pairs}, {pairs}, {n}"));
                self.ins(format!("mov.u32 {cta}, %clusterid.x"));
                self.ins(format!("mov.u32 {ctas}, %nclusterid.x"));
                pairs
            }
            None => {
                self.ins(format!("mov.u32 {cta}, %ctaid.x"));
                self.ins(format!("mov.u32 {ctas}, %nctaid.x"));
                blocks_x
            }
        };
        self.ins(format!("mov.u32 {wave}, 0"));
        self.ins(format!("mul.lo.u32 {total}, {nx}, {ny}"));
        self.ins(format!("mul.lo.u32 {total}, {total}, {nz}"));
        self.ins(format!("mov.u32 {parity}, 0"));
        c.tile_parity = Some(parity);
        let (top, done) = (self.new_label(), self.new_label());
        self.label(&top);
        let (tile, finished) = (self.new_reg(Class::B32), self.new_reg(Class::Pred));
        match tiles {
            TileScheduler::Strided | TileScheduler::Grouped { .. } => {
                self.ins(format!("add.u32 {tile}, {wave}, {cta}"))
            }
            TileScheduler::LongestFirst => {
                // Odd waves deal the tiles from the last CTA down.
                let (mirrored, odd) = (self.new_reg(Class::B32), self.new_reg(Class::Pred));
                self.ins(format!("sub.u32 {mirrored}, {ctas}, {cta}"));
                self.ins(format!("sub.u32 {mirrored}, {mirrored}, 1"));
                self.ins(format!("setp.ne.u32 {odd}, {parity}, 0"));
                self.ins(format!("selp.u32 {tile}, {mirrored}, {cta}, {odd}"));
                self.ins(format!("add.u32 {tile}, {tile}, {wave}"));
            }
        }
        self.ins(format!("setp.ge.u32 {finished}, {tile}, {total}"));
        self.ins(format!("@{finished} bra {done}"));
        let [x, y, z] = [(); 3].map(|_| self.new_reg(Class::B32));
        match tiles {
            TileScheduler::Strided => {
                self.comment("work tile: its block index (x fastest)");
                let yz = self.new_reg(Class::B32);
                self.ins(format!("rem.u32 {x}, {tile}, {nx}"));
                self.ins(format!("div.u32 {yz}, {tile}, {nx}"));
                self.ins(format!("rem.u32 {y}, {yz}, {ny}"));
                self.ins(format!("div.u32 {z}, {yz}, {ny}"));
            }
            TileScheduler::LongestFirst => {
                self.comment("work tile: its block index (x slowest, from the last block down)");
                let [planes, yz] = [(); 2].map(|_| self.new_reg(Class::B32));
                self.ins(format!("mul.lo.u32 {planes}, {ny}, {nz}"));
                self.ins(format!("div.u32 {x}, {tile}, {planes}"));
                self.ins(format!("sub.u32 {x}, {nx}, {x}"));
                self.ins(format!("sub.u32 {x}, {x}, 1"));
                self.ins(format!("rem.u32 {yz}, {tile}, {planes}"));
                self.ins(format!("rem.u32 {y}, {yz}, {ny}"));
                self.ins(format!("div.u32 {z}, {yz}, {ny}"));
            }
            TileScheduler::Grouped { rows } => {
                self.comment(&format!(
                    "work tile: its block index (groups of {rows} x blocks, x fastest within)"
                ));
                let [plane, r, first, width, within] = [(); 5].map(|_| self.new_reg(Class::B32));
                self.ins(format!("mul.lo.u32 {plane}, {nx}, {ny}"));
                self.ins(format!("div.u32 {z}, {tile}, {plane}"));
                self.ins(format!("rem.u32 {r}, {tile}, {plane}"));
                self.ins(format!("mul.lo.u32 {first}, {ny}, {rows}"));
                self.ins(format!("div.u32 {first}, {r}, {first}"));
                self.ins(format!("mul.lo.u32 {first}, {first}, {rows}"));
                self.ins(format!("sub.u32 {width}, {nx}, {first}"));
                self.ins(format!("min.u32 {width}, {width}, {rows}"));
                self.ins(format!("mul.lo.u32 {within}, {first}, {ny}"));
                self.ins(format!("sub.u32 {within}, {r}, {within}"));
                self.ins(format!("rem.u32 {x}, {within}, {width}"));
                self.ins(format!("add.u32 {x}, {x}, {first}"));
                self.ins(format!("div.u32 {y}, {within}, {width}"));
            }
        }
        if let Some(n) = cluster {
            let rank = self.cluster_rank();
            self.ins(format!("mad.lo.u32 {x}, {x}, {n}, {rank}"));
        }
        self.block = Some([x, y, z]);
        // A rotated loop's release lags count from the tile's start; an unrotated one's run on
        // (its first release frees the previous tile's last stage).
        if s.roles.iter().any(|r| r.program.rotated) {
            self.ins(format!("mov.u32 {}, 0", c.count));
        }
        Ok(TileLoop {
            wave,
            ctas,
            top,
            done,
        })
    }

    /// Moves to the role's next wave and closes the walk.
    pub(crate) fn close_tile_loop(&mut self, tl: &TileLoop, c: &Cursor) {
        self.ins(format!("add.u32 {0}, {0}, {1}", tl.wave, tl.ctas));
        if let Some(parity) = c.tile_parity {
            self.ins(format!("xor.b32 {parity}, {parity}, 1"));
        }
        self.ins(format!("bra.uni {}", tl.top));
        self.label(&tl.done);
        self.block = None;
    }
}

/// Whether `op` and everything in its regions only compute scalars (no tile, no memory).
pub(crate) fn scalar_only(k: &Kernel, op: OpId) -> bool {
    let o = &k.ops[op];
    let scalar_results = o
        .results
        .iter()
        .all(|&r| matches!(k.ty(r), Type::Scalar(_)));
    let no_memory = !matches!(
        o.kind,
        kiln_ir::OpKind::Load { .. }
            | kiln_ir::OpKind::Store { .. }
            | kiln_ir::OpKind::Print { .. }
            | kiln_ir::OpKind::Mma
    );
    scalar_results
        && no_memory
        && o.regions
            .iter()
            .all(|r| r.ops.iter().all(|&inner| scalar_only(k, inner)))
}
