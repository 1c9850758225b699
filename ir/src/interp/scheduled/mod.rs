//! The CPU execution of a scheduled kernel: the kernel after the pass pipeline, run as its
//! schedule says it runs on the GPU, with the data moving where the schedule moves it.
//!
//! - **Work tiles.** A persistent kernel runs `ctas` CTAs, each walking the work tiles its
//!   [`TileScheduler`] deals it (so a walk that skips or repeats a tile shows in the output);
//!   other kernels run one CTA per grid block. Per tile, the code before the ring loop runs
//!   with the tile's block index, and the code after it once the tile's loop is done.
//! - **Roles and barriers.** The ring's producer and consumer programs run on the protocol
//!   check's abstract machine ([`crate::passes::protocol_check`]), which executes each step
//!   when its barriers let it and reports it here, the producer running ahead as far as the
//!   `empty` barriers allow.
//! - **Shared memory.** The producer's TMA steps write the boxes of each load, read from the
//!   tensor with TMA's zero fill, into the stage's swizzled cells ([`smem`]); the once loads
//!   (attention's `Q`) into their buffer once per tile. A consumer step reads every tile it
//!   multiplies back from those cells at the moment it runs, so a stage refilled before its
//!   last read, a buffer overlapping another, or boxes that miss their tile give wrong or NaN
//!   results.
//! - **Consumer steps.** An unrotated body runs whole at its `wgmma` (or `tcgen05.mma`) step.
//!   A rotated one ([`Overlap`]) runs in three parts: at `wgmma head[i]` the ops before the
//!   code between (the head mma, its loads, the index arithmetic), at `between[i]` the code
//!   between, and at `wgmma tail[i-1]` the tail section (the rescale and the tail mma, with
//!   the loads only it reads) of the iteration before. Each iteration keeps its own values,
//!   which stand for the registers the handoff moves; a part reading a value that no earlier
//!   part of its iteration computed is a schedule error, not a silent recomputation.
//! - **Maximum deferral.** Where the `overlap` pass defers the running maximum
//!   ([`Deferral`]), each consumer warp keeps its reference while all of its rows grew by at
//!   most the threshold, as the PTX writer's vote does, so the code between runs on the same
//!   maximum the GPU's does. (The tail's rescale skip, by a warp whose factors are all 1, is
//!   the identity and needs nothing.)
//! - **Epilogues and TMA stores.** A tile's code after the loop runs when the consumers move
//!   on to the next tile (or finish), while the producer may already be loading the next
//!   one. A store the `tma_store` pass lowered writes its rounds into the swizzled staging
//!   tile, and its boxes reach global memory (clipped as TMA clips them) only when the next
//!   round, the next tile's store or the CTA's exit waits for the bulk copies: a staging tile
//!   that overlaps a stage, or a stage written over it, shows in the output.
//! - **Tensor memory** (sm_100a). The ring's mma accumulates into one TMEM accumulator per
//!   CTA, which the first mma of each tile overwrites (its enable-input flag off); the code
//!   after a tile's loop reads the accumulator as the tile's last mma left it (a tile with no
//!   iterations takes the loop's initial value instead, as the epilogue's `Read` does).
//!
//! The orders the execution takes for granted (which wgmma a release waits for, the staging
//! tile's barriers) are the protocol check's to prove; this execution checks where the data
//! goes and what the consumers compute from it.

mod smem;

use std::collections::BTreeMap;

use crate::kernel::{Block, Kernel, OpId, OpKind, ValueId};
use crate::passes::protocol_check::machine::{At, Machine as Protocol, PRODUCER};
use crate::passes::walk;
use crate::ring::{Deferral, Overlap, Ring, Step, TmaLoad};
use crate::tile_scheduler::TileScheduler;
use crate::tma_store::TmaStore;
use crate::types::DType;

use super::HostArg;
use super::error::InterpError;
use super::exec::Machine;
use super::value::{Elems, Value};
use super::{eval, memory};

