//! The CPU execution of a scheduled kernel: the kernel after the pass pipeline, run as its
//! schedule IR ([`crate::sched`]) says it runs on the GPU, with the data moving where the
//! schedule moves it. One execution for every target family: the roles' programs run on the
//! protocol check's machine ([`crate::passes::protocol_check`]), which reports each op a
//! role runs, in its order, and [`execution`] moves the data of that op. The orders it takes
//! for granted are the protocol check's to prove; it checks where the data goes and what the
//! roles compute from it. What it models (work, shared and tensor memory, rotated bodies,
//! deferred maxima, TMA stores): `docs/pipeline.md`, "The schedule, executed on the CPU".

mod execution;
mod smem;

use std::collections::BTreeMap;

use crate::kernel::{Block, Kernel, OpId, OpKind, UnaryOp, ValueDef, ValueId};
use crate::passes::walk;
use crate::sched::overlap::{Deferral, Overlap};
use crate::sched::tiles::TileScheduler;
use crate::sched::{LoadId, Sched, TmaStore};
use crate::types::DType;

use super::HostArg;
use super::error::InterpError;
use super::exec::Machine;
use super::memory;
use super::value::{Elems, Value};

use smem::{Boxes, SharedMemory};

/// Runs the scheduled `kernel` (after the pass pipeline) over its logical `grid` with `args`
/// in parameter order, a persistent kernel on `ctas` CTAs (see `docs/pipeline.md`). A kernel
/// without a schedule IR runs as [`super::run`] runs it.
pub fn run_scheduled(
    kernel: &Kernel,
    grid: [u32; 3],
    ctas: u32,
    args: &mut [HostArg<'_>],
) -> Result<(), InterpError> {
    let g = super::checked(kernel, grid, args)?;
    let mut machine = Machine::new(kernel, args, g, false);
    let Some(sched) = &kernel.schedule.sched else {
        return machine.run_grid();
    };
    let plan = Plan::new(kernel, sched)?;
    if sched.persistent() && ctas == 0 {
        return Err(plan.error("a persistent kernel needs at least one CTA".into()));
    }
    for cluster in plan.walk(grid, ctas)? {
        execution::run(&plan, &mut machine, cluster)?;
    }
    Ok(())
}

/// One cluster's work (one CTA's without a cluster): per CTA of it, per work step, the
/// blocks of the work tiles it runs at once.
pub(super) type Cluster = Vec<Vec<Vec<[i32; 3]>>>;

/// Which ops of the loop body each mma and region op runs.
pub(super) enum Parts {
    /// An unrotated body: every op at the body's mma.
    Whole(Vec<OpId>),
    /// A rotated body (see `docs/pipeline.md`).
    Rotated {
        head: Vec<OpId>,
        between: Vec<OpId>,
        tail: Vec<OpId>,
    },
    /// An sm_100a attention pair: the mmas' operand slices and the softmax's ops.
    Pair(PairBody),
}

/// What the roles of an sm_100a attention pair run of the loop body.
pub(super) struct PairBody {
    /// The softmax's ops (the code between the mmas and the iteration-local ops), in order.
    pub(super) softmax: Vec<OpId>,
    /// The ops computing the head mma's operands and the head mma itself; the ops computing
    /// the tail mma's staged operand.
    pub(super) head: Vec<OpId>,
    pub(super) tail_b: Vec<OpId>,
    /// The factors the correction reads, and the cast of `P` the tail mma reads.
    pub(super) factor: ValueId,
    pub(super) p_cast: OpId,
    /// The exponential producing `P`, whose columns take the polynomial share.
    pub(super) exp2: Option<OpId>,
}

/// What the execution needs to know of the kernel and its schedule, worked out once.
pub(super) struct Plan<'k> {
    pub(super) kernel: &'k Kernel,
    pub(super) sched: &'k Sched,
    /// The loop's body and the values its `yield` passes to the next iteration.
    pub(super) body: &'k Block,
    pub(super) yielded: Vec<ValueId>,
    /// Top-level ops before the loop (without the once loads, which the producer issues)
    /// and after it.
    pub(super) prologue: Vec<OpId>,
    pub(super) epilogue: Vec<OpId>,
    /// Per ring load, the body ops its coordinates need, in body order.
    pub(super) coords: BTreeMap<LoadId, Vec<OpId>>,
    pub(super) parts: Parts,
    /// The carried value the loop accumulates in tensor memory (sm_100a), and the mma that
    /// computes it in a whole body.
    pub(super) tmem_carried: Option<(usize, Option<OpId>)>,
    /// The deferred maximum, and the groups of its rows that decide together.
    pub(super) deferral: Option<(Deferral, Vec<Vec<usize>>)>,
}

