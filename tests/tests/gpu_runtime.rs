//! The runtime on a real GPU, with a hand-written PTX kernel: driver load, allocation, copies
//! (strided views included), NaN poisoning, JIT load with its error log, dynamic shared memory
//! over 48 KB, the parameter ABI, launch validation on the GPU path, and event timing.
//! Without a GPU the tests are reported ignored, with the reason.

mod gpu_common;

use std::process::ExitCode;

use gpu_common::{Needs, device, upload_padded};

use kiln_ir::dsl::{ComptimeParam, KernelDecl, KernelDef, ParamSig, Spec};
use kiln_ir::{DType, Diagnostic, HostTensor, Kernel, Loc, Target};
use kiln_ptx::PtxModule;
use kiln_runtime::{Device, KernelArg, L2Flush, LaunchError, LoadedKernel, RuntimeError};
use kiln_tests::check::rel_error;
use kiln_tests::inputs::Rng;

/// `o[r, c] = a[r, c] * scale + bias` for 2-D f32 tensors, one block per row, threads
/// striding over columns; parameters follow the kiln ABI (ptr, s32 extents, s64 strides).
/// `o`'s shape is the iteration space (rows from `o_dim0`, columns from `o_dim1`).
const AXPB_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry axpb(
    .param .u64 a_ptr, .param .s32 a_dim0, .param .s32 a_dim1, .param .s64 a_stride0, .param .s64 a_stride1,
    .param .u64 o_ptr, .param .s32 o_dim0, .param .s32 o_dim1, .param .s64 o_stride0, .param .s64 o_stride1,
    .param .f32 scale, .param .s32 bias)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;
    .reg .f32 %f<6>;
    ld.param.u64 %rd1, [a_ptr];
    ld.param.u64 %rd2, [o_ptr];
    ld.param.s32 %r1, [o_dim0];
    ld.param.s32 %r2, [o_dim1];
    ld.param.s64 %rd3, [a_stride0];
    ld.param.s64 %rd4, [o_stride0];
    ld.param.f32 %f1, [scale];
    ld.param.s32 %r3, [bias];
    cvt.rn.f32.s32 %f2, %r3;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r4, %ctaid.x;
    setp.ge.s32 %p1, %r4, %r1;
    @%p1 bra DONE;
    cvt.s64.s32 %rd5, %r4;
    mul.lo.s64 %rd6, %rd5, %rd3;
    mul.lo.s64 %rd7, %rd5, %rd4;
    mov.u32 %r5, %tid.x;
    mov.u32 %r6, %ntid.x;
LOOP:
    setp.ge.s32 %p2, %r5, %r2;
    @%p2 bra DONE;
    cvt.s64.s32 %rd8, %r5;
    add.s64 %rd9, %rd6, %rd8;
    shl.b64 %rd9, %rd9, 2;
    add.s64 %rd9, %rd1, %rd9;
    ld.global.f32 %f3, [%rd9];
    fma.rn.f32 %f4, %f3, %f1, %f2;
    add.s64 %rd10, %rd7, %rd8;
    shl.b64 %rd10, %rd10, 2;
    add.s64 %rd10, %rd2, %rd10;
    st.global.f32 [%rd10], %f4;
    add.s32 %r5, %r5, %r6;
    bra LOOP;
DONE:
    ret;
}
"#;

const AXPB_SIG: &[ParamSig] = &[
    ParamSig::Tensor {
        name: "a",
        dtype: DType::F32,
        dtype_param: None,
        rank: 2,
        mutable: false,
    },
    ParamSig::Tensor {
        name: "o",
        dtype: DType::F32,
        dtype_param: None,
        rank: 2,
        mutable: true,
    },
    ParamSig::Scalar {
        name: "scale",
        dtype: DType::F32,
    },
    ParamSig::Scalar {
        name: "bias",
        dtype: DType::I32,
    },
];

fn axpb_module(dynamic_smem_bytes: u32) -> PtxModule {
    PtxModule {
        ptx: AXPB_PTX.to_string(),
        entry: "axpb".into(),
        threads_per_block: 128,
        dynamic_smem_bytes,
        target: Target::Sm80,
        tensor_maps: Vec::new(),
        persistent: false,
    }
}

