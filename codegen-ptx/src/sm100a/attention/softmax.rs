//! A softmax warpgroup of the attention schedule: per iteration it copies its Q tile's score
//! rows from TMEM (thread `t`: row `t`, so the row maximum and sum need no shuffle), runs the
//! loop's code between the two mmas (the mask, the online softmax) with the deferred
//! maximum, hands the rows' rescale factors to the correction warpgroup through shared memory
//! and writes `P` (bf16 pairs) over `S` in TMEM; after the loop it copies `O` out and runs the
//! kernel's code after the loop (the normalisation and the store) for its tile.
//!
//! A share of the score tile's exponentials ([`kiln_ir::sched::Sched::poly_share`]) is the FMA
//! polynomial of [`kiln_ir::tmem::exp2`]; the rest `ex2.approx.ftz`.

use std::collections::BTreeSet;

use kiln_ir::sched::overlap::{Deferral, Overlap};
use kiln_ir::sched::tmem::{ACC_ROWS, LOAD_COLUMNS};
use kiln_ir::sched::{Op, Region, Role};
use kiln_ir::tmem::exp2::{EXP2_POLY, EXP2_POLY_MIN};
use kiln_ir::{OpId, OpKind, UnaryOp, ValueId};

use super::Parts;
use crate::CodegenError;
use crate::sm90a::Cursor;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

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
fn body(w: &Writer<'_>, p: &Parts) -> Result<Body, CodegenError> {
    let k = w.k;
    let o = overlap(w, p)?;
    let block = &k.ops[p.id].regions[0];
    let cast = def_op(k, k.ops[o.tail].operands[0]);
    let Some(cast) = cast.filter(|&c| matches!(k.ops[c].kind, OpKind::Cast { .. })) else {
        return Err(w.internal(o.tail, "an attention PV mma whose P is not a cast"));
    };
    let pv = k.ops[cast].operands[0];
    let exp2 = def_op(k, pv).filter(|&e| k.ops[e].kind == OpKind::Unary(UnaryOp::Exp2));
    let staged: BTreeSet<OpId> = p.s.ring_loads().map(|(_, l)| l.tma.load).collect();
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
        .ok_or_else(|| w.internal(o.tail, "an attention schedule without its rescale"))?;
    Ok(Body {
        ops: block.ops.iter().copied().filter(|&op| !skip(op)).collect(),
        scores: k.ops[o.head].results[0],
        factor,
        p: pv,
        exp2,
    })
}

