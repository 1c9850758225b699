//! Running a [`Plan`]: on the GPU, over borrowed memory on the caller's stream
//! ([`launch`]; a packed varlen batch's in one launch, [`launch_varlen`]), or on kiln's CPU
//! interpreter over host tensors laid out the same way ([`interpret`], [`interpret_varlen`]),
//! so the BSHD views are tested without a GPU.
//!
//! Both go through [`comptime`] and the kernels' own grid function (`KernelDef::grid`; [`grid`]
//! for a dense call), so they run the same specialisation over the same grid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kiln::ir::dsl::{KernelDef, ParamSig, Spec, specialise};
use kiln::ir::interp::{HostArg, InterpError, run_def};
use kiln::ir::{DType, HostTensor, Target};
use kiln::ptx::PtxModule;
use kiln::runtime::{
    Device, DeviceTensor, ForeignStream, KernelArg, LaunchError, LoadedKernel, RuntimeError,
};
use kiln_examples::attention::{
    AttentionParams, attention, attention_lse, attention_varlen, attention_varlen_lse,
    attention_varlen_used, attention_varlen_used_lse,
};

use crate::args::{Plan, TensorInfo, View};
use crate::varlen::{Offsets, VarlenPlan};

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

/// The comptime values of the kernel for `plan` on `target`: the example's tuned blocks for
/// its head dim, mask and lengths (a packed varlen batch's are its totals), and its features.
/// The four attention kernels share them, so one struct serves whichever kernel (`kernel`)
/// the call takes.
pub fn comptime(plan: &Plan, target: Target) -> AttentionParams {
    let lengths = (plan.seqlen_q, plan.seqlen_k);
    AttentionParams {
        kv_group: plan.kv_group,
        dtype: plan.dtype,
        window_left: plan.window.0,
        window_right: plan.window.1,
        attention_chunk: plan.chunk,
        softcap: plan.softcap,
        ..AttentionParams::tuned_pair(target, plan.tile_dims(), plan.causal, lengths)
    }
}

/// The kernel's grid for the comptime values `ct` ([`comptime`]): `block_m` query rows per
/// block, one block row per head and batch.
pub fn grid(plan: &Plan, ct: &AttentionParams) -> [u32; 3] {
    attention.grid(ct, [plan.seqlen_q, plan.nheads, plan.batch])
}

/// One of the attention kernels, whichever: they take the same comptime struct.
type AttentionKernel = dyn KernelDef<Comptime = AttentionParams>;

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

/// Two device tensors of sequence lengths a varlen launch reads: `cu_seqlens_q` and
/// `cu_seqlens_k`, or `seqused_q` and `seqused_k`.
type OffsetPair<'a> = (&'a Offsets, &'a Offsets);

/// Which attention kernel a call takes: dense, packed varlen, or packed varlen with
/// FlashAttention 3's used lengths (`seqused_q`, `seqused_k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Dense,
    Varlen,
    VarlenUsed,
}

/// The kernel for a call of `form`: `attention`, `attention_varlen` or
/// `attention_varlen_used`; their log-sum-exp forms when `lse`.
fn kernel(lse: bool, form: Form) -> &'static AttentionKernel {
    match (lse, form) {
        (false, Form::Dense) => &attention,
        (true, Form::Dense) => &attention_lse,
        (false, Form::Varlen) => &attention_varlen,
        (true, Form::Varlen) => &attention_varlen_lse,
        (false, Form::VarlenUsed) => &attention_varlen_used,
        (true, Form::VarlenUsed) => &attention_varlen_used_lse,
    }
}

/// Launches `plan` writing `out` (a BHSD view from [`crate::args::check_out`]) and, when
/// given, the log-sum-exp `lse` (a `[batch, nheads, seqlen_q]` f32 view: `attention_lse`)
/// on `stream` of its device. Asynchronous: the kernel runs in order on `stream`.
///
/// `lse` may have any strides with the innermost 1 and any f32-aligned address: the kernel
/// writes it with plain stores masked at its extents (TMA stores only take 2-byte tiles), and
/// its 16-byte alignment only selects a specialisation.
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
    let dims = [plan.seqlen_q, plan.nheads, plan.batch];
    // SAFETY: the caller's guarantees, passed on.
    unsafe { launch_kernel(plan, (out, lse), (None, None), dims, stream) }
}

