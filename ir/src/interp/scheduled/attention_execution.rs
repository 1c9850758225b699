//! The execution of the sm_100a attention schedule ([`AttentionPlan`]): its five roles run on
//! the plan's own protocol machine ([`crate::passes::protocol_check`]), which reports each
//! completed step; the data moves as the plan says.
//!
//! A CTA walks pairs of work tiles (the tile scheduler over the grid with x halved): Q tiles
//! `2 p` and `2 p + 1` of one head share one walk of the key blocks, from the earlier start to
//! the later end. The load warp's TMA steps fill the two Q buffers and the K/V ring in shared
//! memory ([`Memory`]). The MMA thread writes `S_g = Q_g K^T` into tile `g`'s tensor memory
//! and accumulates `O_g += P_g V` there (the walk's first iteration overwrites). Softmax
//! warpgroup `g` copies `S_g` out, runs the loop's code between the mmas on it (the maximum
//! deferred row by row, the polynomial share of the score exponentials as
//! [`crate::tmem::exp2::exp2_poly`] computes them), writes its factors to shared memory and
//! `P_g` over `S_g`; iterations outside its tile's own range are no-ops (`P = 0`, factors 1,
//! its running values kept). The correction warpgroup rescales `O_g` by the factors from the
//! second iteration on. After the walk, softmax `g` runs the code after the loop on `O_g` and
//! its running values, its store through its own staging tile.

use std::collections::BTreeMap;

use crate::kernel::{OpId, OpKind, UnaryOp, ValueDef, ValueId};
use crate::passes::legacy_protocol::tmem_attention::{Pos, run_observed};
use crate::ring::TmaLoad;
use crate::tmem::attention::{AttentionPlan, AttnStep, Q_TILES};
use crate::tmem::exp2::exp2_poly;

use super::super::error::InterpError;
use super::super::eval;
use super::super::exec::Machine;
use super::super::value::{Elems, Value};
use super::{Env, Memory, Plan, Stop, Tile, backward_slice, defer, run_checked, trips};

/// Runs the attention schedule of `plan` over the kernel's logical `grid` on `ctas` CTAs.
pub(super) fn run<'k>(
    plan: &Plan<'k>,
    attention: &'k AttentionPlan,
    m: &mut Machine<'k, '_, '_>,
    grid: [u32; 3],
    ctas: u32,
) -> Result<(), InterpError> {
    let body = Body::new(plan, attention)?;
    let pairs = [grid[0].div_ceil(2), grid[1], grid[2]];
    for blocks in plan.walk(pairs, ctas) {
        PairCta::new(plan, attention, &body, m, blocks)?.run(m)?;
    }
    Ok(())
}

/// What the roles run of the loop body.
struct Body {
    /// The softmax's ops (the code between the mmas and the iteration-local ops), in order.
    softmax: Vec<OpId>,
    /// The ops computing the head mma's operands (its staged load and its transpose) and the
    /// head mma itself; the ops computing the tail mma's staged operand.
    head: Vec<OpId>,
    tail_b: Vec<OpId>,
    /// The factors the correction reads, and the cast of `P` the tail mma reads (written to
    /// tensor memory, not run by the softmax).
    factor: ValueId,
    p_cast: OpId,
    /// The exponential producing `P`, whose columns take the polynomial share.
    exp2: Option<OpId>,
}

