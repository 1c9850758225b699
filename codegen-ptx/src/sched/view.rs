//! A kernel's schedule as the writers read it, and the tensor maps it needs.

use std::collections::BTreeSet;

use kiln_ir::sched::op::Named;
use kiln_ir::sched::{BarrierId, BarrierKind, LoadId, Mbarrier, Op, Phase, Role, RoleKind, Sched};
use kiln_ir::{Kernel, OpId};

use crate::emit::Emitter;
use crate::error::CodegenError;
use crate::output::TensorMapSpec;
use crate::types::Reg;

/// The tensor maps the runtime builds for kernel `k`, one per tensor parameter TMA loads,
/// stores or reduces into (its schedule's loads and stores, its boxed bulk adds), in
/// parameter order.
pub(crate) fn tensor_maps(k: &Kernel) -> Vec<TensorMapSpec> {
    let sched = k.schedule.sched.iter();
    let loads = sched
        .clone()
        .flat_map(|s| s.loads.iter())
        .map(|(_, l)| TensorMapSpec {
            param: l.tma.param,
            box_dims: l.tma.map_box(),
            swizzle_bytes: l.tma.swizzle,
        });
    let stores = sched.flat_map(|s| s.stores.iter()).map(|st| TensorMapSpec {
        param: st.param,
        box_dims: st.map_box(),
        swizzle_bytes: st.swizzle,
    });
    let adds = k
        .schedule
        .bulk_adds
        .iter()
        .flat_map(|b| b.boxes.values())
        .map(|b| TensorMapSpec {
            param: b.param,
            box_dims: b.map_box(),
            swizzle_bytes: 128,
        });
    let mut maps: Vec<TensorMapSpec> = loads.chain(stores).chain(adds).collect();
    maps.sort_by_key(|m| m.param);
    maps.dedup();
    maps
}

/// A kernel's schedule as the writers read it.
pub(crate) struct View<'k> {
    /// The kernel.
    pub(crate) k: &'k Kernel,
    /// Its schedule.
    pub(crate) s: &'k Sched,
    /// The load ring's barriers: those the producer's program names (its stage arrays, the
    /// once tiles' barriers). The others hand tensor memory or registers between roles.
    ring: BTreeSet<BarrierId>,
}

impl<'k> View<'k> {
    /// The view of `k`'s schedule `s`.
    pub(crate) fn new(k: &'k Kernel, s: &'k Sched) -> View<'k> {
        let ring = s
            .role(RoleKind::Producer)
            .into_iter()
            .flat_map(|r| r.program.ops())
            .filter_map(Op::barrier)
            .collect();
        View { k, s, ring }
    }

    /// The ring loop.
    pub(crate) fn for_op(&self) -> OpId {
        self.s.for_op
    }

    /// Whether `bar` is one of the load ring's barriers.
    pub(crate) fn in_ring(&self, bar: BarrierId) -> bool {
        self.ring.contains(&bar)
    }

    /// Whether `bar` is a stage array of the ring: a per-iteration barrier of the load ring,
    /// whose stage `i % stages` iteration `i` uses.
    pub(crate) fn staged(&self, bar: BarrierId) -> bool {
        self.s
            .mbarrier(bar)
            .is_some_and(|m| m.phase == Phase::Iteration)
            && self.in_ring(bar)
    }

    /// The mbarrier `bar`.
    pub(crate) fn mbarrier(
        &self,
        e: &Emitter<'_>,
        bar: BarrierId,
    ) -> Result<Mbarrier, CodegenError> {
        self.s.mbarrier(bar).copied().ok_or_else(|| {
            e.internal(
                self.for_op(),
                format!("`{}` is not an mbarrier", self.s.barriers[bar]),
            )
        })
    }

    /// The named barrier array `bar`: its first id, its ids and the threads meeting at each.
    pub(crate) fn named_barrier(
        &self,
        e: &Emitter<'_>,
        bar: BarrierId,
    ) -> Result<(u32, u32, u32), CodegenError> {
        match self.s.barriers[bar].kind {
            BarrierKind::Named {
                first,
                ids,
                threads,
            } => Ok((first, ids, threads)),
            BarrierKind::Mbarrier(_) => Err(e.internal(
                self.for_op(),
                format!("`{}` is not a named barrier", self.s.barriers[bar]),
            )),
        }
    }

    /// The role of `kind`.
    pub(crate) fn role(&self, e: &Emitter<'_>, kind: RoleKind) -> Result<&'k Role, CodegenError> {
        self.s
            .role(kind)
            .ok_or_else(|| e.internal(self.for_op(), format!("a schedule without its {kind} role")))
    }

    /// The position of load `load` among the ring's loads, if it is one.
    pub(crate) fn ring_index(&self, load: LoadId) -> Option<usize> {
        self.s.ring_loads().position(|(h, _)| h == load)
    }

    /// `op` as the schedule IR prints it, for messages.
    pub(crate) fn named(&self, op: Op) -> String {
        Named { op, sched: self.s }.to_string()
    }

    /// An internal error: `op` has no place where it stands (`what`).
    pub(crate) fn misplaced(&self, e: &Emitter<'_>, op: Op, what: &str) -> CodegenError {
        e.internal(self.for_op(), format!("`{}` {what}", self.named(op)))
    }

    /// The top-level ops before the ring loop and after it.
    pub(crate) fn parts(&self, e: &Emitter<'_>) -> Result<(Vec<OpId>, Vec<OpId>), CodegenError> {
        let (body, id) = (&self.k.body, self.for_op());
        let at = body
            .ops
            .iter()
            .position(|&op| op == id)
            .ok_or_else(|| e.internal(id, "the ring loop is nested"))?;
        Ok((body.ops[..at].to_vec(), body.ops[at + 1..].to_vec()))
    }

    /// The ring loop's lower bound, upper bound and step.
    pub(crate) fn loop_bounds(&self, e: &mut Emitter<'_>) -> Result<[Reg; 3], CodegenError> {
        let id = self.for_op();
        let op = &self.k.ops[id];
        Ok([
            e.scalar(op.operands[0], id)?,
            e.scalar(op.operands[1], id)?,
            e.scalar(op.operands[2], id)?,
        ])
    }
}
