//! The `kiln_attn._native` Python module: attention's forward and backward over PyTorch tensors
//! (CUDA tensors in place on the caller's current stream, CPU tensors on kiln's interpreter) and
//! every registered kernel by name; `kiln_attn/*.py` adds FlashAttention's argument orders,
//! autograd and the custom ops. Tensors are read through `shape`, `stride()`, `dtype`, `device`
//! and `data_ptr()`, not DLPack: a few attribute reads, no capsule or stream handshake, and the
//! CPU tests may pass tensor-like objects. torch is imported once, at the first launch.
//!
//! **Architecture invariant:** no rule lives here; checks and launch plans are `kiln-attn-core`'s.

use kiln_attn_core::args::Place;
use kiln_attn_core::args::{
    self, ArgError, ErrorKind, Options, TensorInfo, TorchDType, TorchDevice, WindowRule,
};
use kiln_attn_core::backward;
use kiln_attn_core::generic::{self, Arg, Given};
use kiln_attn_core::kiln::ir::dsl::{ComptimeValue, ParamSig, Registered};
use kiln_attn_core::launch::{self, LaunchFailure};
use kiln_attn_core::varlen;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::Mutex;

use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyTuple};

/// The exception an argument error becomes.
fn arg_err(e: ArgError) -> PyErr {
    match e.kind {
        ErrorKind::Type => PyTypeError::new_err(e.message),
        ErrorKind::Value => PyValueError::new_err(e.message),
    }
}

/// The `RuntimeError` a failure past the argument checks becomes (no driver, a compile or
/// driver error), its message starting `kiln_attn: `.
fn runtime_err(e: LaunchFailure) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// What PyTorch reports about `obj`, passed as argument `name`; a `TypeError` when `obj` is
/// not a tensor.
fn tensor_info(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<TensorInfo> {
    let not_tensor = || {
        let ty = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string());
        PyTypeError::new_err(format!("{name}: expected a torch.Tensor, got {ty}"))
    };
    // One method call per fact the extension needs (a bound method object costs as much
    // again), in the order that finds a non-tensor soonest.
    let shape = obj
        .getattr(pyo3::intern!(obj.py(), "shape"))
        .and_then(|s| ints(&s))
        .map_err(|_| not_tensor())?;
    let strides = obj
        .call_method0(pyo3::intern!(obj.py(), "stride"))
        .and_then(|s| ints(&s))
        .map_err(|_| not_tensor())?;
    let dtype = obj
        .getattr(pyo3::intern!(obj.py(), "dtype"))
        .and_then(|d| dtype_of(&d))
        .map_err(|_| not_tensor())?;
    // A CUDA tensor's device index; -1 for every other device.
    let index: i64 = obj
        .call_method0(pyo3::intern!(obj.py(), "get_device"))
        .and_then(|i| i.extract())
        .map_err(|_| not_tensor())?;
    let device = if let Ok(index) = usize::try_from(index) {
        TorchDevice::Cuda(index)
    } else {
        let device = obj
            .getattr(pyo3::intern!(obj.py(), "device"))
            .and_then(|d| d.str())
            .map_err(|_| not_tensor())?;
        TorchDevice::Other(device.to_string())
    };
    let ptr: u64 = obj
        .call_method0(pyo3::intern!(obj.py(), "data_ptr"))
        .and_then(|p| p.extract())
        .map_err(|_| not_tensor())?;
    Ok(TensorInfo {
        shape,
        strides,
        dtype,
        device,
        ptr,
    })
}

/// The caller's `out` and what it holds, or a new contiguous tensor of `shape` with q's dtype
/// and device, so only its address is asked for. A contiguous `torch.Tensor` q of that shape
/// is copied by `torch.empty_like(q)` (same strides, since q is dense), which takes a
/// microsecond less than `q.new_empty(shape)`, the form for every other case (and for objects
/// that only look like tensors).
fn out_or_new<'py>(
    out: Option<Bound<'py, PyAny>>,
    q: &Bound<'py, PyAny>,
    qi: &TensorInfo,
    shape: &[usize],
) -> PyResult<(Bound<'py, PyAny>, TensorInfo)> {
    if let Some(out) = out {
        let oi = tensor_info("out", &out)?;
        return Ok((out, oi));
    }
    let py = q.py();
    let like = TensorInfo::contiguous(shape, qi.dtype.clone(), qi.device.clone(), 0);
    let out = match torch_alloc(py)? {
        Some((tensor, empty_like))
            if like.shape == qi.shape && like.strides == qi.strides && q.is_instance(tensor)? =>
        {
            empty_like.call1((q,))?
        }
        _ => q.call_method1(pyo3::intern!(py, "new_empty"), (PyTuple::new(py, shape)?,))?,
    };
    let ptr: u64 = out.call_method0(pyo3::intern!(py, "data_ptr"))?.extract()?;
    Ok((out, TensorInfo { ptr, ..like }))
}

/// `torch.Tensor` and `torch.empty_like` once torch is imported (a real tensor means it is),
/// looked up once; `None` while it is not, so the extension never imports torch to allocate.
fn torch_alloc(py: Python<'_>) -> PyResult<Option<(&Bound<'_, PyAny>, &Bound<'_, PyAny>)>> {
    static TORCH: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    if TORCH.get(py).is_none() {
        let modules = py.import("sys")?.getattr("modules")?;
        let Ok(torch) = modules.get_item("torch") else {
            return Ok(None);
        };
        let found = (
            torch.getattr("Tensor")?.unbind(),
            torch.getattr("empty_like")?.unbind(),
        );
        let _ = TORCH.set(py, found);
    }
    Ok(TORCH.get(py).map(|(t, e)| (t.bind(py), e.bind(py))))
}

