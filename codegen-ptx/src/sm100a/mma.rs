//! The MMA warp of the sm_100a schedules (docs/ptx.md §7): its elected lane 0 walks the work tiles
//! (attention's: pairs of them, [`super::attention`]) and issues its role's program as
//! `tcgen05.mma`s into TMEM, each stage or hand-over released by `tcgen05.commit` to its barrier.

use std::fmt::Display;

use kiln_ir::sched::tmem::{Descriptor, TmemMma};
use kiln_ir::sched::{MmaPart, Op, Program, Role, RoleKind};

use super::{Sm100a, cta_group};
use crate::error::CodegenError;
use crate::sched::{self, Cursor};
use crate::types::{Class, Reg};

/// Registers the MMA thread's ops read.
struct MmaRegs<'k> {
    /// The TMEM base address (lane 0, column 0).
    base: Reg,
    /// The mmas the thread issues, each with its instruction descriptor's register.
    mmas: Vec<(&'k TmemMma, Reg)>,
    /// Attention's count of the role's iterations (its own barriers' phase).
    it: Option<Reg>,
    /// In the loop: false in the tile's first iteration.
    accumulate: Option<Reg>,
}

impl<'k> Sm100a<'_, 'k> {
    /// The MMA warp, from its label on (see the module doc); it ends in `exit`.
    ///
    /// A commit arrives once every earlier tcgen05 op of the thread has completed. Lane 0
    /// alone knows how many tiles ran, so it runs the exit's waits, and the reconverged warp
    /// the rest of the exit (the dealloc is warp-wide). In the 2-SM form
    /// (`kiln_ir::sched::cluster::Pair`) only the leader CTA's thread issues, every tcgen05 op
    /// is `cta_group::2` (ptxas rejects a kernel that mixes the two), each commit multicasts its
    /// arrival to both CTAs, and the peer's warp only runs its own exit.
    ///
    /// A GEMM's stage is `K / 16` mmas; the shared-memory descriptors are the schedule's
    /// templates with the start address of each k16 step, so A (K-major) and B (K- or MN-major)
    /// are read where TMA wrote them. Attention issues `S_g = Q_g K^T` the same way and
    /// `O_g += P_g V` with A (`P_g`) read from TMEM. The first accumulating mma of a tile's loop
    /// overwrites its tile (enable-input-d false), every later one accumulates.
    ///
    /// The tcgen05.mmas of one thread execute in issue order (PTX ISA, tcgen05 memory
    /// consistency: they form one pipeline; FlashAttention-4 relies on the same), so attention's
    /// `S_g` of the next iteration, written over the `P_g` the previous `O_g += P_g V` reads, is
    /// issued after it and needs no wait of its own. (Not checked on hardware: no Blackwell
    /// here.)
    pub(super) fn mma_warp(&mut self, mma: &Role) -> Result<(), CodegenError> {
        let s = self.v.s;
        let attention = s.role(RoleKind::Softmax(0)).is_some();
        self.e
            .comment("mma warp: one thread issues the tcgen05.mmas; the warp owns TMEM");
        let base = self.tmem_base();
        let other = self.e.setp("ne.u32", self.e.tid, 32 * mma.first_warp);
        // The 2-SM form: the peer's MMA warp issues nothing; it only frees its columns.
        let leader = s.cluster.as_ref().and_then(|c| c.pair).map(|p| p.leader);
        let peer_role = s
            .roles
            .iter()
            .find(|r| r.kind == RoleKind::Mma && r.rank.is_some_and(|rank| Some(rank) != leader));
        let peer = match (leader, peer_role) {
            (Some(leader), Some(role)) => {
                let rank = sched::cluster_rank(self.e);
                let peer = self.e.setp("ne.u32", rank, leader);
                self.e.ins(format!("or.pred {other}, {other}, {peer}"));
                Some((peer, role))
            }
            _ => None,
        };
        let join = self.e.new_label();
        self.e.ins(format!("@{other} bra {join}"));
        let mut r = MmaRegs {
            base,
            mmas: Vec::new(),
            it: None,
            accumulate: None,
        };
        // Attention's descriptors and iteration count are set once, a GEMM's descriptor per
        // tile, before its loop.
        if attention {
            self.set_idesc(&mut r, MmaPart::Head)?;
            self.set_idesc(&mut r, MmaPart::Tail)?;
            let it = self.e.new_reg(Class::B32);
            self.e.ins(format!("mov.u32 {it}, 0"));
            r.it = Some(it);
        }
        let p = &mma.program;
        let mut c = self.v.cursor(self.e, &p.iteration);
        let (walk, bounds) = if attention {
            let pair = self.open_pair(&mut c)?;
            let bounds = self.pair_bounds(&pair)?;
            (Some(pair.walk), bounds)
        } else {
            let walk = self
                .v
                .open_tile(self.e, &mut self.ops, &mut c, &self.before, true)?;
            (walk, self.v.loop_bounds(self.e)?)
        };
        for &op in &p.tile {
            self.mma_op(&c, &r, op)?;
        }
        if !p.iteration.is_empty() {
            if !attention {
                self.set_idesc(&mut r, MmaPart::Body)?;
            }
            self.mma_loop(p, &c, &mut r, bounds)?;
        }
        for &op in p.drain.iter().chain(&p.release).chain(&p.end) {
            self.mma_op(&c, &r, op)?;
        }
        self.v.close_tile(self.e, &mut self.ops, walk.as_ref(), &c);
        let waits = p
            .exit
            .iter()
            .take_while(|op| matches!(op, Op::Wait { .. }))
            .count();
        for &op in &p.exit[..waits] {
            self.v.wait(self.e, &c, op, r.it, true)?;
        }
        self.e.label(&join);
        self.e.ins("bar.warp.sync -1");
        // The peer's warp runs its own exit, the leader's its role's.
        let peer_exit = match peer {
            Some((p, role)) => {
                let (own, done) = (self.e.new_label(), self.e.new_label());
                self.e.ins(format!("@{p} bra {own}"));
                Some((own, done, role))
            }
            None => None,
        };
        for &op in &p.exit[waits..] {
            self.tmem_op(op, base)?;
        }
        if let Some((own, done, role)) = peer_exit {
            self.e.ins(format!("bra.uni {done}"));
            self.e.label(&own);
            for &op in &role.program.exit {
                self.tmem_op(op, base)?;
            }
            self.e.label(&done);
        }
        self.e.ins("exit");
        Ok(())
    }

    /// The iteration program over the tile's loop iterations; the cursor `c` goes on from
    /// tile to tile.
    fn mma_loop(
        &mut self,
        p: &Program,
        c: &Cursor,
        r: &mut MmaRegs<'k>,
        [lo, hi, step]: [Reg; 3],
    ) -> Result<(), CodegenError> {
        let iv = self.e.new_reg(Class::B32);
        self.e.mov(iv, lo);
        let counted = self.e.open_counted_loop(iv, hi, step);
        r.accumulate = Some(self.e.setp("ne.s32", iv, lo));
        for &op in &p.iteration {
            self.mma_op(c, r, op)?;
        }
        self.v.advance(self.e, c);
        if let Some(it) = r.it {
            self.e.ins(format!("add.u32 {it}, {it}, 1"));
        }
        self.e.close_counted_loop(&counted);
        Ok(())
    }

    /// One op of the MMA thread.
    fn mma_op(&mut self, c: &Cursor, r: &MmaRegs<'k>, op: Op) -> Result<(), CodegenError> {
        match op {
            Op::Wait { .. } => self.v.wait(self.e, c, op, r.it, false)?,
            // The pipeline pass releases the stage just read (lag 0): the commit's arrival
            // already waits for the mmas reading it.
            Op::Tcgen05Commit { bar, lag: 0 } => {
                let a = self.v.bar_addr(self.e, bar, c.stage)?;
                self.commit(a);
            }
            Op::Tcgen05Mma {
                part: MmaPart::Body,
                ..
            } => self.ring_mma(c, r)?,
            Op::Tcgen05Mma {
                part: MmaPart::Head,
                tile,
            } => self.s_mma(c, r, tile)?,
            Op::Tcgen05Mma {
                part: MmaPart::Tail,
                tile,
            } => self.o_mma(c, r, tile)?,
            other => self.tmem_op(other, r.base)?,
        }
        Ok(())
    }

    /// Sets mma `part`'s instruction descriptor in a register of `r`.
    fn set_idesc(&mut self, r: &mut MmaRegs<'k>, part: MmaPart) -> Result<(), CodegenError> {
        let id = self.v.for_op();
        let Some(mma) = self.tmem.mma(part) else {
            return Err(self
                .e
                .internal(id, format!("a schedule without its {part:?} mma")));
        };
        let d = self.e.new_reg(Class::B32);
        self.e.ins(format!("mov.u32 {d}, 0x{:08X}", mma.idesc));
        r.mmas.push((mma, d));
        Ok(())
    }

    /// The operands of mma `part` and the register of its instruction descriptor.
    fn operands(&self, r: &MmaRegs<'k>, part: MmaPart) -> Result<(&'k TmemMma, Reg), CodegenError> {
        let found = r.mmas.iter().find(|(m, _)| m.part == part).copied();
        found.ok_or_else(|| {
            let what = format!("a {part:?} mma before its descriptor");
            self.e.internal(self.v.for_op(), what)
        })
    }

    /// A GEMM's stage: K / 16 `tcgen05.mma`s into the accumulator, A and B from their stage's
    /// descriptors.
    fn ring_mma(&mut self, c: &Cursor, r: &MmaRegs<'k>) -> Result<(), CodegenError> {
        let (s, id) = (self.v.s, self.v.for_op());
        let (mma, idesc) = self.operands(r, MmaPart::Body)?;
        let loads: Vec<_> = s.ring_loads().map(|(_, l)| &l.tma).collect();
        let ([a, b], Some(da_t), Some(accumulate)) = (&loads[..], &mma.a, r.accumulate) else {
            return Err(self.e.internal(
                id,
                "a tcgen05 ring without its two loads, or outside its loop",
            ));
        };
        let e = &mut *self.e;
        // The stage's data landed (the `full` wait): order the mmas after it.
        e.ins("tcgen05.fence::after_thread_sync");
        let bases = [a, b].map(|l| sched::stage_address(e, c.stage, l.stage_stride, l.offset));
        self.mma_steps(r.base, bases, [da_t, &mma.b], idesc, accumulate);
        Ok(())
    }

    /// Attention's `S_g = Q_g K^T`: Q tile `g` from its once load, K from the stage, into
    /// the `S` tile of `g`, overwriting it.
    fn s_mma(&mut self, c: &Cursor, r: &MmaRegs<'k>, g: u32) -> Result<(), CodegenError> {
        let s = self.v.s;
        let (mma, idesc) = self.operands(r, MmaPart::Head)?;
        let q = s
            .loads
            .iter()
            .find(|(h, l)| s.once(*h) && l.work_tile == g)
            .map(|(_, l)| l.tma.offset);
        let col = self.column("S", g)?;
        let (Some(q), Some(qd), Some((_, k))) = (q, &mma.a, s.ring_loads().next()) else {
            return Err(self
                .e
                .internal(self.v.for_op(), "an S mma without its operands"));
        };
        let e = &mut *self.e;
        let qa = e.new_reg(Class::B32);
        e.ins(format!("add.u32 {qa}, {}, {q}", e.smem));
        let ka = sched::stage_address(e, c.stage, k.tma.stage_stride, k.tma.offset);
        let d = e.new_reg(Class::B32);
        e.ins(format!("add.u32 {d}, {}, {col}", r.base));
        self.mma_steps(d, [qa, ka], [qd, &mma.b], idesc, 0);
        Ok(())
    }

    /// Attention's `O_g += P_g V`: `P_g` from TMEM (over `S_g`), V from the stage.
    fn o_mma(&mut self, c: &Cursor, r: &MmaRegs<'k>, g: u32) -> Result<(), CodegenError> {
        let group = cta_group(self.v.s);
        let (mma, idesc) = self.operands(r, MmaPart::Tail)?;
        let (o, sc) = (self.column("O", g)?, self.column("S", g)?);
        let (Some((_, v)), Some(accumulate)) = (self.v.s.ring_loads().nth(1), r.accumulate) else {
            return Err(self
                .e
                .internal(self.v.for_op(), "an O mma without its operands"));
        };
        let e = &mut *self.e;
        let va = sched::stage_address(e, c.stage, v.tma.stage_stride, v.tma.offset);
        let d = e.new_reg(Class::B32);
        e.ins(format!("add.u32 {d}, {}, {o}", r.base));
        for (step, &sv) in mma.b.steps.iter().enumerate() {
            // P's k16 step `step`: 16 bf16 of a row, two a 32-bit column (the lower key in
            // the low half; see the softmax's store).
            let (a, b) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
            e.ins(format!("add.u32 {a}, {}, {}", r.base, sc + 8 * step as u32));
            e.ins(format!("add.u32 {b}, {va}, {sv}"));
            let db = sched::descriptor(e, b, mma.b.template);
            let enable = if step == 0 {
                accumulate.to_string()
            } else {
                "1".to_string()
            };
            e.ins(format!(
                "tcgen05.mma.{group}.kind::f16 [{d}], [{a}], {db}, {idesc}, {enable}"
            ));
        }
        Ok(())
    }
    /// One `tcgen05.mma` per k16 step into the TMEM tile at `d`, A and B read from shared
    /// memory at `bases` through descriptors `descs`; the first step accumulates where
    /// `accumulate` holds (a predicate, or `0`), every later one does.
    fn mma_steps(
        &mut self,
        d: Reg,
        bases: [Reg; 2],
        [da_t, db_t]: [&Descriptor; 2],
        idesc: Reg,
        accumulate: impl Display,
    ) {
        let group = cta_group(self.v.s);
        let e = &mut *self.e;
        for (k, (&sa, &sb)) in da_t.steps.iter().zip(&db_t.steps).enumerate() {
            let [at_a, at_b] = e.new_regs(Class::B32);
            e.ins(format!("add.u32 {at_a}, {}, {sa}", bases[0]));
            e.ins(format!("add.u32 {at_b}, {}, {sb}", bases[1]));
            let da = sched::descriptor(e, at_a, da_t.template);
            let db = sched::descriptor(e, at_b, db_t.template);
            let enable = if k == 0 {
                accumulate.to_string()
            } else {
                "1".to_string()
            };
            e.ins(format!(
                "tcgen05.mma.{group}.kind::f16 [{d}], {da}, {db}, {idesc}, {enable}"
            ));
        }
    }

    /// `tcgen05.commit`: one arrival on the mbarrier at `bar` once every earlier tcgen05 op of
    /// this thread has completed; in the 2-SM form on the barrier at the same offset of every
    /// CTA its commit mask names.
    fn commit(&mut self, bar: Reg) {
        let s = self.v.s;
        let e = &mut *self.e;
        let group = cta_group(s);
        match s
            .cluster
            .as_ref()
            .and_then(|c| c.pair)
            .map(|p| p.commit_mask)
        {
            Some(m) => {
                let r = e.new_reg(Class::B16);
                e.ins(format!("mov.b16 {r}, {m}"));
                e.ins(format!(
                    "tcgen05.commit.{group}.mbarrier::arrive::one.shared::cluster.multicast::\
                     cluster.b64 [{bar}], {r}"
                ));
            }
            None => e.ins(format!(
                "tcgen05.commit.{group}.mbarrier::arrive::one.shared::cluster.b64 [{bar}]"
            )),
        }
    }
}
