//! The `tmem` pass (sm_100a): plans the Blackwell roles, the tensor-memory accumulator and the
//! tcgen05 descriptors of the schedule's loop ([`crate::sched::tmem`]).
//!
//! A GEMM mainloop (one carried accumulator of a single 128-row mma) gets epilogue warps, one
//! TMA producer warp and one MMA warp, the accumulator in TMEM handed between them per work
//! tile on `acc_full` / `acc_empty`; an attention-shaped loop gets the FlashAttention-4-style
//! schedule (`attention`); any other loop is reported as not implemented on sm_100a. Runs on
//! the final shared-memory plan. The roles, the 2-SM form and the conditions: `docs/targets.md`.

mod attention;

pub use attention::AttentionOptions;

use crate::diag::Diagnostic;
use crate::kernel::{Const, Kernel, OpKind, ValueDef};
use crate::sched::cluster::CTAS;
use crate::sched::tma::Operand;
use crate::sched::tmem::{ACC_ROWS, Descriptor, Tmem, TmemMma, TmemTile, instruction_descriptor};
use crate::sched::{BarrierId, Issue, Mbarrier, MmaPart, Op, Phase, Role, RoleKind, Sched, Scope};
use crate::target::Target;

use super::memory_plan::check_smem;
use super::walk::sched_loc;

/// Plans the loop's TMEM accumulator; does nothing on other targets or without a schedule.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    run_with(kernel, target, AttentionOptions::default())
}

/// [`run`] with the attention schedule's options.
pub fn run_with(
    kernel: &mut Kernel,
    target: Target,
    options: AttentionOptions,
) -> Result<(), Diagnostic> {
    if target != Target::Sm100a {
        return Ok(());
    }
    let Some(s) = &kernel.schedule.sched else {
        return Ok(());
    };
    let id = s.for_op;
    if let Some(overlap) = attention::attention_overlap(kernel, s) {
        return attention::plan(kernel, overlap, options);
    }
    let loc = sched_loc(kernel);
    let unsupported = |why: &str| {
        Diagnostic::unsupported(
            loc,
            format!("target sm_100a is not implemented yet for this loop: {why}"),
        )
        .note("sm_100a schedules the GEMM mainloop `acc = mma(x, y, acc)` from zeros")
        .note("compile for sm_80, which runs on Blackwell")
    };
    let op = &kernel.ops[id];
    let once = s.loads.iter().any(|(h, _)| s.once(h));
    if once || !super::pipeline::overlaps(kernel, id) {
        return Err(unsupported(
            "it has tiles loaded before it or reads its mma's products",
        ));
    }
    let [_, _, _, init] = op.operands[..] else {
        return Err(unsupported("it carries more than the accumulator"));
    };
    let zero = match kernel.values[init].def {
        ValueDef::Op(s, 0) if matches!(kernel.ops[s].kind, OpKind::Splat { .. }) => {
            match kernel.values[kernel.ops[s].operands[0]].def {
                ValueDef::Op(c, 0) => {
                    matches!(kernel.ops[c].kind, OpKind::Const(Const::Float(f)) if f == 0.0)
                }
                ValueDef::BlockArg { .. } | ValueDef::Op(..) => false,
            }
        }
        ValueDef::BlockArg { .. } | ValueDef::Op(..) => false,
    };
    let shape = kernel.ty(init).shape().cloned();
    let (Some(shape), true) = (shape, zero) else {
        return Err(unsupported("its accumulator does not start as zeros"));
    };
    let (m, n) = (shape.rows() as u32, shape.cols() as u32);
    let ring: Vec<_> = s.ring_loads().map(|(_, l)| l.tma.clone()).collect();
    let [a, b] = &ring[..] else {
        return Err(unsupported("its mma does not read two staged tiles"));
    };
    if m != ACC_ROWS || a.operand != Operand::KMajorA {
        return Err(unsupported("its accumulator does not have 128 rows"));
    }
    let columns = n.next_power_of_two().max(32);
    let dtype = kernel.ty(kernel.ops[a.load].results[0]).dtype();
    // The 2-SM form's mma covers both CTAs' rows (M = 256, each TMEM its 128).
    let pair = s.cluster.as_ref().and_then(|c| c.pair);
    let mma_m = m * pair.map_or(1, |_| CTAS);
    let idesc = instruction_descriptor(dtype, mma_m, n, b.operand == Operand::MnMajorB);
    let (a, b) = (Descriptor::of(a), Descriptor::of(b));
    let slot_offset = kernel.schedule.smem_bytes.next_multiple_of(8);
    let smem_bytes = slot_offset + 24;
    let rings = "the TMA stage rings and the TMEM barriers";
    check_smem(
        loc,
        smem_bytes,
        rings,
        "use smaller tiles or fewer pipeline stages",
    )?;
    // Every epilogue warpgroup reads all 128 lanes (a warp only its 32) of its column block.
    let epilogue_warps = kernel.options.num_warps;
    let block = n / (epilogue_warps / 4).max(1);
    if !epilogue_warps.is_multiple_of(4) || block * (epilogue_warps / 4) != n {
        return Err(Diagnostic::internal(
            loc,
            format!("{epilogue_warps} epilogue warps for a {n}-column TMEM accumulator"),
        ));
    }
    let chunk = crate::tmem::epilogue::chunk_columns(kernel, id, n, epilogue_warps);
    let Some(s) = kernel.schedule.sched.as_mut() else {
        return Ok(());
    };
    // The 2-SM pair's commit reaches both CTAs' `acc_full`; both hand back on the leader's
    // `acc_empty`.
    let acc = |count, offset, pair_scope| Mbarrier {
        offset,
        scope: if pair.is_some() {
            pair_scope
        } else {
            Scope::Cta
        },
        hands_tmem: true,
        ..Mbarrier::new(count, 1, Phase::Tile)
    };
    let acc_full = s.add_mbarrier("acc_full", None, acc(1, slot_offset + 8, Scope::Cluster));
    let pairs = pair.map_or(1, |_| CTAS);
    let acc_empty = s.add_mbarrier(
        "acc_empty",
        None,
        acc(epilogue_warps * pairs, slot_offset + 16, Scope::Leader),
    );
    s.tmem = Some(Tmem {
        columns,
        slot_offset,
        tiles: vec![TmemTile {
            name: "acc",
            index: None,
            column: 0,
            columns: n,
        }],
        mmas: vec![TmemMma {
            part: MmaPart::Body,
            idesc,
            a: Some(a),
            b,
        }],
    });
    s.setup = tmem_setup(&s.setup, columns);
    roles(
        s,
        epilogue_warps,
        (acc_full, acc_empty),
        columns,
        (block, chunk),
    );
    s.sort_barriers();
    kernel.schedule.smem_bytes = smem_bytes;
    Ok(())
}

