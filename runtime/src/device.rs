//! [`Device`]: one GPU's context, its tensors, the compile cache and kernel launches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, DriverError, result, sys};
use kiln_ir::dsl::{KernelDef, ParamSig, Spec, specialise};
use kiln_ir::print::print_kernel;
use kiln_ir::{DType, HostTensor, Target};
use kiln_ptx::PtxModule;

use crate::compile_cache::{Choices, LoadedKernels};
use crate::disk_cache::{DiskCache, ModuleKey};
use crate::dump::DumpConfig;
use crate::error::{DriverContext, LaunchError, RuntimeError};
use crate::layout::Layout;
use crate::module::{self, LoadedKernel, ModuleLimits};
use crate::params::ParamBuffer;
use crate::tensor::{Buffer, DeviceTensor, nan_pattern};
use crate::tensor_map_cache::MapInputs;
use crate::tma::TensorMap;
use crate::tma_rules::{L2Promotion, MapEncoding, OobFill, Swizzle, TensorMapError};
use crate::validate::{ArgView, alignment, check_args, check_grid};

/// A launch argument, in signature order.
#[derive(Clone, Copy, Debug)]
pub enum KernelArg<'a> {
    /// A tensor (read-only or written: the signature says which).
    Tensor(&'a DeviceTensor),
    /// An `f32` scalar.
    F32(f32),
    /// An `i32` scalar.
    I32(i32),
    /// A `u32` scalar.
    U32(u32),
}

impl KernelArg<'_> {
    fn view(&self) -> ArgView<'_> {
        match self {
            KernelArg::Tensor(t) => ArgView::Tensor {
                layout: t.layout(),
                base: t.alloc_ptr(),
                alloc_bytes: t.alloc_bytes(),
                context: t.context_id(),
            },
            KernelArg::F32(v) => ArgView::F32(*v),
            KernelArg::I32(v) => ArgView::I32(*v),
            KernelArg::U32(v) => ArgView::U32(*v),
        }
    }
}

/// One GPU: a CUDA context (the device's primary context), the target kernels are compiled
/// for, and an in-memory cache of loaded kernels. All work goes to the context's null stream,
/// so copies, fills and launches run in the order they are issued.
#[derive(Debug)]
pub struct Device {
    ctx: Arc<CudaContext>,
    target: Target,
    name: String,
    driver_version: i32,
    compute_capability: (u32, u32),
    grid_max: [u32; 3],
    limits: ModuleLimits,
    l2_bytes: usize,
    dump: DumpConfig,
    disk_cache: Option<DiskCache>,
    persistent_ctas: Option<u32>,
    /// Loaded kernels by specialisation: looked up on every launch, with the launch's
    /// [`Spec`] itself as the key.
    cache: LoadedKernels,
    /// The autotuner's choices, by key (`crate::autotune`).
    tuned: Choices,
    /// The kernel that holds the GPU before a timed interval (`crate::timing`).
    hold: HoldSlot,
}

/// Where a device keeps the kernel `crate::timing` loads on first use to hold the GPU.
pub(crate) type HoldSlot = Mutex<Option<Arc<LoadedKernel>>>;

impl Device {
    /// Whether a CUDA driver can be loaded and reports at least one GPU. GPU tests call this
    /// to skip themselves; it never panics.
    pub fn is_available() -> bool {
        device_count().is_ok_and(|n| n > 0)
    }

