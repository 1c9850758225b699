//! The kernels under test: the device with the chosen target, and their comptime values
//! autotuned.

use kiln_ir::dsl::{KernelDef, Spec};
use kiln_runtime::{Device, LaunchError};
use serde_json::Value;

use crate::cli::Args;
use crate::error::BenchError;

/// GPU 0, compiling for `--target` or, by default, the runtime's default target (the GPU's own: sm_90a on Hopper, which
/// runs on Hopper and Blackwell; pass `--target sm_90a` once the backend implements it).
pub fn device(args: &Args) -> Result<Device, BenchError> {
    let device = Device::new(0)?;
    Ok(match args.target {
        Some(target) => device.with_target(target),
        None => device,
    })
}

/// `def`'s comptime values autotuned over `comptime` for shape bucket `bucket`, with the
/// tensor parameters `aligned` known to be 16-byte aligned (`run` launches one candidate), and
/// the search's record for the JSON: every candidate's median ms or why it was skipped, `null`
/// without a disk cache.
pub fn autotuned<K: KernelDef>(
    device: &Device,
    def: &K,
    comptime: &K::Comptime,
    aligned: &[&str],
    bucket: &str,
    run: &mut dyn FnMut(&K::Comptime) -> Result<(), LaunchError>,
) -> Result<(K::Comptime, Value), BenchError> {
    let spec = Spec::new(comptime.clone()).with_aligned16(aligned);
    let chosen = device.autotune(def, &spec, bucket, run)?;
    let record = device
        .autotune_record(def, &spec, bucket)
        .and_then(|c| serde_json::to_value(c.timings).ok())
        .unwrap_or(Value::Null);
    Ok((chosen, record))
}
