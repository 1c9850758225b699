//! Runs NVIDIA's offline assembler `ptxas` on generated PTX and reads its resource report, and
//! `nvdisasm` on the assembled cubin to show its SASS: the offline checks of `kiln check`,
//! `kiln ptx --sass`, the snapshot tests and CI (the driver JIT-compiles PTX, so neither is
//! needed to compile or launch).

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use kiln_ir::{Diagnostic, Target};

/// The pinned ptxas release (pip `nvidia-cuda-nvcc`).
pub const PTXAS_VERSION: &str = "13.5.37";

/// The ptxas release of the GPU host's driver (CUDA 13.0), whose JIT assembles kiln's PTX
/// there ([`Tool::JitPtxas`]).
pub const JIT_PTXAS_VERSION: &str = "13.0.88";

/// What ptxas reported for one entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory bytes.
    pub shared_bytes: u32,
    /// Bytes of stack frame.
    pub stack_bytes: u32,
    /// Bytes spilled to local memory by stores.
    pub spill_store_bytes: u32,
    /// Bytes reloaded from local memory.
    pub spill_load_bytes: u32,
    /// Every `warning` and `(C75xx)` advisory line, verbatim.
    pub warnings: Vec<String>,
}

impl PtxasReport {
    /// Whether ptxas spilled registers.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

impl fmt::Display for PtxasReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "registers {}, static smem {} B, stack {} B, spills {} B stored / {} B loaded",
            self.registers,
            self.shared_bytes,
            self.stack_bytes,
            self.spill_store_bytes,
            self.spill_load_bytes
        )?;
        for w in &self.warnings {
            write!(f, "\n  {w}")?;
        }
        Ok(())
    }
}

/// An offline CUDA tool kiln runs.
///
/// ptxas also makes the cubins the runtime's disk cache keeps when it is installed. The
/// tools come from the pip packages `nvidia-cuda-nvcc` and `nvidia-cuda-nvdisasm` (version
/// [`PTXAS_VERSION`]), installed by `scripts/ensure-cuda-tool ptxas|nvdisasm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tool {
    /// The assembler.
    Ptxas,
    /// The assembler of the GPU host's driver release ([`JIT_PTXAS_VERSION`],
    /// `scripts/ensure-cuda-tool ptxas-jit`): the driver JIT-compiles PTX as that release's
    /// ptxas does, which allocates registers and reports advisories differently from a newer
    /// one. The tests check the kernels kiln launches with it too, so what is clean offline is
    /// clean on the GPU.
    JitPtxas,
    /// The cubin disassembler.
    Nvdisasm,
}

impl Tool {
    /// The binary's name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Ptxas | Tool::JitPtxas => "ptxas",
            Tool::Nvdisasm => "nvdisasm",
        }
    }

    /// The environment variable that overrides where it is.
    pub fn env(self) -> &'static str {
        match self {
            Tool::Ptxas => "KILN_PTXAS",
            Tool::JitPtxas => "KILN_PTXAS_JIT",
            Tool::Nvdisasm => "KILN_NVDISASM",
        }
    }

    /// The pip package that ships it.
    pub fn package(self) -> &'static str {
        match self {
            Tool::Ptxas | Tool::JitPtxas => "nvidia-cuda-nvcc",
            Tool::Nvdisasm => "nvidia-cuda-nvdisasm",
        }
    }

    /// The package's pinned version.
    pub fn version(self) -> &'static str {
        match self {
            Tool::Ptxas | Tool::Nvdisasm => PTXAS_VERSION,
            Tool::JitPtxas => JIT_PTXAS_VERSION,
        }
    }

    /// What `scripts/ensure-cuda-tool` calls it.
    fn script_name(self) -> &'static str {
        match self {
            Tool::JitPtxas => "ptxas-jit",
            t => t.name(),
        }
    }

    /// Where `scripts/ensure-cuda-tool` installs it, under the workspace root.
    fn workspace_dir(self) -> &'static str {
        match self {
            Tool::Ptxas | Tool::Nvdisasm => ".tools/cuda/bin",
            Tool::JitPtxas => ".tools/cuda-jit/bin",
        }
    }
}

