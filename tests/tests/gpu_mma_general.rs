//! The kernels of `mma_kernels/` on the GPU, compiled for sm_80 and (on Hopper) sm_90a, each
//! against the f64 reference and against the interpreter: an mma outside any loop, two mma
//! loops with transposed register operands, a register B, a masked A, operands masked at a
//! bound and a B masked or gathered (what they must not read NaN), a persistent loop with a
//! runtime stride, an mma in a runtime `if`; shapes no multiple of the tiles, every input
//! distribution, outputs poisoned. Skips itself without a GPU.

mod gpu_common;
mod mma_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, check, devices, poisoned_output as output};
use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor};
use kiln_tests::check::{Case, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::sweep::sweep;
use mma_kernels::*;

/// `(m, n, k)`: none a multiple of the 64 x 64 x 32 tiles.
const SHAPES: [(usize, usize, usize); 3] = [(70, 130, 50), (129, 65, 100), (1, 3, 17)];

/// Runs `launch` and `interpret` of a kernel `(a, b, c)` over every shape and distribution.
fn gemm_like(
    name: &str,
    shapes: &[(usize, usize, usize)],
    grid: impl Fn(usize, usize) -> [u32; 3],
    want: impl Fn(&HostTensor, &HostTensor) -> Vec<f64>,
    launch: impl Fn(&Device, [u32; 3], &DeviceTensor, &DeviceTensor, &DeviceTensor),
    interpret: impl Fn([u32; 3], &HostTensor, &HostTensor, &mut HostTensor),
) {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let kernel = format!("{name} on {}", dev.target());
        let label = |(m, n, k)| format!("m={m} n={n} k={k}");
        sweep(
            &mut rng,
            &kernel,
            shapes.iter().copied(),
            &Dist::ALL,
            label,
            |rng, (m, n, k), case| {
                let a = tensor(rng, &[m, k], DType::Bf16, case.dist);
                let b = tensor(rng, &[k, n], DType::Bf16, case.dist);
                let (da, db) = (
                    dev.upload(&a).expect("upload"),
                    dev.upload(&b).expect("upload"),
                );
                let c = output(&dev, DType::F32, &[m, n]);
                launch(&dev, grid(m, n), &da, &db, &c);
                let mut ci = poisoned(&[m, n], DType::F32);
                interpret(grid(m, n), &a, &b, &mut ci);
                check(case, &c, &want(&a, &b), &ci, tolerance(DType::Bf16));
            },
        );
    }
}

fn tiles(m: usize, n: usize) -> [u32; 3] {
    [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1]
}

fn gpu_mma_once() {
    let ct = MmaOnceComptime::default();
    gemm_like(
        "mma_once",
        &[(70, 130, 32), (129, 65, 17), (1, 3, 1)],
        tiles,
        gemm,
        |dev, g, a, b, c| mma_once.launch(dev, &ct, g, a, b, c).expect("launch"),
        |g, a, b, c| mma_once.interpret(&ct, g, a, b, c).expect("interpret"),
    );
}

fn gpu_mma_register_b() {
    let ct = MmaRegisterBComptime::default();
    gemm_like(
        "mma_register_b",
        &SHAPES,
        tiles,
        gemm_exp_b,
        |dev, g, a, b, c| mma_register_b.launch(dev, &ct, g, a, b, c).expect("launch"),
        |g, a, b, c| {
            mma_register_b
                .interpret(&ct, g, a, b, c)
                .expect("interpret")
        },
    );
}

fn gpu_mma_masked() {
    // `(BM, NW)`: comptime warp counts, each launched with its own block size.
    for (bm, nw) in [(64, 4), (64, 2), (128, 8)] {
        let ct = MmaMaskedComptime {
            BM: bm,
            NW: nw,
            ..MmaMaskedComptime::default()
        };
        gemm_like(
            &format!("mma_masked BM={bm} NW={nw}"),
            &SHAPES,
            |m, n| [m.div_ceil(bm) as u32, n.div_ceil(64) as u32, 1],
            gemm_tril_a,
            |dev, g, a, b, c| mma_masked.launch(dev, &ct, g, a, b, c).expect("launch"),
            |g, a, b, c| mma_masked.interpret(&ct, g, a, b, c).expect("interpret"),
        );
    }
}

