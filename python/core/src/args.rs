//! FlashAttention's arguments as kiln sees them, and every check on them: a [`TensorInfo`]
//! per tensor (what PyTorch reports: shape, strides, dtype, device, address) and [`Options`]
//! go in, a [`Plan`] (the kernel's `[batch, heads, seq, d]` views of the BSHD tensors, the
//! scale, the mask) or an [`ArgError`] naming the argument comes out.
//!
//! Pure host code with no Python and no GPU, so each rule is unit-tested here and the
//! extension only translates Python objects and errors.

use std::fmt;

use kiln::ir::DType;

/// Where a call's tensors must live: on a CUDA device for a launch, in host memory (PyTorch
/// CPU tensors) for the interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// CUDA tensors, all on one device.
    Cuda,
    /// CPU tensors.
    Host,
}

/// The tile widths the attention kernels run a head dim in: the narrowest that holds it
/// ([`tile_width`]; the columns past the tensor's read 0 and are never written).
pub const TILE_WIDTHS: [usize; 5] = [64, 96, 128, 192, 256];

/// The most head dim (of q and k, or of v) a call may have.
pub const MAX_HEAD_DIM: usize = 256;

/// The tile width head dim `d` runs in: the narrowest of [`TILE_WIDTHS`] at least `d` wide
/// (`None` past [`MAX_HEAD_DIM`]).
pub fn tile_width(d: usize) -> Option<usize> {
    TILE_WIDTHS.iter().copied().find(|&w| w >= d)
}

/// The element types PyTorch tensors can have, as far as kiln cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorchDType {
    /// `torch.bfloat16`.
    Bf16,
    /// `torch.float16`.
    F16,
    /// Anything else, by its PyTorch name (`torch.float32`).
    Other(String),
}

impl TorchDType {
    /// The dtype PyTorch prints as `name` (`str(torch.bfloat16)` is `"torch.bfloat16"`).
    pub fn from_name(name: &str) -> TorchDType {
        match name {
            "torch.bfloat16" => TorchDType::Bf16,
            "torch.float16" => TorchDType::F16,
            other => TorchDType::Other(other.to_string()),
        }
    }
}

impl fmt::Display for TorchDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TorchDType::Bf16 => f.write_str("torch.bfloat16"),
            TorchDType::F16 => f.write_str("torch.float16"),
            TorchDType::Other(name) => f.write_str(name),
        }
    }
}

/// Where a tensor lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorchDevice {
    /// `cuda:<ordinal>`.
    Cuda(usize),
    /// Anywhere else, by PyTorch's name for it (`cpu`, `meta`).
    Other(String),
}

impl fmt::Display for TorchDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TorchDevice::Cuda(i) => write!(f, "cuda:{i}"),
            TorchDevice::Other(name) => f.write_str(name),
        }
    }
}

/// One tensor argument as PyTorch describes it; strides are in elements and may be
/// anything PyTorch allows (so they are checked, never trusted, here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// `tensor.shape`.
    pub shape: Vec<i64>,
    /// `tensor.stride()`.
    pub strides: Vec<i64>,
    /// `tensor.dtype`.
    pub dtype: TorchDType,
    /// `tensor.device`.
    pub device: TorchDevice,
    /// `tensor.data_ptr()`: the address of element `[0, 0, 0, 0]`.
    pub ptr: u64,
}

impl TensorInfo {
    /// A contiguous (row-major) tensor of `shape` at `ptr`, as `torch.empty` makes one.
    pub fn contiguous(shape: &[usize], dtype: TorchDType, device: TorchDevice, ptr: u64) -> Self {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1].max(1) as i64;
        }
        TensorInfo {
            shape: shape.iter().map(|&n| n as i64).collect(),
            strides,
            dtype,
            device,
            ptr,
        }
    }
}

/// The keyword arguments of `flash_attn_func`, with FlashAttention's meanings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Scores are `q.k * softmax_scale`; `None`: `1 / sqrt(headdim)`.
    pub softmax_scale: Option<f64>,
    /// Causal mask, aligned to the bottom-right corner of the score matrix.
    pub causal: bool,
    /// Sliding window `(left, right)`; `-1` is unbounded.
    pub window_size: (i64, i64),
    /// Logit soft-capping (`softcap * tanh(s / softcap)`); 0 is off.
    pub softcap: f64,
    /// Also return the log-sum-exp of each score row.
    pub return_lse: bool,
    /// Which FlashAttention's window bounds the call follows.
    pub window_rule: WindowRule,
    /// Keys per chunk (FlashAttention 3's `attention_chunk`): a query sees only the keys of
    /// its diagonal's chunk; 0 is off.
    pub attention_chunk: i64,
}

