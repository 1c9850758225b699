//! One execution of the CTAs of a cluster (one CTA without a cluster): every role's program
//! runs on the protocol machine, and each op it reports moves the data it moves on the GPU
//! (see `docs/pipeline.md`). A role's replicas compute the same tiles, so the first
//! moves the data for all.

use std::collections::BTreeMap;

use crate::kernel::OpId;
use crate::passes::protocol_check::machine::Machine as Protocol;
use crate::sched::expand::Step;
use crate::sched::tmem::TmemTileId;
use crate::sched::{LoadId, MmaPart, Op, Region, RoleKind};
use crate::tmem::exp2::exp2_poly;

use super::super::error::InterpError;
use super::super::eval;
use super::super::exec::Machine;
use super::super::value::{Elems, Value};
use super::{Cluster, Env, Memory, PairBody, Parts, Plan, Stop, Tile, Walk, defer, run_checked};

/// Runs the CTAs of one cluster: per CTA, the blocks of each work step it runs.
pub(super) fn run<'k>(
    plan: &Plan<'k>,
    m: &mut Machine<'k, '_, '_>,
    cluster: Cluster,
) -> Result<(), InterpError> {
    let mut ctas = cluster
        .into_iter()
        .map(|steps| Cta::new(plan, m, steps))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = ctas.first() else {
        return Ok(());
    };
    let trips: Vec<u32> = first.groups.iter().map(|g| g.walk.trips).collect();
    if ctas.iter().any(|c| {
        c.groups
            .iter()
            .map(|g| g.walk.trips)
            .ne(trips.iter().copied())
    }) {
        return Err(plan.error("a cluster's CTAs walk tiles of different trip counts".into()));
    }
    let protocol = Protocol::new(plan.sched, &trips);
    let who = protocol.who();
    let mut stop = Stop::default();
    let ran = protocol.run_observed(&mut |a, step| {
        let (role, replica, cta) = who[a];
        let moved = if replica > 0 {
            Ok(())
        } else {
            dispatch(plan, &mut ctas, m, role, cta as usize, step)
        };
        stop.keep(moved)
    });
    stop.finish(plan, ran)?;
    for cta in &mut ctas {
        cta.mem.wait_bulk(m)?;
    }
    Ok(())
}

/// The work tiles a CTA runs at once and the walk of the loop they share.
struct Group {
    tiles: Vec<Tile>,
    walk: Walk,
}

impl Group {
    /// Whether iteration `t` of the walk is one of work tile `g`'s own.
    fn own(&self, g: usize, t: u32) -> bool {
        let (i, own) = (self.walk.index(t), &self.tiles[g].walk);
        own.lo <= i && i < own.index(own.trips)
    }
}

/// One CTA: its work, the values of each iteration, shared and tensor memory.
struct Cta<'p, 'k> {
    plan: &'p Plan<'k>,
    groups: Vec<Group>,
    /// The values of work tile `g` in iteration `t` of group `k`, keyed `(k, g, t)`.
    iterations: BTreeMap<(usize, usize, u32), Env>,
    mem: Memory<'p, 'k>,
    /// Each TMEM tile as the mmas and roles left it; what a role copied of one for a group.
    tmem: BTreeMap<TmemTileId, Value>,
    copies: BTreeMap<(usize, TmemTileId), Value>,
    /// Each Q tile's rescale factors as the softmax wrote them and the correction read them.
    factors: BTreeMap<u32, Value>,
    factors_read: BTreeMap<u32, Value>,
}

impl<'p, 'k> Cta<'p, 'k> {
    /// Runs the code before the loop of each work tile and works out each group's walk.
    fn new(
        plan: &'p Plan<'k>,
        m: &mut Machine<'k, '_, '_>,
        steps: Vec<Vec<[i32; 3]>>,
    ) -> Result<Cta<'p, 'k>, InterpError> {
        let mut groups = Vec::with_capacity(steps.len());
        for blocks in steps {
            let tiles = blocks
                .into_iter()
                .map(|b| Tile::new(plan, m, b))
                .collect::<Result<Vec<_>, _>>()?;
            let Some(first) = tiles.first() else {
                return Err(plan.error("a work step without tiles".into()));
            };
            let step = first.walk.step;
            if tiles.iter().any(|t| t.walk.step != step) {
                return Err(plan.error("a CTA's work tiles step their loops differently".into()));
            }
            let lo = tiles
                .iter()
                .map(|t| t.walk.lo)
                .min()
                .unwrap_or(first.walk.lo);
            let end = tiles.iter().map(|t| t.walk.index(t.walk.trips)).max();
            let walk = Walk::new(plan, lo, end.unwrap_or(lo), step)?;
            groups.push(Group { tiles, walk });
        }
        Ok(Cta {
            plan,
            groups,
            iterations: BTreeMap::new(),
            mem: Memory::new(plan),
            tmem: BTreeMap::new(),
            copies: BTreeMap::new(),
            factors: BTreeMap::new(),
            factors_read: BTreeMap::new(),
        })
    }