    /// Opens GPU `ordinal`. Returns [`RuntimeError::NoDriver`] when `libcuda` cannot be
    /// loaded, the driver does not initialise, or there is no GPU; never panics for those.
    /// Kernels are compiled for the GPU's own target ([`Target::best_for`] its compute
    /// capability: sm_90a on Hopper) unless [`Device::with_target`] says otherwise.
    pub fn new(ordinal: usize) -> Result<Device, RuntimeError> {
        let count = device_count()?;
        if count == 0 {
            return Err(RuntimeError::NoDriver {
                reason: "the CUDA driver loaded but reports no GPU".into(),
            });
        }
        if ordinal >= count {
            return Err(RuntimeError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?;
        let attr = |a| -> Result<u32, RuntimeError> {
            Ok(ctx.attribute(a).call("cuDeviceGetAttribute")?.max(0) as u32)
        };
        use sys::CUdevice_attribute as A;
        let grid_max = [
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ];
        let compute_capability = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let limits = ModuleLimits {
            threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            smem_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            compute_capability,
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        };
        let l2_bytes = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
        let mut driver_version = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .call("cuDriverGetVersion")?;
        let name = ctx.name().call("cuDeviceGetName")?;
        Ok(Device {
            ctx,
            target: Target::best_for(compute_capability),
            name,
            driver_version,
            compute_capability,
            grid_max,
            limits,
            l2_bytes,
            dump: DumpConfig::from_env(),
            disk_cache: DiskCache::from_env(),
            persistent_ctas: None,
            cache: LoadedKernels::default(),
            tuned: Choices::default(),
            hold: HoldSlot::default(),
        })
    }

    /// The same device compiling kernels for `target` (the cache keys on the target, so
    /// nothing compiled for another target is reused).
    pub fn with_target(mut self, target: Target) -> Device {
        self.target = target;
        self
    }

    /// The same device with disk compile cache `cache` (`None`: no disk cache) instead of
    /// the one `KILN_CACHE_DIR` chose.
    pub fn with_disk_cache(mut self, cache: Option<DiskCache>) -> Device {
        self.disk_cache = cache;
        self
    }

    /// The same device launching persistent kernels with at most `ctas` CTAs (`None`: as
    /// many as the GPU runs at once), so each walks more work tiles (tests use this).
    pub fn with_persistent_ctas(mut self, ctas: Option<u32>) -> Device {
        self.persistent_ctas = ctas.map(|n| n.max(1));
        self
    }

    /// The target kernels are compiled for.
    pub fn target(&self) -> Target {
        self.target
    }

    /// The GPU's name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver's CUDA version as `cuDriverGetVersion` reports it (13000 for 13.0).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// Compute capability `(major, minor)`: `(9, 0)` on Hopper.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// Streaming multiprocessors (132 on the H200), which tile choices such as
    /// `kiln_examples::gemm::tuned_tile` fill.
    pub fn multiprocessors(&self) -> usize {
        self.limits.multiprocessors as usize
    }

    /// L2 cache size in bytes (for benchmarks that must defeat it).
    pub fn l2_bytes(&self) -> usize {
        self.l2_bytes
    }

    /// The underlying cudarc context, for libraries such as cuBLAS in benchmarks.
    pub fn cuda_context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn context_id(&self) -> usize {
        self.ctx.cu_ctx() as usize
    }

    /// A contiguous tensor of `dtype` and `shape`. Its contents are unspecified until written.
    pub fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, RuntimeError> {
        let layout = Layout::contiguous(dtype, shape);
        let bytes = layout.end_byte().ok_or_else(|| RuntimeError::Shape {
            what: "alloc shape",
            expected: "a size that fits in usize bytes".into(),
            got: format!("{shape:?} of {dtype}"),
        })?;
        Ok(DeviceTensor::new(Buffer::alloc(&self.ctx, bytes)?, layout))
    }

    /// Encodes a tiled TMA map over `tensor` (bf16, f16 or f32; rank 1..=5; innermost
    /// dimension contiguous) whose box has extents `box_dims`, **outermost first** like the
    /// tensor's shape. Every driver rule is checked first and reported as
    /// [`RuntimeError::TensorMap`]; the driver's own refusal is [`RuntimeError::Driver`].
    pub fn tensor_map(
        &self,
        tensor: &DeviceTensor,
        box_dims: &[u32],
        swizzle: Swizzle,
        l2_promotion: L2Promotion,
        oob_fill: OobFill,
    ) -> Result<TensorMap, RuntimeError> {
        if tensor.context_id() != self.context_id() {
            return Err(TensorMapError::ForeignTensor.into());
        }
        let encoding = MapEncoding {
            swizzle,
            l2_promotion,
            oob_fill,
        };
        TensorMap::tiled(tensor, box_dims, encoding)
    }

    /// A contiguous device copy of `host` (which may be strided).
    pub fn upload(&self, host: &HostTensor) -> Result<DeviceTensor, RuntimeError> {
        let t = self.alloc(host.dtype(), &host.shape)?;
        t.copy_from_host(host)?;
        Ok(t)
    }

    /// Poisons every element of the view with NaN (integers get `0x7FC00000`), so a test
    /// sees any output element a kernel failed to write.
    pub fn fill_nan(&self, tensor: &DeviceTensor) -> Result<(), RuntimeError> {
        tensor.fill_pattern(&nan_pattern(tensor.dtype()))
    }

    /// Waits for all work issued so far; reports a kernel's asynchronous failure.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.ctx.synchronize().call("cuCtxSynchronize")
    }

    /// Validates `args` against `def`'s signature and `grid` against the device's limits,
    /// specialises `def` (comptime values plus each tensor's 16-byte alignment), compiles and
    /// loads it unless the cache holds it, and launches it. Asynchronous: call
    /// [`Device::synchronize`] (or download a result) to see the kernel's own failures.
    pub fn launch<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        comptime: &K::Comptime,
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        // SAFETY: the null stream belongs to every context.
        unsafe { self.launch_on(std::ptr::null_mut(), def, comptime, grid, args) }
    }