impl Writer<'_> {
    /// Softmax warpgroup `g` (see the module doc).
    pub(super) fn write_softmax(
        &mut self,
        p: &Parts,
        role: &Role,
        g: u32,
    ) -> Result<(), CodegenError> {
        let b = body(self, p)?;
        // The warpgroup's code sees its own threads 0..128: the tile's layout, its rows and
        // its store's issuing thread.
        let global = self.tid;
        let local = self.new_reg(Class::B32);
        self.ins(format!("and.b32 {local}, {global}, {}", ACC_ROWS - 1));
        self.tid = local;
        let written = self.write_softmax_tiles(p, role, g, &b);
        self.tid = global;
        written
    }

    /// Softmax warpgroup `g`'s walk over the tiles, then its stores' last wait.
    fn write_softmax_tiles(
        &mut self,
        p: &Parts,
        role: &Role,
        g: u32,
        b: &Body,
    ) -> Result<(), CodegenError> {
        let o = overlap(self, p)?;
        let (_, lanes) = self.attention_tmem(p);
        let s_col = p
            .column("S", g)
            .ok_or_else(|| self.internal(p.id, "a softmax without its S tile"))?;
        let (s_at, row) = (self.new_reg(Class::B32), self.new_reg(Class::B32));
        self.ins(format!("add.u32 {s_at}, {lanes}, {s_col}"));
        // The thread's row of the tile: its factor's slot.
        self.ins(format!("and.b32 {row}, {}, {}", self.tid, ACC_ROWS - 1));
        let scale = self.new_reg(Class::B32);
        self.ins(format!("mad.lo.u32 {scale}, {row}, 4, {}", self.smem));
        self.ins(format!("add.u32 {scale}, {scale}, {}", p.factors(g)));
        let it = self.new_reg(Class::B32);
        self.ins(format!("mov.u32 {it}, 0"));
        let mut c = self.cursor(p.s, &[]);
        let pair = self.open_pair(p, &mut c)?;
        for &op in &role.program.tile {
            match op {
                Op::Wait { .. } => self.attn_wait(p, op, it, &c, true)?,
                other => self.attn_common(p, other)?,
            }
        }
        let [lo, hi, step] = self.pair_bounds(p, &pair)?;
        self.enter_pair_tile(p, &pair, g, false)?;
        let [own_lo, own_hi, _] = self.loop_bounds(p.id)?;
        let op = self.k.ops[p.id].clone();
        let block = op.regions[0].clone();
        let carried_at = o.carried;
        // The carried values but the accumulator (which lives in TMEM) get registers.
        let iv = self.new_reg(Class::B32);
        self.mov(iv, lo);
        self.vals.insert(block.args[0], Val::Scalar(iv));
        let mut carried: Vec<(usize, Val)> = Vec::new();
        for (i, &init) in op.operands[3..].iter().enumerate() {
            if i == carried_at {
                continue;
            }
            let v = match self.val(init, p.id)? {
                Val::Affine { .. } | Val::Lazy(_) => Val::Tile(self.tile(init, p.id)?),
                other => other,
            };
            let fresh = self.fresh_like(&v, p.id)?;
            self.assign(&fresh, &v, p.id)?;
            self.vals.insert(block.args[1 + i], fresh.clone());
            carried.push((i, fresh));
        }
        let counted = self.open_counted_loop(iv, hi, step);
        let (outside, noop, join) = (
            self.new_reg(Class::Pred),
            self.new_label(),
            self.new_label(),
        );
        self.ins(format!("setp.ge.s32 {outside}, {iv}, {own_hi}"));
        self.ins(format!(
            "setp.lt.or.s32 {outside}, {iv}, {own_lo}, {outside}"
        ));
        self.ins(format!("@{outside} bra.uni {noop}"));
        let r = Regs { it, s_at, scale };
        self.write_softmax_iteration(p, role, b, &c, &r, false)?;
        let yields = self.yielded(&block);
        let (dsts, srcs): (Vec<Val>, Vec<ValueId>) =
            carried.iter().map(|(i, v)| (v.clone(), yields[*i])).unzip();
        self.assign_all(&dsts, &srcs, p.id)?;
        self.ins(format!("bra.uni {join}"));
        self.comment("outside this tile's own key blocks: the protocol only");
        self.label(&noop);
        self.write_softmax_iteration(p, role, b, &c, &r, true)?;
        self.label(&join);
        self.ins(format!("add.u32 {it}, {it}, 1"));
        self.close_counted_loop(&counted);
        self.write_softmax_end(p, role, g, &c, it, [lo, hi], lanes, &carried)?;
        self.close_pair(&pair, &c);
        for &op in &role.program.exit {
            match op {
                Op::BulkWaitAll => {
                    let own = p.s.stores.get(g as usize).cloned();
                    self.finish_tma_stores(p.s, own.as_slice())?;
                }
                other => self.attn_common(p, other)?,
            }
        }
        Ok(())
    }

    /// One iteration of softmax warpgroup `g`'s program; `noop`: one outside the tile's range,
    /// which keeps every barrier's phase but copies no score, hands on factors of 1 and a
    /// zero `P`, and leaves the carried values as they are.
    fn write_softmax_iteration(
        &mut self,
        p: &Parts,
        role: &Role,
        b: &Body,
        c: &Cursor,
        r: &Regs,
        noop: bool,
    ) -> Result<(), CodegenError> {
        let o = overlap(self, p)?;
        for &op in &role.program.iteration {
            match op {
                Op::Wait { .. } => self.attn_wait(p, op, r.it, c, true)?,
                Op::TmemLoad { .. } | Op::Run(Region::Between) if noop => {}
                Op::TmemLoad { columns, .. } => {
                    let regs = self.tmem_load(r.s_at, columns);
                    self.vals.insert(b.scores, Val::Tile(regs));
                }
                Op::Run(Region::Between) => self.write_softmax_body(p, o, b)?,
                Op::FactorStore { .. } if noop => {
                    self.ins(format!("st.shared.f32 [{}], 0f3F800000", r.scale));
                }
                Op::FactorStore { .. } => {
                    let f = self.tile(b.factor, p.id)?;
                    let [f] = f[..] else {
                        return Err(self.internal(p.id, "a rescale factor not one per thread"));
                    };
                    self.ins(format!("st.shared.f32 [{}], {f}", r.scale));
                }
                Op::TmemStore { tile } if noop => {
                    let n = p.tmem.tiles.get(tile.0).map_or(0, |t| t.columns);
                    let zero = self.new_reg(Class::B32);
                    self.ins(format!("mov.b32 {zero}, 0"));
                    self.tmem_store(r.s_at, &vec![zero; n as usize / 2]);
                }
                Op::TmemStore { .. } => {
                    let dtype = self.k.ty(self.k.ops[o.tail].operands[0]).dtype();
                    let ty = if dtype == kiln_ir::DType::F16 {
                        "f16x2"
                    } else {
                        "bf16x2"
                    };
                    let pv = self.tile(b.p, p.id)?;
                    let packed: Vec<Reg> = pv
                        .chunks(2)
                        .map(|pair| {
                            let x = self.new_reg(Class::B32);
                            // Column j of P holds keys 2j (low half) and 2j + 1, as a K-major
                            // bf16 row sits in memory; that the PV mma's A operand reads TMEM
                            // in this order is UNVERIFIED on hardware (no Blackwell here). The
                            // first source lands in the upper half (ptx-notes §6).
                            self.ins(format!("cvt.rn.{ty}.f32 {x}, {}, {}", pair[1], pair[0]));
                            x
                        })
                        .collect();
                    self.tmem_store(r.s_at, &packed);
                }
                other => self.attn_common(p, other)?,
            }
        }
        Ok(())
    }

    /// After the tile's loop: the output from TMEM (the accumulator's initial value when no
    /// iteration ran), handed back, then the kernel's code after the loop.
    #[allow(clippy::too_many_arguments)]
    fn write_softmax_end(
        &mut self,
        p: &Parts,
        role: &Role,
        g: u32,
        c: &Cursor,
        it: Reg,
        [lo, hi]: [Reg; 2],
        lanes: Reg,
        carried: &[(usize, Val)],
    ) -> Result<(), CodegenError> {
        let o = overlap(self, p)?;
        let op = self.k.ops[p.id].clone();
        let o_col = p
            .column("O", g)
            .ok_or_else(|| self.internal(p.id, "a softmax without its O tile"))?;
        let o_at = self.new_reg(Class::B32);
        self.ins(format!("add.u32 {o_at}, {lanes}, {o_col}"));
        let (none, skip) = (self.new_reg(Class::Pred), self.new_label());
        self.ins(format!("setp.ge.s32 {none}, {lo}, {hi}"));
        let init = self.tile(op.operands[3 + o.carried], p.id)?;
        let out: Vec<Reg> = init.iter().map(|_| self.new_reg(Class::F32)).collect();
        for (o, i) in out.iter().zip(&init) {
            self.mov(*o, *i);
        }
        self.ins(format!("@{none} bra.uni {skip}"));
        for &step in &role.program.end {
            match step {
                Op::Wait { .. } => self.attn_wait(p, step, it, c, true)?,
                Op::TmemLoad {
                    column, columns, ..
                } => {
                    let regs = self.tmem_load_at(o_at, column, columns);
                    for (k, r) in regs.into_iter().enumerate() {
                        let at = out.get(column as usize + k).copied().ok_or_else(|| {
                            self.internal(p.id, "an output copy past the accumulator")
                        })?;
                        self.mov(at, r);
                    }
                }
                // A tile that ran no iteration has no product to wait for or copy.
                Op::TmemWaitLoad => {
                    self.attn_common(p, step)?;
                    self.label(&skip);
                }
                Op::Run(Region::Epilogue(None)) => {
                    self.vals
                        .insert(op.results[o.carried], Val::Tile(out.clone()));
                    for (i, v) in carried {
                        self.vals.insert(op.results[*i], v.clone());
                    }
                    for &x in &p.after {
                        match p.s.stores.get(g as usize) {
                            _ if self.k.ops[x].kind == OpKind::Yield => {}
                            Some(st) if st.store == x => self.write_tma_store(p.s, x, st)?,
                            _ => self.write_op(x)?,
                        }
                    }
                }
                other => self.attn_common(p, other)?,
            }
        }
        Ok(())
    }

    /// The code between the mmas, with the polynomial share of the scores' exponential and
    /// the deferred maximum.
    fn write_softmax_body(
        &mut self,
        p: &Parts,
        ov: &Overlap,
        b: &Body,
    ) -> Result<(), CodegenError> {
        for &o in &b.ops {
            if Some(o) == b.exp2 {
                self.write_exp2_share(p, o)?;
            } else {
                self.write_op(o)?;
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
        let m_new = self.k.ops[d.max].results[0];
        let new = self.tile(m_new, d.max)?;
        let old = self.tile(d.carried, d.max)?;
        let threshold = format!("0f{:08X}", Deferral::THRESHOLD.to_bits());
        let chosen: Vec<Reg> = new
            .iter()
            .zip(&old)
            .map(|(n, o)| {
                let (growth, near, r) = (
                    self.new_reg(Class::F32),
                    self.new_reg(Class::Pred),
                    self.new_reg(Class::F32),
                );
                self.ins(format!("sub.f32 {growth}, {n}, {o}"));
                self.ins(format!("setp.le.f32 {near}, {growth}, {threshold}"));
                self.ins(format!("selp.f32 {r}, {o}, {n}, {near}"));
                r
            })
            .collect();
        self.vals.insert(m_new, Val::Tile(chosen));
        Ok(())
    }

    /// The scores' `exp2`: columns of the polynomial share on the FMA pipes
    /// (`kiln_ir::tmem::exp2`), the others `ex2.approx.ftz`.
    fn write_exp2_share(&mut self, p: &Parts, id: OpId) -> Result<(), CodegenError> {
        let (x, r) = (self.k.ops[id].operands[0], self.k.ops[id].results[0]);
        let dist = self.dist(r, id)?;
        let [c1, c2, c3] = EXP2_POLY.map(|c| format!("0f{:08X}", c.to_bits()));
        let min = format!("0f{:08X}", EXP2_POLY_MIN.to_bits());
        let mut out = Vec::with_capacity(dist.regs.len());
        for offs in &dist.regs {
            let e = self.elem(x, offs, id)?;
            let d = self.new_reg(Class::F32);
            if !p.poly_column(offs[1]) {
                self.ins(format!("ex2.approx.ftz.f32 {d}, {e}"));
                out.push(d);
                continue;
            }
            // 2^x = 2^j 2^f, j = floor(x), f in [0, 1): the cubic for 2^f, j into the exponent.
            let [xc, j, f, q] = [(); 4].map(|_| self.new_reg(Class::F32));
            let [ji, qi] = [(); 2].map(|_| self.new_reg(Class::B32));
            let tiny = self.new_reg(Class::Pred);
            self.ins(format!("min.f32 {xc}, {e}, 0f42FE0000"));
            self.ins(format!("cvt.rmi.f32.f32 {j}, {xc}"));
            self.ins(format!("sub.f32 {f}, {xc}, {j}"));
            self.ins(format!("fma.rn.f32 {q}, {c3}, {f}, {c2}"));
            self.ins(format!("fma.rn.f32 {q}, {q}, {f}, {c1}"));
            self.ins(format!("fma.rn.f32 {q}, {q}, {f}, 0f3F800000"));
            self.ins(format!("cvt.rzi.s32.f32 {ji}, {j}"));
            self.ins(format!("shl.b32 {ji}, {ji}, 23"));
            self.ins(format!("mov.b32 {qi}, {q}"));
            self.ins(format!("add.s32 {ji}, {ji}, {qi}"));
            self.ins(format!("mov.b32 {d}, {ji}"));
            self.ins(format!("setp.lt.f32 {tiny}, {e}, {min}"));
            self.ins(format!("selp.f32 {d}, 0f00000000, {d}, {tiny}"));
            out.push(d);
        }
        self.vals.insert(r, Val::Tile(out));
        Ok(())
    }

    /// `tcgen05.ld.32x32b` of `n` columns at `at` (the thread's lane), 32 columns an
    /// instruction (one of 128 registers does not fit the register file's addressing at entry
    /// with its address): register `j` holds column `j`.
    pub(super) fn tmem_load(&mut self, at: Reg, n: u32) -> Vec<Reg> {
        (0..n.div_ceil(LOAD_COLUMNS))
            .flat_map(|q| {
                let c = q * LOAD_COLUMNS;
                self.tmem_load_at(at, c, LOAD_COLUMNS.min(n - c))
            })
            .collect()
    }

    /// [`Writer::tmem_load`] from column `column` on.
    pub(super) fn tmem_load_at(&mut self, at: Reg, column: u32, n: u32) -> Vec<Reg> {
        let regs: Vec<Reg> = (0..n).map(|_| self.new_reg(Class::F32)).collect();
        let a = self.new_reg(Class::B32);
        self.ins(format!("add.u32 {a}, {at}, {column}"));
        let list: Vec<String> = regs.iter().map(Reg::to_string).collect();
        self.ins(format!(
            "tcgen05.ld.sync.aligned.32x32b.x{n}.b32 {{{}}}, [{a}]",
            list.join(", ")
        ));
        regs
    }

    /// `tcgen05.st.32x32b` of `regs` at `at` (register `j` into column `j`), 32 columns an
    /// instruction.
    pub(super) fn tmem_store(&mut self, at: Reg, regs: &[Reg]) {
        for (q, chunk) in regs.chunks(LOAD_COLUMNS as usize).enumerate() {
            let a = self.new_reg(Class::B32);
            self.ins(format!("add.u32 {a}, {at}, {}", q as u32 * LOAD_COLUMNS));
            let list: Vec<String> = chunk.iter().map(Reg::to_string).collect();
            self.ins(format!(
                "tcgen05.st.sync.aligned.32x32b.x{}.b32 [{a}], {{{}}}",
                chunk.len(),
                list.join(", ")
            ));
        }
    }
}

/// The loop's structure the softmax runs (the `overlap` pass's), or an internal error.
fn overlap<'s>(w: &Writer<'_>, p: &Parts<'s>) -> Result<&'s Overlap, CodegenError> {
    p.s.overlap
        .as_ref()
        .ok_or_else(|| w.internal(p.id, "an attention schedule without its overlap"))
}
