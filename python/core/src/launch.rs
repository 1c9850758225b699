//! Running a [`Plan`]: on the GPU, over borrowed memory on the caller's stream
//! ([`launch`]), or on kiln's CPU interpreter over host tensors laid out the same way
//! ([`interpret`]), so the BSHD views are tested without a GPU.
//!
//! Both go through [`comptime`] and [`grid`], so they run the same specialisation.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use kiln::ir::dsl::ComptimeValue;
use kiln::ir::interp::{HostArg, InterpError, run_def};
use kiln::ir::{DType, HostTensor, Target};
use kiln::ptx::PtxModule;
use kiln::runtime::{
    Device, DeviceTensor, ForeignStream, KernelArg, LaunchError, LoadedKernel, RuntimeError,
};
use kiln_examples::attention::{BLOCK_M, attention, attention_lse, tuned_block_m, tuned_block_n};

use crate::args::{Plan, View};
use crate::varlen::VarlenPlan;

/// Why a checked call still failed: no usable GPU, or the runtime refused or failed the launch.
#[derive(Debug, thiserror::Error)]
pub enum LaunchFailure {
    /// Opening the device or borrowing a tensor failed.
    #[error("kiln_attn: {0}")]
    Runtime(#[from] RuntimeError),
    /// Validation, compilation or the launch itself failed.
    #[error("kiln_attn: {0}")]
    Launch(#[from] LaunchError),
}

/// The comptime values of the kernel for `plan` on `target`.
pub fn comptime(plan: &Plan, target: Target) -> BTreeMap<String, ComptimeValue> {
    BTreeMap::from([
        ("d".to_string(), ComptimeValue::Usize(plan.head_dim)),
        ("causal".to_string(), ComptimeValue::Bool(plan.causal)),
        (
            "block_n".to_string(),
            ComptimeValue::Usize(tuned_block_n(target, plan.head_dim)),
        ),
        ("kv_group".to_string(), ComptimeValue::Usize(plan.kv_group)),
        ("dtype".to_string(), ComptimeValue::DType(plan.dtype)),
        ("window_left".to_string(), ComptimeValue::I32(plan.window.0)),
        (
            "window_right".to_string(),
            ComptimeValue::I32(plan.window.1),
        ),
        ("softcap".to_string(), ComptimeValue::F32(plan.softcap)),
        (
            "block_m".to_string(),
            ComptimeValue::Usize(tuned_block_m(target, plan.head_dim)),
        ),
    ])
}

/// The kernel's grid for the comptime values `ct` ([`comptime`]): `block_m` query rows per
/// block, one block row per head and batch.
pub fn grid(plan: &Plan, ct: &BTreeMap<String, ComptimeValue>) -> [u32; 3] {
    let block_m = match ct.get("block_m") {
        Some(&ComptimeValue::Usize(m)) => m,
        _ => BLOCK_M,
    };
    [
        plan.seqlen_q.div_ceil(block_m) as u32,
        plan.nheads as u32,
        plan.batch as u32,
    ]
}

/// The device for CUDA ordinal `ordinal`, opened once per process: opening retains the primary
/// context (PyTorch's), and the device keeps the compile cache every later call hits.
pub fn device(ordinal: usize) -> Result<Arc<Device>, RuntimeError> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
    let mut devices = devices.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = devices.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(Device::new(ordinal)?);
    devices.insert(ordinal, d.clone());
    Ok(d)
}

/// Launches `plan` writing `out` (a BHSD view from [`crate::args::check_out`]) and, when
/// given, the log-sum-exp `lse` (a contiguous `[batch, nheads, seqlen_q]` f32 tensor:
/// `attention_lse`) on `stream` of its device. Asynchronous: the kernel runs in order on
/// `stream`.
///
/// # Safety
/// Every view must address live device memory of the plan's device (its primary context)
/// that stays allocated until the kernel has run, `out` and `lse` must not overlap the inputs
/// or each other, and `stream` must be 0 or a live stream of that device's primary context.
pub unsafe fn launch(
    plan: &Plan,
    out: &View,
    lse: Option<&Lse>,
    stream: u64,
) -> Result<(), LaunchFailure> {
    let dev = device(plan.device)?;
    // SAFETY: the caller guarantees the memory behind every view.
    let borrow = |v: &View| unsafe { dev.borrow_tensor(v.ptr, plan.dtype, &v.shape, &v.strides) };
    let [q, k, v, o]: [DeviceTensor; 4] = [
        borrow(&plan.q)?,
        borrow(&plan.k)?,
        borrow(&plan.v)?,
        borrow(out)?,
    ];
    // SAFETY: the caller guarantees the stream.
    let stream = unsafe { ForeignStream::from_raw(stream) };
    let ct = comptime(plan, dev.target());
    let grid = grid(plan, &ct);
    let (q, k, v, o) = (
        KernelArg::Tensor(&q),
        KernelArg::Tensor(&k),
        KernelArg::Tensor(&v),
        KernelArg::Tensor(&o),
    );
    let scale = KernelArg::F32(plan.scale);
    match lse {
        None => dev.launch_on_stream(stream, &attention, &ct, grid, &[q, k, v, o, scale])?,
        Some(l) => {
            // SAFETY: the caller guarantees the memory behind `lse`.
            let l = unsafe { dev.borrow_tensor(l.ptr, DType::F32, &l.shape, &l.strides) }?;
            let l = KernelArg::Tensor(&l);
            dev.launch_on_stream(stream, &attention_lse, &ct, grid, &[q, k, v, o, l, scale])?
        }
    }
    Ok(())
}

/// Launches every sequence of the varlen plan `vp` on `stream`, in batch order, each writing
/// its own rows of the packed output (see [`crate::varlen`]).
///
/// # Safety
/// As [`launch`], for every sequence's views.
pub unsafe fn launch_varlen(vp: &VarlenPlan, stream: u64) -> Result<(), LaunchFailure> {
    for (plan, out) in &vp.sequences {
        // SAFETY: the caller guarantees every view, as `launch` requires.
        unsafe { launch(plan, out, None, stream) }?;
    }
    Ok(())
}

/// A `[batch, nheads, seqlen_q]` f32 tensor for the log-sum-exp: its address and strides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lse {
    /// The address of element `[0, 0, 0]`.
    pub ptr: u64,
    /// `[batch, nheads, seqlen_q]`.
    pub shape: [usize; 3],
    /// Strides of those, in elements.
    pub strides: [usize; 3],
}

