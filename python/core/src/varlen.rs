//! `flash_attn_varlen_func`'s arguments (packed `[total, heads, headdim]` tensors and the
//! `cu_seqlens_q` / `cu_seqlens_k` offsets), checked with each error naming its argument, and
//! planned as one launch of `attention_varlen` (`attention_varlen_lse`) over the whole batch:
//! the packed tensors as a `[1, total, heads, headdim]` view of the same memory, the offsets
//! read by the kernel on the device, so nothing is copied or read to the host. What is checked,
//! and why offsets of any value are safe: `docs/python.md`, `flash_attn_varlen_func`.

use crate::args::Place;
use crate::args::{
    ArgError, GRID_YZ_MAX, Options, Plan, TensorInfo, TorchDType, View, check_out, plan_windowed_at,
};

/// A checked varlen call: the one launch's plan and the offsets it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct VarlenPlan {
    /// The plan over the packed tensors as one batch: `seqlen_q` and `seqlen_k` are q's and
    /// k's rows (`total_q`, `total_k`), the window normalised by `max_seqlen_k`.
    pub plan: Plan,
    /// The BHSD view of `out`, `[1, nheads, total_q, headdim]`.
    pub out: View,
    /// The sequences: the grid's z.
    pub batch: usize,
    /// `max_seqlen_q`: the grid's x covers `cdiv(max_seqlen_q, block_m)` query blocks.
    pub max_seqlen_q: usize,
    /// `cu_seqlens_q` on the device.
    pub cu_q: Offsets,
    /// `cu_seqlens_k` on the device.
    pub cu_k: Offsets,
    /// `[nheads, total_q]`, the log-sum-exp's shape, when the call returns it.
    pub lse_shape: Option<[usize; 2]>,
    /// FlashAttention 3's `seqused_q` and `seqused_k` on the device (`batch` values each), when
    /// the call gives them: the launch takes `attention_varlen_used`.
    pub used: Option<(Offsets, Offsets)>,
}

/// A checked offsets tensor: `batch + 1` contiguous int32 values at `ptr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// The address of the first.
    pub ptr: u64,
    /// How many (`batch + 1`).
    pub len: usize,
}

impl VarlenPlan {
    /// Whether the launch has work: query rows, heads and query blocks (`max_seqlen_q > 0`),
    /// and keys in k (without any, [`VarlenPlan::keyless`] says what the caller writes).
    pub fn launches(&self) -> bool {
        !self.plan.is_empty() && self.max_seqlen_q > 0 && !self.keyless()
    }

    /// Whether k has no rows, so no sequence has a key: every query row's output is 0 and its
    /// log-sum-exp `+inf` (`flash_attn_func`'s for a row that sees no key), which the caller
    /// writes without a launch (a tensor map cannot have an extent of 0), the rows past the
    /// last offset included.
    pub fn keyless(&self) -> bool {
        self.plan.seqlen_k == 0
    }
}

/// Checks a `flash_attn_varlen_func` call (q: `[total_q, nheads, headdim]`, k and v:
/// `[total_k, nheads_k, headdim]`, `out` as q; `cu_q`, `cu_k`: the `cu_seqlens_q`,
/// `cu_seqlens_k` tensors) and plans its launch (see the module doc for what is checked).
/// Window bounds of at least `max_seqlen_k` are unbounded, as FlashAttention normalises them.
/// With `opts.return_lse`, the plan's [`VarlenPlan::lse_shape`] is `[nheads, total_q]`,
/// `total_q` being q's rows (as FlashAttention's, rows past the last offset included, which
/// no sequence writes).
pub fn plan_varlen(
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
    out: &TensorInfo,
    (cu_q, cu_k): (&TensorInfo, &TensorInfo),
    (max_seqlen_q, max_seqlen_k): (i64, i64),
    opts: &Options,
) -> Result<VarlenPlan, ArgError> {
    plan_varlen_at(
        (q, k, v),
        out,
        (cu_q, cu_k),
        (max_seqlen_q, max_seqlen_k),
        opts,
        Place::Cuda,
    )
}

/// [`plan_varlen`] for tensors at `place` (CPU tensors for a run on the interpreter).
pub fn plan_varlen_at(
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
    out: &TensorInfo,
    (cu_q, cu_k): (&TensorInfo, &TensorInfo),
    (max_seqlen_q, max_seqlen_k): (i64, i64),
    opts: &Options,
    place: Place,
) -> Result<VarlenPlan, ArgError> {
    let lengths = (max_seqlen_q, max_seqlen_k);
    plan_varlen_used_at((q, k, v), out, (cu_q, cu_k), None, lengths, opts, place)
}

