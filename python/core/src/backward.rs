//! Attention's backward pass from PyTorch (`_flash_attn_backward` and its varlen form), and the
//! forward on kiln's CPU interpreter: every gradient and workspace tensor checked against the
//! forward's [`Plan`] (an [`ArgError`] naming the argument), then the steps of
//! `kiln_examples::attention_backward` (`docs/kernels.md`, "Attention backward and decode"),
//! each a registered kernel run through [`crate::generic`] on the GPU or on the interpreter.

use kiln::ir::{DType, Target};
use kiln_examples::attention_backward::AttentionBwdParams;

use crate::args::Place;
use crate::args::{
    ArgError, Options, Plan, TensorInfo, TorchDType, TorchDevice, View, check_strides, plan_at,
};
use crate::generic::{self, Arg, GenericError, Given};
use crate::launch::Lse;
use crate::varlen::{Offsets, one_batch, plan_varlen_used_at};

/// The tensors of a backward call besides q, k and v, as PyTorch describes them.
#[derive(Clone, Copy, Debug)]
pub struct Grads<'a> {
    /// `dout`, the gradient of the forward's output: q's shape in v's head dim, q's dtype.
    pub dout: &'a TensorInfo,
    /// The forward's output: as `dout`.
    pub out: &'a TensorInfo,
    /// The forward's log-sum-exp (`[batch, nheads, seqlen_q]`, or `[nheads, total_q]` packed),
    /// torch.float32.
    pub lse: &'a TensorInfo,
    /// Written: q's shape and dtype.
    pub dq: &'a TensorInfo,
    /// Written: k's shape and dtype.
    pub dk: &'a TensorInfo,
    /// Written: v's shape, q's dtype.
    pub dv: &'a TensorInfo,
}

/// A packed varlen batch's extras: the offsets and the longest sequences (the grids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    /// `cu_seqlens_q`.
    pub cu_q: Offsets,
    /// `cu_seqlens_k`.
    pub cu_k: Offsets,
    /// The sequences.
    pub batch: usize,
    /// `max_seqlen_q`.
    pub max_seqlen_q: usize,
    /// `max_seqlen_k`.
    pub max_seqlen_k: usize,
    /// FlashAttention 3's `seqused_q` and `seqused_k`, when the call gives them.
    pub used: Option<(Offsets, Offsets)>,
}

/// A checked backward call.
#[derive(Clone, Debug, PartialEq)]
pub struct BwdPlan {
    /// The forward's plan (over a packed batch: one batch of `total_q` rows).
    pub fwd: Plan,
    /// Reproducible dQ asked for: the second pass instead of atomics (which the plan may take
    /// anyway, [`BwdPlan::dq_by_walk`]).
    pub deterministic: bool,
    /// Where the tensors are.
    pub place: Place,
    /// The BHSD views of `dout`, `out`, `dq`, `dk`, `dv`.
    pub dout: View,
    /// `out`.
    pub out: View,
    /// `dq`.
    pub dq: View,
    /// `dk`.
    pub dk: View,
    /// `dv`.
    pub dv: View,
    /// The log-sum-exp as the kernels read it, `[batch, nheads, seqlen_q]`.
    pub lse: Lse,
    /// The offsets of a packed batch.
    pub packed: Option<Packed>,
    /// The target the kernels are built for, whose tuned tiles they take
    /// ([`AttentionBwdParams::tuned`]); `None` (the interpreter) keeps the defaults.
    pub target: Option<Target>,
}

/// What a checked call needs done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Nothing to compute: no query row, head or key. The caller zeroes dq, dk, dv and delta
    /// (a gradient through no score is 0; a tensor map cannot have an extent of 0).
    Zero,
    /// Run [`BwdPlan::steps`].
    Run,
}

/// One kernel run: the registered kernel, its arguments in order, its grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The registered kernel's name.
    pub kernel: &'static str,
    /// Launch arguments in signature order.
    pub args: Vec<Arg>,
    /// The grid: fixed, or the kernel's own grid function over `[x, y, z]` extents.
    pub grid: StepGrid,
    /// The comptime values the kernel is built with, by name.
    pub given: Vec<(String, Given)>,
}

/// How a [`Step`]'s grid is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepGrid {
    /// These block counts.
    Fixed([u32; 3]),
    /// The kernel's own grid (`#[kernel(grid = ..)]`) over these extents.
    Own([usize; 3]),
}

/// Checks a dense backward call: q, k, v and the options as the forward took them, then every
/// tensor of `g` against them.
pub fn plan_backward(
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
    g: Grads<'_>,
    opts: &Options,
    deterministic: bool,
    place: Place,
) -> Result<BwdPlan, ArgError> {
    let fwd = plan_at(q, k, v, opts, place)?;
    let lse = check_lse(
        g.lse,
        q,
        &[fwd.batch, fwd.nheads, fwd.seqlen_q],
        "[batch, nheads, seqlen_q]",
    )?;
    let lse = Lse {
        ptr: lse.ptr,
        shape: [0, 1, 2].map(|i| lse.shape[i] as usize),
        strides: [0, 1, 2].map(|i| lse.strides[i] as usize),
    };
    let views = check_grads(g, (q, k, v))?;
    Ok(assemble(fwd, views, lse, None, deterministic, place))
}

/// Checks a varlen backward call: the packed q, k, v, out, offsets and used lengths
/// (FlashAttention 3's `seqused_q`, `seqused_k`, both or neither) as the varlen forward took
/// them, then `dout`, `dq`, `dk`, `dv` (packed, `[total, heads, headdim]`) and the packed
/// `[nheads, total_q]` log-sum-exp.
#[allow(clippy::too_many_arguments)]
pub fn plan_varlen_backward(
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
    g: Grads<'_>,
    (cu_q, cu_k): (&TensorInfo, &TensorInfo),
    used: Option<(&TensorInfo, &TensorInfo)>,
    (max_seqlen_q, max_seqlen_k): (i64, i64),
    opts: &Options,
    deterministic: bool,
    place: Place,
) -> Result<BwdPlan, ArgError> {
    let vp = plan_varlen_used_at(
        (q, k, v),
        g.out,
        (cu_q, cu_k),
        used,
        (max_seqlen_q, max_seqlen_k),
        opts,
        place,
    )?;
    let out_shape = with_value_dim(q, v);
    for (name, t, like, whose) in [
        ("dout", g.dout, &out_shape, "q's in v's head dim"),
        ("dq", g.dq, &q.shape, "q's"),
        ("dk", g.dk, &k.shape, "k's"),
        ("dv", g.dv, &v.shape, "v's"),
    ] {
        if &t.shape != like || t.strides.len() != like.len() {
            return Err(ArgError::value_error(format!(
                "{name}: expected shape {like:?} ({whose}), got {:?}",
                t.shape
            )));
        }
    }
    let (nheads, total_q) = (vp.plan.nheads, vp.plan.seqlen_q);
    let lse = check_lse(g.lse, q, &[nheads, total_q], "[nheads, total_q]")?;
    let lse = Lse::packed(
        lse.ptr,
        [nheads, total_q],
        [lse.strides[0] as usize, lse.strides[1] as usize],
    );
    let [dout, dq, dk, dv, out] = [g.dout, g.dq, g.dk, g.dv, g.out].map(one_batch);
    let grads = Grads {
        dout: &dout,
        out: &out,
        lse: g.lse,
        dq: &dq,
        dk: &dk,
        dv: &dv,
    };
    let [qb, kb, vb] = [q, k, v].map(one_batch);
    let views = check_grads(grads, (&qb, &kb, &vb))?;
    let packed = Packed {
        cu_q: vp.cu_q,
        cu_k: vp.cu_k,
        batch: vp.batch,
        max_seqlen_q: vp.max_seqlen_q,
        max_seqlen_k: max_seqlen_k as usize,
        used: vp.used,
    };
    Ok(assemble(
        vp.plan,
        views,
        lse,
        Some(packed),
        deterministic,
        place,
    ))
}

