//! The main job: compile the attention kernel written in the DSL, show PTX statistics, then
//! run it on the GPU when a CUDA driver is present (else on the CPU interpreter) and check it
//! against an f64 reference.
//!
//! ```sh
//! cargo run --release -p kiln-examples --example attention [-- --d 64 --causal --seq 1024]
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use kiln::ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln::ir::{DType, HostTensor, Target};
use kiln::runtime::Device;
use kiln_examples::attention::{AttentionParams, attention};
use kiln_tests::check::{poisoned, rel_error, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// Compiles the DSL attention kernel, shows its PTX statistics, and runs it on the GPU (its own
/// target) when a CUDA driver is present, else on the CPU interpreter, checked against an f64
/// reference.
#[derive(Parser)]
#[command(version)]
struct Options {
    /// Head dimension (64, 128 or 256).
    #[arg(long, default_value_t = 128, value_parser = positive)]
    d: usize,
    /// Causal attention (bottom-right aligned).
    #[arg(long)]
    causal: bool,
    /// Batch size.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    batch: usize,
    /// Heads.
    #[arg(long, default_value_t = 2, value_parser = positive)]
    heads: usize,
    /// Sequence length (default: 1000 on the GPU, 200 on the interpreter).
    #[arg(long, value_parser = positive)]
    seq: Option<usize>,
}

/// A positive integer.
fn positive(s: &str) -> Result<usize, String> {
    s.parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("expected a positive integer, got `{s}`"))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let o = Options::parse();
    // The GPU's own target when there is one (sm_90a on Hopper), else the portable sm_80
    // whose kernel the interpreter runs.
    let device = Device::new(0);
    let target = device.as_ref().map_or(Target::Sm80, Device::target);
    // Small enough for the interpreter; neither is a multiple of a tile.
    let s = o.seq.unwrap_or(if device.is_ok() { 1000 } else { 200 });
    let params = AttentionParams::tuned(target, o.d, o.causal, (s, s));
    let spec = Spec::uniform(params, attention.signature(), true);

    // Compile: specialise, run the passes, write PTX.
    let t0 = Instant::now();
    let kernel = attention.build(&spec).map_err(|e| e.to_string())?;
    let t_build = t0.elapsed();
    let t1 = Instant::now();
    let module = kiln::ptx::compile(&kernel, target).map_err(|e| e.to_string())?;
    let t_ptx = t1.elapsed();
    println!(
        "attention d={} causal={}: built IR ({} ops) in {:.2} ms, PTX ({} lines, {} KiB) in {:.2} ms",
        o.d,
        o.causal,
        kernel.ops.len(),
        t_build.as_secs_f64() * 1e3,
        module.ptx.lines().count(),
        module.ptx.len() / 1024,
        t_ptx.as_secs_f64() * 1e3
    );
    println!(
        "  target {} ({}), {} threads/block, {} B dynamic shared memory",
        module.target,
        if device.is_ok() {
            "the GPU's own"
        } else {
            "no GPU: the portable one"
        },
        module.threads_per_block,
        module.dynamic_smem_bytes
    );
    match kiln::ptx::ptxas::check(&module.ptx, target) {
        Ok(r) => println!("  ptxas -arch={target}: {r}"),
        Err(e) => println!("  ptxas not run: {e}"),
    }

    let mut rng = Rng::from_env();
    match device {
        Ok(dev) => run_gpu(&dev, &o, s, &params, &mut rng),
        Err(e) => {
            println!("no GPU ({e}); running on the CPU interpreter");
            // The kernel's own key block: the interpreter's cost grows with none of them.
            let params = AttentionParams {
                block_n: 0,
                ..params
            };
            run_interpreter(&o, s, &params, &mut rng)
        }
    }
}

/// Random q, k, v of the given sequence lengths.
fn inputs(rng: &mut Rng, o: &Options, sq: usize, sk: usize) -> [HostTensor; 3] {
    let (b, h, d) = (o.batch, o.heads, o.d);
    [
        tensor(rng, &[b, h, sq, d], DType::Bf16, Dist::Normal),
        tensor(rng, &[b, h, sk, d], DType::Bf16, Dist::Normal),
        tensor(rng, &[b, h, sk, d], DType::Bf16, Dist::Normal),
    ]
}

fn report(what: &str, out: &HostTensor, reference: &[f64], seed: u64) -> Result<(), String> {
    let err = rel_error(&out.to_f64_vec(), reference);
    let tol = tolerance(DType::Bf16);
    println!(
        "  {what}: relative error vs f64 reference {err:.2e} (tolerance {tol:.0e}, seed {seed})"
    );
    if err <= tol {
        Ok(())
    } else {
        Err(format!("{what}: error {err:.2e} exceeds {tol:.0e}"))
    }
}

/// Runs `s` queries and keys on the interpreter with comptime values `params`.
fn run_interpreter(
    o: &Options,
    s: usize,
    params: &AttentionParams,
    rng: &mut Rng,
) -> Result<(), String> {
    let [q, k, v] = inputs(rng, o, s, s);
    let mut out = poisoned(&[o.batch, o.heads, s, o.d], DType::Bf16);
    let scale = 1.0 / (o.d as f32).sqrt();
    let grid = attention.grid(params, [s, o.heads, o.batch]);
    let t = Instant::now();
    attention
        .interpret(params, grid, &q, &k, &v, &mut out, scale)
        .map_err(|e| e.to_string())?;
    println!(
        "  interpreter: b={} h={} s={s} in {:.2} s",
        o.batch,
        o.heads,
        t.elapsed().as_secs_f64()
    );
    let reference = reference::attention(&q, &k, &v, scale as f64, o.causal);
    report("interpreter", &out, &reference, rng.seed())
}

/// Runs `s` queries and keys on `dev` with comptime values `params`.
fn run_gpu(
    dev: &Device,
    o: &Options,
    s: usize,
    params: &AttentionParams,
    rng: &mut Rng,
) -> Result<(), String> {
    println!(
        "GPU: {} (sm_{}{}), driver {}, kiln target {}",
        dev.name(),
        dev.compute_capability().0,
        dev.compute_capability().1,
        dev.driver_version(),
        dev.target()
    );
    let [q, k, v] = inputs(rng, o, s, s);
    let up = |t: &HostTensor| dev.upload(t).map_err(|e| e.to_string());
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let dout = dev
        .alloc(DType::Bf16, &[o.batch, o.heads, s, o.d])
        .map_err(|e| e.to_string())?;
    dev.fill_nan(&dout).map_err(|e| e.to_string())?;
    let scale = 1.0 / (o.d as f32).sqrt();
    let grid = attention.grid(params, [s, o.heads, o.batch]);
    let t = Instant::now();
    attention
        .launch(dev, params, grid, &dq, &dk, &dv, &dout, scale)
        .map_err(|e| e.to_string())?;
    dev.synchronize().map_err(|e| e.to_string())?;
    println!(
        "  first launch (compile + JIT load + run): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let out = dout.download().map_err(|e| e.to_string())?;
    let reference = reference::attention(&q, &k, &v, scale as f64, o.causal);
    report("GPU", &out, &reference, rng.seed())
}
