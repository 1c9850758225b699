//! A softmax warpgroup of the attention schedule. Per iteration it copies its Q tile's score
//! rows from TMEM (thread `t`: row `t`, so row maxima and sums need no shuffle), runs the loop's
//! code between the two mmas (mask, online softmax) with the deferred maximum, hands the rows'
//! rescale factors to the correction warpgroup through shared memory and writes `P` (bf16 pairs)
//! over `S` in TMEM; after the loop it copies `O` out and runs the kernel's code after the loop.
//! A share of the exponentials ([`kiln_ir::sched::Sched::poly_share`]) is the FMA polynomial of
//! [`kiln_ir::tmem::exp2`]; the rest `ex2.approx.ftz`.

use std::collections::BTreeSet;

use kiln_ir::sched::overlap::{Deferral, Overlap};
use kiln_ir::sched::tmem::ACC_ROWS;
use kiln_ir::sched::{Op, Region, Role};
use kiln_ir::tmem::exp2::{EXP2_POLY, EXP2_POLY_MIN};
use kiln_ir::{OpId, OpKind, UnaryOp, ValueId};

use crate::emit::{Emitter, Val};
use crate::error::CodegenError;
use crate::sched::{self, Cursor, View};
use crate::sm100a::Sm100a;
use crate::types::{Class, Reg};

/// What the softmax role needs of the loop body.
struct Body {
    /// The ops it writes (the code between the mmas and the iteration-local ops), in order.
    ops: Vec<OpId>,
    /// The scores (the head mma's result), the factors handed to the correction, and `P` in
    /// f32 (the operand of the cast the tail mma reads).
    scores: ValueId,
    factor: ValueId,
    p: ValueId,
    /// The exponential producing `p`, when there is one (its columns take the polynomial
    /// share).
    exp2: Option<OpId>,
}

/// Registers a softmax iteration reads: the iteration count, the thread's `S` address in
/// TMEM and its factor's shared address.
struct Regs {
    it: Reg,
    s_at: Reg,
    scale: Reg,
}

/// The op defining `v`, unless `v` is a block argument.
fn def_op(k: &kiln_ir::Kernel, v: ValueId) -> Option<OpId> {
    match k.values[v].def {
        kiln_ir::kernel::ValueDef::Op(op, _) => Some(op),
        kiln_ir::kernel::ValueDef::BlockArg { .. } => None,
    }
}

/// The loop body's parts (see [`Body`]).
fn body(e: &Emitter<'_>, v: &View<'_>) -> Result<Body, CodegenError> {
    let k = v.k;
    let o = overlap(e, v)?;
    let block = &k.ops[v.for_op()].regions[0];
    let cast = def_op(k, k.ops[o.tail].operands[0]);
    let Some(cast) = cast.filter(|&c| matches!(k.ops[c].kind, OpKind::Cast { .. })) else {
        return Err(e.internal(o.tail, "an attention PV mma whose P is not a cast"));
    };
    let pv = k.ops[cast].operands[0];
    let exp2 = def_op(k, pv).filter(|&e| k.ops[e].kind == OpKind::Unary(UnaryOp::Exp2));
    let staged: BTreeSet<OpId> = v.s.ring_loads().map(|(_, l)| l.tma.load).collect();
    let skip = |op: OpId| {
        let kind = &k.ops[op].kind;
        staged.contains(&op)
            || (*kind == OpKind::Transpose
                && def_op(k, k.ops[op].operands[0]).is_some_and(|d| staged.contains(&d)))
            || op == o.head
            || o.tail_ops.contains(&op)
            || op == cast
            || *kind == OpKind::Yield
    };
    let (_, factor) = o
        .rescale
        .ok_or_else(|| e.internal(o.tail, "an attention schedule without its rescale"))?;
    Ok(Body {
        ops: block.ops.iter().copied().filter(|&op| !skip(op)).collect(),
        scores: k.ops[o.head].results[0],
        factor,
        p: pv,
        exp2,
    })
}

impl Sm100a<'_, '_> {
    /// Softmax warpgroup `g` (see the module doc).
    pub(super) fn softmax(&mut self, role: &Role, g: u32) -> Result<(), CodegenError> {
        let b = body(self.e, &self.v)?;
        // The warpgroup's code sees its own threads 0..128: the tile's layout, its rows and
        // its store's issuing thread; its stores are its own tile's.
        let global = self.e.tid;
        let local = self.e.new_reg(Class::B32);
        self.e
            .ins(format!("and.b32 {local}, {global}, {}", ACC_ROWS - 1));
        self.e.tid = local;
        let stores = self.ops.stores;
        self.ops.stores = stores.get(g as usize..=g as usize).unwrap_or_default();
        let written = self.softmax_tiles(role, g, &b);
        self.ops.stores = stores;
        self.e.tid = global;
        written
    }

