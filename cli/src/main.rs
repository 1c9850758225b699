//! `kiln`: list the example kernels, print their IR after any pass, their PTX for a target,
//! and check the PTX with ptxas.
//!
//! ```text
//! kiln list
//! kiln ir NAME [--after PASS] [--target T] [-D key=value ...]
//! kiln ptx NAME [--target T] [-D key=value ...]
//! kiln check NAME [--target T] [-D key=value ...]
//! ```
//! With no `-D`, each comptime parameter takes its declared default (attention: d=128,
//! causal=false) and every tensor is taken as 16-byte aligned.
//!
//! **Architecture invariant:** the CLI never needs a GPU: it builds, schedules and writes
//! PTX on the host, and `check` runs ptxas, not the driver.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ir::{Kernel, Target};

const USAGE: &str = "usage:
  kiln list
  kiln ir NAME [--after PASS] [--target T] [-D key=value ...]
  kiln ptx NAME [--target T] [-D key=value ...]
  kiln check NAME [--target T] [-D key=value ...]
targets: sm_80 (default), sm_90a, sm_100a";

/// A parsed command line.
struct Args {
    command: String,
    kernel: Option<String>,
    target: Target,
    after: Option<String>,
    defines: Vec<(String, String)>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let command = it.next().ok_or_else(|| USAGE.to_string())?;
    let mut args = Args {
        command,
        kernel: None,
        target: Target::Sm80,
        after: None,
        defines: Vec::new(),
    };
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .ok_or_else(|| format!("`{flag}` needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--target" => args.target = value("--target")?.parse().map_err(|e| format!("{e}"))?,
            "--after" => args.after = Some(value("--after")?),
            "-D" => {
                let d = value("-D")?;
                let (k, v) = d
                    .split_once('=')
                    .ok_or_else(|| format!("`-D {d}`: expected -D key=value"))?;
                args.defines.push((k.to_string(), v.to_string()));
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`\n{USAGE}")),
            s if args.kernel.is_none() => args.kernel = Some(s.to_string()),
            s => return Err(format!("unexpected argument `{s}`\n{USAGE}")),
        }
    }
    Ok(args)
}

fn find_kernel(name: Option<&str>) -> Result<&'static dyn KernelDef, String> {
    let names: Vec<&str> = kiln_examples::registry().iter().map(|k| k.name()).collect();
    let name = name.ok_or_else(|| format!("missing kernel name; one of: {}", names.join(", ")))?;
    kiln_examples::find(name)
        .ok_or_else(|| format!("no kernel named `{name}`; one of: {}", names.join(", ")))
}

fn build(def: &dyn KernelDef, defines: &[(String, String)]) -> Result<Kernel, String> {
    let spec = Spec::from_defaults(def, defines).map_err(|e| e.to_string())?;
    def.build(&spec).map_err(|d| d.to_string())
}

fn list() -> String {
    let mut out = String::new();
    for def in kiln_examples::registry() {
        let comptime: Vec<String> = def
            .comptime_params()
            .iter()
            .map(|p| match p.default {
                Some(d) => format!("{}: {} = {d}", p.name, p.kind.name()),
                None => format!("{}: {}", p.name, p.kind.name()),
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

fn ir(args: &Args) -> Result<String, String> {
    let def = find_kernel(args.kernel.as_deref())?;
    let mut kernel = build(def, &args.defines)?;
    let names: Vec<&str> = kiln::ir::passes::PASSES.iter().map(|p| p.0).collect();
    let after = match args.after.as_deref() {
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
    kiln::ir::passes::run_pipeline(&mut kernel, args.target, &mut |name, k| {
        if after.as_deref() == Some(name) {
            dump = Some(kiln::ir::print::print_kernel(k));
        }
    })
    .map_err(|d| d.to_string())?;
    Ok(dump.unwrap_or_else(|| kiln::ir::print::print_kernel(&kernel)))
}

fn ptx(args: &Args) -> Result<kiln::ptx::PtxModule, String> {
    let def = find_kernel(args.kernel.as_deref())?;
    let kernel = build(def, &args.defines)?;
    kiln::ptx::compile(&kernel, args.target).map_err(|e| e.to_string())
}

fn check(args: &Args) -> Result<String, String> {
    let module = ptx(args)?;
    let report = kiln::ptx::ptxas::check(&module.ptx, args.target).map_err(|e| e.to_string())?;
    Ok(format!(
        "{} ({}): {} threads/block, {} B dynamic smem, {} PTX lines\nptxas: {report}\n",
        module.entry,
        args.target,
        module.threads_per_block,
        module.dynamic_smem_bytes,
        module.ptx.lines().count()
    ))
}

fn run(args: Args) -> Result<String, String> {
    match args.command.as_str() {
        "list" => Ok(list()),
        "ir" => ir(&args),
        "ptx" => ptx(&args).map(|m| m.ptx),
        "check" => check(&args),
        "-h" | "--help" | "help" => Ok(format!("{USAGE}\n")),
        c => Err(format!("unknown command `{c}`\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)).and_then(run) {
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
