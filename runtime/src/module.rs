//! JIT loading: PTX text to a loaded module and its entry function, through
//! `cuModuleLoadDataEx` with the driver's error and info logs, so a rejected module reports
//! ptxas's own message.

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, sys};
use kiln_ptx::PtxModule;

use crate::error::{DriverContext, LaunchError, RuntimeError};

/// Bytes reserved for each JIT log; ptxas `-v` output for one entry fits easily.
const LOG_BYTES: usize = 16 * 1024;

/// Dynamic shared memory a launch may use without opting in per function.
const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

/// Wall-clock time of each compilation stage of one kernel specialisation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CompileTimes {
    /// `KernelDef::build`: the macro's code building the IR.
    pub build: Duration,
    /// `kiln_ptx::compile`: passes and PTX emission.
    pub codegen: Duration,
    /// The driver JIT (`cuModuleLoadDataEx`) and function setup.
    pub load: Duration,
}

/// A PTX module loaded into a context, with its entry function ready to launch. Unloaded on drop.
#[derive(Debug)]
pub struct LoadedKernel {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    ptx: PtxModule,
    info_log: String,
    times: CompileTimes,
}

// SAFETY: CUmodule and CUfunction are driver handles usable from any thread once their context
// is current; every use binds the context first, and the module is unloaded once, on drop.
unsafe impl Send for LoadedKernel {}
// SAFETY: as above; no method mutates the handles.
unsafe impl Sync for LoadedKernel {}

impl LoadedKernel {
    /// The PTX and launch geometry it was loaded from.
    pub fn ptx(&self) -> &PtxModule {
        &self.ptx
    }

    /// The driver JIT's info log (ptxas `-v`: registers, spills, shared memory).
    pub fn info_log(&self) -> &str {
        &self.info_log
    }

    /// How long each compilation stage took.
    pub fn times(&self) -> CompileTimes {
        self.times
    }

    /// Records the build and codegen times (the load time is measured by [`load`]).
    pub(crate) fn set_front_times(&mut self, build: Duration, codegen: Duration) {
        self.times.build = build;
        self.times.codegen = codegen;
    }

    /// Registers per thread, as the driver reports them.
    pub fn num_regs(&self) -> Result<i32, RuntimeError> {
        self.attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
    }

    /// Local memory per thread in bytes (non-zero means register spills or local arrays).
    pub fn local_bytes(&self) -> Result<i32, RuntimeError> {
        self.attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
    }

    fn attribute(&self, attr: sys::CUfunction_attribute) -> Result<i32, RuntimeError> {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut v = 0;
        // SAFETY: `function` is a live handle of this context.
        unsafe { sys::cuFuncGetAttribute(&mut v, attr, self.function) }
            .result()
            .call("cuFuncGetAttribute")?;
        Ok(v)
    }

    /// The owning context and the entry's driver handle, for launch paths outside this module
    /// (`launch_ex`).
    pub(crate) fn raw_handle(&self) -> (&Arc<CudaContext>, sys::CUfunction) {
        (&self.ctx, self.function)
    }

    /// Launches on the context's null stream with `params` (one pointer per ABI slot).
    ///
    /// # Safety
    /// `params` must match the entry's parameter list in count and widths, and every address
    /// in it must be valid for what the kernel accesses.
    pub(crate) unsafe fn launch(
        &self,
        grid: [u32; 3],
        params: &mut [*mut c_void],
    ) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the caller guarantees the parameters; geometry comes from the PtxModule,
        // whose shared memory need was opted into at load.
        unsafe {
            sys::cuLaunchKernel(
                self.function,
                grid[0],
                grid[1],
                grid[2],
                self.ptx.threads_per_block,
                1,
                1,
                self.ptx.dynamic_smem_bytes,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .call("cuLaunchKernel")
    }
}

impl Drop for LoadedKernel {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: loaded in `load`, unloaded only here.
        self.ctx
            .record_err(unsafe { sys::cuModuleUnload(self.module) }.result());
    }
}