/// Runs axpb over `rows x cols` with `a` a view of a wider, NaN-padded allocation (outer
/// stride `cols + pad`), output poisoned first, and checks every element against f64.
fn check_axpb(dev: &Device, k: &LoadedKernel, rows: usize, cols: usize, pad: usize, mag: f64) {
    let mut rng = Rng::from_env();
    let seed = rng.seed();
    let host = HostTensor::from_fn(&[rows, cols], DType::F32, |_| rng.uniform(-1.0, 1.0) * mag);
    let a = upload_padded(dev, &host, pad);
    let o = dev.alloc(DType::F32, &[rows, cols]).expect("alloc");
    dev.fill_nan(&o).expect("poison");
    let (scale, bias) = (rng.uniform(-3.0, 3.0) as f32, 7);
    let args = [
        KernelArg::Tensor(&a),
        KernelArg::Tensor(&o),
        KernelArg::F32(scale),
        KernelArg::I32(bias),
    ];
    dev.launch_loaded(k, AXPB_SIG, [rows as u32, 1, 1], &args)
        .expect("valid launch");
    let out = o.download().expect("download").to_f64_vec();
    let reference: Vec<f64> = host
        .to_f64_vec()
        .iter()
        .map(|x| x * scale as f64 + bias as f64)
        .collect();
    let err = rel_error(&out, &reference);
    assert!(
        err < 1e-6,
        "axpb {rows}x{cols} pad {pad} mag {mag}: rel error {err} (KILN_SEED={seed})"
    );
}

fn gpu_device_reports_itself() {
    let Some(dev) = device() else { return };
    println!(
        "{} (sm_{}{}), driver {}, L2 {} MiB",
        dev.name(),
        dev.compute_capability().0,
        dev.compute_capability().1,
        dev.driver_version(),
        dev.l2_bytes() >> 20
    );
    assert!(dev.driver_version() >= 11000);
    assert!(dev.compute_capability().0 >= 8);
    // A fresh device compiles for the GPU's own target; one can choose another.
    let fresh = Device::new(0).expect("again");
    assert_eq!(fresh.target(), Target::best_for(dev.compute_capability()));
    assert_eq!(fresh.with_target(Target::Sm90a).target(), Target::Sm90a);
}

fn gpu_upload_download_round_trips_strided_views() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    for dtype in [DType::Bf16, DType::F16, DType::F32, DType::I32] {
        let host = HostTensor::from_fn(&[3, 5, 7], dtype, |_| rng.uniform(-1000.0, 1000.0).round());
        let t = dev.upload(&host).expect("upload");
        assert_eq!(t.download().expect("download"), host, "{dtype}");
        // A transposed, narrowed view downloads as the same elements as on the host.
        let v = t.transpose(0, 2).expect("t").narrow(1, 1, 3).expect("n");
        let got = v.download().expect("download");
        assert_eq!(got.shape, [7, 3, 3]);
        for (i, j, k) in [(0, 0, 0), (6, 2, 1), (3, 1, 2)] {
            let want = host.data.get_f64(host.offset(&[k, j + 1, i]));
            assert_eq!(got.data.get_f64(got.offset(&[i, j, k])), want, "{dtype}");
        }
    }
}

fn gpu_fill_nan_poisons_only_the_view() {
    let Some(dev) = device() else { return };
    let host = HostTensor::from_fn(&[4, 6], DType::F32, |i| i as f64);
    let t = dev.upload(&host).expect("upload");
    dev.fill_nan(&t.narrow(1, 2, 3).expect("view"))
        .expect("poison");
    let got = t.download().expect("download");
    for r in 0..4 {
        for c in 0..6 {
            let v = got.data.get_f64(got.offset(&[r, c]));
            if (2..5).contains(&c) {
                assert!(v.is_nan(), "[{r},{c}] should be poisoned");
            } else {
                assert_eq!(v, (r * 6 + c) as f64, "[{r},{c}] should be untouched");
            }
        }
    }
    let bf = dev.alloc(DType::Bf16, &[3, 130]).expect("alloc");
    dev.fill_nan(&bf).expect("poison");
    assert!(
        bf.download()
            .expect("download")
            .to_f64_vec()
            .iter()
            .all(|v| v.is_nan())
    );
}