/// The set-up with the MMA warp's allocation of `columns`: the inits, the allocation and the
/// permit given up, then the set-up barrier between the tcgen05 fences, which publishes the
/// address in the shared slot to every thread.
fn tmem_setup(setup: &[Op], columns: u32) -> Vec<Op> {
    let mut out = vec![
        Op::InitBarriers,
        Op::TmemAlloc { columns },
        Op::TmemRelinquish,
        Op::Tcgen05FenceBefore,
    ];
    out.extend(setup.iter().copied().filter(|&op| op != Op::InitBarriers));
    out.push(Op::Tcgen05FenceAfter);
    out
}

/// The roles of a TMEM gemm: the epilogue warps first (the kernel's), then the producer and
/// MMA warps the `pipeline` pass planned after them (see `docs/targets.md`).
fn roles(
    s: &mut Sched,
    epilogue_warps: u32,
    (acc_full, acc_empty): (BarrierId, BarrierId),
    columns: u32,
    (block, chunk): (u32, u32),
) {
    let pair = s.cluster.as_ref().and_then(|c| c.pair);
    let exit_sync = s.cluster.as_ref().is_some_and(|c| c.exit_sync);
    let mut epilogue = Role::new(RoleKind::Epilogue, 0, epilogue_warps, Issue::Warps);
    epilogue.program.end = crate::tmem::epilogue::program(block, chunk, acc_full, acc_empty);
    if !s.stores.is_empty() {
        epilogue.program.exit.push(Op::BulkWaitAll);
    }
    if exit_sync {
        epilogue.program.exit.push(Op::ClusterSync);
    }
    let wait_empty = Op::wait(acc_empty, 1);
    let dealloc = Op::TmemDealloc { columns };
    let mut peer = None;
    for r in &mut s.roles {
        if r.kind != RoleKind::Mma {
            continue;
        }
        // The accumulator is overwritten only once the previous tile's copy is out (a fresh
        // barrier passes parity 1 at once), and freed once the last one is.
        r.program.tile = vec![wait_empty, Op::Tcgen05FenceAfter];
        r.program.end = vec![Op::commit(acc_full)];
        r.program.exit = vec![wait_empty, Op::Tcgen05FenceAfter];
        if let Some(p) = pair {
            // Neither CTA frees its columns while the leader's mmas or the other's copies may
            // still use them.
            r.rank = Some(p.leader);
            r.program.exit.extend([Op::ClusterSync, dealloc]);
            let mut other = Role::new(RoleKind::Mma, r.first_warp, r.warps, Issue::Thread);
            other.rank = Some(1 - p.leader);
            other.program.exit = vec![Op::ClusterSync, dealloc];
            peer = Some(other);
        } else {
            r.program.exit.push(dealloc);
        }
    }
    s.roles.insert(0, epilogue);
    s.roles.extend(peer);
}