impl<'k> Plan<'k> {
    fn new(kernel: &'k Kernel, sched: &'k Sched) -> Result<Plan<'k>, InterpError> {
        let for_op = sched.for_op;
        let error = |what: &str| InterpError::Schedule {
            loc: kernel.ops[for_op].loc,
            what: what.to_string(),
        };
        let at = kernel
            .body
            .ops
            .iter()
            .position(|&o| o == for_op)
            .ok_or_else(|| error("the ring loop is not at the kernel's top level"))?;
        let body = kernel.ops[for_op]
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
        let once: Vec<OpId> = sched
            .once_loads()
            .map(|h| sched.loads[h].tma.load)
            .collect();
        let prologue = kernel.body.ops[..at]
            .iter()
            .copied()
            .filter(|o| !once.contains(o))
            .collect();
        let coords = sched
            .ring_loads()
            .map(|(h, l)| {
                let slice = backward_slice(kernel, ops, &kernel.ops[l.tma.load].operands);
                (h, slice)
            })
            .collect();
        let yielded = kernel.ops[last].operands.clone();
        let pair = sched.work_tiles > 1;
        let parts = match (&sched.overlap, pair) {
            (Some(o), true) => {
                Parts::Pair(pair_body(kernel, sched, o, ops).map_err(|e| error(&e))?)
            }
            (Some(o), false) => rotated_parts(kernel, sched, o, ops),
            (None, _) => Parts::Whole(ops.to_vec()),
        };
        let tmem_carried = match (&sched.tmem, &sched.overlap) {
            (None, _) => None,
            (Some(_), Some(o)) => Some((o.carried, None)),
            (Some(_), None) => {
                let [mma] = walk::mmas(kernel, body)[..] else {
                    return Err(error("a tensor-memory ring loop has one mma"));
                };
                let result = kernel.ops[mma].results[0];
                let carried = yielded
                    .iter()
                    .position(|&v| v == result)
                    .ok_or_else(|| error("the tensor-memory accumulator is not carried"))?;
                Some((carried, Some(mma)))
            }
        };
        let deferral = match sched.overlap.as_ref().and_then(|o| o.defer) {
            None => None,
            Some(d) => {
                let groups = if sched.tmem.is_some() {
                    // A thread holds a whole row (sm_100a): each row decides alone.
                    let rows = kernel.ty(kernel.ops[d.max].results[0]);
                    let rows = rows.shape().map_or(1, |s| s.dims()[0]);
                    (0..rows).map(|r| vec![r]).collect()
                } else {
                    let warps = sched
                        .roles
                        .iter()
                        .find(|r| {
                            r.program
                                .ops()
                                .any(|op| matches!(op, crate::sched::Op::Wgmma(_)))
                        })
                        .map_or(0, |r| r.warps);
                    warp_rows(kernel, d, warps).map_err(|e| error(&e))?
                };
                Some((d, groups))
            }
        };
        Ok(Plan {
            kernel,
            sched,
            body,
            yielded,
            prologue,
            epilogue: kernel.body.ops[at + 1..].to_vec(),
            coords,
            parts,
            tmem_carried,
            deferral,
        })
    }

    pub(super) fn error(&self, what: String) -> InterpError {
        InterpError::Schedule {
            loc: self.kernel.ops[self.sched.for_op].loc,
            what,
        }
    }

    /// Per cluster (one CTA without a cluster), per CTA of it, the blocks of each work step
    /// it runs, in order: one block, or the `work_tiles` blocks it runs at once. The tile
    /// scheduler deals work steps over the grid of x blocks grouped by the cluster's CTAs
    /// and the CTA's work tiles; CTA `r` of a cluster takes x group `size * px + r`, whose
    /// work tile `g` is x block `work * (size * px + r) + g` (past the grid in a ragged last
    /// group).
    fn walk(&self, [nx, ny, nz]: [u32; 3], ctas: u32) -> Result<Vec<Cluster>, InterpError> {
        let size = self.sched.cluster.as_ref().map_or(1, |c| c.ctas);
        let work = self.sched.work_tiles.max(1);
        if !ctas.is_multiple_of(size) && self.sched.persistent() {
            return Err(self.error(format!(
                "{ctas} CTAs are not a whole number of clusters of {size}"
            )));
        }
        let groups = [nx.div_ceil(size * work), ny, nz];
        let steps = self.steps(groups, ctas / size);
        Ok(steps
            .into_iter()
            .map(|cluster| {
                (0..size as i32)
                    .map(|r| {
                        cluster
                            .iter()
                            .map(|b| {
                                (0..work as i32)
                                    .map(|g| {
                                        [(b[0] * size as i32 + r) * work as i32 + g, b[1], b[2]]
                                    })
                                    .collect()
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect())
    }

    /// The block indices of the work steps of each CTA (or cluster), in the order it runs
    /// them.
    fn steps(&self, grid: [u32; 3], ctas: u32) -> Vec<Vec<[i32; 3]>> {
        let block = |b: [u32; 3]| b.map(|x| x as i32);
        match self.sched.tiles {
            Some(order) => {
                let total = TileScheduler::tiles(grid);
                (0..ctas)
                    .map(|c| {
                        (0..)
                            .map(|k| order.tile(c, ctas, k))
                            .take_while(|&t| t < total)
                            .map(|t| block(order.block(t as u32, grid, ctas)))
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

    /// The stores of work tile `g`'s code after the loop, by their `store` op.
    pub(super) fn store(&self, g: u32, op: OpId) -> Option<&'k TmaStore> {
        self.sched
            .stores
            .iter()
            .find(|st| st.store == op && st.work_tile == g)
    }
}

/// The ops of a rotated body in its three parts (see `docs/pipeline.md`): the code between and
/// the tail section as the `overlap` pass chose them, the loads only the tail reads with
/// the tail, and everything else with the head.
fn rotated_parts(kernel: &Kernel, sched: &Sched, o: &Overlap, ops: &[OpId]) -> Parts {
    let tail_only = |op: OpId| {
        sched.loads.iter().any(|(_, l)| l.tma.load == op)
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

/// What an attention pair's roles run of the body (see [`PairBody`]).
fn pair_body(
    kernel: &Kernel,
    sched: &Sched,
    o: &Overlap,
    ops: &[OpId],
) -> Result<PairBody, String> {
    let def_op = |v: ValueId| match kernel.values[v].def {
        ValueDef::Op(op, _) => Some(op),
        ValueDef::BlockArg { .. } => None,
    };
    let p_cast = def_op(kernel.ops[o.tail].operands[0])
        .filter(|&c| matches!(kernel.ops[c].kind, OpKind::Cast { .. }))
        .ok_or("the P V mma does not read a cast of P")?;
    let exp2 = def_op(kernel.ops[p_cast].operands[0])
        .filter(|&e| kernel.ops[e].kind == OpKind::Unary(UnaryOp::Exp2));
    let (_, factor) = o.rescale.ok_or("an attention pair without its rescale")?;
    let mut head = backward_slice(kernel, ops, &kernel.ops[o.head].operands);
    head.push(o.head);
    let tail_b = backward_slice(kernel, ops, &kernel.ops[o.tail].operands[1..2]);
    let loaded = |op: OpId| sched.loads.iter().any(|(_, l)| l.tma.load == op);
    let staged = |op: OpId| {
        loaded(op)
            || kernel.ops[op].kind == OpKind::Transpose
                && def_op(kernel.ops[op].operands[0]).is_some_and(loaded)
    };
    let softmax = ops
        .iter()
        .copied()
        .filter(|&op| {
            !staged(op)
                && op != o.head
                && !o.tail_ops.contains(&op)
                && op != p_cast
                && kernel.ops[op].kind != OpKind::Yield
        })
        .collect();
    Ok(PairBody {
        softmax,
        head,
        tail_b,
        factor,
        p_cast,
        exp2,
    })
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
/// loop's walk.
pub(super) struct Tile {
    pub(super) block: [i32; 3],
    pub(super) env: Env,
    pub(super) walk: Walk,
}

impl Tile {
    /// Runs the code before the loop (which every role shares) for `block`.
    pub(super) fn new(
        plan: &Plan<'_>,
        m: &mut Machine<'_, '_, '_>,
        block: [i32; 3],
    ) -> Result<Tile, InterpError> {
        let kernel = plan.kernel;
        let for_op = plan.sched.for_op;
        let mut env = vec![None; kernel.values.len()];
        m.set_block(block);
        let bounds = scalars(
            m,
            &mut env,
            &plan.prologue,
            &kernel.ops[for_op].operands[..3],
        )?;
        let Some(&[lo, hi, step]) = bounds.as_deref() else {
            return Err(plan.error("the loop's bounds are not computed before it".into()));
        };
        if step <= 0 {
            return Err(InterpError::NonPositiveStep {
                loc: kernel.ops[for_op].loc,
                step,
            });
        }
        let walk = Walk::new(plan, lo, hi, step)?;
        Ok(Tile { block, env, walk })
    }

    /// The values the loop starts from (its `for`'s operands after the bounds).
    pub(super) fn initial(&self, plan: &Plan<'_>) -> Vec<Option<Value>> {
        plan.kernel.ops[plan.sched.for_op].operands[3..]
            .iter()
            .map(|v| self.env[v.index()].clone())
            .collect()
    }
}

/// Runs `ops` in `env`, then reads `values` as integers (`None` unless all are).
fn scalars(
    m: &mut Machine<'_, '_, '_>,
    env: &mut Env,
    ops: &[OpId],
    values: &[ValueId],
) -> Result<Option<Vec<i32>>, InterpError> {
    m.with_env(env, |m| {
        m.exec_ops(ops)?;
        Ok(values
            .iter()
            .map(|&v| m.value(v).and_then(Value::as_i32))
            .collect())
    })
}

/// The iterations of a loop: its start, step (positive) and trip count.
pub(super) struct Walk {
    pub(super) lo: i32,
    pub(super) step: i32,
    pub(super) trips: u32,
}

impl Walk {
    /// The walk of `lo..hi` by `step`.
    pub(super) fn new(plan: &Plan<'_>, lo: i32, hi: i32, step: i32) -> Result<Walk, InterpError> {
        let span = (i64::from(hi) - i64::from(lo)).max(0);
        let trips = u32::try_from((span + i64::from(step) - 1) / i64::from(step))
            .map_err(|_| plan.error("too many trips".into()))?;
        Ok(Walk { lo, step, trips })
    }

    /// The loop index of iteration `t` (of `trips`: the loop's end, one step past its last
    /// iteration's index, or its start).
    pub(super) fn index(&self, t: u32) -> i32 {
        self.lo.wrapping_add((t as i32).wrapping_mul(self.step))
    }
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

/// The deferred maximum, after `op` where it computes it: each group of rows keeps the
/// carried reference while every one of them grew by at most the threshold (a NaN growth,
/// from a `-inf` reference, never stays).
pub(super) fn defer(
    plan: &Plan<'_>,
    m: &mut Machine<'_, '_, '_>,
    op: OpId,
) -> Result<(), InterpError> {
    let Some((d, groups)) = plan.deferral.as_ref().filter(|(d, _)| d.max == op) else {
        return Ok(());
    };
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
        protocol: Result<(), crate::passes::protocol_check::ProtocolError>,
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
    bulk: Vec<(&'k TmaStore, usize, Vec<i32>, DType)>,
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

    /// The coordinates of load `l`'s tile, computed in `env` by the ops `slice` (those of a
    /// ring load for the iteration; none for a once load, whose coordinates the code before
    /// the loop computed).
    pub(super) fn tma_coords(
        &self,
        m: &mut Machine<'k, '_, '_>,
        l: LoadId,
        env: &mut Env,
        slice: &[OpId],
    ) -> Result<Vec<i32>, InterpError> {
        let op = self.plan.sched.loads[l].tma.load;
        let coords = scalars(m, env, slice, &self.plan.kernel.ops[op].operands)?;
        coords.ok_or_else(|| {
            self.plan.error(format!(
                "the producer cannot compute the coordinates of {op}"
            ))
        })
    }

    /// The boxes of `l` (or only box `only`) of the tile at `coords` into `stage`.
    pub(super) fn tma_boxes(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        l: LoadId,
        stage: u32,
        coords: &[i32],
        only: Option<usize>,
    ) -> Result<(), InterpError> {
        let t = &self.plan.sched.loads[l].tma;
        let tensor = m.tensor_arg(t.param).ok_or_else(|| {
            self.plan
                .error(format!("parameter {} is not a tensor", t.param))
        })?;
        let boxes = Boxes::load(t, stage);
        let boxes = match only {
            Some(b) => boxes.single(b),
            None => boxes,
        };
        self.smem
            .load(&boxes, tensor, coords)
            .map_err(|e| self.plan.error(e))
    }

    /// The tile `l` holds in `stage`, as an mma reads it now; with `part`, only the extent
    /// its boxes cover (a 2-SM CTA's half of the shared tile, which the pair's mma joins).
    pub(super) fn read(&self, l: LoadId, stage: u32, part: bool) -> Result<Value, InterpError> {
        let t = &self.plan.sched.loads[l].tma;
        let ty = self.plan.kernel.ty(self.plan.kernel.ops[t.load].results[0]);
        let dims = if part {
            t.tile_dims().map(|d| d as usize).to_vec()
        } else {
            ty.shape().map(|s| s.dims().to_vec()).unwrap_or_default()
        };
        self.smem
            .read_tile(&Boxes::load(t, stage), ty.dtype(), &dims)
            .map_err(|e| self.plan.error(e))
    }

    /// Runs the code after the loop in `env` for `block`, each store of work tile `g` the
    /// schedule lowered to a TMA store.
    pub(super) fn epilogue(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        env: &mut Env,
        block: [i32; 3],
        g: u32,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        m.set_block(block);
        m.with_env(env, |m| {
            plan.epilogue
                .iter()
                .try_for_each(|&op| match plan.store(g, op) {
                    Some(st) => self.tma_store(m, st),
                    None => m.exec_ops(&[op]).map(drop),
                })
        })
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
