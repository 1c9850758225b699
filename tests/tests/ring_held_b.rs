//! A warp-specialised ring whose B operand is a tile loaded once before the loop and held in
//! shared memory (`wgmma_kernels::ring_held_b`: a weight against streamed row tiles, read
//! MN-major and K-major, one and two consumer warpgroups), checked on the CPU: the `pipeline`
//! pass plans the weight as a once load beside the ring's stage loads, `protocol_check`
//! proves the schedule, its CPU execution (`run_scheduled`) and the interpreter match the f64
//! reference, and both ptxas releases assemble the PTX without spills. The GPU run:
//! `gpu_wgmma_general.rs`.

mod wgmma_kernels;

use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_ir::interp::{HostArg, run_def, run_scheduled};
use kiln_ir::passes::run_pipeline;
use kiln_ir::sched::tma::Operand;
use kiln_ir::{DType, Kernel, Target};
use kiln_ptx::ptxas::{self, Tool};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use wgmma_kernels::{RingHeldBComptime, held_b, ring_held_b, ring_held_b_configs};

fn scheduled(ct: RingHeldBComptime) -> Kernel {
    let spec = Spec::uniform(ct, ring_held_b.signature(), true);
    let mut k = ring_held_b.build(&spec).expect("builds");
    run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{ct:?}: {d}"));
    k
}

#[test]
fn the_weight_is_a_once_load_of_the_ring() {
    for ct in ring_held_b_configs() {
        let k = scheduled(ct);
        let s = k.schedule.sched.as_ref().expect("a ring");
        let loads: Vec<_> = s
            .loads
            .iter()
            .map(|(h, l)| (s.once(h), l.tma.operand))
            .collect();
        let b = if ct.WT {
            Operand::KMajorB
        } else {
            Operand::MnMajorB
        };
        assert_eq!(
            loads,
            [(false, Operand::KMajorA), (true, b)],
            "{ct:?}: the row tiles per stage, the weight once"
        );
    }
}

#[test]
fn scheduled_and_interpreted_match_reference() {
    let mut rng = Rng::from_env();
    for ct in ring_held_b_configs() {
        let kernel = scheduled(ct);
        // Row counts no multiple of the tile (the last tile's rows read as 0), and N past the
        // blocks' columns.
        for (rows, n) in [(300, 130), (64, 64), (5, 200)] {
            for dist in [Dist::Normal, Dist::Large] {
                let a = tensor(&mut rng, &[rows, ct.K], DType::Bf16, dist);
                let w_shape = if ct.WT { [n, ct.K] } else { [ct.K, n] };
                let w = tensor(&mut rng, &w_shape, DType::Bf16, dist);
                let want = held_b(&a, &w, ct.BM, ct.WT);
                let grid = [n.div_ceil(ct.BN) as u32, 1, 1];
                let case = Case {
                    kernel: format!("ring_held_b {ct:?}"),
                    shape: format!("rows={rows} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                let mut c = poisoned(&[ct.BM, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&w),
                    HostArg::TensorMut(&mut c),
                ];
                run_scheduled(&kernel, grid, 2, &mut args)
                    .unwrap_or_else(|e| panic!("{ct:?}: {e}"));
                assert_close(&case, &c, &want, tolerance(DType::Bf16));
                let mut ci = poisoned(&[ct.BM, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&w),
                    HostArg::TensorMut(&mut ci),
                ];
                run_def(&ring_held_b, &ct, grid, &mut args).expect("interprets");
                assert_close(&case, &ci, &want, tolerance(DType::Bf16));
            }
        }
    }
}

#[test]
fn both_ptxas_assemble_without_spills() {
    for ct in ring_held_b_configs() {
        let spec = Spec::uniform(ct, ring_held_b.signature(), true);
        let built = ring_held_b.build(&spec).expect("builds");
        let m = kiln_ptx::compile(&built, Target::Sm90a).expect("compiles");
        assert!(m.ptx.contains("wgmma.mma_async"), "{ct:?}: wgmma");
        for tool in [Tool::Ptxas, Tool::JitPtxas] {
            let report = ptxas::check_with(tool, &m.ptx, Target::Sm90a)
                .unwrap_or_else(|e| panic!("{ct:?} {tool:?}: {e}"));
            assert!(!report.spills(), "{ct:?} {tool:?} spills: {report}");
        }
    }
}
