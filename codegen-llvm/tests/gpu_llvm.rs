//! Differential check on the GPU: every variant of the sm_80 subset compiled by both
//! backends (kiln-ptx, and kiln-llvm through LLVM's NVPTX target), loaded and launched the
//! same way (`Device::load_ptx`, `Device::launch_loaded` with the kernel's signature) on the
//! same random inputs of odd shapes, each output poisoned with NaN first; both results are
//! compared to the f64 reference and to each other. Variants whose tensors are not known to
//! be 16-byte aligned get inputs with padded rows (strided views). Reported ignored, with
//! the reason, without a CUDA driver and GPU.

mod common;
#[path = "../../tests/tests/gpu_common/mod.rs"]
mod gpu_common;

use std::process::ExitCode;

use common::Variant;
use gpu_common::{Needs, device, upload_padded};
use kiln::ir::{DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor, KernelArg};
use kiln_tests::check::{rel_error, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// The inputs, output shape and grid of one launch of a variant, and its f64 reference.
struct Problem {
    inputs: Vec<HostTensor>,
    out_shape: Vec<usize>,
    out_dtype: DType,
    grid: [u32; 3],
    reference: Vec<f64>,
}

/// Random inputs of odd shapes for `variant`. Aligned variants keep every row a multiple of
/// 16 bytes (what a contiguous launch they specialise on guarantees).
fn problem(rng: &mut Rng, variant: Variant, aligned: bool) -> Problem {
    let cdiv = |a: usize, b: usize| a.div_ceil(b) as u32;
    match variant {
        Variant::VectorAdd => {
            let n = 3 * 1024 + 517;
            let a = tensor(rng, &[n], DType::F32, Dist::Normal);
            let b = tensor(rng, &[n], DType::F32, Dist::Normal);
            let reference = reference::vector_add(&a, &b);
            Problem {
                inputs: vec![a, b],
                out_shape: vec![n],
                out_dtype: DType::F32,
                grid: [cdiv(n, 1024), 1, 1],
                reference,
            }
        }
        Variant::Softmax(c) => {
            let (m, n) = if aligned { (37, 1000) } else { (29, 1001) };
            let x = tensor(rng, &[m, n], DType::F32, Dist::Large);
            let reference = reference::softmax_rows(&x);
            Problem {
                inputs: vec![x],
                out_shape: vec![m, n],
                out_dtype: DType::F32,
                grid: [cdiv(m, c.BM), 1, 1],
                reference,
            }
        }
        Variant::Gemm(c) => {
            let (m, k, n) = if aligned {
                (197, 136, 264)
            } else {
                (97, 75, 131)
            };
            let dtype = c.dtype;
            let a = tensor(rng, &[m, k], dtype, Dist::Uniform);
            let (b, reference) = if c.b_col_major {
                let bt = tensor(rng, &[n, k], dtype, Dist::Uniform);
                let r = reference::gemm_bt(&a, &bt);
                (bt, r)
            } else {
                let b = tensor(rng, &[k, n], dtype, Dist::Uniform);
                let r = reference::gemm(&a, &b);
                (b, r)
            };
            Problem {
                inputs: vec![a, b],
                out_shape: vec![m, n],
                out_dtype: dtype,
                grid: [cdiv(m, c.BM), cdiv(n, c.BN), 1],
                reference,
            }
        }
    }
}

/// `host` on the device: contiguous when aligned, else a view with padded rows.
fn upload(dev: &Device, host: &HostTensor, aligned: bool) -> DeviceTensor {
    if aligned || host.shape.len() < 2 {
        dev.upload(host).expect("upload")
    } else {
        upload_padded(dev, host, 3)
    }
}

fn gpu_backends_agree_with_each_other_and_the_reference() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    println!("seed {}", rng.seed());
    for (name, variant, aligned) in common::variants() {
        // The signature is what the launch validates the arguments against.
        let (k, signature) = variant.build(aligned);
        let p = problem(&mut rng, variant, aligned);
        let inputs: Vec<DeviceTensor> = p.inputs.iter().map(|h| upload(&dev, h, aligned)).collect();
        let mut outs = Vec::new();
        for backend in ["kiln-ptx", "kiln-llvm"] {
            let module = match backend {
                "kiln-ptx" => kiln_ptx::compile(&k, Target::Sm80).expect("kiln-ptx compiles"),
                _ => kiln_llvm::compile(&k).expect("kiln-llvm compiles").ptx,
            };
            let loaded = dev
                .load_ptx(module)
                .unwrap_or_else(|e| panic!("{name}: {backend}: JIT: {e}"));
            let out = dev.alloc(p.out_dtype, &p.out_shape).expect("alloc");
            dev.fill_nan(&out).expect("poison");
            let mut args: Vec<KernelArg> = inputs.iter().map(KernelArg::Tensor).collect();
            args.push(KernelArg::Tensor(&out));
            dev.launch_loaded(&loaded, &signature, p.grid, &args)
                .unwrap_or_else(|e| panic!("{name}: {backend}: launch: {e}"));
            let got = out.download().expect("download").to_f64_vec();
            let err = rel_error(&got, &p.reference);
            println!("{name:22} {backend:9} relative error {err:.3e}");
            assert!(
                err <= tolerance(p.out_dtype),
                "{name}: {backend} differs from the f64 reference: relative error {err:.3e}"
            );
            outs.push(got);
        }
        let between = rel_error(&outs[1], &outs[0]);
        assert!(
            between <= tolerance(p.out_dtype),
            "{name}: the backends differ: relative error {between:.3e}"
        );
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[(
        "gpu_backends_agree_with_each_other_and_the_reference",
        Needs::Gpu,
        gpu_backends_agree_with_each_other_and_the_reference,
    )])
}
