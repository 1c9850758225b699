//! kiln's `gemm` example against cuBLAS (`cublasGemmEx`, bf16 in, f32 compute, bf16 out) in
//! the same process on the same GPU and stream: each shape checked against cuBLAS on sampled
//! rows, then timed with CUDA events (the median, as TFLOP/s and kiln / cuBLAS). Options
//! (`--quick`, `--shapes`, `--iters`, `--set`, `--autotune`, `--b-col-major`, `--out`), the
//! shape list and the method: `docs/benchmarking.md`, "GEMM".
//!
//! Run on a GPU host: `bench_gemm --out bench/results/gemm.json [--target sm_90a]
//! [--b-col-major]`.

use std::process::ExitCode;

use clap::Parser;
use kiln_bench::cli::Args;
use kiln_bench::cublas::Cublas;
use kiln_bench::harness::{Progress, measure, tflops};
use kiln_bench::inputs::{copies, uniform};
use kiln_bench::report::{Table, comptime_text, meta, write_json};
use kiln_bench::{BenchError, kernels};
use kiln_examples::gemm::{GemmComptime, gemm, tuned_tile};
use kiln_ir::DType;
use kiln_ir::dsl::{Comptime, KernelDef};
use kiln_runtime::{Device, DeviceTensor, KernelArg, rotation_sets};
use kiln_tests::check::rel_error;
use serde_json::{Value, json};

/// bf16 output of two f32-accumulated GEMMs that sum in different orders.
const TOLERANCE: f64 = 1e-2;
/// Rows of `c` compared at each end of the matrix.
const CHECK_ROWS: usize = 128;
/// Most input sets kept on the device for rotation.
const MAX_SETS: usize = 32;

fn shapes(quick: bool) -> Vec<[usize; 3]> {
    if quick {
        return vec![[1024; 3], [4096; 3]];
    }
    let mut v: Vec<[usize; 3]> = [1024, 2048, 4096, 8192].iter().map(|&s| [s; 3]).collect();
    for n in [4096, 8192, 14336] {
        for k in [4096, 8192, 14336] {
            v.push([16384, n, k]);
        }
    }
    v.extend([[1000, 3000, 777], [127, 4095, 4096]]);
    v
}

fn main() -> ExitCode {
    kiln_bench::exit(
        run(),
        "at least one kiln result disagreed with cuBLAS (see the table)",
    )
}

/// The comptime values of shape `[m, n, k]` without `--autotune`: the gemm's tuned tile for
/// the device ([`tuned_tile`]) under the command line's own `--set` values, which win.
fn tuned(
    device: &Device,
    base: &GemmComptime,
    set: &[(String, String)],
    [m, n, k]: [usize; 3],
) -> Result<GemmComptime, BenchError> {
    let tile = tuned_tile(device.target(), [m, n, k], *base, device.multiprocessors());
    Ok(tile.with_defines(set)?)
}

/// `BMxBNxBK/STAGES` of a specialisation (`x2` after it for a 2-CTA cluster).
fn tile_text(c: &GemmComptime) -> String {
    let cluster = if c.CLUSTER_M > 1 { " x2" } else { "" };
    format!("{}x{}x{}/{}{cluster}", c.BM, c.BN, c.BK, c.STAGES)
}

