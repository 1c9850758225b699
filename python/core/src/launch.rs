//! Running a [`Plan`]: on the GPU, over borrowed memory on the caller's stream
//! ([`launch`]), or on kiln's CPU interpreter over host tensors laid out the same way
//! ([`interpret`]), so the BSHD views are tested without a GPU.
//!
//! Both go through [`comptime`] and [`grid`], so they run the same specialisation.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use kiln::ir::dsl::{ComptimeValue, KernelDef, ParamSig, Spec, specialise};
use kiln::ir::interp::{HostArg, InterpError, run_def};
use kiln::ir::{DType, HostTensor, Target};
use kiln::ptx::PtxModule;
use kiln::runtime::{
    Device, DeviceTensor, ForeignStream, KernelArg, LaunchError, LoadedKernel, RuntimeError,
};
use kiln_examples::attention::{attention, attention_lse, tuned_block_m, tuned_block_n};

use crate::args::{Plan, TensorInfo, View};
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
    kiln_examples::attention::grid(ct, (plan.seqlen_q, plan.nheads, plan.batch))
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
/// given, the log-sum-exp `lse` (a `[batch, nheads, seqlen_q]` f32 view: `attention_lse`)
/// on `stream` of its device. Asynchronous: the kernel runs in order on `stream`.
///
/// `lse` may have any strides with the innermost 1 and any f32-aligned address: the kernel
/// writes it with plain stores masked at its extents (TMA stores only take 2-byte tiles), and
/// its 16-byte alignment only selects a specialisation, so a varlen sequence's columns of the
/// packed log-sum-exp ([`Lse::rows`]) are written in place.
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
    let lse = match lse {
        // SAFETY: the caller guarantees the memory behind `lse`.
        Some(l) => Some(unsafe { dev.borrow_tensor(l.ptr, DType::F32, &l.shape, &l.strides) }?),
        None => None,
    };
    let tensors = [&q, &k, &v, &o];
    let mut args: Vec<KernelArg<'_>> = tensors.iter().map(|&t| KernelArg::Tensor(t)).collect();
    args.extend(lse.as_ref().map(KernelArg::Tensor));
    args.push(KernelArg::F32(plan.scale));
    let def: &'static dyn KernelDef = if lse.is_some() {
        &attention_lse
    } else {
        &attention
    };
    let prepared = prepared(&dev, def, plan, &args)?;
    // SAFETY: the caller guarantees the stream.
    let stream = unsafe { ForeignStream::from_raw(stream) };
    let grid = grid(plan, &prepared.comptime);
    dev.launch_loaded_on_stream(stream, &prepared.kernel, &prepared.signature, grid, &args)?;
    Ok(())
}

/// What picks the loaded kernel of a call: the kernel, the device, the plan's comptime
/// choices (everything [`comptime`] reads) and, bit `i` for tensor argument `i`, whether the
/// tensor is 16-byte aligned (the runtime's rule, [`DeviceTensor::aligned16`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct LaunchKey {
    kernel: &'static str,
    device: usize,
    head_dim: usize,
    causal: bool,
    kv_group: usize,
    dtype: DType,
    window: (i32, i32),
    /// `softcap`'s bits: comptime values are compared bit for bit.
    softcap: u32,
    aligned: u32,
}

/// A specialisation ready to launch: its comptime values (the grid reads `block_m`), its
/// signature with them applied, and the loaded kernel.
struct Prepared {
    comptime: BTreeMap<String, ComptimeValue>,
    signature: Vec<ParamSig>,
    kernel: Arc<LoadedKernel>,
}