/// The integers of `obj` (`torch.Size` and `stride()` are tuples: read in place, the common
/// case; any other sequence through pyo3's generic extraction).
fn ints(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    match obj.cast::<PyTuple>() {
        Ok(t) => t.iter().map(|x| x.extract()).collect(),
        Err(_) => obj.extract(),
    }
}

/// The dtype objects [`dtype_of`] has parsed, with what each is.
type SeenDTypes = Vec<(Py<PyAny>, TorchDType)>;

/// The dtype `dtype` is, by its printed name; a dtype seen before is recognised by identity
/// (torch dtypes are singletons), which spares a string per tensor per call.
fn dtype_of(dtype: &Bound<'_, PyAny>) -> PyResult<TorchDType> {
    static SEEN: PyOnceLock<Mutex<SeenDTypes>> = PyOnceLock::new();
    let py = dtype.py();
    let seen = SEEN.get_or_init(py, Default::default);
    // A poisoned lock only means another thread panicked mid-push; the list is still valid.
    let known = |seen: &SeenDTypes| {
        seen.iter()
            .find(|(d, _)| dtype.is(d))
            .map(|(_, t)| t.clone())
    };
    if let Some(t) = known(&seen.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(t);
    }
    let parsed = TorchDType::from_name(dtype.str()?.to_str()?);
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    // PyTorch has a few dtypes; past eight distinct objects, the rest are parsed each time.
    if known(&seen).is_none() && seen.len() < 8 {
        seen.push((dtype.clone().unbind(), parsed.clone()));
    }
    Ok(parsed)
}

/// PyTorch's current CUDA stream on `device`, as a driver handle. Looked up once: the raw
/// getter PyTorch's own compilers use (`torch._C._cuda_getCurrentRawStream`, a fraction of a
/// microsecond), else the public `torch.cuda.current_stream(device).cuda_stream`.
fn current_stream(py: Python<'_>, device: usize) -> PyResult<u64> {
    static RAW: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
    let raw = RAW.get_or_try_init(py, || -> PyResult<_> {
        let c = py.import("torch")?.getattr("_C")?;
        Ok(c.getattr("_cuda_getCurrentRawStream")
            .ok()
            .map(Bound::unbind))
    })?;
    match raw {
        Some(getter) => getter.bind(py).call1((device,))?.extract(),
        None => py
            .import("torch")?
            .getattr("cuda")?
            .call_method1("current_stream", (device,))?
            .getattr("cuda_stream")?
            .extract(),
    }
}

/// The forward under `kiln_attn.flash_attn_func` (which adds FlashAttention 2's argument
/// order, its checks of dropout and ALiBi, and autograd): attention by kiln's DSL kernel.
///
/// q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim), v:
/// (batch, seqlen_k, nheads_k, headdim_v); all torch.bfloat16 or all torch.float16 tensors
/// on one CUDA device (CPU tensors with interpret=True: kiln's interpreter, for tests), each
/// with a contiguous last dimension. headdim and headdim_v are multiples of 8 up to 256 (out
/// is headdim_v wide); nheads_k divides nheads. window_size=(left, right) is
/// normalised by FlashAttention 2's rule, or 3's with fa3_window=True; attention_chunk > 0
/// (FlashAttention 3's) limits each query to its diagonal's chunk of keys. Returns out, or (out,
/// lse) with return_lse=True, lse (batch, nheads, seqlen_q) torch.float32 (+inf for a row
/// that sees no key, as FlashAttention writes it).
#[pyfunction]
#[pyo3(signature = (
    q, k, v, softmax_scale=None, causal=false, window_size=(-1, -1), softcap=0.0,
    return_lse=false, *, out=None, fa3_window=false, attention_chunk=0, interpret=false
))]
#[pyo3(
    text_signature = "(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), \
    softcap=0.0, return_lse=False, *, out=None, fa3_window=False, attention_chunk=0, interpret=False)"
)]
#[allow(clippy::too_many_arguments)]
fn _fwd<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    softmax_scale: Option<f64>,
    causal: bool,
    window_size: (i64, i64),
    softcap: f64,
    return_lse: bool,
    out: Option<Bound<'py, PyAny>>,
    fa3_window: bool,
    attention_chunk: i64,
    interpret: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let py = q.py();
    let qi = tensor_info("q", q)?;
    let ki = tensor_info("k", k)?;
    let vi = tensor_info("v", v)?;
    let opts = options(
        softmax_scale,
        causal,
        window_size,
        softcap,
        return_lse,
        (fa3_window, attention_chunk),
    );
    let place = place(interpret);
    let plan = args::plan_at(&qi, &ki, &vi, &opts, place).map_err(arg_err)?;
    let (out, oi) = out_or_new(out, q, &qi, &plan.out_shape())?;
    let out_view = args::check_out(&plan, &qi, &oi).map_err(arg_err)?;
    // The log-sum-exp when asked for, allocated by each path once it is past every check
    // (the interpreter's kernel always writes one).
    let plan_lse = |always: bool| {
        (plan.return_lse || always)
            .then(|| new_f32(q, &plan.lse_shape()))
            .transpose()
    };
    if plan.is_empty() {
        return with_lse(out, plan_lse(false)?);
    }
    if plan.seqlen_k == 0 {
        // Every row sees no key, so the output is 0 and the log-sum-exp +inf; no launch (a
        // tensor map cannot have an extent of 0). torch's zero_ and fill_ run on the current
        // stream.
        out.call_method0(pyo3::intern!(py, "zero_"))?;
        let lse = plan_lse(false)?;
        if let Some(l) = &lse {
            l.call_method1(pyo3::intern!(py, "fill_"), (f64::INFINITY,))?;
        }
        return with_lse(out, lse);
    }
    if interpret {
        let lse = plan_lse(true)?.expect("allocated when asked for");
        let lse_view = launch::Lse::of(&tensor_info("lse", &lse)?);
        let step = backward::forward_steps(&plan, &out_view, &lse_view, None);
        // SAFETY: every tensor is a CPU tensor (checked) the caller holds, or one allocated
        // above; the interpreter reads and writes them with the GIL held.
        unsafe { backward::run(&[step], Place::Host, 0) }.map_err(generic_err)?;
        return with_lse(out, plan.return_lse.then_some(lse));
    }
    // The device first: without a driver this is the error (not a failed torch import).
    launch::device(plan.device).map_err(|e| runtime_err(e.into()))?;
    let stream = current_stream(py, plan.device)?;
    let lse = plan_lse(false)?;
    let lse_view = lse_view(lse.as_ref())?;
    // SAFETY: the views come from live PyTorch CUDA tensors (checked to be on plan.device,
    // whose primary context PyTorch allocates in) that the caller holds until the call
    // returns; PyTorch's caching allocator keeps their memory for work queued on the current
    // stream, which is `stream`, a live stream of that context. `out` is checked to be the
    // output's shape; it overlapping an input is the caller's mistake, as in FlashAttention.
    unsafe { launch::launch(&plan, &out_view, lse_view.as_ref(), stream) }.map_err(runtime_err)?;
    with_lse(out, lse)
}