/// [`plan_varlen_at`] with FlashAttention 3's `seqused_q` and `seqused_k` when `used` gives
/// them (both: the caller fills a missing one with the offsets' lengths): each a 1-D
/// contiguous torch.int32 tensor of `batch` values on q's device, read by the kernel. Sequence
/// `b` then uses its first `seqused_q[b]` query rows and `seqused_k[b]` keys (capped at its
/// lengths); its rows past `seqused_q[b]` are not written.
pub fn plan_varlen_used_at(
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
    out: &TensorInfo,
    (cu_q, cu_k): (&TensorInfo, &TensorInfo),
    used: Option<(&TensorInfo, &TensorInfo)>,
    (max_seqlen_q, max_seqlen_k): (i64, i64),
    opts: &Options,
    place: Place,
) -> Result<VarlenPlan, ArgError> {
    for (name, t, total) in [
        ("q", q, "total_q"),
        ("k", k, "total_k"),
        ("v", v, "total_k"),
        ("out", out, "total_q"),
    ] {
        let heads = if name == "k" || name == "v" {
            "nheads_k"
        } else {
            "nheads"
        };
        if t.shape.len() != 3 || t.strides.len() != 3 || t.shape.iter().any(|&n| n < 0) {
            return Err(ArgError::value_error(format!(
                "{name}: expected a 3-D tensor [{total}, {heads}, headdim], got shape {:?}",
                t.shape
            )));
        }
    }
    let cu_q = check_offsets_tensor("cu_seqlens_q", cu_q, q, "[batch + 1]")?;
    let cu_k = check_offsets_tensor("cu_seqlens_k", cu_k, q, "[batch + 1]")?;
    if cu_q.len != cu_k.len || cu_q.len < 2 {
        return Err(ArgError::value_error(format!(
            "cu_seqlens_k: expected batch + 1 offsets, as many as cu_seqlens_q ({}), at least 2, \
             got {}",
            cu_q.len, cu_k.len
        )));
    }
    let batch = cu_q.len - 1;
    let used = match used {
        Some((uq, uk)) => {
            let check = |name: &str, t: &TensorInfo| {
                let o = check_offsets_tensor(name, t, q, "[batch]")?;
                if o.len != batch {
                    return Err(ArgError::value_error(format!(
                        "{name}: expected {batch} lengths (one per sequence), got {}",
                        o.len
                    )));
                }
                Ok(o)
            };
            Some((check("seqused_q", uq)?, check("seqused_k", uk)?))
        }
        None => None,
    };
    if batch as i64 > GRID_YZ_MAX {
        return Err(ArgError::value_error(format!(
            "cu_seqlens_q: batch {batch} is above the most kiln launches ({GRID_YZ_MAX})"
        )));
    }
    for (name, max) in [
        ("max_seqlen_q", max_seqlen_q),
        ("max_seqlen_k", max_seqlen_k),
    ] {
        if !(0..=i64::from(i32::MAX)).contains(&max) {
            return Err(ArgError::value_error(format!(
                "{name}: expected a length in 0..={}, got {max}",
                i32::MAX
            )));
        }
    }
    let want = [q.shape[0], q.shape[1], v.shape[2]];
    if out.shape != want {
        return Err(ArgError::value_error(format!(
            "out: expected shape {want:?} (q's, v's head dim), got {:?}",
            out.shape
        )));
    }
    let [qb, kb, vb, ob] = [q, k, v, out].map(one_batch);
    let plan = plan_windowed_at(&qb, &kb, &vb, opts, Some(max_seqlen_k), place)?;
    let out = check_out(&plan, &qb, &ob)?;
    Ok(VarlenPlan {
        lse_shape: opts
            .return_lse
            .then(|| [q.shape[1], q.shape[0]].map(|n| n as usize)),
        plan,
        out,
        batch,
        max_seqlen_q: max_seqlen_q as usize,
        cu_q,
        cu_k,
        used,
    })
}

/// The offsets tensor `t` (argument `name`) must be a 1-D contiguous torch.int32 tensor on
/// q's device.
fn check_offsets_tensor(
    name: &str,
    t: &TensorInfo,
    q: &TensorInfo,
    shape: &str,
) -> Result<Offsets, ArgError> {
    if t.dtype != TorchDType::Other("torch.int32".into()) {
        return Err(ArgError::type_error(format!(
            "{name}: expected dtype torch.int32, got {}",
            t.dtype
        )));
    }
    if t.shape.len() != 1 || t.strides.len() != 1 {
        return Err(ArgError::value_error(format!(
            "{name}: expected a 1-D tensor {shape}, got shape {:?}",
            t.shape
        )));
    }
    if t.strides[0] != 1 && t.shape[0] > 1 {
        return Err(ArgError::value_error(format!(
            "{name}: expected a contiguous tensor (stride 1), got stride {}; call .contiguous() \
             first",
            t.strides[0]
        )));
    }
    if t.device != q.device {
        return Err(ArgError::value_error(format!(
            "{name}: expected a tensor on {} (q's device), got a tensor on {}",
            q.device, t.device
        )));
    }
    Ok(Offsets {
        ptr: t.ptr,
        len: t.shape[0] as usize,
    })
}