fn gpu_hand_written_ptx_launches_with_the_abi() {
    let Some(dev) = device() else { return };
    let k = dev.load_ptx(axpb_module(0)).expect("JIT load");
    println!(
        "axpb: {} regs; JIT log:\n{}",
        k.num_regs().expect("attr"),
        k.info_log()
    );
    assert_eq!(k.local_bytes().expect("attr"), 0);
    for (rows, cols, pad) in [(1, 1, 0), (5, 127, 3), (64, 1000, 1), (300, 129, 16)] {
        for mag in [1.0, 1e4] {
            check_axpb(&dev, &k, rows, cols, pad, mag);
        }
    }
}

fn gpu_dynamic_shared_memory_over_48k_is_opted_into() {
    let Some(dev) = device() else { return };
    let k = dev.load_ptx(axpb_module(100 * 1024)).expect("JIT load");
    check_axpb(&dev, &k, 9, 33, 2, 1.0);
    let err = dev
        .load_ptx(axpb_module(4 << 20))
        .expect_err("4 MiB of shared memory exists on no GPU");
    assert!(
        matches!(
            err,
            LaunchError::Resource {
                needed: 4194304,
                ..
            }
        ),
        "{err}"
    );
}

fn gpu_bad_ptx_reports_the_driver_log() {
    let Some(dev) = device() else { return };
    let bad = PtxModule {
        ptx: AXPB_PTX.replace("fma.rn.f32 %f4", "fma.bogus.f32 %f4"),
        ..axpb_module(0)
    };
    let err = dev.load_ptx(bad).expect_err("not PTX");
    let LaunchError::Runtime(RuntimeError::Jit { entry, log, .. }) = &err else {
        panic!("expected a JIT error, got {err}");
    };
    assert_eq!(entry, "axpb");
    assert!(
        log.contains("fma.bogus") || log.contains("line"),
        "log: {log}"
    );
    println!("{err}");
}