/// `q`'s shape with `v`'s head dim (the last): the shape of the forward's output and of
/// `dout`.
fn with_value_dim(q: &TensorInfo, v: &TensorInfo) -> Vec<i64> {
    let mut shape = q.shape.clone();
    if let (Some(o), Some(&dv)) = (shape.last_mut(), v.shape.last()) {
        *o = dv;
    }
    shape
}

/// The BHSD views of `dout`, `out`, `dq`, `dk`, `dv` (4-D BSHD tensors), each checked to have
/// the shape of q (`dout` and `out` in v's head dim, dk k's, dv v's), q's dtype and device,
/// and a contiguous last dimension. A mismatch is a `ValueError`: these are buffers of a
/// call already checked, not inputs whose element type picks a kernel.
fn check_grads(
    g: Grads<'_>,
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
) -> Result<[View; 5], ArgError> {
    let out_shape = with_value_dim(q, v);
    let named = [
        ("dout", g.dout, &out_shape, "q's in v's head dim"),
        ("out", g.out, &out_shape, "q's in v's head dim"),
        ("dq", g.dq, &q.shape, "q's"),
        ("dk", g.dk, &k.shape, "k's"),
        ("dv", g.dv, &v.shape, "v's"),
    ];
    for (name, t, like, whose) in named {
        if &t.shape != like || t.strides.len() != like.len() {
            return Err(ArgError::value_error(format!(
                "{name}: expected shape {like:?} ({whose}), got {:?}",
                t.shape
            )));
        }
        if t.dtype != q.dtype {
            return Err(ArgError::value_error(format!(
                "{name}: expected dtype {} (q's), got {}",
                q.dtype, t.dtype
            )));
        }
        same_device(name, t, q)?;
        check_strides(name, t)?;
    }
    Ok(named.map(|(_, t, _, _)| bhsd(t)))
}

/// `t` must be on q's device.
fn same_device(name: &str, t: &TensorInfo, q: &TensorInfo) -> Result<(), ArgError> {
    if t.device != q.device {
        return Err(ArgError::value_error(format!(
            "{name}: expected a tensor on {} (q's device), got a tensor on {}",
            q.device, t.device
        )));
    }
    Ok(())
}

/// The log-sum-exp `lse` must be a torch.float32 tensor of `shape` on q's device with
/// non-negative strides and a contiguous last dimension.
fn check_lse<'a>(
    lse: &'a TensorInfo,
    q: &TensorInfo,
    shape: &[usize],
    layout: &str,
) -> Result<&'a TensorInfo, ArgError> {
    let want: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
    if lse.shape != want || lse.strides.len() != want.len() {
        return Err(ArgError::value_error(format!(
            "softmax_lse: expected shape {want:?} ({layout}, the forward's), got {:?}",
            lse.shape
        )));
    }
    if lse.dtype != TorchDType::Other("torch.float32".into()) {
        return Err(ArgError::value_error(format!(
            "softmax_lse: expected dtype torch.float32, got {}",
            lse.dtype
        )));
    }
    same_device("softmax_lse", lse, q)?;
    let last = lse.strides.len() - 1;
    if lse.strides.iter().any(|&s| s < 0) || (lse.strides[last] != 1 && lse.shape[last] > 1) {
        return Err(ArgError::value_error(format!(
            "softmax_lse: expected non-negative strides and a contiguous last dimension, got \
             strides {:?}",
            lse.strides
        )));
    }
    Ok(lse)
}

/// The BHSD view of a checked 4-D BSHD tensor.
fn bhsd(t: &TensorInfo) -> View {
    let at = |v: &[i64], i: usize| v[i] as usize;
    View {
        ptr: t.ptr,
        shape: [0, 2, 1, 3].map(|i| at(&t.shape, i)),
        strides: [0, 2, 1, 3].map(|i| at(&t.strides, i)),
    }
}

/// The plan of a call whose tensors are all checked.
fn assemble(
    fwd: Plan,
    [dout, out, dq, dk, dv]: [View; 5],
    lse: Lse,
    packed: Option<Packed>,
    deterministic: bool,
    place: Place,
) -> BwdPlan {
    BwdPlan {
        fwd,
        deterministic,
        place,
        dout,
        out,
        dq,
        dk,
        dv,
        lse,
        packed,
        target: None,
    }
}

impl BwdPlan {
    /// Whether there is anything to launch ([`Work::Zero`]: the caller zeroes the gradients).
    pub fn work(&self) -> Work {
        let p = &self.fwd;
        let no_rows = match &self.packed {
            Some(pk) => pk.max_seqlen_q == 0 || pk.max_seqlen_k == 0,
            None => false,
        };
        if p.batch == 0 || p.nheads == 0 || p.seqlen_q == 0 || p.seqlen_k == 0 || no_rows {
            Work::Zero
        } else {
            Work::Run
        }
    }

    /// The shape of `delta` (FlashAttention's softmax_d), f32, padded as FlashAttention 2
    /// allocates it: `[batch, nheads, seqlen_q rounded up to 128]`, or `[nheads, total_q + 128
    /// batch]` over a packed batch. The kernels write the first `seqlen_q` (`total_q`) entries
    /// of each row; the caller zeroes the whole.
    pub fn delta_shape(&self) -> Vec<usize> {
        let p = &self.fwd;
        match self.packed {
            Some(pk) => vec![p.nheads, p.seqlen_q + 128 * pk.batch],
            None => vec![p.batch, p.nheads, p.seqlen_q.next_multiple_of(128)],
        }
    }

