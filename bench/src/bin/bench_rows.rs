//! kiln's memory-bound row kernels, softmax, layer norm and RMS norm (`kiln_examples`), in
//! GB/s from Rust, each call timed alone behind a GPU hold; shapes, method and options are in
//! docs/benchmarking.md. Run on a GPU host: `.gpu/bin/bench_rows [--out OUT.json] [--quick]`.

use std::process::ExitCode;

use clap::Parser;
use kiln_bench::cli::Args;
use kiln_bench::harness::{Progress, measure};
use kiln_bench::inputs::{copies, uniform};
use kiln_bench::report::{Table, comptime_text, meta, write_json};
use kiln_bench::{BenchError, kernels};
use kiln_examples::layer_norm::{LayerNormComptime, layer_norm};
use kiln_examples::rms_norm::{RmsNormComptime, rms_norm};
use kiln_examples::rows::row_config;
use kiln_examples::softmax::{SoftmaxComptime, softmax};
use kiln_ir::dsl::{Comptime, KernelDef};
use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor, KernelArg, rotation_sets};
use kiln_tests::check::{as_stored, rel_error, tolerance};
use kiln_tests::reference;
use serde_json::json;

/// Rows checked at each end of the output.
const CHECK_ROWS: usize = 8;
/// Most input sets kept on the device for rotation.
const MAX_SETS: usize = 16;
/// Layer norm's and RMS norm's epsilon (PyTorch's defaults: 1e-5; RMS norm's is the dtype's
/// machine epsilon there, so the peer script passes this one explicitly).
const EPS: f32 = 1e-5;

/// The kernels timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Softmax,
    LayerNorm,
    RmsNorm,
}

impl Row {
    const ALL: [Row; 3] = [Row::Softmax, Row::LayerNorm, Row::RmsNorm];

    fn name(self) -> &'static str {
        match self {
            Row::Softmax => "softmax",
            Row::LayerNorm => "layer_norm",
            Row::RmsNorm => "rms_norm",
        }
    }

    /// Bytes one call must move for `x: [m, n]` of `dtype`: `x` read and `y` written, the
    /// weights (and bias) read, the f32 statistics written.
    fn bytes(self, m: usize, n: usize, dtype: DType) -> usize {
        let e = dtype.size_bytes();
        let xy = 2 * m * n * e;
        match self {
            Row::Softmax => xy,
            Row::LayerNorm => xy + 2 * n * e + 2 * 4 * m,
            Row::RmsNorm => xy + n * e + 4 * m,
        }
    }
}

fn shapes(quick: bool) -> Vec<[usize; 2]> {
    if quick {
        return vec![[4096, 8192]];
    }
    vec![
        [4096, 8192],
        [8192, 8192],
        [16384, 4096],
        [4096, 4097],
        [32768, 8192],
        [65536, 4096],
    ]
}

fn main() -> ExitCode {
    kiln_bench::exit(
        run(),
        "at least one kiln result disagreed with its reference (see the table)",
    )
}

/// The device tensors of one configuration: rotated inputs and outputs, shared weights.
struct Tensors {
    x: Vec<DeviceTensor>,
    y: Vec<DeviceTensor>,
    w: DeviceTensor,
    b: DeviceTensor,
    stat0: Vec<DeviceTensor>,
    stat1: Vec<DeviceTensor>,
}

/// One kernel's launch on input set `s`, with its comptime values as text.
struct Launcher<'a> {
    device: &'a Device,
    row: Row,
    m: usize,
    softmax: SoftmaxComptime,
    layer_norm: LayerNormComptime,
    rms_norm: RmsNormComptime,
}

impl Launcher<'_> {
    fn launch(&self, t: &Tensors, s: usize) -> Result<(), BenchError> {
        let (x, y) = (KernelArg::Tensor(&t.x[s]), KernelArg::Tensor(&t.y[s]));
        let m = self.m;
        match self.row {
            Row::Softmax => {
                let c = &self.softmax;
                let grid = softmax.grid(c, [m, 1, 1]);
                self.device.launch(&softmax, c, grid, &[x, y])?;
            }
            Row::LayerNorm => {
                let c = &self.layer_norm;
                let grid = layer_norm.grid(c, [m, 1, 1]);
                let args = [
                    x,
                    KernelArg::Tensor(&t.w),
                    KernelArg::Tensor(&t.b),
                    y,
                    KernelArg::Tensor(&t.stat0[s]),
                    KernelArg::Tensor(&t.stat1[s]),
                    KernelArg::F32(EPS),
                ];
                self.device.launch(&layer_norm, c, grid, &args)?;
            }
            Row::RmsNorm => {
                let c = &self.rms_norm;
                let grid = rms_norm.grid(c, [m, 1, 1]);
                let args = [
                    x,
                    KernelArg::Tensor(&t.w),
                    y,
                    KernelArg::Tensor(&t.stat0[s]),
                    KernelArg::F32(EPS),
                ];
                self.device.launch(&rms_norm, c, grid, &args)?;
            }
        }
        Ok(())
    }

    fn comptime(&self) -> String {
        match self.row {
            Row::Softmax => comptime_text(&self.softmax),
            Row::LayerNorm => comptime_text(&self.layer_norm),
            Row::RmsNorm => comptime_text(&self.rms_norm),
        }
    }
}

/// Rows `start..start + rows` of 2-D `t` as a contiguous host tensor.
fn rows_of(t: &HostTensor, start: usize, rows: usize) -> HostTensor {
    let n = t.shape[1];
    let v = t.to_f64_vec();
    HostTensor::from_fn(&[rows, n], t.dtype(), |i| v[start * n + i])
}

