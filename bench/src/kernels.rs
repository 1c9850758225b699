//! The kernels under test: the device with the chosen target, example kernels by name, and
//! their comptime values.

use std::collections::BTreeMap;

use kiln_ir::dsl::{ComptimeValue, KernelDef, Spec};
use kiln_runtime::Device;

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