/// The options of a call.
fn options(
    softmax_scale: Option<f64>,
    causal: bool,
    window_size: (i64, i64),
    softcap: f64,
    return_lse: bool,
    (fa3_window, attention_chunk): (bool, i64),
) -> Options {
    Options {
        softmax_scale,
        causal,
        window_size,
        softcap,
        return_lse,
        window_rule: if fa3_window {
            WindowRule::Fa3
        } else {
            WindowRule::Fa2
        },
        attention_chunk,
    }
}

/// Where a call's tensors must be: CUDA, or the host for the interpreter.
fn place(interpret: bool) -> Place {
    if interpret { Place::Host } else { Place::Cuda }
}

/// A new torch.float32 tensor of `shape` on q's device (the log-sum-exp, the backward's
/// workspaces).
fn new_f32<'py>(q: &Bound<'py, PyAny>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let py = q.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("dtype", py.import("torch")?.getattr("float32")?)?;
    q.call_method(
        pyo3::intern!(py, "new_empty"),
        (PyTuple::new(py, shape)?,),
        Some(&kwargs),
    )
}

/// The view the kernel writes of the log-sum-exp `lse` allocated by [`new_f32`], if any.
fn lse_view(lse: Option<&Bound<'_, PyAny>>) -> PyResult<Option<launch::Lse>> {
    lse.map(|t| Ok(launch::Lse::of(&tensor_info("lse", t)?)))
        .transpose()
}

/// FlashAttention 3's `seqused_q` and `seqused_k` as given: both, or neither.
fn used_lengths(
    seqused_q: Option<&Bound<'_, PyAny>>,
    seqused_k: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<(TensorInfo, TensorInfo)>> {
    match (seqused_q, seqused_k) {
        (Some(uq), Some(uk)) => Ok(Some((
            tensor_info("seqused_q", uq)?,
            tensor_info("seqused_k", uk)?,
        ))),
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(PyValueError::new_err(
            "seqused_k: pass seqused_q and seqused_k together (kiln_attn.fa3 fills a missing \
             one with the offsets' lengths)",
        )),
    }
}

/// What both functions return: `out`, or `(out, lse)` when the call asked for the
/// log-sum-exp.
fn with_lse<'py>(
    out: Bound<'py, PyAny>,
    lse: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    match lse {
        None => Ok(out),
        Some(lse) => Ok(PyTuple::new(out.py(), [out, lse])?.into_any()),
    }
}

