//! Tensor memory (docs/ptx.md §7): the address the MMA warp published, the copies between TMEM
//! and registers (`tcgen05.ld` / `tcgen05.st`, shape `32x32b`, 32 columns an instruction),
//! and the ops the roles share: the hand-back of TMEM, the fences and waits, the owner's
//! `tcgen05.dealloc`.

use kiln_ir::sched::Op;
use kiln_ir::sched::tmem::LOAD_COLUMNS;

use super::{Sm100a, cta_group, shared_at};
use crate::error::CodegenError;
use crate::sched::{self, Cursor};
use crate::types::{Class, Reg};

impl Sm100a<'_, '_> {
    /// The TMEM base address (lane 0, column 0) the MMA warp published in the shared slot.
    pub(super) fn tmem_base(&mut self) -> Reg {
        let slot = shared_at(self.e, self.tmem.slot_offset);
        let base = self.e.new_reg(Class::B32);
        self.e.ins(format!("ld.shared.b32 {base}, [{slot}]"));
        base
    }

    /// An op of the MMA warp or the epilogue that is the same for both and needs no phase
    /// (`base`: the accumulator's TMEM address).
    pub(super) fn tmem_op(&mut self, op: Op, base: Reg) -> Result<(), CodegenError> {
        let s = self.v.s;
        match op {
            Op::Arrive { bar, .. } => {
                let a = self.v.bar_at(self.e, bar)?;
                let lane0 = sched::lane0(self.e);
                match s.cluster.as_ref().and_then(|c| c.pair) {
                    // The 2-SM form: both CTAs hand TMEM back to the leader's MMA thread.
                    Some(p) => {
                        let remote = self.e.new_reg(Class::B32);
                        self.e.ins(format!(
                            "mapa.shared::cluster.u32 {remote}, {a}, {}",
                            p.leader
                        ));
                        self.e.ins(format!(
                            "@{lane0} mbarrier.arrive.release.cluster.shared::cluster.b64 _, \
                             [{remote}]"
                        ));
                    }
                    None => self
                        .e
                        .ins(format!("@{lane0} mbarrier.arrive.shared::cta.b64 _, [{a}]")),
                }
            }
            Op::ClusterSync => sched::cluster_barrier(self.e),
            Op::Tcgen05FenceAfter | Op::Tcgen05FenceBefore => self.fence(op),
            Op::TmemWaitLoad => self.e.ins("tcgen05.wait::ld.sync.aligned"),
            Op::TmemWaitStore => self.e.ins("tcgen05.wait::st.sync.aligned"),
            Op::TmemDealloc { columns } => {
                let group = cta_group(s);
                self.e.ins(format!(
                    "tcgen05.dealloc.{group}.sync.aligned.b32 {base}, {columns}"
                ))
            }
            other => return Err(self.v.misplaced(self.e, other, "outside its role")),
        }
        Ok(())
    }

    /// A parity wait by every thread of warps whose `.sync.aligned` tcgen05 ops follow it:
    /// lanes may leave the wait loop apart, so the warp reconverges after it, but for a wait
    /// on the load ring (attention's softmax warps wait for Q). `it`: the role's iteration
    /// count, the phase of attention's own barriers (see [`super::attention`]).
    pub(super) fn warp_wait(
        &mut self,
        op: Op,
        it: Option<Reg>,
        c: &Cursor,
    ) -> Result<(), CodegenError> {
        self.v.wait(self.e, c, op, it, false)?;
        if !matches!(op, Op::Wait { bar, .. } if self.v.in_ring(bar)) {
            self.e.ins("bar.warp.sync -1");
        }
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

    /// `tcgen05.ld.32x32b` of `n` columns from column `column` on of the lane at `at`.
    pub(super) fn tmem_load_at(&mut self, at: Reg, column: u32, n: u32) -> Vec<Reg> {
        let e = &mut *self.e;
        let regs: Vec<Reg> = (0..n).map(|_| e.new_reg(Class::F32)).collect();
        let a = e.new_reg(Class::B32);
        e.ins(format!("add.u32 {a}, {at}, {column}"));
        let list: Vec<String> = regs.iter().map(Reg::to_string).collect();
        e.ins(format!(
            "tcgen05.ld.sync.aligned.32x32b.x{n}.b32 {{{}}}, [{a}]",
            list.join(", ")
        ));
        regs
    }

    /// `tcgen05.st.32x32b` of `regs` at `at` (register `j` into column `j`), 32 columns an
    /// instruction.
    pub(super) fn tmem_store(&mut self, at: Reg, regs: &[Reg]) {
        let e = &mut *self.e;
        for (q, chunk) in regs.chunks(LOAD_COLUMNS as usize).enumerate() {
            let a = e.new_reg(Class::B32);
            e.ins(format!("add.u32 {a}, {at}, {}", q as u32 * LOAD_COLUMNS));
            let list: Vec<String> = chunk.iter().map(Reg::to_string).collect();
            e.ins(format!(
                "tcgen05.st.sync.aligned.32x32b.x{}.b32 [{a}], {{{}}}",
                chunk.len(),
                list.join(", ")
            ));
        }
    }
}