    /// Softmax warpgroup `g`'s walk over the tiles, then its stores' last wait.
    fn softmax_tiles(&mut self, role: &Role, g: u32, b: &Body) -> Result<(), CodegenError> {
        let id = self.v.for_op();
        let o = overlap(self.e, &self.v)?;
        let (base, lanes) = self.lanes();
        let s_col = self.column("S", g)?;
        let (s_at, row) = (self.e.new_reg(Class::B32), self.e.new_reg(Class::B32));
        self.e.ins(format!("add.u32 {s_at}, {lanes}, {s_col}"));
        // The thread's row of the tile: its factor's slot.
        self.e
            .ins(format!("and.b32 {row}, {}, {}", self.e.tid, ACC_ROWS - 1));
        let scale = self.e.new_reg(Class::B32);
        self.e
            .ins(format!("mad.lo.u32 {scale}, {row}, 4, {}", self.e.smem));
        self.e
            .ins(format!("add.u32 {scale}, {scale}, {}", self.factors(g)));
        let it = self.e.new_reg(Class::B32);
        self.e.ins(format!("mov.u32 {it}, 0"));
        let mut c = self.v.cursor(self.e, &[]);
        let pair = self.open_pair(&mut c)?;
        for &op in &role.program.tile {
            match op {
                Op::Wait { .. } => self.warp_wait(op, Some(it), &c)?,
                other => self.tmem_op(other, base)?,
            }
        }
        let [lo, hi, step] = self.pair_bounds(&pair)?;
        self.enter_pair_tile(&pair, g, false)?;
        let [own_lo, own_hi, _] = self.v.loop_bounds(self.e)?;
        let op = &self.v.k.ops[id];
        let block = op.regions[0].clone();
        let carried_at = o.carried;
        // The carried values but the accumulator (which lives in TMEM) get registers.
        let iv = self.e.new_reg(Class::B32);
        self.e.mov(iv, lo);
        self.e.vals.insert(block.args[0], Val::Scalar(iv));
        let mut carried: Vec<(usize, Val)> = Vec::new();
        for (i, &init) in op.operands[3..].iter().enumerate() {
            if i != carried_at {
                carried.push((i, self.e.carry(init, block.args[1 + i], id)?));
            }
        }
        let counted = self.e.open_counted_loop(iv, hi, step);
        let outside = self.e.setp("ge.s32", iv, own_hi);
        let (noop, join) = (self.e.new_label(), self.e.new_label());
        self.e.ins(format!(
            "setp.lt.or.s32 {outside}, {iv}, {own_lo}, {outside}"
        ));
        self.e.ins(format!("@{outside} bra.uni {noop}"));
        let r = Regs { it, s_at, scale };
        self.softmax_iteration(role, b, &c, &r, false)?;
        let yields = self.e.yielded(&block);
        let (dsts, srcs): (Vec<Val>, Vec<ValueId>) =
            carried.iter().map(|(i, v)| (v.clone(), yields[*i])).unzip();
        self.e.assign_all(&dsts, &srcs, id)?;
        self.e.ins(format!("bra.uni {join}"));
        self.e
            .comment("outside this tile's own key blocks: the protocol only");
        self.e.label(&noop);
        self.softmax_iteration(role, b, &c, &r, true)?;
        self.e.label(&join);
        self.e.ins(format!("add.u32 {it}, {it}, 1"));
        self.e.close_counted_loop(&counted);
        self.softmax_end(role, g, &c, it, [lo, hi], lanes, &carried)?;
        self.close_pair(&pair, &c);
        for &op in &role.program.exit {
            match op {
                Op::BulkWaitAll => self.ops.exit(self.e, op)?,
                other => self.tmem_op(other, base)?,
            }
        }
        Ok(())
    }