/// The varlen forward under `kiln_attn.flash_attn_varlen_func`: q (total_q, nheads,
/// headdim), k, v (total_k, nheads_k, headdim), the sequences packed one after another, their
/// starts in cu_seqlens_q / cu_seqlens_k ((batch + 1,) torch.int32 on q's device, read by the
/// kernel, never by the host); max_seqlen_q / max_seqlen_k at least every sequence's length.
/// Returns out, or (out, softmax_lse) with return_lse=True, softmax_lse (nheads, total_q)
/// torch.float32 as FlashAttention 2's varlen forward. Window bounds of at least
/// max_seqlen_k are unbounded (FlashAttention 2's rule; fa3_window=True takes 3's).
/// seqused_q, seqused_k: FlashAttention 3's used lengths ((batch,) torch.int32 on q's device,
/// both or neither): sequence b attends with its first seqused_q[b] rows to its first
/// seqused_k[b] keys; its rows past seqused_q[b] are not written.
#[pyfunction]
#[pyo3(signature = (
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
    causal=false, window_size=(-1, -1), softcap=0.0, return_lse=false, *, out=None,
    fa3_window=false, attention_chunk=0, interpret=false, seqused_q=None, seqused_k=None
))]
#[pyo3(
    text_signature = "(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, \
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, return_lse=False, *, \
    out=None, fa3_window=False, attention_chunk=0, interpret=False, seqused_q=None, seqused_k=None)"
)]
#[allow(clippy::too_many_arguments)]
fn _varlen_fwd<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    cu_seqlens_q: &Bound<'py, PyAny>,
    cu_seqlens_k: &Bound<'py, PyAny>,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    softmax_scale: Option<f64>,
    causal: bool,
    window_size: (i64, i64),
    softcap: f64,
    return_lse: bool,
    out: Option<Bound<'py, PyAny>>,
    fa3_window: bool,
    attention_chunk: i64,
    interpret: bool,
    seqused_q: Option<Bound<'py, PyAny>>,
    seqused_k: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = q.py();
    let used = used_lengths(seqused_q.as_ref(), seqused_k.as_ref())?;
    let (qi, ki, vi) = (
        tensor_info("q", q)?,
        tensor_info("k", k)?,
        tensor_info("v", v)?,
    );
    let cu_qi = tensor_info("cu_seqlens_q", cu_seqlens_q)?;
    let cu_ki = tensor_info("cu_seqlens_k", cu_seqlens_k)?;
    let opts = options(
        softmax_scale,
        causal,
        window_size,
        softcap,
        return_lse,
        (fa3_window, attention_chunk),
    );
    // The output is q's rows and heads in v's head dim (which the plan checks).
    let mut shape: Vec<usize> = qi.shape.iter().map(|&n| n.max(0) as usize).collect();
    if let (Some(o), Some(&dv)) = (shape.get_mut(2), vi.shape.get(2)) {
        *o = dv.max(0) as usize;
    }
    let (out, oi) = out_or_new(out, q, &qi, &shape)?;
    let vp = varlen::plan_varlen_used_at(
        (&qi, &ki, &vi),
        &oi,
        (&cu_qi, &cu_ki),
        used.as_ref().map(|(q, k)| (q, k)),
        (max_seqlen_q, max_seqlen_k),
        &opts,
        place(interpret),
    )
    .map_err(arg_err)?;
    if vp.launches() && !interpret {
        // The device first: without a driver this is the error (not a failed torch import),
        // raised before anything is written.
        launch::device(vp.plan.device).map_err(|e| runtime_err(e.into()))?;
    }
    let lse_shape = [vp.plan.nheads, vp.plan.seqlen_q];
    let lse = (vp.lse_shape.is_some() || (interpret && vp.launches()))
        .then(|| new_f32(q, &lse_shape))
        .transpose()?;
    if vp.keyless() {
        // No sequence has a key: every row outputs 0 and its log-sum-exp is +inf, as
        // flash_attn_func's rows that see no key (torch's zero_ and fill_, on the current
        // stream).
        out.call_method0(pyo3::intern!(py, "zero_"))?;
        if let Some(l) = &lse {
            l.call_method1(pyo3::intern!(py, "fill_"), (f64::INFINITY,))?;
        }
    }
    if !vp.launches() {
        return with_lse(out, lse);
    }
    if interpret {
        let li = tensor_info("lse", lse.as_ref().expect("allocated for the interpreter"))?;
        let lse_view = launch::Lse::packed(
            li.ptr,
            lse_shape,
            [li.strides[0] as usize, li.strides[1] as usize],
        );
        let packed = backward::Packed {
            cu_q: vp.cu_q,
            cu_k: vp.cu_k,
            batch: vp.batch,
            max_seqlen_q: vp.max_seqlen_q,
            max_seqlen_k: max_seqlen_k as usize,
            used: vp.used,
        };
        let step = backward::forward_steps(&vp.plan, &vp.out, &lse_view, Some(packed));
        // SAFETY: every tensor is a checked CPU tensor the caller holds, or one allocated
        // above; the interpreter reads and writes them with the GIL held.
        unsafe { backward::run(&[step], Place::Host, 0) }.map_err(generic_err)?;
        return with_lse(out, vp.lse_shape.and(lse));
    }
    let stream = current_stream(py, vp.plan.device)?;
    let lse_view = lse_view(lse.as_ref())?;
    // SAFETY: as in _fwd; the packed views are the checked tensors, the offsets
    // checked int32 tensors of batch + 1 entries on q's device, and `lse` was allocated above
    // on it, so they address live CUDA memory. The kernel keeps every access inside them
    // whatever the offsets hold (crate::varlen).
    unsafe { launch::launch_varlen(&vp, lse_view.as_ref(), stream) }.map_err(runtime_err)?;
    with_lse(out, lse)
}

/// The gradients dq, dk, dv of the forward's q, k, v written into the caller's buffers, under
/// `kiln_attn._flash_attn_backward`: dout and out of q's shape in v's head dim, dq of q's,
/// dk of k's, dv of v's (all q's dtype), softmax_lse the forward's (batch, nheads, seqlen_q) torch.float32; options as the
/// forward took them. Each is checked (a ValueError naming it) before any kernel runs.
/// deterministic=True computes dq in a second pass (the same bits every run) instead of f32
/// atomics (on sm_90a a dense batch always takes the second pass: it is faster). Returns
/// softmax_d, rowsum(dout * out) per row, (batch, nheads, seqlen_q rounded
/// up to 128; FlashAttention 2's padding, zero past seqlen_q)
/// torch.float32.
#[pyfunction]
#[pyo3(signature = (
    dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale=None, causal=false,
    window_size=(-1, -1), softcap=0.0, deterministic=false, *, fa3_window=false, attention_chunk=0,
    interpret=false
))]
#[pyo3(
    text_signature = "(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale=None, \
    causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False, *, \
    fa3_window=False, attention_chunk=0, interpret=False)"
)]
#[allow(clippy::too_many_arguments)]
fn _bwd<'py>(
    dout: &Bound<'py, PyAny>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    softmax_lse: &Bound<'py, PyAny>,
    dq: &Bound<'py, PyAny>,
    dk: &Bound<'py, PyAny>,
    dv: &Bound<'py, PyAny>,
    softmax_scale: Option<f64>,
    causal: bool,
    window_size: (i64, i64),
    softcap: f64,
    deterministic: bool,
    fa3_window: bool,
    attention_chunk: i64,
    interpret: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let t = BwdTensors::read([q, k, v, dout, out, softmax_lse, dq, dk, dv])?;
    let opts = options(
        softmax_scale,
        causal,
        window_size,
        softcap,
        false,
        (fa3_window, attention_chunk),
    );
    let bp = backward::plan_backward(t.qkv(), t.grads(), &opts, deterministic, place(interpret))
        .map_err(arg_err)?;
    run_backward(q, bp, [dq, dk, dv])
}

