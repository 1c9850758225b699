//! Launches through `cuLaunchKernelEx`: thread-block clusters
//! (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`) and parameter lists with TMA descriptors passed by
//! value ([`KernelParams`]), for Hopper kernels whose parameters the kiln ABI's
//! [`KernelArg`](crate::KernelArg) cannot yet express. The cluster shape is checked on the host
//! ([`ClusterError`](crate::ClusterError)); the parameters are not checked against the entry, so
//! [`launch_ex`] is `unsafe`.

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::cluster::ClusterLaunch;
use crate::error::{DriverContext, LaunchError, RuntimeError};
use crate::module::LoadedKernel;
use crate::tensor::DeviceTensor;
use crate::tma::TensorMap;

/// One parameter's value, stored at its own alignment so the driver can read it in place.
#[derive(Clone, Debug)]
enum Param {
    /// A `CUtensorMap` for a `.param .align 64 .b8 name[128]` slot.
    TensorMap(Box<sys::CUtensorMap>),
    /// A `.u64` (device address) or `.s64` slot.
    U64(Box<u64>),
    /// A `.u32`/`.s32` slot.
    U32(Box<u32>),
    /// A `.f32` slot.
    F32(Box<f32>),
}

/// An entry's parameter values in declaration order, for [`launch_ex`]. Each value is boxed,
/// so the pointers handed to the driver stay valid however many are appended.
///
/// A tensor map is copied in whole (the driver then copies its 128 bytes into the kernel's
/// parameter space, which is what "by value" means for `__grid_constant__ CUtensorMap`).
#[derive(Clone, Debug, Default)]
pub struct KernelParams {
    params: Vec<Param>,
}

impl KernelParams {
    /// No parameters.
    pub fn new() -> KernelParams {
        KernelParams::default()
    }

    /// Appends a tensor map for a `.param .align 64 .b8 name[128]` parameter.
    pub fn tensor_map(&mut self, map: &TensorMap) -> &mut KernelParams {
        self.params.push(Param::TensorMap(Box::new(*map.as_raw())));
        self
    }

    /// Appends the device address of `tensor`'s element `[0, .., 0]` for a `.u64` parameter.
    pub fn pointer(&mut self, tensor: &DeviceTensor) -> &mut KernelParams {
        self.u64(tensor.device_ptr())
    }

    /// Appends a `.u64` parameter.
    pub fn u64(&mut self, v: u64) -> &mut KernelParams {
        self.params.push(Param::U64(Box::new(v)));
        self
    }

    /// Appends an `.s64` parameter.
    pub fn i64(&mut self, v: i64) -> &mut KernelParams {
        self.u64(v as u64)
    }

    /// Appends a `.u32` parameter.
    pub fn u32(&mut self, v: u32) -> &mut KernelParams {
        self.params.push(Param::U32(Box::new(v)));
        self
    }

    /// Appends an `.s32` parameter.
    pub fn i32(&mut self, v: i32) -> &mut KernelParams {
        self.u32(v as u32)
    }

    /// Appends an `.f32` parameter.
    pub fn f32(&mut self, v: f32) -> &mut KernelParams {
        self.params.push(Param::F32(Box::new(v)));
        self
    }

    /// How many parameters were appended.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// One pointer per parameter, as `kernelParams` wants; valid while `self` is alive and
    /// not modified.
    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.params
            .iter_mut()
            .map(|p| match p {
                Param::TensorMap(m) => (&mut **m as *mut sys::CUtensorMap).cast(),
                Param::U64(v) => (&mut **v as *mut u64).cast(),
                Param::U32(v) => (&mut **v as *mut u32).cast(),
                Param::F32(v) => (&mut **v as *mut f32).cast(),
            })
            .collect()
    }
}

/// Launches `kernel` with `cuLaunchKernelEx` on its context's null stream: `shape.grid` CTAs
/// of the kernel's `threads_per_block` threads and `dynamic_smem_bytes`, in clusters of
/// `shape.cluster`. Asynchronous, like [`Device::launch`](crate::Device::launch).
///
/// # Safety
/// `params` must match the entry's parameter list in count, order and widths; every address
/// in it (tensor maps included) must stay valid for what the kernel accesses until the launch
/// completes (keep the tensors and maps alive until a synchronize).
pub unsafe fn launch_ex(
    kernel: &LoadedKernel,
    shape: ClusterLaunch,
    params: &mut KernelParams,
) -> Result<(), LaunchError> {
    shape.check()?;
    let (ctx, function) = kernel.raw_handle();
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    if shape.non_portable {
        // SAFETY: `function` is a live handle of the current context.
        unsafe {
            sys::cuFuncSetAttribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
        }
        .result()
        .call("cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")?;
    }
    // A zeroed union is a valid value of every member; only `clusterDim` is read for this id.
    // SAFETY: the attribute value union is plain data (integers, pointers, arrays).
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: shape.cluster[0],
        y: shape.cluster[1],
        z: shape.cluster[2],
    };
    // Without a cluster the attribute is left out, so the path also works before Hopper.
    let num_attrs = u32::from(shape.cluster_size() > 1);
    let ptx = kernel.ptx();
    let config = sys::CUlaunchConfig {
        gridDimX: shape.grid[0],
        gridDimY: shape.grid[1],
        gridDimZ: shape.grid[2],
        blockDimX: ptx.threads_per_block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: ptx.dynamic_smem_bytes,
        hStream: std::ptr::null_mut(),
        attrs: &mut attr,
        numAttrs: num_attrs,
    };
    let mut ptrs = params.pointers();
    // SAFETY: the caller guarantees the parameters; `config` and its attribute outlive the
    // call; the shared memory need was opted into when the module was loaded.
    unsafe { sys::cuLaunchKernelEx(&config, function, ptrs.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .call("cuLaunchKernelEx")
        .map_err(|e: RuntimeError| e.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_point_at_their_values_in_order() {
        let mut p = KernelParams::new();
        p.u64(0x1000).i32(-3).f32(0.5).i64(-1);
        for i in 0..100 {
            p.u32(i);
        }
        let ptrs = p.pointers();
        assert_eq!(ptrs.len(), 104);
        // SAFETY: the pointers point into `p`'s boxes, which are alive and unmodified.
        unsafe {
            assert_eq!(*ptrs[0].cast::<u64>(), 0x1000);
            assert_eq!(*ptrs[1].cast::<i32>(), -3);
            assert_eq!(*ptrs[2].cast::<f32>(), 0.5);
            assert_eq!(*ptrs[3].cast::<i64>(), -1);
            assert_eq!(*ptrs[103].cast::<u32>(), 99);
        }
    }
}
