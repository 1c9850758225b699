//! sm_90a: which of the named barriers the consumer warpgroups meet at around their
//! shared-memory staging in a ring body another barrier of the same body already implies.
//!
//! Two kinds of op stage a register tile there in a consumers' ring body: an mma whose A the
//! consumers write into its buffer ([`StagedOperand`](crate::schedule::StagedOperand)) and a
//! bulk add's tile ([`BulkAdds`](crate::schedule::BulkAdds)).
//! Each is written between two barriers: the first orders the write after every thread's
//! reads of the previous contents (write after read), the second orders the reads of the new
//! contents after every thread's write and is always kept. The first is implied where the
//! consumers already meet at another op's second barrier between the point where the
//! previous contents' readers have finished and the write, going round the loop:
//! - a staged operand's readers are the wgmmas reading its buffer, which have finished in
//!   every thread at the latest where the body first reads their result (the PTX writer waits
//!   there for their group) or at the body's end (where it drains every group);
//! - a bulk add's tile is read by the copy engine until the issuing thread waits for it
//!   (`cp.async.bulk.wait_group.read`); that wait moves to the nearest staged mma before the
//!   add, ahead of its second barrier, which then orders the add's write after the reads.
//!
//! Attention backward's keys-major body (dS staged for dQ's wgmma, dQ added in boxes) meets
//! twice an iteration instead of four times. Only the body's top-level ops count: the
//! consumers run each of them every iteration, where an op inside an `if` may not run.

use std::collections::BTreeMap;

use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::sched::RoleKind;
use crate::schedule::ImpliedBarriers;
use crate::target::Target;

use super::pipeline::overlaps;
use super::walk::{ops_in_block, ops_in_order};

/// Records the implied barriers in [`crate::schedule::Schedule::implied_barriers`]; nothing
/// outside an unrotated consumers' ring body on sm_90a whose wgmmas complete in the body.
/// Runs in `lower`, after the bulk adds are planned.
pub fn plan(kernel: &mut Kernel, target: Target) {
    kernel.schedule.implied_barriers = ImpliedBarriers::default();
    if target != Target::Sm90a {
        return;
    }
    let Some(s) = &kernel.schedule.sched else {
        return;
    };
    let for_op = s.for_op;
    let unrotated = s
        .role(RoleKind::Consumer)
        .is_some_and(|c| !c.program.rotated);
    // The GEMM mainloop's one mma stays in flight across iterations.
    if !unrotated || overlaps(kernel, for_op) {
        return;
    }
    let body = Body::of(kernel, for_op);
    // The staged buffers and the adds' region are placed apart (after every other buffer,
    // the region last); where they were not, a staging write would also be an add's.
    if let Some(b) = &kernel.schedule.bulk_adds {
        let region = b.offset..b.offset + b.bytes;
        let apart = kernel
            .schedule
            .staged
            .iter()
            .all(|st| !overlap(&buffer_range(&st.buffer), &region));
        if !apart {
            return;
        }
    }
    let mut implied = ImpliedBarriers::default();
    for (&m, buffers) in &body.staged {
        if buffers
            .iter()
            .all(|b| body.staged_write_implied(kernel, m, b))
        {
            implied.staged.insert(m);
        }
    }
    if let Some((add, host)) = body.bulk_add_host(kernel) {
        implied.bulk.insert(add, host);
    }
    kernel.schedule.implied_barriers = implied;
}

/// A point of the body, in program order: before a top-level op's code (where the PTX writer
/// waits for the wgmma groups it reads), at its first barrier, at its second.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Point {
    op: usize,
    at: At,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum At {
    Before,
    First,
    Second,
}

/// The ring body's top-level ops and which of them stage a tile.
struct Body {
    ops: Vec<OpId>,
    /// Every op of the body, its regions' included.
    all: Vec<OpId>,
    /// Top-level mmas staging an operand, with the byte ranges of their buffers (A's and
    /// B's, written between one pair of barriers).
    staged: BTreeMap<OpId, Vec<std::ops::Range<u32>>>,
    /// Top-level bulk adds.
    adds: Vec<OpId>,
}

impl Body {
    fn of(kernel: &Kernel, for_op: OpId) -> Body {
        let block = &kernel.ops[for_op].regions[0];
        let ops = block.ops.clone();
        let staged = ops
            .iter()
            .filter(|&&o| kernel.ops[o].kind == OpKind::Mma)
            .filter_map(|&o| {
                let ranges: Vec<_> = (0..2)
                    .filter_map(|slot| {
                        kernel
                            .schedule
                            .staged_as(kernel.ops[o].operands[slot], slot)
                    })
                    .map(|st| buffer_range(&st.buffer))
                    .collect();
                (!ranges.is_empty()).then_some((o, ranges))
            })
            .collect();
        let adds = ops
            .iter()
            .copied()
            .filter(|&o| is_bulk_add(kernel, o))
            .collect();
        Body {
            all: ops_in_block(kernel, block),
            ops,
            staged,
            adds,
        }
    }

