//! The memory-operation kernels (`memory_kernels`) through the PTX backend for sm_80 and
//! sm_90a: every variant assembles with `ptxas` without spills, and the instructions are the
//! ones the operation needs: `red` for an atomic whose old values are unused, `atom` with the
//! requested order and scope when they are read, a compare-and-swap loop where the target has
//! no such atomic (bf16 add on sm_80, float max/min), predicated loads and stores for masks
//! and gathers.

mod memory_kernels;

use kiln::ir::dsl::{Comptime, KernelDef, Spec};
use kiln::ir::{DType, Kernel, Target};
use kiln::prelude::*;
use kiln::ptx::ptxas;
use memory_kernels::*;

/// `def` built for `comptime`, every tensor 16-byte aligned.
fn build<K: KernelDef>(def: &K, comptime: K::Comptime) -> Kernel
where
    K::Comptime: Comptime,
{
    def.build(&Spec::uniform(comptime, def.signature(), true))
        .unwrap_or_else(|d| panic!("{d}"))
}

/// The PTX of `k` for `target`, checked by ptxas (when it is installed) to have no spills.
fn ptx(k: &Kernel, target: Target, what: &str) -> String {
    ptx_spilling(k, target, what, 0)
}

/// [`ptx`], allowing `max` bytes of spill stores: around compare-and-swap loops (ours for
/// float max/min and sm_80's bf16 add; ptxas's own for a lone 16-bit float atomic, which it
/// emulates, `EIATTR_ATOM16_EMUL_INSTR_REG_MAP`) ptxas keeps a value or two on the stack
/// (4 to 8 bytes, with under 50 of the 255 registers used); every other kernel spills nothing.
fn ptx_spilling(k: &Kernel, target: Target, what: &str, max: u32) -> String {
    let m = kiln::ptx::compile(k, target).unwrap_or_else(|e| panic!("{what} {target}: {e}"));
    if ptxas::find_ptxas().is_ok() {
        let r = ptxas::check(&m.ptx, target).unwrap_or_else(|e| panic!("{what} {target}: {e}"));
        assert!(
            r.spill_store_bytes <= max && r.spill_load_bytes <= max,
            "{what} {target}: spills {r:?}"
        );
    }
    m.ptx
}

const TARGETS: [Target; 2] = [Target::Sm80, Target::Sm90a];

/// The PTX type one element of `dtype` moves as.
fn mem(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::I32 => "b32",
        _ => "b16",
    }
}

#[test]
fn histogram_is_a_reduction_without_result() {
    let k = build(&histogram, HIST);
    for t in TARGETS {
        let p = ptx(&k, t, "histogram");
        assert!(p.contains("red.relaxed.gpu.global.add.s32"), "{t}:\n{p}");
        assert!(!p.contains("atom."), "{t}: no atom where no result is read");
    }
}

#[test]
fn row_gathers_and_scatters_are_predicated_accesses() {
    for dtype in [DType::F32, DType::Bf16, DType::F16, DType::I32] {
        let g = build(&gather_rows, GatherRowsComptime { dtype });
        let s = build(&scatter_rows, ScatterRowsComptime { dtype });
        for t in TARGETS {
            // Whole 16-byte pieces of each routed row where they lie inside, element by
            // element at the edges.
            let p = ptx(&g, t, "gather_rows");
            assert!(
                p.contains("ld.global.v4."),
                "{t} {dtype}: vector gather loads"
            );
            assert!(
                p.contains(&format!("ld.global.{} ", mem(dtype))),
                "{t} {dtype}: edges"
            );
            let p = ptx(&s, t, "scatter_rows");
            assert!(
                p.contains("st.global.v4."),
                "{t} {dtype}: vector scatter stores"
            );
            assert!(
                p.contains(&format!("st.global.{} ", mem(dtype))),
                "{t} {dtype}: edges"
            );
        }
    }
    let k = build(&gather_elems, ());
    for t in TARGETS {
        ptx(&k, t, "gather_elems");
    }
}