use smem::{Boxes, SharedMemory};

/// Runs the scheduled `kernel` (after the pass pipeline) over its logical `grid` with `args`
/// in parameter order, a persistent kernel on `ctas` CTAs (see the module doc). A kernel
/// without a stage ring runs as [`super::run`] runs it.
pub fn run_scheduled(
    kernel: &Kernel,
    grid: [u32; 3],
    ctas: u32,
    args: &mut [HostArg<'_>],
) -> Result<(), InterpError> {
    let g = super::checked(kernel, grid, args)?;
    let mut machine = Machine::new(kernel, args, g, false);
    let Some(ring) = kernel.schedule.rings.values().next() else {
        return machine.run_grid();
    };
    let plan = Plan::new(kernel, ring)?;
    if kernel.schedule.tiles.is_some() && ctas == 0 {
        return Err(plan.error("a persistent kernel needs at least one CTA".into()));
    }
    for tiles in plan.walk(grid, ctas) {
        Cta::new(&plan, &mut machine, tiles)?.run(&mut machine)?;
    }
    Ok(())
}

/// Which ops of the ring's body each consumer step runs.
enum Parts {
    /// An unrotated body: every op at the `wgmma` / `tcgen05.mma` step.
    Whole(Vec<OpId>),
    /// A rotated body (see the module doc).
    Rotated {
        head: Vec<OpId>,
        between: Vec<OpId>,
        tail: Vec<OpId>,
    },
}

/// What the execution needs to know of the kernel and its ring, worked out once.
struct Plan<'k> {
    kernel: &'k Kernel,
    ring: &'k Ring,
    /// The ring loop's body and the values its `yield` passes to the next iteration.
    body: &'k Block,
    yielded: Vec<ValueId>,
    /// Top-level ops before the loop (without the once loads, which the producer issues)
    /// and after it.
    prologue: Vec<OpId>,
    epilogue: Vec<OpId>,
    /// Per ring load, the body ops its coordinates need, in body order.
    coords: Vec<Vec<OpId>>,
    parts: Parts,
    /// sm_100a: the ring's mma (accumulating in tensor memory) and the carried value it
    /// produces.
    tmem_mma: Option<(OpId, usize)>,
    /// Arriving consumer warps, as the protocol check counts them.
    consumer_warps: u32,
    /// The deferred maximum, and per consumer warp the rows of it the warp holds.
    deferral: Option<(Deferral, Vec<Vec<usize>>)>,
}

