//! The `tiles_3d_kernels` (tiles of rank 3 and 4: multi-head RMS norm, heads merged and split
//! by `reshape`, `permute`, reductions over every dimension, a rank-4 mean) on the GPU,
//! compiled for sm_80 and, on Hopper, sm_90a: against the f64 reference and the interpreter,
//! shapes that are no multiple of the tiles, every input distribution, outputs poisoned with
//! NaN, inputs with padded rows. Skips itself without a GPU.

mod gpu_common;
mod tiles_3d_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, check, devices, poisoned_output as output, upload_padded};
use kiln_ir::DType;
use kiln_ir::dsl::KernelDef;
use kiln_tests::check::{Case, as_stored, poisoned, sum_tolerance, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::sweep::{dims, sweep};
use tiles_3d_kernels::*;

fn gpu_qk_norm() {
    let mut rng = Rng::from_env();
    let eps = 1e-6f32;
    for dev in devices() {
        for (bt, bh, bd, dtype) in [
            (4, 8, 128, DType::F32),
            (4, 8, 128, DType::Bf16),
            (2, 4, 64, DType::F16),
        ] {
            let c = QkNormComptime {
                BT: bt,
                BH: bh,
                BD: bd,
                dtype,
            };
            let shapes = [[1, 1, 1], [3, 5, 7], [1000, bh, bd], [77, bh - 1, bd - 28]]
                .map(|[t, h, d]| [t, h.min(bh), d.min(bd)]);
            let kernel = format!(
                "qk_norm BT={bt} BH={bh} BD={bd} {dtype} on {}",
                dev.target()
            );
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [t, h, d], case| {
                    let x = tensor(rng, &[t, h, d], dtype, case.dist);
                    let w = tensor(rng, &[d], dtype, Dist::Normal);
                    let grid = qk_norm.grid(&c, [t, 1, 1]);
                    let y = output(&dev, dtype, &[t, h, d]);
                    let (dx, dw) = (upload_padded(&dev, &x, 8), dev.upload(&w).expect("upload"));
                    qk_norm
                        .launch(&dev, &c, grid, &dx, &dw, &y, eps)
                        .expect("launch");
                    let mut yi = poisoned(&[t, h, d], dtype);
                    qk_norm
                        .interpret(&c, grid, &x, &w, &mut yi, eps)
                        .expect("interpret");
                    let want = as_stored(&qk_norm_ref(&x, &w, f64::from(eps)), dtype);
                    check(case, &y, &want, &yi, tolerance(dtype).max(sum_tolerance(d)));
                },
            );
        }
    }
}

fn gpu_merge_split_heads() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bb, h, d) in [(8, 4, 64), (2, 8, 32), (4, 2, 128)] {
            let c = MergeHeadsComptime { BB: bb, H: h, D: d };
            let s = SplitHeadsComptime { BB: bb, H: h, D: d };
            let shapes = [1, 3, 2 * bb + 1, 301];
            let kernel = format!("merge_heads BB={bb} H={h} D={d} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                |b: usize| format!("b={b}"),
                |rng, b, case| {
                    let x = tensor(rng, &[b, h, d], DType::F32, case.dist);
                    let grid = merge_heads.grid(&c, [b, 1, 1]);
                    let y = output(&dev, DType::F32, &[b, h * d]);
                    let dx = upload_padded(&dev, &x, 4);
                    merge_heads.launch(&dev, &c, grid, &dx, &y).expect("launch");
                    let mut yi = poisoned(&[b, h * d], DType::F32);
                    merge_heads
                        .interpret(&c, grid, &x, &mut yi)
                        .expect("interpret");
                    check(case, &y, &merge_heads_ref(&x), &yi, tolerance(DType::F32));

                    let x2 = tensor(rng, &[b, h * d], DType::F32, case.dist);
                    let y2 = output(&dev, DType::F32, &[b, h, d]);
                    let dx2 = upload_padded(&dev, &x2, 4);
                    split_heads
                        .launch(&dev, &s, grid, &dx2, &y2)
                        .expect("launch");
                    let mut y2i = poisoned(&[b, h, d], DType::F32);
                    split_heads
                        .interpret(&s, grid, &x2, &mut y2i)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("split_heads BB={bb} H={h} D={d} on {}", dev.target()),
                        ..case.clone()
                    };
                    let want = split_heads_ref(&x2, d);
                    check(&case, &y2, &want, &y2i, tolerance(DType::F32));
                },
            );
        }
    }
}

