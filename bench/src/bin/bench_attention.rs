//! kiln's `attention` example over the standard sweep (docs/benchmarking.md, which also has the
//! method and options), each point checked against an f64 reference and timed alone behind a
//! GPU hold, with the time to compile and load each specialisation.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use clap::Parser;
use kiln_bench::cli::Args;
use kiln_bench::harness::{Progress, measure, tflops};
use kiln_bench::inputs::{copies, uniform};
use kiln_bench::report::{Table, comptime_text, meta, write_json};
use kiln_bench::{BenchError, kernels};
use kiln_examples::attention::{AttentionParams, attention};
use kiln_ir::dsl::{Comptime, KernelDef, Spec};
use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor, DiskCache, Origin, rotation_sets};
use kiln_tests::check::rel_error;
use kiln_tests::reference::attention_row;
use serde_json::{Value, json};

/// Tokens per configuration (b * s).
const TOKENS: usize = 16384;
/// Model width (h * d).
const WIDTH: usize = 2048;
/// Query rows checked against the f64 reference per configuration.
const CHECK_ROWS: usize = 16;
/// bf16 output tolerance (relative L2 over the checked rows).
const TOLERANCE: f64 = 2e-2;
/// Most input sets kept on the device for rotation.
const MAX_SETS: usize = 8;

/// One configuration of the sweep.
#[derive(Clone, Copy, Debug)]
struct Config {
    s: usize,
    d: usize,
    causal: bool,
}

impl Config {
    fn b(&self) -> usize {
        TOKENS / self.s
    }
    fn h(&self) -> usize {
        WIDTH / self.d
    }
    fn flops(&self) -> f64 {
        let full = 4.0 * (self.b() * self.h()) as f64 * (self.s * self.s * self.d) as f64;
        if self.causal { full / 2.0 } else { full }
    }
    fn shape(&self) -> [usize; 4] {
        [self.b(), self.h(), self.s, self.d]
    }
}

fn sweep(quick: bool) -> Vec<Config> {
    let seqs: &[usize] = if quick {
        &[1024, 4096]
    } else {
        &[1024, 2048, 4096, 8192, 16384]
    };
    let mut v = Vec::new();
    for d in [64, 128, 256] {
        for causal in [false, true] {
            for &s in seqs {
                v.push(Config { s, d, causal });
            }
        }
    }
    v
}

fn main() -> ExitCode {
    kiln_bench::exit(
        run(),
        "at least one kiln result disagreed with the f64 reference",
    )
}