impl<'k> Plan<'k> {
    fn new(kernel: &'k Kernel, ring: &'k Ring) -> Result<Plan<'k>, InterpError> {
        let error = |what: &str| InterpError::Schedule {
            loc: kernel.ops[ring.for_op].loc,
            what: what.to_string(),
        };
        let at = kernel
            .body
            .ops
            .iter()
            .position(|&o| o == ring.for_op)
            .ok_or_else(|| error("the ring loop is not at the kernel's top level"))?;
        let body = kernel.ops[ring.for_op]
            .regions
            .first()
            .ok_or_else(|| error("the ring loop has no body"))?;
        let (&last, ops) = body
            .ops
            .split_last()
            .ok_or_else(|| error("the ring loop's body is empty"))?;
        if kernel.ops[last].kind != OpKind::Yield {
            return Err(error("the ring loop's body does not end with its yield"));
        }
        let once: Vec<OpId> = ring.once.iter().map(|l| l.load).collect();
        let prologue = kernel.body.ops[..at]
            .iter()
            .copied()
            .filter(|o| !once.contains(o))
            .collect();
        let coords = ring
            .loads
            .iter()
            .map(|l| backward_slice(kernel, ops, &kernel.ops[l.load].operands))
            .collect();
        let parts = match &ring.overlap {
            None => Parts::Whole(ops.to_vec()),
            Some(o) => rotated_parts(kernel, ring, o, ops),
        };
        let yielded = kernel.ops[last].operands.clone();
        let tmem_mma = match kernel.schedule.tmem {
            None => None,
            Some(_) => {
                let mut mmas = ops.iter().filter(|&&o| kernel.ops[o].kind == OpKind::Mma);
                let (Some(&mma), None) = (mmas.next(), mmas.next()) else {
                    return Err(error("a tensor-memory ring loop has one mma"));
                };
                let result = kernel.ops[mma].results[0];
                let carried = yielded
                    .iter()
                    .position(|&v| v == result)
                    .ok_or_else(|| error("the tensor-memory accumulator is not carried"))?;
                Some((mma, carried))
            }
        };
        let consumer_warps = match (&kernel.schedule.tmem, kernel.schedule.roles) {
            (Some(_), _) => 1,
            (None, Some(roles)) => roles.consumer_warps,
            (None, None) => return Err(error("a stage ring without warp roles")),
        };
        let deferral = match ring.overlap.as_ref().and_then(|o| o.defer) {
            None => None,
            Some(d) => Some((
                d,
                warp_rows(kernel, d, consumer_warps).map_err(|e| error(&e))?,
            )),
        };
        Ok(Plan {
            kernel,
            ring,
            body,
            yielded,
            prologue,
            epilogue: kernel.body.ops[at + 1..].to_vec(),
            coords,
            parts,
            tmem_mma,
            consumer_warps,
            deferral,
        })
    }

    fn error(&self, what: String) -> InterpError {
        InterpError::Schedule {
            loc: self.kernel.ops[self.ring.for_op].loc,
            what,
        }
    }

    /// The block indices of the work tiles of each CTA, in the order it runs them.
    fn walk(&self, grid: [u32; 3], ctas: u32) -> Vec<Vec<[i32; 3]>> {
        let block = |b: [u32; 3]| b.map(|x| x as i32);
        match self.kernel.schedule.tiles {
            Some(order) => {
                let total = TileScheduler::tiles(grid);
                (0..ctas)
                    .map(|c| {
                        (0..)
                            .map(|k| order.tile(c, ctas, k))
                            .take_while(|&t| t < total)
                            .map(|t| block(order.block(t as u32, grid)))
                            .collect()
                    })
                    .collect()
            }
            None => {
                let [nx, ny, nz] = grid;
                (0..nz)
                    .flat_map(|z| (0..ny).flat_map(move |y| (0..nx).map(move |x| [x, y, z])))
                    .map(|b| vec![block(b)])
                    .collect()
            }
        }
    }
}

/// The ops of a rotated body in its three parts (see the module doc): the code between and
/// the tail section as the `overlap` pass chose them, the ring loads only the tail reads with
/// the tail, and everything else with the head.
fn rotated_parts(kernel: &Kernel, ring: &Ring, o: &Overlap, ops: &[OpId]) -> Parts {
    let tail_only = |op: OpId| {
        ring.loads.iter().any(|l| l.load == op)
            && kernel.ops[op].results.iter().all(|&r| {
                ops.iter()
                    .filter(|&&u| uses(kernel, u, r))
                    .all(|u| o.tail_ops.contains(u))
            })
    };
    let (mut head, mut between, mut tail) = (Vec::new(), Vec::new(), Vec::new());
    for &op in ops {
        if o.between.contains(&op) {
            between.push(op);
        } else if o.tail_ops.contains(&op) || tail_only(op) {
            tail.push(op);
        } else {
            head.push(op);
        }
    }
    Parts::Rotated {
        head,
        between,
        tail,
    }
}

