//! The `kiln` command as a library: list the kernels linked into the program, print their IR
//! after any pass, their PTX for a target, and check the PTX with ptxas, all without a GPU
//! (`kiln --help` says how). A crate inspects its own kernels, and those of every library it
//! links ([`kiln_ir::dsl::registry`]), with a one-line binary `src/bin/kiln.rs`,
//! `fn main() -> std::process::ExitCode { kiln::cli::main() }` (`docs/own-crate.md`). With no
//! `-D`, each comptime parameter takes its declared default and every tensor is taken as
//! 16-byte aligned.

// The bundled `kiln` binary is the one-line `main` over `kiln-examples`; the facade's
// documentation of `kiln::cli` compiles that line. This crate depends on the member crates,
// not on the `kiln` facade, which re-exports it as `kiln::cli`.

use std::ffi::OsString;
use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kiln_ir::dsl::registry::{self, Registered};
use kiln_ir::dsl::{ComptimeValue, split_define};
use kiln_ir::{Kernel, Target};

/// kiln: the IR, PTX and ptxas reports of the kernels linked into this program, without a GPU.
#[derive(Parser)]
#[command(name = "kiln", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// The flattened and nested fields have no help text of their own: clap would print a doc
// comment on them.
#[allow(missing_docs)]
#[derive(Subcommand)]
pub enum Command {
    /// List the kernels linked into this program with their comptime parameters and
    /// signatures.
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

/// What `kiln cache` does.
#[derive(Subcommand)]
pub enum CacheAction {
    /// List the cached cubins: key, size, age.
    Ls,
    /// Remove every cached cubin.
    Clear,
}

/// Which kernel, specialised how, for which target.
#[derive(Args)]
pub struct KernelArgs {
    /// The kernel (`kiln list` names them): its name, or its path
    /// (`my_crate::layers::relu`) where two kernels share the name.
    pub name: String,
    /// The target: sm_80 (default), sm_90a or sm_100a.
    #[arg(long)]
    pub target: Option<Target>,
    /// A comptime value, `-D NAME=VALUE` (repeatable); the kernel's comptime struct parses
    /// them (`Comptime::from_defines`).
    #[arg(short = 'D', value_name = "NAME=VALUE", value_parser = define)]
    pub defines: Vec<(String, String)>,
}

/// Splits `NAME=VALUE`; the value is parsed as the kernel's parameter type when it is built.
pub fn define(s: &str) -> Result<(String, String), String> {
    split_define(s).map_err(|e| e.to_string())
}

impl KernelArgs {
    /// The registered kernel named, built with the defines on its comptime defaults, every
    /// tensor taken as 16-byte aligned; why not, in the words `kiln` prints.
    pub fn build(&self) -> Result<Kernel, String> {
        registry::find(&self.name)
            .map_err(|e| e.to_string())?
            .def()
            .build_defines(&self.defines, true)
            .map_err(|e| e.to_string())
    }

    /// The target named, else sm_80.
    fn target(&self) -> Target {
        self.target.unwrap_or(Target::Sm80)
    }