impl Body {
    fn new(plan: &Plan<'_>, attention: &AttentionPlan) -> Result<Body, InterpError> {
        let kernel = plan.kernel;
        let o = &attention.overlap;
        let ops = &plan.body.ops;
        let def_op = |v: ValueId| match kernel.values[v].def {
            ValueDef::Op(op, _) => Some(op),
            ValueDef::BlockArg { .. } => None,
        };
        let p_cast = def_op(kernel.ops[o.tail].operands[0])
            .filter(|&c| matches!(kernel.ops[c].kind, OpKind::Cast { .. }))
            .ok_or_else(|| plan.error("the P V mma does not read a cast of P".into()))?;
        let exp2 = def_op(kernel.ops[p_cast].operands[0])
            .filter(|&e| kernel.ops[e].kind == OpKind::Unary(UnaryOp::Exp2));
        let (_, factor) = o
            .rescale
            .ok_or_else(|| plan.error("an attention plan without its rescale".into()))?;
        let mut head = backward_slice(kernel, ops, &kernel.ops[o.head].operands);
        head.push(o.head);
        let tail_b = backward_slice(kernel, ops, &kernel.ops[o.tail].operands[1..2]);
        let staged = |op: OpId| {
            plan.ring.loads.iter().any(|l| l.load == op)
                || kernel.ops[op].kind == OpKind::Transpose
                    && def_op(kernel.ops[op].operands[0])
                        .is_some_and(|d| plan.ring.loads.iter().any(|l| l.load == d))
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
        Ok(Body {
            softmax,
            head,
            tail_b,
            factor,
            p_cast,
            exp2,
        })
    }
}

/// A pair of work tiles: both tiles, and the walk they share.
struct Pair {
    tiles: [Tile; 2],
    lo: i32,
    step: i32,
    trips: u32,
}

impl Pair {
    /// The loop index of the walk's iteration `j`.
    fn index(&self, j: u32) -> i32 {
        self.lo.wrapping_add((j as i32).wrapping_mul(self.step))
    }

    /// Whether iteration `j` of the walk is one of tile `g`'s own.
    fn own(&self, g: usize, j: u32) -> bool {
        let (i, t) = (self.index(j), &self.tiles[g]);
        t.lo <= i && i < t.end()
    }
}

/// One CTA's execution of the attention schedule.
struct PairCta<'p, 'k> {
    plan: &'p Plan<'k>,
    attention: &'k AttentionPlan,
    body: &'p Body,
    pairs: Vec<Pair>,
    /// The values of the softmax of tile `g` in iteration `j` of pair `k`, keyed `(k, g, j)`.
    iterations: BTreeMap<(usize, usize, u32), Env>,
    mem: Memory<'p, 'k>,
    /// The Q tiles' loads (tile 1's buffer at the plan's offset).
    q: [TmaLoad; 2],
    /// Tensor memory: each tile's `S` (then `P`) and `O`; shared memory: each tile's factors
    /// as the softmax wrote them and as the correction read them.
    s: [Option<Value>; 2],
    o: [Option<Value>; 2],
    scale: [Option<Value>; 2],
    factor: [Option<Value>; 2],
}

impl<'p, 'k> PairCta<'p, 'k> {
    /// Runs the code before the loop for both tiles of each pair and works out the walks.
    fn new(
        plan: &'p Plan<'k>,
        attention: &'k AttentionPlan,
        body: &'p Body,
        m: &mut Machine<'k, '_, '_>,
        blocks: Vec<[i32; 3]>,
    ) -> Result<PairCta<'p, 'k>, InterpError> {
        let mut pairs = Vec::with_capacity(blocks.len());
        for [xp, y, z] in blocks {
            let t0 = Tile::new(plan, m, [2 * xp, y, z])?;
            let t1 = Tile::new(plan, m, [2 * xp + 1, y, z])?;
            if t0.step != t1.step {
                return Err(plan.error("the pair's tiles step their loops differently".into()));
            }
            let (lo, end) = (t0.lo.min(t1.lo), t0.end().max(t1.end()));
            let step = t0.step;
            let trips = trips(lo, end, step).ok_or_else(|| plan.error("too many trips".into()))?;
            pairs.push(Pair {
                tiles: [t0, t1],
                lo,
                step,
                trips,
            });
        }
        let once = plan
            .ring
            .once
            .first()
            .ok_or_else(|| plan.error("an attention ring without its Q load".into()))?;
        let mut q1 = once.clone();
        q1.offset = attention.q1_offset;
        Ok(PairCta {
            plan,
            attention,
            body,
            pairs,
            iterations: BTreeMap::new(),
            mem: Memory::new(plan),
            q: [once.clone(), q1],
            s: [None, None],
            o: [None, None],
            scale: [None, None],
            factor: [None, None],
        })
    }