fn gpu_permute_heads() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bb, bh, bd, dtype) in [
            (4, 8, 8, DType::F32),
            (2, 4, 64, DType::Bf16),
            (8, 2, 32, DType::F32),
        ] {
            let c = PermuteHeadsComptime {
                BB: bb,
                BH: bh,
                BD: bd,
                dtype,
            };
            let shapes = [[1, 1, 1], [3, 5, 7], [257, bh, bd], [bb, bh - 1, bd - 1]]
                .map(|[b, h, d]| [b, h.min(bh), d.min(bd)]);
            let kernel = format!(
                "permute_heads BB={bb} BH={bh} BD={bd} {dtype} on {}",
                dev.target()
            );
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [b, h, d], case| {
                    let x = tensor(rng, &[b, h, d], dtype, case.dist);
                    let grid = permute_heads.grid(&c, [b, 1, 1]);
                    let hb = output(&dev, dtype, &[h, b, d]);
                    let bdh = output(&dev, dtype, &[b, d, h]);
                    let dx = upload_padded(&dev, &x, 3);
                    permute_heads
                        .launch(&dev, &c, grid, &dx, &hb, &bdh)
                        .expect("launch");
                    let mut hbi = poisoned(&[h, b, d], dtype);
                    let mut bdhi = poisoned(&[b, d, h], dtype);
                    permute_heads
                        .interpret(&c, grid, &x, &mut hbi, &mut bdhi)
                        .expect("interpret");
                    let (rhb, rbdh) = permute_heads_ref(&x);
                    check(case, &hb, &rhb, &hbi, 0.0);
                    check(case, &bdh, &rbdh, &bdhi, 0.0);
                },
            );
        }
    }
}

fn gpu_reduce_dims() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bt, bh, bd) in [(4, 8, 8), (8, 4, 32), (2, 16, 64)] {
            let c = ReduceDimsComptime {
                BT: bt,
                BH: bh,
                BD: bd,
            };
            let shapes = [[1, 1, 1], [3, 5, 7], [999, bh, bd], [bt, bh - 1, bd - 3]]
                .map(|[t, h, d]| [t, h.min(bh), d.min(bd)]);
            let kernel = format!("reduce_dims BT={bt} BH={bh} BD={bd} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [t, h, d], case| {
                    let x = tensor(rng, &[t, h, d], DType::F32, case.dist);
                    let blocks = t.div_ceil(bt);
                    let grid = reduce_dims.grid(&c, [t, 1, 1]);
                    let s = output(&dev, DType::F32, &[blocks, h, d]);
                    let mx = output(&dev, DType::F32, &[t, d]);
                    let mn = output(&dev, DType::F32, &[t, h]);
                    let dx = upload_padded(&dev, &x, 5);
                    reduce_dims
                        .launch(&dev, &c, grid, &dx, &s, &mx, &mn)
                        .expect("launch");
                    let mut si = poisoned(&[blocks, h, d], DType::F32);
                    let mut mxi = poisoned(&[t, d], DType::F32);
                    let mut mni = poisoned(&[t, h], DType::F32);
                    reduce_dims
                        .interpret(&c, grid, &x, &mut si, &mut mxi, &mut mni)
                        .expect("interpret");
                    let (rs, rmx, rmn) = reduce_dims_ref(&x, bt);
                    check(case, &s, &rs, &si, sum_tolerance(bt));
                    check(case, &mx, &rmx, &mxi, 0.0);
                    check(case, &mn, &rmn, &mni, 0.0);
                },
            );
        }
    }
}

fn gpu_center_seq() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bh, bs, bd) in [(4, 8, 16), (2, 32, 4), (8, 4, 64)] {
            let c = CenterSeqComptime {
                BH: bh,
                BS: bs,
                BD: bd,
            };
            let shapes = [[1, 1, 1, 1], [3, 3, 5, 7], [65, bh, bs, bd]]
                .map(|[b, h, s, d]| [b, h.min(bh), s.min(bs), d.min(bd)]);
            let kernel = format!("center_seq BH={bh} BS={bs} BD={bd} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [b, h, s, d], case| {
                    let x = tensor(rng, &[b, h, s, d], DType::F32, case.dist);
                    let grid = center_seq.grid(&c, [b, 1, 1]);
                    let y = output(&dev, DType::F32, &[b, h, s, d]);
                    let dx = upload_padded(&dev, &x, 1);
                    center_seq.launch(&dev, &c, grid, &dx, &y).expect("launch");
                    let mut yi = poisoned(&[b, h, s, d], DType::F32);
                    center_seq
                        .interpret(&c, grid, &x, &mut yi)
                        .expect("interpret");
                    let want = center_seq_ref(&x);
                    let xn = x.to_f64_vec().iter().map(|v| v * v).sum::<f64>().sqrt();
                    let rn = want.iter().map(|v| v * v).sum::<f64>().sqrt();
                    let tol = sum_tolerance(s) * (xn / rn.max(f64::MIN_POSITIVE)).max(1.0);
                    check(case, &y, &want, &yi, tol);
                },
            );
        }
    }
}