/// An entry with no parameters that returns at once: what a launch costs with no work.
const EMPTY_PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry kiln_attn_empty()
{
\tret;
}
";

/// Launches a kernel that does nothing (one block of 32 threads) on `stream` of device
/// `ordinal`, through the same stream path as [`launch`]: the baseline the Python call
/// overhead of `flash_attn_func` is measured against.
///
/// # Safety
/// `stream` must be 0 or a live stream of the device's primary context.
pub unsafe fn empty_launch(ordinal: usize, stream: u64) -> Result<(), LaunchFailure> {
    static EMPTY: OnceLock<Mutex<HashMap<usize, Arc<LoadedKernel>>>> = OnceLock::new();
    let dev = device(ordinal)?;
    let kernel = {
        let mut loaded = EMPTY
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match loaded.get(&ordinal) {
            Some(k) => k.clone(),
            None => {
                let k = Arc::new(dev.load_ptx(PtxModule {
                    ptx: EMPTY_PTX.to_string(),
                    entry: "kiln_attn_empty".into(),
                    threads_per_block: 32,
                    dynamic_smem_bytes: 0,
                    target: Target::Sm80,
                    tensor_maps: Vec::new(),
                    persistent: false,
                })?);
                loaded.insert(ordinal, k.clone());
                k
            }
        }
    };
    // SAFETY: the caller guarantees the stream.
    let stream = unsafe { ForeignStream::from_raw(stream) };
    dev.launch_loaded_on_stream(stream, &kernel, &[], [1, 1, 1], &[])?;
    Ok(())
}

