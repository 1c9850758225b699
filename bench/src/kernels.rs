//! The kernels under test: the device with the chosen target, example kernels by name, and
//! their comptime values.

use std::collections::BTreeMap;

use kiln_ir::dsl::{ComptimeValue, KernelDef, Spec};
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

/// The example kernel called `name`.
pub fn find(name: &'static str) -> Result<&'static dyn KernelDef, BenchError> {
    kiln_examples::find(name).ok_or(BenchError::NoKernel(name))
}

/// `def`'s comptime values: its defaults with `overrides` (name, value as text) applied.
pub fn comptime(
    def: &dyn KernelDef,
    overrides: &[(&str, String)],
) -> Result<BTreeMap<String, ComptimeValue>, BenchError> {
    let o: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Ok(Spec::from_defaults(def, &o)?.comptime)
}

/// `def`'s comptime values autotuned over `comptime` for shape bucket `bucket`, with the
/// tensor parameters `aligned` known to be 16-byte aligned (`run` launches one candidate), and
/// the search's record for the JSON: every candidate's median ms or why it was skipped, `null`
/// without a disk cache.
pub fn autotuned(
    device: &Device,
    def: &dyn KernelDef,
    comptime: &BTreeMap<String, ComptimeValue>,
    aligned: &[&str],
    bucket: &str,
    run: &mut dyn FnMut(&Spec) -> Result<(), LaunchError>,
) -> Result<(BTreeMap<String, ComptimeValue>, Value), BenchError> {
    let spec = Spec {
        comptime: comptime.clone(),
        aligned16: Default::default(),
    }
    .with_aligned16(aligned);
    let chosen = device.autotune(def, &spec, bucket, run)?.comptime;
    let record = device
        .autotune_record(def, &spec, bucket)
        .and_then(|c| serde_json::to_value(c.timings).ok())
        .unwrap_or(Value::Null);
    Ok((chosen, record))
}