    /// [`Device::launch`] on `stream` (null: the null stream); `crate::foreign` launches on a
    /// caller's stream through it.
    ///
    /// # Safety
    /// `stream` must be null or a live stream of this device's context.
    pub(crate) unsafe fn launch_on<K: KernelDef + ?Sized>(
        &self,
        stream: sys::CUstream,
        def: &K,
        comptime: &K::Comptime,
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        let views: Vec<ArgView<'_>> = args.iter().map(KernelArg::view).collect();
        check_grid(grid, self.grid_max)?;
        // Element types that are comptime parameters take this launch's values.
        let signature = specialise(def.signature(), comptime);
        check_args(def.name(), &signature, &views, self.context_id())?;
        let spec = Spec {
            comptime: comptime.clone(),
            aligned16: alignment(&signature, &views),
        };
        let kernel = self.compile(def, &spec)?;
        let maps = self.tensor_maps(&kernel, &signature, args)?;
        // SAFETY: the caller guarantees `stream`.
        unsafe { self.launch_views(&kernel, &signature, grid, &views, &maps, stream) }
    }

    /// Encodes the tensor maps an sm_90a entry takes ([`kiln_ptx::PtxModule::tensor_maps`]),
    /// each over its whole tensor argument, out-of-bounds elements read as zeros: the map a
    /// launch of the kernel encoded before from the same tensor inputs, else encoded now (host
    /// work only, no driver round trip to the GPU).
    fn tensor_maps(
        &self,
        kernel: &LoadedKernel,
        signature: &[ParamSig],
        args: &[KernelArg<'_>],
    ) -> Result<BTreeMap<usize, sys::CUtensorMap>, LaunchError> {
        let mut maps = BTreeMap::new();
        for spec in &kernel.ptx().tensor_maps {
            let Some(KernelArg::Tensor(t)) = args.get(spec.param) else {
                return Err(LaunchError::AbiMismatch {
                    slot: format!("tensor map of parameter {}", spec.param),
                });
            };
            if t.layout().shape.contains(&0) {
                // The driver refuses empty maps; an empty tensor is never loaded (the loop
                // over it has no iterations, or the grid has no blocks).
                maps.insert(spec.param, sys::CUtensorMap { opaque: [0; 16] });
                continue;
            }
            let inputs = MapInputs::of(spec.param, t);
            if let Some(map) = kernel.tensor_map_cache().get(&inputs) {
                maps.insert(spec.param, map);
                continue;
            }
            let swizzle = match spec.swizzle_bytes {
                32 => Swizzle::B32,
                64 => Swizzle::B64,
                128 => Swizzle::B128,
                _ => Swizzle::None,
            };
            let encoding = MapEncoding {
                swizzle,
                l2_promotion: L2Promotion::B256,
                oob_fill: OobFill::Zero,
            };
            // `check_args` has made sure `t` lives on this device's context.
            let map = TensorMap::tiled(t, &spec.box_dims, encoding).map_err(|source| {
                LaunchError::TensorMapArg {
                    param: signature
                        .get(spec.param)
                        .map_or_else(|| format!("#{}", spec.param), |p| p.name().to_string()),
                    source,
                }
            })?;
            kernel.tensor_map_cache().insert(inputs, *map.as_raw());
            maps.insert(spec.param, *map.as_raw());
        }
        Ok(maps)
    }

    /// Launches an already loaded kernel whose entry takes `signature`'s parameters, with
    /// the same validation as [`Device::launch`] (for hand-written PTX and benchmarks).
    pub fn launch_loaded(
        &self,
        kernel: &LoadedKernel,
        signature: &[ParamSig],
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        // SAFETY: the null stream belongs to every context.
        unsafe { self.launch_loaded_on(std::ptr::null_mut(), kernel, signature, grid, args) }
    }

    /// [`Device::launch_loaded`] on `stream` (null: the null stream).
    ///
    /// # Safety
    /// `stream` must be null or a live stream of this device's context.
    pub(crate) unsafe fn launch_loaded_on(
        &self,
        stream: sys::CUstream,
        kernel: &LoadedKernel,
        signature: &[ParamSig],
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        let views: Vec<ArgView<'_>> = args.iter().map(KernelArg::view).collect();
        check_grid(grid, self.grid_max)?;
        check_args(&kernel.ptx().entry, signature, &views, self.context_id())?;
        let maps = self.tensor_maps(kernel, signature, args)?;
        // SAFETY: the caller guarantees `stream`.
        unsafe { self.launch_views(kernel, signature, grid, &views, &maps, stream) }
    }

    /// The loaded kernel for `def` specialised by `spec`: from the in-memory cache, else from
    /// the disk cache, else compiled now.
    pub fn compile<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
    ) -> Result<Arc<LoadedKernel>, LaunchError> {
        self.cache.get_or_load(def.name(), self.target, spec, || {
            self.compile_from_disk(def, spec)
        })
    }

