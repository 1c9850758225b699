//! `kiln`: list the example kernels, print their IR after any pass, their PTX for a target,
//! and check the PTX with ptxas. `kiln --help` (and `kiln COMMAND --help`) says how.
//!
//! With no `-D`, each comptime parameter takes its declared default (attention: d=128,
//! causal=false, block_n=0) and every tensor is taken as 16-byte aligned.
//!
//! **Architecture invariant:** the CLI never needs a GPU: it builds, schedules and writes
//! PTX on the host, and `check` runs ptxas, not the driver.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kiln::ir::dsl::{AnyKernelDef, ComptimeValue, split_define};
use kiln::ir::{Kernel, Target};

/// kiln: the example kernels' IR, PTX and ptxas reports, without a GPU.
#[derive(Parser)]
#[command(name = "kiln", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the example kernels with their comptime parameters and signatures.
    List,
    /// Print a kernel's IR as built, or after a pass of the pipeline.
    Ir {
        #[command(flatten)]
        kernel: KernelArgs,
        /// `build`, or the pass after which to print (default: after every pass).
        #[arg(long)]
        after: Option<String>,
    },
    /// Print a kernel's PTX, or with `--sass` its machine code (ptxas, then nvdisasm).
    Ptx {
        #[command(flatten)]
        kernel: KernelArgs,
        /// Print the SASS ptxas assembles the PTX into, not the PTX.
        #[arg(long)]
        sass: bool,
    },
    /// The disk compile cache (`KILN_CACHE_DIR`, else the platform cache directory).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Assemble a kernel's PTX with ptxas: registers, shared memory, spills and blocks per SM,
    /// for every target in one table unless `--target` names one.
    Check {
        #[command(flatten)]
        kernel: KernelArgs,
    },
}

#[derive(Subcommand)]
enum CacheAction {
    /// List the cached cubins: key, size, age.
    Ls,
    /// Remove every cached cubin.
    Clear,
}

/// Which kernel, specialised how, for which target.
#[derive(Args)]
struct KernelArgs {
    /// The example kernel (`kiln list` names them).
    name: String,
    /// The target: sm_80 (default), sm_90a or sm_100a.
    #[arg(long)]
    target: Option<Target>,
    /// A comptime value, `-D NAME=VALUE` (repeatable); the kernel's comptime struct parses
    /// them (`Comptime::from_defines`).
    #[arg(short = 'D', value_name = "NAME=VALUE", value_parser = define)]
    defines: Vec<(String, String)>,
}

/// Splits `NAME=VALUE`; the value is parsed as the kernel's parameter type when it is built.
fn define(s: &str) -> Result<(String, String), String> {
    split_define(s).map_err(|e| e.to_string())
}

fn find_kernel(name: &str) -> Result<&'static dyn AnyKernelDef, String> {
    let names: Vec<&str> = kiln_examples::registry().iter().map(|k| k.name()).collect();
    kiln_examples::find(name)
        .ok_or_else(|| format!("no kernel named `{name}`; one of: {}", names.join(", ")))
}

impl KernelArgs {
    fn build(&self) -> Result<Kernel, String> {
        find_kernel(&self.name)?
            .build_defines(&self.defines, true)
            .map_err(|e| e.to_string())
    }

    /// The target named, else sm_80.
    fn target(&self) -> Target {
        self.target.unwrap_or(Target::Sm80)
    }

    fn ptx(&self, target: Target) -> Result<kiln::ptx::PtxModule, String> {
        kiln::ptx::compile(&self.build()?, target).map_err(|e| e.to_string())
    }
}

/// ` (tuned over a, b)` for a parameter the autotuner searches, else nothing.
fn tuned(candidates: &[ComptimeValue]) -> String {
    if candidates.is_empty() {
        return String::new();
    }
    let c: Vec<String> = candidates.iter().map(ToString::to_string).collect();
    format!(" (tuned over {})", c.join(", "))
}

fn list() -> String {
    let mut out = String::new();
    for def in kiln_examples::registry() {
        let comptime: Vec<String> = def
            .comptime_params()
            .iter()
            .map(|p| match p.default {
                Some(d) => format!("{}: {} = {d}{}", p.name, p.kind.name(), tuned(p.tune)),
                None => format!("{}: {}{}", p.name, p.kind.name(), tuned(p.tune)),
            })
            .collect();
        let params: Vec<String> = def.signature().iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "{}\n  comptime: {}\n  params:   {}\n",
            def.name(),
            if comptime.is_empty() {
                "none".into()
            } else {
                comptime.join(", ")
            },
            params.join(", ")
        ));
    }
    out
}