    /// Runs the five roles' programs, moving the data at each completed step.
    fn run(mut self, m: &mut Machine<'k, '_, '_>) -> Result<(), InterpError> {
        let plan = self.plan;
        let trips: Vec<u32> = self.pairs.iter().map(|p| p.trips).collect();
        let mut stop = Stop::default();
        let protocol = run_observed(plan.ring, self.attention, &trips, &mut |role, step, at| {
            stop.keep(self.step(m, role, step, at))
        });
        stop.finish(plan, protocol)?;
        self.mem.wait_bulk(m)
    }

    /// Moves the data of step `s` of `role` (load warp, MMA thread, softmax 0 and 1,
    /// correction) at `at`.
    fn step(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        role: usize,
        s: AttnStep,
        at: Pos,
    ) -> Result<(), InterpError> {
        let k = at.tile as usize;
        let stage = at.it % self.plan.ring.stages;
        match (role, s) {
            (0, AttnStep::LoadQ { tile }) => {
                let g = tile as usize;
                let q = self.q[g].clone();
                self.mem.tma(m, &q, 0, &mut self.pairs[k].tiles[g].env, &[])
            }
            (0, AttnStep::LoadKv) => self.load_kv(m, k, at.j, stage),
            (1, AttnStep::MmaS { tile }) => self.mma_s(m, k, tile as usize, at.j, stage),
            (1, AttnStep::MmaO { tile }) => self.mma_o(m, k, tile as usize, at.j, stage),
            (2 | 3, AttnStep::LoadS { tile }) => {
                let g = tile as usize;
                if self.pairs[k].own(g, at.j) {
                    let mut env = self.iteration(k, g, at.j);
                    let scores = self.plan.kernel.ops[self.attention.overlap.head].results[0];
                    env[scores.index()] = self.s[g].clone();
                    self.iterations.insert((k, g, at.j), env);
                }
                Ok(())
            }
            (2 | 3, AttnStep::Softmax) => self.softmax(m, k, role - 2, at.j),
            (2 | 3, AttnStep::StoreScale { tile }) => {
                let g = tile as usize;
                self.scale[g] = Some(self.softmax_value(k, g, at.j, self.body.factor)?);
                Ok(())
            }
            (2 | 3, AttnStep::StoreP { tile }) => {
                // P goes to tensor memory in the tail mma's element type: the cast.
                let g = tile as usize;
                let cast = &self.plan.kernel.ops[self.body.p_cast];
                let p = self.softmax_value(k, g, at.j, cast.operands[0])?;
                let to = self.plan.kernel.ty(cast.results[0]).dtype();
                let p = eval::cast(&p, to).map_err(|_| self.plan.error("the cast of P".into()))?;
                self.s[g] = Some(p);
                Ok(())
            }
            (2 | 3, AttnStep::Epilogue) => self.epilogue(m, k, role - 2),
            (4, AttnStep::LoadScale { tile }) => {
                let g = tile as usize;
                self.factor[g] = self.scale[g].clone();
                Ok(())
            }
            (4, AttnStep::BeginRescale { tile }) => self.rescale(tile as usize),
            _ => Ok(()),
        }
    }

    /// The ring producer's iteration `j` of pair `k`: each K/V load at the walk's index,
    /// coordinates from tile 0's code before the loop (both tiles read the same keys).
    fn load_kv(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        j: u32,
        stage: u32,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        for (load, l) in plan.ring.loads.iter().enumerate() {
            let mut env = self.scratch(k, 0, j);
            self.mem.tma(m, l, stage, &mut env, &plan.coords[load])?;
        }
        Ok(())
    }

    /// Tile `g`'s values before the loop with the walk's index of iteration `j`.
    fn scratch(&self, k: usize, g: usize, j: u32) -> Env {
        let pair = &self.pairs[k];
        let mut env = pair.tiles[g].env.clone();
        env[self.plan.body.args[0].index()] = Some(Value::i32(pair.index(j)));
        env
    }

