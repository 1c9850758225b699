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
//! - **The sm_100a attention schedule** ([`crate::tmem::attention`]) runs its five roles on
//!   its own protocol machine ([`attention_execution`]): pairs of Q tiles over one key walk,
//!   `S`, `P` and `O` in tensor memory, the softmax's per-row deferral and polynomial share of
//!   the exponentials, the correction's rescale of `O`, each tile's own store.
//!
//! The orders the execution takes for granted (which wgmma a release waits for, the staging
//! tile's barriers) are the protocol check's to prove; this execution checks where the data
//! goes and what the consumers compute from it.

mod attention_execution;
mod ring_execution;
mod smem;

use crate::kernel::{Block, Kernel, OpId, OpKind, ValueId};
use crate::passes::walk;
use crate::ring::{Deferral, Overlap, Ring, TmaLoad};
use crate::sched::tiles::TileScheduler;
use crate::tma_store::TmaStore;
use crate::types::DType;

use super::HostArg;
use super::error::InterpError;
use super::exec::Machine;
use super::memory;
use super::value::{Elems, Value};

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
    match &kernel.schedule.attention {
        Some(attention) => attention_execution::run(&plan, attention, &mut machine, grid, ctas),
        None => match &ring.cluster {
            None => {
                for tiles in plan.walk(grid, ctas) {
                    ring_execution::RingCta::new(&plan, &mut machine, tiles)?.run(&mut machine)?;
                }
                Ok(())
            }
            Some(c) => {
                for cluster in plan.walk_clusters(grid, ctas, c.ctas)? {
                    ring_execution::run_cluster(&plan, &mut machine, cluster)?;
                }
                Ok(())
            }
        },
    }
}