/// [`_bwd`] over a packed varlen batch: dout, out (total_q, nheads, headdim_v), dq (total_q,
/// nheads, headdim), dk (total_k, nheads_k, headdim), dv (total_k, nheads_k, headdim_v),
/// softmax_lse (nheads, total_q), the offsets, longest lengths and used lengths (seqused_q,
/// seqused_k: both or neither) as the varlen forward took them. Rows that no sequence owns
/// are not written; with used lengths, a sequence's rows past seqused_q[b] get dq = 0 and its
/// keys past seqused_k[b] dk = dv = 0 (FlashAttention 3's). Returns softmax_d (nheads,
/// total_q + 128 * batch) torch.float32 (FlashAttention 2's padding, zero past total_q).
#[pyfunction]
#[pyo3(signature = (
    dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, softmax_scale=None, causal=false, window_size=(-1, -1), softcap=0.0,
    deterministic=false, *, fa3_window=false, attention_chunk=0, interpret=false,
    seqused_q=None, seqused_k=None
))]
#[pyo3(
    text_signature = "(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, \
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False, \
    window_size=(-1, -1), softcap=0.0, deterministic=False, *, fa3_window=False, \
    attention_chunk=0, interpret=False, seqused_q=None, seqused_k=None)"
)]
#[allow(clippy::too_many_arguments)]
fn _varlen_bwd<'py>(
    dout: &Bound<'py, PyAny>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    softmax_lse: &Bound<'py, PyAny>,
    dq: &Bound<'py, PyAny>,
    dk: &Bound<'py, PyAny>,
    dv: &Bound<'py, PyAny>,
    cu_seqlens_q: &Bound<'py, PyAny>,
    cu_seqlens_k: &Bound<'py, PyAny>,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    softmax_scale: Option<f64>,
    causal: bool,
    window_size: (i64, i64),
    softcap: f64,
    deterministic: bool,
    fa3_window: bool,
    attention_chunk: i64,
    interpret: bool,
    seqused_q: Option<Bound<'py, PyAny>>,
    seqused_k: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let t = BwdTensors::read([q, k, v, dout, out, softmax_lse, dq, dk, dv])?;
    let cu_qi = tensor_info("cu_seqlens_q", cu_seqlens_q)?;
    let cu_ki = tensor_info("cu_seqlens_k", cu_seqlens_k)?;
    let used = used_lengths(seqused_q.as_ref(), seqused_k.as_ref())?;
    let opts = options(
        softmax_scale,
        causal,
        window_size,
        softcap,
        false,
        (fa3_window, attention_chunk),
    );
    let bp = backward::plan_varlen_backward(
        t.qkv(),
        t.grads(),
        (&cu_qi, &cu_ki),
        used.as_ref().map(|(q, k)| (q, k)),
        (max_seqlen_q, max_seqlen_k),
        &opts,
        deterministic,
        place(interpret),
    )
    .map_err(arg_err)?;
    run_backward(q, bp, [dq, dk, dv])
}

/// The nine tensors a backward call reads, dense or varlen, as PyTorch describes them.
struct BwdTensors {
    q: TensorInfo,
    k: TensorInfo,
    v: TensorInfo,
    dout: TensorInfo,
    out: TensorInfo,
    lse: TensorInfo,
    dq: TensorInfo,
    dk: TensorInfo,
    dv: TensorInfo,
}

impl BwdTensors {
    /// Reads `q, k, v, dout, out, softmax_lse, dq, dk, dv` in that order; the first that is
    /// not a tensor is the error, named.
    fn read(t: [&Bound<'_, PyAny>; 9]) -> PyResult<BwdTensors> {
        let [q, k, v, dout, out, lse, dq, dk, dv] = t;
        Ok(BwdTensors {
            q: tensor_info("q", q)?,
            k: tensor_info("k", k)?,
            v: tensor_info("v", v)?,
            dout: tensor_info("dout", dout)?,
            out: tensor_info("out", out)?,
            lse: tensor_info("softmax_lse", lse)?,
            dq: tensor_info("dq", dq)?,
            dk: tensor_info("dk", dk)?,
            dv: tensor_info("dv", dv)?,
        })
    }

    fn qkv(&self) -> (&TensorInfo, &TensorInfo, &TensorInfo) {
        (&self.q, &self.k, &self.v)
    }

    fn grads(&self) -> backward::Grads<'_> {
        backward::Grads {
            dout: &self.dout,
            out: &self.out,
            lse: &self.lse,
            dq: &self.dq,
            dk: &self.dk,
            dv: &self.dv,
        }
    }
}

