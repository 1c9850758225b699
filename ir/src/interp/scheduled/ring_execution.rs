//! The execution of a stage ring's schedule (sm_90a, and sm_100a's GEMM): the producer and
//! consumer programs on the ring's protocol machine (see the parent module's doc).
//!
//! A clustered ring ([`crate::cluster`]) runs the CTAs of each cluster together, each with its
//! own tiles and shared memory, on one machine (the protocol check's, which runs every CTA of
//! the cluster): a CTA's TMA of the shared load writes the boxes it issues into the stage of
//! every CTA in their mask, from its own tile's coordinates, so a box that misses a CTA leaves
//! that CTA's stage as it was.
//!
//! A 2-SM pair ([`crate::cluster::Pair`], sm_100a) runs the same way, each CTA's TMA writing
//! its own stage (of the shared load, its half of the tile, at its rank's offset), but only
//! the leader consumes: its mma step computes both CTAs' accumulators, each from that CTA's
//! own A tile and the B tile joined from both CTAs' halves in rank order, into each CTA's
//! TMEM, which each CTA's tiles' code after the loop reads.

use std::collections::BTreeMap;

use crate::cluster::Pair;
use crate::kernel::OpId;
use crate::passes::legacy_protocol::machine::{At, Machine as Protocol, PRODUCER, roles_per_cta};
use crate::ring::Step;

use super::super::error::InterpError;
use super::super::eval;
use super::super::exec::Machine;
use super::super::value::{Elems, Value};
use super::{Env, Memory, Parts, Plan, Stop, Tile, defer, run_checked};

/// One CTA's execution: its tiles, each iteration's values, shared and tensor memory.
pub(super) struct RingCta<'p, 'k> {
    plan: &'p Plan<'k>,
    tiles: Vec<Tile>,
    /// The ring iteration of each tile's first trip (iterations count on across tiles).
    bases: Vec<u32>,
    /// The values of iteration `t` of tile `k`, keyed `(k, t)`.
    iterations: BTreeMap<(usize, u32), Env>,
    mem: Memory<'p, 'k>,
    /// sm_100a: the TMEM accumulator, and what each tile's last mma left in it.
    tmem: Option<Value>,
    tmem_left: Vec<Option<Value>>,
    /// Tiles whose code after the loop has run.
    finished: usize,
}

impl<'p, 'k> RingCta<'p, 'k> {
    /// Runs the code before the loop of each tile (which the producer and consumers share)
    /// and counts the tiles' trips.
    pub(super) fn new(
        plan: &'p Plan<'k>,
        m: &mut Machine<'k, '_, '_>,
        blocks: Vec<[i32; 3]>,
    ) -> Result<RingCta<'p, 'k>, InterpError> {
        let tiles = blocks
            .into_iter()
            .map(|b| Tile::new(plan, m, b))
            .collect::<Result<Vec<_>, _>>()?;
        let bases = tiles
            .iter()
            .scan(0, |base, t| {
                let first = *base;
                *base += t.trips;
                Some(first)
            })
            .collect();
        let n = tiles.len();
        Ok(RingCta {
            plan,
            tiles,
            bases,
            iterations: BTreeMap::new(),
            mem: Memory::new(plan),
            tmem: None,
            tmem_left: vec![None; n],
            finished: 0,
        })
    }

    /// Runs the roles' programs, moving the data at each step, then each tile's code after
    /// the loop.
    pub(super) fn run(self, m: &mut Machine<'k, '_, '_>) -> Result<(), InterpError> {
        run_ctas(vec![self], m)
    }

    /// The producer's TMA of the cluster's shared load `load` for iteration `t` of tile `k`:
    /// the boxes `issues` names, from this CTA's coordinates, into `stage` of every CTA of
    /// their mask.
    fn multicast(
        ctas: &mut [RingCta<'p, 'k>],
        m: &mut Machine<'k, '_, '_>,
        from: usize,
        (k, t, stage): (usize, u32, u32),
        load: usize,
        issues: &[(usize, u16)],
    ) -> Result<(), InterpError> {
        let plan = ctas[from].plan;
        let l = &plan.ring.loads[load];
        let mut env = ctas[from].tiles[k].env.clone();
        env[plan.body.args[0].index()] = Some(ctas[from].tiles[k].iv(t));
        let coords = ctas[from]
            .mem
            .tma_coords(m, l, &mut env, &plan.coords[load])?;
        for &(b, mask) in issues {
            for (to, cta) in ctas.iter_mut().enumerate() {
                if mask & (1 << to) != 0 {
                    cta.mem.tma_boxes(m, l, stage, &coords, Some(b))?;
                }
            }
        }
        Ok(())
    }

    /// Moves the data of one executed step: `role` 0 is the producer, 1 the first consumer
    /// warpgroup (which stands for all: the others run the same steps on the same stages)
    /// of this CTA.
    fn step(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        role: usize,
        at: At,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let k = at.tile as usize;
        let t = at.i - self.bases[k];
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
        let mut env = self.tiles[k].env.clone();
        env[plan.body.args[0].index()] = Some(self.tiles[k].iv(t));
        self.mem.tma(
            m,
            &plan.ring.loads[load],
            stage,
            &mut env,
            &plan.coords[load],
        )
    }