/// Runs `plan` on the CPU interpreter, the way [`launch`] runs it on the GPU: `q`, `k`, `v`
/// and `out` are host tensors in the caller's BSHD layout (any strides), viewed through the
/// plan's BHSD strides, compiled for `target`'s comptime choices.
pub fn interpret(
    plan: &Plan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: &mut HostTensor,
    lse: Option<&mut HostTensor>,
) -> Result<(), InterpError> {
    let view = |t: &HostTensor, v: &View| HostTensor {
        shape: v.shape.to_vec(),
        strides: v.strides.to_vec(),
        data: t.data.clone(),
    };
    let (qv, kv, vv) = (view(q, &plan.q), view(k, &plan.k), view(v, &plan.v));
    let out_view = View {
        ptr: 0,
        shape: [plan.batch, plan.nheads, plan.seqlen_q, plan.head_dim],
        strides: [
            out.strides[0],
            out.strides[2],
            out.strides[1],
            out.strides[3],
        ],
    };
    let mut ov = view(out, &out_view);
    let ct = comptime(plan, target);
    let grid = grid(plan, &ct);
    let (q, k, v, scale) = (
        HostArg::Tensor(&qv),
        HostArg::Tensor(&kv),
        HostArg::Tensor(&vv),
        HostArg::F32(plan.scale),
    );
    match lse {
        None => run_def(
            &attention,
            &ct,
            grid,
            &mut [q, k, v, HostArg::TensorMut(&mut ov), scale],
        )?,
        Some(l) => run_def(
            &attention_lse,
            &ct,
            grid,
            &mut [
                q,
                k,
                v,
                HostArg::TensorMut(&mut ov),
                HostArg::TensorMut(l),
                scale,
            ],
        )?,
    }
    out.data = ov.data;
    Ok(())
}

/// Runs the varlen plan `vp` on the CPU interpreter, the way [`launch_varlen`] runs it: `q`,
/// `k`, `v` and `out` are the packed host tensors the plan was made for, described to it at
/// address 0 (so a view's address is its offset in bytes). Each sequence's views are copied
/// out and its output copied back: this runs the plan's offsets, lengths and options, not
/// the kernel's edge masking at a sequence's end (the GPU tests check that).
pub fn interpret_varlen(
    vp: &VarlenPlan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: &mut HostTensor,
) -> Result<(), InterpError> {
    for (plan, ov) in &vp.sequences {
        let (qs, ks, vs) = (gather(q, &plan.q), gather(k, &plan.k), gather(v, &plan.v));
        let mut os = gather(out, ov);
        let ct = comptime(plan, target);
        run_def(
            &attention,
            &ct,
            grid(plan, &ct),
            &mut [
                HostArg::Tensor(&qs),
                HostArg::Tensor(&ks),
                HostArg::Tensor(&vs),
                HostArg::TensorMut(&mut os),
                HostArg::F32(plan.scale),
            ],
        )?;
        for (i, at) in view_offsets(ov).into_iter().enumerate() {
            out.data.set_f64(at, os.data.get_f64(i));
        }
    }
    // As the extension zeroes them (`out.narrow(0, first, rows).zero_()`).
    let row = out.strides[0];
    for &(first, rows) in &vp.zero_rows {
        for i in first * row..(first + rows) * row {
            out.data.set_f64(i, 0.0);
        }
    }
    Ok(())
}

/// The elements of `t` that view `v` (address = byte offset of 2-byte elements) sees, as a
/// contiguous tensor of the view's shape.
fn gather(t: &HostTensor, v: &View) -> HostTensor {
    let at = view_offsets(v);
    HostTensor::from_fn(&v.shape, t.dtype(), |i| t.data.get_f64(at[i]))
}