fn gpu_launch_validation_names_the_argument() {
    let Some(dev) = device() else { return };
    let k = dev.load_ptx(axpb_module(0)).expect("JIT load");
    let a = dev.alloc(DType::F32, &[8, 16]).expect("alloc");
    let o = dev.alloc(DType::F32, &[8, 16]).expect("alloc");
    let launch = |a: &kiln_runtime::DeviceTensor, o: &kiln_runtime::DeviceTensor| {
        dev.launch_loaded(
            &k,
            AXPB_SIG,
            [8, 1, 1],
            &[
                KernelArg::Tensor(a),
                KernelArg::Tensor(o),
                KernelArg::F32(1.0),
                KernelArg::I32(0),
            ],
        )
    };
    let bf = dev.alloc(DType::Bf16, &[8, 16]).expect("alloc");
    let err = launch(&bf, &o).expect_err("dtype");
    assert!(
        matches!(err, LaunchError::DType { param: "a", .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "argument `a`: expected a f32 tensor, got bf16"
    );

    let flat = dev.alloc(DType::F32, &[128]).expect("alloc");
    let err = launch(&a, &flat).expect_err("rank");
    assert!(
        matches!(
            err,
            LaunchError::Rank {
                param: "o",
                expected: 2,
                got: 1
            }
        ),
        "{err}"
    );

    let t = a.transpose(0, 1).expect("view");
    let err = launch(&t, &o).expect_err("inner stride");
    assert!(
        matches!(
            err,
            LaunchError::InnerStride {
                param: "a",
                stride: 16
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("innermost stride must be 1"),
        "{err}"
    );

    let big = o.as_strided(&[9, 16], &[16, 1], 0).expect("ranks agree");
    let err = launch(&a, &big).expect_err("9 rows in an 8-row allocation");
    assert!(
        matches!(
            err,
            LaunchError::OutOfBounds {
                param: "o",
                needed: 576,
                available: 512,
                ..
            }
        ),
        "{err}"
    );
    assert!(big.download().is_err(), "download must refuse the view too");

    let err = dev
        .launch_loaded(&k, AXPB_SIG, [0, 1, 1], &[KernelArg::Tensor(&a)])
        .expect_err("zero grid");
    assert!(
        matches!(
            err,
            LaunchError::Grid {
                axis: 'x',
                got: 0,
                ..
            }
        ),
        "{err}"
    );
    // Nothing above reached the GPU: it is still usable.
    dev.synchronize().expect("no sticky error");
}

/// A KernelDef whose body is never reached: validation must reject the arguments first.
struct NeverBuilt;

impl KernelDecl for NeverBuilt {
    fn name(&self) -> &'static str {
        "never_built"
    }
    fn comptime_params(&self) -> &'static [ComptimeParam] {
        &[]
    }
    fn signature(&self) -> &'static [ParamSig] {
        AXPB_SIG
    }
}

impl KernelDef for NeverBuilt {
    type Comptime = ();

    fn build(&self, _spec: &Spec<()>) -> Result<Kernel, Diagnostic> {
        Err(Diagnostic::new(
            Loc::caller(),
            "validation should have failed first",
        ))
    }
}

fn gpu_device_launch_validates_before_building() {
    let Some(dev) = device() else { return };
    let a = dev.alloc(DType::F32, &[8, 16]).expect("alloc");
    let short = dev.alloc(DType::F32, &[8, 15]).expect("alloc");
    let view = short
        .as_strided(&[8, 16], &[16, 1], 0)
        .expect("ranks agree");
    let err = dev
        .launch(
            &NeverBuilt,
            &(),
            [8, 1, 1],
            &[
                KernelArg::Tensor(&a),
                KernelArg::Tensor(&view),
                KernelArg::F32(1.0),
                KernelArg::I32(0),
            ],
        )
        .expect_err("too small");
    assert!(
        matches!(err, LaunchError::OutOfBounds { param: "o", .. }),
        "{err}"
    );
    let err = dev
        .launch(
            &NeverBuilt,
            &(),
            [8, 1, 1],
            &[
                KernelArg::Tensor(&a),
                KernelArg::Tensor(&a),
                KernelArg::F32(1.0),
                KernelArg::F32(0.0),
            ],
        )
        .expect_err("f32 for i32");
    assert!(
        matches!(
            err,
            LaunchError::ArgKind {
                index: 3,
                param: "bias",
                ..
            }
        ),
        "{err}"
    );
}

fn gpu_event_timing_and_l2_flush() {
    let Some(dev) = device() else { return };
    let k = dev.load_ptx(axpb_module(0)).expect("JIT load");
    let a = dev.alloc(DType::F32, &[4096, 4096]).expect("alloc");
    let o = dev.alloc(DType::F32, &[4096, 4096]).expect("alloc");
    let flush = L2Flush::new(&dev).expect("scratch");
    flush.flush().expect("flush");
    let args = [
        KernelArg::Tensor(&a),
        KernelArg::Tensor(&o),
        KernelArg::F32(2.0),
        KernelArg::I32(1),
    ];
    let ((), ms) = dev
        .time(|| dev.launch_loaded(&k, AXPB_SIG, [4096, 1, 1], &args))
        .expect("timed launch");
    println!("axpb 4096x4096 f32: {ms:.3} ms");
    assert!(ms > 0.0 && ms < 1000.0, "{ms} ms");
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_device_reports_itself",
            Needs::Gpu,
            gpu_device_reports_itself,
        ),
        (
            "gpu_upload_download_round_trips_strided_views",
            Needs::Gpu,
            gpu_upload_download_round_trips_strided_views,
        ),
        (
            "gpu_fill_nan_poisons_only_the_view",
            Needs::Gpu,
            gpu_fill_nan_poisons_only_the_view,
        ),
        (
            "gpu_hand_written_ptx_launches_with_the_abi",
            Needs::Gpu,
            gpu_hand_written_ptx_launches_with_the_abi,
        ),
        (
            "gpu_dynamic_shared_memory_over_48k_is_opted_into",
            Needs::Gpu,
            gpu_dynamic_shared_memory_over_48k_is_opted_into,
        ),
        (
            "gpu_bad_ptx_reports_the_driver_log",
            Needs::Gpu,
            gpu_bad_ptx_reports_the_driver_log,
        ),
        (
            "gpu_launch_validation_names_the_argument",
            Needs::Gpu,
            gpu_launch_validation_names_the_argument,
        ),
        (
            "gpu_device_launch_validates_before_building",
            Needs::Gpu,
            gpu_device_launch_validates_before_building,
        ),
        (
            "gpu_event_timing_and_l2_flush",
            Needs::Gpu,
            gpu_event_timing_and_l2_flush,
        ),
    ])
}