/// Per consumer warp, the rows of the deferred maximum its threads hold (each row in one
/// warp: a warp's vote decides for its rows alone).
fn warp_rows(kernel: &Kernel, d: Deferral, warps: u32) -> Result<Vec<Vec<usize>>, String> {
    let m_new = kernel.ops[d.max].results[0];
    let dist = kernel.distribution(m_new)?;
    let rows = kernel.ty(m_new).shape().map_or(1, |s| s.dims()[0]);
    let mut owner = vec![None; rows];
    let mut out = vec![Vec::new(); warps as usize];
    for tid in 0..32 * warps {
        let w = (tid / 32) as usize;
        for c in dist.coords(tid) {
            let r = c[0] as usize;
            match owner.get(r).copied().flatten() {
                None if r < rows => {
                    owner[r] = Some(w);
                    out[w].push(r);
                }
                Some(o) if o == w => {}
                _ => {
                    return Err(format!(
                        "row {r} of the deferred maximum is held by two warps"
                    ));
                }
            }
        }
    }
    match owner.iter().position(Option::is_none) {
        Some(r) => Err(format!(
            "no consumer warp holds row {r} of the deferred maximum"
        )),
        None => Ok(out),
    }
}

/// Whether `op` (or an op inside its regions) reads `v`.
fn uses(kernel: &Kernel, op: OpId, v: ValueId) -> bool {
    std::iter::once(op)
        .chain(walk::ops_in_block_regions(kernel, op))
        .any(|o| kernel.ops[o].operands.contains(&v))
}

/// The ops of `ops` (one block, in its order) that `roots` depend on, in that order.
fn backward_slice(kernel: &Kernel, ops: &[OpId], roots: &[ValueId]) -> Vec<OpId> {
    let mut needed: Vec<ValueId> = roots.to_vec();
    let mut picked = vec![false; ops.len()];
    for (at, &op) in ops.iter().enumerate().rev() {
        if kernel.ops[op].results.iter().any(|r| needed.contains(r)) {
            picked[at] = true;
            needed.extend(free_operands(kernel, op));
        }
    }
    ops.iter()
        .zip(picked)
        .filter_map(|(&op, p)| p.then_some(op))
        .collect()
}

/// The values `op` and the ops inside its regions read that are defined outside it.
fn free_operands(kernel: &Kernel, op: OpId) -> Vec<ValueId> {
    let inner = walk::ops_in_block_regions(kernel, op);
    let mut defined: Vec<ValueId> = Vec::new();
    for &o in std::iter::once(&op).chain(&inner) {
        defined.extend(
            kernel.ops[o]
                .regions
                .iter()
                .flat_map(|r| r.args.iter().copied()),
        );
        defined.extend(kernel.ops[o].results.iter().copied());
    }
    std::iter::once(op)
        .chain(inner)
        .flat_map(|o| kernel.ops[o].operands.iter().copied())
        .filter(|v| !defined.contains(v))
        .collect()
}

/// Environments: every SSA value's contents, as [`Machine`] holds them.
type Env = Vec<Option<Value>>;

/// One work tile of a CTA.
struct Tile {
    block: [i32; 3],
    /// The values of the code before the loop.
    env: Env,
    /// The loop's start and step, its trip count, and the ring iteration of its first trip
    /// (iterations count on across the CTA's tiles).
    lo: i32,
    step: i32,
    trips: u32,
    base: u32,
}