fn ir(k: &KernelArgs, after: Option<&str>) -> Result<String, String> {
    let mut kernel = k.build()?;
    let names: Vec<&str> = kiln::ir::passes::PASSES.iter().map(|p| p.0).collect();
    let after = match after {
        None => None,
        Some("build") => return Ok(kiln::ir::print::print_kernel(&kernel)),
        Some(p) if names.contains(&p) => Some(p.to_string()),
        Some(p) => {
            return Err(format!(
                "no pass named `{p}`; passes: build, {}",
                names.join(", ")
            ));
        }
    };
    let mut dump = None;
    kiln::ir::passes::run_pipeline(&mut kernel, k.target(), &mut |name, k| {
        if after.as_deref() == Some(name) {
            dump = Some(kiln::ir::print::print_kernel(k));
        }
    })
    .map_err(|d| d.to_string())?;
    Ok(dump.unwrap_or_else(|| kiln::ir::print::print_kernel(&kernel)))
}

fn check(k: &KernelArgs) -> Result<String, String> {
    let Some(target) = k.target else {
        return Ok(check_every_target(k));
    };
    let module = k.ptx(target)?;
    let report = kiln::ptx::ptxas::check(&module.ptx, target).map_err(|e| e.to_string())?;
    let mut out = format!(
        "{} ({}): {} threads/block, {} B dynamic smem, {} PTX lines, {} block(s)/SM\nptxas: {report}\n",
        module.entry,
        target,
        module.threads_per_block,
        module.dynamic_smem_bytes,
        module.ptx.lines().count(),
        blocks_per_sm(&module, &report)
    );
    // What the GPU host's driver will make of it, when that release's ptxas is installed.
    use kiln::ptx::ptxas::{JIT_PTXAS_VERSION, Tool};
    if kiln::ptx::ptxas::find(Tool::JitPtxas).is_ok() {
        let jit = kiln::ptx::ptxas::check_with(Tool::JitPtxas, &module.ptx, target)
            .map_err(|e| e.to_string())?;
        out.push_str(&format!(
            "ptxas {JIT_PTXAS_VERSION} (the driver's JIT): {jit}\n"
        ));
    }
    Ok(out)
}

/// Blocks of `module` one SM of its target holds.
fn blocks_per_sm(module: &kiln::ptx::PtxModule, report: &kiln::ptx::ptxas::PtxasReport) -> u32 {
    module.target.sm_limits().blocks_per_sm(
        module.threads_per_block,
        report.registers,
        module.dynamic_smem_bytes + report.shared_bytes,
    )
}

/// One row per target: resources and blocks per SM, or why the target has none.
fn check_every_target(k: &KernelArgs) -> String {
    let mut out = format!(
        "{:<8} {:>7} {:>10} {:>5} {:>6} {:>13} {:>9}\n",
        "target", "threads", "smem B", "regs", "stack", "spills st/ld", "blocks/SM"
    );
    for target in Target::ALL {
        let row = k.ptx(target).and_then(|m| {
            let r = kiln::ptx::ptxas::check(&m.ptx, target).map_err(|e| e.to_string())?;
            Ok(format!(
                "{:>7} {:>10} {:>5} {:>6} {:>13} {:>9}",
                m.threads_per_block,
                m.dynamic_smem_bytes + r.shared_bytes,
                r.registers,
                r.stack_bytes,
                format!("{}/{}", r.spill_store_bytes, r.spill_load_bytes),
                blocks_per_sm(&m, &r)
            ))
        });
        let row = row.unwrap_or_else(|e| e.lines().next().unwrap_or_default().to_string());
        out.push_str(&format!("{:<8} {row}\n", target.name()));
    }
    out
}

fn cache(action: &CacheAction) -> Result<String, String> {
    let cache = kiln::runtime::DiskCache::from_env()
        .ok_or("the disk cache is off (KILN_CACHE_DIR=off, or no platform cache directory)")?;
    let dir = cache.dir().display().to_string();
    match action {
        CacheAction::Ls => {
            let entries = cache.entries().map_err(|e| format!("{dir}: {e}"))?;
            let mut out = format!("{dir}: {} entries\n", entries.len());
            for e in entries {
                let age = e
                    .modified
                    .and_then(|m| m.elapsed().ok())
                    .map_or("?".to_string(), |d| format!("{}s ago", d.as_secs()));
                out.push_str(&format!("{}  {:>9} B  {age}\n", e.name, e.bytes));
            }
            Ok(out)
        }
        CacheAction::Clear => {
            let n = cache.clear().map_err(|e| format!("{dir}: {e}"))?;
            Ok(format!("{dir}: removed {n} entries\n"))
        }
    }
}