/// Why ptxas or nvdisasm could not check or show a module.
#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    /// The tool's binary was not found.
    #[error(
        "{tool} not found (looked at ${env}, {looked}); install it with \
         scripts/ensure-cuda-tool {script} (pip package {package}=={version})",
        tool = tool.name(),
        script = tool.script_name(),
        env = tool.env(),
        package = tool.package(),
        version = tool.version()
    )]
    NotFound {
        /// The tool.
        tool: Tool,
        /// The places that were tried.
        looked: String,
    },
    /// Running it failed.
    #[error("could not run {path}: {source}")]
    Spawn {
        /// The binary.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// ptxas rejected the PTX, or nvdisasm the cubin.
    #[error("{} for {arch} failed:\n{}{log}", tool.name(), rendered(at))]
    Rejected {
        /// The tool.
        tool: Tool,
        /// The architecture.
        arch: String,
        /// ptxas's errors at the user's lines their PTX was written for
        /// ([`crate::source_map::map_log`]); empty for nvdisasm.
        at: Vec<Diagnostic>,
        /// ptxas's output.
        log: String,
    },
}

/// Diagnostics, one after another, each ending in a newline.
fn rendered(at: &[Diagnostic]) -> String {
    at.iter().map(|d| format!("{d}\n")).collect()
}

/// The ptxas to use (see [`find`]).
pub fn find_ptxas() -> Result<PathBuf, PtxasError> {
    find(Tool::Ptxas)
}

/// Where `tool` is: its environment variable, else its directory under the workspace root
/// (`.tools/cuda/bin`, or `.tools/cuda-jit/bin` for [`Tool::JitPtxas`]: what
/// `scripts/ensure-cuda-tool` installs); for the other tools, else `bin/<name>` under
/// `$CUDA_HOME` or `$CUDA_PATH`, else the first `<name>` on `$PATH`, else the toolkit's
/// default place, `/usr/local/cuda/bin`. A toolkit's ptxas is of whatever release it is, so
/// [`Tool::JitPtxas`] is only looked for where it was installed by its version.
pub fn find(tool: Tool) -> Result<PathBuf, PtxasError> {
    if let Some(p) = std::env::var_os(tool.env()) {
        return Ok(PathBuf::from(p));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(tool.workspace_dir());
    if tool == Tool::JitPtxas {
        let path = workspace.join(tool.name());
        return match path.is_file() {
            true => Ok(path),
            false => Err(PtxasError::NotFound {
                tool,
                looked: path.display().to_string(),
            }),
        };
    }
    let toolkits = ["CUDA_HOME", "CUDA_PATH"]
        .into_iter()
        .filter_map(std::env::var_os)
        .map(|root| PathBuf::from(root).join("bin"));
    let path = std::env::var_os("PATH");
    let on_path = path.iter().flat_map(std::env::split_paths);
    std::iter::once(workspace.clone())
        .chain(toolkits)
        .chain(on_path)
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda/bin")))
        .map(|dir| dir.join(tool.name()))
        .find(|p| p.is_file())
        .ok_or_else(|| PtxasError::NotFound {
            tool,
            looked: format!(
                "{}, $CUDA_HOME/bin, $CUDA_PATH/bin, $PATH and /usr/local/cuda/bin",
                workspace.join(tool.name()).display()
            ),
        })
}

/// Assembles `ptx` for `target` with `ptxas -v` and returns the report for its (single) entry.
pub fn check(ptx: &str, target: Target) -> Result<PtxasReport, PtxasError> {
    check_with(Tool::Ptxas, ptx, target)
}

/// [`check`] with the assembler `tool` ([`Tool::Ptxas`] or [`Tool::JitPtxas`]).
pub fn check_with(tool: Tool, ptx: &str, target: Target) -> Result<PtxasReport, PtxasError> {
    checked_log(tool, ptx, target.name()).map(|log| parse_report(&log))
}

/// The `-v` log of `ptx` assembled for `arch`, discarding the cubin. ptxas is deterministic,
/// so a process that checks one PTX text twice (the tests' matrices of variants, many of
/// which compile to the same kernel) runs it once: logs are kept for the process's life.
fn checked_log(tool: Tool, ptx: &str, arch: &str) -> Result<String, PtxasError> {
    type Key = (Tool, String, String);
    static LOGS: OnceLock<Mutex<HashMap<Key, String>>> = OnceLock::new();
    let logs = LOGS.get_or_init(Default::default);
    let key = (tool, arch.to_string(), ptx.to_string());
    if let Some(log) = logs.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(log.clone());
    }
    let log = assemble(tool, ptx, arch, Path::new("/dev/null"))?;
    logs.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, log.clone());
    Ok(log)
}