    /// Work tile `g`'s values before the loop with the walk's index of iteration `t`.
    fn scratch(&self, k: usize, g: usize, t: u32) -> Env {
        let group = &self.groups[k];
        let mut env = group.tiles[g].env.clone();
        env[self.plan.body.args[0].index()] = Some(Value::i32(group.walk.index(t)));
        env
    }

    /// Work tile `g`'s values in iteration `t` of group `k` (taken out of the map while a
    /// step runs): its values before the loop, the walk's index, and each carried value
    /// from the iteration before (the loop's initial value in the first).
    fn iteration(&mut self, k: usize, g: usize, t: u32) -> Env {
        let plan = self.plan;
        let mut env = match self.iterations.remove(&(k, g, t)) {
            Some(env) => env,
            None => self.scratch(k, g, t),
        };
        let initial = self.groups[k].tiles[g].initial(plan);
        for (c, &arg) in plan.body.args[1..].iter().enumerate() {
            if env[arg.index()].is_none() {
                env[arg.index()] = match t.checked_sub(1) {
                    None => initial[c].clone(),
                    Some(prev) => self
                        .iterations
                        .get(&(k, g, prev))
                        .and_then(|p| p[plan.yielded[c].index()].clone()),
                };
            }
        }
        env
    }

    /// Runs `ops` of iteration `t` of group `k`'s first work tile (an mma or region op of an
    /// unrotated or rotated body), its ring loads read from `stage` now (load `joined.0`
    /// from the tile `joined.1` instead: the 2-SM pair's B), its once loads from their
    /// buffers.
    fn consume(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        (k, t): (usize, u32),
        ops: &[OpId],
        stage: u32,
        joined: Option<(LoadId, &Value)>,
    ) -> Result<(), InterpError> {
        let mut env = self.iteration(k, 0, t);
        let run = |cta: &mut Self, m: &mut Machine<'k, '_, '_>, op| cta.run_op(m, t, op);
        let ran = self.run_loaded(m, &mut env, (0, stage), ops, joined, run);
        self.iterations.insert((k, 0, t), env);
        ran
    }

    /// Runs `ops` of a step of work tile `g` in `env`, each by `run`, with the loads they
    /// read served: the ring's from `stage` (load `joined.0` from the tile `joined.1`
    /// instead: the 2-SM pair's B), the tile's once loads put in `env` from their buffers.
    fn run_loaded(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        env: &mut Env,
        (g, stage): (usize, u32),
        ops: &[OpId],
        joined: Option<(LoadId, &Value)>,
        mut run: impl FnMut(&mut Self, &mut Machine<'k, '_, '_>, OpId) -> Result<(), InterpError>,
    ) -> Result<(), InterpError> {
        let s = self.plan.sched;
        for (h, l) in s.ring_loads() {
            if ops.contains(&l.tma.load) {
                let tile = match joined {
                    Some((shared, b)) if shared == h => b.clone(),
                    _ => self.mem.read(h, stage, false)?,
                };
                m.serve(l.tma.load, tile);
            }
        }
        for h in s.once_loads().filter(|&h| s.loads[h].work_tile == g as u32) {
            let result = self.plan.kernel.ops[s.loads[h].tma.load].results[0];
            env[result.index()] = Some(self.mem.read(h, 0, false)?);
        }
        let ran = m.with_env(env, |m| ops.iter().try_for_each(|&op| run(self, m, op)));
        m.unserve();
        ran
    }

    /// Runs one op of a consumer step: the body's mma into tensor memory on sm_100a (the
    /// walk's first overwrites), the deferred maximum where the `overlap` pass defers it.
    fn run_op(&mut self, m: &mut Machine<'k, '_, '_>, t: u32, op: OpId) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        match plan.tmem_carried {
            Some((_, Some(mma))) if mma == op => {
                let operand = |i: usize| m.value(kernel.ops[op].operands[i]);
                let (Some(a), Some(b)) = (operand(0), operand(1)) else {
                    return Err(plan.error(format!("{op} runs before its operands are loaded")));
                };
                let acc_tile = TmemTileId(0);
                let acc = if t == 0 {
                    None
                } else {
                    self.tmem.get(&acc_tile)
                };
                let d = eval::mma(a, b, acc).map_err(|_| plan.error(format!("{op}")))?;
                self.tmem.insert(acc_tile, d.clone());
                m.bind(kernel.ops[op].results[0], d);
                Ok(())
            }
            _ => {
                run_checked(plan, m, op)?;
                defer(plan, m, op)
            }
        }
    }