    /// Runs `ops` in a scratch environment of tile `g`, iteration `j`, with the ring's loads
    /// read from `stage` and tile `g`'s Q from its buffer; returns the environment.
    fn operands(
        &self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        g: usize,
        j: u32,
        stage: u32,
        ops: &[OpId],
    ) -> Result<Env, InterpError> {
        let plan = self.plan;
        let mut env = self.scratch(k, g, j);
        let q = plan.kernel.ops[self.q[g].load].results[0];
        env[q.index()] = Some(self.mem.read(&self.q[g], 0)?);
        for l in &plan.ring.loads {
            if ops.contains(&l.load) {
                m.serve(l.load, self.mem.read(l, stage)?);
            }
        }
        m.swap_env(&mut env);
        let ran = ops.iter().try_for_each(|&op| run_checked(plan, m, op));
        m.swap_env(&mut env);
        m.unserve();
        ran.map(|()| env)
    }

    /// `S_g = Q_g K^T` into tile `g`'s tensor memory.
    fn mma_s(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        g: usize,
        j: u32,
        stage: u32,
    ) -> Result<(), InterpError> {
        let env = self.operands(m, k, g, j, stage, &self.body.head)?;
        let scores = self.plan.kernel.ops[self.attention.overlap.head].results[0];
        self.s[g] = env[scores.index()].clone();
        Ok(())
    }

    /// `O_g (+)= P_g V`, with `P_g` from tensor memory; the walk's first iteration
    /// overwrites `O_g`.
    fn mma_o(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        g: usize,
        j: u32,
        stage: u32,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let env = self.operands(m, k, g, j, stage, &self.body.tail_b)?;
        let tail = &plan.kernel.ops[self.attention.overlap.tail];
        let (Some(p), Some(v)) = (&self.s[g], &env[tail.operands[1].index()]) else {
            return Err(plan.error(format!("{} runs before P or V is there", tail.results[0])));
        };
        let acc = if j == 0 { None } else { self.o[g].as_ref() };
        let o = eval::mma(p, v, acc).map_err(|_| plan.error("the P V mma".into()))?;
        self.o[g] = Some(o);
        Ok(())
    }

    /// Softmax `g`'s iteration `j`: the code between the mmas on its copied scores, or a
    /// no-op outside the tile's own range.
    fn softmax(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        g: usize,
        j: u32,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let mut env = self.iteration(k, g, j);
        if self.pairs[k].own(g, j) {
            m.swap_env(&mut env);
            let ran = self
                .body
                .softmax
                .iter()
                .try_for_each(|&op| self.run_op(m, op));
            m.swap_env(&mut env);
            ran?;
        } else {
            // Its running values stay as they were.
            for (c, &arg) in plan.body.args[1..].iter().enumerate() {
                if c != self.attention.overlap.carried {
                    env[plan.yielded[c].index()] = env[arg.index()].clone();
                }
            }
        }
        self.iterations.insert((k, g, j), env);
        Ok(())
    }

    /// One op of the softmax: the polynomial share of `P`'s exponential, the maximum deferred
    /// row by row.
    fn run_op(&self, m: &mut Machine<'k, '_, '_>, op: OpId) -> Result<(), InterpError> {
        let plan = self.plan;
        run_checked(plan, m, op)?;
        if Some(op) == self.body.exp2 {
            self.exp2_share(m, op)?;
        }
        match self.attention.overlap.defer {
            Some(d) if d.max == op => {
                let rows = plan.kernel.ty(plan.kernel.ops[op].results[0]);
                let rows = rows.shape().map_or(1, |s| s.dims()[0]);
                let each: Vec<Vec<usize>> = (0..rows).map(|r| vec![r]).collect();
                defer(plan, m, d, &each)
            }
            _ => Ok(()),
        }
    }