fn gpu_sub_max_mid() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bb, bs, bd) in [(2, 96, 32), (4, 96, 8), (1, 192, 16)] {
            let c = SubMaxMidComptime {
                BB: bb,
                BS: bs,
                BD: bd,
            };
            let shapes = [
                [1, 1, 1],
                [3, 50, 7],
                [2 * bb + 1, bs, bd],
                [129, bs - 1, bd],
            ]
            .map(|[b, s, d]| [b, s.min(bs), d.min(bd)]);
            let kernel = format!("sub_max_mid BB={bb} BS={bs} BD={bd} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [b, s, d], case| {
                    let x = tensor(rng, &[b, s, d], DType::F32, case.dist);
                    let grid = sub_max_mid.grid(&c, [b, 1, 1]);
                    let y = output(&dev, DType::F32, &[b, s, d]);
                    let dx = upload_padded(&dev, &x, 2);
                    sub_max_mid.launch(&dev, &c, grid, &dx, &y).expect("launch");
                    let mut yi = poisoned(&[b, s, d], DType::F32);
                    sub_max_mid
                        .interpret(&c, grid, &x, &mut yi)
                        .expect("interpret");
                    check(case, &y, &sub_max_mid_ref(&x), &yi, tolerance(DType::F32));
                },
            );
        }
    }
}

fn gpu_transpose_tile() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bm, bn, dtype) in [
            (32, 64, DType::F32),
            (64, 16, DType::Bf16),
            (8, 128, DType::F32),
        ] {
            let c = TransposeTileComptime {
                BM: bm,
                BN: bn,
                dtype,
            };
            let shapes = [
                [1, 1],
                [3, 5],
                [2 * bm + 1, bn + 3],
                [bm, 3 * bn],
                [1000, 777],
            ];
            let kernel = format!("transpose_tile BM={bm} BN={bn} {dtype} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [m, n], case| {
                    let x = tensor(rng, &[m, n], dtype, case.dist);
                    let grid = transpose_tile.grid(&c, [m, n, 1]);
                    let y = output(&dev, dtype, &[n, m]);
                    let z = output(&dev, dtype, &[n, 1, m]);
                    let dx = upload_padded(&dev, &x, 8);
                    transpose_tile
                        .launch(&dev, &c, grid, &dx, &y, &z)
                        .expect("launch");
                    let mut yi = poisoned(&[n, m], dtype);
                    let mut zi = poisoned(&[n, 1, m], dtype);
                    transpose_tile
                        .interpret(&c, grid, &x, &mut yi, &mut zi)
                        .expect("interpret");
                    let (ry, rz) = transpose_tile_ref(&x);
                    check(case, &y, &as_stored(&ry, dtype), &yi, tolerance(dtype));
                    check(case, &z, &rz, &zi, 0.0);
                },
            );
        }
    }
}

fn gpu_broadcast_ranks() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bt, bh, bd) in [(2, 8, 32), (4, 2, 128), (1, 16, 8)] {
            let c = BroadcastRanksComptime {
                BT: bt,
                BH: bh,
                BD: bd,
            };
            let shapes = [
                [1, 1, 1],
                [3, 5, 7],
                [2 * bt + 1, bh, bd],
                [333, bh - 1, bd],
            ]
            .map(|[t, h, d]| [t, h.min(bh), d.min(bd)]);
            let kernel = format!(
                "broadcast_ranks BT={bt} BH={bh} BD={bd} on {}",
                dev.target()
            );
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [t, h, d], case| {
                    let x = tensor(rng, &[t, h, d], DType::F32, case.dist);
                    let b = tensor(rng, &[d], DType::F32, case.dist);
                    let g = tensor(rng, &[h, d], DType::F32, case.dist);
                    let grid = broadcast_ranks.grid(&c, [t, 1, 1]);
                    let y = output(&dev, DType::F32, &[t, h, d]);
                    let (dx, db, dg) = (
                        upload_padded(&dev, &x, 4),
                        dev.upload(&b).expect("upload"),
                        upload_padded(&dev, &g, 1),
                    );
                    broadcast_ranks
                        .launch(&dev, &c, grid, &dx, &db, &dg, &y)
                        .expect("launch");
                    let mut yi = poisoned(&[t, h, d], DType::F32);
                    broadcast_ranks
                        .interpret(&c, grid, &x, &b, &g, &mut yi)
                        .expect("interpret");
                    let want = broadcast_ranks_ref(&x, &b, &g);
                    check(case, &y, &want, &yi, tolerance(DType::F32));
                },
            );
        }
    }
}

