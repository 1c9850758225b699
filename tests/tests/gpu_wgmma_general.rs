//! The kernels of `wgmma_kernels/` on the GPU (sm_80 code anywhere, sm_90a on Hopper): wgmma
//! without warp roles (transposed loaded operands, one and two warpgroups, a chained mma with a
//! register A, an A gathered once before a loop) and warp-specialised rings whose B is loaded
//! once and held (`ring_held_b`), whose one stage load feeds two operands (`ring_shared_b`) or
//! whose consumers stage an A operand (`ring_staged_a`),
//! each against the f64 reference and the interpreter on shapes
//! no multiple of the tiles, every input distribution, outputs poisoned. Skips itself without
//! a GPU.

mod gpu_common;
mod wgmma_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, check, devices, poisoned_output};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use wgmma_kernels::*;

fn gpu_wgmma_transposed() {
    let mut rng = Rng::from_env();
    let configs = [
        WgmmaTransposedComptime::default(),
        WgmmaTransposedComptime {
            BM: 128,
            BN: 64,
            BK: 128,
            NW: 8,
            ..Default::default()
        },
        WgmmaTransposedComptime {
            BM: 64,
            BN: 128,
            BK: 32,
            NW: 4,
            ..Default::default()
        },
        // B's rows of 32 bytes: the 32-byte swizzle.
        WgmmaTransposedComptime {
            BM: 64,
            BN: 64,
            BK: 16,
            NW: 4,
            ..Default::default()
        },
    ];
    // Each without warp roles and, on sm_90a, as a warp-specialised ring (A read MN-major
    // from its TMA stage).
    let configs = configs
        .into_iter()
        .flat_map(|ct| [false, true].map(|ws| WgmmaTransposedComptime { WS: ws, ..ct }));
    for dev in devices() {
        for ct in configs.clone() {
            for (m, n, k) in [(70, 130, 150), (129, 65, 33), (3, 5, 7), (256, 192, 320)] {
                for dist in Dist::ALL {
                    let a = tensor(&mut rng, &[k, m], DType::Bf16, dist);
                    let b = tensor(&mut rng, &[n, k], DType::Bf16, dist);
                    let grid = [m.div_ceil(ct.BM) as u32, n.div_ceil(ct.BN) as u32, 1];
                    let (da, db) = (dev.upload(&a).expect("up"), dev.upload(&b).expect("up"));
                    let c = poisoned_output(&dev, DType::F32, &[m, n]);
                    wgmma_transposed
                        .launch(&dev, &ct, grid, &da, &db, &c)
                        .expect("launch");
                    let mut ci = poisoned(&[m, n], DType::F32);
                    wgmma_transposed
                        .interpret(&ct, grid, &a, &b, &mut ci)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!(
                            "wgmma_transposed BM={} BK={} WS={} on {}",
                            ct.BM,
                            ct.BK,
                            ct.WS,
                            dev.target()
                        ),
                        shape: format!("m={m} n={n} k={k}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(&case, &c, &gemm_tt(&a, &b), &ci, tolerance(DType::Bf16));
                }
            }
        }
    }
}

fn gpu_wgmma_chain() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for d in [64, 96, 128] {
            let ct = WgmmaChainComptime {
                D: d,
                ..WgmmaChainComptime::default()
            };
            for (sq, sk) in [(100, 70), (64, 129), (3, 5), (200, 600)] {
                for dist in Dist::ALL {
                    let q = tensor(&mut rng, &[sq, d], DType::Bf16, dist);
                    let k = tensor(&mut rng, &[sk, d], DType::Bf16, dist);
                    let v = tensor(&mut rng, &[sk, d], DType::Bf16, dist);
                    let scale = 1.0 / (d as f32).sqrt();
                    let grid = [sq.div_ceil(ct.BM) as u32, 1, 1];
                    let (dq, dk, dv) = (
                        dev.upload(&q).expect("up"),
                        dev.upload(&k).expect("up"),
                        dev.upload(&v).expect("up"),
                    );
                    let o = poisoned_output(&dev, DType::F32, &[sq, d]);
                    wgmma_chain
                        .launch(&dev, &ct, grid, &dq, &dk, &dv, &o, scale)
                        .expect("launch");
                    let mut oi = poisoned(&[sq, d], DType::F32);
                    wgmma_chain
                        .interpret(&ct, grid, &q, &k, &v, &mut oi, scale)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("wgmma_chain d={d} on {}", dev.target()),
                        shape: format!("sq={sq} sk={sk}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let want = chain(&q, &k, &v, f64::from(scale));
                    check(&case, &o, &want, &oi, tolerance(DType::Bf16));
                }
            }
        }
    }
}

