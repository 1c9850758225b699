//! Timing helpers for benchmarks: CUDA-event timing of work issued on the device's stream,
//! an L2 flush, and rotation over several input sets so that timed runs do not hit in L2.

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
    pub fn flush(&self, device: &Device) -> Result<(), RuntimeError> {
        device
            .cuda_context()
            .bind_to_thread()
            .call("cuCtxSetCurrent")?;
        let words = self.scratch.shape()[0];
        // SAFETY: the range is exactly the scratch allocation.
        unsafe {
            sys::cuMemsetD32Async(
                self.scratch.device_ptr(),
                0x5A5A_5A5A,
                words,
                std::ptr::null_mut(),
            )
        }
        .result()
        .call("cuMemsetD32Async")
    }
}

/// How many distinct input sets of `bytes_per_set` bytes a benchmark must cycle through so
/// that together they exceed twice the L2 size (at least 2, at most `max_sets`).
pub fn rotation_sets(bytes_per_set: usize, l2_bytes: usize, max_sets: usize) -> usize {
    (2 * l2_bytes)
        .div_ceil(bytes_per_set.max(1))
        .clamp(2, max_sets.max(2))
}

/// Cycles through a fixed list of items (input sets), one per timed run.
#[derive(Debug)]
pub struct Rotation<T> {
    items: Vec<T>,
    next: usize,
}

impl<T> Rotation<T> {
    /// Rotation over `items`; `None` if there are none.
    pub fn new(items: Vec<T>) -> Option<Rotation<T>> {
        (!items.is_empty()).then_some(Rotation { items, next: 0 })
    }

    /// The next item, wrapping around.
    pub fn next_item(&mut self) -> &T {
        let i = self.next;
        self.next = (i + 1) % self.items.len();
        &self.items[i]
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Always false: a rotation holds at least one item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
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

    #[test]
    fn rotation_wraps() {
        let mut r = Rotation::new(vec![1, 2, 3]).expect("non-empty");
        let got: Vec<i32> = (0..7).map(|_| *r.next_item()).collect();
        assert_eq!(got, [1, 2, 3, 1, 2, 3, 1]);
        assert!(Rotation::<i32>::new(vec![]).is_none());
    }
}