    /// The columns `c` with `c % den < num` of the exponential `op` computed by the
    /// polynomial, as the softmax computes them on the FMA pipes.
    fn exp2_share(&self, m: &mut Machine<'k, '_, '_>, op: OpId) -> Result<(), InterpError> {
        let kernel = self.plan.kernel;
        let (num, den) = self.attention.poly_share;
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

    /// Value `v` of softmax `g`'s iteration `j`: what it computed, or in a no-op iteration
    /// the factors 1 and `P = 0` (tiles of `v`'s type).
    fn softmax_value(&self, k: usize, g: usize, j: u32, v: ValueId) -> Result<Value, InterpError> {
        if self.pairs[k].own(g, j) {
            let env = self.iterations.get(&(k, g, j));
            return env.and_then(|env| env[v.index()].clone()).ok_or_else(|| {
                self.plan
                    .error(format!("softmax {g} hands on {v} before computing it"))
            });
        }
        let fill = if v == self.body.factor { 1.0 } else { 0.0 };
        let ty = self.plan.kernel.ty(v);
        let dims = ty.shape().map(|s| s.dims().to_vec()).unwrap_or_default();
        let n = dims.iter().product();
        Ok(Value {
            dtype: ty.dtype(),
            dims,
            elems: Elems::F(vec![fill; n]),
        })
    }

    /// The correction's rescale of `O_g` by the factors it read, row by row.
    fn rescale(&mut self, g: usize) -> Result<(), InterpError> {
        let (Some(o), Some(f)) = (self.o[g].as_mut(), self.factor[g].as_ref()) else {
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

    /// Softmax `g`'s values in iteration `j` of pair `k` (taken out of the map while a step
    /// runs): tile `g`'s values before the loop, the walk's index, and each running value
    /// from the iteration before.
    fn iteration(&mut self, k: usize, g: usize, j: u32) -> Env {
        let plan = self.plan;
        let mut env = match self.iterations.remove(&(k, g, j)) {
            Some(env) => env,
            None => self.scratch(k, g, j),
        };
        let initial = self.pairs[k].tiles[g].initial(plan);
        for (c, &arg) in plan.body.args[1..].iter().enumerate() {
            if env[arg.index()].is_none() {
                env[arg.index()] = match j.checked_sub(1) {
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

    /// Tile `g`'s code after the loop: its running values from the walk's last iteration,
    /// `O_g` from tensor memory (the loop's initial value after an empty walk), its store
    /// through its own staging tile.
    fn epilogue(
        &mut self,
        m: &mut Machine<'k, '_, '_>,
        k: usize,
        g: usize,
    ) -> Result<(), InterpError> {
        let plan = self.plan;
        let kernel = plan.kernel;
        let results = &kernel.ops[plan.ring.for_op].results;
        let trips = self.pairs[k].trips;
        let initial = self.pairs[k].tiles[g].initial(plan);
        let last = trips
            .checked_sub(1)
            .and_then(|j| self.iterations.get(&(k, g, j)));
        let mut env = self.pairs[k].tiles[g].env.clone();
        for (c, &r) in results.iter().enumerate() {
            env[r.index()] = if c == self.attention.overlap.carried && trips > 0 {
                self.o[g].clone()
            } else {
                match last {
                    Some(last) => last[plan.yielded[c].index()].clone(),
                    None => initial[c].clone(),
                }
            };
        }
        if results.iter().any(|r| env[r.index()].is_none()) {
            return Err(plan.error(format!(
                "tile {g} of pair {k}: the loop's results are not all computed"
            )));
        }
        let block = self.pairs[k].tiles[g].block;
        let store = self.attention.stores.get(g);
        self.mem
            .epilogue(m, &mut env, block, &|op| store.filter(|st| st.store == op))?;
        for j in 0..trips {
            self.iterations.remove(&(k, g, j));
        }
        Ok(())
    }
}

// The pair's per-tile arrays hold the plan's two Q tiles.
const _: () = assert!(Q_TILES == 2);