/// What ptxas made of one module: the cubin and its `-v` log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembled {
    /// The cubin, loadable with `cuModuleLoadData`.
    pub cubin: Vec<u8>,
    /// ptxas's verbose report (registers, spills, shared memory).
    pub log: String,
}

/// Assembles `ptx` into a cubin for GPU architecture `arch` (`sm_90a`; `sm_90` for portable
/// PTX on Hopper), whole-program as the driver JIT compiles a module: the runtime's disk cache
/// stores these.
pub fn cubin(ptx: &str, arch: &str) -> Result<Assembled, PtxasError> {
    let (_dir, path, log) = assemble_in_tempdir(ptx, arch)?;
    let cubin = std::fs::read(&path).map_err(|source| PtxasError::Spawn {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Assembled { cubin, log })
}

/// Assembles `ptx` for `arch` into `kernel.cubin` in a fresh temporary directory, which lives
/// as long as the returned handle; returns it, the cubin's path and the log.
fn assemble_in_tempdir(
    ptx: &str,
    arch: &str,
) -> Result<(tempfile::TempDir, PathBuf, String), PtxasError> {
    let dir = tempfile::tempdir().map_err(|source| PtxasError::Spawn {
        path: "a temporary directory".into(),
        source,
    })?;
    let path = dir.path().join("kernel.cubin");
    let log = assemble(Tool::Ptxas, ptx, arch, &path)?;
    Ok((dir, path, log))
}

/// The SASS of `ptx` assembled for `target`: ptxas writes the cubin, nvdisasm prints its code.
pub fn sass(ptx: &str, target: Target) -> Result<String, PtxasError> {
    let nvdisasm = find(Tool::Nvdisasm)?;
    let (_dir, path, _) = assemble_in_tempdir(ptx, target.name())?;
    let shown = nvdisasm.display().to_string();
    let out = Command::new(&nvdisasm)
        .arg("-c")
        .arg(&path)
        .output()
        .map_err(|source| PtxasError::Spawn {
            path: shown,
            source,
        })?;
    if !out.status.success() {
        return Err(PtxasError::Rejected {
            tool: Tool::Nvdisasm,
            arch: target.name().to_string(),
            at: Vec::new(),
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ptxas -v -arch <arch> -o <out>` on `ptx` with the assembler `tool`; returns its log.
fn assemble(tool: Tool, ptx: &str, arch: &str, out_path: &Path) -> Result<String, PtxasError> {
    let path = find(tool)?;
    let shown = path.display().to_string();
    let spawn = |source| PtxasError::Spawn {
        path: shown.clone(),
        source,
    };
    let mut child = Command::new(&path)
        .args(["-v", "-arch", arch, "-o"])
        .arg(out_path)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(ptx.as_bytes()).map_err(spawn)?;
    }
    let out = child.wait_with_output().map_err(spawn)?;
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(PtxasError::Rejected {
            tool,
            arch: arch.to_string(),
            at: crate::source_map::map_log(ptx, &log),
            log,
        });
    }
    Ok(log)
}

/// Reads registers, shared memory, stack and spills from `ptxas -v` output.
pub fn parse_report(log: &str) -> PtxasReport {
    let mut r = PtxasReport::default();
    for line in log.lines() {
        if line.contains("Used") && line.contains("registers") {
            r.registers = number_before(line, "registers").unwrap_or(0);
            r.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        } else if line.contains("bytes stack frame") {
            r.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            r.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            r.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("warning") || line.contains("(C75") {
            r.warnings.push(line.trim().to_string());
        }
    }
    r
}

/// The integer just before `marker` in `line` (`"Used 40 registers"`, `"registers"` -> 40).
fn number_before(line: &str, marker: &str) -> Option<u32> {
    let head = &line[..line.find(marker)?];
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_verbose_report() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_80'\n\
                   ptxas info    : Function properties for k\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 168 registers, used 1 barriers, 16384 bytes smem, 380 bytes cmem[0]\n";
        let r = parse_report(log);
        assert_eq!(r.registers, 168);
        assert_eq!(r.shared_bytes, 16384);
        assert_eq!(
            (r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes),
            (8, 4, 12)
        );
        assert!(r.spills());
    }
}