/// Launches the varlen plan `vp` on `stream`: one launch of `attention_varlen` (or
/// `attention_varlen_lse` when `lse`, the packed `[nheads, total_q]` log-sum-exp as
/// [`Lse::packed`], is given) over the packed tensors, reading the offsets on the device (see
/// [`crate::varlen`]). Launches nothing when there is no work ([`VarlenPlan::launches`]).
///
/// # Safety
/// As [`launch`], for the plan's views, `lse` and both offsets tensors (`batch + 1` int32
/// each, read-only).
pub unsafe fn launch_varlen(
    vp: &VarlenPlan,
    lse: Option<&Lse>,
    stream: u64,
) -> Result<(), LaunchFailure> {
    if !vp.launches() {
        return Ok(());
    }
    let dims = [vp.max_seqlen_q, vp.plan.nheads, vp.batch];
    let offsets = Some((&vp.cu_q, &vp.cu_k));
    let used = vp.used.as_ref().map(|(q, k)| (q, k));
    // SAFETY: the caller's guarantees, passed on (the used lengths as the offsets).
    unsafe { launch_kernel(&vp.plan, (&vp.out, lse), (offsets, used), dims, stream) }
}

/// [`launch`] and [`launch_varlen`]: the kernel of `plan` (its varlen form when `offsets`
/// are given) over the grid for `[seqlen_q, heads, batch]` = `dims` ([`grid`]'s reading).
///
/// # Safety
/// As [`launch_varlen`].
unsafe fn launch_kernel(
    plan: &Plan,
    (out, lse): (&View, Option<&Lse>),
    (offsets, used): (Option<OffsetPair<'_>>, Option<OffsetPair<'_>>),
    dims: [usize; 3],
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
    let lse = match lse {
        // SAFETY: the caller guarantees the memory behind `lse`.
        Some(l) => Some(unsafe { dev.borrow_tensor(l.ptr, DType::F32, &l.shape, &l.strides) }?),
        None => None,
    };
    // SAFETY: the caller guarantees the offsets tensors.
    let borrow_offsets =
        |c: &Offsets| unsafe { dev.borrow_tensor(c.ptr, DType::I32, &[c.len], &[1]) };
    let cu = match offsets {
        Some((q, k)) => Some([borrow_offsets(q)?, borrow_offsets(k)?]),
        None => None,
    };
    let used = match used {
        Some((q, k)) => Some([borrow_offsets(q)?, borrow_offsets(k)?]),
        None => None,
    };
    let tensors = [&q, &k, &v, &o];
    let mut args: Vec<KernelArg<'_>> = tensors.iter().map(|&t| KernelArg::Tensor(t)).collect();
    args.extend(lse.as_ref().map(KernelArg::Tensor));
    args.extend(cu.iter().flatten().map(KernelArg::Tensor));
    args.extend(used.iter().flatten().map(KernelArg::Tensor));
    args.push(KernelArg::F32(plan.scale));
    let form = match (&cu, &used) {
        (None, _) => Form::Dense,
        (Some(_), None) => Form::Varlen,
        (Some(_), Some(_)) => Form::VarlenUsed,
    };
    let def = kernel(lse.is_some(), form);
    let prepared = prepared(&dev, def, plan, &args)?;
    // SAFETY: the caller guarantees the stream.
    let stream = unsafe { ForeignStream::from_raw(stream) };
    let grid = def.grid(&prepared.comptime, dims);
    dev.launch_loaded_on_stream(stream, &prepared.kernel, &prepared.signature, grid, &args)?;
    Ok(())
}

/// What picks the loaded kernel of a call: the kernel, the device, the plan's comptime
/// values ([`comptime`]: compared bit for bit, `softcap` included; its blocks depend on the
/// lengths too) and, bit `i` for tensor argument `i`, whether the tensor is 16-byte aligned
/// (the runtime's rule, [`DeviceTensor::aligned16`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct LaunchKey {
    kernel: &'static str,
    device: usize,
    comptime: AttentionParams,
    aligned: u32,
}