/// How a window bound too large to mask anything is read: FlashAttention 2 and 3 differ when
/// `right` lies between `seqlen_k` and `seqlen_q - 1` (a bound that still masks the first
/// rows when `seqlen_q > seqlen_k`, bottom-right aligned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowRule {
    /// FlashAttention 2: a bound of at least `seqlen_k` is unbounded, whatever it would
    /// have masked.
    #[default]
    Fa2,
    /// FlashAttention 3: `left >= seqlen_k - 1` and `right >= seqlen_q - 1` are unbounded,
    /// which masks nothing either way; every smaller bound masks as given.
    Fa3,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            softmax_scale: None,
            causal: false,
            window_size: (-1, -1),
            softcap: 0.0,
            return_lse: false,
            window_rule: WindowRule::Fa2,
            attention_chunk: 0,
        }
    }
}

/// Which Python exception an argument error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `TypeError`: not a tensor, or the wrong dtype.
    Type,
    /// `ValueError`: a bad shape, device, stride or option, or a feature not supported yet.
    Value,
}

/// A rejected argument: the exception to raise and a message that names the argument and
/// says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ArgError {
    /// `TypeError` or `ValueError`.
    pub kind: ErrorKind,
    /// The message.
    pub message: String,
}

impl ArgError {
    /// A `TypeError` saying `message`.
    pub fn type_error(message: impl Into<String>) -> ArgError {
        ArgError {
            kind: ErrorKind::Type,
            message: message.into(),
        }
    }

    /// A `ValueError` saying `message`.
    pub fn value_error(message: impl Into<String>) -> ArgError {
        ArgError {
            kind: ErrorKind::Value,
            message: message.into(),
        }
    }
}

/// A `[batch, heads, seq, d]` view of a BSHD tensor: the same memory, the middle two
/// dimensions' extents and strides swapped (no copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The address of element `[0, 0, 0, 0]`.
    pub ptr: u64,
    /// `[batch, heads, seq, d]`.
    pub shape: [usize; 4],
    /// Strides of those, in elements.
    pub strides: [usize; 4],
}

impl View {
    /// The BHSD view of a checked 4-D BSHD tensor (non-negative strides).
    fn bhsd(t: &TensorInfo) -> View {
        let at = |v: &[i64], i: usize| v[i] as usize;
        View {
            ptr: t.ptr,
            shape: [
                at(&t.shape, 0),
                at(&t.shape, 2),
                at(&t.shape, 1),
                at(&t.shape, 3),
            ],
            strides: [
                at(&t.strides, 0),
                at(&t.strides, 2),
                at(&t.strides, 1),
                at(&t.strides, 3),
            ],
        }
    }
}

/// A checked call: everything the launch needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The CUDA device every tensor is on.
    pub device: usize,
    /// `batch`.
    pub batch: usize,
    /// `seqlen_q`.
    pub seqlen_q: usize,
    /// `seqlen_k`.
    pub seqlen_k: usize,
    /// `nheads`.
    pub nheads: usize,
    /// `nheads_k`.
    pub nheads_k: usize,
    /// Query heads per key/value head, `nheads / nheads_k` (grouped-query attention when
    /// above 1, multi-query when `nheads_k` is 1): query head `h` reads k and v head
    /// `h / kv_group`.
    pub kv_group: usize,
    /// `headdim` (of q and k).
    pub head_dim: usize,
    /// `headdim_v`, v's and the output's head dim (FlashAttention 3's; `head_dim` unless v's
    /// last extent differs).
    pub head_dim_v: usize,
    /// The score scale.
    pub scale: f32,
    /// Causal mask, aligned to the bottom-right corner of the score matrix (the window
    /// `(-1, 0)`, however it was spelled).
    pub causal: bool,
    /// The element type of q, k, v and the output: bf16 or f16.
    pub dtype: DType,
    /// The sliding window `(left, right)` besides causal, `-1` unbounded, as FlashAttention
    /// normalises it: a bound of at least `seqlen_k` is unbounded, causal makes `right` 0,
    /// and the causal window itself is `causal` with `(-1, -1)` here.
    pub window: (i32, i32),
    /// Keys per chunk (`attention_chunk`); 0 is off.
    pub chunk: i32,
    /// Logit soft-cap (scores `softcap * tanh(s / softcap)`); 0 is off.
    pub softcap: f32,
    /// Whether the call also returns the log-sum-exp, `[batch, nheads, seqlen_q]` f32.
    pub return_lse: bool,
    /// `q` as `[batch, nheads, seqlen_q, d]`.
    pub q: View,
    /// `k` as `[batch, nheads_k, seqlen_k, d]`.
    pub k: View,
    /// `v` as `[batch, nheads_k, seqlen_k, headdim_v]`.
    pub v: View,
}