    /// The shape of the f32 dQ accumulator, contiguous `[batch, nheads, seqlen_q, headdim]`
    /// (BHSD; one batch of `total_q` rows over a packed batch); when dQ comes from the walk
    /// ([`BwdPlan::dq_by_walk`]), which never touches it, a 16-byte placeholder `[1, 1, 1, 4]`
    /// (the kernels still take the argument): the whole would be twice dq's size in f32.
    pub fn accum_shape(&self) -> [usize; 4] {
        if self.dq_by_walk() {
            return [1, 1, 1, 4];
        }
        let p = &self.fwd;
        [p.batch, p.nheads, p.seqlen_q, p.head_dim]
    }

    /// Whether dQ comes from the walk ([`AttentionBwdParams::dq_walk_is_faster`]): asked for
    /// (`deterministic`), or the faster way on the target.
    pub fn dq_by_walk(&self) -> bool {
        self.deterministic
            || self.target.is_some_and(|t| {
                self.untuned()
                    .dq_walk_is_faster(t, self.no_ring(), self.fwd.seqlen_q)
            })
    }

    /// The backward kernels' comptime values: the forward's head dims (in their tiles'
    /// widths, `dv` 0 when they match), mask, cap, heads and dtype, and the tiles tuned for
    /// [`BwdPlan::target`].
    pub fn params(&self) -> AttentionBwdParams {
        let params = AttentionBwdParams {
            deterministic: self.dq_by_walk(),
            ..self.untuned()
        };
        match self.target {
            Some(target) => params.tuned(target, self.no_ring()),
            None => params,
        }
    }

    /// Whether the kernels cannot take sm_90a's rings: a packed batch (its loads are masked),
    /// or a tensor the dK/dV kernel reads or writes not 16-byte aligned (its base or an outer
    /// stride: TMA needs them). Such a call keeps the tiles measured without a ring.
    pub fn no_ring(&self) -> bool {
        // The runtime's rule, the one the kernels specialise on.
        let aligned = |dtype: DType, ptr: u64, shape: &[usize], strides: &[usize]| {
            let layout = kiln::runtime::Layout {
                dtype,
                shape: shape.to_vec(),
                strides: strides.to_vec(),
                offset: 0,
            };
            layout.aligned16(ptr)
        };
        let p = &self.fwd;
        let views = [&p.q, &p.k, &p.v, &self.dout, &self.dk, &self.dv];
        let lse = &self.lse;
        self.packed.is_some()
            || !aligned(DType::F32, lse.ptr, &lse.shape, &lse.strides)
            || !views
                .into_iter()
                .all(|v| aligned(p.dtype, v.ptr, &v.shape, &v.strides))
    }

    /// [`BwdPlan::params`] as asked for, before the target's tiles and its choice of dQ.
    fn untuned(&self) -> AttentionBwdParams {
        let p = &self.fwd;
        let (d, dv) = p.tile_dims();
        AttentionBwdParams {
            d,
            dv: if dv == d { 0 } else { dv },
            causal: p.causal,
            kv_group: p.kv_group,
            dtype: p.dtype,
            window_left: p.window.0,
            window_right: p.window.1,
            attention_chunk: p.chunk,
            softcap: p.softcap,
            block_m: 0,
            block_n: 0,
            deterministic: self.deterministic,
            num_warps: 4,
            keys_major: false,
            key_cols: 0,
        }
    }