    /// One iteration of softmax warpgroup `g`'s program; `noop`: one outside the tile's range,
    /// which keeps every barrier's phase but copies no score, hands on factors of 1 and a
    /// zero `P`, and leaves the carried values as they are.
    fn softmax_iteration(
        &mut self,
        role: &Role,
        b: &Body,
        c: &Cursor,
        r: &Regs,
        noop: bool,
    ) -> Result<(), CodegenError> {
        let (id, o) = (self.v.for_op(), overlap(self.e, &self.v)?);
        for &op in &role.program.iteration {
            match op {
                Op::Wait { .. } => self.warp_wait(op, Some(r.it), c)?,
                Op::TmemLoad { .. } | Op::Run(Region::Between) if noop => {}
                Op::TmemLoad { columns, .. } => {
                    let regs = self.tmem_load(r.s_at, columns);
                    self.e.vals.insert(b.scores, Val::Tile(regs));
                }
                Op::Run(Region::Between) => self.softmax_body(o, b)?,
                Op::FactorStore { .. } if noop => {
                    self.e
                        .ins(format!("st.shared.f32 [{}], 0f3F800000", r.scale));
                }
                Op::FactorStore { .. } => {
                    let f = self.e.tile(b.factor, id)?;
                    let [f] = f[..] else {
                        return Err(self.e.internal(id, "a rescale factor not one per thread"));
                    };
                    self.e.ins(format!("st.shared.f32 [{}], {f}", r.scale));
                }
                Op::TmemStore { tile } if noop => {
                    let n = self.tmem.tiles.get(tile.0).map_or(0, |t| t.columns);
                    let zero = self.e.new_reg(Class::B32);
                    self.e.ins(format!("mov.b32 {zero}, 0"));
                    self.tmem_store(r.s_at, &vec![zero; n as usize / 2]);
                }
                Op::TmemStore { .. } => {
                    let dtype = self.v.k.ty(self.v.k.ops[o.tail].operands[0]).dtype();
                    let ty = if dtype == kiln_ir::DType::F16 {
                        "f16x2"
                    } else {
                        "bf16x2"
                    };
                    let pv = self.e.tile(b.p, id)?;
                    let packed: Vec<Reg> = pv
                        .chunks(2)
                        .map(|pair| {
                            let x = self.e.new_reg(Class::B32);
                            // Column j of P holds keys 2j (low half) and 2j + 1, as a K-major
                            // bf16 row sits in memory; that the PV mma's A operand reads TMEM
                            // in this order is UNVERIFIED on hardware (no Blackwell here). The
                            // first source lands in the upper half (docs/ptx.md §6).
                            self.e
                                .ins(format!("cvt.rn.{ty}.f32 {x}, {}, {}", pair[1], pair[0]));
                            x
                        })
                        .collect();
                    self.tmem_store(r.s_at, &packed);
                }
                other => self.tmem_op(other, r.s_at)?,
            }
        }
        Ok(())
    }

    /// After the tile's loop: the output from TMEM (the accumulator's initial value when no
    /// iteration ran), handed back, then the kernel's code after the loop.
    #[allow(clippy::too_many_arguments)]
    fn softmax_end(
        &mut self,
        role: &Role,
        g: u32,
        c: &Cursor,
        it: Reg,
        [lo, hi]: [Reg; 2],
        lanes: Reg,
        carried: &[(usize, Val)],
    ) -> Result<(), CodegenError> {
        let (id, o) = (self.v.for_op(), overlap(self.e, &self.v)?);
        let op = &self.v.k.ops[id];
        let o_col = self.column("O", g)?;
        let o_at = self.e.new_reg(Class::B32);
        self.e.ins(format!("add.u32 {o_at}, {lanes}, {o_col}"));
        let (none, skip) = (self.e.setp("ge.s32", lo, hi), self.e.new_label());
        let init = self.e.tile(op.operands[3 + o.carried], id)?;
        let out: Vec<Reg> = init.iter().map(|_| self.e.new_reg(Class::F32)).collect();
        for (o, i) in out.iter().zip(&init) {
            self.e.mov(*o, *i);
        }
        self.e.ins(format!("@{none} bra.uni {skip}"));
        for &step in &role.program.end {
            match step {
                Op::Wait { .. } => self.warp_wait(step, Some(it), c)?,
                Op::TmemLoad {
                    column, columns, ..
                } => {
                    let regs = self.tmem_load_at(o_at, column, columns);
                    for (k, r) in regs.into_iter().enumerate() {
                        let at = out.get(column as usize + k).copied().ok_or_else(|| {
                            self.e.internal(id, "an output copy past the accumulator")
                        })?;
                        self.e.mov(at, r);
                    }
                }
                // A tile that ran no iteration has no product to wait for or copy.
                Op::TmemWaitLoad => {
                    self.tmem_op(step, lanes)?;
                    self.e.label(&skip);
                }
                Op::Run(Region::Epilogue(None)) => {
                    self.e
                        .vals
                        .insert(op.results[o.carried], Val::Tile(out.clone()));
                    for (i, v) in carried {
                        self.e.vals.insert(op.results[*i], v.clone());
                    }
                    let after = self.after.clone();
                    for x in after {
                        match self.ops.stores.first() {
                            _ if self.v.k.ops[x].kind == OpKind::Yield => {}
                            // Where the program stores it, without the op's comment.
                            Some(st) if st.store == x => {
                                sched::write_store(self.e, self.v.s, st.store, st, None)?;
                            }
                            _ => self.e.write_op(x, &mut self.ops)?,
                        }
                    }
                }
                other => self.tmem_op(other, lanes)?,
            }
        }
        Ok(())
    }