impl Plan {
    /// The output's shape, `[batch, seqlen_q, nheads, headdim_v]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.nheads, self.head_dim_v]
    }

    /// The kernels' tile widths for `(headdim, headdim_v)` ([`tile_width`]; both checked to
    /// have one).
    pub fn tile_dims(&self) -> (usize, usize) {
        let tile = |d| tile_width(d).unwrap_or(MAX_HEAD_DIM);
        (tile(self.head_dim), tile(self.head_dim_v))
    }

    /// The log-sum-exp's shape, `[batch, nheads, seqlen_q]`.
    pub fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.nheads, self.seqlen_q]
    }

    /// Whether there is nothing to compute (an empty output), so nothing is launched.
    pub fn is_empty(&self) -> bool {
        self.out_shape().contains(&0)
    }
}

/// The grid's y (heads) and z (batch) extents are at most this (the driver's limit).
pub(crate) const GRID_YZ_MAX: i64 = 65535;

/// Checks `q`, `k`, `v` and `opts` as `flash_attn_func` takes them (q: `[batch, seqlen_q,
/// nheads, headdim]`, k and v: `[batch, seqlen_k, nheads_k, headdim]`) and plans the launch.
pub fn plan(
    q: &TensorInfo,
    k: &TensorInfo,
    v: &TensorInfo,
    opts: &Options,
) -> Result<Plan, ArgError> {
    plan_windowed(q, k, v, opts, None)
}

/// [`plan`], with window bounds of at least `window_len` (else `seqlen_k`) unbounded:
/// `flash_attn_varlen_func` normalises them by `max_seqlen_k`, as FlashAttention does.
pub(crate) fn plan_windowed(
    q: &TensorInfo,
    k: &TensorInfo,
    v: &TensorInfo,
    opts: &Options,
    window_len: Option<i64>,
) -> Result<Plan, ArgError> {
    plan_windowed_at(q, k, v, opts, window_len, Place::Cuda)
}

/// [`plan`] for tensors at `place`: CUDA tensors for a launch, CPU tensors for a run on the
/// interpreter (the plan's `device` is then 0).
pub fn plan_at(
    q: &TensorInfo,
    k: &TensorInfo,
    v: &TensorInfo,
    opts: &Options,
    place: Place,
) -> Result<Plan, ArgError> {
    plan_windowed_at(q, k, v, opts, None, place)
}