    /// The kernel runs, in order, given the caller's `delta` and `dq_accum` (allocated in
    /// [`BwdPlan::delta_shape`] and [`BwdPlan::accum_shape`], torch.float32, contiguous, on
    /// q's device).
    pub fn steps(&self, delta: &TensorInfo, dq_accum: &TensorInfo) -> Result<Vec<Step>, ArgError> {
        let want = self.delta_shape();
        let q_dev = &self.device();
        for (name, t, shape) in [
            ("delta", delta, want.clone()),
            ("dq_accum", dq_accum, self.accum_shape().to_vec()),
        ] {
            let contiguous =
                TensorInfo::contiguous(&shape, t.dtype.clone(), t.device.clone(), t.ptr);
            if t.shape != contiguous.shape
                || t.strides != contiguous.strides
                || t.dtype != TorchDType::Other("torch.float32".into())
                || &t.device != q_dev
            {
                return Err(ArgError::value_error(format!(
                    "internal: the workspace {name} is not a contiguous torch.float32 tensor of \
                     shape {shape:?} on {q_dev}"
                )));
            }
        }
        let p = &self.fwd;
        let dt = match p.dtype {
            DType::F16 => TorchDType::F16,
            _ => TorchDType::Bf16,
        };
        let f32t = TorchDType::Other("torch.float32".into());
        let dev = q_dev.clone();
        let t = |v: &View, dtype: &TorchDType| {
            Arg::Tensor(TensorInfo {
                shape: v.shape.iter().map(|&n| n as i64).collect(),
                strides: v.strides.iter().map(|&n| n as i64).collect(),
                dtype: dtype.clone(),
                device: dev.clone(),
                ptr: v.ptr,
            })
        };
        let (q, k, v) = (t(&p.q, &dt), t(&p.k, &dt), t(&p.v, &dt));
        let (dout, out) = (t(&self.dout, &dt), t(&self.out, &dt));
        let (dq, dk, dv) = (t(&self.dq, &dt), t(&self.dk, &dt), t(&self.dv, &dt));
        let lse = Arg::Tensor(TensorInfo {
            shape: self.lse.shape.iter().map(|&n| n as i64).collect(),
            strides: self.lse.strides.iter().map(|&n| n as i64).collect(),
            dtype: f32t.clone(),
            device: dev.clone(),
            ptr: self.lse.ptr,
        });
        // The kernels' `[batch, nheads, seqlen_q]` view of the padded rows.
        let [b, h, sq] = self.lse.shape;
        let row = *want.last().expect("a row length") as i64;
        let delta = Arg::Tensor(TensorInfo {
            shape: vec![b as i64, h as i64, sq as i64],
            strides: vec![h as i64 * row, row, 1],
            dtype: f32t.clone(),
            device: dev.clone(),
            ptr: delta.ptr,
        });
        let accum = Arg::Tensor(dq_accum.clone());
        let scale = Arg::Float(f64::from(p.scale));
        let offsets = |o: &Offsets| {
            Arg::Tensor(TensorInfo::contiguous(
                &[o.len],
                TorchDType::Other("torch.int32".into()),
                dev.clone(),
                o.ptr,
            ))
        };
        let cu = self.packed.map(|pk| [offsets(&pk.cu_q), offsets(&pk.cu_k)]);
        let with_cu = |mut args: Vec<Arg>, before_scale: bool| {
            if let Some(cu) = &cu {
                let at = if before_scale {
                    args.len() - 1
                } else {
                    args.len()
                };
                for (i, c) in cu.iter().enumerate() {
                    args.insert(at + i, c.clone());
                }
            }
            args
        };
        let name = |dense: &'static str, varlen: &'static str| {
            if self.packed.is_some() { varlen } else { dense }
        };
        // The dK/dV and dQ kernels of used lengths take them after the offsets; the
        // preprocess and the dQ conversion cover every row of the offsets as they are.
        let used = self
            .packed
            .and_then(|pk| pk.used)
            .map(|(uq, uk)| [offsets(&uq), offsets(&uk)]);
        let with_used = |args: Vec<Arg>| {
            let mut args = with_cu(args, true);
            if let Some(used) = &used {
                let at = args.len() - 1;
                for (i, u) in used.iter().enumerate() {
                    args.insert(at + i, u.clone());
                }
            }
            args
        };
        let walk_name = |dense: &'static str, varlen: &'static str, used_form: &'static str| {
            if used.is_some() {
                used_form
            } else {
                name(dense, varlen)
            }
        };
        // The dK/dV kernel's tiles, and the query-side kernels' beside them.
        let bp = self.params();
        let qp = bp.query_tiles();
        let (keys_given, query_given) = (bwd_given(&bp), bwd_given(&qp));
        let (rows_q, rows_k, batch) = match self.packed {
            Some(pk) => (pk.max_seqlen_q, pk.max_seqlen_k, pk.batch),
            None => (p.seqlen_q, p.seqlen_k, p.batch),
        };
        let qgrid = StepGrid::Fixed(qp.query_grid([rows_q, p.nheads, batch]));
        let kgrid = StepGrid::Fixed(bp.key_grid([rows_k, p.nheads_k, batch]));
        // The dQ pass splits a wide head's columns over blocks (d = 256: two of 128).
        let dq_grid = StepGrid::Fixed(qp.dq_grid([rows_q, p.nheads, batch]));
        let mut steps = vec![
            Step {
                kernel: name(
                    "attention_bwd_preprocess",
                    "attention_bwd_preprocess_varlen",
                ),
                args: with_cu(vec![out, dout.clone(), delta.clone(), accum.clone()], false),
                grid: qgrid,
                given: query_given.clone(),
            },
            Step {
                kernel: walk_name(
                    "attention_bwd_dkdv",
                    "attention_bwd_dkdv_varlen",
                    "attention_bwd_dkdv_varlen_used",
                ),
                args: with_used(vec![
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    dout.clone(),
                    lse.clone(),
                    delta.clone(),
                    accum.clone(),
                    dk,
                    dv,
                    scale.clone(),
                ]),
                grid: kgrid,
                given: keys_given,
            },
        ];
        steps.push(if self.dq_by_walk() {
            Step {
                kernel: walk_name(
                    "attention_bwd_dq",
                    "attention_bwd_dq_varlen",
                    "attention_bwd_dq_varlen_used",
                ),
                args: with_used(vec![q, k, v, dout, lse, delta, dq, scale]),
                grid: dq_grid,
                given: query_given,
            }
        } else {
            Step {
                kernel: name(
                    "attention_bwd_dq_convert",
                    "attention_bwd_dq_convert_varlen",
                ),
                args: with_cu(vec![accum, dq, scale], true),
                grid: qgrid,
                given: query_given,
            }
        });
        Ok(steps)
    }

    /// The device every tensor is on (q's).
    fn device(&self) -> TorchDevice {
        match self.place {
            Place::Cuda => TorchDevice::Cuda(self.fwd.device),
            Place::Host => TorchDevice::Other("cpu".into()),
        }
    }
}

/// `p` as the comptime keyword values the generic path takes.
fn bwd_given(p: &AttentionBwdParams) -> Vec<(String, Given)> {
    let mut g = forward_given(&Semantic {
        d: p.d,
        causal: p.causal,
        kv_group: p.kv_group,
        dtype: p.dtype,
        window: (p.window_left, p.window_right),
        chunk: p.attention_chunk,
        softcap: p.softcap,
    });
    g.push(("dv".into(), Given::Int(p.dv as i64)));
    g.push(("deterministic".into(), Given::Bool(p.deterministic)));
    g.push(("keys_major".into(), Given::Bool(p.keys_major)));
    // The tiles too: the launch grids the steps compute from them must be the built kernel's.
    for (name, value) in [
        ("block_m", p.block_m),
        ("block_n", p.block_n),
        ("num_warps", p.num_warps),
        ("key_cols", p.key_cols),
    ] {
        g.push((name.into(), Given::Int(value as i64)));
    }
    g
}

/// What the forward and backward kernels' comptime values share: the call's semantics.
struct Semantic {
    d: usize,
    causal: bool,
    kv_group: usize,
    dtype: DType,
    window: (i32, i32),
    chunk: i32,
    softcap: f32,
}

fn forward_given(s: &Semantic) -> Vec<(String, Given)> {
    vec![
        ("d".into(), Given::Int(s.d as i64)),
        ("causal".into(), Given::Bool(s.causal)),
        ("kv_group".into(), Given::Int(s.kv_group as i64)),
        ("dtype".into(), Given::Text(s.dtype.name().to_string())),
        ("window_left".into(), Given::Int(i64::from(s.window.0))),
        ("window_right".into(), Given::Int(i64::from(s.window.1))),
        ("attention_chunk".into(), Given::Int(i64::from(s.chunk))),
        ("softcap".into(), Given::Float(f64::from(s.softcap))),
    ]
}

