//! Loading: PTX text to a loaded module and its entry function. A module comes from the disk
//! cache's cubin when it holds one; else from ptxas's cubin, which the disk cache then keeps
//! (see [`crate::disk_cache`]); else from the driver JIT (`cuModuleLoadDataEx`), whose error
//! log a rejected module reports ([`Origin`]).

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, DriverError, sys};
use kiln_ir::Target;
use kiln_ptx::PtxModule;

use crate::disk_cache::{CacheKey, CachedCubin, DiskCache};
use crate::error::{DriverContext, LaunchError, RuntimeError};
use crate::tensor_map_cache::TensorMapCache;

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

/// Where a loaded module's code came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A cubin from the disk cache: nothing was compiled.
    DiskCache,
    /// ptxas's cubin, now also in the disk cache. Not the driver's `cuLink*` JIT's: that
    /// compiles PTX as relocatable code, where ptxas ignores the register budget `setmaxnreg`
    /// raises and spills (268 bytes in the sm_90a attention at d=128, measured at half the
    /// speed); ptxas and the module JIT both compile whole-program, to the same code.
    Ptxas,
    /// The driver JIT.
    DriverJit {
        /// Why ptxas did not make the cubin, when a disk cache was in use (ptxas not found,
        /// it rejected the PTX, or the driver refused its cubin).
        ptxas_skipped: Option<String>,
    },
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
    origin: Origin,
    /// CTAs of it the GPU runs at once (its occupancy on every multiprocessor; for a
    /// clustered kernel, the clusters that fit at once times their size).
    resident_ctas: u32,
    /// CTAs per cluster along x the entry requires (`.reqnctapercluster`; 1 for none).
    cluster_width: u32,
    /// The tensor maps its launches encoded, for the next launch over the same tensors.
    tensor_maps: TensorMapCache,
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

    /// Where its code came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// CTAs of this kernel the GPU runs at once: a persistent kernel launches at most these.
    pub fn resident_ctas(&self) -> u32 {
        self.resident_ctas
    }

    /// CTAs per cluster along x that the entry requires (1 when it requires no cluster): a
    /// launch's x extent must be a multiple of it.
    pub fn cluster_width(&self) -> u32 {
        self.cluster_width
    }

    /// The tensor maps its launches encoded ([`Device`](crate::Device)'s launches reuse them).
    pub(crate) fn tensor_map_cache(&self) -> &TensorMapCache {
        &self.tensor_maps
    }

    /// Whether the cubin came from the disk cache (nothing was compiled).
    pub fn from_disk_cache(&self) -> bool {
        self.origin == Origin::DiskCache
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

    /// Launches on `stream` (null: the context's null stream) with `params` (one pointer per
    /// ABI slot).
    ///
    /// # Safety
    /// `params` must match the entry's parameter list in count and widths, and every address
    /// in it must be valid for what the kernel accesses; `stream` must be null or a live
    /// stream of the kernel's context.
    pub(crate) unsafe fn launch(
        &self,
        grid: [u32; 3],
        params: &mut [*mut c_void],
        stream: sys::CUstream,
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
                stream,
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
    /// The GPU's compute capability, which its cubins are assembled for.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

/// The architecture ptxas assembles `target`'s PTX for on a GPU of `compute_capability`:
/// arch-specific PTX runs only on its own GPU; portable PTX is compiled for the GPU's own
/// SASS, since an sm_80 cubin does not run on sm_90.
fn device_arch(target: Target, compute_capability: (u32, u32)) -> String {
    match target {
        Target::Sm80 => format!("sm_{}{}", compute_capability.0, compute_capability.1),
        Target::Sm90a | Target::Sm100a => target.name().to_string(),
    }
}

/// Loads `ptx` into `ctx`: its cubin from `disk` when cached there (`driver_version` is part
/// of the key); else, with a disk cache, ptxas's cubin, stored into `disk` for the next process
/// (best effort: an unwritable cache only costs that process the assembly); else the driver
/// JIT. Then fetches the entry and opts into its dynamic shared memory.
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
    let arch = device_arch(ptx.target, limits.compute_capability);
    let cache = disk.map(|d| {
        let assembler = format!("ptxas -v -arch {arch}");
        let key = CacheKey::new(&ptx.ptx, ptx.target, driver_version, &assembler);
        (d, key)
    });
    let cached = cache.as_ref().and_then(|(d, k)| d.get(k));
    let (module, info_log, origin) = match (cached, cache) {
        (Some(c), _) => (
            load_cubin(&c.cubin).call("cuModuleLoadData")?,
            c.log,
            Origin::DiskCache,
        ),
        (None, Some((d, k))) => match assemble_into(d, &k, &ptx, &arch) {
            Ok((module, log)) => (module, log, Origin::Ptxas),
            Err(why) => {
                let (module, log) = jit(&ptx)?;
                let ptxas_skipped = Some(why);
                (module, log, Origin::DriverJit { ptxas_skipped })
            }
        },
        (None, None) => {
            let (module, log) = jit(&ptx)?;
            (
                module,
                log,
                Origin::DriverJit {
                    ptxas_skipped: None,
                },
            )
        }
    };
    let mut kernel = LoadedKernel {
        ctx: ctx.clone(),
        module,
        function: std::ptr::null_mut(),
        info_log,
        ptx,
        times: CompileTimes::default(),
        origin,
        resident_ctas: 0,
        cluster_width: 1,
        tensor_maps: TensorMapCache::default(),
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
    kernel.cluster_width = kernel
        .attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)?
        .max(1) as u32;
    kernel.resident_ctas = if kernel.cluster_width > 1 {
        // A cluster's CTAs share a GPC, so fewer of them may fit at once than one per
        // multiprocessor: ask the driver for whole clusters.
        resident_clusters(&kernel)? * kernel.cluster_width
    } else {
        let mut per_sm = 0;
        // SAFETY: `function` is live; the block size and shared memory are the launch's own.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                kernel.function,
                kernel.ptx.threads_per_block as i32,
                kernel.ptx.dynamic_smem_bytes as usize,
            )
        }
        .result()
        .call("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        (per_sm.max(1) as u32) * limits.multiprocessors.max(1)
    };
    kernel.times.load = start.elapsed();
    Ok(kernel)
}