    /// Work tile `g`'s code after the loop of group `k`: the loop's results from its last
    /// iteration, the value carried in tensor memory as its role copied it out (the loop's
    /// initial value after a walk of no iteration), its stores through its staging tile.
    fn epilogue(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        g: usize,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        let results = &kernel.ops[plan.sched.for_op].results;
        let trips = self.groups[k].walk.trips;
        let initial = self.groups[k].tiles[g].initial(plan);
        let last = trips
            .checked_sub(1)
            .and_then(|t| self.iterations.get(&(k, g, t)));
        let mut env = self.groups[k].tiles[g].env.clone();
        for (c, &r) in results.iter().enumerate() {
            env[r.index()] = match plan.tmem_carried {
                Some((carried, _)) if carried == c && trips > 0 => {
                    let tile = self.carried_tile(g);
                    self.copies.get(&(k, tile)).cloned()
                }
                _ => match last {
                    Some(last) => last[plan.yielded[c].index()].clone(),
                    None => initial[c].clone(),
                },
            };
        }
        if results.iter().any(|r| env[r.index()].is_none()) {
            return Err(plan.error(format!(
                "work tile {g} of step {k}: the loop's results are not all computed"
            )));
        }
        let block = self.groups[k].tiles[g].block;
        self.mem.epilogue(m, &mut env, block, g as u32)?;
        for t in 0..trips {
            self.iterations.remove(&(k, g, t));
        }
        Ok(())
    }

    /// The TMEM tile holding the carried value of work tile `g`: the accumulator, or an
    /// attention pair's `O_g`.
    fn carried_tile(&self, g: usize) -> TmemTileId {
        let s = self.plan.sched;
        let tmem = s.tmem.as_ref();
        match s.work_tiles {
            1 => tmem.and_then(|t| t.tile("acc", None)),
            _ => tmem.and_then(|t| t.tile("O", Some(g as u32))),
        }
        .unwrap_or(TmemTileId(0))
    }

    /// The score tile `S_g` of an attention pair.
    fn score_tile(&self, g: usize) -> Option<TmemTileId> {
        let tmem = self.plan.sched.tmem.as_ref()?;
        tmem.tile("S", Some(g as u32))
    }

    /// Runs `ops` in a scratch environment of work tile `g`, iteration `t`, with the ring's
    /// loads read from `stage` and tile `g`'s once loads from their buffers; returns the
    /// environment.
    fn operands(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        (k, g, t): (usize, usize, u32),
        stage: u32,
        ops: &[OpId],
    ) -> Result<Env, InterpError> {
        let mut env = self.scratch(k, g, t);
        let run = |cta: &mut Self, m: &mut Machine<'k, '_, '_>, op| run_checked(cta.plan, m, op);
        self.run_loaded(m, &mut env, (g, stage), ops, None, run)?;
        Ok(env)
    }

    /// An attention pair's `S_g = Q_g K^T` into tensor memory.
    fn mma_s(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        at: (usize, usize, u32),
        stage: u32,
        body: &PairBody,
    ) -> Result<(), InterpError> {
        let env = self.operands(m, at, stage, &body.head)?;
        let head = self.plan.sched.overlap.as_ref().map(|o| o.head);
        let scores = head.map(|h| self.plan.kernel.ops[h].results[0]);
        if let (Some(tile), Some(v)) = (
            self.score_tile(at.1),
            scores.and_then(|v| env[v.index()].clone()),
        ) {
            self.tmem.insert(tile, v);
        }
        Ok(())
    }

