//! sm_90a: wgmma groups still in flight while the rest of a ring's body is written. A body
//! with several mmas (attention's backward: scores, dP, dV, dQ, dK) commits each one's group
//! where it is issued and waits for it only where something needs it: an op reading its
//! result, its accumulator or its registers' A operand (PTX leaves any access to those
//! undefined until the group completes), an op that may write shared memory or synchronise
//! in ways this module does not reason about, a staged operand written over the bytes an
//! in-flight wgmma reads as its staged operand, and the end of the body. In between, the
//! tensor cores run beside the softmax arithmetic, the shared-memory staging and the other
//! mmas' issue.
//!
//! Groups complete in commit order, so waiting for one group is `wgmma.wait_group n` with
//! `n` the groups committed after it. The tracking is static: before an `if` whose branches
//! would wait (a read of an in-flight result, an op not known harmless), the PTX waits
//! ahead of the branch, so that both paths leave the same groups in flight.

use kiln_ir::{OpId, OpKind, ValueId};

use super::Emitter;

/// One committed wgmma group: the values whose registers it writes, or reads as its
/// accumulator or A operand, and the bytes of shared memory it reads as a tile the consumers
/// staged (`start..end`), if it does.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    pub(crate) values: Vec<ValueId>,
    pub(crate) staged: Vec<std::ops::Range<u32>>,
}

impl Emitter<'_> {
    /// After a wgmma group is committed: it is in flight until waited for.
    pub(crate) fn wgmma_in_flight(&mut self, group: InFlight) {
        self.in_flight.push(group);
    }

    /// Waits for every group in flight.
    pub(crate) fn wgmma_drain(&mut self) {
        if !self.in_flight.is_empty() {
            self.ins("wgmma.wait_group.sync.aligned 0");
            self.in_flight.clear();
        }
    }

    /// Before a staged operand is written over bytes `at`: waits for the newest group in
    /// flight that reads a staged operand overlapping them (and, as groups complete in
    /// order, the ones before it); groups reading other bytes stay in flight.
    pub(crate) fn wgmma_before_staging(&mut self, at: std::ops::Range<u32>) {
        let newest = self.in_flight.iter().rposition(|g| {
            g.staged
                .iter()
                .any(|r| r.start < at.end && at.start < r.end)
        });
        self.wgmma_wait_through(newest);
    }

    /// Before op `id` is written: waits for the groups it needs complete (module doc).
    pub(crate) fn wgmma_before(&mut self, id: OpId) {
        if self.in_flight.is_empty() {
            return;
        }
        if !self.harmless_in_flight(id) {
            self.wgmma_drain();
            return;
        }
        let mut read = Vec::new();
        self.operands_within(id, &mut read);
        let newest = self
            .in_flight
            .iter()
            .rposition(|g| g.values.iter().any(|v| read.contains(v)));
        self.wgmma_wait_through(newest);
    }

    /// Waits for in-flight group `i` (and the groups before it), if any.
    fn wgmma_wait_through(&mut self, i: Option<usize>) {
        if let Some(i) = i {
            let after = self.in_flight.len() - 1 - i;
            self.ins(format!("wgmma.wait_group.sync.aligned {after}"));
            self.in_flight.drain(..=i);
        }
    }

    /// The values op `id` and the ops of its regions read.
    fn operands_within(&self, id: OpId, out: &mut Vec<ValueId>) {
        let op = &self.k.ops[id];
        out.extend(op.operands.iter().copied());
        for region in &op.regions {
            for &o in &region.ops {
                self.operands_within(o, out);
            }
        }
    }

    /// Whether op `id` (with its regions) may be written while wgmma groups are in flight:
    /// it only computes in registers, reads global memory, binds a ring stage, adds
    /// atomically to global memory (bulk adds stage in their own region, which no mma
    /// reads), or is another ring mma.
    fn harmless_in_flight(&self, id: OpId) -> bool {
        let op = &self.k.ops[id];
        let pure = match &op.kind {
            k if k.is_scalar_source() || k.is_elementwise() => true,
            OpKind::Mma | OpKind::Atomic { .. } | OpKind::Yield | OpKind::If => true,
            OpKind::Reshape { .. } => kiln_ir::passes::lower::reshape_is_free(self.k, op),
            OpKind::Transpose => !kiln_ir::passes::lower::transpose_moves(self.k, op),
            OpKind::Load { .. } => {
                self.k.schedule.buffer(id).is_none() || self.pipelined_stage(id).is_some()
            }
            _ => false,
        };
        pure && op
            .regions
            .iter()
            .all(|r| r.ops.iter().all(|&o| self.harmless_in_flight(o)))
    }
}