/// A specialisation ready to launch: its comptime values (the grid reads `block_m`), its
/// signature with them applied, and the loaded kernel.
struct Prepared {
    comptime: AttentionParams,
    signature: Vec<ParamSig>,
    kernel: Arc<LoadedKernel>,
}

/// The [`Prepared`] specialisation of `def` for `plan` and the tensors of `args`, made on
/// the first call with its key and kept for the process. A call after the first builds no
/// signature or [`Spec`] (the work [`Device::launch`] does per launch), which is most of the
/// host time a repeated small call spends in kiln.
fn prepared(
    dev: &Device,
    def: &'static AttentionKernel,
    plan: &Plan,
    args: &[KernelArg<'_>],
) -> Result<Arc<Prepared>, LaunchError> {
    static PREPARED: OnceLock<Mutex<HashMap<LaunchKey, Arc<Prepared>>>> = OnceLock::new();
    let tensors = || {
        args.iter().filter_map(|a| match a {
            KernelArg::Tensor(t) => Some(*t),
            _ => None,
        })
    };
    let comptime = comptime(plan, dev.target());
    let key = LaunchKey {
        kernel: def.name(),
        device: plan.device,
        comptime,
        aligned: tensors()
            .enumerate()
            .fold(0, |bits, (i, t)| bits | (u32::from(t.aligned16()) << i)),
    };
    let cache = PREPARED.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
    if let Some(p) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let signature = specialise(def.signature(), &comptime);
    let names = signature.iter().filter_map(|p| match p {
        ParamSig::Tensor { name, .. } => Some(name.to_string()),
        ParamSig::Scalar { .. } => None,
    });
    let spec = Spec {
        comptime,
        aligned16: names.zip(tensors().map(DeviceTensor::aligned16)).collect(),
    };
    let kernel = dev.compile(def, &spec)?;
    let p = Arc::new(Prepared {
        comptime,
        signature,
        kernel,
    });
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(cache.entry(key).or_insert(p).clone())
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

impl Lse {
    /// The log-sum-exp tensor the extension allocated, as PyTorch describes it:
    /// `flash_attn_func`'s `[batch, nheads, seqlen_q]` as it is, `flash_attn_varlen_func`'s
    /// `[nheads, total_q]` as [`Lse::packed`].
    pub fn of(t: &TensorInfo) -> Lse {
        let at = |v: &[i64], i: usize| v[i] as usize;
        if t.shape.len() == 2 {
            let (s, st) = (&t.shape, &t.strides);
            return Lse::packed(t.ptr, [at(s, 0), at(s, 1)], [at(st, 0), at(st, 1)]);
        }
        Lse {
            ptr: t.ptr,
            shape: [0, 1, 2].map(|i| at(&t.shape, i)),
            strides: [0, 1, 2].map(|i| at(&t.strides, i)),
        }
    }

    /// `flash_attn_varlen_func`'s `[nheads, total_q]` log-sum-exp at `ptr`, strides `[head,
    /// row]` in elements, as one batch `[1, nheads, total_q]`: the rank `attention_lse` writes.
    pub fn packed(ptr: u64, [heads, total]: [usize; 2], [head, row]: [usize; 2]) -> Lse {
        Lse {
            ptr,
            shape: [1, heads, total],
            strides: [heads * head, head, row],
        }
    }
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
/// plan's BHSD strides, compiled for `target`'s comptime choices; `lse`, when given, is the
/// `[batch, nheads, seqlen_q]` log-sum-exp (`attention_lse`).
pub fn interpret(
    plan: &Plan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: &mut HostTensor,
    lse: Option<&mut HostTensor>,
) -> Result<(), InterpError> {
    let out_view = View {
        ptr: 0,
        shape: [plan.batch, plan.nheads, plan.seqlen_q, plan.head_dim_v],
        strides: [
            out.strides[0],
            out.strides[2],
            out.strides[1],
            out.strides[3],
        ],
    };
    let dims = [plan.seqlen_q, plan.nheads, plan.batch];
    run_kernel(plan, target, (q, k, v), (out, &out_view, lse), None, dims)
}

/// Runs the varlen plan `vp` on the CPU interpreter, the way [`launch_varlen`] runs it on the
/// GPU: one run of `attention_varlen` (`attention_varlen_lse` when `lse`, the packed `[nheads,
/// total_q]` log-sum-exp, is given) over the packed host tensors `q`, `k`, `v` and `out` the
/// plan was made for (described at address 0), the kernel reading the offsets `cu_q`, `cu_k`
/// (int32 `[batch + 1]`) itself. Runs nothing when the launch would not
/// ([`VarlenPlan::launches`]).
pub fn interpret_varlen(
    vp: &VarlenPlan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: &mut HostTensor,
    lse: Option<&mut HostTensor>,
    (cu_q, cu_k): (&HostTensor, &HostTensor),
) -> Result<(), InterpError> {
    if !vp.launches() {
        return Ok(());
    }
    let mut lse_view = lse.map(|l| {
        let p = Lse::packed(0, [l.shape[0], l.shape[1]], [l.strides[0], l.strides[1]]);
        let view = HostTensor {
            shape: p.shape.to_vec(),
            strides: p.strides.to_vec(),
            data: l.data.clone(),
        };
        (l, view)
    });
    let dims = [vp.max_seqlen_q, vp.plan.nheads, vp.batch];
    run_kernel(
        &vp.plan,
        target,
        (q, k, v),
        (out, &vp.out, lse_view.as_mut().map(|(_, view)| view)),
        Some((cu_q, cu_k)),
        dims,
    )?;
    if let Some((l, view)) = lse_view {
        l.data = view.data;
    }
    Ok(())
}

/// Runs the kernel for `plan` ([`kernel`]: its varlen form with `offsets`) on the interpreter
/// over the grid for `dims` = `[seqlen_q, heads, batch]`: `q`, `k`, `v` seen through the
/// plan's views, `out` through `out_view`, `lse` as given (in the kernel's layout); `out`
/// gets the results back.
fn run_kernel(
    plan: &Plan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    (out, out_view, lse): (&mut HostTensor, &View, Option<&mut HostTensor>),
    offsets: Option<(&HostTensor, &HostTensor)>,
    dims: [usize; 3],
) -> Result<(), InterpError> {
    // The tensors lie at address 0, as every view of them starts.
    let view = |t: &HostTensor, v: &View| HostTensor {
        shape: v.shape.to_vec(),
        strides: v.strides.to_vec(),
        data: t.data.clone(),
    };
    let (qv, kv, vv) = (view(q, &plan.q), view(k, &plan.k), view(v, &plan.v));
    let mut ov = view(out, out_view);
    let ct = comptime(plan, target);
    let form = if offsets.is_some() {
        Form::Varlen
    } else {
        Form::Dense
    };
    let def = kernel(lse.is_some(), form);
    let grid = def.grid(&ct, dims);
    let mut args = vec![
        HostArg::Tensor(&qv),
        HostArg::Tensor(&kv),
        HostArg::Tensor(&vv),
        HostArg::TensorMut(&mut ov),
    ];
    args.extend(lse.map(HostArg::TensorMut));
    if let Some((cu_q, cu_k)) = offsets {
        args.extend([HostArg::Tensor(cu_q), HostArg::Tensor(cu_k)]);
    }
    args.push(HostArg::F32(plan.scale));
    run_def(def, &ct, grid, &mut args)?;
    drop(args);
    out.data = ov.data;
    Ok(())
}

#[cfg(test)]
mod tests {
    use kiln::ir::{DType, HostTensor, Target, TensorData};
    use kiln_tests::check::{rel_error, tolerance};
    use kiln_tests::inputs::{Dist, Rng, tensor};
    use kiln_tests::reference;

    use super::{interpret, interpret_varlen};
    use crate::args::{Options, TensorInfo, TorchDType, TorchDevice, plan};
    use crate::varlen::{VarlenPlan, plan_varlen};

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
    /// (FlashAttention's normalisation: causal with a left bound), chunks, a soft-cap and
    /// head dim 96, with the log-sum-exp, against the f64 reference with the same window and cap
    /// (every row sees a key here: rows that see none are `interp_attention_features`').
    #[test]
    fn options_run_on_the_interpreter_to_the_reference() {
        let mut rng = Rng::new(96);
        let (b, sq, sk, h) = (1, 150, 210, 2);
        for (target, d, dtype, causal, window_size, chunk, softcap) in [
            (Target::Sm90a, 64, DType::F16, false, (-1, -1), 0, 0.0),
            (Target::Sm80, 64, DType::Bf16, true, (40, -1), 0, 0.0),
            (Target::Sm90a, 96, DType::Bf16, false, (30, 20), 0, 10.0),
            (Target::Sm90a, 64, DType::F16, true, (-1, -1), 0, 25.0),
            (Target::Sm90a, 64, DType::Bf16, true, (-1, -1), 50, 0.0),
            (Target::Sm80, 96, DType::F16, false, (20, -1), 70, 0.0),
        ] {
            let make = |rng: &mut Rng, s| tensor(rng, &[b, s, h, d], dtype, Dist::Normal);
            let q = make(&mut rng, sq);
            let (k, v) = (make(&mut rng, sk), make(&mut rng, sk));
            let opts = Options {
                causal,
                window_size,
                softcap,
                return_lse: true,
                attention_chunk: chunk,
                ..Options::default()
            };
            let p = plan(&info(&q), &info(&k), &info(&v), &opts).expect("valid");
            let mut out = HostTensor::full(&[b, sq, h, d], dtype, f64::NAN);
            let mut lse = HostTensor::full(&p.lse_shape(), DType::F32, f64::NAN);
            interpret(&p, target, (&q, &k, &v), &mut out, Some(&mut lse)).expect("interprets");
            let right = if causal { 0 } else { window_size.1 };
            let window = reference::Window {
                left: window_size.0,
                right,
                chunk,
            };
            let want = reference::attention_window(
                &as_bhsd(&q),
                &as_bhsd(&k),
                &as_bhsd(&v),
                f64::from(p.scale),
                window,
                (softcap > 0.0).then_some(softcap),
            );
            let err = rel_error(&as_bhsd(&out).to_f64_vec(), &want);
            let want_lse = reference::attention_lse(
                &as_bhsd(&q),
                &as_bhsd(&k),
                f64::from(p.scale),
                window,
                (softcap > 0.0).then_some(softcap),
            );
            let lse_err = rel_error(&lse.to_f64_vec(), &want_lse);
            assert!(
                err < tolerance(dtype) && lse_err < tolerance(DType::F32),
                "{target:?} d={d} {dtype:?} causal={causal} window={window_size:?} \
                 chunk={chunk} softcap={softcap}: error {err:.2e}, lse error {lse_err:.2e}"
            );
        }
    }

    /// A packed varlen batch: sequences of `(query rows, keys)` `lens`, `pad` query rows past
    /// the last offset, `h` query and `hkv` key/value heads of head dim 64.
    struct Packed {
        cu_q: Vec<i64>,
        cu_k: Vec<i64>,
        q: HostTensor,
        k: HostTensor,
        v: HostTensor,
    }

    impl Packed {
        fn new(
            rng: &mut Rng,
            lens: &[(usize, usize)],
            (h, hkv): (usize, usize),
            pad: usize,
            dtype: DType,
        ) -> Packed {
            let offsets = |len: fn(&(usize, usize)) -> usize| {
                let mut cu = vec![0i64];
                for l in lens {
                    cu.push(cu[cu.len() - 1] + len(l) as i64);
                }
                cu
            };
            let (cu_q, cu_k) = (offsets(|l| l.0), offsets(|l| l.1));
            let total_q = cu_q[lens.len()] as usize + pad;
            let total_k = cu_k[lens.len()] as usize;
            let d = 64;
            let q = tensor(rng, &[total_q, h, d], dtype, Dist::Normal);
            let k = tensor(rng, &[total_k, hkv, d], dtype, Dist::Normal);
            let v = tensor(rng, &[total_k, hkv, d], dtype, Dist::Normal);
            Packed {
                cu_q,
                cu_k,
                q,
                k,
                v,
            }
        }

        /// `plan_varlen` over these tensors, `out` and `opts`, with the maxima given.
        fn plan(&self, out: &HostTensor, max: (i64, i64), opts: &Options) -> VarlenPlan {
            let cu_info = |n: usize| TensorInfo {
                shape: vec![n as i64],
                strides: vec![1],
                dtype: TorchDType::Other("torch.int32".into()),
                device: TorchDevice::Cuda(0),
                ptr: 0,
            };
            let n = self.cu_q.len();
            plan_varlen(
                (&info(&self.q), &info(&self.k), &info(&self.v)),
                &info(out),
                (&cu_info(n), &cu_info(n)),
                max,
                opts,
            )
            .expect("valid")
        }

        /// The offsets as the int32 tensors the kernel reads.
        fn offsets(&self) -> (HostTensor, HostTensor) {
            let t = |cu: &[i64]| {
                let cu = cu.iter().map(|&x| x as i32).collect();
                HostTensor::new(&[self.cu_q.len()], TensorData::I32(cu)).expect("offsets")
            };
            (t(&self.cu_q), t(&self.cu_k))
        }

        /// Sequence `i`'s rows of q, k and v as `[1, heads, rows, d]` tensors, k's and v's
        /// heads repeated for q's (what the reference reads).
        fn sequence(&self, i: usize) -> (HostTensor, HostTensor, HostTensor) {
            let (q0, q1) = (self.cu_q[i] as usize, self.cu_q[i + 1] as usize);
            let (k0, k1) = (self.cu_k[i] as usize, self.cu_k[i + 1] as usize);
            let group = self.q.shape[1] / self.k.shape[1];
            (
                rows(&self.q, q0, q1),
                repeat_heads(&rows(&self.k, k0, k1), group),
                repeat_heads(&rows(&self.v, k0, k1), group),
            )
        }
    }

    /// Rows `r0..r1` of the packed contiguous `[total, heads, d]` tensor `t` as a `[1, heads,
    /// rows, d]` tensor.
    fn rows(t: &HostTensor, r0: usize, r1: usize) -> HostTensor {
        let [hh, dd] = [t.shape[1], t.shape[2]];
        HostTensor::from_fn(&[1, hh, r1 - r0, dd], t.dtype(), |i| {
            let (x, r, head) = (i % dd, i / dd % (r1 - r0), i / (dd * (r1 - r0)));
            t.data.get_f64(((r0 + r) * hh + head) * dd + x)
        })
    }

    /// `flash_attn_varlen_func`'s one launch on the interpreter: packed sequences of
    /// different lengths (one with no query rows, one with no keys, whose rows are 0), grouped
    /// heads, a causal window normalised by `max_seqlen_k`, each sequence against the
    /// reference on its own rows; rows past the last offset are never written.
    #[test]
    fn varlen_sequences_run_on_the_interpreter_to_the_reference() {
        let lens = [(100, 50), (0, 30), (130, 0), (70, 200)];
        let b = Packed::new(&mut Rng::new(17), &lens, (4, 2), 5, DType::Bf16);
        let mut out = HostTensor::full(&b.q.shape, DType::Bf16, f64::NAN);
        let opts = Options {
            causal: true,
            window_size: (40, -1),
            ..Options::default()
        };
        let vp = b.plan(&out, (130, 200), &opts);
        let (cu_q, cu_k) = b.offsets();
        let inputs = (&b.q, &b.k, &b.v);
        interpret_varlen(&vp, Target::Sm90a, inputs, &mut out, None, (&cu_q, &cu_k))
            .expect("interprets");
        for (i, &(sq, sk)) in lens.iter().enumerate() {
            if sq == 0 {
                continue;
            }
            let (qs, ks, vs) = b.sequence(i);
            let want = reference::attention_window(&qs, &ks, &vs, 0.125, (40, 0), None);
            let q0 = b.cu_q[i] as usize;
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
        let tail = rows(&out, b.cu_q[4] as usize, b.q.shape[0]).to_f64_vec();
        assert!(
            tail.iter().all(|x| x.is_nan()),
            "rows past the last offset untouched"
        );
    }

    /// The varlen log-sum-exp, `[nheads, total_q]`, each sequence writing its columns: odd
    /// lengths, causal with more queries than keys (the first rows see no
    /// key: `+inf`), a sequence without keys (`+inf`, as `flash_attn_func` gives a row that
    /// sees none), an empty one, and grouped heads, against the f64 reference; the output
    /// and the log-sum-exp are poisoned first, so an element no launch writes fails, and the
    /// columns past the last offset must stay so.
    #[test]
    fn varlen_lse_runs_on_the_interpreter_to_the_reference() {
        let lens = [(113, 60), (0, 25), (45, 0), (64, 190), (1, 7)];
        let (h, pad) = (4, 3);
        let b = Packed::new(&mut Rng::new(23), &lens, (h, 2), pad, DType::F16);
        let mut out = HostTensor::full(&b.q.shape, DType::F16, f64::NAN);
        let opts = Options {
            causal: true,
            softcap: 20.0,
            return_lse: true,
            ..Options::default()
        };
        let vp = b.plan(&out, (113, 190), &opts);
        let total_q = b.q.shape[0];
        assert_eq!(vp.lse_shape, Some([h, total_q]));
        let mut lse = HostTensor::full(&[h, total_q], DType::F32, f64::NAN);
        let (cu_q, cu_k) = b.offsets();
        interpret_varlen(
            &vp,
            Target::Sm90a,
            (&b.q, &b.k, &b.v),
            &mut out,
            Some(&mut lse),
            (&cu_q, &cu_k),
        )
        .expect("interprets");
        // Columns c0..c1 of every head of the log-sum-exp, head-major.
        let cols = |c0: usize, c1: usize| -> Vec<f64> {
            (0..h)
                .flat_map(|hh| (c0..c1).map(move |c| (hh, c)))
                .map(|(hh, c)| lse.data.get_f64(hh * total_q + c))
                .collect()
        };
        let scale = 0.125;
        for (i, &(sq, sk)) in lens.iter().enumerate() {
            let (qs, ks, vs) = b.sequence(i);
            let q0 = b.cu_q[i] as usize;
            let want = reference::attention_lse(&qs, &ks, scale, (-1, 0), Some(20.0));
            let got = cols(q0, q0 + sq);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    *g == f64::INFINITY,
                    *w == f64::INFINITY,
                    "sequence {i} (sq={sq} sk={sk}): lse[{j}] = {g}, want {w}"
                );
            }
            let (g, w): (Vec<f64>, Vec<f64>) =
                got.iter().zip(&want).filter(|(_, w)| w.is_finite()).unzip();
            let err = rel_error(&g, &w);
            assert!(
                err < tolerance(DType::F32),
                "sequence {i}: lse error {err:.2e}"
            );
            if sk > 0 {
                let want = reference::attention_window(&qs, &ks, &vs, scale, (-1, 0), Some(20.0));
                let err = rel_error(&rows(&out, q0, q0 + sq).to_f64_vec(), &want);
                assert!(err < tolerance(DType::F16), "sequence {i}: error {err:.2e}");
            } else {
                let got = rows(&out, q0, q0 + sq).to_f64_vec();
                assert!(got.iter().all(|&x| x == 0.0), "sequence {i}: no keys, 0");
            }
        }
        let (blind, keyless) = (lens[0].0 - lens[0].1, lens[2].0);
        let infs = cols(0, total_q)
            .iter()
            .filter(|&&x| x == f64::INFINITY)
            .count();
        assert_eq!(
            infs,
            h * (blind + keyless),
            "+inf: the causal rows that see no key and the sequence without keys"
        );
        let last = b.cu_q[lens.len()] as usize;
        assert!(
            cols(last, total_q).iter().all(|x| x.is_nan()),
            "columns past the last offset untouched"
        );
    }
}