    /// Builds, compiles and loads `def` for `spec`, bypassing the in-memory and the disk
    /// cache (benchmarks time the driver JIT with this).
    pub fn compile_uncached<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
    ) -> Result<LoadedKernel, LaunchError> {
        self.compile_from(def, spec, None)
    }

    /// Builds, compiles and loads `def` for `spec` as a new process would: bypassing the
    /// in-memory cache, loading the cubin from the disk cache when it is there (benchmarks
    /// time warm starts with this).
    pub fn compile_from_disk<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
    ) -> Result<LoadedKernel, LaunchError> {
        self.compile_from(def, spec, self.disk_cache.as_ref())
    }

    fn compile_from<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
        disk: Option<&DiskCache>,
    ) -> Result<LoadedKernel, LaunchError> {
        let start = Instant::now();
        let kernel = def.build(spec)?;
        let build = start.elapsed();
        // A module the passes and the PTX writer made of this very kernel before, when the
        // disk cache has it: neither runs again (with IR or PTX dumps asked for, they do).
        let module_key =
            disk.map(|_| ModuleKey::new(&print_kernel(&kernel), self.target, self.driver_version));
        let reuse = !(self.dump.ir || self.dump.ptx);
        if let (Some(d), Some(key), true) = (disk, &module_key, reuse)
            && let Some(ptx) = d.get_module(key)
        {
            let mut loaded = self.load_with(ptx, disk)?;
            loaded.set_front_times(build, Duration::ZERO);
            return Ok(loaded);
        }
        self.dump.passes(&kernel, spec, self.target)?;
        let start = Instant::now();
        let ptx = kiln_ptx::compile(&kernel, self.target)?;
        let codegen = start.elapsed();
        self.dump.ptx(def.name(), spec, self.target, &ptx.ptx)?;
        let module = ptx.clone();
        let mut loaded = self.load_with(ptx, disk)?;
        loaded.set_front_times(build, codegen);
        if let (Some(d), Some(key)) = (disk, &module_key) {
            // Best effort, as for cubins: an unwritable cache only costs the next process
            // the passes.
            let _ = d.put_module(key, &module);
        }
        Ok(loaded)
    }

    /// Loads a PTX module: from the disk cache when it holds its cubin, else through the
    /// driver JIT (whose error log comes back in [`RuntimeError::Jit`]), caching the result.
    pub fn load_ptx(&self, ptx: PtxModule) -> Result<LoadedKernel, LaunchError> {
        self.load_with(ptx, self.disk_cache.as_ref())
    }

    fn load_with(
        &self,
        ptx: PtxModule,
        disk: Option<&DiskCache>,
    ) -> Result<LoadedKernel, LaunchError> {
        module::load(&self.ctx, ptx, self.limits, disk, self.driver_version)
    }

    /// Packs `views`, validated against `signature`, and launches `kernel` on `grid`; a
    /// persistent kernel gets `grid` as its logical grid and runs at most as many CTAs as
    /// the GPU holds at once (or [`Device::with_persistent_ctas`]); on `stream`.
    ///
    /// # Safety
    /// `stream` must be null or a live stream of this device's context.
    unsafe fn launch_views(
        &self,
        kernel: &LoadedKernel,
        signature: &[ParamSig],
        grid: [u32; 3],
        views: &[ArgView<'_>],
        maps: &BTreeMap<usize, sys::CUtensorMap>,
        stream: sys::CUstream,
    ) -> Result<(), LaunchError> {
        let (physical, logical) = if kernel.ptx().persistent {
            let cap = kernel
                .resident_ctas()
                .min(self.persistent_ctas.unwrap_or(u32::MAX));
            let ctas = persistent_ctas(&kernel.ptx().entry, grid, cap, kernel.cluster_width())?;
            ([ctas, 1, 1], Some(grid))
        } else {
            (grid, None)
        };
        let mut params = ParamBuffer::pack(signature, views, maps, logical)?;
        let mut ptrs = params.pointers();
        // SAFETY: the views were validated against the signature the entry was compiled from
        // (count, kinds, dtypes, ranks, bounds), and are packed per the ABI; the caller
        // guarantees `stream`.
        unsafe { kernel.launch(physical, &mut ptrs, stream) }?;
        Ok(())
    }

    /// The autotuner's choices made in this process.
    pub(crate) fn tuned_choices(&self) -> &Choices {
        &self.tuned
    }

    /// Where the timing hold kernel is kept once loaded (`crate::timing`).
    pub(crate) fn hold_kernel(&self) -> &HoldSlot {
        &self.hold
    }

    /// The disk compile cache this device uses (`KILN_CACHE_DIR`, see [`DiskCache`]), if any.
    pub fn disk_cache(&self) -> Option<&DiskCache> {
        self.disk_cache.as_ref()
    }
}

