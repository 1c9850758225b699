//! The `prefetch` pass's rings on the GPU, for sm_80 and, on Hopper, sm_90a: a pipelined
//! window of columns (`prefetch_kernels::shifted_window`) at 2, 3 and 4 stages gives the same
//! bits as the loop without pipelining, and both match the interpreter: loops of no
//! iteration, one, fewer than the stages, ending inside the tensor and running past its end;
//! aligned and unaligned columns and row strides (the copies' fast path and their element
//! by element edge); outputs poisoned with NaN. Skips itself without a GPU.

mod gpu_common;
mod prefetch_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, devices, poisoned_output as output, upload_padded};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor, TensorData};
use kiln_runtime::Device;
use kiln_tests::check::{Case, assert_close, poisoned, sum_tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use prefetch_kernels::*;

/// `y` and `s` of `shifted_window` at `c` on `dev` over `lo..hi` from column `shift`, `x`'s
/// rows `pad` elements apart beyond its width.
#[allow(clippy::too_many_arguments)]
fn window_on(
    dev: &Device,
    c: &ShiftedWindowComptime,
    (x, w): (&HostTensor, &HostTensor),
    pad: usize,
    (lo, hi, shift): (i32, i32, i32),
) -> (HostTensor, HostTensor) {
    let (m, n) = (x.shape[0], x.shape[1]);
    let (y, s) = (
        output(dev, DType::F32, &[m, n]),
        output(dev, DType::F32, &[m]),
    );
    let dx = upload_padded(dev, x, pad);
    let dw = dev.upload(w).expect("upload");
    shifted_window
        .launch(
            dev,
            c,
            shifted_window.grid(c, [m, 1, 1]),
            &dx,
            &dw,
            &y,
            &s,
            lo,
            hi,
            shift,
        )
        .expect("launch");
    (
        y.download().expect("download"),
        s.download().expect("download"),
    )
}

fn bits(t: &HostTensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|x| x.to_bits()).collect()
}

fn gpu_window() {
    let mut rng = Rng::from_env();
    let (m, n) = (5, 300);
    for dev in devices() {
        for stages in [2, 3, 4] {
            let c = ShiftedWindowComptime {
                BM: 2,
                BN: 32,
                STAGES: stages,
            };
            let plain = ShiftedWindowComptime { STAGES: 1, ..c };
            // Empty, one iteration, fewer than the stages, ending inside the tensor, and
            // running past its end.
            for (lo, hi) in [(10, 10), (0, 20), (3, 70), (16, 200), (40, 300)] {
                for (shift, pad) in [(0, 0), (8, 4), (1, 0), (0, 3)] {
                    let dist = Dist::Normal;
                    let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                    let w = tensor(&mut rng, &[c.BN], DType::F32, Dist::Uniform);
                    let case = Case {
                        kernel: format!(
                            "shifted_window STAGES={stages} shift={shift} pad={pad} on {}",
                            dev.target()
                        ),
                        shape: format!("m={m} n={n} lo={lo} hi={hi}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let args = (lo, hi, shift);
                    let (y, s) = window_on(&dev, &c, (&x, &w), pad, args);
                    let (y1, s1) = window_on(&dev, &plain, (&x, &w), pad, args);
                    assert_eq!(bits(&y), bits(&y1), "{case}: y");
                    assert_eq!(bits(&s), bits(&s1), "{case}: s");
                    let (mut yi, mut si) =
                        (poisoned(&[m, n], DType::F32), poisoned(&[m], DType::F32));
                    shifted_window
                        .interpret(
                            &c,
                            shifted_window.grid(&c, [m, 1, 1]),
                            &x,
                            &w,
                            &mut yi,
                            &mut si,
                            lo,
                            hi,
                            shift,
                        )
                        .expect("interpret");
                    // Unwritten columns stay NaN in both.
                    let written = |t: &HostTensor| -> Vec<bool> {
                        t.to_f64_vec().iter().map(|v| !v.is_nan()).collect()
                    };
                    assert_eq!(written(&y), written(&yi), "{case}: columns written");
                    let keep = |t: &HostTensor| -> Vec<f64> {
                        t.to_f64_vec().into_iter().filter(|v| !v.is_nan()).collect()
                    };
                    let kept = keep(&y);
                    let got = HostTensor::new(
                        &[kept.len()],
                        TensorData::F32(kept.iter().map(|&v| v as f32).collect()),
                    )
                    .expect("a tensor");
                    assert_close(&case, &got, &keep(&yi), 1e-6);
                    assert_close(&case, &s, &si.to_f64_vec(), sum_tolerance(n));
                }
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[("gpu_prefetch_window", Needs::Gpu, gpu_window)])
}