/// Which ops of the ring's body each consumer step runs.
pub(super) enum Parts {
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
pub(super) struct Plan<'k> {
    pub(super) kernel: &'k Kernel,
    pub(super) ring: &'k Ring,
    /// The ring loop's body and the values its `yield` passes to the next iteration.
    pub(super) body: &'k Block,
    pub(super) yielded: Vec<ValueId>,
    /// Top-level ops before the loop (without the once loads, which the producer issues)
    /// and after it.
    pub(super) prologue: Vec<OpId>,
    pub(super) epilogue: Vec<OpId>,
    /// Per ring load, the body ops its coordinates need, in body order.
    pub(super) coords: Vec<Vec<OpId>>,
    pub(super) parts: Parts,
    /// sm_100a: the ring's mma (accumulating in tensor memory) and the carried value it
    /// produces.
    pub(super) tmem_mma: Option<(OpId, usize)>,
    /// Arriving consumer warps, as the protocol check counts them.
    pub(super) consumer_warps: u32,
    /// The deferred maximum, and per consumer warp the rows of it the warp holds.
    pub(super) deferral: Option<(Deferral, Vec<Vec<usize>>)>,
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
            // The attention plan's roles are its own ([`attention_execution`]).
            (None, None) if kernel.schedule.attention.is_some() => 0,
            (None, None) => return Err(error("a stage ring without warp roles")),
        };
        let deferral = match ring.overlap.as_ref().and_then(|o| o.defer) {
            None => None,
            Some(_) if consumer_warps == 0 => None,
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

    pub(super) fn error(&self, what: String) -> InterpError {
        InterpError::Schedule {
            loc: self.kernel.ops[self.ring.for_op].loc,
            what,
        }
    }

    /// A clustered ring's walk ([`crate::cluster`]), cluster by cluster, per CTA of the
    /// cluster the blocks of its tiles: the scheduler deals tile pairs over the grid of x
    /// pairs as it deals tiles to CTAs, and CTA `r` of the cluster takes x block
    /// `size * px + r` (past the grid in a ragged last pair).
    pub(super) fn walk_clusters(
        &self,
        [nx, ny, nz]: [u32; 3],
        ctas: u32,
        size: u32,
    ) -> Result<Vec<Vec<Vec<[i32; 3]>>>, InterpError> {
        if !ctas.is_multiple_of(size) {
            return Err(self.error(format!(
                "{ctas} CTAs are not a whole number of clusters of {size}"
            )));
        }
        let pairs = self.walk([nx.div_ceil(size), ny, nz], ctas / size);
        Ok(pairs
            .into_iter()
            .map(|tiles| {
                (0..size as i32)
                    .map(|r| {
                        let x = |b: &[i32; 3]| [b[0] * size as i32 + r, b[1], b[2]];
                        tiles.iter().map(x).collect()
                    })
                    .collect()
            })
            .collect())
    }

    /// The block indices of the work tiles of each CTA, in the order it runs them.
    pub(super) fn walk(&self, grid: [u32; 3], ctas: u32) -> Vec<Vec<[i32; 3]>> {
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
pub(super) fn backward_slice(kernel: &Kernel, ops: &[OpId], roots: &[ValueId]) -> Vec<OpId> {
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
pub(super) fn free_operands(kernel: &Kernel, op: OpId) -> Vec<ValueId> {
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
pub(super) type Env = Vec<Option<Value>>;

/// One work tile of a CTA: its block index, the values of the code before its loop, and the
/// loop's start, step and trip count.
pub(super) struct Tile {
    pub(super) block: [i32; 3],
    pub(super) env: Env,
    pub(super) lo: i32,
    pub(super) step: i32,
    pub(super) trips: u32,
}

impl Tile {
    /// Runs the code before the loop (which every role shares) for `block`.
    pub(super) fn new(
        plan: &Plan<'_>,
        m: &mut Machine<'_, '_, '_>,
        block: [i32; 3],
    ) -> Result<Tile, InterpError> {
        let kernel = plan.kernel;
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
        let trips = trips(lo, hi, step).ok_or_else(|| plan.error("too many trips".into()))?;
        Ok(Tile {
            block,
            env,
            lo,
            step,
            trips,
        })
    }

    /// The loop's end (one step past its last iteration's index, or its start).
    pub(super) fn end(&self) -> i32 {
        self.lo
            .wrapping_add((self.trips as i32).wrapping_mul(self.step))
    }

    /// The induction variable of iteration `t`.
    pub(super) fn iv(&self, t: u32) -> Value {
        Value::i32(self.lo.wrapping_add((t as i32).wrapping_mul(self.step)))
    }

    /// The values the loop starts from (its `for`'s operands after the bounds).
    pub(super) fn initial(&self, plan: &Plan<'_>) -> Vec<Option<Value>> {
        plan.kernel.ops[plan.ring.for_op].operands[3..]
            .iter()
            .map(|v| self.env[v.index()].clone())
            .collect()
    }
}

/// Trips of `lo..hi` by `step` (positive).
pub(super) fn trips(lo: i32, hi: i32, step: i32) -> Option<u32> {
    let span = (i64::from(hi) - i64::from(lo)).max(0);
    u32::try_from((span + i64::from(step) - 1) / i64::from(step)).ok()
}

/// Runs one op of a role's step, after checking that every value it reads exists (a value
/// no earlier step computed is a schedule error, not a silent recomputation).
pub(super) fn run_checked(
    plan: &Plan<'_>,
    m: &mut Machine<'_, '_, '_>,
    op: OpId,
) -> Result<(), InterpError> {
    let kernel = plan.kernel;
    if let Some(v) = free_operands(kernel, op)
        .into_iter()
        .find(|&v| !m.is_bound(v))
    {
        return Err(plan.error(format!(
            "{op} runs before {v}, which it reads, is computed (`{}`)",
            crate::print::op_str(kernel, op)
        )));
    }
    m.exec_ops(&[op]).map(drop)
}

/// The deferred maximum: each group of rows keeps the carried reference while every one of
/// them grew by at most the threshold (a NaN growth, from a `-inf` reference, never stays).
/// The groups are a warp's rows on sm_90a (its vote decides) and single rows on sm_100a.
pub(super) fn defer(
    plan: &Plan<'_>,
    m: &mut Machine<'_, '_, '_>,
    d: Deferral,
    groups: &[Vec<usize>],
) -> Result<(), InterpError> {
    let m_new = plan.kernel.ops[d.max].results[0];
    let (Some(new), Some(old)) = (m.value(m_new), m.value(d.carried)) else {
        return Err(plan.error(format!("{} defers a maximum it has not computed", d.max)));
    };
    let (Elems::F(new_rows), Elems::F(old_rows)) = (&new.elems, &old.elems) else {
        return Err(plan.error(format!("{} defers a maximum that is not float", d.max)));
    };
    let mut chosen = new_rows.clone();
    for rows in groups {
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

/// The first error of a data step, which stops the protocol machine driving it.
#[derive(Default)]
pub(super) struct Stop {
    failed: Option<InterpError>,
}

impl Stop {
    /// Whether the machine may go on after a step that gave `r`.
    pub(super) fn keep(&mut self, r: Result<(), InterpError>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                self.failed = Some(e);
                false
            }
        }
    }

    /// The run's outcome: the data step's error, else the protocol's as a schedule error.
    pub(super) fn finish(
        self,
        plan: &Plan<'_>,
        protocol: Result<(), crate::passes::legacy_protocol::ProtocolError>,
    ) -> Result<(), InterpError> {
        match self.failed {
            Some(e) => Err(e),
            None => protocol.map_err(|e| plan.error(format!("the barrier protocol fails: {e}"))),
        }
    }
}

/// A CTA's shared memory and the TMA stores in flight from it.
pub(super) struct Memory<'p, 'k> {
    plan: &'p Plan<'k>,
    smem: SharedMemory,
    /// TMA-store boxes issued but not yet waited for: the store, the box, the store's tile
    /// coordinates and element type.
    bulk: Vec<(&'p TmaStore, usize, Vec<i32>, DType)>,
}

impl<'p, 'k> Memory<'p, 'k> {
    /// The kernel's shared memory, every cell NaN.
    pub(super) fn new(plan: &'p Plan<'k>) -> Memory<'p, 'k> {
        Memory {
            plan,
            smem: SharedMemory::new(plan.kernel.schedule.smem_bytes),
            bulk: Vec::new(),
        }
    }

    /// A TMA load of `l` into `stage`, its coordinates computed in `env` by the ops `slice`
    /// (those of a ring load for the iteration; none for a once load, whose coordinates the
    /// code before the loop computed).
    pub(super) fn tma(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        l: &TmaLoad,
        stage: u32,
        env: &mut Env,
        slice: &[OpId],
    ) -> Result<(), InterpError> {
        let coords = self.tma_coords(m, l, env, slice)?;
        self.tma_boxes(m, l, stage, &coords, None)
    }

    /// The coordinates of `l`'s tile, computed in `env` by the ops `slice` (see
    /// [`Memory::tma`]).
    pub(super) fn tma_coords(
        &self,
        m: &mut Machine<'k, '_, '_>,
        l: &TmaLoad,
        env: &mut Env,
        slice: &[OpId],
    ) -> Result<Vec<i32>, InterpError> {
        m.swap_env(env);
        let ran = m.exec_ops(slice);
        let coords: Option<Vec<i32>> = self.plan.kernel.ops[l.load]
            .operands
            .iter()
            .map(|&v| m.value(v).and_then(Value::as_i32))
            .collect();
        m.swap_env(env);
        ran?;
        coords.ok_or_else(|| {
            self.plan.error(format!(
                "the producer cannot compute the coordinates of {}",
                l.load
            ))
        })
    }

    /// The boxes of `l` (or only box `only`) of the tile at `coords` into `stage`.
    pub(super) fn tma_boxes(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        l: &TmaLoad,
        stage: u32,
        coords: &[i32],
        only: Option<usize>,
    ) -> Result<(), InterpError> {
        let tensor = m.tensor_arg(l.param).ok_or_else(|| {
            self.plan
                .error(format!("parameter {} is not a tensor", l.param))
        })?;
        let boxes = Boxes::load(l, stage);
        let boxes = match only {
            Some(b) => boxes.single(b),
            None => boxes,
        };
        self.smem
            .load(&boxes, tensor, coords)
            .map_err(|e| self.plan.error(e))
    }

    /// What `l`'s boxes hold in `stage`, the extent they cover (a 2-SM CTA's half of the
    /// shared tile), as the pair's mma reads it now.
    pub(super) fn read_part(&self, l: &TmaLoad, stage: u32) -> Result<Value, InterpError> {
        let ty = self.plan.kernel.ty(self.plan.kernel.ops[l.load].results[0]);
        let dims = l.tile_dims().map(|d| d as usize);
        self.smem
            .read_tile(&Boxes::load(l, stage), ty.dtype(), &dims)
            .map_err(|e| self.plan.error(e))
    }

    /// The tile `l` holds in `stage`, as a consumer reads it now.
    pub(super) fn read(&self, l: &TmaLoad, stage: u32) -> Result<Value, InterpError> {
        let ty = self.plan.kernel.ty(self.plan.kernel.ops[l.load].results[0]);
        let dims = ty.shape().map(|s| s.dims().to_vec()).unwrap_or_default();
        self.smem
            .read_tile(&Boxes::load(l, stage), ty.dtype(), &dims)
            .map_err(|e| self.plan.error(e))
    }

    /// Runs the code after the loop in `env` for `block`, each store `store_of` names lowered
    /// to a TMA store.
    pub(super) fn epilogue(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        env: &mut Env,
        block: [i32; 3],
        store_of: &dyn Fn(OpId) -> Option<&'p TmaStore>,
    ) -> Result<(), InterpError> {
        m.set_block(block);
        m.swap_env(env);
        let ran = self
            .plan
            .epilogue
            .iter()
            .try_for_each(|&op| match store_of(op) {
                Some(st) => self.tma_store(m, st),
                None => m.exec_ops(&[op]).map(drop),
            });
        m.swap_env(env);
        ran
    }

    /// A store the `tma_store` pass lowered: per round, the bulk copies of the last one
    /// waited for, then the round's boxes staged and issued.
    fn tma_store(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        st: &'p TmaStore,
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
    pub(super) fn wait_bulk(&mut self, m: &mut Machine<'k, '_, '_>) -> Result<(), InterpError> {
        for (st, b, coords, dtype) in std::mem::take(&mut self.bulk) {
            let boxes = Boxes::store(st, 0..st.boxes.len());
            let data = self
                .smem
                .read_box(&boxes, b, dtype)
                .map_err(|e| self.plan.error(e))?;
            let stored = m
                .tensor_arg_mut(st.param)
                .map(|t| memory::store(t, &boxes.at(b, &coords), &data, None));
            if !matches!(stored, Some(Ok(()))) {
                return Err(self
                    .plan
                    .error(format!("{} cannot store its box {b}", st.store)));
            }
        }
        Ok(())
    }
}