/// Device limits a kernel's launch geometry is checked against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModuleLimits {
    /// Most threads per block.
    pub threads_per_block: u32,
    /// Most dynamic shared memory per block after opting in (attribute 97).
    pub smem_optin: u32,
}

/// JIT-loads `ptx` into `ctx`, fetches its entry, and opts into its dynamic shared memory.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    ptx: PtxModule,
    limits: ModuleLimits,
) -> Result<LoadedKernel, LaunchError> {
    let resource = |resource, needed, max| LaunchError::Resource {
        kernel: ptx.entry.clone(),
        resource,
        needed,
        max,
    };
    if ptx.threads_per_block == 0 || ptx.threads_per_block > limits.threads_per_block {
        return Err(resource(
            "threads per block",
            ptx.threads_per_block,
            limits.threads_per_block,
        ));
    }
    if ptx.dynamic_smem_bytes > limits.smem_optin {
        return Err(resource(
            "bytes of dynamic shared memory",
            ptx.dynamic_smem_bytes,
            limits.smem_optin,
        ));
    }
    let start = std::time::Instant::now();
    let text = nul_terminated(&ptx.ptx, "PTX text")?;
    let entry = nul_terminated(&ptx.entry, "entry name")?;
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;

    let mut error_log = vec![0u8; LOG_BYTES];
    let mut info_log = vec![0u8; LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_LOG_VERBOSE,
    ];
    // Size and flag options carry their value in the pointer itself (cuda.h).
    let mut values: [*mut c_void; 5] = [
        error_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG_BYTES),
        info_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG_BYTES),
        std::ptr::without_provenance_mut(1),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the image is NUL-terminated; the log buffers outlive the call and their sizes
    // are given; options and values have equal length.
    let rc = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            text.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if let Err(source) = rc.result() {
        return Err(RuntimeError::Jit {
            entry: ptx.entry.clone(),
            source,
            log: log_text(&error_log),
        }
        .into());
    }
    let mut kernel = LoadedKernel {
        ctx: ctx.clone(),
        module,
        function: std::ptr::null_mut(),
        info_log: log_text(&info_log),
        ptx,
        times: CompileTimes::default(),
    };
    // SAFETY: `module` is live; `entry` is NUL-terminated.
    unsafe { sys::cuModuleGetFunction(&mut kernel.function, module, entry.as_ptr()) }
        .result()
        .call("cuModuleGetFunction")?;
    if kernel.ptx.dynamic_smem_bytes > DEFAULT_SMEM_LIMIT {
        // SAFETY: `function` is live; the size was checked against the device's opt-in limit.
        unsafe {
            sys::cuFuncSetAttribute(
                kernel.function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernel.ptx.dynamic_smem_bytes as i32,
            )
        }
        .result()
        .call("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
    }
    kernel.times.load = start.elapsed();
    Ok(kernel)
}

/// `text` as a C string, or a typed error if it holds a NUL byte.
fn nul_terminated(text: &str, what: &'static str) -> Result<CString, RuntimeError> {
    CString::new(text).map_err(|e| RuntimeError::Shape {
        what,
        expected: "text without NUL bytes".into(),
        got: format!("a NUL byte at offset {}", e.nul_position()),
    })
}

/// The text of a NUL-terminated log buffer, trimmed.
fn log_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_text_stops_at_nul_and_trims() {
        let mut buf = b"ptxas error : bad\n\0garbage".to_vec();
        buf.resize(40, 0);
        assert_eq!(log_text(&buf), "ptxas error : bad");
    }

    #[test]
    fn nul_in_ptx_is_an_error_not_a_panic() {
        let err = nul_terminated("a\0b", "PTX text").expect_err("has NUL");
        assert!(err.to_string().contains("NUL byte at offset 1"), "{err}");
    }
}