/// The forward on the interpreter (`attention_lse`, or `attention_varlen_lse` with `packed`):
/// the plan's q, k, v, `out` and the log-sum-exp `lse` (the kernel's `[batch, nheads,
/// seqlen_q]` view), with the kernel's default blocks.
pub fn forward_steps(plan: &Plan, out: &View, lse: &Lse, packed: Option<Packed>) -> Step {
    let dev = TorchDevice::Other("cpu".into());
    let dt = match plan.dtype {
        DType::F16 => TorchDType::F16,
        _ => TorchDType::Bf16,
    };
    let t = |v: &View| {
        Arg::Tensor(TensorInfo {
            shape: v.shape.iter().map(|&n| n as i64).collect(),
            strides: v.strides.iter().map(|&n| n as i64).collect(),
            dtype: dt.clone(),
            device: dev.clone(),
            ptr: v.ptr,
        })
    };
    let mut args = vec![t(&plan.q), t(&plan.k), t(&plan.v), t(out)];
    args.push(Arg::Tensor(TensorInfo {
        shape: lse.shape.iter().map(|&n| n as i64).collect(),
        strides: lse.strides.iter().map(|&n| n as i64).collect(),
        dtype: TorchDType::Other("torch.float32".into()),
        device: dev.clone(),
        ptr: lse.ptr,
    }));
    let (kernel, extents) = match packed {
        Some(pk) => {
            let used = pk.used.map(|(q, k)| [q, k]);
            for o in [pk.cu_q, pk.cu_k]
                .into_iter()
                .chain(used.into_iter().flatten())
            {
                args.push(Arg::Tensor(TensorInfo::contiguous(
                    &[o.len],
                    TorchDType::Other("torch.int32".into()),
                    dev.clone(),
                    o.ptr,
                )));
            }
            let kernel = match pk.used {
                Some(_) => "attention_varlen_used_lse",
                None => "attention_varlen_lse",
            };
            (kernel, [pk.max_seqlen_q, plan.nheads, pk.batch])
        }
        None => ("attention_lse", [plan.seqlen_q, plan.nheads, plan.batch]),
    };
    args.push(Arg::Float(f64::from(plan.scale)));
    let (d, dv) = plan.tile_dims();
    let mut given = forward_given(&Semantic {
        d,
        causal: plan.causal,
        kv_group: plan.kv_group,
        dtype: plan.dtype,
        window: plan.window,
        chunk: plan.chunk,
        softcap: plan.softcap,
    });
    given.push(("dv".into(), Given::Int(dv as i64)));
    Step {
        kernel,
        args,
        grid: StepGrid::Own(extents),
        given,
    }
}

