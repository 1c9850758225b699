//! Timing helpers for benchmarks: CUDA-event timing of work issued on the device's stream,
//! an L2 flush, and how many input sets to rotate over so that timed runs do not hit in L2.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use kiln_ir::{DType, Target};
use kiln_ptx::PtxModule;

use crate::device::Device;
use crate::error::{DriverContext, LaunchError, RuntimeError};
use crate::tensor::DeviceTensor;

/// How long the GPU is held before a timed interval starts: longer than any host path takes
/// to enqueue the timed work (tens of microseconds), so the start event runs only once that
/// work is queued behind it, and the interval is the work's GPU time, not the host's launch
/// latency as well.
pub const HOLD_NS: u64 = 200_000;

/// One thread spinning on the global timer for its parameter's nanoseconds.
const HOLD_PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry kiln_hold(.param .u64 ns)
{
\t.reg .pred %p;
\t.reg .b64 %rd<4>;
\tld.param.u64 %rd0, [ns];
\tmov.u64 %rd1, %globaltimer;
$Lspin:
\tmov.u64 %rd2, %globaltimer;
\tsub.u64 %rd3, %rd2, %rd1;
\tsetp.lt.u64 %p, %rd3, %rd0;
\t@%p bra $Lspin;
\tret;
}
";

impl Device {
    /// Runs `f`, which issues GPU work, between two CUDA events on the device's stream, waits,
    /// and returns `f`'s result with the GPU time in milliseconds. The GPU is held for
    /// `HOLD_NS` (200 us) before the start event, so what `f` enqueues is queued when the
    /// interval starts: the figure is GPU time alone, whatever `f`'s host work costs.
    pub fn time<R, E: From<RuntimeError> + From<LaunchError>>(
        &self,
        f: impl FnOnce() -> Result<R, E>,
    ) -> Result<(R, f32), E> {
        let ctx = self.cuda_context();
        let stream = ctx.default_stream();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(flags).call("cuEventCreate")?;
        let end = ctx.new_event(flags).call("cuEventCreate")?;
        self.hold(HOLD_NS)?;
        start.record(&stream).call("cuEventRecord")?;
        let r = f()?;
        end.record(&stream).call("cuEventRecord")?;
        let ms = start.elapsed_ms(&end).call("cuEventElapsedTime")?;
        Ok((r, ms))
    }

    /// Enqueues a kernel that keeps the GPU busy for `ns` nanoseconds on the null stream
    /// (asynchronous); its module is loaded on first use.
    pub fn hold(&self, ns: u64) -> Result<(), LaunchError> {
        let kernel = {
            // A poisoned lock only means another thread panicked mid-load; the slot is valid.
            let mut slot = self.hold_kernel().lock().unwrap_or_else(|e| e.into_inner());
            match &*slot {
                Some(k) => Arc::clone(k),
                None => {
                    let k = Arc::new(self.load_ptx(hold_module())?);
                    *slot = Some(Arc::clone(&k));
                    k
                }
            }
        };
        let mut ns = ns;
        let mut params = [(&raw mut ns).cast::<c_void>()];
        // SAFETY: the entry takes one u64, which `params` points at for the call; the null
        // stream belongs to the device's context.
        unsafe { kernel.launch([1, 1, 1], &mut params, std::ptr::null_mut()) }?;
        Ok(())
    }
}

/// The module of [`HOLD_PTX`].
fn hold_module() -> PtxModule {
    PtxModule {
        ptx: HOLD_PTX.to_string(),
        entry: "kiln_hold".into(),
        threads_per_block: 32,
        dynamic_smem_bytes: 0,
        target: Target::Sm80,
        tensor_maps: Vec::new(),
        persistent: false,
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
    fn the_hold_kernel_assembles() {
        for target in [Target::Sm80, Target::Sm90a] {
            let report = kiln_ptx::ptxas::check(HOLD_PTX, target).expect("ptxas");
            assert!(!report.spills(), "{target}: {report}");
        }
    }

    #[test]
    fn rotation_sets_exceed_twice_l2() {
        let l2 = 50 << 20;
        assert_eq!(rotation_sets(1 << 20, l2, 1000), 100);
        assert_eq!(rotation_sets(1 << 30, l2, 1000), 2);
        assert_eq!(rotation_sets(30 << 20, l2, 1000), 4);
        assert_eq!(rotation_sets(1, l2, 8), 8);
    }
}