/// `wgmma_held_a`: the gathered A written once into shared memory before the loop (sm_90a),
/// in one and two warpgroups, boxed rows; rows outside `a` read zeros.
fn gpu_wgmma_held_a() {
    let mut rng = Rng::from_env();
    let configs = [
        WgmmaHeldAComptime::default(),
        WgmmaHeldAComptime {
            BM: 128,
            BN: 64,
            D: 128,
            NW: 8,
        },
        WgmmaHeldAComptime {
            BM: 64,
            BN: 128,
            D: 128,
            NW: 4,
        },
    ];
    for dev in devices() {
        for ct in configs {
            for (m, r, j, n) in [
                (100, 37, 3, 70),
                (3, 5, 1, 9),
                (130, 200, 2, 129),
                (300, 64, 5, 200),
            ] {
                for dist in Dist::ALL {
                    let a = tensor(&mut rng, &[r, ct.D], DType::Bf16, dist);
                    let rows = held_rows(&mut rng, m, r);
                    let rows_t = HostTensor::from_fn(&[m], DType::I32, |i| f64::from(rows[i]));
                    let b = tensor(&mut rng, &[j * ct.D, n], DType::Bf16, dist);
                    let grid = [m.div_ceil(ct.BM) as u32, n.div_ceil(ct.BN) as u32, 1];
                    let (da, dr, db) = (
                        dev.upload(&a).expect("up"),
                        dev.upload(&rows_t).expect("up"),
                        dev.upload(&b).expect("up"),
                    );
                    let c = poisoned_output(&dev, DType::F32, &[m, n]);
                    wgmma_held_a
                        .launch(&dev, &ct, grid, &da, &dr, &db, &c)
                        .expect("launch");
                    let mut ci = poisoned(&[m, n], DType::F32);
                    wgmma_held_a
                        .interpret(&ct, grid, &a, &rows_t, &b, &mut ci)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("wgmma_held_a {ct:?} on {}", dev.target()),
                        shape: format!("m={m} r={r} j={j} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(
                        &case,
                        &c,
                        &held_a(&a, &rows, &b),
                        &ci,
                        tolerance(DType::Bf16),
                    );
                }
            }
        }
    }
}

fn gpu_ring_held_b() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for ct in ring_held_b_configs() {
            for (rows, n) in [(300, 130), (64, 64), (5, 200), (4000, 256)] {
                for dist in Dist::ALL {
                    let a = tensor(&mut rng, &[rows, ct.K], DType::Bf16, dist);
                    let w_shape = if ct.WT { [n, ct.K] } else { [ct.K, n] };
                    let w = tensor(&mut rng, &w_shape, DType::Bf16, dist);
                    let grid = [n.div_ceil(ct.BN) as u32, 1, 1];
                    let (da, dw) = (dev.upload(&a).expect("up"), dev.upload(&w).expect("up"));
                    let c = poisoned_output(&dev, DType::F32, &[ct.BM, n]);
                    ring_held_b
                        .launch(&dev, &ct, grid, &da, &dw, &c)
                        .expect("launch");
                    let mut ci = poisoned(&[ct.BM, n], DType::F32);
                    ring_held_b
                        .interpret(&ct, grid, &a, &w, &mut ci)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("ring_held_b {ct:?} on {}", dev.target()),
                        shape: format!("rows={rows} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(
                        &case,
                        &c,
                        &held_b(&a, &w, ct.BM, ct.WT),
                        &ci,
                        tolerance(DType::Bf16),
                    );
                }
            }
        }
    }
}

fn gpu_ring_shared_b() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for ct in ring_shared_b_configs() {
            for (m, rows) in [(100, 150), (64, 64), (3, 200), (300, 1000)] {
                for dist in Dist::ALL {
                    let q = tensor(&mut rng, &[m, ct.D], DType::Bf16, dist);
                    let k = tensor(&mut rng, &[rows, ct.D], DType::Bf16, dist);
                    let grid = [m.div_ceil(ct.BM) as u32, 1, 1];
                    let (dq, dk) = (dev.upload(&q).expect("up"), dev.upload(&k).expect("up"));
                    let o = poisoned_output(&dev, DType::F32, &[m, ct.D]);
                    ring_shared_b
                        .launch(&dev, &ct, grid, &dq, &dk, &o)
                        .expect("launch");
                    let mut oi = poisoned(&[m, ct.D], DType::F32);
                    ring_shared_b
                        .interpret(&ct, grid, &q, &k, &mut oi)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("ring_shared_b {ct:?} on {}", dev.target()),
                        shape: format!("m={m} rows={rows}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(&case, &o, &shared_b(&q, &k), &oi, tolerance(DType::Bf16));
                }
            }
        }
    }
}

fn gpu_ring_staged_a() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for ct in ring_staged_a_configs() {
            for (m, n) in [(150, ct.BN), (64, ct.BN - 14), (3, 5), (1000, ct.BN)] {
                for dist in Dist::ALL {
                    let q = tensor(&mut rng, &[m, ct.D], DType::Bf16, dist);
                    let k = tensor(&mut rng, &[n, ct.D], DType::Bf16, dist);
                    let (dq, dk) = (dev.upload(&q).expect("up"), dev.upload(&k).expect("up"));
                    let oq = poisoned_output(&dev, DType::F32, &[m, ct.D]);
                    let ok = poisoned_output(&dev, DType::F32, &[n, ct.D]);
                    ring_staged_a
                        .launch(&dev, &ct, [1, 1, 1], &dq, &dk, &oq, &ok)
                        .expect("launch");
                    let mut oqi = poisoned(&[m, ct.D], DType::F32);
                    let mut oki = poisoned(&[n, ct.D], DType::F32);
                    ring_staged_a
                        .interpret(&ct, [1, 1, 1], &q, &k, &mut oqi, &mut oki)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("ring_staged_a {ct:?} on {}", dev.target()),
                        shape: format!("m={m} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let (want_q, want_k) = staged_a(&q, &k);
                    check(&case, &oq, &want_q, &oqi, tolerance(DType::Bf16));
                    check(&case, &ok, &want_k, &oki, tolerance(DType::Bf16));
                }
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        ("gpu_wgmma_transposed", Needs::Gpu, gpu_wgmma_transposed),
        ("gpu_wgmma_chain", Needs::Gpu, gpu_wgmma_chain),
        ("gpu_wgmma_held_a", Needs::Gpu, gpu_wgmma_held_a),
        ("gpu_ring_held_b", Needs::Gpu, gpu_ring_held_b),
        ("gpu_ring_shared_b", Needs::Gpu, gpu_ring_shared_b),
        ("gpu_ring_staged_a", Needs::Gpu, gpu_ring_staged_a),
    ])
}