/// The packed `[total, heads, headdim]` tensor `t` as one batch, `[1, total, heads, headdim]`
/// of the same memory (the BSHD tensor `flash_attn_func` takes).
pub(crate) fn one_batch(t: &TensorInfo) -> TensorInfo {
    let s = &t.strides;
    TensorInfo {
        shape: vec![1, t.shape[0], t.shape[1], t.shape[2]],
        strides: vec![t.shape[0].max(1) * s[0], s[0], s[1], s[2]],
        dtype: t.dtype.clone(),
        device: t.device.clone(),
        ptr: t.ptr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{ErrorKind, TorchDevice};

    /// A contiguous packed `[total, h, d]` bf16 tensor on cuda:0.
    fn packed(total: i64, h: i64, d: i64) -> TensorInfo {
        TensorInfo {
            shape: vec![total, h, d],
            strides: vec![h * d, d, 1],
            dtype: TorchDType::Bf16,
            device: TorchDevice::Cuda(0),
            ptr: 0x7f00_0000_0000,
        }
    }

    /// A 1-D int32 offsets tensor of `n` entries on cuda:0.
    fn offsets(n: i64) -> TensorInfo {
        TensorInfo {
            shape: vec![n],
            strides: vec![1],
            dtype: TorchDType::Other("torch.int32".into()),
            device: TorchDevice::Cuda(0),
            ptr: 0x7f10_0000_0000,
        }
    }

    fn call(
        q: &TensorInfo,
        k: &TensorInfo,
        cu: (&TensorInfo, &TensorInfo),
        max: (i64, i64),
        opts: &Options,
    ) -> Result<VarlenPlan, ArgError> {
        plan_varlen((q, k, k), q, cu, max, opts)
    }

    #[test]
    fn used_lengths_are_one_per_sequence_and_pick_the_used_kernel() {
        let (q, k, cu) = (packed(300, 4, 64), packed(500, 2, 64), offsets(3));
        let opts = Options::default();
        let plan = |uq: &TensorInfo, uk: &TensorInfo| {
            let used = Some((uq, uk));
            plan_varlen_used_at(
                (&q, &k, &k),
                &q,
                (&cu, &cu),
                used,
                (200, 250),
                &opts,
                Place::Cuda,
            )
        };
        let p = plan(&offsets(2), &offsets(2)).expect("two sequences, two lengths each");
        let (uq, uk) = p.used.expect("used lengths");
        assert_eq!((uq.len, uk.len), (2, 2));
        assert_eq!(
            call(&q, &k, (&cu, &cu), (200, 250), &opts)
                .expect("plain")
                .used,
            None
        );
        let e = plan(&offsets(3), &offsets(2)).expect_err("one per sequence");
        assert_eq!(
            e.message,
            "seqused_q: expected 2 lengths (one per sequence), got 3"
        );
        let mut wide = offsets(2);
        wide.dtype = TorchDType::Other("torch.int64".into());
        let e = plan(&offsets(2), &wide).expect_err("int32");
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.message
                .starts_with("seqused_k: expected dtype torch.int32"),
            "{e}"
        );
    }

    #[test]
    fn the_batch_is_one_launch_over_the_packed_memory() {
        let (q, k) = (packed(310, 4, 64), packed(500, 2, 64));
        let (cu_q, cu_k) = (offsets(5), offsets(5));
        let p = call(&q, &k, (&cu_q, &cu_k), (200, 250), &Options::default()).expect("valid");
        assert_eq!((p.batch, p.max_seqlen_q), (4, 200));
        assert_eq!(
            p.cu_q,
            Offsets {
                ptr: cu_q.ptr,
                len: 5
            }
        );
        let plan = &p.plan;
        assert_eq!((plan.batch, plan.seqlen_q, plan.seqlen_k), (1, 310, 500));
        assert_eq!(plan.kv_group, 2);
        // q's rows as the BHSD view [1, heads, total, d] of the same memory.
        assert_eq!(plan.q.ptr, q.ptr);
        assert_eq!(plan.q.shape, [1, 4, 310, 64]);
        assert_eq!(plan.q.strides, [310 * 256, 64, 256, 1]);
        assert_eq!(p.out.shape, [1, 4, 310, 64]);
        assert!(p.launches());
        assert_eq!(p.lse_shape, None, "no log-sum-exp asked for");
    }

    #[test]
    fn empty_and_keyless_batches_launch_nothing() {
        let (cu, o) = (offsets(3), Options::default());
        let empty = call(
            &packed(0, 4, 64),
            &packed(80, 2, 64),
            (&cu, &cu),
            (0, 80),
            &o,
        );
        assert!(!empty.expect("valid").launches(), "no query rows");
        let (q, k) = (packed(100, 4, 64), packed(80, 2, 64));
        let blocks = call(&q, &k, (&cu, &cu), (0, 80), &o).expect("valid");
        assert!(!blocks.launches(), "max_seqlen_q = 0: no query block");
        let keyless = call(&q, &packed(0, 2, 64), (&cu, &cu), (100, 0), &o).expect("valid");
        assert!(keyless.keyless() && !keyless.launches());
    }

    #[test]
    fn the_log_sum_exp_is_nheads_by_every_packed_row() {
        // FlashAttention-2's varlen shape: q's rows, the 10 past the last offset included.
        let (q, k, cu) = (packed(310, 4, 64), packed(500, 2, 64), offsets(3));
        let opts = Options {
            return_lse: true,
            ..Options::default()
        };
        let p = call(&q, &k, (&cu, &cu), (200, 250), &opts).expect("valid");
        assert_eq!(p.lse_shape, Some([4, 310]));
        assert!(p.plan.return_lse);
    }

    #[test]
    fn windows_are_normalised_by_max_seqlen_k() {
        // Right bound 60 >= max_seqlen_k = 60 is unbounded; 59 stays, though it may be above
        // a sequence's keys (FlashAttention normalises by the maximum).
        let (q, k, cu) = (packed(100, 2, 64), packed(100, 2, 64), offsets(3));
        for (right, want) in [(60, -1), (59, 59)] {
            let opts = Options {
                window_size: (5, right),
                ..Options::default()
            };
            let p = call(&q, &k, (&cu, &cu), (100, 60), &opts).expect("valid");
            assert_eq!(p.plan.window, (5, want));
        }
    }

    #[test]
    fn bad_offsets_and_lengths_name_the_argument() {
        let (q, k, o) = (packed(100, 2, 64), packed(80, 2, 64), Options::default());
        let msg = |cu: (&TensorInfo, &TensorInfo), max| {
            call(&q, &k, cu, max, &o).expect_err("bad").message
        };
        let (two, three) = (offsets(2), offsets(3));
        assert!(
            msg((&two, &three), (100, 80)).starts_with("cu_seqlens_k: expected batch + 1 offsets")
        );
        assert!(msg((&offsets(1), &offsets(1)), (100, 80)).contains("at least 2"));
        assert!(msg((&two, &two), (100, -1)).starts_with("max_seqlen_k: expected a length"));
        assert!(msg((&two, &two), (1 << 31, 80)).starts_with("max_seqlen_q: expected a length"));
        let many = offsets(65537);
        assert_eq!(
            msg((&many, &many), (100, 80)),
            "cu_seqlens_q: batch 65536 is above the most kiln launches (65535)"
        );
        let mut strided = offsets(3);
        strided.strides = vec![2];
        assert!(
            msg((&strided, &three), (100, 80))
                .starts_with("cu_seqlens_q: expected a contiguous tensor (stride 1), got stride 2")
        );
    }

    #[test]
    fn shapes_and_offset_tensors_are_checked() {
        let (q, k, o) = (packed(100, 2, 64), packed(80, 2, 64), Options::default());
        let cu = offsets(2);
        let mut q4 = q.clone();
        q4.shape.push(1);
        q4.strides.push(1);
        let e = call(&q4, &k, (&cu, &cu), (100, 80), &o).expect_err("4-D");
        assert_eq!(
            e.message,
            "q: expected a 3-D tensor [total_q, nheads, headdim], got shape [100, 2, 64, 1]"
        );
        let mut cu64 = offsets(2);
        cu64.dtype = TorchDType::Other("torch.int64".into());
        let e = call(&q, &k, (&cu64, &cu), (100, 80), &o).expect_err("int64");
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(
            e.message,
            "cu_seqlens_q: expected dtype torch.int32, got torch.int64"
        );
        let mut cpu = offsets(2);
        cpu.device = TorchDevice::Other("cpu".into());
        let e = call(&q, &k, (&cu, &cpu), (100, 80), &o).expect_err("cpu");
        assert!(
            e.message
                .starts_with("cu_seqlens_k: expected a tensor on cuda:0"),
            "{e}"
        );
        let e = plan_varlen((&q, &k, &k), &k, (&cu, &cu), (100, 80), &o).expect_err("out");
        assert_eq!(
            e.message,
            "out: expected shape [100, 2, 64] (q's, v's head dim), got [80, 2, 64]"
        );
        // The packed tensors' other checks are flash_attn_func's.
        let k3 = packed(80, 3, 64);
        let e = call(&q, &k3, (&cu, &cu), (100, 80), &o).expect_err("heads");
        assert!(e.message.contains("must be a multiple"), "{e}");
    }
}