/// Runs the sweep; `Ok(false)` if any configuration's results disagreed.
fn run() -> Result<bool, BenchError> {
    let args = Args::parse();
    let device = kernels::device(&args)?;
    let cublas = Cublas::new(&device)?;
    let base = GemmComptime {
        b_col_major: args.b_col_major,
        dtype: DType::Bf16,
        ..GemmComptime::default()
    };
    let comptime = base.with_defines(&args.set)?;
    // The grid of a specialisation: one block per `BM x BN` tile of `c`.
    let grid = |c: &GemmComptime, m: usize, n: usize| gemm.grid(c, [m, n, 1]);
    eprintln!(
        "{} ({}), kiln target {}, comptime {comptime:?}; each shape's tile (BMxBNxBK/STAGES) {}",
        device.name(),
        kiln_bench::report::COMMIT,
        device.target(),
        if args.autotune {
            "autotuned"
        } else {
            "tuned (tuned_tile) unless --set"
        }
    );

    let shapes = if args.shapes.is_empty() {
        shapes(args.quick)
    } else {
        args.shapes.clone()
    };
    let mut progress = Progress::new(shapes.len());
    let mut table = Table::new(&[
        "M",
        "N",
        "K",
        "tile",
        "kiln ms",
        "kiln TFLOP/s",
        "cuBLAS ms",
        "cuBLAS TFLOP/s",
        "ratio",
        "rel err",
    ]);
    let mut rows = Vec::new();
    let mut all_ok = true;
    for (i, &[m, n, k]) in shapes.iter().enumerate() {
        progress.step(&format!("gemm {m}x{n}x{k}"));
        let a_host = uniform(&[m, k], DType::Bf16, 2 * i as u64 + 1);
        let b_shape = if args.b_col_major { [n, k] } else { [k, n] };
        let b_host = uniform(&b_shape, DType::Bf16, 2 * i as u64 + 2);
        let set_bytes = 2 * (m * k + k * n + 2 * m * n);
        let sets = rotation_sets(set_bytes, device.l2_bytes(), MAX_SETS);
        let a = copies(&device, &a_host, sets)?;
        let b = copies(&device, &b_host, sets)?;
        let c_kiln = (0..sets)
            .map(|_| device.alloc(DType::Bf16, &[m, n]))
            .collect::<Result<Vec<_>, _>>()?;
        let c_ref = (0..sets)
            .map(|_| device.alloc(DType::Bf16, &[m, n]))
            .collect::<Result<Vec<_>, _>>()?;
        let launch_args = |s: usize| {
            [
                KernelArg::Tensor(&a[s]),
                KernelArg::Tensor(&b[s]),
                KernelArg::Tensor(&c_kiln[s]),
            ]
        };
        let (chosen, tuning) = if args.autotune {
            kernels::autotuned(
                &device,
                &gemm,
                &comptime,
                &["a", "b", "c"],
                &format!("{m}x{n}x{k}"),
                &mut |c| device.launch(&gemm, c, grid(c, m, n), &launch_args(0)),
            )?
        } else {
            (tuned(&device, &base, &args.set, [m, n, k])?, Value::Null)
        };
        let kiln = |s: usize| -> Result<(), BenchError> {
            let g = grid(&chosen, m, n);
            Ok(device.launch(&gemm, &chosen, g, &launch_args(s))?)
        };
        let peer = |s: usize| cublas.gemm_bf16(&a[s], &b[s], &c_ref[s], args.b_col_major);

        device.fill_nan(&c_kiln[0])?;
        kiln(0)?;
        peer(0)?;
        let err = sampled_error(&c_kiln[0], &c_ref[0])?;
        let ok = err < TOLERANCE;
        all_ok &= ok;

        let kt = measure(&device, args.warmup, args.iters, |r| kiln(r % sets))?;
        let ct = measure(&device, args.warmup, args.iters, |r| peer(r % sets))?;
        let flops = 2.0 * (m * n * k) as f64;
        let (kt_tf, ct_tf) = (tflops(flops, kt.median()), tflops(flops, ct.median()));
        table.row(vec![
            m.to_string(),
            n.to_string(),
            k.to_string(),
            tile_text(&chosen),
            format!("{:.3}", kt.median()),
            format!("{kt_tf:.1}"),
            format!("{:.3}", ct.median()),
            format!("{ct_tf:.1}"),
            format!("{:.3}", kt_tf / ct_tf),
            format!("{err:.1e}{}", if ok { "" } else { " WRONG" }),
        ]);
        rows.push(json!({
            "m": m,
            "n": n,
            "k": k,
            "flops": flops,
            "comptime": comptime_text(&chosen),
            "autotuned": args.autotune,
            "autotune_timings": tuning,
            "input_sets": sets,
            "kiln_ms_median": kt.median(),
            "kiln_ms_min": kt.min(),
            "kiln_tflops": kt_tf,
            "cublas_ms_median": ct.median(),
            "cublas_ms_min": ct.min(),
            "cublas_tflops": ct_tf,
            "ratio": kt_tf / ct_tf,
            "rel_error_vs_cublas": err,
            "correct": ok,
            "kiln_ms_all": kt.all(),
            "cublas_ms_all": ct.all(),
        }));
    }
    progress.finish();
    println!("{}", table.render());

    if let Some(path) = &args.out {
        let json = json!({
            "meta": meta(&device, "gemm"),
            "peer": "cuBLAS cublasGemmEx bf16/bf16/bf16, COMPUTE_32F",
            "b_col_major": args.b_col_major,
            "iters": args.iters,
            "warmup": args.warmup,
            "tolerance": TOLERANCE,
            "rows": rows,
        });
        write_json(path, &json)?;
    }
    Ok(all_ok)
}

/// Relative error of kiln's `c` against cuBLAS's on the first and last [`CHECK_ROWS`] rows.
fn sampled_error(kiln: &DeviceTensor, peer: &DeviceTensor) -> Result<f64, BenchError> {
    let m = kiln.shape()[0];
    let rows = CHECK_ROWS.min(m);
    let mut worst: f64 = 0.0;
    for start in [0, m - rows] {
        let x = kiln.narrow(0, start, rows)?.download()?;
        let y = peer.narrow(0, start, rows)?.download()?;
        let e = rel_error(&x.to_f64_vec(), &y.to_f64_vec());
        // NaN must win: `max` would drop it.
        worst = if e.is_nan() { e } else { worst.max(e) };
        if worst.is_nan() {
            break;
        }
    }
    Ok(worst)
}
