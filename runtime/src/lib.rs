//! # kiln-runtime: the CUDA side of kiln
//!
//! Opens a GPU ([`Device`]), moves tensors to and from it ([`DeviceTensor`], with strided views)
//! and launches kernels ([`Device::launch`]: arguments checked against the signature, compiled
//! unless cached, JIT-loaded with the driver's error log). Other libraries' memory and streams
//! are borrowed ([`Device::borrow_tensor`], [`Device::launch_on_stream`]); `KILN_DUMP=ir,ptx`
//! dumps each specialisation ([`dump`]). The driver is loaded at run time, so the crate builds
//! and runs without CUDA: [`Device::new`] returns [`RuntimeError::NoDriver`]; nothing panics.

// The driver is loaded through cudarc's dynamic loading; without one
// `Device::is_available` is false.
//
// Architecture invariants: only kiln-runtime touches the driver (the IR, the backend and the
// macro never see a CUDA handle; everything device-side goes through this crate), and no
// launch reads or writes outside its tensors' allocations because of a wrong argument:
// shapes, strides, ranks and dtypes are checked on the host before every launch (`validate`),
// and the kernels mask against the extents passed. Foreign memory and streams: `foreign`.

pub mod autotune;
mod cluster;
mod compile_cache;
mod device;
pub mod disk_cache;
pub mod dump;
mod error;
mod foreign;
mod launch_ex;
mod layout;
mod module;
mod params;
mod tensor;
mod tensor_map_cache;
mod timing;
mod tma;
mod tma_rules;
mod validate;

pub use cluster::{ClusterError, ClusterLaunch, PORTABLE_CLUSTER_SIZE};
pub use device::{Device, KernelArg};
pub use disk_cache::DiskCache;
pub use error::{LaunchError, RuntimeError};
pub use foreign::ForeignStream;
pub use launch_ex::{KernelParams, launch_ex};
pub use layout::Layout;
pub use module::{CompileTimes, LoadedKernel, Origin};
pub use tensor::DeviceTensor;
pub use timing::{L2Flush, rotation_sets};
pub use tma::TensorMap;
pub use tma_rules::{L2Promotion, OobFill, Swizzle, TensorMapError};