fn run() -> Result<bool, BenchError> {
    let args = Args::parse();
    let device = kernels::device(&args)?;
    eprintln!("{}, kiln target {}", device.name(), device.target());

    let configs: Vec<Config> = sweep(args.quick)
        .into_iter()
        .filter(|c| args.only.is_empty() || args.only.contains(&(c.s, c.d, c.causal)))
        .collect();
    // The (d, causal) specialisations the run compiles: a `--set` value may suit only these.
    let pairs: BTreeSet<(usize, bool)> = configs.iter().map(|c| (c.d, c.causal)).collect();
    let mut progress = Progress::new(configs.len() + pairs.len());
    let compile_rows = compile_times(&device, &pairs, &args.set, &mut progress)?;

    let mut table = Table::new(&[
        "s",
        "d",
        "causal",
        "b",
        "h",
        "kiln ms",
        "kiln TFLOP/s",
        "rel err",
    ]);
    let mut rows = Vec::new();
    let mut all_ok = true;
    for (i, c) in configs.iter().enumerate() {
        progress.step(&format!(
            "attention s={} d={} causal={}",
            c.s, c.d, c.causal
        ));
        let mut comptime = comptime(c, device.target(), &args.set)?;
        let shape = c.shape();
        let host: Vec<HostTensor> = (0..3)
            .map(|t| uniform(&shape, DType::Bf16, 3 * i as u64 + t))
            .collect();
        let bytes = 4 * shape.iter().product::<usize>() * 2;
        let sets = rotation_sets(bytes, device.l2_bytes(), MAX_SETS);
        let q = copies(&device, &host[0], sets)?;
        let k = copies(&device, &host[1], sets)?;
        let v = copies(&device, &host[2], sets)?;
        let o = (0..sets)
            .map(|_| device.alloc(DType::Bf16, &shape))
            .collect::<Result<Vec<_>, _>>()?;
        let scale = 1.0 / (c.d as f32).sqrt();
        // Each candidate's grid has its own block_m's rows per block.
        let grid = |p: &AttentionParams| attention.grid(p, [c.s, c.h(), c.b()]);
        let mut tuning = Value::Null;
        if args.autotune {
            (comptime, tuning) = kernels::autotuned(
                &device,
                &attention,
                &comptime,
                &["q", "k", "v", "o"],
                &format!("s={} d={} causal={}", c.s, c.d, c.causal),
                &mut |p| attention.launch(&device, p, grid(p), &q[0], &k[0], &v[0], &o[0], scale),
            )?;
        }
        let launch = |s: usize| -> Result<(), BenchError> {
            let g = grid(&comptime);
            Ok(attention.launch(&device, &comptime, g, &q[s], &k[s], &v[s], &o[s], scale)?)
        };
        device.fill_nan(&o[0])?;
        launch(0)?;
        let err = sampled_error(&o[0], &host, scale, c, i as u64)?;
        let ok = err < TOLERANCE;
        all_ok &= ok;

        let t = measure(&device, args.warmup, args.iters, |r| launch(r % sets))?;
        let tf = tflops(c.flops(), t.median());
        table.row(vec![
            c.s.to_string(),
            c.d.to_string(),
            c.causal.to_string(),
            c.b().to_string(),
            c.h().to_string(),
            format!("{:.3}", t.median()),
            format!("{tf:.1}"),
            format!("{err:.1e}{}", if ok { "" } else { " WRONG" }),
        ]);
        rows.push(json!({
            "s": c.s,
            "d": c.d,
            "causal": c.causal,
            "b": c.b(),
            "h": c.h(),
            "flops": c.flops(),
            "comptime": comptime_text(&comptime),
            "autotuned": args.autotune,
            "autotune_timings": tuning,
            "input_sets": sets,
            "kiln_ms_median": t.median(),
            "kiln_ms_min": t.min(),
            "kiln_tflops": tf,
            "rel_error_sampled_rows": err,
            "correct": ok,
            "kiln_ms_all": t.all(),
        }));
    }
    progress.finish();
    println!("{}", table.render());

    if let Some(path) = &args.out {
        let json = json!({
            "meta": meta(&device, "attention"),
            "iters": args.iters,
            "warmup": args.warmup,
            "tolerance": TOLERANCE,
            "comptime_set": args.set.iter().cloned().collect::<BTreeMap<_, _>>(),
            "compile": compile_rows,
            "rows": rows,
        });
        write_json(path, &json)?;
    }
    Ok(all_ok)
}

/// `attention`'s comptime values for `c` on `target` (the key and query blocks it is tuned
/// for), with the command line's `--set` values over them.
fn comptime(
    c: &Config,
    target: kiln_ir::Target,
    set: &[(String, String)],
) -> Result<AttentionParams, BenchError> {
    let tuned = AttentionParams::tuned(target, c.d, c.causal, (c.s, c.s));
    Ok(tuned.with_defines(set)?)
}