/// [`plan_windowed`] for tensors at `place`.
pub(crate) fn plan_windowed_at(
    q: &TensorInfo,
    k: &TensorInfo,
    v: &TensorInfo,
    opts: &Options,
    window_len: Option<i64>,
    place: Place,
) -> Result<Plan, ArgError> {
    let named = [("q", q), ("k", k), ("v", v)];
    for (name, t) in named {
        check_rank(name, t, if name == "q" { "seqlen_q" } else { "seqlen_k" })?;
    }
    check_dtype("q", q, None)?;
    check_dtype("k", k, Some(&q.dtype))?;
    check_dtype("v", v, Some(&q.dtype))?;
    let device = match (place, &q.device) {
        (Place::Cuda, TorchDevice::Cuda(i)) => *i,
        (Place::Host, TorchDevice::Other(cpu)) if cpu == "cpu" => 0,
        (Place::Host, other) => {
            return Err(ArgError::value_error(format!(
                "q: expected a CPU tensor (the interpreter runs on the host), got a tensor on \
                 {other}"
            )));
        }
        (Place::Cuda, other) => {
            return Err(ArgError::value_error(format!(
                "q: expected a CUDA tensor, got a tensor on {other}"
            )));
        }
    };
    for (name, t) in &named[1..] {
        if t.device != q.device {
            return Err(ArgError::value_error(format!(
                "{name}: expected a tensor on {} (q's device), got a tensor on {}",
                q.device, t.device
            )));
        }
    }
    let [batch, seqlen_q, nheads, head_dim] = dims(q);
    let [kb, seqlen_k, nheads_k, kd] = dims(k);
    let head_dim_v = v.shape[3];
    if k.shape[..3] != v.shape[..3] {
        return Err(ArgError::value_error(format!(
            "v: expected shape [{kb}, {seqlen_k}, {nheads_k}, headdim_v] (k's but for the head \
             dim), got {:?}",
            v.shape
        )));
    }
    if kb != batch {
        return Err(ArgError::value_error(format!(
            "k: expected batch {batch} (q's), got {kb}"
        )));
    }
    if kd != head_dim {
        return Err(ArgError::value_error(format!(
            "k: expected headdim {head_dim} (q's), got {kd}"
        )));
    }
    if nheads_k == 0 || nheads % nheads_k != 0 {
        return Err(ArgError::value_error(format!(
            "k: the number of heads in q ({nheads}) must be a multiple of the number of heads in \
             k and v ({nheads_k})"
        )));
    }
    for (name, what, d) in [("q", "headdim", head_dim), ("v", "headdim_v", head_dim_v)] {
        if d == 0 || d as usize > MAX_HEAD_DIM || d % 8 != 0 {
            return Err(ArgError::value_error(format!(
                "{name}: {what} {d} is not supported (kiln_attn takes multiples of 8 up to \
                 {MAX_HEAD_DIM}, as FlashAttention 3)"
            )));
        }
    }
    for (name, t) in named {
        check_strides(name, t)?;
    }
    for (what, n) in [("batch", batch), ("nheads", nheads)] {
        if n > GRID_YZ_MAX {
            return Err(ArgError::value_error(format!(
                "q: {what} {n} is above the most kiln launches ({GRID_YZ_MAX})"
            )));
        }
    }
    for (name, what, n) in [("q", "seqlen_q", seqlen_q), ("k", "seqlen_k", seqlen_k)] {
        if n > i64::from(i32::MAX) {
            return Err(ArgError::value_error(format!(
                "{name}: {what} {n} is above the most kiln addresses ({})",
                i32::MAX
            )));
        }
    }
    let checked = check_options(opts, head_dim, seqlen_q, window_len.unwrap_or(seqlen_k))?;
    Ok(Plan {
        device,
        batch: batch as usize,
        seqlen_q: seqlen_q as usize,
        seqlen_k: seqlen_k as usize,
        nheads: nheads as usize,
        nheads_k: nheads_k as usize,
        kv_group: (nheads / nheads_k) as usize,
        head_dim: head_dim as usize,
        head_dim_v: head_dim_v as usize,
        scale: checked.scale,
        causal: checked.causal,
        dtype: match q.dtype {
            TorchDType::F16 => DType::F16,
            _ => DType::Bf16,
        },
        window: checked.window,
        chunk: checked.chunk,
        softcap: checked.softcap,
        return_lse: opts.return_lse,
        q: View::bhsd(q),
        k: View::bhsd(k),
        v: View::bhsd(v),
    })
}

/// Checks the output tensor `out` (allocated by the caller or by kiln) for `plan`: q's shape,
/// dtype and device, innermost stride 1. Returns its BHSD view.
pub fn check_out(plan: &Plan, q: &TensorInfo, out: &TensorInfo) -> Result<View, ArgError> {
    let want: Vec<i64> = plan.out_shape().iter().map(|&n| n as i64).collect();
    if out.shape != want {
        return Err(ArgError::value_error(format!(
            "out: expected shape {want:?} (q's), got {:?}",
            out.shape
        )));
    }
    check_dtype("out", out, Some(&q.dtype))?;
    if out.device != q.device {
        return Err(ArgError::value_error(format!(
            "out: expected a tensor on {} (q's device), got a tensor on {}",
            q.device, out.device
        )));
    }
    check_strides("out", out)?;
    Ok(View::bhsd(out))
}

/// The four extents of a tensor already checked to be 4-D.
fn dims(t: &TensorInfo) -> [i64; 4] {
    [t.shape[0], t.shape[1], t.shape[2], t.shape[3]]
}

fn check_rank(name: &str, t: &TensorInfo, seq: &str) -> Result<(), ArgError> {
    let heads = if name == "q" { "nheads" } else { "nheads_k" };
    if t.shape.len() != 4 || t.strides.len() != 4 || t.shape.iter().any(|&n| n < 0) {
        return Err(ArgError::value_error(format!(
            "{name}: expected a 4-D tensor [batch, {seq}, {heads}, headdim], got shape {:?}",
            t.shape
        )));
    }
    Ok(())
}

/// `q` must be bfloat16 or float16; the others must match it.
pub(crate) fn check_dtype(
    name: &str,
    t: &TensorInfo,
    like: Option<&TorchDType>,
) -> Result<(), ArgError> {
    match like {
        Some(want) if &t.dtype != want => Err(ArgError::type_error(format!(
            "{name}: expected dtype {want} (q's), got {}",
            t.dtype
        ))),
        Some(_) => Ok(()),
        None => match &t.dtype {
            TorchDType::Bf16 | TorchDType::F16 => Ok(()),
            TorchDType::Other(d) => Err(ArgError::type_error(format!(
                "{name}: expected dtype torch.bfloat16 or torch.float16, got {d}"
            ))),
        },
    }
}