#[test]
fn atomics_use_the_requested_order_and_fall_back_to_cas_loops() {
    let cases: &[(DType, &[usize])] = &[
        (DType::I32, &[0, 1, 2, 3, 4]),
        (DType::F32, &[0, 1, 2, 3, 4]),
        (DType::Bf16, &[0]),
        (DType::F16, &[0]),
    ];
    for &(dtype, ops) in cases {
        for &op in ops {
            for order in 0..12 {
                let k = build(&atomic_rows, AtomicRowsComptime { op, dtype, order });
                let (sem, scope) = (sem_of(order).name(), scope_of(order).name());
                for t in TARGETS {
                    let what = format!("atomic_rows op={op} {dtype} order={order}");
                    let cas = (dtype == DType::F32 && (op == 1 || op == 2))
                        || (dtype == DType::Bf16 && t == Target::Sm80);
                    let loops = cas || dtype.size_bytes() == 2;
                    let p = ptx_spilling(&k, t, &what, if loops { 8 } else { 0 });
                    let want = if dtype.size_bytes() == 2 && !cas {
                        format!("atom.{sem}.{scope}.global.add.noftz.{dtype}x2")
                    } else if cas {
                        // bf16 on sm_80: a 16-bit loop on the element itself.
                        let bits = if dtype == DType::Bf16 { 16 } else { 32 };
                        format!("atom.{sem}.{scope}.global.cas.b{bits}")
                    } else {
                        let name = ["add", "max", "min", "exch", "cas"][op];
                        format!("atom.{sem}.{scope}.global.{name}.")
                    };
                    assert!(p.contains(&want), "{what} {t}: `{want}` in\n{p}");
                }
            }
        }
    }
}

#[test]
fn atomic_adds_without_result_are_reductions() {
    for dtype in [DType::F32, DType::F16, DType::Bf16, DType::I32] {
        let k = build(&atomic_add_tiles, AtomicAddTilesComptime { dtype });
        for t in TARGETS {
            let p = ptx(&k, t, "atomic_add_tiles");
            let red = match (dtype, t) {
                // Whole rows in bulk from shared memory (`bulk_add_ptx`).
                (DType::F32, Target::Sm90a) => {
                    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
                }
                (DType::F32, _) => "red.relaxed.gpu.global.add.f32",
                // Adjacent 16-bit elements: one packed add per pair.
                (DType::F16, _) => "red.relaxed.gpu.global.add.noftz.f16x2",
                (DType::Bf16, Target::Sm80) => "atom.relaxed.gpu.global.cas.b16",
                (DType::Bf16, _) => "red.relaxed.gpu.global.add.noftz.bf16x2",
                _ => "red.relaxed.gpu.global.add.s32",
            };
            assert!(p.contains(red), "{dtype} {t}: `{red}`");
        }
    }
}

#[test]
fn masked_loads_and_stores_assemble() {
    let k = build(&masked_copy, ());
    for t in TARGETS {
        let p = ptx(&k, t, "masked_copy");
        assert!(
            p.contains("ld.global.f32") && p.contains("st.global.f32"),
            "{t}"
        );
    }
}

#[test]
fn split_k_gemm_adds_its_accumulator_atomically() {
    let k = build(&splitk_gemm, ());
    for t in [Target::Sm80, Target::Sm90a, Target::Sm100a] {
        let p = ptx(&k, t, "splitk_gemm");
        assert!(p.contains("red.relaxed.gpu.global.add.f32"), "{t}");
        // On sm_90a the partial tile comes from the warp-specialised wgmma schedule, on
        // sm_100a from tcgen05 and tensor memory.
        let mma = match t {
            Target::Sm80 => "mma.sync",
            Target::Sm90a => "wgmma.mma_async",
            Target::Sm100a => "tcgen05.mma",
        };
        assert!(p.contains(mma), "{t}: {mma}");
    }
}

/// An atomic whose tile is smaller than the block, reading its old values.
#[kernel(num_warps = 4)]
fn small_atomic_with_result(x: Tensor<f32, 1>, y: TensorMut<f32, 1>, z: TensorMut<f32, 1>) {
    let v = x.tile([64], [0]).load();
    let old = y.tile([64], [0]).atomic_max(v);
    z.tile([64], [0]).store(old);
}

#[test]
fn old_values_copied_across_warps_are_diagnosed_at_the_line() {
    let k = build(&small_atomic_with_result, ());
    let err = kiln::ptx::compile(&k, Target::Sm80).expect_err("copies across warps");
    let d = err.diagnostic();
    let src = include_str!("memory_ops_ptx.rs");
    let line = src
        .lines()
        .position(|l| l.contains("let old = y.tile([64], [0]).atomic_max(v);"))
        .expect("line") as u32
        + 1;
    assert_eq!(d.loc.line, line, "{err}");
    let k = build(&small_atomics, ());
    for t in TARGETS {
        let p = ptx(&k, t, "small_atomics");
        // One owner per element, and its old value to the lanes holding copies.
        assert!(p.contains("shfl.sync.idx.b32"), "{t}");
    }
}