    /// The producer's TMA of once load `load` for tile `k`.
    fn tma_once(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        load: usize,
    ) -> Result<(), InterpError> {
        let l = &self.plan.ring.once[load];
        self.mem.tma(m, l, 0, &mut self.tiles[k].env, &[])
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
        self.consume_with(m, k, t, ops, stage, None)
    }

    /// [`RingCta::consume`], ring load `joined.0` reading the tile `joined.1` instead of this
    /// CTA's stage (the 2-SM pair's B, joined from both CTAs' halves).
    fn consume_with(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        t: u32,
        ops: &[OpId],
        stage: u32,
        joined: Option<(usize, &Value)>,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        let mut env = self.iteration(k, t);
        for (j, l) in plan.ring.loads.iter().enumerate() {
            if ops.contains(&l.load) {
                let tile = match joined {
                    Some((shared, b)) if shared == j => b.clone(),
                    _ => self.mem.read(l, stage)?,
                };
                m.serve(l.load, tile);
            }
        }
        for l in &plan.ring.once {
            env[kernel.ops[l.load].results[0].index()] = Some(self.mem.read(l, 0)?);
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

    /// Runs one op of a consumer step: the ring's mma into tensor memory on sm_100a, the
    /// deferred maximum per warp where the `overlap` pass defers it.
    fn run_op(&mut self, m: &mut Machine<'k, '_, '_>, t: u32, op: OpId) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        match plan.tmem_mma {
            Some((mma, _)) if mma == op => {
                let operand = |i: usize| m.value(kernel.ops[op].operands[i]);
                let (Some(a), Some(b)) = (operand(0), operand(1)) else {
                    return Err(plan.error(format!("{op} runs before its operands are loaded")));
                };
                // The first tcgen05.mma of a tile overwrites the accumulator.
                let acc = if t == 0 { None } else { self.tmem.as_ref() };
                let d = eval::mma(a, b, acc).map_err(|_| plan.error(format!("{op}")))?;
                self.tmem = Some(d.clone());
                m.bind(kernel.ops[op].results[0], d);
                Ok(())
            }
            _ => {
                run_checked(plan, m, op)?;
                match &plan.deferral {
                    Some((d, warps)) if d.max == op => defer(plan, m, *d, warps),
                    _ => Ok(()),
                }
            }
        }
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
                env[plan.body.args[0].index()] = Some(self.tiles[k].iv(t));
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
        let results = &kernel.ops[plan.ring.for_op].results;
        let trips = self.tiles[k].trips;
        let initial = self.tiles[k].initial(plan);
        let last = trips.checked_sub(1).map(|t| &self.iterations[&(k, t)]);
        let mut env = std::mem::take(&mut self.tiles[k].env);
        for (j, &r) in results.iter().enumerate() {
            env[r.index()] = match last {
                Some(last) => last[plan.yielded[j].index()].clone(),
                None => initial[j].clone(),
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
        let stores = &kernel.schedule.tma_stores;
        let ran = self
            .mem
            .epilogue(m, &mut env, self.tiles[k].block, &|op| stores.get(&op));
        for t in 0..trips {
            self.iterations.remove(&(k, t));
        }
        ran
    }
}

/// The producer's TMA in a 2-SM pair: CTA `cta`'s own tile of `load`, the shared load's half
/// at `cta` times the pair's offset, into its own stage.
fn pair_tma<'k>(
    ctas: &mut [RingCta<'_, 'k>],
    m: &mut Machine<'k, '_, '_>,
    cta: usize,
    at: At,
    load: usize,
    (shared, pair): (usize, Pair),
) -> Result<(), InterpError> {
    let c = &mut ctas[cta];
    let plan = c.plan;
    let k = at.tile as usize;
    let t = at.i - c.bases[k];
    let l = &plan.ring.loads[load];
    let mut env = c.tiles[k].env.clone();
    env[plan.body.args[0].index()] = Some(c.tiles[k].iv(t));
    let mut coords = c.mem.tma_coords(m, l, &mut env, &plan.coords[load])?;
    if load == shared {
        let n = coords.len();
        for (d, &h) in pair.half.iter().enumerate() {
            coords[n - 2 + d] += cta as i32 * h as i32;
        }
    }
    c.mem
        .tma_boxes(m, l, at.i % plan.ring.stages, &coords, None)
}

/// The leader's mma step in a 2-SM pair (see the module doc): every CTA's iteration runs with
/// the B tile joined from the CTAs' halves.
fn pair_mma<'k>(
    ctas: &mut [RingCta<'_, 'k>],
    m: &mut Machine<'k, '_, '_>,
    at: At,
    (shared, pair): (usize, Pair),
) -> Result<(), InterpError> {
    let Some(plan) = ctas.first().map(|c| c.plan) else {
        return Ok(());
    };
    let Parts::Whole(ops) = &plan.parts else {
        return Err(plan.error("a 2-SM pair whose loop is rotated".into()));
    };
    let (k, stage) = (at.tile as usize, at.i % plan.ring.stages);
    let l = &plan.ring.loads[shared];
    let halves = ctas
        .iter()
        .map(|c| c.mem.read_part(l, stage))
        .collect::<Result<Vec<_>, _>>()?;
    // The halves lie along the axis of the pair's offset: rows of a B stored [N, K], columns
    // of one stored [K, N].
    let b = join(&halves, usize::from(pair.half[0] == 0))
        .ok_or_else(|| plan.error(format!("the halves of {} do not join", l.load)))?;
    for c in ctas.iter_mut() {
        let t = at.i - c.bases[k];
        c.finish_tiles(m, k)?;
        c.consume_with(m, k, t, ops, stage, Some((shared, &b)))?;
    }
    Ok(())
}

/// The 2-d tiles `parts` side by side along `axis` (0: rows, 1: columns), in order.
fn join(parts: &[Value], axis: usize) -> Option<Value> {
    let first = parts.first()?;
    let &[rows, cols] = &first.dims[..] else {
        return None;
    };
    let mut out = Vec::new();
    let data: Vec<&[f32]> = parts
        .iter()
        .map(|p| match &p.elems {
            Elems::F(v) if p.dims == first.dims => Some(&v[..]),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let dims = if axis == 0 {
        data.iter().for_each(|d| out.extend_from_slice(d));
        vec![rows * parts.len(), cols]
    } else {
        for r in 0..rows {
            data.iter()
                .for_each(|d| out.extend_from_slice(&d[r * cols..(r + 1) * cols]));
        }
        vec![rows, cols * parts.len()]
    };
    Some(Value {
        dtype: first.dtype,
        dims,
        elems: Elems::F(out),
    })
}

/// Runs the CTAs of one cluster, `blocks` per CTA of it (see the module doc).
pub(super) fn run_cluster<'k>(
    plan: &Plan<'k>,
    m: &mut Machine<'k, '_, '_>,
    blocks: Vec<Vec<[i32; 3]>>,
) -> Result<(), InterpError> {
    let ctas = blocks
        .into_iter()
        .map(|b| RingCta::new(plan, m, b))
        .collect::<Result<Vec<_>, _>>()?;
    run_ctas(ctas, m)
}

/// Runs `ctas` (one CTA, or the CTAs of a cluster, which walk their tiles in lockstep) on one
/// protocol machine, then each CTA's tiles' code after the loop.
fn run_ctas<'p, 'k>(
    mut ctas: Vec<RingCta<'p, 'k>>,
    m: &mut Machine<'k, '_, '_>,
) -> Result<(), InterpError> {
    let Some(plan) = ctas.first().map(|c| c.plan) else {
        return Ok(());
    };
    let trips: Vec<u32> = ctas[0].tiles.iter().map(|t| t.trips).collect();
    if ctas
        .iter()
        .any(|c| c.tiles.iter().map(|t| t.trips).ne(trips.iter().copied()))
    {
        return Err(plan.error("a cluster's CTAs walk tiles of different trip counts".into()));
    }
    let per_cta = roles_per_cta(plan.ring, plan.consumer_warps);
    // Per CTA, the boxes of the cluster's shared load it issues, and their masks.
    let issues: Vec<Vec<(usize, u16)>> = (0..ctas.len() as u32)
        .map(|r| {
            plan.ring.cluster.as_ref().map_or(Vec::new(), |c| {
                let mine = c
                    .multicast
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.issuer == r);
                mine.map(|(b, x)| (b, x.mask)).collect()
            })
        })
        .collect();
    let shared = plan.ring.cluster.as_ref().map(|c| c.shared);
    let pair = plan
        .ring
        .cluster
        .as_ref()
        .and_then(|c| c.pair.map(|p| (c.shared, p)));
    let mut stop = Stop::default();
    let protocol =
        Protocol::new(plan.ring, plan.consumer_warps).run_observed(&trips, &mut |role, at| {
            let (cta, local) = (role / per_cta, role % per_cta);
            let ran = match (at.step, pair) {
                (Step::Tma { load }, Some(p)) if local == PRODUCER => {
                    pair_tma(&mut ctas, m, cta, at, load, p)
                }
                (Step::Tcgen05Mma, Some(p)) => pair_mma(&mut ctas, m, at, p),
                _ => match at.step {
                    Step::Tma { load } if local == PRODUCER && Some(load) == shared => {
                        let k = at.tile as usize;
                        let t = at.i - ctas[cta].bases[k];
                        let place = (k, t, at.i % plan.ring.stages);
                        RingCta::multicast(&mut ctas, m, cta, place, load, &issues[cta])
                    }
                    _ => ctas[cta].step(m, local, at),
                },
            };
            stop.keep(ran)
        });
    stop.finish(plan, protocol)?;
    for mut cta in ctas {
        cta.finish_tiles(m, cta.tiles.len())?;
        cta.mem.wait_bulk(m)?;
    }
    Ok(())
}