/// One CTA's execution: its tiles, each iteration's values, shared and tensor memory.
struct Cta<'p, 'k> {
    plan: &'p Plan<'k>,
    tiles: Vec<Tile>,
    /// The values of iteration `t` of tile `k`, keyed `(k, t)`.
    iterations: BTreeMap<(usize, u32), Env>,
    smem: SharedMemory,
    /// sm_100a: the TMEM accumulator, and what each tile's last mma left in it.
    tmem: Option<Value>,
    tmem_left: Vec<Option<Value>>,
    /// Tiles whose code after the loop has run.
    finished: usize,
    /// TMA-store boxes issued but not yet waited for: the store, the box, the store's tile
    /// coordinates and element type.
    bulk: Vec<(&'k TmaStore, usize, Vec<i32>, DType)>,
}

impl<'p, 'k> Cta<'p, 'k> {
    /// Runs the code before the loop of each tile (which the producer and consumers share)
    /// and counts the tiles' trips.
    fn new(
        plan: &'p Plan<'k>,
        m: &mut Machine<'k, '_, '_>,
        blocks: Vec<[i32; 3]>,
    ) -> Result<Cta<'p, 'k>, InterpError> {
        let kernel = plan.kernel;
        let mut tiles = Vec::with_capacity(blocks.len());
        let mut base = 0;
        for block in blocks {
            let mut env = vec![None; kernel.values.len()];
            m.set_block(block);
            m.swap_env(&mut env);
            let ran = m.exec_ops(&plan.prologue);
            let bounds: Vec<Option<i32>> = kernel.ops[plan.ring.for_op].operands[..3]
                .iter()
                .map(|&v| m.value(v).and_then(Value::as_i32))
                .collect();
            m.swap_env(&mut env);
            ran?;
            let &[Some(lo), Some(hi), Some(step)] = &bounds[..] else {
                return Err(plan.error("the loop's bounds are not computed before it".into()));
            };
            if step <= 0 {
                return Err(InterpError::NonPositiveStep {
                    loc: kernel.ops[plan.ring.for_op].loc,
                    step,
                });
            }
            let span = (i64::from(hi) - i64::from(lo)).max(0);
            let trips = (span + i64::from(step) - 1) / i64::from(step);
            let trips = u32::try_from(trips).map_err(|_| plan.error("too many trips".into()))?;
            tiles.push(Tile {
                block,
                env,
                lo,
                step,
                trips,
                base,
            });
            base += trips;
        }
        let n = tiles.len();
        Ok(Cta {
            plan,
            tiles,
            iterations: BTreeMap::new(),
            smem: SharedMemory::new(kernel.schedule.smem_bytes),
            tmem: None,
            tmem_left: vec![None; n],
            finished: 0,
            bulk: Vec::new(),
        })
    }

    /// Runs the roles' programs, moving the data at each step, then each tile's code after
    /// the loop.
    fn run(mut self, m: &mut Machine<'k, '_, '_>) -> Result<(), InterpError> {
        let plan = self.plan;
        let trips: Vec<u32> = self.tiles.iter().map(|t| t.trips).collect();
        let mut failed = None;
        let protocol =
            Protocol::new(plan.ring, plan.consumer_warps).run_observed(&trips, &mut |role, at| {
                match self.step(m, role, at) {
                    Ok(()) => true,
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                }
            });
        if let Some(e) = failed {
            return Err(e);
        }
        protocol.map_err(|e| plan.error(format!("the barrier protocol fails: {e}")))?;
        self.finish_tiles(m, self.tiles.len())?;
        self.wait_bulk(m)
    }

    /// Moves the data of one executed step: `role` 0 is the producer, 1 the first consumer
    /// warpgroup (which stands for all: the others run the same steps on the same stages).
    fn step(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        role: usize,
        at: At,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let k = at.tile as usize;
        let t = at.i - self.tiles[k].base;
        let stage = |i: u32| i % plan.ring.stages;
        if role == PRODUCER {
            return match at.step {
                Step::Tma { load } => self.tma(m, k, t, load, stage(at.i)),
                Step::TmaOnce { load } => self.tma_once(m, k, load),
                _ => Ok(()),
            };
        }
        if role != 1 {
            return Ok(());
        }
        self.finish_tiles(m, k)?;
        match (&plan.parts, at.step) {
            (Parts::Whole(ops), Step::Mma | Step::Tcgen05Mma) => {
                self.consume(m, k, t, ops, stage(at.i))
            }
            (Parts::Rotated { head, .. }, Step::IssueHead) => {
                self.consume(m, k, t, head, stage(at.i))
            }
            (Parts::Rotated { between, .. }, Step::Between) => {
                self.consume(m, k, t, between, stage(at.i))
            }
            (Parts::Rotated { tail, .. }, Step::IssueTail) => {
                self.consume(m, k, t - 1, tail, stage(at.i - 1))
            }
            _ => Ok(()),
        }
    }

