//! The kernels under test: the device with the chosen target, example kernels by name, and
//! their comptime values.

use std::collections::BTreeMap;

use kiln_ir::Target;
use kiln_ir::dsl::{ComptimeValue, KernelDef, Spec};
use kiln_runtime::Device;

use crate::cli::Args;
use crate::error::BenchError;

/// GPU 0, compiling for `--target` or, by default, the GPU's own architecture-specific target
/// (sm_90a on Hopper, sm_100a on Blackwell, sm_80 otherwise).
pub fn device(args: &Args) -> Result<Device, BenchError> {
    let device = Device::new(0)?;
    let target = args.target.unwrap_or(match device.compute_capability() {
        (9, _) => Target::Sm90a,
        (10, _) => Target::Sm100a,
        _ => Target::Sm80,
    });
    Ok(device.with_target(target))
}

/// The example kernel called `name`.
pub fn find(name: &'static str) -> Result<&'static dyn KernelDef, BenchError> {
    kiln_examples::registry()
        .iter()
        .copied()
        .find(|k| k.name() == name)
        .ok_or(BenchError::NoKernel(name))
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