    /// The code between the mmas, with the polynomial share of the scores' exponential and
    /// the deferred maximum.
    fn softmax_body(&mut self, ov: &Overlap, b: &Body) -> Result<(), CodegenError> {
        for &o in &b.ops {
            if Some(o) == b.exp2 {
                self.exp2_share(o)?;
            } else {
                self.e.write_op(o, &mut self.ops)?;
            }
            if let Some(d) = ov.defer
                && d.max == o
            {
                self.defer_row_max(d)?;
            }
        }
        Ok(())
    }

    /// Row by row, the reference maximum stays while the new maximum exceeds it by at most
    /// the threshold (a `-inf` reference never stays: `x - -inf` is not below it); see
    /// `kiln_ir::tmem::attention` for why this is exact.
    fn defer_row_max(&mut self, d: Deferral) -> Result<(), CodegenError> {
        let m_new = self.v.k.ops[d.max].results[0];
        let new = self.e.tile(m_new, d.max)?;
        let old = self.e.tile(d.carried, d.max)?;
        let threshold = format!("0f{:08X}", Deferral::THRESHOLD.to_bits());
        let chosen: Vec<Reg> = new
            .iter()
            .zip(&old)
            .map(|(n, o)| {
                let growth = self.e.new_reg(Class::F32);
                self.e.ins(format!("sub.f32 {growth}, {n}, {o}"));
                let near = self.e.setp("le.f32", growth, &threshold);
                let r = self.e.new_reg(Class::F32);
                self.e.ins(format!("selp.f32 {r}, {o}, {n}, {near}"));
                r
            })
            .collect();
        self.e.vals.insert(m_new, Val::Tile(chosen));
        Ok(())
    }

    /// The scores' `exp2`: columns of the polynomial share on the FMA pipes
    /// (`kiln_ir::tmem::exp2`), the others `ex2.approx.ftz`.
    fn exp2_share(&mut self, id: OpId) -> Result<(), CodegenError> {
        let (num, den) = self.v.s.poly_share;
        let (x, r) = (self.v.k.ops[id].operands[0], self.v.k.ops[id].results[0]);
        let dist = self.e.dist(r, id)?;
        let [c1, c2, c3] = EXP2_POLY.map(|c| format!("0f{:08X}", c.to_bits()));
        let min = format!("0f{:08X}", EXP2_POLY_MIN.to_bits());
        let mut out = Vec::with_capacity(dist.regs.len());
        for offs in &dist.regs {
            let e = self.e.elem(x, offs, id)?;
            let d = self.e.new_reg(Class::F32);
            if den == 0 || offs[1] % den >= num {
                self.e.ins(format!("ex2.approx.ftz.f32 {d}, {e}"));
                out.push(d);
                continue;
            }
            // 2^x = 2^j 2^f, j = floor(x), f in [0, 1): the cubic for 2^f, j into the exponent.
            let [xc, j, f, q] = self.e.new_regs(Class::F32);
            let [ji, qi] = self.e.new_regs(Class::B32);
            self.e.ins(format!("min.f32 {xc}, {e}, 0f42FE0000"));
            self.e.ins(format!("cvt.rmi.f32.f32 {j}, {xc}"));
            self.e.ins(format!("sub.f32 {f}, {xc}, {j}"));
            self.e.ins(format!("fma.rn.f32 {q}, {c3}, {f}, {c2}"));
            self.e.ins(format!("fma.rn.f32 {q}, {q}, {f}, {c1}"));
            self.e.ins(format!("fma.rn.f32 {q}, {q}, {f}, 0f3F800000"));
            self.e.ins(format!("cvt.rzi.s32.f32 {ji}, {j}"));
            self.e.ins(format!("shl.b32 {ji}, {ji}, 23"));
            self.e.ins(format!("mov.b32 {qi}, {q}"));
            self.e.ins(format!("add.s32 {ji}, {ji}, {qi}"));
            self.e.ins(format!("mov.b32 {d}, {ji}"));
            let tiny = self.e.setp("lt.f32", e, &min);
            self.e.ins(format!("selp.f32 {d}, 0f00000000, {d}, {tiny}"));
            out.push(d);
        }
        self.e.vals.insert(r, Val::Tile(out));
        Ok(())
    }
}

/// The loop's structure the softmax runs (the `overlap` pass's), or an internal error.
fn overlap<'k>(e: &Emitter<'_>, v: &View<'k>) -> Result<&'k Overlap, CodegenError> {
    v.s.overlap
        .as_ref()
        .ok_or_else(|| e.internal(v.for_op(), "an attention schedule without its overlap"))
}