/// The element offsets of view `v`'s elements in row-major order of its shape.
fn view_offsets(v: &View) -> Vec<usize> {
    let base = (v.ptr / 2) as usize;
    kiln::ir::host::row_major_offsets(&v.shape, &v.strides)
        .into_iter()
        .map(|o| base + o)
        .collect()
}

#[cfg(test)]
mod tests {
    use kiln::ir::{DType, HostTensor, Target};
    use kiln_tests::check::{rel_error, tolerance};
    use kiln_tests::inputs::{Dist, Rng, tensor};
    use kiln_tests::reference;

    use super::{interpret, interpret_varlen};
    use crate::args::{Options, TensorInfo, TorchDType, TorchDevice, plan};

    /// What PyTorch would report for host tensor `t` (its strides as they are).
    fn info(t: &HostTensor) -> TensorInfo {
        TensorInfo {
            shape: t.shape.iter().map(|&n| n as i64).collect(),
            strides: t.strides.iter().map(|&n| n as i64).collect(),
            dtype: match t.dtype() {
                DType::F16 => TorchDType::F16,
                _ => TorchDType::Bf16,
            },
            device: TorchDevice::Cuda(0),
            ptr: 0,
        }
    }

    /// `t` (`[b, s, h, d]` contiguous, or any strides) seen as `[b, h, s, d]`, for the
    /// reference, which reads its inputs in row-major order of their shape.
    fn as_bhsd(t: &HostTensor) -> HostTensor {
        HostTensor {
            shape: vec![t.shape[0], t.shape[2], t.shape[1], t.shape[3]],
            strides: vec![t.strides[0], t.strides[2], t.strides[1], t.strides[3]],
            data: t.data.clone(),
        }
    }