    fn index(&self, op: OpId) -> usize {
        self.ops
            .iter()
            .position(|&o| o == op)
            .unwrap_or(self.ops.len())
    }

    /// The points of the always-kept second barriers: every staged mma's and bulk add's.
    fn second_barriers(&self) -> Vec<Point> {
        let mut out: Vec<Point> = (self.staged.keys().chain(&self.adds))
            .map(|&o| Point {
                op: self.index(o),
                at: At::Second,
            })
            .collect();
        out.sort();
        out
    }

    /// Whether a second barrier lies strictly between `from` and `to`, going forward round
    /// the loop.
    fn barrier_between(&self, from: Point, to: Point) -> bool {
        self.second_barriers().into_iter().any(|b| {
            if from < to {
                from < b && b < to
            } else {
                b > from || b < to
            }
        })
    }

    /// Whether mma `m`'s staging write needs no first barrier: every reader of its buffer
    /// (the staged mmas whose buffers overlap it, all top-level in the body) has finished
    /// before another second barrier that precedes the write.
    fn staged_write_implied(
        &self,
        kernel: &Kernel,
        m: OpId,
        buffer: &std::ops::Range<u32>,
    ) -> bool {
        let overlapping: Vec<_> = kernel
            .schedule
            .staged
            .iter()
            .filter(|st| overlap(&buffer_range(&st.buffer), buffer))
            .collect();
        // A buffer written at its source, or read by an mma the body does not hold at its
        // top level, is read where these points do not reach.
        if overlapping.iter().any(|st| st.at_source) {
            return false;
        }
        let readers: Vec<OpId> = self
            .all
            .iter()
            .copied()
            .filter(|&o| overlapping.iter().any(|st| reads_staged(kernel, o, st)))
            .collect();
        let outside = ops_in_order(kernel)
            .into_iter()
            .filter(|o| !self.all.contains(o))
            .any(|o| overlapping.iter().any(|st| reads_staged(kernel, o, st)));
        if outside || readers.iter().any(|r| !self.staged.contains_key(r)) {
            return false;
        }
        let write = Point {
            op: self.index(m),
            at: At::First,
        };
        readers.iter().all(|&r| {
            let done = Point {
                op: self.first_reader(kernel, r),
                at: At::Before,
            };
            self.barrier_between(done, write)
        })
    }

    /// The index of the first top-level op after mma `r` reading its result (in its regions
    /// too), or the body's length (its end).
    fn first_reader(&self, kernel: &Kernel, r: OpId) -> usize {
        let result = kernel.ops[r].results[0];
        let at = self.index(r);
        (at + 1..self.ops.len())
            .find(|&i| reads(kernel, self.ops[i], result))
            .unwrap_or(self.ops.len())
    }

    /// The body's one bulk add, if its first barrier is implied: with the staged mma nearest
    /// before it (round the loop) whose second barrier then orders its write after the
    /// previous add's reads. Going round the loop (the mma after the add), no add may run
    /// before the loop, whose reads the first iteration would not wait for.
    fn bulk_add_host(&self, kernel: &Kernel) -> Option<(OpId, OpId)> {
        let adds = kernel.schedule.bulk_adds.as_ref()?;
        let in_body = self.all.iter().filter(|o| adds.ops.contains(o)).count();
        let [add] = self.adds[..] else {
            return None;
        };
        if in_body != 1 {
            return None;
        }
        let at = self.index(add);
        let hosts: Vec<(usize, OpId)> = self.staged.keys().map(|&m| (self.index(m), m)).collect();
        let before = hosts.iter().filter(|(i, _)| *i < at).max();
        let host = match before {
            Some(&(_, m)) => m,
            None if adds.ops.len() == 1 => hosts.iter().max()?.1,
            None => return None,
        };
        Some((add, host))
    }
}

/// Whether op `o` is an mma reading staged operand `st` from its buffer (as the operand it
/// was staged for: the same tile may be another operand of it, read from registers).
fn reads_staged(kernel: &Kernel, o: OpId, st: &crate::schedule::StagedOperand) -> bool {
    kernel.ops[o].kind == OpKind::Mma && kernel.ops[o].operands.get(st.slot) == Some(&st.operand)
}

/// Whether op `o` or an op of its regions reads `v`.
fn reads(kernel: &Kernel, o: OpId, v: ValueId) -> bool {
    kernel.ops[o].operands.contains(&v)
        || kernel.ops[o]
            .regions
            .iter()
            .any(|r| r.ops.iter().any(|&i| reads(kernel, i, v)))
}

fn is_bulk_add(kernel: &Kernel, o: OpId) -> bool {
    kernel
        .schedule
        .bulk_adds
        .as_ref()
        .is_some_and(|b| b.ops.contains(&o))
}

fn buffer_range(b: &crate::schedule::SmemBuffer) -> std::ops::Range<u32> {
    b.offset..b.offset + b.stage_bytes * b.stages
}

fn overlap(a: &std::ops::Range<u32>, b: &std::ops::Range<u32>) -> bool {
    a.start < b.end && b.start < a.end
}