fn gpu_mma_persistent() {
    let ct = MmaPersistentComptime::default();
    for blocks in [3u32, 64] {
        gemm_like(
            &format!("mma_persistent ({blocks} blocks)"),
            &SHAPES,
            |_, _| [blocks, 1, 1],
            gemm,
            |dev, g, a, b, c| mma_persistent.launch(dev, &ct, g, a, b, c).expect("launch"),
            |g, a, b, c| {
                mma_persistent
                    .interpret(&ct, g, a, b, c)
                    .expect("interpret")
            },
        );
    }
}

fn gpu_mma_in_if() {
    let ct = MmaInIfComptime::default();
    for flag in [1, 0] {
        let sign = if flag > 0 { 1.0 } else { -1.0 };
        gemm_like(
            &format!("mma_in_if (flag {flag})"),
            &SHAPES,
            tiles,
            |a, b| gemm(a, b).iter().map(|x| sign * x).collect(),
            |dev, g, a, b, c| {
                mma_in_if
                    .launch(dev, &ct, g, a, b, c, flag)
                    .expect("launch")
            },
            |g, a, b, c| {
                mma_in_if
                    .interpret(&ct, g, a, b, c, flag)
                    .expect("interpret")
            },
        );
    }
}

fn gpu_mma_row_centered() {
    let ct = MmaRowCenteredComptime::default();
    gemm_like(
        "mma_row_centered",
        &[(70, 200, 50), (129, 65, 100), (1, 3, 17)],
        |m, n| [m.div_ceil(ct.BM) as u32, n.div_ceil(ct.BN) as u32, 1],
        |a, b| gemm_row_centered(a, b, ct.BN),
        |dev, g, a, b, c| {
            mma_row_centered
                .launch(dev, &ct, g, a, b, c)
                .expect("launch")
        },
        |g, a, b, c| {
            mma_row_centered
                .interpret(&ct, g, a, b, c)
                .expect("interpret")
        },
    );
}

fn gpu_mma_two_loops() {
    let mut rng = Rng::from_env();
    let ct = MmaTwoLoopsComptime::default();
    for dev in devices() {
        for (sq, sk) in [(100, 70), (64, 129), (3, 5)] {
            for dist in Dist::ALL {
                let d = ct.D;
                let q = tensor(&mut rng, &[sq, d], DType::Bf16, dist);
                let k = tensor(&mut rng, &[sk, d], DType::Bf16, dist);
                let scale = 1.0 / (d as f32).sqrt();
                let grid = [sk.div_ceil(ct.BN) as u32, 1, 1];
                let (dq, dk_in) = (
                    dev.upload(&q).expect("upload"),
                    dev.upload(&k).expect("upload"),
                );
                let (dv, dk) = (
                    output(&dev, DType::F32, &[sk, d]),
                    output(&dev, DType::F32, &[sk, d]),
                );
                mma_two_loops
                    .launch(&dev, &ct, grid, &dq, &dk_in, &dv, &dk, scale)
                    .expect("launch");
                let mut dvi = poisoned(&[sk, d], DType::F32);
                let mut dki = poisoned(&[sk, d], DType::F32);
                mma_two_loops
                    .interpret(&ct, grid, &q, &k, &mut dvi, &mut dki, scale)
                    .expect("interpret");
                let (want_v, want_k) = two_loops(&q, &k, f64::from(scale));
                let case = |what: &str| Case {
                    kernel: format!("mma_two_loops {what} on {}", dev.target()),
                    shape: format!("sq={sq} sk={sk} d={d}"),
                    dist,
                    seed: rng.seed(),
                };
                check(&case("dv"), &dv, &want_v, &dvi, tolerance(DType::Bf16));
                check(&case("dk"), &dk, &want_k, &dki, tolerance(DType::Bf16));
            }
        }
    }
}

/// Poisons (NaN) the elements of `t` (`[rows, cols]`) that `keep(row, col)` rejects: what a
/// masked load must never read.
fn poison_outside(t: &mut HostTensor, keep: impl Fn(usize, usize) -> bool) {
    let cols = t.shape[1];
    for i in 0..t.data.len() {
        if !keep(i / cols, i % cols) {
            t.data.set_f64(i, f64::NAN);
        }
    }
}

