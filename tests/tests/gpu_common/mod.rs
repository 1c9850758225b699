//! Helpers shared by the GPU test files (`gpu_*.rs`): the device or a printed skip, and
//! device tensors with non-contiguous outer strides.

use kiln_ir::HostTensor;
use kiln_runtime::{Device, DeviceTensor};

/// GPU 0 compiling for sm_80, or `None` after printing "skipped: no CUDA driver" (no driver
/// or no GPU).
pub fn device() -> Option<Device> {
    if !Device::is_available() {
        println!("skipped: no CUDA driver");
        return None;
    }
    // The portable target, on any GPU: sm_90a has its own tests (gpu_sm90a, gpu_tma).
    Some(
        Device::new(0)
            .expect("a driver and a GPU are present")
            .with_target(kiln_ir::Target::Sm80),
    )
}

/// `host` on the device as a view into a wider allocation: the innermost dimension is padded
/// by `pad` elements (poisoned with NaN), so every outer stride differs from the contiguous
/// one and a kernel that ignores strides reads NaN.
pub fn upload_padded(dev: &Device, host: &HostTensor, pad: usize) -> DeviceTensor {
    let mut wide_shape = host.shape.clone();
    let last = wide_shape.len() - 1;
    wide_shape[last] += pad;
    let wide = dev.alloc(host.dtype(), &wide_shape).expect("alloc");
    dev.fill_nan(&wide).expect("poison padding");
    let view = wide.narrow(last, 0, host.shape[last]).expect("view");
    view.copy_from_host(host).expect("copy");
    view
}
