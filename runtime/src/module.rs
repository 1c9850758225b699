//! JIT loading: PTX text to a loaded module and its entry function. The driver's JIT runs
//! through the `cuLink*` API, which hands back the cubin (kept in the disk cache, see
//! [`crate::disk_cache`]), with its error and info logs, so a rejected module reports
//! ptxas's own message; the cubin is loaded with `cuModuleLoadData`.

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, sys};
use kiln_ptx::PtxModule;

use crate::disk_cache::{CacheKey, CachedCubin, DiskCache};
use crate::error::{DriverContext, LaunchError, RuntimeError};

/// The JIT options [`jit`] passes, as the disk cache keys them.
const JIT_OPTIONS: &str = "error-log,info-log,log-verbose";

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
    /// The driver JIT (or the disk cache lookup), the module load and function setup.
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
    from_disk_cache: bool,
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

    /// Whether the cubin came from the disk cache (no JIT ran).
    pub fn from_disk_cache(&self) -> bool {
        self.from_disk_cache
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

/// Loads `ptx` into `ctx`: its cubin from `disk` when cached there (`driver_version` is part
/// of the key), else from the driver JIT, stored into `disk` for the next process (best effort:
/// an unwritable cache only costs that process the JIT). Then fetches the entry and opts into
/// its dynamic shared memory.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    ptx: PtxModule,
    limits: ModuleLimits,
    disk: Option<&DiskCache>,
    driver_version: i32,
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
    let entry = nul_terminated(&ptx.entry, "entry name")?;
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    let key = disk.map(|_| CacheKey::new(&ptx.ptx, ptx.target, driver_version, JIT_OPTIONS));
    let cached = disk.zip(key.as_ref()).and_then(|(d, k)| d.get(k));
    let from_disk_cache = cached.is_some();
    let compiled = match cached {
        Some(c) => c,
        None => {
            let c = jit(&ptx)?;
            if let (Some(d), Some(k)) = (disk, &key) {
                let _ = d.put(k, &c);
            }
            c
        }
    };
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the image is a whole cubin (the JIT's output, or a cache entry verified by hash).
    unsafe { sys::cuModuleLoadData(&mut module, compiled.cubin.as_ptr().cast()) }
        .result()
        .call("cuModuleLoadData")?;
    let mut kernel = LoadedKernel {
        ctx: ctx.clone(),
        module,
        function: std::ptr::null_mut(),
        info_log: compiled.log,
        ptx,
        times: CompileTimes::default(),
        from_disk_cache,
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

/// A `cuLink*` state, destroyed on drop (after which its cubin is gone).
struct LinkState(sys::CUlinkState);

impl Drop for LinkState {
    fn drop(&mut self) {
        // SAFETY: created by cuLinkCreate, destroyed only here.
        let _ = unsafe { sys::cuLinkDestroy(self.0) };
    }
}

/// The driver JIT of `ptx` (the context is current): the cubin and the info log, or the
/// error log in [`RuntimeError::Jit`].
fn jit(ptx: &PtxModule) -> Result<CachedCubin, LaunchError> {
    let text = nul_terminated(&ptx.ptx, "PTX text")?;
    // The logs outlive the link state, which the driver writes them through.
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
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: options and values have equal length; the log buffers and their sizes stay
    // valid until the state is destroyed (they are declared before it).
    unsafe {
        sys::cuLinkCreate_v2(
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &mut state,
        )
    }
    .result()
    .call("cuLinkCreate")?;
    let state = LinkState(state);
    let jit_error = |source, error_log: &[u8]| -> LaunchError {
        RuntimeError::Jit {
            entry: ptx.entry.clone(),
            source,
            log: log_text(error_log),
        }
        .into()
    };
    let bytes = text.as_bytes_with_nul();
    // SAFETY: the PTX is NUL-terminated and `bytes.len()` long; the name is a C string.
    let rc = unsafe {
        sys::cuLinkAddData_v2(
            state.0,
            sys::CUjitInputType::CU_JIT_INPUT_PTX,
            bytes.as_ptr().cast_mut().cast(),
            bytes.len(),
            c"kiln.ptx".as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if let Err(source) = rc.result() {
        return Err(jit_error(source, &error_log));
    }
    let (mut cubin, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
    // SAFETY: `state` is live; the outputs are written once.
    let rc = unsafe { sys::cuLinkComplete(state.0, &mut cubin, &mut size) };
    if let Err(source) = rc.result() {
        return Err(jit_error(source, &error_log));
    }
    // SAFETY: the driver owns `size` bytes at `cubin` until the state is destroyed; they are
    // copied before that.
    let image = unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec();
    drop(state);
    Ok(CachedCubin {
        cubin: image,
        log: log_text(&info_log),
    })
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