/// The CTAs a persistent kernel `kernel` runs on logical grid `grid` in clusters of `width`
/// along x: one per work tile (a cluster per `width` x-adjacent tiles, the last group padded:
/// `kiln_ir::cluster`), at most `cap`, a whole number of clusters (at least one); an error
/// when the grid has more tiles than the kernel counts (it steps a u32 tile index by the CTA
/// count past the last).
fn persistent_ctas(kernel: &str, grid: [u32; 3], cap: u32, width: u32) -> Result<u32, LaunchError> {
    let width = width.max(1);
    let [nx, ny, nz] = grid;
    let tiles = kiln_ir::sched::tiles::TileScheduler::tiles([nx.div_ceil(width), ny, nz])
        * u64::from(width);
    let max = u64::from(i32::MAX as u32);
    if tiles > max {
        return Err(LaunchError::Tiles {
            kernel: kernel.to_string(),
            tiles,
            max,
        });
    }
    let ctas = (tiles as u32).min(cap);
    Ok((ctas - ctas % width).max(width))
}

/// Loads the driver library, initialises it, and counts GPUs; the one place that decides
/// whether a driver exists.
fn device_count() -> Result<usize, RuntimeError> {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err(RuntimeError::NoDriver {
            reason: "libcuda (libcuda.so / libcuda.so.1) could not be loaded".into(),
        });
    }
    let no_driver = |call: &str, e: DriverError| RuntimeError::NoDriver {
        reason: format!("{call} failed: {e}"),
    };
    result::init().map_err(|e| no_driver("cuInit", e))?;
    let n = result::device::get_count().map_err(|e| no_driver("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistent_kernels_run_at_most_the_resident_ctas() {
        assert_eq!(
            persistent_ctas("k", [64, 16, 2], 132, 1).expect("fits"),
            132
        );
        assert_eq!(persistent_ctas("k", [3, 1, 1], 132, 1).expect("fits"), 3);
        assert_eq!(persistent_ctas("k", [3, 1, 1], 0, 1).expect("fits"), 1);
        let err = persistent_ctas("k", [1 << 20, 1 << 12, 1], 132, 1).expect_err("too many tiles");
        assert!(err.to_string().contains("at most 2147483647"), "{err}");
    }

    #[test]
    fn clustered_persistent_kernels_launch_whole_clusters() {
        // 5 x 3 tiles in pairs along x: 3 x 3 pairs, the last of each row ragged, 18 CTAs.
        assert_eq!(persistent_ctas("k", [5, 3, 1], 132, 2).expect("fits"), 18);
        // A cap rounds down to whole clusters, and at least one cluster runs.
        assert_eq!(persistent_ctas("k", [5, 3, 1], 7, 2).expect("fits"), 6);
        assert_eq!(persistent_ctas("k", [5, 3, 1], 1, 2).expect("fits"), 2);
        assert_eq!(persistent_ctas("k", [1, 1, 1], 132, 2).expect("fits"), 2);
    }

    /// On a machine without a driver (CI), opening a device is an error, not a panic; on a
    /// GPU machine it succeeds. Either way the two answers agree.
    #[test]
    fn new_agrees_with_is_available_and_never_panics() {
        match Device::new(0) {
            Ok(d) => {
                assert!(Device::is_available());
                assert!(!d.name().is_empty());
            }
            Err(e) => {
                assert!(!Device::is_available());
                assert!(matches!(e, RuntimeError::NoDriver { .. }), "{e}");
                assert!(e.to_string().starts_with("no CUDA driver: "), "{e}");
            }
        }
    }

    #[test]
    fn ordinal_past_the_device_count_is_no_device_or_no_driver() {
        let err = Device::new(1 << 20).expect_err("no machine has 2^20 GPUs");
        assert!(
            matches!(
                err,
                RuntimeError::NoDevice {
                    ordinal: 1048576,
                    ..
                } | RuntimeError::NoDriver { .. }
            ),
            "{err}"
        );
    }
}