/// The last dimension must be contiguous (as FlashAttention requires); the others may have
/// any non-negative stride (a transposed BHSD tensor is fine).
pub(crate) fn check_strides(name: &str, t: &TensorInfo) -> Result<(), ArgError> {
    if t.strides.iter().any(|&s| s < 0) {
        return Err(ArgError::value_error(format!(
            "{name}: expected non-negative strides, got {:?}",
            t.strides
        )));
    }
    if t.strides[3] != 1 && t.shape[3] > 1 {
        return Err(ArgError::value_error(format!(
            "{name}: expected a contiguous last dimension (stride 1), got strides {:?}; call \
             .contiguous() first",
            t.strides
        )));
    }
    Ok(())
}

/// The options of a call as the kernel takes them.
struct Checked {
    scale: f32,
    causal: bool,
    window: (i32, i32),
    chunk: i32,
    softcap: f32,
}

/// Checks the options and normalises them as FlashAttention does: a window bound of at least
/// `seqlen_k` is unbounded (-1), causal makes the right bound 0, and the window `(-1, 0)` is
/// the causal mask (so every spelling of it runs one specialisation).
fn check_options(
    opts: &Options,
    head_dim: i64,
    seqlen_q: i64,
    seqlen_k: i64,
) -> Result<Checked, ArgError> {
    let (left, right) = opts.window_size;
    if left < -1 || right < -1 {
        return Err(ArgError::value_error(format!(
            "window_size: expected (left, right) with each -1 (unbounded) or >= 0, got ({left}, \
             {right})"
        )));
    }
    // Below seqlen_q, seqlen_k <= i32::MAX (checked by the caller), so the bounds fit an i32.
    let bound = |b: i64, len: i64| if b >= len { -1 } else { b as i32 };
    let (left_len, right_len) = match opts.window_rule {
        WindowRule::Fa2 => (seqlen_k, seqlen_k),
        WindowRule::Fa3 => (seqlen_k - 1, seqlen_q - 1),
    };
    let left = bound(left, left_len);
    let right = if opts.causal {
        0
    } else {
        bound(right, right_len)
    };
    let causal = left == -1 && right == 0;
    let window = if causal { (-1, -1) } else { (left, right) };
    let chunk = i32::try_from(opts.attention_chunk)
        .ok()
        .filter(|&c| c >= 0)
        .ok_or_else(|| {
            ArgError::value_error(format!(
                "attention_chunk: expected 0 (off) or a chunk length up to {}, got {}",
                i32::MAX,
                opts.attention_chunk
            ))
        })?;
    let cap = opts.softcap;
    if !(cap.is_finite() && cap >= 0.0 && (cap as f32).is_finite()) {
        return Err(ArgError::value_error(format!(
            "softcap: expected a finite number >= 0 (0 is off), got {cap}"
        )));
    }
    let scale = opts.softmax_scale.unwrap_or(1.0 / (head_dim as f64).sqrt());
    if !scale.is_finite() || (scale as f32).is_infinite() {
        return Err(ArgError::value_error(format!(
            "softmax_scale: expected a finite number, got {scale}"
        )));
    }
    Ok(Checked {
        scale: scale as f32,
        causal,
        window,
        chunk,
        softcap: cap as f32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A contiguous BSHD bf16 tensor on cuda:0.
    fn bshd(b: i64, s: i64, h: i64, d: i64) -> TensorInfo {
        let shape = [b, s, h, d].map(|n| n as usize);
        TensorInfo::contiguous(
            &shape,
            TorchDType::Bf16,
            TorchDevice::Cuda(0),
            0x7f00_0000_0000,
        )
    }

    #[test]
    fn contiguous_strides_are_torchs() {
        let t = TensorInfo::contiguous(&[2, 3, 4, 5], TorchDType::F16, TorchDevice::Cuda(1), 16);
        assert_eq!(t.strides, [60, 20, 5, 1]);
        // torch.empty(2, 0, 4, 5).stride() is (20, 20, 5, 1).
        let e = TensorInfo::contiguous(&[2, 0, 4, 5], TorchDType::F16, TorchDevice::Cuda(1), 16);
        assert_eq!((e.shape, e.strides), (vec![2, 0, 4, 5], vec![20, 20, 5, 1]));
    }

    fn err(q: &TensorInfo, k: &TensorInfo, v: &TensorInfo, opts: Options) -> ArgError {
        plan(q, k, v, &opts).expect_err("invalid")
    }

    #[test]
    fn bshd_tensors_become_bhsd_views_of_the_same_memory() {
        let (q, k) = (bshd(2, 113, 4, 64), bshd(2, 203, 4, 64));
        let p = plan(&q, &k, &k, &Options::default()).expect("valid");
        assert_eq!(p.q.shape, [2, 4, 113, 64]);
        assert_eq!(p.q.strides, [113 * 4 * 64, 64, 4 * 64, 1]);
        assert_eq!(p.k.shape, [2, 4, 203, 64]);
        assert_eq!(p.q.ptr, q.ptr);
        assert_eq!(p.out_shape(), [2, 113, 4, 64]);
        assert_eq!(p.scale, 0.125);
        assert!(!p.is_empty());
    }

    #[test]
    fn a_transposed_bhsd_tensor_is_accepted_as_it_is() {
        // torch.randn(b, h, s, d).transpose(1, 2): BSHD shape over BHSD memory.
        let (b, s, h, d) = (1, 100, 2, 128);
        let mut q = bshd(b, s, h, d);
        q.strides = vec![h * s * d, d, s * d, 1];
        let p = plan(&q, &q, &q, &Options::default()).expect("valid");
        assert_eq!(
            p.q.strides,
            [(h * s * d) as usize, (s * d) as usize, d as usize, 1]
        );
    }

    #[test]
    fn shape_errors_name_the_argument_and_the_layout() {
        let q = bshd(2, 128, 4, 64);
        let mut q3 = q.clone();
        q3.shape.pop();
        q3.strides.pop();
        let e = err(&q3, &q, &q, Options::default());
        assert_eq!(e.kind, ErrorKind::Value);
        assert_eq!(
            e.message,
            "q: expected a 4-D tensor [batch, seqlen_q, nheads, headdim], got shape [2, 128, 4]"
        );
        let e = err(&q, &q, &bshd(2, 127, 4, 64), Options::default());
        assert!(
            e.message
                .starts_with("v: expected shape [2, 128, 4, headdim_v]"),
            "{e}"
        );
        let e = err(
            &q,
            &bshd(3, 128, 4, 64),
            &bshd(3, 128, 4, 64),
            Options::default(),
        );
        assert_eq!(e.message, "k: expected batch 2 (q's), got 3");
        let e = err(
            &q,
            &bshd(2, 128, 4, 128),
            &bshd(2, 128, 4, 128),
            Options::default(),
        );
        assert_eq!(e.message, "k: expected headdim 64 (q's), got 128");
    }

    #[test]
    fn head_counts_must_divide_and_give_the_kv_group() {
        let q = bshd(1, 64, 6, 64);
        let k = bshd(1, 64, 4, 64);
        let e = err(&q, &k, &k, Options::default());
        assert!(e.message.contains("(6) must be a multiple"), "{e}");
        for (nheads_k, group) in [(6, 1), (3, 2), (2, 3), (1, 6)] {
            let k = bshd(1, 64, nheads_k, 64);
            let p = plan(&q, &k, &k, &Options::default()).expect("divides");
            assert_eq!((p.nheads_k, p.kv_group), (nheads_k as usize, group));
            assert_eq!(p.k.shape, [1, nheads_k as usize, 64, 64]);
        }
        let k = bshd(1, 64, 0, 64);
        let e = err(&q, &k, &k, Options::default());
        assert!(e.message.contains("must be a multiple"), "{e}");
    }

    #[test]
    fn unsupported_head_dims_are_value_errors() {
        for d in [12, 264, 512] {
            let q = bshd(1, 64, 2, d);
            let e = err(&q, &q, &q, Options::default());
            assert_eq!(
                e.message,
                format!(
                    "q: headdim {d} is not supported (kiln_attn takes multiples of 8 up to 256, \
                     as FlashAttention 3)"
                )
            );
        }
        let (q, v) = (bshd(1, 64, 2, 64), bshd(1, 64, 2, 300));
        let e = err(&q, &q, &v, Options::default());
        assert!(
            e.message.starts_with("v: headdim_v 300 is not supported"),
            "{e}"
        );
    }

    #[test]
    fn head_dims_run_in_the_next_tile_width() {
        // Any multiple of 8 up to 256, in the narrowest tile that holds it; v's head dim
        // apart from q's and k's (MLA's 192 / 128), the output as wide as v.
        for (d, dv, tiles) in [
            (8, 8, (64, 64)),
            (72, 72, (96, 96)),
            (192, 128, (192, 128)),
            (64, 136, (64, 192)),
            (256, 40, (256, 64)),
        ] {
            let (q, v) = (bshd(2, 33, 4, d), bshd(2, 33, 4, dv));
            let p = plan(&q, &q, &v, &Options::default()).expect("plans");
            assert_eq!(p.tile_dims(), tiles);
            assert_eq!((p.head_dim, p.head_dim_v), (d as usize, dv as usize));
            assert_eq!(p.out_shape(), [2, 33, 4, dv as usize]);
            assert_eq!(p.v.shape, [2, 4, 33, dv as usize]);
        }
        // Only the head dim may differ between k and v.
        let (q, v) = (bshd(2, 33, 4, 64), bshd(2, 32, 4, 128));
        let e = err(&q, &q, &v, Options::default());
        assert_eq!(
            e.message,
            "v: expected shape [2, 33, 4, headdim_v] (k's but for the head dim), got [2, 32, 4, 128]"
        );
    }

    #[test]
    fn dtypes_are_type_errors() {
        let q = bshd(1, 64, 2, 64);
        let mut f = q.clone();
        f.dtype = TorchDType::Other("torch.float32".into());
        let e = err(&f, &f, &f, Options::default());
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(
            e.message,
            "q: expected dtype torch.bfloat16 or torch.float16, got torch.float32"
        );
        let mut h = q.clone();
        h.dtype = TorchDType::F16;
        let p = plan(&h, &h, &h, &Options::default()).expect("f16");
        assert_eq!(p.dtype, DType::F16);
        assert_eq!(
            plan(&q, &q, &q, &Options::default()).expect("bf16").dtype,
            DType::Bf16
        );
        let e = err(&h, &q, &q, Options::default());
        assert_eq!(
            e.message,
            "k: expected dtype torch.float16 (q's), got torch.bfloat16"
        );
        let e = err(&q, &q, &f, Options::default());
        assert_eq!(
            e.message,
            "v: expected dtype torch.bfloat16 (q's), got torch.float32"
        );
    }

    #[test]
    fn devices_must_be_one_cuda_device() {
        let q = bshd(1, 64, 2, 64);
        let mut cpu = q.clone();
        cpu.device = TorchDevice::Other("cpu".into());
        let e = err(&cpu, &cpu, &cpu, Options::default());
        assert_eq!(e.message, "q: expected a CUDA tensor, got a tensor on cpu");
        let mut other = q.clone();
        other.device = TorchDevice::Cuda(1);
        let e = err(&q, &other, &other, Options::default());
        assert_eq!(
            e.message,
            "k: expected a tensor on cuda:0 (q's device), got a tensor on cuda:1"
        );
    }

    #[test]
    fn the_last_dimension_must_be_contiguous() {
        let q = bshd(1, 64, 2, 64);
        let mut t = q.clone();
        t.strides = vec![64 * 2 * 64, 1, 64, 64 * 2];
        let e = err(&q, &t, &q, Options::default());
        assert!(
            e.message
                .starts_with("k: expected a contiguous last dimension"),
            "{e}"
        );
        t.strides = vec![-1, 128, 64, 1];
        let e = err(&q, &q, &t, Options::default());
        assert!(
            e.message.starts_with("v: expected non-negative strides"),
            "{e}"
        );
    }

    #[test]
    fn attention_chunk_is_a_length_or_zero() {
        let q = bshd(1, 16, 2, 64);
        let with = |attention_chunk| {
            let opts = Options {
                attention_chunk,
                ..Options::default()
            };
            plan(&q, &q, &q, &opts).map(|p| p.chunk)
        };
        assert_eq!(with(0).expect("off"), 0);
        assert_eq!(with(8192).expect("a chunk"), 8192);
        for bad in [-1, i64::from(i32::MAX) + 1] {
            let e = with(bad).expect_err("refused");
            assert_eq!(e.kind, ErrorKind::Value);
            assert!(
                e.message.starts_with("attention_chunk: expected 0 (off)"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn windows_are_normalised_as_flash_attention_does() {
        // seqlen_k = 100: a bound of 100 or more is unbounded; causal makes right 0; the
        // window (-1, 0) is causal, however it is spelled.
        let (q, k) = (bshd(1, 64, 2, 64), bshd(1, 100, 2, 64));
        let with = |causal, window_size| {
            let o = Options {
                causal,
                window_size,
                ..Options::default()
            };
            let p = plan(&q, &k, &k, &o).expect("valid window");
            (p.causal, p.window)
        };
        assert_eq!(with(false, (-1, -1)), (false, (-1, -1)));
        assert_eq!(with(true, (-1, -1)), (true, (-1, -1)));
        assert_eq!(with(false, (-1, 0)), (true, (-1, -1)));
        assert_eq!(with(true, (-1, 0)), (true, (-1, -1)));
        assert_eq!(with(true, (16, -1)), (false, (16, 0)));
        assert_eq!(with(true, (16, 5)), (false, (16, 0)));
        assert_eq!(with(false, (16, 5)), (false, (16, 5)));
        assert_eq!(with(false, (0, 0)), (false, (0, 0)));
        assert_eq!(with(false, (99, 100)), (false, (99, -1)));
        assert_eq!(with(false, (100, 0)), (true, (-1, -1)));
        assert_eq!(with(false, (i64::MAX, 3)), (false, (-1, 3)));
        for bad in [(-2, 0), (0, -5), (i64::MIN, -1)] {
            let e = err(
                &q,
                &k,
                &k,
                Options {
                    window_size: bad,
                    ..Options::default()
                },
            );
            assert_eq!(e.kind, ErrorKind::Value);
            assert!(
                e.message.starts_with(
                    "window_size: expected (left, right) with each -1 (unbounded) or >= 0"
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn a_right_bound_between_seqlen_k_and_seqlen_q_follows_each_flash_attentions_rule() {
        // seqlen_q = 300 > seqlen_k = 100: right = 150 still masks query rows below 49
        // (bottom-right aligned, row i sees keys up to i - 200 + 150). FlashAttention 2 reads
        // it as unbounded (>= seqlen_k); FlashAttention 3 keeps it (< seqlen_q - 1).
        let (q, k) = (bshd(1, 300, 2, 64), bshd(1, 100, 2, 64));
        let with = |window_rule, window_size| {
            let o = Options {
                window_size,
                window_rule,
                ..Options::default()
            };
            plan(&q, &k, &k, &o).expect("valid window").window
        };
        assert_eq!(with(WindowRule::Fa2, (-1, 150)), (-1, -1));
        assert_eq!(with(WindowRule::Fa3, (-1, 150)), (-1, 150));
        assert_eq!(with(WindowRule::Fa3, (-1, 299)), (-1, -1));
        assert_eq!(with(WindowRule::Fa3, (-1, 298)), (-1, 298));
        assert_eq!(with(WindowRule::Fa3, (99, 5)), (-1, 5));
        assert_eq!(with(WindowRule::Fa3, (98, 5)), (98, 5));
        assert_eq!(with(WindowRule::Fa2, (99, 5)), (99, 5));
    }

    #[test]
    fn softcap_must_be_finite_and_not_negative() {
        let q = bshd(1, 64, 2, 64);
        let with = |softcap| {
            plan(
                &q,
                &q,
                &q,
                &Options {
                    softcap,
                    ..Options::default()
                },
            )
        };
        assert_eq!(with(0.0).expect("off").softcap, 0.0);
        assert_eq!(with(30.0).expect("on").softcap, 30.0);
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
            let e = with(bad).expect_err("bad softcap");
            assert!(
                e.message
                    .starts_with("softcap: expected a finite number >= 0 (0 is off), got"),
                "{e}"
            );
        }
    }

    #[test]
    fn return_lse_plans_the_log_sum_exp() {
        let (q, k) = (bshd(2, 100, 4, 64), bshd(2, 50, 4, 64));
        let o = Options {
            return_lse: true,
            ..Options::default()
        };
        let p = plan(&q, &k, &k, &o).expect("valid");
        assert!(p.return_lse);
        assert_eq!(p.lse_shape(), [2, 4, 100]);
    }

    #[test]
    fn bad_scales_say_so() {
        let q = bshd(1, 64, 2, 64);
        let with = |o: Options| err(&q, &q, &q, o).message;
        assert!(
            with(Options {
                softmax_scale: Some(f64::NAN),
                ..Options::default()
            })
            .starts_with("softmax_scale: expected a finite number")
        );
        let p = plan(
            &q,
            &q,
            &q,
            &Options {
                softmax_scale: Some(0.5),
                ..Options::default()
            },
        )
        .expect("valid");
        assert_eq!(p.scale, 0.5);
    }

    #[test]
    fn the_output_must_have_qs_shape_dtype_and_device() {
        let q = bshd(2, 100, 4, 64);
        let k = bshd(2, 50, 4, 64);
        let p = plan(&q, &k, &k, &Options::default()).expect("valid");
        let view = check_out(&p, &q, &bshd(2, 100, 4, 64)).expect("valid out");
        assert_eq!(view.shape, [2, 4, 100, 64]);
        let e = check_out(&p, &q, &k).expect_err("k's shape");
        assert_eq!(
            e.message,
            "out: expected shape [2, 100, 4, 64] (q's), got [2, 50, 4, 64]"
        );
    }

    #[test]
    fn empty_batches_plan_no_launch() {
        let q = bshd(0, 64, 2, 64);
        let p = plan(&q, &q, &q, &Options::default()).expect("valid");
        assert!(p.is_empty());
        let q = bshd(1, 0, 2, 64);
        assert!(
            plan(
                &q,
                &bshd(1, 8, 2, 64),
                &bshd(1, 8, 2, 64),
                &Options::default()
            )
            .expect("valid")
            .is_empty()
        );
    }
}