/// `mma_bounded` (A and B loaded masked at `klim` along K: copied into shared memory clipped
/// at the bound) and `mma_masked_b` (B masked along both dimensions: staged from registers),
/// every element past the bounds NaN, so a read past them shows.
fn gpu_mma_masked_operands() {
    let mut rng = Rng::from_env();
    let (bounded, masked_b) = (MmaBoundedComptime::default(), MmaMaskedBComptime::default());
    for dev in devices() {
        for &(m, n, k) in &SHAPES {
            for dist in Dist::ALL {
                for klim in [k * 3 / 4 + 1, k + 9, 0] {
                    let nlim = n * 2 / 3 + 1;
                    let a_all = tensor(&mut rng, &[m, k], DType::Bf16, dist);
                    let mut a = a_all.clone();
                    poison_outside(&mut a, |_, p| p < klim);
                    let mut b_k = tensor(&mut rng, &[k, n], DType::Bf16, dist);
                    let mut b_kn = b_k.clone();
                    poison_outside(&mut b_k, |p, _| p < klim);
                    poison_outside(&mut b_kn, |p, j| p < klim && j < nlim);
                    let up = |t: &HostTensor| dev.upload(t).expect("upload");
                    let (da, da_all, db_k, db_kn) = (up(&a), up(&a_all), up(&b_k), up(&b_kn));
                    let g = tiles(m, n);
                    let case = |what: &str| Case {
                        kernel: format!("{what} on {}", dev.target()),
                        shape: format!("m={m} n={n} k={k} klim={klim} nlim={nlim}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let kl = klim as i32;
                    let c = output(&dev, DType::F32, &[m, n]);
                    mma_bounded
                        .launch(&dev, &bounded, g, &da, &db_k, &c, kl)
                        .expect("launch");
                    let mut ci = poisoned(&[m, n], DType::F32);
                    mma_bounded
                        .interpret(&bounded, g, &a, &b_k, &mut ci, kl)
                        .expect("interpret");
                    let want = gemm_bounded(&a, &b_k, klim, n);
                    check(&case("mma_bounded"), &c, &want, &ci, tolerance(DType::Bf16));
                    let c = output(&dev, DType::F32, &[m, n]);
                    let nl = nlim as i32;
                    mma_masked_b
                        .launch(&dev, &masked_b, g, &da_all, &db_kn, &c, kl, nl)
                        .expect("launch");
                    let mut ci = poisoned(&[m, n], DType::F32);
                    mma_masked_b
                        .interpret(&masked_b, g, &a_all, &b_kn, &mut ci, kl, nl)
                        .expect("interpret");
                    let want = gemm_bounded(&a_all, &b_kn, klim, nlim);
                    check(
                        &case("mma_masked_b"),
                        &c,
                        &want,
                        &ci,
                        tolerance(DType::Bf16),
                    );
                }
            }
        }
    }
}

fn gpu_mma_gathered_b() {
    let ct = MmaGatheredBComptime::default();
    gemm_like(
        "mma_gathered_b",
        &SHAPES,
        tiles,
        gemm_gathered_b,
        |dev, g, a, b, c| mma_gathered_b.launch(dev, &ct, g, a, b, c).expect("launch"),
        |g, a, b, c| {
            mma_gathered_b
                .interpret(&ct, g, a, b, c)
                .expect("interpret")
        },
    );
}

fn main() -> ExitCode {
    gpu_common::run(&[
        ("gpu_mma_once", Needs::Gpu, gpu_mma_once),
        ("gpu_mma_register_b", Needs::Gpu, gpu_mma_register_b),
        ("gpu_mma_masked", Needs::Gpu, gpu_mma_masked),
        ("gpu_mma_persistent", Needs::Gpu, gpu_mma_persistent),
        ("gpu_mma_in_if", Needs::Gpu, gpu_mma_in_if),
        ("gpu_mma_two_loops", Needs::Gpu, gpu_mma_two_loops),
        (
            "gpu_mma_masked_operands",
            Needs::Gpu,
            gpu_mma_masked_operands,
        ),
        ("gpu_mma_gathered_b", Needs::Gpu, gpu_mma_gathered_b),
        ("gpu_mma_row_centered", Needs::Gpu, gpu_mma_row_centered),
    ])
}