fn run(cli: Cli) -> Result<String, String> {
    match &cli.command {
        Command::List => Ok(list()),
        Command::Ir { kernel, after } => ir(kernel, after.as_deref()),
        Command::Ptx { kernel, sass } => {
            let target = kernel.target();
            let module = kernel.ptx(target)?;
            if *sass {
                kiln::ptx::ptxas::sass(&module.ptx, target).map_err(|e| e.to_string())
            } else {
                Ok(module.ptx)
            }
        }
        Command::Check { kernel } => check(kernel),
        Command::Cache { action } => cache(action),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(text) => {
            // Not `print!`, which panics when the reader has gone (`kiln ir attention | head`);
            // a closed pipe is the reader's choice, not a failure.
            match std::io::stdout().lock().write_all(text.as_bytes()) {
                Err(e) if e.kind() != ErrorKind::BrokenPipe => {
                    eprintln!("cannot write to stdout: {e}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kiln::ir::dsl::{Comptime, DefineError};
    use kiln::ir::{DType, Target};
    use kiln_examples::attention::AttentionParams;

    use super::{Cli, Command, KernelArgs};

    /// The `-D` values of `kiln ptx attention ARGS..`, parsed into attention's comptime struct.
    fn attention_params(args: &[&str]) -> Result<AttentionParams, String> {
        let cli = Cli::try_parse_from(["kiln", "ptx", "attention"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        let Command::Ptx {
            kernel: KernelArgs { defines, .. },
            ..
        } = cli.command
        else {
            return Err("not `kiln ptx`".into());
        };
        AttentionParams::from_defines(&defines).map_err(|e| e.to_string())
    }

    #[test]
    fn defines_parse_into_the_kernels_comptime_struct() {
        let p = attention_params(&[
            "-D",
            "d=64",
            "-D",
            "causal=true",
            "-D",
            "dtype=f16",
            "-D",
            "window_left=-3",
            "-D",
            "softcap=-0.0",
            "-D",
            "d=96",
        ])
        .expect("valid defines");
        assert_eq!(
            p,
            AttentionParams {
                d: 96,
                causal: true,
                dtype: DType::F16,
                window_left: -3,
                softcap: -0.0,
                ..AttentionParams::default()
            }
        );
        // The sign of a zero is a specialisation of its own.
        assert_ne!(p.softcap.to_bits(), 0.0f32.to_bits());
        assert_eq!(attention_params(&[]), Ok(AttentionParams::default()));
    }

    #[test]
    fn a_bad_value_names_the_parameter_and_its_type() {
        let err = attention_params(&["-D", "d=x"]).expect_err("not a usize");
        assert_eq!(err, "comptime parameter `d` is a usize, and `x` is not one");
        let err = attention_params(&["-D", "dtype=f64"]).expect_err("not a DType");
        assert_eq!(
            err,
            "comptime parameter `dtype` is a DType, and `f64` is not one"
        );
        let err = attention_params(&["-D", "causal=1"]).expect_err("not a bool");
        assert!(err.contains("`causal` is a bool"), "{err}");
    }

    #[test]
    fn an_unknown_name_lists_the_parameters() {
        let err = attention_params(&["-D", "heads=3"]).expect_err("no such parameter");
        let known: Vec<&str> = AttentionParams::PARAMS.iter().map(|p| p.name).collect();
        assert_eq!(
            err,
            DefineError::UnknownParam {
                name: "heads".into(),
                known,
            }
            .to_string()
        );
        assert!(err.starts_with("no comptime parameter `heads`; the parameters are: d, causal"));
        let err = attention_params(&["-D", "d"]).expect_err("no `=`");
        assert!(err.contains("`d`: expected NAME=VALUE"), "{err}");
    }

    #[test]
    fn the_cli_builds_with_defines_and_reports_bad_ones_by_kernel() {
        let args = |defines: &[&str]| KernelArgs {
            name: "attention".into(),
            target: Some(Target::Sm80),
            defines: defines
                .iter()
                .map(|d| super::define(d).expect("NAME=VALUE"))
                .collect(),
        };
        assert!(args(&["d=64"]).build().is_ok());
        let err = args(&["d=64", "bn=3"]).build().expect_err("unknown");
        assert!(
            err.starts_with("kernel `attention`: no comptime parameter `bn`"),
            "{err}"
        );
    }
}