/// Runs a checked backward: its workspaces allocated on q's device, then its steps on the GPU
/// (the current stream) or the interpreter. Returns softmax_d (the `delta` workspace).
fn run_backward<'py>(
    q: &Bound<'py, PyAny>,
    mut bp: backward::BwdPlan,
    grads: [&Bound<'py, PyAny>; 3],
) -> PyResult<Bound<'py, PyAny>> {
    let py = q.py();
    // FlashAttention 2's padded softmax_d: zeroed, the kernels write each row's first entries.
    let delta = new_f32(q, &bp.delta_shape())?;
    delta.call_method0(pyo3::intern!(py, "zero_"))?;
    if bp.work() == backward::Work::Zero {
        // No score reaches a gradient: each is 0 (torch's zero_, on the current stream).
        for t in grads.into_iter().chain([&delta]) {
            t.call_method0(pyo3::intern!(py, "zero_"))?;
        }
        return Ok(delta);
    }
    if bp.place == Place::Cuda {
        // The device first: without a driver this is the error, raised before anything is
        // written.
        let dev = launch::device(bp.fwd.device).map_err(|e| runtime_err(e.into()))?;
        bp.target = Some(dev.target());
    }
    let accum = new_f32(q, &bp.accum_shape())?;
    let steps = bp
        .steps(
            &tensor_info("delta", &delta)?,
            &tensor_info("dq_accum", &accum)?,
        )
        .map_err(arg_err)?;
    let stream = match bp.place {
        Place::Cuda => current_stream(py, bp.fwd.device)?,
        Place::Host => 0,
    };
    // SAFETY: every tensor of the steps is a checked tensor the caller holds (on bp.fwd.device
    // or the host, as bp.place says) or a workspace allocated above on q's device; PyTorch's
    // caching allocator keeps their memory for work queued on its current stream, `stream`.
    // On the host the interpreter runs with the GIL held.
    unsafe { backward::run(&steps, bp.place, stream) }.map_err(generic_err)?;
    // The workspace stays allocated until the kernels that use it have run: PyTorch's caching
    // allocator only reuses its block for work queued after them on the same stream.
    drop(accum);
    Ok(delta)
}

/// The driver handle of the CUDA context kiln launches in on device `device` (for tests that
/// check it is PyTorch's: the device's primary context).
#[pyfunction]
fn _context_handle(device: usize) -> PyResult<u64> {
    let dev = launch::device(device).map_err(|e| runtime_err(e.into()))?;
    Ok(dev.cuda_context().cu_ctx() as usize as u64)
}

/// Launches a kernel that does nothing on device `device`'s current stream: the floor under
/// any launch from Python, which `python/bench.py` measures `flash_attn_func` against.
#[pyfunction]
fn _empty_launch(py: Python<'_>, device: usize) -> PyResult<()> {
    launch::device(device).map_err(|e| runtime_err(e.into()))?;
    let stream = current_stream(py, device)?;
    // SAFETY: `stream` is PyTorch's current stream on `device`, a live stream of its primary
    // context.
    unsafe { launch::empty_launch(device, stream) }.map_err(runtime_err)
}

/// The target kiln compiles for on device `device` (`sm_90a` on Hopper).
#[pyfunction]
fn _target(py: Python<'_>, device: usize) -> PyResult<Bound<'_, PyString>> {
    let dev = launch::device(device).map_err(|e| runtime_err(e.into()))?;
    Ok(PyString::new(py, &dev.target().to_string()))
}

/// Every kernel registered in the package (`#[kernel]`s of kiln's library: softmax, layer
/// norm, RMS norm, their backward passes, cross-entropy, rotary, dropout, gemm, attention, ..),
/// by name (by path where two share a name): what `kernel()` takes.
#[pyfunction]
fn kernels() -> Vec<String> {
    generic::kernel_names()
}

/// `(BM, BN, NW)` of the row kernels (softmax, layer norm, RMS norm) for rows of `n`
/// elements: Rust's one choice (`kiln_examples::rows::row_config`), which `kiln_attn.ops`
/// takes.
#[pyfunction]
fn _row_config(n: usize) -> (usize, usize, usize) {
    let c = kiln_attn_core::rows::row_config(n);
    (c.bm, c.bn, c.nw)
}

/// `(BM, BN, RB, NW, OCC)` of the layer norm and RMS norm backwards for `m` rows of `n`
/// elements: Rust's one choice (`kiln_examples::rows::norm_backward_config`).
#[pyfunction]
fn _norm_backward_config(m: usize, n: usize) -> (usize, usize, usize, usize, usize) {
    let c = kiln_attn_core::rows::norm_backward_config(m, n);
    (c.bm, c.bn, c.rb, c.nw, c.occ)
}

/// The registered kernel `name` (or its path, `kiln_examples::softmax::softmax`), to inspect
/// and launch; `ValueError` listing the kernels for an unknown name.
#[pyfunction]
fn kernel(name: &str) -> PyResult<Kernel> {
    Ok(Kernel {
        reg: generic::find(name).map_err(arg_err)?,
    })
}

/// A registered `#[kernel]`: its declaration and its launch on PyTorch's current stream.
///
/// `launch(grid, *args, **comptime)` passes `args` in the kernel's parameter order (tensors
/// and Python numbers for its scalars), comptime values by name (int, bool, float, a
/// torch.dtype, or `-D` text such as "bf16"); a `DType` parameter that names a tensor's
/// element type and is not given takes that tensor's dtype, every other one not given its
/// declared default. Each specialisation (comptime values and each tensor's 16-byte
/// alignment) is compiled on its first launch and kept for the process. Outputs are written
/// in place; nothing is returned.
#[pyclass(frozen, module = "kiln_attn")]
struct Kernel {
    reg: &'static kiln_attn_core::kiln::ir::dsl::Registered,
}

/// A comptime value as Python shows it: `int`, `bool`, `float`, or a dtype's kiln name.
fn comptime_py<'py>(py: Python<'py>, v: &ComptimeValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match *v {
        ComptimeValue::Usize(n) => n.into_pyobject(py)?.into_any(),
        ComptimeValue::I32(n) => n.into_pyobject(py)?.into_any(),
        ComptimeValue::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any(),
        ComptimeValue::F32(x) => f64::from(x).into_pyobject(py)?.into_any(),
        ComptimeValue::DType(d) => PyString::new(py, d.name()).into_any(),
    })
}

