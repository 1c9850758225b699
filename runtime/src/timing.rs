//! Timing helpers for benchmarks: CUDA-event timing of work issued on the device's stream,
//! an L2 flush, and how many input sets to rotate over so that timed runs do not hit in L2.

use cudarc::driver::sys;

use crate::device::Device;
use crate::error::{DriverContext, RuntimeError};
use crate::tensor::DeviceTensor;
use kiln_ir::DType;

impl Device {
    /// Runs `f`, which issues GPU work, between two CUDA events on the device's stream, waits,
    /// and returns `f`'s result with the GPU time in milliseconds.
    pub fn time<R, E: From<RuntimeError>>(
        &self,
        f: impl FnOnce() -> Result<R, E>,
    ) -> Result<(R, f32), E> {
        let ctx = self.cuda_context();
        let stream = ctx.default_stream();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(flags).call("cuEventCreate")?;
        let end = ctx.new_event(flags).call("cuEventCreate")?;
        start.record(&stream).call("cuEventRecord")?;
        let r = f()?;
        end.record(&stream).call("cuEventRecord")?;
        let ms = start.elapsed_ms(&end).call("cuEventElapsedTime")?;
        Ok((r, ms))
    }
}

/// A buffer twice the L2 size; writing it evicts whatever a previous run left in L2.
#[derive(Debug)]
pub struct L2Flush {
    scratch: DeviceTensor,
}

impl L2Flush {
    /// Allocates the scratch buffer on `device`.
    pub fn new(device: &Device) -> Result<L2Flush, RuntimeError> {
        let words = (2 * device.l2_bytes()).max(1 << 20) / 4;
        Ok(L2Flush {
            scratch: device.alloc(DType::I32, &[words])?,
        })
    }

    /// Overwrites the scratch buffer on the device's stream (asynchronous).
    pub fn flush(&self) -> Result<(), RuntimeError> {
        self.scratch.fill_pattern(&0x5A5A_5A5Au32.to_le_bytes())
    }
}

/// How many distinct input sets of `bytes_per_set` bytes a benchmark must cycle through so
/// that together they exceed twice the L2 size (at least 2, at most `max_sets`).
pub fn rotation_sets(bytes_per_set: usize, l2_bytes: usize, max_sets: usize) -> usize {
    (2 * l2_bytes)
        .div_ceil(bytes_per_set.max(1))
        .clamp(2, max_sets.max(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_sets_exceed_twice_l2() {
        let l2 = 50 << 20;
        assert_eq!(rotation_sets(1 << 20, l2, 1000), 100);
        assert_eq!(rotation_sets(1 << 30, l2, 1000), 2);
        assert_eq!(rotation_sets(30 << 20, l2, 1000), 4);
        assert_eq!(rotation_sets(1, l2, 8), 8);
    }
}