    /// `t: [b, hkv, s, d]` (any strides) as a contiguous `[b, hkv * group, s, d]` in which
    /// each head is repeated `group` times: what each query head of a grouped-query kernel
    /// reads, for the reference.
    fn repeat_heads(t: &HostTensor, group: usize) -> HostTensor {
        let [b, hkv, s, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
        let h = hkv * group;
        HostTensor::from_fn(&[b, h, s, d], t.dtype(), |i| {
            let (x, j, hh, n) = (i % d, i / d % s, i / (d * s) % h, i / (d * s * h));
            t.data.get_f64(t.offset(&[n, hh / group, j, x]))
        })
    }

    /// A `[b, s, h, d]` tensor stored as `[b, h, s, d]` (PyTorch's `x.transpose(1, 2)` of a
    /// contiguous BHSD tensor).
    fn transposed_bshd(rng: &mut Rng, [b, s, h, d]: [usize; 4]) -> HostTensor {
        let t = tensor(rng, &[b, h, s, d], DType::Bf16, Dist::Normal);
        HostTensor {
            shape: vec![b, s, h, d],
            strides: vec![h * s * d, d, s * d, 1],
            data: t.data,
        }
    }

    /// The interpreter runs the plan's views of BSHD tensors (contiguous, and transposed from
    /// BHSD memory) to the f64 reference, at sequence lengths that are not multiples of the
    /// tiles, with more queries than keys (so causal rows that see no key output 0), both
    /// masks, both targets' block choices, and grouped-query and multi-query heads.
    #[test]
    fn bshd_views_run_on_the_interpreter_to_the_reference() {
        let mut rng = Rng::new(9);
        let (b, sq, sk, h, d) = (1, 130, 70, 4, 64);
        for (target, causal, transposed, hkv) in [
            (Target::Sm90a, false, false, 4),
            (Target::Sm90a, true, true, 4),
            (Target::Sm80, true, false, 4),
            (Target::Sm90a, false, true, 2),
            (Target::Sm90a, true, false, 1),
        ] {
            let make = |rng: &mut Rng, s, h| {
                if transposed {
                    transposed_bshd(rng, [b, s, h, d])
                } else {
                    tensor(rng, &[b, s, h, d], DType::Bf16, Dist::Normal)
                }
            };
            let q = make(&mut rng, sq, h);
            let (k, v) = (make(&mut rng, sk, hkv), make(&mut rng, sk, hkv));
            let opts = Options {
                causal,
                ..Options::default()
            };
            let p = plan(&info(&q), &info(&k), &info(&v), &opts).expect("valid");
            let mut out = HostTensor::full(&[b, sq, h, d], DType::Bf16, f64::NAN);
            interpret(&p, target, (&q, &k, &v), &mut out, None).expect("interprets");
            let group = h / hkv;
            let want = reference::attention(
                &as_bhsd(&q),
                &repeat_heads(&as_bhsd(&k), group),
                &repeat_heads(&as_bhsd(&v), group),
                f64::from(p.scale),
                causal,
            );
            let err = rel_error(&as_bhsd(&out).to_f64_vec(), &want);
            assert!(
                err < tolerance(DType::Bf16),
                "{target:?} causal={causal} transposed={transposed} nheads_k={hkv}: error {err:.2e}"
            );
        }
    }

    /// FlashAttention's options through the plan to the interpreter: f16, a sliding window
    /// (FlashAttention's normalisation: causal with a left bound), a soft-cap and head dim
    /// 96, with the log-sum-exp, against the f64 reference with the same window and cap
    /// (every row sees a key here: rows that see none are `interp_attention_features`').
    #[test]
    fn options_run_on_the_interpreter_to_the_reference() {
        let mut rng = Rng::new(96);
        let (b, sq, sk, h) = (1, 150, 210, 2);
        for (target, d, dtype, causal, window_size, softcap) in [
            (Target::Sm90a, 64, DType::F16, false, (-1, -1), 0.0),
            (Target::Sm80, 64, DType::Bf16, true, (40, -1), 0.0),
            (Target::Sm90a, 96, DType::Bf16, false, (30, 20), 10.0),
            (Target::Sm90a, 64, DType::F16, true, (-1, -1), 25.0),
        ] {
            let make = |rng: &mut Rng, s| tensor(rng, &[b, s, h, d], dtype, Dist::Normal);
            let q = make(&mut rng, sq);
            let (k, v) = (make(&mut rng, sk), make(&mut rng, sk));
            let opts = Options {
                causal,
                window_size,
                softcap,
                return_lse: true,
                ..Options::default()
            };
            let p = plan(&info(&q), &info(&k), &info(&v), &opts).expect("valid");
            let mut out = HostTensor::full(&[b, sq, h, d], dtype, f64::NAN);
            let mut lse = HostTensor::full(&p.lse_shape(), DType::F32, f64::NAN);
            interpret(&p, target, (&q, &k, &v), &mut out, Some(&mut lse)).expect("interprets");
            let right = if causal { 0 } else { window_size.1 };
            let want = reference::attention_window(
                &as_bhsd(&q),
                &as_bhsd(&k),
                &as_bhsd(&v),
                f64::from(p.scale),
                (window_size.0, right),
                (softcap > 0.0).then_some(softcap),
            );
            let err = rel_error(&as_bhsd(&out).to_f64_vec(), &want);
            let want_lse = reference::attention_lse(
                &as_bhsd(&q),
                &as_bhsd(&k),
                f64::from(p.scale),
                (window_size.0, right),
                (softcap > 0.0).then_some(softcap),
            );
            let lse_err = rel_error(&lse.to_f64_vec(), &want_lse);
            assert!(
                err < tolerance(dtype) && lse_err < tolerance(DType::F32),
                "{target:?} d={d} {dtype:?} causal={causal} window={window_size:?} \
                 softcap={softcap}: error {err:.2e}, lse error {lse_err:.2e}"
            );
        }
    }

    /// `flash_attn_varlen_func`'s plan on the interpreter: packed sequences of different
    /// lengths (one with no query rows, one with no keys, whose rows are 0), grouped heads, a
    /// causal window normalised by `max_seqlen_k`, each sequence against the reference on its
    /// own rows; rows past the last offset are never written.
    #[test]
    fn varlen_sequences_run_on_the_interpreter_to_the_reference() {
        use crate::varlen::plan_varlen;
        let mut rng = Rng::new(17);
        let (h, hkv, d) = (4, 2, 64);
        let lens: [(usize, usize); 4] = [(100, 50), (0, 30), (130, 0), (70, 200)];
        let offsets = |f: fn(&(usize, usize)) -> usize| {
            let mut cu = vec![0i64];
            for l in &lens {
                cu.push(cu[cu.len() - 1] + f(l) as i64);
            }
            cu
        };
        let (cu_q, cu_k) = (offsets(|l| l.0), offsets(|l| l.1));
        let (total_q, total_k) = (cu_q[4] as usize + 5, cu_k[4] as usize);
        let q = tensor(&mut rng, &[total_q, h, d], DType::Bf16, Dist::Normal);
        let k = tensor(&mut rng, &[total_k, hkv, d], DType::Bf16, Dist::Normal);
        let v = tensor(&mut rng, &[total_k, hkv, d], DType::Bf16, Dist::Normal);
        let mut out = HostTensor::full(&[total_q, h, d], DType::Bf16, f64::NAN);
        let cu_info = |n: usize| TensorInfo {
            shape: vec![n as i64],
            strides: vec![1],
            dtype: TorchDType::Other("torch.int32".into()),
            device: TorchDevice::Cuda(0),
            ptr: 0,
        };
        let opts = Options {
            causal: true,
            window_size: (40, -1),
            ..Options::default()
        };
        let vp = plan_varlen(
            (&info(&q), &info(&k), &info(&v)),
            &info(&out),
            (&cu_info(5), &cu_info(5)),
            (&cu_q, &cu_k),
            (130, 200),
            &opts,
        )
        .expect("valid");
        assert_eq!(
            vp.sequences.len(),
            2,
            "the empty query sequence launches nothing"
        );
        assert_eq!(vp.zero_rows, [(100, 130)], "nor the one without keys");
        interpret_varlen(&vp, Target::Sm90a, (&q, &k, &v), &mut out).expect("interprets");
        // Rows r0..r1 of packed t as a [1, heads, rows, d] tensor.
        let rows = |t: &HostTensor, r0: usize, r1: usize| {
            let [hh, dd] = [t.shape[1], t.shape[2]];
            HostTensor::from_fn(&[1, hh, r1 - r0, dd], t.dtype(), |i| {
                let (x, r, head) = (i % dd, i / dd % (r1 - r0), i / (dd * (r1 - r0)));
                t.data.get_f64(((r0 + r) * hh + head) * dd + x)
            })
        };
        for (i, &(sq, sk)) in lens.iter().enumerate() {
            if sq == 0 {
                continue;
            }
            let (q0, k0) = (cu_q[i] as usize, cu_k[i] as usize);
            let (ks, vs) = (rows(&k, k0, k0 + sk), rows(&v, k0, k0 + sk));
            let want = reference::attention_window(
                &rows(&q, q0, q0 + sq),
                &repeat_heads(&ks, h / hkv),
                &repeat_heads(&vs, h / hkv),
                0.125,
                (40, 0),
                None,
            );
            let got = rows(&out, q0, q0 + sq).to_f64_vec();
            if sk == 0 {
                assert!(got.iter().all(|&x| x == 0.0), "sequence {i}: no keys, 0");
            } else {
                let err = rel_error(&got, &want);
                assert!(
                    err < tolerance(DType::Bf16),
                    "sequence {i}: error {err:.2e}"
                );
            }
        }
        let tail = rows(&out, cu_q[4] as usize, total_q).to_f64_vec();
        assert!(
            tail.iter().all(|x| x.is_nan()),
            "rows past the last offset untouched"
        );
    }
}