/// The value a keyword argument gives a comptime parameter.
fn given(obj: &Bound<'_, PyAny>) -> PyResult<Given> {
    if let Ok(b) = obj.cast::<pyo3::types::PyBool>() {
        return Ok(Given::Bool(b.is_true()));
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return obj.extract().map(Given::Int).map_err(|_| {
            PyValueError::new_err(format!("comptime value {obj} does not fit in 64 bits"))
        });
    }
    if let Ok(x) = obj.cast::<pyo3::types::PyFloat>() {
        return Ok(Given::Float(x.value()));
    }
    if let Ok(t) = obj.cast::<PyString>() {
        return Ok(Given::Text(t.to_str()?.to_string()));
    }
    // A torch.dtype prints as `torch.bfloat16` (torch itself is not imported to check).
    let text = obj.str()?.to_str()?.to_string();
    if text.starts_with("torch.") {
        return Ok(Given::DType(TorchDType::from_name(&text)));
    }
    Ok(Given::Other(obj.get_type().name()?.to_string()))
}

/// The comptime keyword arguments, in the order given.
fn given_all(kwargs: Option<&Bound<'_, pyo3::types::PyDict>>) -> PyResult<Vec<(String, Given)>> {
    let mut all = Vec::new();
    if let Some(kw) = kwargs {
        for (k, v) in kw.iter() {
            all.push((k.extract::<String>()?, given(&v)?));
        }
    }
    Ok(all)
}

/// The launch arguments, tensors read as `flash_attn_func` reads them.
fn launch_args(reg: &Registered, args: &Bound<'_, PyTuple>) -> PyResult<Vec<Arg>> {
    let names: Vec<&str> = reg.def().signature().iter().map(|p| p.name()).collect();
    let mut out = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        out.push(if a.is_instance_of::<pyo3::types::PyBool>() {
            Arg::Other("bool".into())
        } else if a.is_instance_of::<pyo3::types::PyInt>() {
            a.extract()
                .map(Arg::Int)
                .unwrap_or_else(|_| Arg::Other("int (out of range)".into()))
        } else if let Ok(x) = a.cast::<pyo3::types::PyFloat>() {
            Arg::Float(x.value())
        } else if a.hasattr(pyo3::intern!(a.py(), "data_ptr"))? {
            let name = names
                .get(i)
                .map_or_else(|| format!("argument {i}"), |n| n.to_string());
            Arg::Tensor(tensor_info(&name, &a)?)
        } else {
            Arg::Other(a.get_type().name()?.to_string())
        });
    }
    Ok(out)
}

/// A [`generic::GenericError`] as the exception it is.
fn generic_err(e: generic::GenericError) -> PyErr {
    match e {
        generic::GenericError::Arg(a) => arg_err(a),
        generic::GenericError::Launch(l) => runtime_err(l),
    }
}