#[test]
fn gathered_rows_feed_mma_from_registers() {
    let k = build(&gathered_gemm, ());
    for t in TARGETS {
        let p = ptx(&k, t, "gathered_gemm");
        // The routed rows are register A operands: of mma.sync on sm_80, of wgmma without
        // warp roles on sm_90a (no TMA ring for a gathered A: the `pipeline` pass).
        let mma = if t == Target::Sm90a {
            !p.contains("mma.sync") && p.contains("wgmma.mma_async")
        } else {
            p.contains("mma.sync") && !p.contains("wgmma.mma_async")
        };
        assert!(mma && p.contains("ld.global"), "{t}");
    }
}

#[test]
fn scalar_atomics_are_one_thread_s_atomic_between_barriers() {
    let k = build(&last_block_sum, ());
    for t in TARGETS {
        let p = ptx(&k, t, "last_block_sum");
        // The ticket: acq_rel, applied by thread 0 and read back by every thread.
        assert!(p.contains("atom.acq_rel.gpu.global.add.s32"), "{t}:\n{p}");
        assert!(
            p.contains("st.shared.b32") && p.contains("ld.shared.b32"),
            "{t}"
        );
        // The reset's old value is unused: no result, no broadcast.
        assert!(p.contains("atom.relaxed.gpu.global.exch.b32"), "{t}");
    }
    let k = build(&scalar_atomics, ());
    for t in TARGETS {
        // sm_80's 16-bit compare-and-swap loop may keep a value on the stack (see
        // `ptx_spilling`).
        let p = ptx_spilling(&k, t, "scalar_atomics", 8);
        for form in [
            "atom.relaxed.gpu.global.add.s32",
            "atom.relaxed.gpu.global.max.s32",
            "atom.relaxed.gpu.global.min.s32",
            "atom.relaxed.gpu.global.exch.b32",
            "atom.relaxed.gpu.global.cas.b32",
            "atom.relaxed.gpu.global.add.f32",
            "atom.relaxed.gpu.global.cas.b16",
        ] {
            assert!(p.contains(form), "{t}: no {form}");
        }
        // One barrier before each of the nine atomics and one before each broadcast.
        let barriers = p.lines().filter(|l| l.trim() == "bar.sync 0;").count();
        assert!(barriers >= 17, "{t}: {barriers} barriers");
    }
}

/// A scalar atomic with a mask or a tile value is diagnosed at the user's line.
#[kernel(num_warps = 4)]
fn scalar_atomic_misuse(x: Tensor<i32, 1>, c: TensorMut<i32, 1>) {
    let v = x.tile([128], [0]).load();
    c.at([0]).atomic_add(v);
}

#[test]
fn a_scalar_atomic_of_a_tile_is_diagnosed_at_its_line() {
    let err = scalar_atomic_misuse
        .build(&Spec::uniform((), scalar_atomic_misuse.signature(), true))
        .expect_err("a tile value");
    let src = include_str!("memory_ops_ptx.rs");
    let line = src
        .lines()
        .position(|l| l.contains("c.at([0]).atomic_add(v);"))
        .expect("line") as u32
        + 1;
    assert_eq!(err.loc.line, line, "{err}");
    assert!(
        err.message.contains("scalar atomic takes scalar values"),
        "{err}"
    );
}

/// Split-K with a completion counter: on sm_90a the GEMM loop is warp-specialised, whose
/// roles share no block-wide barrier for a once-per-block atomic.
#[kernel(num_warps = 4)]
fn splitk_with_counter(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    done: TensorMut<i32, 1>,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let mut acc = zeros::<f32>([128, 128]);
    for kb in pipelined(0..cdiv(a.dim(1), 64), stages = 2) {
        let x = a.tile([128, 64], [mb * 128, kb * 64]).load();
        let y = b.tile([64, 128], [kb * 64, nb * 128]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([128, 128], [mb * 128, nb * 128]).atomic_add(acc);
    done.at([0]).atomic_add(1);
}

#[test]
fn a_scalar_atomic_in_a_warp_specialised_kernel_is_diagnosed_at_its_line() {
    let k = build(&splitk_with_counter, ());
    // sm_80 has the block-wide barrier it needs.
    ptx(&k, Target::Sm80, "splitk_with_counter");
    let err = kiln::ptx::compile(&k, Target::Sm90a).expect_err("no block-wide barrier");
    let d = err.diagnostic();
    let line = include_str!("memory_ops_ptx.rs")
        .lines()
        .position(|l| l.contains("done.at([0]).atomic_add(1);"))
        .expect("line") as u32
        + 1;
    assert_eq!(d.loc.line, line, "{err}");
    assert!(d.message.contains("scalar atomic"), "{err}");
}