    fn ptx(&self, target: Target) -> Result<kiln_ptx::PtxModule, String> {
        kiln_ptx::compile(&self.build()?, target).map_err(|e| e.to_string())
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

/// What `kiln list` prints for `kernels`: each one's name (its path where another shares the
/// name), comptime parameters and signature.
fn list(kernels: &[&'static Registered]) -> String {
    if kernels.is_empty() {
        return "no kernel is registered in this program: a `#[kernel]` registers itself when \
                its crate is linked in (name a library of kernels in the binary, e.g. \
                `use my_kernels as _;`)\n"
            .to_string();
    }
    let mut out = String::new();
    for (entry, name) in kernels.iter().zip(registry::display_names(kernels)) {
        let def = entry.def();
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
            "{name}\n  comptime: {}\n  params:   {}\n",
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
    let names: Vec<&str> = kiln_ir::passes::PASSES.iter().map(|p| p.0).collect();
    let after = match after {
        None => None,
        Some("build") => return Ok(kiln_ir::print::print_kernel(&kernel)),
        Some(p) if names.contains(&p) => Some(p.to_string()),
        Some(p) => {
            return Err(format!(
                "no pass named `{p}`; passes: build, {}",
                names.join(", ")
            ));
        }
    };
    let mut dump = None;
    kiln_ir::passes::run_pipeline(&mut kernel, k.target(), &mut |name, k| {
        if after.as_deref() == Some(name) {
            dump = Some(kiln_ir::print::print_kernel(k));
        }
    })
    .map_err(|d| d.to_string())?;
    Ok(dump.unwrap_or_else(|| kiln_ir::print::print_kernel(&kernel)))
}

fn check(k: &KernelArgs) -> Result<String, String> {
    let Some(target) = k.target else {
        // An unknown kernel or a bad define fails on every target alike: say so once, and
        // fail, rather than print a table of the same error.
        k.build()?;
        return Ok(check_every_target(k));
    };
    let module = k.ptx(target)?;
    let report = kiln_ptx::ptxas::check(&module.ptx, target).map_err(|e| e.to_string())?;
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
    use kiln_ptx::ptxas::{JIT_PTXAS_VERSION, Tool};
    if kiln_ptx::ptxas::find(Tool::JitPtxas).is_ok() {
        let jit = kiln_ptx::ptxas::check_with(Tool::JitPtxas, &module.ptx, target)
            .map_err(|e| e.to_string())?;
        out.push_str(&format!(
            "ptxas {JIT_PTXAS_VERSION} (the driver's JIT): {jit}\n"
        ));
    }
    // How the passes lowered it where that is a choice (a loop kept off the warp-specialised
    // schedule, an mma left on mma.sync), each at the user's line.
    for note in module
        .ptx
        .lines()
        .filter_map(|l| l.strip_prefix("// note: "))
    {
        out.push_str(&format!("note: {note}\n"));
    }
    Ok(out)
}

/// Blocks of `module` one SM of its target holds.
fn blocks_per_sm(module: &kiln_ptx::PtxModule, report: &kiln_ptx::ptxas::PtxasReport) -> u32 {
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
            let r = kiln_ptx::ptxas::check(&m.ptx, target).map_err(|e| e.to_string())?;
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
    let cache = kiln_runtime::DiskCache::from_env()
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

impl Cli {
    /// Runs the command over the kernels registered in this program: the text `kiln` prints
    /// on success, else the message it prints before failing.
    pub fn run(&self) -> Result<String, String> {
        run(self)
    }
}

fn run(cli: &Cli) -> Result<String, String> {
    match &cli.command {
        Command::List => Ok(list(registry::registered())),
        Command::Ir { kernel, after } => ir(kernel, after.as_deref()),
        Command::Ptx { kernel, sass } => {
            let target = kernel.target();
            let module = kernel.ptx(target)?;
            if *sass {
                kiln_ptx::ptxas::sass(&module.ptx, target).map_err(|e| e.to_string())
            } else {
                Ok(module.ptx)
            }
        }
        Command::Check { kernel } => check(kernel),
        Command::Cache { action } => cache(action),
    }
}

/// `kiln ARGS..` on the given arguments (the first is the program's name, as in
/// `std::env::args_os`): the text it prints on success, else the message it fails with
/// (clap's, for arguments it refuses, `--help` and `--version` included).
pub fn run_args<I, T>(args: I) -> Result<String, String>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args).map_err(|e| e.render().to_string())?;
    run(&cli)
}

/// The `kiln` command over the kernels registered in this program, on the process's
/// arguments: prints the result and returns the exit code. A crate's `src/bin/kiln.rs` is
/// `fn main() -> std::process::ExitCode { kiln::cli::main() }`.
pub fn main() -> ExitCode {
    match run(&Cli::parse()) {
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