#[pymethods]
impl Kernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> &'static str {
        self.reg.name()
    }

    /// `crate::module::name`.
    #[getter]
    fn path(&self) -> String {
        self.reg.path()
    }

    /// The declaration: `softmax(x: Tensor<dtype, 2>, y: TensorMut<dtype, 2>; BM: usize = 4,
    /// ..)`.
    #[getter]
    fn signature(&self) -> String {
        generic::KernelInfo::of(self.reg).signature_text()
    }

    /// The launch parameters in order: dicts with `name`, `kind` ("tensor" or "scalar"),
    /// `dtype` (kiln's name, or the comptime parameter naming it), and for a tensor `rank`
    /// and `mutable` (written by the kernel).
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        let info = generic::KernelInfo::of(self.reg);
        info.params
            .iter()
            .map(|p| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("name", p.name())?;
                match p {
                    ParamSig::Tensor {
                        dtype,
                        dtype_param,
                        rank,
                        mutable,
                        ..
                    } => {
                        d.set_item("kind", "tensor")?;
                        d.set_item("dtype", dtype_param.unwrap_or(dtype.name()))?;
                        d.set_item("rank", rank)?;
                        d.set_item("mutable", mutable)?;
                    }
                    ParamSig::Scalar { dtype, .. } => {
                        d.set_item("kind", "scalar")?;
                        d.set_item("dtype", dtype.name())?;
                    }
                }
                Ok(d)
            })
            .collect()
    }

    /// The comptime parameters in order: dicts with `name`, `kind` ("usize", "i32", "bool",
    /// "f32", "DType") and `default` (None where none is declared).
    #[getter]
    fn comptime<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        self.reg
            .def()
            .comptime_params()
            .iter()
            .map(|c| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("name", c.name)?;
                d.set_item("kind", c.kind.name())?;
                match &c.default {
                    Some(v) => d.set_item("default", comptime_py(py, v)?)?,
                    None => d.set_item("default", py.None())?,
                }
                Ok(d)
            })
            .collect()
    }

    /// The comptime values a launch with these arguments would take, as a dict by name
    /// (checked as `launch` checks them; nothing is compiled).
    #[pyo3(signature = (*args, **comptime))]
    fn comptime_values<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        comptime: Option<&Bound<'py, pyo3::types::PyDict>>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let args = launch_args(self.reg, args)?;
        let values = generic::comptime_values(self.reg.def(), &args, &given_all(comptime)?)
            .map_err(arg_err)?;
        let d = pyo3::types::PyDict::new(py);
        for (p, v) in self.reg.def().comptime_params().iter().zip(&values) {
            d.set_item(p.name, comptime_py(py, v)?)?;
        }
        Ok(d)
    }

    /// The kernel's own grid (`#[kernel(grid = [..])]`: `cdiv(extent, tile)` per axis) over
    /// one to three `extents`, with comptime values as `launch` takes them.
    #[pyo3(signature = (extents, **comptime))]
    fn grid(
        &self,
        extents: &Bound<'_, PyAny>,
        comptime: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<(u32, u32, u32)> {
        let extents: Vec<usize> = if let Ok(n) = extents.extract::<usize>() {
            vec![n]
        } else {
            extents.extract().map_err(|_| {
                PyTypeError::new_err("extents: expected a non-negative int or a tuple of them")
            })?
        };
        let values = generic::comptime_values(self.reg.def(), &[], &given_all(comptime)?)
            .map_err(arg_err)?;
        let [x, y, z] = generic::kernel_grid(self.reg, &values, &extents).map_err(arg_err)?;
        Ok((x, y, z))
    }

    /// Launches the kernel over `grid` (an int or a tuple of one to three block counts) with
    /// `args` in its parameter order and comptime values by name, on PyTorch's current CUDA
    /// stream of the tensors' device. Asynchronous; returns None.
    #[pyo3(signature = (grid, *args, **comptime))]
    fn launch(
        &self,
        grid: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
        comptime: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        let py = args.py();
        let blocks: Vec<i64> = if let Ok(n) = grid.extract::<i64>() {
            vec![n]
        } else {
            grid.extract().map_err(|_| {
                PyTypeError::new_err("grid: expected an int or a tuple of one to three ints")
            })?
        };
        let grid = generic::grid(&blocks).map_err(arg_err)?;
        let args = launch_args(self.reg, args)?;
        let planned = generic::plan(self.reg, &args, &given_all(comptime)?).map_err(arg_err)?;
        // The device first: without a driver this is the error (not a failed torch import).
        launch::device(planned.device).map_err(|e| runtime_err(e.into()))?;
        let stream = current_stream(py, planned.device)?;
        // SAFETY: the tensors are live PyTorch CUDA tensors (checked to be on one device,
        // whose primary context PyTorch allocates in) that the caller holds until this
        // returns; PyTorch's caching allocator keeps their memory for work queued on its
        // current stream, which is `stream`. Overlapping outputs are the caller's affair, as
        // with any kernel.
        unsafe { generic::launch(&planned, grid, stream) }.map_err(generic_err)
    }

    /// `launch` on kiln's CPU interpreter instead of the GPU, over PyTorch CPU tensors: the
    /// same checks, kernel and comptime values, the kernel's outputs written into the
    /// tensors in place. Slow (an interpreter): for tests on small shapes without a GPU.
    #[pyo3(signature = (grid, *args, **comptime))]
    fn interpret(
        &self,
        grid: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
        comptime: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        let blocks: Vec<i64> = if let Ok(n) = grid.extract::<i64>() {
            vec![n]
        } else {
            grid.extract().map_err(|_| {
                PyTypeError::new_err("grid: expected an int or a tuple of one to three ints")
            })?
        };
        let grid = generic::grid(&blocks).map_err(arg_err)?;
        let args = launch_args(self.reg, args)?;
        let planned = generic::plan_at(self.reg, &args, &given_all(comptime)?, Place::Host)
            .map_err(arg_err)?;
        // SAFETY: the tensors are live PyTorch CPU tensors (checked to be on the CPU) that
        // the caller holds until this returns; nothing else runs on them meanwhile (the GIL is
        // held throughout).
        unsafe { generic::interpret_host(&planned, grid) }.map_err(generic_err)
    }

    fn __repr__(&self) -> String {
        format!("<kiln kernel {}>", self.signature())
    }
}

/// How many splits of the keys the split-KV decode runs with when kiln chooses
/// (`num_splits=0`): `kiln_examples::attention_decode::num_splits` for `batch` sequences of
/// `heads_k` key/value heads, `row_blocks` packed query blocks each, `keys` keys (the longest
/// sequence) in blocks of `block_n`, on `sms` multiprocessors.
#[pyfunction]
fn _num_splits(
    batch: usize,
    heads_k: usize,
    row_blocks: usize,
    keys: usize,
    block_n: usize,
    sms: usize,
) -> usize {
    kiln_attn_core::decode::num_splits((batch, heads_k, row_blocks), (keys, block_n), sms)
}

/// How many blocks share a head's value columns in the decode kernels for key head dim `d`
/// and value head dim `dv` (their grid's y is `heads_k` times this):
/// `kiln_examples::attention_decode::value_split`.
#[pyfunction]
fn _value_split(d: usize, dv: usize) -> usize {
    kiln_attn_core::decode::value_split(d, dv)
}

/// The extension under the `kiln_attn` package: attention's forward and backward (`_fwd`,
/// `_varlen_fwd`, `_bwd`, `_varlen_bwd`), and every registered kernel (`kernels`, `kernel`).
#[pymodule(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(_varlen_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(_varlen_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(_context_handle, m)?)?;
    m.add_function(wrap_pyfunction!(_target, m)?)?;
    m.add_function(wrap_pyfunction!(_empty_launch, m)?)?;
    m.add_function(wrap_pyfunction!(kernels, m)?)?;
    m.add_function(wrap_pyfunction!(_row_config, m)?)?;
    m.add_function(wrap_pyfunction!(_norm_backward_config, m)?)?;
    m.add_function(wrap_pyfunction!(_num_splits, m)?)?;
    m.add_function(wrap_pyfunction!(_value_split, m)?)?;
    m.add_function(wrap_pyfunction!(kernel, m)?)?;
    m.add_class::<Kernel>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