/// Uncached time from specialisation to PTX text and to a loaded module, per (d, causal) of
/// `pairs`, printed and returned as JSON rows.
fn compile_times(
    device: &Device,
    pairs: &BTreeSet<(usize, bool)>,
    set: &[(String, String)],
    progress: &mut Progress,
) -> Result<Vec<Value>, BenchError> {
    let mut table = Table::new(&[
        "d",
        "causal",
        "build ms",
        "codegen ms",
        "to PTX ms",
        "JIT ms",
        "to module ms",
        "warm start ms",
    ]);
    let mut rows = Vec::new();
    // Warm starts read a disk cache of their own, filled by the first compilation of each
    // specialisation (as a new process would find it).
    let cache_dir = tempfile::tempdir().map_err(|source| BenchError::Io {
        path: "a temporary disk cache".into(),
        source,
    })?;
    let warm_device = Device::new(0)?
        .with_target(device.target())
        .with_disk_cache(Some(DiskCache::at(cache_dir.path())));
    for &(d, causal) in pairs {
        progress.step(&format!("compile attention d={d} causal={causal}"));
        // What the sweep's contiguous bf16 tensors specialise on.
        let spec = Spec::new(comptime(&Config { s: 0, d, causal }, device.target(), set)?)
            .with_aligned16(&["q", "k", "v", "o"]);
        let kernel = device.compile_uncached(&attention, &spec)?;
        let t = kernel.times();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let to_ptx = ms(t.build) + ms(t.codegen);
        let to_module = to_ptx + ms(t.load);
        warm_device.compile_from_disk(&attention, &spec)?;
        let warm = warm_device.compile_from_disk(&attention, &spec)?;
        let w = warm.times();
        let warm_ms = ms(w.build) + ms(w.codegen) + ms(w.load);
        let warm_cell = match warm.origin() {
            Origin::DiskCache => format!("{warm_ms:.2}"),
            Origin::Ptxas => format!("{warm_ms:.2} (ptxas ran)"),
            Origin::DriverJit { ptxas_skipped } => format!(
                "{warm_ms:.2} (JIT ran: {})",
                ptxas_skipped.as_deref().unwrap_or("no disk cache")
            ),
        };
        table.row(vec![
            d.to_string(),
            causal.to_string(),
            format!("{:.2}", ms(t.build)),
            format!("{:.2}", ms(t.codegen)),
            format!("{to_ptx:.2}"),
            format!("{:.2}", ms(t.load)),
            format!("{to_module:.2}"),
            warm_cell,
        ]);
        rows.push(json!({
            "d": d,
            "causal": causal,
            "build_ms": ms(t.build),
            "codegen_ms": ms(t.codegen),
            "to_ptx_ms": to_ptx,
            "jit_load_ms": ms(t.load),
            "to_module_ms": to_module,
            "warm_start_ms": warm_ms,
            "warm_load_ms": ms(w.load),
            "warm_start_from_disk_cache": warm.from_disk_cache(),
            "num_regs": kernel.num_regs()?,
            "local_bytes": kernel.local_bytes()?,
        }));
    }
    eprintln!();
    println!("{}", table.render());
    Ok(rows)
}

/// Relative error of `out` against the f64 reference on [`CHECK_ROWS`] query rows spread over
/// batches, heads and positions (the first and last rows included).
fn sampled_error(
    out: &DeviceTensor,
    host: &[HostTensor],
    scale: f32,
    c: &Config,
    salt: u64,
) -> Result<f64, BenchError> {
    let [b, h, s, _] = c.shape();
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for r in 0..CHECK_ROWS as u64 {
        let mix = (r + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
        let (bi, hi) = ((mix % b as u64) as usize, ((mix >> 20) % h as u64) as usize);
        let row = match r {
            0 => 0,
            1 => s - 1,
            _ => ((mix >> 40) % s as u64) as usize,
        };
        let o = out.narrow(0, bi, 1)?.narrow(1, hi, 1)?.narrow(2, row, 1)?;
        got.extend(o.download()?.to_f64_vec());
        let (q, k, v) = (&host[0], &host[1], &host[2]);
        want.extend(attention_row(
            q,
            k,
            v,
            scale as f64,
            c.causal,
            [bi, hi, row],
        ));
    }
    Ok(rel_error(&got, &want))
}