/// Runs `steps` in order, each with its comptime values checked against its kernel
/// by the generic path: launched on `stream` (`Place::Cuda`) or run on the interpreter
/// (`Place::Host`).
///
/// # Safety
/// Every tensor of the steps must address live memory at `place` (device memory of the plan's
/// device, or host memory) that stays allocated until the kernels have run; `stream` must be
/// 0 or a live stream of that device's primary context.
pub unsafe fn run(steps: &[Step], place: Place, stream: u64) -> Result<(), GenericError> {
    for s in steps {
        let reg = generic::find(s.kernel)?;
        let planned = generic::plan_at(reg, &s.args, &s.given, place)?;
        let grid = match s.grid {
            StepGrid::Fixed(g) => g,
            StepGrid::Own(e) => generic::kernel_grid(reg, &planned.values, &e)?,
        };
        match place {
            // SAFETY: the caller's guarantees, passed on.
            Place::Cuda => unsafe { generic::launch(&planned, grid, stream) }?,
            // SAFETY: the caller's guarantees, passed on.
            Place::Host => unsafe { generic::interpret_host(&planned, grid) }?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUDA: TorchDevice = TorchDevice::Cuda(0);

    fn bshd(shape: [i64; 4], dtype: TorchDType, ptr: u64) -> TensorInfo {
        let s: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
        TensorInfo::contiguous(&s, dtype, CUDA, ptr)
    }

    struct Call {
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

    fn call(b: i64, sq: i64, sk: i64, h: i64, hk: i64, d: i64) -> Call {
        let bf = TorchDType::Bf16;
        let q = bshd([b, sq, h, d], bf.clone(), 0x1000);
        let k = bshd([b, sk, hk, d], bf.clone(), 0x2000);
        Call {
            v: bshd([b, sk, hk, d], bf.clone(), 0x3000),
            dout: bshd([b, sq, h, d], bf.clone(), 0x4000),
            out: bshd([b, sq, h, d], bf.clone(), 0x5000),
            lse: TensorInfo::contiguous(
                &[b as usize, h as usize, sq as usize],
                TorchDType::Other("torch.float32".into()),
                CUDA,
                0x6000,
            ),
            dq: q.clone(),
            dk: k.clone(),
            dv: k.clone(),
            q,
            k,
        }
    }

    fn plan(c: &Call, deterministic: bool) -> Result<BwdPlan, ArgError> {
        let g = Grads {
            dout: &c.dout,
            out: &c.out,
            lse: &c.lse,
            dq: &c.dq,
            dk: &c.dk,
            dv: &c.dv,
        };
        plan_backward(
            (&c.q, &c.k, &c.v),
            g,
            &Options::default(),
            deterministic,
            Place::Cuda,
        )
    }

    #[test]
    fn a_value_head_dim_apart_from_the_key_one_plans_its_own_widths() {
        // MLA's d = 192 beside dv = 128: dout, out and dv in v's head dim, the kernels told
        // both, three blocks a key block (dK's three 64-column chunks, dV's two).
        let f32t = TorchDType::Other("torch.float32".into());
        let mut c = call(1, 16, 100, 2, 2, 192);
        c.v = bshd([1, 100, 2, 128], TorchDType::Bf16, 0x3000);
        c.dv = c.v.clone();
        let e = plan(&c, false).expect_err("dout in q's head dim");
        assert!(
            e.message
                .starts_with("dout: expected shape [1, 16, 2, 128] (q's in v's head dim)"),
            "{e}"
        );
        c.dout = bshd([1, 16, 2, 128], TorchDType::Bf16, 0x4000);
        c.out = bshd([1, 16, 2, 128], TorchDType::Bf16, 0x5000);
        for deterministic in [false, true] {
            let p = plan(&c, deterministic).expect("headdim_v != headdim");
            let bp = p.params();
            assert_eq!((bp.d, bp.dv), (192, 128));
            assert_eq!(p.dv.shape, [1, 2, 100, 128]);
            let accum_shape = if deterministic {
                [1, 1, 1, 4]
            } else {
                [1, 2, 16, 192]
            };
            assert_eq!(p.accum_shape(), accum_shape);
            let delta = TensorInfo::contiguous(&[1, 2, 128], f32t.clone(), CUDA, 0x7000);
            let accum = TensorInfo::contiguous(&accum_shape, f32t.clone(), CUDA, 0x8000);
            let steps = p.steps(&delta, &accum).expect("steps");
            assert_eq!(steps[1].grid, StepGrid::Fixed([2 * 3, 2, 1]));
            for s in &steps {
                let reg = generic::find(s.kernel).expect("registered");
                generic::plan_at(reg, &s.args, &s.given, Place::Cuda)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.kernel));
            }
        }
        // Equal head dims in no built width run in the next one up.
        let p = plan(&call(1, 16, 16, 2, 2, 72), false).expect("72 runs in 96");
        assert_eq!(p.params().d, 96);
        assert_eq!(p.accum_shape(), [1, 2, 16, 72]);
    }

    #[test]
    fn sm90a_dense_plans_take_the_dq_walk_unasked() {
        // The walk is faster there (`dq_walk_is_faster`); the interpreter and sm_80 keep what
        // was asked for. 132 query rows: the log-sum-exp's rows 16-byte aligned, as the rings
        // need (130 would take no ring).
        let f32t = TorchDType::Other("torch.float32".into());
        let c = call(2, 132, 200, 4, 2, 128);
        let delta = TensorInfo::contiguous(&[2, 4, 256], f32t.clone(), CUDA, 0x7000);
        for (target, deterministic, walk) in [
            (None, false, false),
            (Some(Target::Sm80), false, false),
            (Some(Target::Sm80), true, true),
            (Some(Target::Sm90a), false, true),
            (Some(Target::Sm90a), true, true),
        ] {
            let mut p = plan(&c, deterministic).expect("valid");
            p.target = target;
            assert_eq!(p.dq_by_walk(), walk, "{target:?} {deterministic}");
            assert_eq!(p.params().deterministic, walk);
            // The walk never touches the accumulator: a placeholder, not twice dq in f32.
            let shape = if walk { [1, 1, 1, 4] } else { [2, 4, 132, 128] };
            assert_eq!(p.accum_shape(), shape);
            let accum = TensorInfo::contiguous(&shape, f32t.clone(), CUDA, 0x8000);
            let steps = p.steps(&delta, &accum).expect("steps");
            let last = steps.last().expect("three steps").kernel;
            let want = if walk {
                "attention_bwd_dq"
            } else {
                "attention_bwd_dq_convert"
            };
            assert_eq!(last, want, "{target:?} {deterministic}");
            for s in &steps {
                let reg = generic::find(s.kernel).expect("registered");
                generic::plan_at(reg, &s.args, &s.given, Place::Cuda)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.kernel));
            }
        }
    }

    #[test]
    fn sm90a_dense_d64_and_d128_add_dq_from_a_ring_unless_asked_for_the_walk() {
        // At d = 64 or 128: dK and dV from the keys-major ring of two consumer warpgroups that
        // also adds dQ (`adds_dq_in_ring`), then the conversion, once a key block walks enough
        // query rows (`dq_walk_is_faster`: 512 at d = 64, 2048 at 128, counting every query
        // head of a group); reproducible bits asked for or a short walk keep the walk.
        for d in [64, 128] {
            for (deterministic, hk, sq, walk_at) in [
                (false, 4, 4096, [false, false]),
                (true, 4, 4096, [true, true]),
                (false, 2, 4096, [false, false]),
                (false, 4, 1024, [false, true]),
                (false, 1, 256, [false, true]),
                (false, 4, 256, [true, true]),
            ] {
                let walk = walk_at[usize::from(d == 128)];
                let what = format!("d = {d} {deterministic} {hk} {sq}");
                let mut p = plan(&call(2, sq, 200, 4, hk, d), deterministic).expect("valid");
                p.target = Some(Target::Sm90a);
                assert_eq!(p.dq_by_walk(), walk, "{what}");
                let params = p.params();
                assert_eq!(params.keys_major, !walk, "{what}");
                if !walk {
                    let tiles = (
                        params.block_m,
                        params.block_n,
                        params.num_warps,
                        params.key_cols,
                    );
                    let want = if d == 64 {
                        (128, 128, 8, 64)
                    } else {
                        (64, 128, 8, 128)
                    };
                    assert_eq!(tiles, want, "{what}");
                    assert_eq!(p.accum_shape(), [2, 4, sq as usize, d as usize]);
                }
            }
        }
    }

    #[test]
    fn sm90a_calls_with_a_tensor_off_16_bytes_keep_the_tiles_without_a_ring() {
        // The rings' TMA needs every tensor the dK/dV kernel reads or writes 16-byte aligned:
        // a call with one off (k a view 2 bytes into its storage, or lse 4 bytes into its)
        // keeps dQ by atomics and the tiles measured without a ring, as a packed batch does.
        for d in [64, 128] {
            let aligned = call(2, 4096, 4096, 4, 4, d);
            let mut off = call(2, 4096, 4096, 4, 4, d);
            off.k.ptr += 2;
            let mut lse_off = call(2, 4096, 4096, 4, 4, d);
            lse_off.lse.ptr += 4;
            for (c, ring) in [(&aligned, true), (&off, false), (&lse_off, false)] {
                let mut p = plan(c, false).expect("valid");
                p.target = Some(Target::Sm90a);
                assert_eq!(p.no_ring(), !ring, "d = {d}");
                assert!(!p.dq_by_walk(), "d = {d}: dQ by atomics either way");
                let params = p.params();
                assert_eq!(params.keys_major, ring, "d = {d}");
                assert_eq!(params.num_warps == 8, ring, "d = {d}");
            }
        }
    }

    #[test]
    fn sm90a_plans_take_the_tuned_tiles_in_grid_and_kernel_alike() {
        let f32t = TorchDType::Other("torch.float32".into());
        // 200 keys: d = 96, no column split, 4 key blocks of 64; d = 128, no split, 2 of 128
        // keys (two consumer warpgroups); d = 256 (no group), two column splits of 128, 4 key
        // blocks.
        for (d, heads_kv, key_blocks, key_cols, warps) in [
            (96usize, 2, 4, 96, 4),
            (128, 2, 2, 128, 8),
            (256, 4, 8, 128, 4),
        ] {
            let c = call(2, 132, 200, 4, heads_kv, d as i64);
            let mut p = plan(&c, false).expect("valid");
            p.target = Some(Target::Sm90a);
            let tuned = p.params();
            assert_eq!(tuned.key_cols, key_cols, "d = {d}");
            let delta = TensorInfo::contiguous(&[2, 4, 256], f32t.clone(), CUDA, 0x7000);
            let accum = TensorInfo::contiguous(&p.accum_shape(), f32t.clone(), CUDA, 0x8000);
            let steps = p.steps(&delta, &accum).expect("steps");
            assert_eq!(
                steps[1].grid,
                StepGrid::Fixed([key_blocks, heads_kv as u32, 2]),
                "d = {d}"
            );
            let int = |s: &Step, name: &str| {
                s.given
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, g)| g.clone())
            };
            // The dK/dV kernel takes the tuned tiles; the query side four warps and its own
            // key block, over the same query blocks.
            let dkdv = &steps[1];
            assert_eq!(int(dkdv, "key_cols"), Some(Given::Int(key_cols as i64)));
            assert_eq!(int(dkdv, "block_n"), Some(Given::Int(tuned.block_n as i64)));
            assert_eq!(int(dkdv, "num_warps"), Some(Given::Int(warps)));
            for s in [&steps[0], &steps[2]] {
                assert_eq!(int(s, "num_warps"), Some(Given::Int(4)), "{}", s.kernel);
                assert_eq!(int(s, "block_n"), Some(Given::Int(0)), "{}", s.kernel);
                assert_eq!(int(s, "block_m"), int(dkdv, "block_m"), "{}", s.kernel);
            }
            for s in &steps {
                let reg = generic::find(s.kernel).expect("registered");
                generic::plan_at(reg, &s.args, &s.given, Place::Cuda)
                    .unwrap_or_else(|e| panic!("d = {d}: {}: {e}", s.kernel));
            }
        }
    }

    #[test]
    fn a_valid_call_plans_three_steps_in_the_kernels_layouts() {
        let c = call(2, 130, 77, 4, 2, 64);
        let p = plan(&c, false).expect("valid");
        assert_eq!(p.work(), Work::Run);
        assert_eq!(p.delta_shape(), vec![2, 4, 256]);
        assert_eq!(p.accum_shape(), [2, 4, 130, 64]);
        assert_eq!(p.dk.shape, [2, 2, 77, 64]);
        assert_eq!(p.dq.strides, [130 * 4 * 64, 64, 4 * 64, 1]);
        let f32t = TorchDType::Other("torch.float32".into());
        let delta = TensorInfo::contiguous(&[2, 4, 256], f32t.clone(), CUDA, 0x7000);
        let accum = TensorInfo::contiguous(&[2, 4, 130, 64], f32t.clone(), CUDA, 0x8000);
        let steps = p.steps(&delta, &accum).expect("steps");
        let names: Vec<_> = steps.iter().map(|s| s.kernel).collect();
        assert_eq!(
            names,
            [
                "attention_bwd_preprocess",
                "attention_bwd_dkdv",
                "attention_bwd_dq_convert"
            ]
        );
        // Query blocks of 64 rows; key blocks of 64 keys, one column split at d = 64.
        assert_eq!(steps[0].grid, StepGrid::Fixed([3, 4, 2]));
        assert_eq!(steps[1].grid, StepGrid::Fixed([2, 2, 2]));
        let walk = plan(&c, true).expect("valid");
        // The walk takes a placeholder for the accumulator it never touches.
        assert_eq!(walk.accum_shape(), [1, 1, 1, 4]);
        let placeholder = TensorInfo::contiguous(&[1, 1, 1, 4], f32t.clone(), CUDA, 0x8000);
        let det = walk.steps(&delta, &placeholder).expect("steps");
        assert_eq!(det[2].kernel, "attention_bwd_dq");
        // One column block up to d = 128: the query grid.
        assert_eq!(det[2].grid, StepGrid::Fixed([3, 4, 2]));
        // Every step's arguments pass the generic checks against its kernel.
        for s in steps.iter().chain(&det) {
            let reg = generic::find(s.kernel).expect("registered");
            generic::plan_at(reg, &s.args, &s.given, Place::Cuda)
                .unwrap_or_else(|e| panic!("{}: {e}", s.kernel));
        }
        // A bad workspace is refused.
        let e = p.steps(&accum, &delta).unwrap_err();
        assert!(e.message.contains("workspace delta"), "{}", e.message);
    }

    #[test]
    fn each_gradient_tensor_is_checked_by_name() {
        type Edit = fn(&mut Call);
        let cases: [(Edit, &str); 10] = [
            (
                |c| c.dout.shape[1] = 99,
                "dout: expected shape [1, 100, 4, 64] (q's in v's head dim)",
            ),
            (
                |c| c.dout.dtype = TorchDType::F16,
                "dout: expected dtype torch.bfloat16 (q's)",
            ),
            (
                |c| c.dout.device = TorchDevice::Cuda(1),
                "dout: expected a tensor on cuda:0",
            ),
            (
                |c| c.out.shape[3] = 32,
                "out: expected shape [1, 100, 4, 64]",
            ),
            (
                |c| c.lse.shape[2] = 128,
                "softmax_lse: expected shape [1, 4, 100]",
            ),
            (
                |c| c.lse.dtype = TorchDType::Bf16,
                "softmax_lse: expected dtype torch.float32",
            ),
            (
                |c| c.dq.dtype = TorchDType::Other("torch.float32".into()),
                "dq: expected dtype",
            ),
            (
                |c| c.dk.shape[2] = 4,
                "dk: expected shape [1, 50, 2, 64] (k's)",
            ),
            (
                |c| c.dv.strides[3] = 2,
                "dv: expected a contiguous last dimension",
            ),
            (
                |c| c.dv.shape = vec![1, 50, 2],
                "dv: expected shape [1, 50, 2, 64]",
            ),
        ];
        for (edit, want) in cases {
            let mut c = call(1, 100, 50, 4, 2, 64);
            edit(&mut c);
            let e = plan(&c, false).unwrap_err();
            assert_eq!(e.kind, crate::args::ErrorKind::Value, "{want}");
            assert!(e.message.starts_with(want), "{} !~ {want}", e.message);
        }
    }

    #[test]
    fn empty_calls_zero_the_gradients_without_a_launch() {
        for (sq, sk) in [(0, 10), (10, 0), (0, 0)] {
            let c = call(1, sq, sk, 2, 2, 64);
            assert_eq!(
                plan(&c, false).expect("valid").work(),
                Work::Zero,
                "{sq} {sk}"
            );
        }
    }

    #[test]
    fn a_varlen_call_plans_the_varlen_kernels_over_the_longest_sequences() {
        let bf = TorchDType::Bf16;
        let f32t = TorchDType::Other("torch.float32".into());
        let i32t = TorchDType::Other("torch.int32".into());
        let packed = |rows: usize, heads: usize, ptr| {
            TensorInfo::contiguous(&[rows, heads, 96], bf.clone(), CUDA, ptr)
        };
        let (q, k) = (packed(300, 4, 0x1000), packed(500, 2, 0x2000));
        let (dout, out, dq) = (
            packed(300, 4, 0x3000),
            packed(300, 4, 0x4000),
            packed(300, 4, 0x5000),
        );
        let (dk, dv) = (packed(500, 2, 0x6000), packed(500, 2, 0x7000));
        let lse = TensorInfo::contiguous(&[4, 300], f32t.clone(), CUDA, 0x8000);
        let cu = TensorInfo::contiguous(&[3], i32t, CUDA, 0x9000);
        let g = Grads {
            dout: &dout,
            out: &out,
            lse: &lse,
            dq: &dq,
            dk: &dk,
            dv: &dv,
        };
        let opts = Options {
            causal: true,
            ..Options::default()
        };
        let p = plan_varlen_backward(
            (&q, &k, &k),
            g,
            (&cu, &cu),
            None,
            (200, 250),
            &opts,
            true,
            Place::Cuda,
        )
        .expect("valid");
        assert_eq!(p.delta_shape(), vec![4, 300 + 128 * 2]);
        // Deterministic: the walk, whose accumulator is a placeholder.
        assert_eq!(p.accum_shape(), [1, 1, 1, 4]);
        assert_eq!(p.lse.shape, [1, 4, 300]);
        let delta = TensorInfo::contiguous(&[4, 300 + 128 * 2], f32t.clone(), CUDA, 0xa000);
        let accum = TensorInfo::contiguous(&[1, 1, 1, 4], f32t, CUDA, 0xb000);
        let steps = p.steps(&delta, &accum).expect("steps");
        let names: Vec<_> = steps.iter().map(|s| s.kernel).collect();
        assert_eq!(
            names,
            [
                "attention_bwd_preprocess_varlen",
                "attention_bwd_dkdv_varlen",
                "attention_bwd_dq_varlen"
            ]
        );
        // Query blocks of the longest sequence (200 rows: 4 of 64); key blocks of the longest
        // (250 keys: 4 of 64), d = 96 split into 3 column chunks of 32.
        assert_eq!(steps[0].grid, StepGrid::Fixed([4, 4, 2]));
        assert_eq!(steps[1].grid, StepGrid::Fixed([12, 2, 2]));
        for s in &steps {
            let reg = generic::find(s.kernel).expect("registered");
            generic::plan_at(reg, &s.args, &s.given, Place::Cuda)
                .unwrap_or_else(|e| panic!("{}: {e}", s.kernel));
        }
        let bad = packed(299, 4, 0x3000);
        let g = Grads { dout: &bad, ..g };
        let e = plan_varlen_backward(
            (&q, &k, &k),
            g,
            (&cu, &cu),
            None,
            (200, 250),
            &opts,
            true,
            Place::Cuda,
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("dout: expected shape [300, 4, 96] (q's in v's head dim)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn used_lengths_take_the_used_walks_and_name_themselves() {
        // seqused_q / seqused_k: the dK/dV and dQ walks of used lengths, given them after the
        // offsets; the preprocess and the dQ conversion as they are (every row of the offsets).
        let bf = TorchDType::Bf16;
        let f32t = TorchDType::Other("torch.float32".into());
        let i32t = TorchDType::Other("torch.int32".into());
        let packed = |rows: usize, heads: usize, ptr| {
            TensorInfo::contiguous(&[rows, heads, 64], bf.clone(), CUDA, ptr)
        };
        let (q, k, v) = (
            packed(300, 4, 0x1000),
            packed(500, 2, 0x2000),
            packed(500, 2, 0x2800),
        );
        let (dout, out, dq) = (
            packed(300, 4, 0x3000),
            packed(300, 4, 0x4000),
            packed(300, 4, 0x5000),
        );
        let (dk, dv) = (packed(500, 2, 0x6000), packed(500, 2, 0x7000));
        let lse = TensorInfo::contiguous(&[4, 300], f32t.clone(), CUDA, 0x8000);
        let cu = TensorInfo::contiguous(&[3], i32t.clone(), CUDA, 0x9000);
        let used = TensorInfo::contiguous(&[2], i32t.clone(), CUDA, 0x9100);
        let g = Grads {
            dout: &dout,
            out: &out,
            lse: &lse,
            dq: &dq,
            dk: &dk,
            dv: &dv,
        };
        let delta = TensorInfo::contiguous(&[4, 300 + 128 * 2], f32t.clone(), CUDA, 0xa000);
        for (deterministic, last) in [
            (false, "attention_bwd_dq_convert_varlen"),
            (true, "attention_bwd_dq_varlen_used"),
        ] {
            let p = plan_varlen_backward(
                (&q, &k, &v),
                g,
                (&cu, &cu),
                Some((&used, &used)),
                (200, 250),
                &Options::default(),
                deterministic,
                Place::Cuda,
            )
            .expect("valid");
            // A packed batch takes no ring on sm_90a either: dQ as asked.
            let mut on_sm90a = p.clone();
            on_sm90a.target = Some(Target::Sm90a);
            assert_eq!(on_sm90a.dq_by_walk(), deterministic);
            let accum = TensorInfo::contiguous(&p.accum_shape(), f32t.clone(), CUDA, 0xb000);
            let steps = p.steps(&delta, &accum).expect("steps");
            let names: Vec<_> = steps.iter().map(|s| s.kernel).collect();
            assert_eq!(
                names,
                [
                    "attention_bwd_preprocess_varlen",
                    "attention_bwd_dkdv_varlen_used",
                    last
                ]
            );
            for s in &steps {
                let reg = generic::find(s.kernel).expect("registered");
                generic::plan_at(reg, &s.args, &s.given, Place::Cuda)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.kernel));
            }
        }
        let three = TensorInfo::contiguous(&[3], i32t, CUDA, 0x9200);
        let e = plan_varlen_backward(
            (&q, &k, &v),
            g,
            (&cu, &cu),
            Some((&three, &used)),
            (200, 250),
            &Options::default(),
            false,
            Place::Cuda,
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("seqused_q: expected 2 lengths (one per sequence), got 3"),
            "{}",
            e.message
        );
    }

    #[test]
    fn host_plans_take_cpu_tensors_only() {
        let mut c = call(1, 10, 10, 2, 2, 64);
        let g = Grads {
            dout: &c.dout,
            out: &c.out,
            lse: &c.lse,
            dq: &c.dq,
            dk: &c.dk,
            dv: &c.dv,
        };
        let e = plan_backward(
            (&c.q, &c.k, &c.v),
            g,
            &Options::default(),
            false,
            Place::Host,
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("q: expected a CPU tensor"),
            "{}",
            e.message
        );
        let cpu = TorchDevice::Other("cpu".into());
        for t in [
            &mut c.q,
            &mut c.k,
            &mut c.v,
            &mut c.dout,
            &mut c.out,
            &mut c.lse,
            &mut c.dq,
            &mut c.dk,
            &mut c.dv,
        ] {
            t.device = cpu.clone();
        }
        let g = Grads {
            dout: &c.dout,
            out: &c.out,
            lse: &c.lse,
            dq: &c.dq,
            dk: &c.dk,
            dv: &c.dv,
        };
        let p = plan_backward(
            (&c.q, &c.k, &c.v),
            g,
            &Options::default(),
            false,
            Place::Host,
        )
        .expect("host plan");
        assert_eq!(p.place, Place::Host);
    }
}