/// Clusters of `kernel` (which requires its cluster shape) the GPU runs at once, at least 1.
fn resident_clusters(kernel: &LoadedKernel) -> Result<u32, RuntimeError> {
    let config = sys::CUlaunchConfig {
        gridDimX: kernel.cluster_width,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: kernel.ptx.threads_per_block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: kernel.ptx.dynamic_smem_bytes,
        hStream: std::ptr::null_mut(),
        // The entry's required cluster shape applies; the config names none.
        attrs: std::ptr::null_mut(),
        numAttrs: 0,
    };
    let mut clusters = 0;
    // SAFETY: `function` is live and its context current; `config` outlives the call.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, kernel.function, &config) }
        .result()
        .call("cuOccupancyMaxActiveClusters")?;
    Ok(clusters.max(1) as u32)
}

/// A module from a cubin (the context is current).
fn load_cubin(cubin: &[u8]) -> Result<sys::CUmodule, DriverError> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the image is a whole cubin (ptxas's output, or a cache entry verified by hash);
    // the driver reads its length from the ELF header.
    unsafe { sys::cuModuleLoadData(&mut module, cubin.as_ptr().cast()) }.result()?;
    Ok(module)
}

/// The module and log from ptxas's cubin of `ptx` for `arch`, kept in `disk` under `key`; why not when
/// ptxas is not installed, rejects the PTX (the JIT then reports the error), or makes a cubin
/// this driver does not load (a newer CUDA major version).
fn assemble_into(
    disk: &DiskCache,
    key: &CacheKey,
    ptx: &PtxModule,
    arch: &str,
) -> Result<(sys::CUmodule, String), String> {
    let assembled = kiln_ptx::ptxas::cubin(&ptx.ptx, arch).map_err(|e| e.to_string())?;
    let module = load_cubin(&assembled.cubin)
        .map_err(|e| format!("the driver did not load ptxas's cubin: {e:?}"))?;
    let entry = CachedCubin {
        cubin: assembled.cubin,
        log: assembled.log.trim().to_string(),
    };
    let _ = disk.put(key, &entry);
    Ok((module, entry.log))
}

/// The driver JIT of `ptx` (the context is current): the module and the JIT's info log, or
/// the error log in [`RuntimeError::Jit`].
fn jit(ptx: &PtxModule) -> Result<(sys::CUmodule, String), LaunchError> {
    let text = nul_terminated(&ptx.ptx, "PTX text")?;
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
    match rc.result() {
        Ok(()) => Ok((module, log_text(&info_log))),
        Err(source) => Err(RuntimeError::Jit {
            entry: ptx.entry.clone(),
            source,
            // The JIT is ptxas: its errors name PTX lines, which map to the user's.
            log: kiln_ptx::source_map::annotate(&ptx.ptx, &log_text(&error_log)),
        }
        .into()),
    }
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
    fn portable_ptx_is_assembled_for_the_gpu_it_runs_on() {
        assert_eq!(device_arch(Target::Sm80, (9, 0)), "sm_90");
        assert_eq!(device_arch(Target::Sm80, (8, 6)), "sm_86");
        assert_eq!(device_arch(Target::Sm90a, (9, 0)), "sm_90a");
    }

    #[test]
    fn nul_in_ptx_is_an_error_not_a_panic() {
        let err = nul_terminated("a\0b", "PTX text").expect_err("has NUL");
        assert!(err.to_string().contains("NUL byte at offset 1"), "{err}");
    }
}