    /// An attention pair's `O_g (+)= P_g V`, with `P_g` from tensor memory; the walk's first
    /// iteration overwrites `O_g`.
    fn mma_o(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        at: (usize, usize, u32),
        stage: u32,
        body: &PairBody,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let env = self.operands(m, at, stage, &body.tail_b)?;
        let Some(o) = plan.sched.overlap.as_ref() else {
            return Ok(());
        };
        let tail = &plan.kernel.ops[o.tail];
        let (score, out) = (self.score_tile(at.1), self.carried_tile(at.1));
        let p = score.and_then(|t| self.tmem.get(&t));
        let (Some(p), Some(v)) = (p, &env[tail.operands[1].index()]) else {
            return Err(plan.error(format!("{} runs before P or V is there", tail.results[0])));
        };
        let acc = if at.2 == 0 { None } else { self.tmem.get(&out) };
        let o = eval::mma(p, v, acc).map_err(|_| plan.error("the P V mma".into()))?;
        self.tmem.insert(out, o);
        Ok(())
    }

    /// Softmax `g`'s iteration `t`: the code between the mmas on its copied scores, or a
    /// no-op outside the tile's own range (its running values kept).
    fn softmax(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        (k, g, t): (usize, usize, u32),
        body: &PairBody,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let mut env = self.iteration(k, g, t);
        if self.groups[k].own(g, t) {
            m.with_env(&mut env, |m| {
                body.softmax
                    .iter()
                    .try_for_each(|&op| self.softmax_op(m, op, body))
            })?;
        } else {
            let carried = plan.sched.overlap.as_ref().map(|o| o.carried);
            for (c, &arg) in plan.body.args[1..].iter().enumerate() {
                if Some(c) != carried {
                    env[plan.yielded[c].index()] = env[arg.index()].clone();
                }
            }
        }
        self.iterations.insert((k, g, t), env);
        Ok(())
    }

    /// One op of the softmax: the polynomial share of `P`'s exponential, the deferred
    /// maximum.
    fn softmax_op(
        &self,
        m: &mut Machine<'k, '_, '_>,
        op: OpId,
        body: &PairBody,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        run_checked(plan, m, op)?;
        if Some(op) == body.exp2 {
            self.exp2_share(m, op)?;
        }
        defer(plan, m, op)
    }

    /// The columns `c` with `c % den < num` of the exponential `op` computed by the
    /// polynomial, as the softmax computes them on the FMA pipes.
    fn exp2_share(&self, m: &mut Machine<'k, '_, '_>, op: OpId) -> Result<(), InterpError> {
        let kernel = self.plan.kernel;
        let (num, den) = self.plan.sched.poly_share;
        let (x, r) = (kernel.ops[op].operands[0], kernel.ops[op].results[0]);
        let (Some(x), Some(mut p)) = (m.value(x).cloned(), m.value(r).cloned()) else {
            return Err(self.plan.error(format!("{op} has not run")));
        };
        let (Elems::F(xs), Elems::F(ps)) = (&x.elems, &mut p.elems) else {
            return Err(self.plan.error(format!("{op} is not a float exponential")));
        };
        let cols = x.dims.last().copied().unwrap_or(1);
        for (e, (px, &xv)) in ps.iter_mut().zip(xs).enumerate() {
            if den > 0 && (e % cols) as u32 % den < num {
                *px = exp2_poly(xv);
            }
        }
        m.bind(r, p);
        Ok(())
    }

    /// Value `v` of softmax `g`'s iteration `t`: what it computed, or in a no-op iteration
    /// the factors 1 and `P = 0` (tiles of `v`'s type).
    fn softmax_value(
        &self,
        (k, g, t): (usize, usize, u32),
        v: crate::kernel::ValueId,
        body: &PairBody,
    ) -> Result<Value, InterpError> {
        if self.groups[k].own(g, t) {
            let env = self.iterations.get(&(k, g, t));
            return env.and_then(|env| env[v.index()].clone()).ok_or_else(|| {
                self.plan
                    .error(format!("softmax {g} hands on {v} before computing it"))
            });
        }
        let fill = if v == body.factor { 1.0 } else { 0.0 };
        let ty = self.plan.kernel.ty(v);
        let dims = ty.shape().map(|s| s.dims().to_vec()).unwrap_or_default();
        Ok(eval::splat(&Value::float(ty.dtype(), fill), &dims))
    }

    /// The correction's rescale of `O_g` by the factors it read, row by row.
    fn rescale(&mut self, g: usize) -> Result<(), InterpError> {
        let tile = self.carried_tile(g);
        let (Some(o), Some(f)) = (self.tmem.get_mut(&tile), self.factors_read.get(&(g as u32)))
        else {
            return Err(self.plan.error(format!(
                "the correction rescales O{g} before its factors or product exist"
            )));
        };
        let (Elems::F(os), Elems::F(fs)) = (&mut o.elems, &f.elems) else {
            return Err(self.plan.error("a rescale that is not float".into()));
        };
        let cols = o.dims.last().copied().unwrap_or(1);
        for (e, x) in os.iter_mut().enumerate() {
            *x *= fs[e / cols];
        }
        Ok(())
    }
}