fn gpu_keep_heads() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bt, bh, bd) in [(2, 8, 32), (4, 4, 64)] {
            let c = KeepHeadsComptime {
                BT: bt,
                BH: bh,
                BD: bd,
            };
            for (t, h, d, keep) in [(3, 3, 7, 2), (101, bh, bd, bh as i32 - 1), (9, bh, 30, -1)] {
                let x = tensor(&mut rng, &[t, h, d], DType::F32, Dist::Normal);
                let init = tensor(&mut rng, &[t, h, d], DType::F32, Dist::Uniform);
                let grid = keep_heads.grid(&c, [t, 1, 1]);
                let y = dev.upload(&init).expect("upload");
                let dx = upload_padded(&dev, &x, 4);
                keep_heads
                    .launch(&dev, &c, grid, &dx, &y, keep)
                    .expect("launch");
                let mut yi = init.clone();
                keep_heads
                    .interpret(&c, grid, &x, &mut yi, keep)
                    .expect("interpret");
                let old = init.to_f64_vec();
                let want: Vec<f64> = x
                    .to_f64_vec()
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        if (i / d) % h < keep.max(0) as usize {
                            v * 3.0
                        } else {
                            old[i]
                        }
                    })
                    .collect();
                let case = Case {
                    kernel: format!("keep_heads BT={bt} BH={bh} BD={bd} on {}", dev.target()),
                    shape: format!("[{t}, {h}, {d}] keep={keep}"),
                    dist: Dist::Normal,
                    seed: rng.seed(),
                };
                check(&case, &y, &want, &yi, tolerance(DType::F32));
            }
        }
    }
}

fn gpu_chunk_stats() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bt, bh, bd) in [(2, 8, 64), (4, 4, 32), (1, 2, 128)] {
            let c = ChunkStatsComptime {
                BT: bt,
                BH: bh,
                BD: bd,
            };
            let shapes = [
                [1, 1, 1],
                [3, 5, 7],
                [2 * bt + 1, bh, 3 * bd + 5],
                [500, bh, 1000],
            ]
            .map(|[t, h, d]| [t, h.min(bh), d]);
            let kernel = format!("chunk_stats BT={bt} BH={bh} BD={bd} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                dims,
                |rng, [t, h, d], case| {
                    let x = tensor(rng, &[t, h, d], DType::F32, case.dist);
                    let grid = chunk_stats.grid(&c, [t, 1, 1]);
                    let s = output(&dev, DType::F32, &[t, h]);
                    let mx = output(&dev, DType::F32, &[t, h]);
                    let dx = upload_padded(&dev, &x, 3);
                    chunk_stats
                        .launch(&dev, &c, grid, &dx, &s, &mx)
                        .expect("launch");
                    let mut si = poisoned(&[t, h], DType::F32);
                    let mut mxi = poisoned(&[t, h], DType::F32);
                    chunk_stats
                        .interpret(&c, grid, &x, &mut si, &mut mxi)
                        .expect("interpret");
                    let (rs, rm) = chunk_stats_ref(&x);
                    check(case, &s, &rs, &si, sum_tolerance(d));
                    check(case, &mx, &rm, &mxi, 0.0);
                },
            );
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        ("gpu_tiles_3d_qk_norm", Needs::Gpu, gpu_qk_norm),
        (
            "gpu_tiles_3d_merge_split_heads",
            Needs::Gpu,
            gpu_merge_split_heads,
        ),
        ("gpu_tiles_3d_permute_heads", Needs::Gpu, gpu_permute_heads),
        ("gpu_tiles_3d_reduce_dims", Needs::Gpu, gpu_reduce_dims),
        ("gpu_tiles_3d_center_seq", Needs::Gpu, gpu_center_seq),
        ("gpu_tiles_3d_sub_max_mid", Needs::Gpu, gpu_sub_max_mid),
        (
            "gpu_tiles_3d_transpose_tile",
            Needs::Gpu,
            gpu_transpose_tile,
        ),
        (
            "gpu_tiles_3d_broadcast_ranks",
            Needs::Gpu,
            gpu_broadcast_ranks,
        ),
        ("gpu_tiles_3d_keep_heads", Needs::Gpu, gpu_keep_heads),
        ("gpu_tiles_3d_chunk_stats", Needs::Gpu, gpu_chunk_stats),
    ])
}