    /// The producer's TMA of ring load `load` for iteration `t` of tile `k`: its coordinates
    /// computed as the producer computes them, its boxes written into `stage`.
    fn tma(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        t: u32,
        load: usize,
        stage: u32,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let l = &plan.ring.loads[load];
        let mut env = self.tiles[k].env.clone();
        env[plan.body.args[0].index()] = Some(self.iv(k, t));
        m.swap_env(&mut env);
        let ran = m.exec_ops(&plan.coords[load]);
        let coords = self.coords(m, l.load);
        m.swap_env(&mut env);
        ran?;
        self.write(m, l, stage, &coords?)
    }

    /// The producer's TMA of once load `load` for tile `k`.
    fn tma_once(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        load: usize,
    ) -> Result<(), InterpError> {
        let l = &self.plan.ring.once[load];
        m.swap_env(&mut self.tiles[k].env);
        let coords = self.coords(m, l.load);
        m.swap_env(&mut self.tiles[k].env);
        self.write(m, l, 0, &coords?)
    }

    /// The coordinates of `load`'s tile, from the current environment.
    fn coords(&self, m: &Machine<'k, '_, '_>, load: OpId) -> Result<Vec<i32>, InterpError> {
        self.plan.kernel.ops[load]
            .operands
            .iter()
            .map(|&v| m.value(v).and_then(Value::as_i32))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                self.plan.error(format!(
                    "the producer cannot compute the coordinates of {load}"
                ))
            })
    }

    /// A TMA load of `l`'s tile at `coords` into `stage`.
    fn write(
        &mut self,
        m: &Machine<'k, '_, '_>,
        l: &TmaLoad,
        stage: u32,
        coords: &[i32],
    ) -> Result<(), InterpError> {
        let tensor = m.tensor_arg(l.param).ok_or_else(|| {
            self.plan
                .error(format!("parameter {} is not a tensor", l.param))
        })?;
        self.smem
            .load(&Boxes::load(l, stage), tensor, coords)
            .map_err(|e| self.plan.error(e))
    }

    /// The induction variable of iteration `t` of tile `k`.
    fn iv(&self, k: usize, t: u32) -> Value {
        let tile = &self.tiles[k];
        Value::i32(tile.lo.wrapping_add((t as i32).wrapping_mul(tile.step)))
    }

    /// Runs `ops` of iteration `t` of tile `k` (a consumer step), its ring loads and the once
    /// loads read from shared memory now, the ring's from `stage`.
    fn consume(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        t: u32,
        ops: &[OpId],
        stage: u32,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        let mut env = self.iteration(k, t);
        for l in &plan.ring.loads {
            if ops.contains(&l.load) {
                m.serve(l.load, self.read(l, stage)?);
            }
        }
        for l in &plan.ring.once {
            env[kernel.ops[l.load].results[0].index()] = Some(self.read(l, 0)?);
        }
        m.swap_env(&mut env);
        let ran = ops.iter().try_for_each(|&op| self.run_op(m, t, op));
        m.swap_env(&mut env);
        m.unserve();
        self.iterations.insert((k, t), env);
        if let Some((_, carried)) = plan.tmem_mma {
            self.tmem_left[k] = self.iterations[&(k, t)][plan.yielded[carried].index()].clone();
        }
        ran
    }

    /// Runs one op of a consumer step, after checking that every value it reads exists.
    fn run_op(&mut self, m: &mut Machine<'k, '_, '_>, t: u32, op: OpId) -> Result<(), InterpError> {
        let kernel = self.plan.kernel;
        if let Some(v) = free_operands(kernel, op)
            .into_iter()
            .find(|&v| !m.is_bound(v))
        {
            return Err(self.plan.error(format!(
                "{op} runs before {v}, which it reads, is computed (`{}`)",
                crate::print::op_str(kernel, op)
            )));
        }
        match self.plan.tmem_mma {
            Some((mma, _)) if mma == op => {
                let operand = |i: usize| m.value(kernel.ops[op].operands[i]);
                let (Some(a), Some(b)) = (operand(0), operand(1)) else {
                    return Err(self.plan.error(format!("{op} has no operands")));
                };
                // The first tcgen05.mma of a tile overwrites the accumulator.
                let acc = if t == 0 { None } else { self.tmem.as_ref() };
                let d = eval::mma(a, b, acc).map_err(|_| self.plan.error(format!("{op}")))?;
                self.tmem = Some(d.clone());
                m.bind(kernel.ops[op].results[0], d);
                Ok(())
            }
            _ => {
                m.exec_ops(&[op])?;
                match &self.plan.deferral {
                    Some((d, warps)) if d.max == op => self.defer(m, *d, warps),
                    _ => Ok(()),
                }
            }
        }
    }

    /// The deferred maximum: each warp keeps the carried reference for its rows while every
    /// one of them grew by at most the threshold (a NaN growth, from a `-inf` reference,
    /// never stays), as the PTX writer's vote decides.
    fn defer(
        &self,
        m: &mut Machine<'k, '_, '_>,
        d: Deferral,
        warps: &[Vec<usize>],
    ) -> Result<(), InterpError> {
        let m_new = self.plan.kernel.ops[d.max].results[0];
        let (Some(new), Some(old)) = (m.value(m_new), m.value(d.carried)) else {
            return Err(self
                .plan
                .error(format!("{} defers a maximum it has not computed", d.max)));
        };
        let (Elems::F(new_rows), Elems::F(old_rows)) = (&new.elems, &old.elems) else {
            return Err(self
                .plan
                .error(format!("{} defers a maximum that is not float", d.max)));
        };
        let mut chosen = new_rows.clone();
        for rows in warps {
            if rows
                .iter()
                .all(|&r| new_rows[r] - old_rows[r] <= Deferral::THRESHOLD)
            {
                for &r in rows {
                    chosen[r] = old_rows[r];
                }
            }
        }
        let deferred = Value {
            elems: Elems::F(chosen),
            ..new.clone()
        };
        m.bind(m_new, deferred);
        Ok(())
    }

    /// The tile `l` holds in `stage`, as the consumer reads it now.
    fn read(&self, l: &TmaLoad, stage: u32) -> Result<Value, InterpError> {
        let ty = self.plan.kernel.ty(self.plan.kernel.ops[l.load].results[0]);
        let dims = ty.shape().map(|s| s.dims().to_vec()).unwrap_or_default();
        self.smem
            .read_tile(&Boxes::load(l, stage), ty.dtype(), &dims)
            .map_err(|e| self.plan.error(e))
    }

    /// Iteration `t` of tile `k`'s values (taken out of the map while a step runs): the
    /// code before the loop, the induction variable, and each carried value once the step
    /// that computes it in the iteration before has run.
    fn iteration(&mut self, k: usize, t: u32) -> Env {
        let plan = self.plan;
        let mut env = match self.iterations.remove(&(k, t)) {
            Some(env) => env,
            None => {
                let mut env = self.tiles[k].env.clone();
                env[plan.body.args[0].index()] = Some(self.iv(k, t));
                env
            }
        };
        let init = &plan.kernel.ops[plan.ring.for_op].operands[3..];
        for (j, &arg) in plan.body.args[1..].iter().enumerate() {
            if env[arg.index()].is_some() {
                continue;
            }
            env[arg.index()] = if t == 0 {
                self.tiles[k].env[init[j].index()].clone()
            } else {
                self.iterations
                    .get(&(k, t - 1))
                    .and_then(|prev| prev[plan.yielded[j].index()].clone())
            };
        }
        env
    }

    /// Runs the code after the loop of every tile before tile `upto` not yet finished.
    fn finish_tiles(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        upto: usize,
    ) -> Result<(), InterpError> {
        while self.finished < upto {
            self.epilogue(m, self.finished)?;
            self.finished += 1;
        }
        Ok(())
    }

    /// Tile `k`'s code after the loop, with the loop's results: the carried values of its
    /// last iteration (the accumulator in tensor memory as the tile's last mma left it).
    fn epilogue(&mut self, m: &mut Machine<'k, '_, '_>, k: usize) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        let init = &kernel.ops[plan.ring.for_op].operands[3..];
        let results = &kernel.ops[plan.ring.for_op].results;
        let trips = self.tiles[k].trips;
        let last = trips.checked_sub(1).map(|t| &self.iterations[&(k, t)]);
        let mut env = std::mem::take(&mut self.tiles[k].env);
        for (j, &r) in results.iter().enumerate() {
            env[r.index()] = match last {
                Some(last) => last[plan.yielded[j].index()].clone(),
                None => env[init[j].index()].clone(),
            };
        }
        if let Some((_, carried)) = plan.tmem_mma
            && trips > 0
        {
            env[results[carried].index()] = self.tmem_left[k].take();
        }
        if results.iter().any(|r| env[r.index()].is_none()) {
            return Err(plan.error(format!(
                "tile {k}'s loop results are not all computed by its last iteration"
            )));
        }
        m.set_block(self.tiles[k].block);
        m.swap_env(&mut env);
        let ran =
            plan.epilogue
                .iter()
                .try_for_each(|&op| match kernel.schedule.tma_stores.get(&op) {
                    Some(st) => self.tma_store(m, st),
                    None => m.exec_ops(&[op]).map(drop),
                });
        m.swap_env(&mut env);
        for t in 0..trips {
            self.iterations.remove(&(k, t));
        }
        ran
    }

    /// A store the `tma_store` pass lowered: per round, the bulk copies of the last one
    /// waited for, then the round's boxes staged and issued.
    fn tma_store(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        st: &'k TmaStore,
    ) -> Result<(), InterpError> {
        let kernel = self.plan.kernel;
        let op = &kernel.ops[st.store];
        let (&value, coord_ids) = op
            .operands
            .split_last()
            .ok_or_else(|| self.plan.error(format!("{} stores nothing", st.store)))?;
        let coords: Option<Vec<i32>> = coord_ids
            .iter()
            .map(|&v| m.value(v).and_then(Value::as_i32))
            .collect();
        let (Some(tile), Some(coords)) = (m.value(value).cloned(), coords) else {
            return Err(self.plan.error(format!(
                "{} stores a tile the code after the loop did not compute",
                st.store
            )));
        };
        let per = st.boxes_per_round() as usize;
        for round in 0..st.rounds as usize {
            self.wait_bulk(m)?;
            let boxes = round * per..(round + 1) * per;
            self.smem
                .stage(&Boxes::store(st, boxes.clone()), &tile)
                .map_err(|e| self.plan.error(e))?;
            self.bulk
                .extend(boxes.map(|b| (st, b, coords.clone(), tile.dtype)));
        }
        Ok(())
    }

    /// Completes every issued TMA-store box: reads it from the staging tile now and writes
    /// it to global memory, clipped to the tensor.
    fn wait_bulk(&mut self, m: &mut Machine<'k, '_, '_>) -> Result<(), InterpError> {
        for (st, b, coords, dtype) in std::mem::take(&mut self.bulk) {
            let boxes = Boxes::store(st, 0..st.boxes.len());
            let data = self
                .smem
                .read_box(&boxes, b, dtype)
                .map_err(|e| self.plan.error(e))?;
            let stored = m
                .tensor_arg_mut(st.param)
                .map(|t| memory::store(t, &boxes.at(b, &coords), &data));
            if !matches!(stored, Some(Ok(()))) {
                return Err(self
                    .plan
                    .error(format!("{} cannot store its box {b}", st.store)));
            }
        }
        Ok(())
    }
}
