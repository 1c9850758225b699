//! Runs NVIDIA's offline assembler `ptxas` on generated PTX and reads its resource report.
//!
//! ptxas is not needed to compile or launch (the driver JIT-compiles PTX); it is the offline
//! check used by `kiln check`, the snapshot tests and CI. It comes from the pip package
//! `nvidia-cuda-nvcc` (version [`PTXAS_VERSION`]), installed by `scripts/ensure-ptxas`.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kiln_ir::Target;

/// The pinned ptxas release (pip `nvidia-cuda-nvcc`).
pub const PTXAS_VERSION: &str = "13.5.37";

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

/// Why ptxas could not check a module.
#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    /// No ptxas binary was found.
    #[error(
        "ptxas not found (looked at $KILN_PTXAS and {looked}); install it with scripts/ensure-ptxas \
         (pip package nvidia-cuda-nvcc=={PTXAS_VERSION})"
    )]
    NotFound {
        /// The default path that was tried.
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
    /// ptxas rejected the PTX.
    #[error("ptxas -arch={arch} rejected the PTX:\n{log}")]
    Rejected {
        /// The architecture.
        arch: &'static str,
        /// ptxas's output.
        log: String,
    },
}

/// The ptxas to use: `$KILN_PTXAS`, else `.tools/cuda/bin/ptxas` under the workspace root.
pub fn find_ptxas() -> Result<PathBuf, PtxasError> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Ok(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let default = root.join(".tools/cuda/bin/ptxas");
    if default.is_file() {
        Ok(default)
    } else {
        Err(PtxasError::NotFound {
            looked: default.display().to_string(),
        })
    }
}

/// Assembles `ptx` for `target` with `ptxas -v` and returns the report for its (single) entry.
pub fn check(ptx: &str, target: Target) -> Result<PtxasReport, PtxasError> {
    let path = find_ptxas()?;
    let shown = path.display().to_string();
    let spawn = |source| PtxasError::Spawn {
        path: shown.clone(),
        source,
    };
    let mut child = Command::new(&path)
        .args(["-v", "-arch", target.name(), "-o", "/dev/null", "-"])
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
            arch: target.name(),
            log,
        });
    }
    Ok(parse_report(&log))
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
