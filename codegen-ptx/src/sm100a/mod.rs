//! sm_100a: a stage ring of the `pipeline` pass as a Blackwell warp-specialised loop, with
//! the accumulator in tensor memory ([`kiln_ir::tmem`], which gives every step).
//!
//! The block is the kernel's epilogue warps (threads `0..32 * epilogue_warps`), a TMA
//! producer warp and an MMA warp. Before the roles split, the MMA warp allocates the
//! accumulator's TMEM columns ([`tmem`]) under the ring's set-up barrier. At the ring's `for`,
//! the producer's elected thread runs the ring's producer program exactly as on sm_90a (TMA
//! and mbarriers are the same on Blackwell) and exits; the MMA warp's elected thread runs the
//! consumer program, its mmas as `tcgen05.mma` from shared-memory descriptors, each stage
//! released by `tcgen05.commit` ([`tcgen05`]), then commits the accumulator to `acc_full`;
//! the whole warp then waits for the epilogue's `acc_empty`, frees the columns and exits. The
//! epilogue warps copy the accumulator to registers, the `for`'s result, and go on with the
//! kernel's code after the loop (its store goes through the TMA-store epilogue).

mod tcgen05;
mod tmem;

use kiln_ir::OpId;
use kiln_ir::tmem::TmemPlan;

use crate::CodegenError;
use crate::types::Class;
use crate::writer::Writer;

impl Writer<'_> {
    /// The kernel's TMEM plan (the `tmem` pass sets it with the ring).
    fn tmem_plan(&self, at: OpId) -> Result<TmemPlan, CodegenError> {
        self.k
            .schedule
            .tmem
            .clone()
            .ok_or_else(|| self.internal(at, "an sm_100a ring without its TMEM plan"))
    }

    /// Writes a ring's `for` on sm_100a: the three roles (see the module doc).
    pub(crate) fn write_tcgen05_ring_loop(&mut self, id: OpId) -> Result<(), CodegenError> {
        let ring = self.k.schedule.rings[&id].clone();
        let plan = self.tmem_plan(id)?;
        let bounds = self.loop_bounds(id)?;
        let roles = plan.roles;
        let [is_epilogue, is_mma, idle] = [(); 3].map(|_| self.new_reg(Class::Pred));
        let (epilogue, mma) = (self.new_label(), self.new_label());
        self.ins(format!(
            "setp.lt.u32 {is_epilogue}, {}, {}",
            self.tid,
            32 * roles.epilogue_warps
        ));
        self.ins(format!("@{is_epilogue} bra {epilogue}"));
        self.ins(format!(
            "setp.ge.u32 {is_mma}, {}, {}",
            self.tid,
            32 * roles.mma_warp
        ));
        self.ins(format!("@{is_mma} bra {mma}"));
        self.comment("producer warp: one thread issues every stage's TMA");
        self.ins(format!(
            "setp.ne.u32 {idle}, {}, {}",
            self.tid,
            32 * roles.producer_warp
        ));
        self.ins(format!("@{idle} exit"));
        let c = self.cursor(&ring.producer);
        self.write_producer(id, &ring, &c, bounds)?;
        self.ins("exit");
        self.label(&mma);
        self.comment("mma warp: one thread issues the tcgen05.mmas; the warp owns TMEM");
        self.write_mma_warp(id, &ring, &plan, bounds)?;
        self.ins("exit");
        self.label(&epilogue);
        self.comment("epilogue warps: the accumulator from TMEM, then the kernel's code");
        self.write_tmem_epilogue(id, &plan, bounds)
    }
}
