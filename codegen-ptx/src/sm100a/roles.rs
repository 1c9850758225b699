//! The sm_100a GEMM's walk over its roles' programs: the split, the producer (the shared
//! producer walk), the MMA warp (its per-tile program around its iteration program, then
//! its exit) and the epilogue warps (the accumulator out of TMEM, then the code after the
//! loop, whole or chunk by chunk).

use std::ops::Range;

use kiln_ir::sched::{Op, Region, Role, RoleKind};

use super::Sm100a;
use crate::emit::Val;
use crate::error::CodegenError;
use crate::sched;
use crate::types::{Class, Reg};

impl Sm100a<'_, '_> {
    /// The three roles (see the module doc).
    pub(super) fn roles(&mut self) -> Result<(), CodegenError> {
        let epilogue = self.v.role(self.e, RoleKind::Epilogue)?;
        let producer = self.v.role(self.e, RoleKind::Producer)?;
        let mma = self.v.role(self.e, RoleKind::Mma)?;
        let e = &mut *self.e;
        let epilogue_label = e.branch_if("lt.u32", e.tid, 32 * epilogue.end_warp());
        let mma_label = e.branch_if("ge.u32", e.tid, 32 * mma.first_warp);
        e.comment("producer warp: one thread issues every stage's TMA");
        sched::elect(e, producer);
        let mut c = self.v.cursor(self.e, &producer.program.iteration);
        let walk = self
            .v
            .open_tile(self.e, &mut self.ops, &mut c, &self.before, true)?;
        let bounds = self.v.loop_bounds(self.e)?;
        self.v
            .producer(self.e, &mut self.ops, producer, &c, bounds)?;
        self.v.close_tile(self.e, &mut self.ops, walk.as_ref(), &c);
        self.e.ins("exit");
        self.e.label(&mma_label);
        self.mma_warp(mma)?;
        self.e.label(&epilogue_label);
        self.e
            .comment("epilogue warps: the accumulator from TMEM, then the kernel's code");
        self.epilogue(epilogue)
    }

    /// The epilogue warps, per work tile: warp `w` copies TMEM lanes `32 (w % 4) ..` (its
    /// threads' rows) of its warpgroup's column block (columns `(w / 4) b ..`, `b` the
    /// accumulator's columns over the warpgroups) load by load, column `j` of the block into
    /// the `j`-th register, and at each [`Region::Epilogue`] runs the code after the loop on
    /// the columns it names ([`Sm100a::read_chunk`]). A loop that ran no iteration yields its
    /// initial value instead (no mma wrote the accumulator).
    fn epilogue(&mut self, epilogue: &Role) -> Result<(), CodegenError> {
        let id = self.v.for_op();
        let acc = self.tmem.tiles.first().copied().ok_or_else(|| {
            self.e
                .internal(id, "an sm_100a schedule without its accumulator")
        })?;
        let groups = epilogue.warps / 4;
        let block_columns = acc.columns / groups.max(1);
        let base = self.tmem_base();
        let e = &mut *self.e;
        let (warp, lanes) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
        // TMEM address = (lane << 16) | column; warp w reaches lanes 32 (w % 4) .. + 31.
        e.ins(format!("shr.u32 {warp}, {}, 5", e.tid));
        e.ins(format!("and.b32 {lanes}, {warp}, 3"));
        e.ins(format!("shl.b32 {lanes}, {lanes}, 21"));
        e.ins(format!("add.u32 {lanes}, {lanes}, {base}"));
        if groups > 1 {
            let group = e.new_reg(Class::B32);
            e.ins(format!("shr.u32 {group}, {warp}, 2"));
            e.ins(format!(
                "mad.lo.u32 {lanes}, {group}, {block_columns}, {lanes}"
            ));
        }
        let mut c = self.v.cursor(self.e, &[]);
        let walk = self
            .v
            .open_tile(self.e, &mut self.ops, &mut c, &self.before, false)?;
        let [lo, hi, _] = self.v.loop_bounds(self.e)?;
        let mut regs: Vec<Reg> = Vec::new();
        let mut first = true;
        for &op in &epilogue.program.end {
            match op {
                Op::TmemLoad {
                    column, columns, ..
                } => {
                    if column as usize != regs.len() {
                        return Err(self.e.internal(id, "TMEM loads out of column order"));
                    }
                    regs.extend(self.tmem_load_at(lanes, acc.column + column, columns));
                }
                Op::Run(Region::Epilogue(Some((column, columns)))) => {
                    if columns < block_columns {
                        self.e.comment(&format!(
                            "the code after the loop on block columns {column}..{}",
                            column + columns
                        ));
                    }
                    self.read_chunk(&regs, column..column + columns, [lo, hi], first)?;
                    first = false;
                }
                Op::Wait { .. } => self.warp_wait(op, None, &c)?,
                other => self.tmem_op(other, base)?,
            }
        }
        self.v.close_tile(self.e, &mut self.ops, walk.as_ref(), &c);
        for &op in &epilogue.program.exit {
            match op {
                Op::BulkWaitAll | Op::ClusterSync => self.ops.exit(self.e, op)?,
                other => self.tmem_op(other, base)?,
            }
        }
        Ok(())
    }

    /// Runs the code after the loop on block columns `columns` of the copied registers
    /// `regs`: the ring `for`'s result is that chunk of them (of its initial value where the
    /// loop ran no iteration, `[lo, hi]` its bounds), and every tile whose layout holds the
    /// accumulator's columns has only the chunk's registers meanwhile
    /// ([`crate::emit::Lower::columns`]). The ops that compute only scalars are written
    /// with the `first` chunk alone; the later ones reuse their registers.
    fn read_chunk(
        &mut self,
        regs: &[Reg],
        columns: Range<u32>,
        [lo, hi]: [Reg; 2],
        first: bool,
    ) -> Result<(), CodegenError> {
        let (k, id) = (self.v.k, self.v.for_op());
        let op = &k.ops[id];
        let e = &mut *self.e;
        let (&[init], &[result]) = (&op.operands[3..], &op.results[..]) else {
            return Err(e.internal(id, "a tcgen05 ring loop carrying more than its accumulator"));
        };
        let init = e.tile(init, id)?;
        let range = columns.start as usize..columns.end as usize;
        let (Some(init), Some(regs)) = (init.get(range.clone()), regs.get(range)) else {
            return Err(e.internal(id, "a read of accumulator columns not copied"));
        };
        let skip = e.branch_if("lt.s32", lo, hi);
        for (&r, &i) in regs.iter().zip(init) {
            e.mov(r, i);
        }
        e.label(&skip);
        e.vals.insert(result, Val::Tile(regs.to_vec()));
        self.ops
            .write_after(self.e, k, &self.after, Some(columns), first)
    }
}