/// The work tile a role's region ops run for: softmax `g`'s, else the CTA's first.
fn work_tile(plan: &Plan<'_>, role: usize) -> usize {
    match plan.sched.roles[role].kind {
        RoleKind::Softmax(g) => g as usize,
        _ => 0,
    }
}

/// Moves the data of `step` of role `role` in CTA `c`.
fn dispatch<'k>(
    plan: &Plan<'k>,
    ctas: &mut [Cta<'_, 'k>],
    m: &mut Machine<'k, '_, '_>,
    role: usize,
    c: usize,
    step: Step,
) -> Result<(), InterpError> {
    let s = plan.sched;
    let at = step.at;
    let (k, t) = (at.tile as usize, at.t);
    let stage = |i: u32| i % s.stages.max(1);
    let g = work_tile(plan, role);
    match (step.op, &plan.parts) {
        (Op::Tma { load }, _) => tma(plan, ctas, m, c, load, step),
        (
            Op::Wgmma(MmaPart::Body)
            | Op::Tcgen05Mma {
                part: MmaPart::Body,
                ..
            },
            Parts::Whole(ops),
        ) => {
            match s
                .cluster
                .as_ref()
                .and_then(|cl| cl.pair.map(|p| (cl.shared, p)))
            {
                Some((shared, pair)) => {
                    pair_mma(plan, ctas, m, step, ops, (LoadId::from_index(shared), pair))
                }
                None => ctas[c].consume(m, (k, t), ops, stage(at.i), None),
            }
        }
        (Op::Wgmma(MmaPart::Head), Parts::Rotated { head: ops, .. })
        | (Op::Run(Region::Between), Parts::Rotated { between: ops, .. }) => {
            ctas[c].consume(m, (k, t), ops, stage(at.i), None)
        }
        (Op::Wgmma(MmaPart::Tail), Parts::Rotated { tail, .. }) => {
            ctas[c].consume(m, (k, t - 1), tail, stage(at.i - 1), None)
        }
        (Op::Tcgen05Mma { part, tile }, Parts::Pair(body)) => {
            let (work, stage) = ((k, tile as usize, t), stage(at.i));
            match part {
                MmaPart::Head => ctas[c].mma_s(m, work, stage, body),
                MmaPart::Tail => ctas[c].mma_o(m, work, stage, body),
                MmaPart::Body => Ok(()),
            }
        }
        (Op::Run(Region::Between), Parts::Pair(body)) => ctas[c].softmax(m, (k, g, t), body),
        (Op::TmemLoad { tile, .. }, _) => {
            let cta = &mut ctas[c];
            if cta.score_tile(g) == Some(tile) {
                // The softmax copies its scores: the head mma's products of the iteration.
                if cta.groups[k].own(g, t) {
                    let mut env = cta.iteration(k, g, t);
                    let head = s.overlap.as_ref().map(|o| o.head);
                    if let Some(h) = head {
                        env[plan.kernel.ops[h].results[0].index()] = cta.tmem.get(&tile).cloned();
                    }
                    cta.iterations.insert((k, g, t), env);
                }
            } else if let Some(v) = cta.tmem.get(&tile).cloned() {
                cta.copies.insert((k, tile), v);
            }
            Ok(())
        }
        (Op::TmemStore { tile }, Parts::Pair(body)) => {
            let cta = &mut ctas[c];
            if cta.score_tile(g) != Some(tile) {
                return Ok(());
            }
            // P goes to tensor memory in the tail mma's element type: the cast.
            let cast = &plan.kernel.ops[body.p_cast];
            let p = cta.softmax_value((k, g, t), cast.operands[0], body)?;
            let to = plan.kernel.ty(cast.results[0]).dtype();
            let p = eval::cast(&p, to).map_err(|_| plan.error("the cast of P".into()))?;
            cta.tmem.insert(tile, p);
            Ok(())
        }
        (Op::FactorStore { tile }, Parts::Pair(body)) => {
            let cta = &mut ctas[c];
            let f = cta.softmax_value((k, tile as usize, t), body.factor, body)?;
            cta.factors.insert(tile, f);
            Ok(())
        }
        (Op::FactorLoad { tile }, _) => {
            let cta = &mut ctas[c];
            if let Some(f) = cta.factors.get(&tile).cloned() {
                cta.factors_read.insert(tile, f);
            }
            Ok(())
        }
        (Op::RescaleBegin { tile }, _) => ctas[c].rescale(tile as usize),
        (Op::Run(Region::Epilogue(cols)), _) => {
            // The code after the loop runs once, with its last chunk of columns.
            let last = s.roles[role]
                .program
                .end
                .iter()
                .filter_map(|op| match *op {
                    Op::Run(Region::Epilogue(Some((c, n)))) => Some(c + n),
                    _ => None,
                })
                .max();
            if cols.is_none_or(|(c, n)| Some(c + n) == last) {
                ctas[c].epilogue(m, k, g)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// A producer's TMA of `load` in CTA `c`: a once load at its work tile's coordinates; a ring
/// load at the iteration's, into the stage of every CTA its boxes land in (a cluster's
/// shared load: the boxes this CTA issues into their masks' CTAs; a 2-SM pair's: its half,
/// at its rank's offset).
fn tma<'k>(
    plan: &Plan<'k>,
    ctas: &mut [Cta<'_, 'k>],
    m: &mut Machine<'k, '_, '_>,
    c: usize,
    load: LoadId,
    step: Step,
) -> Result<(), InterpError> {
    let s = plan.sched;
    let l = &s.loads[load];
    let (k, t) = (step.at.tile as usize, step.at.t);
    if s.once(load) {
        let cta = &mut ctas[c];
        let g = l.work_tile as usize;
        let mut env = cta.groups[k].tiles[g].env.clone();
        let coords = cta.mem.tma_coords(m, load, &mut env, &[])?;
        return cta.mem.tma_boxes(m, load, 0, &coords, None);
    }
    let stage = step.at.i % s.stages.max(1);
    let slice = plan.coords.get(&load).map_or(&[][..], Vec::as_slice);
    let mut env = ctas[c].scratch(k, 0, t);
    let mut coords = ctas[c].mem.tma_coords(m, load, &mut env, slice)?;
    let cluster = s.cluster.as_ref();
    let shared = cluster.is_some_and(|cl| cl.shared == load.index());
    match cluster {
        Some(cl) if let Some(p) = cl.pair => {
            if shared {
                let n = coords.len();
                for (d, &h) in p.half.iter().enumerate() {
                    coords[n - 2 + d] += c as i32 * h as i32;
                }
            }
            ctas[c].mem.tma_boxes(m, load, stage, &coords, None)
        }
        Some(cl) if shared => {
            let issues: Vec<(usize, u16)> = cl
                .multicast
                .iter()
                .enumerate()
                .filter(|(_, x)| x.issuer == c as u32)
                .map(|(b, x)| (b, x.mask))
                .collect();
            for (b, mask) in issues {
                for (to, cta) in ctas.iter_mut().enumerate() {
                    if mask & (1 << to) != 0 {
                        cta.mem.tma_boxes(m, load, stage, &coords, Some(b))?;
                    }
                }
            }
            Ok(())
        }
        _ => ctas[c].mem.tma_boxes(m, load, stage, &coords, None),
    }
}

/// The leader's mma in a 2-SM pair: every CTA's iteration runs with the B tile joined from
/// the CTAs' halves, in rank order.
fn pair_mma<'k>(
    plan: &Plan<'k>,
    ctas: &mut [Cta<'_, 'k>],
    m: &mut Machine<'k, '_, '_>,
    step: Step,
    ops: &[OpId],
    (shared, pair): (LoadId, crate::sched::cluster::Pair),
) -> Result<(), InterpError> {
    let (k, t) = (step.at.tile as usize, step.at.t);
    let stage = step.at.i % plan.sched.stages.max(1);
    let halves = ctas
        .iter()
        .map(|c| c.mem.read(shared, stage, true))
        .collect::<Result<Vec<_>, _>>()?;
    // The halves lie along the axis of the pair's offset: rows of a B stored [N, K], columns
    // of one stored [K, N].
    let b = join(&halves, usize::from(pair.half[0] == 0)).ok_or_else(|| {
        plan.error(format!(
            "the halves of {} do not join",
            plan.sched.loads[shared].tma.load
        ))
    })?;
    for c in ctas.iter_mut() {
        c.consume(m, (k, t), ops, stage, Some((shared, &b)))?;
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