/// The relative error of `y`'s first and last [`CHECK_ROWS`] rows against the f64 reference
/// of `row` on the same rows of `x` (NaN wins).
fn check(
    row: Row,
    x: &HostTensor,
    w: &HostTensor,
    b: &HostTensor,
    y: &DeviceTensor,
) -> Result<f64, BenchError> {
    let (m, dtype) = (x.shape[0], x.dtype());
    let rows = CHECK_ROWS.min(m);
    let mut worst: f64 = 0.0;
    for start in [0, m - rows] {
        let xs = rows_of(x, start, rows);
        let want = match row {
            Row::Softmax => reference::softmax_rows(&xs),
            Row::LayerNorm => reference::layer_norm_rows(&xs, w, b, f64::from(EPS)).0,
            Row::RmsNorm => reference::rms_norm_rows(&xs, w, f64::from(EPS)).0,
        };
        let got = y.narrow(0, start, rows)?.download()?;
        let e = rel_error(&got.to_f64_vec(), &as_stored(&want, dtype));
        worst = if e.is_nan() { e } else { worst.max(e) };
        if worst.is_nan() {
            break;
        }
    }
    Ok(worst)
}

/// Runs the sweep; `Ok(false)` if any configuration's results disagreed.
fn run() -> Result<bool, BenchError> {
    let args = Args::parse();
    let device = kernels::device(&args)?;
    eprintln!(
        "{} ({}), kiln target {}",
        device.name(),
        kiln_bench::report::COMMIT,
        device.target()
    );
    let configs: Vec<(Row, DType, [usize; 2])> = shapes(args.quick)
        .into_iter()
        .flat_map(|s| {
            [DType::F32, DType::Bf16]
                .into_iter()
                .flat_map(move |d| Row::ALL.into_iter().map(move |r| (r, d, s)))
        })
        .collect();
    let mut progress = Progress::new(configs.len());
    let mut table = Table::new(&[
        "kernel",
        "dtype",
        "M",
        "N",
        "kiln ms",
        "kiln GB/s",
        "rel err",
    ]);
    let mut out_rows = Vec::new();
    let mut all_ok = true;
    for (i, &(row, dtype, [m, n])) in configs.iter().enumerate() {
        progress.step(&format!("{} {dtype} {m}x{n}", row.name()));
        let x_host = uniform(&[m, n], dtype, 3 * i as u64 + 1);
        let w_host = uniform(&[n], dtype, 3 * i as u64 + 2);
        let b_host = uniform(&[n], dtype, 3 * i as u64 + 3);
        let bytes = row.bytes(m, n, dtype);
        let sets = rotation_sets(bytes, device.l2_bytes(), MAX_SETS);
        let alloc = |d: DType, shape: &[usize]| -> Result<Vec<DeviceTensor>, BenchError> {
            (0..sets)
                .map(|_| device.alloc(d, shape).map_err(BenchError::from))
                .collect()
        };
        let t = Tensors {
            x: copies(&device, &x_host, sets)?,
            y: alloc(dtype, &[m, n])?,
            w: device.upload(&w_host)?,
            b: device.upload(&b_host)?,
            stat0: alloc(DType::F32, &[m])?,
            stat1: alloc(DType::F32, &[m])?,
        };
        let rc = row_config(n);
        let launcher = Launcher {
            device: &device,
            row,
            m,
            softmax: SoftmaxComptime {
                BM: rc.bm,
                BN: rc.bn,
                NW: rc.nw,
                dtype,
            }
            .with_defines(&args.set)?,
            layer_norm: LayerNormComptime {
                BM: rc.bm,
                BN: rc.bn,
                NW: rc.nw,
                dtype,
            }
            .with_defines(&args.set)?,
            rms_norm: RmsNormComptime {
                BM: rc.bm,
                BN: rc.bn,
                NW: rc.nw,
                dtype,
            }
            .with_defines(&args.set)?,
        };
        device.fill_nan(&t.y[0])?;
        launcher.launch(&t, 0)?;
        let err = check(row, &x_host, &w_host, &b_host, &t.y[0])?;
        let ok = err <= tolerance(dtype);
        all_ok &= ok;
        let kt = measure(&device, args.warmup, args.iters, |r| {
            launcher.launch(&t, r % sets)
        })?;
        let gbs = bytes as f64 / (kt.median() * 1e-3) / 1e9;
        table.row(vec![
            row.name().to_string(),
            dtype.to_string(),
            m.to_string(),
            n.to_string(),
            format!("{:.4}", kt.median()),
            format!("{gbs:.0}"),
            format!("{err:.1e}{}", if ok { "" } else { " WRONG" }),
        ]);
        out_rows.push(json!({
            "kernel": row.name(),
            "dtype": dtype.to_string(),
            "m": m,
            "n": n,
            "bytes": bytes,
            "comptime": launcher.comptime(),
            "input_sets": sets,
            "kiln_ms_median": kt.median(),
            "kiln_ms_min": kt.min(),
            "kiln_gbs": gbs,
            "rel_error_sampled_rows": err,
            "correct": ok,
            "kiln_ms_all": kt.all(),
        }));
    }
    progress.finish();
    println!("{}", table.render());
    if let Some(path) = &args.out {
        let json = json!({
            "meta": meta(&device, "rows"),
            "iters": args.iters,
            "warmup": args.warmup,
            "eps": EPS,
            "rows": out_rows,
        });
        write_json(path, &json)?;
    }
    Ok(all_ok)
}