/// The [`Prepared`] specialisation of `def` for `plan` and the tensors of `args`, made on
/// the first call with its key and kept for the process. A call after the first builds no
/// comptime map, signature or [`Spec`] (the work [`Device::launch`] does per launch), which
/// is most of the host time a repeated small call spends in kiln.
fn prepared(
    dev: &Device,
    def: &'static dyn KernelDef,
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
    let key = LaunchKey {
        kernel: def.name(),
        device: plan.device,
        head_dim: plan.head_dim,
        causal: plan.causal,
        kv_group: plan.kv_group,
        dtype: plan.dtype,
        window: plan.window,
        softcap: plan.softcap.to_bits(),
        aligned: tensors()
            .enumerate()
            .fold(0, |bits, (i, t)| bits | (u32::from(t.aligned16()) << i)),
    };
    let cache = PREPARED.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
    if let Some(p) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let comptime = comptime(plan, dev.target());
    let signature = specialise(def.signature(), &comptime);
    let names = signature.iter().filter_map(|p| match p {
        ParamSig::Tensor { name, .. } => Some(name.to_string()),
        ParamSig::Scalar { .. } => None,
    });
    let spec = Spec {
        comptime: comptime.clone(),
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

/// Launches every sequence of the varlen plan `vp` on `stream`, in batch order, each writing
/// its own rows of the packed output and, when `lse` (the packed `[nheads, total_q]`
/// log-sum-exp as [`Lse::packed`]) is given, its own columns of it (see [`crate::varlen`]).
/// The rows of sequences without keys (`vp.zero_rows`) are the caller's to fill.
///
/// # Safety
/// As [`launch`], for every sequence's views and `lse`.
pub unsafe fn launch_varlen(
    vp: &VarlenPlan,
    lse: Option<&Lse>,
    stream: u64,
) -> Result<(), LaunchFailure> {
    for s in &vp.sequences {
        let lse = lse.map(|l| l.rows(s.first, s.plan.seqlen_q));
        // SAFETY: the caller guarantees every view, as `launch` requires; a sequence's
        // columns lie inside `lse`, its rows being inside the checked offsets.
        unsafe { launch(&s.plan, &s.out, lse.as_ref(), stream) }?;
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

    /// Rows `first..first + rows` of every head, the same memory: one varlen sequence's
    /// log-sum-exp inside the packed one.
    pub fn rows(&self, first: usize, rows: usize) -> Lse {
        let bytes = first * self.strides[2] * std::mem::size_of::<f32>();
        Lse {
            ptr: self.ptr + bytes as u64,
            shape: [self.shape[0], self.shape[1], rows],
            strides: self.strides,
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
    run_kernel(plan, target, (&qv, &kv, &vv), &mut ov, lse)?;
    out.data = ov.data;
    Ok(())
}

/// Runs `attention` for `plan`, or `attention_lse` when `lse` is given, on the interpreter
/// over tensors already in the kernel's layout (`[batch, heads, seq, d]`, and `lse`
/// `[batch, nheads, seqlen_q]`).
fn run_kernel(
    plan: &Plan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: &mut HostTensor,
    lse: Option<&mut HostTensor>,
) -> Result<(), InterpError> {
    let ct = comptime(plan, target);
    let grid = grid(plan, &ct);
    let (q, k, v, o, scale) = (
        HostArg::Tensor(q),
        HostArg::Tensor(k),
        HostArg::Tensor(v),
        HostArg::TensorMut(out),
        HostArg::F32(plan.scale),
    );
    match lse {
        None => run_def(&attention, &ct, grid, &mut [q, k, v, o, scale]),
        Some(l) => run_def(
            &attention_lse,
            &ct,
            grid,
            &mut [q, k, v, o, HostArg::TensorMut(l), scale],
        ),
    }
}

/// Runs the varlen plan `vp` on the CPU interpreter, the way [`launch_varlen`] runs it: `q`,
/// `k`, `v` and `out` are the packed host tensors the plan was made for, and `lse`, when
/// given, the packed `[nheads, total_q]` log-sum-exp, all described at address 0 (so a
/// view's address is its offset in bytes). Each sequence's views (its log-sum-exp columns
/// through [`Lse::rows`], as the launch takes them) are copied out and its results copied
/// back: this runs the plan's offsets, lengths and options, not the kernel's edge masking at
/// a sequence's end (the GPU tests check that). Sequences without keys get what the
/// extension writes for them: output 0, log-sum-exp `+inf`.
pub fn interpret_varlen(
    vp: &VarlenPlan,
    target: Target,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: &mut HostTensor,
    mut lse: Option<&mut HostTensor>,
) -> Result<(), InterpError> {
    let packed = lse
        .as_deref()
        .map(|l| Lse::packed(0, [l.shape[0], l.shape[1]], [l.strides[0], l.strides[1]]));
    let of_view = |t: &HostTensor, v: &View| Gathered::new(t, v.ptr, &v.shape, &v.strides);
    let of_lse = |t: &HostTensor, l: &Lse| Gathered::new(t, l.ptr, &l.shape, &l.strides);
    for s in &vp.sequences {
        let p = &s.plan;
        let (qs, ks, vs) = (of_view(q, &p.q), of_view(k, &p.k), of_view(v, &p.v));
        let mut os = of_view(out, &s.out);
        let mut ls = lse
            .as_deref()
            .zip(packed.as_ref())
            .map(|(l, packed)| of_lse(l, &packed.rows(s.first, p.seqlen_q)));
        run_kernel(
            p,
            target,
            (&qs.t, &ks.t, &vs.t),
            &mut os.t,
            ls.as_mut().map(|g| &mut g.t),
        )?;
        os.scatter(out);
        if let Some((g, l)) = ls.zip(lse.as_deref_mut()) {
            g.scatter(l);
        }
    }
    // As the extension fills them (`out.narrow(0, first, rows).zero_()`, and the
    // log-sum-exp's columns `fill_(inf)`).
    let row = out.strides[0];
    for &(first, rows) in &vp.zero_rows {
        for i in first * row..(first + rows) * row {
            out.data.set_f64(i, 0.0);
        }
        if let Some((l, packed)) = lse.as_deref_mut().zip(packed.as_ref()) {
            let cols = packed.rows(first, rows);
            for i in offsets(l, cols.ptr, &cols.shape, &cols.strides) {
                l.data.set_f64(i, f64::INFINITY);
            }
        }
    }
    Ok(())
}

/// A view's elements copied out of a host tensor, and where each came from.
struct Gathered {
    /// The elements, a contiguous tensor of the view's shape.
    t: HostTensor,
    /// The element offset in the host tensor of each, in row-major order.
    at: Vec<usize>,
}

impl Gathered {
    /// The elements of `t` that the view at byte address `ptr` (`t` being at address 0) with
    /// `shape` and `strides` sees.
    fn new(t: &HostTensor, ptr: u64, shape: &[usize], strides: &[usize]) -> Gathered {
        let at = offsets(t, ptr, shape, strides);
        Gathered {
            t: HostTensor::from_fn(shape, t.dtype(), |i| t.data.get_f64(at[i])),
            at,
        }
    }

    /// Writes the elements back where they came from in `t`.
    fn scatter(&self, t: &mut HostTensor) {
        for (i, &at) in self.at.iter().enumerate() {
            t.data.set_f64(at, self.t.data.get_f64(i));
        }
    }
}

/// The element offsets in `t` (at address 0) of the elements of the view at byte address
/// `ptr` with `shape` and `strides`, in row-major order of its shape.
fn offsets(t: &HostTensor, ptr: u64, shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let base = ptr as usize / t.dtype().size_bytes();
    kiln::ir::host::row_major_offsets(shape, strides)
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
                (&self.cu_q, &self.cu_k),
                max,
                opts,
            )
            .expect("valid")
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

    /// `flash_attn_varlen_func`'s plan on the interpreter: packed sequences of different
    /// lengths (one with no query rows, one with no keys, whose rows are 0), grouped heads, a
    /// causal window normalised by `max_seqlen_k`, each sequence against the reference on its
    /// own rows; rows past the last offset are never written.
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
        assert_eq!(
            vp.sequences.len(),
            2,
            "the empty query sequence launches nothing"
        );
        assert_eq!(vp.zero_rows, [(100, 130)], "nor the one without keys");
        interpret_varlen(&vp, Target::Sm90a, (&b.q, &b.k, &b.v), &mut out, None)
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

    /// The varlen log-sum-exp, `[nheads, total_q]`, written by each sequence through its
    /// columns' view: odd lengths, causal with more queries than keys (the first rows see no
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
        interpret_varlen(
            &vp,
            Target::Sm90a,
            (&b.q, &b.k, &b.v),
            &mut out,
            Some(&mut lse),
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
