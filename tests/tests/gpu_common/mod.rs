//! Helpers shared by the GPU test files (`gpu_*.rs`): their harness (a test needing a GPU
//! the machine lacks is reported ignored, and why), the device, and device tensors with
//! non-contiguous outer strides. Each GPU test crate compiles it and uses a part.

#![allow(dead_code)]

use std::process::ExitCode;

use kiln_ir::{DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor};
use kiln_tests::check::{Case, assert_close};
use libtest_mimic::{Arguments, Trial};

/// What a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Nothing (a host-side check that lives with the GPU tests).
    Nothing,
    /// A CUDA driver and a GPU.
    Gpu,
    /// A Hopper GPU (compute capability 9.0), for sm_90a code.
    Hopper,
}

/// Why this machine cannot run a test that needs `needs`, if it cannot.
fn missing(needs: Needs) -> Option<String> {
    if needs == Needs::Nothing {
        return None;
    }
    let dev = match Device::new(0) {
        Ok(dev) => dev,
        Err(e) => return Some(e.to_string()),
    };
    let (major, minor) = dev.compute_capability();
    (needs == Needs::Hopper && (major, minor) != (9, 0)).then(|| {
        format!(
            "needs a Hopper GPU (sm_90), found {} (sm_{major}{minor})",
            dev.name()
        )
    })
}

/// Runs `tests` as libtest does (same arguments, output and summary line); a test whose
/// needs this machine lacks is reported ignored, and the reason printed once.
pub fn run(tests: &[(&'static str, Needs, fn())]) -> ExitCode {
    let args = Arguments::from_args();
    let mut reasons: Vec<(Needs, Option<String>)> = Vec::new();
    let trials = tests
        .iter()
        .map(|&(name, needs, test)| {
            let why = match reasons.iter().find(|(n, _)| *n == needs) {
                Some((_, why)) => why.clone(),
                None => {
                    let why = missing(needs);
                    reasons.push((needs, why.clone()));
                    why
                }
            };
            Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(why.is_some())
        })
        .collect();
    for why in reasons.iter().filter_map(|(_, why)| why.as_deref()) {
        println!("GPU tests ignored: {why}");
    }
    libtest_mimic::run(&args, trials).exit_code()
}

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

/// The devices a test of portable and Hopper code runs on: sm_80 code on any GPU, and sm_90a
/// code on a Hopper GPU (empty without a driver).
pub fn devices() -> Vec<Device> {
    let Some(dev) = device() else {
        return Vec::new();
    };
    let hopper = dev.compute_capability() == (9, 0);
    let mut all = vec![dev];
    if hopper {
        all.push(
            Device::new(0)
                .expect("a driver and a GPU are present")
                .with_target(Target::Sm90a),
        );
    }
    all
}

/// A device tensor of `dtype` and `shape` poisoned with NaN ([`Device::fill_nan`]), so an
/// element a kernel forgets to write shows.
pub fn poisoned_output(dev: &Device, dtype: DType, shape: &[usize]) -> DeviceTensor {
    let t = dev.alloc(dtype, shape).expect("alloc");
    dev.fill_nan(&t).expect("poison");
    t
}

/// The GPU result `gpu` against the reference and against the interpreter's result, each
/// within relative norm error `tol`.
pub fn check(case: &Case, gpu: &DeviceTensor, reference: &[f64], interp: &HostTensor, tol: f64) {
    let got = gpu.download().expect("download");
    assert_close(case, &got, reference, tol);
    let vs = Case {
        kernel: format!("{} (GPU vs interpreter)", case.kernel),
        ..case.clone()
    };
    assert_close(&vs, &got, &interp.to_f64_vec(), tol);
}
