//! `flash_attn_varlen_func`'s arguments: packed `[total, heads, headdim]` tensors and the
//! `cu_seqlens_q` / `cu_seqlens_k` offsets, checked and planned as one [`Plan`] per sequence
//! over views of the packed memory (no copy). Each sequence's query and output view ends at
//! that sequence's last row, so the kernel's edge masking (and on sm_90a the TMA store's
//! clipping at its tensor map's extent) keeps every store inside the sequence.
//!
//! The log-sum-exp, when asked for, is FlashAttention-2's varlen one: a `[nheads, total_q]`
//! f32 tensor, sequence `i`'s rows being columns `cu_q[i]..cu_q[i + 1]`; each launch writes
//! them through a view of those columns ([`crate::launch::Lse::rows`], no copy). A sequence
//! without keys has `+inf` there, as `flash_attn_func` gives every row that sees no key.
//!
//! One launch per sequence, not one for the batch: the DSL has no scalar load to read a
//! sequence's offsets in the kernel, nor tensor bounds that vary per block, which a single
//! varlen launch needs. The offsets are read on the host (a device synchronisation in the
//! extension, `cu_seqlens.tolist()`).

use crate::args::{
    ArgError, Options, Plan, TensorInfo, TorchDType, View, check_out, plan_windowed,
};

/// A checked varlen call: each sequence's plan and the view of `out` it writes.
#[derive(Clone, Debug, PartialEq)]
pub struct VarlenPlan {
    /// Every sequence with query rows and keys, in batch order.
    pub sequences: Vec<Sequence>,
    /// `(first row, rows)` of `out` for each sequence with query rows but no key: their
    /// output is 0 and their log-sum-exp `+inf`, which the extension writes without a launch
    /// (a tensor map cannot have an extent of 0).
    pub zero_rows: Vec<(usize, usize)>,
    /// `[nheads, total_q]`, the log-sum-exp's shape, when the call returns it.
    pub lse_shape: Option<[usize; 2]>,
}

/// One sequence's launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    /// Its first row in the packed tensors (`cu_seqlens_q[i]`), and so its first column of
    /// the log-sum-exp.
    pub first: usize,
    /// Its plan, over views of its rows of q, k and v (`plan.seqlen_q` rows from `first`).
    pub plan: Plan,
    /// The BHSD view of its rows of `out`.
    pub out: View,
}

/// Checks a `flash_attn_varlen_func` call (q: `[total_q, nheads, headdim]`, k and v:
/// `[total_k, nheads_k, headdim]`, `out` as q; `cu_q`, `cu_k`: the values of
/// `cu_seqlens_q`, `cu_seqlens_k`, whose tensors `cu_q_info`, `cu_k_info` must be int32 on
/// q's device) and plans one launch per sequence. Window bounds of at least `max_seqlen_k`
/// are unbounded, as FlashAttention normalises them. With `opts.return_lse`, the plan's
/// [`VarlenPlan::lse_shape`] is `[nheads, total_q]`, `total_q` being q's rows (as
/// FlashAttention's, rows past the last offset included, which no launch writes).
#[allow(clippy::too_many_arguments)]
pub fn plan_varlen(
    (q, k, v): (&TensorInfo, &TensorInfo, &TensorInfo),
    out: &TensorInfo,
    (cu_q_info, cu_k_info): (&TensorInfo, &TensorInfo),
    (cu_q, cu_k): (&[i64], &[i64]),
    (max_seqlen_q, max_seqlen_k): (i64, i64),
    opts: &Options,
) -> Result<VarlenPlan, ArgError> {
    for (name, t, total) in [
        ("q", q, "total_q"),
        ("k", k, "total_k"),
        ("v", v, "total_k"),
    ] {
        let heads = if name == "q" { "nheads" } else { "nheads_k" };
        if t.shape.len() != 3 || t.strides.len() != 3 || t.shape.iter().any(|&n| n < 0) {
            return Err(ArgError::value_error(format!(
                "{name}: expected a 3-D tensor [{total}, {heads}, headdim], got shape {:?}",
                t.shape
            )));
        }
    }
    check_offsets_tensor("cu_seqlens_q", cu_q_info, q)?;
    check_offsets_tensor("cu_seqlens_k", cu_k_info, q)?;
    if cu_q.len() != cu_k.len() || cu_q.len() < 2 {
        return Err(ArgError::value_error(format!(
            "cu_seqlens_k: expected batch + 1 offsets, as many as cu_seqlens_q ({}), at least 2, \
             got {}",
            cu_q.len(),
            cu_k.len()
        )));
    }
    for (name, cu, total, max, max_name) in [
        (
            "cu_seqlens_q",
            cu_q,
            q.shape[0],
            max_seqlen_q,
            "max_seqlen_q",
        ),
        (
            "cu_seqlens_k",
            cu_k,
            k.shape[0],
            max_seqlen_k,
            "max_seqlen_k",
        ),
    ] {
        check_offsets(name, cu, total)?;
        if !(0..=i64::from(i32::MAX)).contains(&max) {
            return Err(ArgError::value_error(format!(
                "{max_name}: expected a length in 0..={}, got {max}",
                i32::MAX
            )));
        }
        if let Some((i, len)) = lengths(cu).enumerate().find(|&(_, len)| len > max) {
            return Err(ArgError::value_error(format!(
                "{max_name}: sequence {i} has {len} rows, more than {max_name} = {max}"
            )));
        }
    }
    if k.shape != v.shape {
        return Err(ArgError::value_error(format!(
            "v: expected the shape of k {:?}, got {:?}",
            k.shape, v.shape
        )));
    }
    let want_out = q.shape.clone();
    if out.shape != want_out {
        return Err(ArgError::value_error(format!(
            "out: expected shape {want_out:?} (q's), got {:?}",
            out.shape
        )));
    }
    let (mut sequences, mut zero_rows) = (Vec::new(), Vec::new());
    for i in 0..cu_q.len() - 1 {
        let (sq, sk) = (cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]);
        let (qs, ks, vs, os) = (
            sequence(q, cu_q[i], sq),
            sequence(k, cu_k[i], sk),
            sequence(v, cu_k[i], sk),
            sequence(out, cu_q[i], sq),
        );
        let plan = plan_windowed(&qs, &ks, &vs, opts, Some(max_seqlen_k))?;
        let view = check_out(&plan, &qs, &os)?;
        if plan.is_empty() {
            continue;
        }
        let first = cu_q[i] as usize;
        if plan.seqlen_k == 0 {
            zero_rows.push((first, plan.seqlen_q));
        } else {
            sequences.push(Sequence {
                first,
                plan,
                out: view,
            });
        }
    }
    Ok(VarlenPlan {
        sequences,
        zero_rows,
        lse_shape: opts
            .return_lse
            .then(|| [q.shape[1], q.shape[0]].map(|n| n as usize)),
    })
}

/// The offsets tensor `t` (argument `name`) must be a 1-D torch.int32 tensor on q's device:
/// what the extension checks before it reads the values.
pub fn check_offsets_tensor(name: &str, t: &TensorInfo, q: &TensorInfo) -> Result<(), ArgError> {
    if t.dtype != TorchDType::Other("torch.int32".into()) {
        return Err(ArgError::type_error(format!(
            "{name}: expected dtype torch.int32, got {}",
            t.dtype
        )));
    }
    if t.shape.len() != 1 {
        return Err(ArgError::value_error(format!(
            "{name}: expected a 1-D tensor [batch + 1], got shape {:?}",
            t.shape
        )));
    }
    if t.device != q.device {
        return Err(ArgError::value_error(format!(
            "{name}: expected a tensor on {} (q's device), got a tensor on {}",
            q.device, t.device
        )));
    }
    Ok(())
}

/// `cu` must start at 0, never decrease, and end within the packed tensor's `total` rows.
fn check_offsets(name: &str, cu: &[i64], total: i64) -> Result<(), ArgError> {
    let last = cu[cu.len() - 1];
    if cu[0] != 0 || cu.windows(2).any(|w| w[1] < w[0]) || last > total {
        return Err(ArgError::value_error(format!(
            "{name}: expected offsets from 0, non-decreasing, ending at most at the packed \
             tensor's {total} rows, got {cu:?}"
        )));
    }
    Ok(())
}

/// The sequence lengths of offsets `cu`.
fn lengths(cu: &[i64]) -> impl Iterator<Item = i64> + '_ {
    cu.windows(2).map(|w| w[1] - w[0])
}

/// Rows `start..start + len` of the packed `[total, heads, headdim]` tensor `t` as a 4-D
/// `[1, len, heads, headdim]` tensor of the same memory (its element size: 2 bytes, the
/// dtypes [`plan_windowed`] accepts; anything else it rejects by name first).
fn sequence(t: &TensorInfo, start: i64, len: i64) -> TensorInfo {
    let elem_bytes = 2;
    let s = &t.strides;
    TensorInfo {
        shape: vec![1, len, t.shape[1], t.shape[2]],
        strides: vec![len.max(1) * s[0], s[0], s[1], s[2]],
        dtype: t.dtype.clone(),
        device: t.device.clone(),
        ptr: t.ptr.wrapping_add((start * s[0] * elem_bytes) as u64),
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
        cu: (&[i64], &[i64]),
        max: (i64, i64),
    ) -> Result<VarlenPlan, ArgError> {
        let n = cu.0.len() as i64;
        plan_varlen(
            (q, k, k),
            q,
            (&offsets(n), &offsets(cu.1.len() as i64)),
            cu,
            max,
            &Options::default(),
        )
    }

    #[test]
    fn each_sequence_is_a_view_of_the_packed_memory() {
        let (q, k) = (packed(310, 4, 64), packed(500, 2, 64));
        let p = call(
            &q,
            &k,
            (&[0, 100, 100, 300, 310], &[0, 50, 250, 500, 500]),
            (200, 250),
        )
        .expect("valid");
        // The empty second query sequence launches nothing; the last has no key: its 10
        // rows are zeroed, not launched.
        assert_eq!(p.sequences.len(), 2);
        assert_eq!(p.zero_rows, [(300, 10)]);
        let (first, out) = (&p.sequences[0].plan, &p.sequences[0].out);
        assert_eq!(p.sequences[0].first, 0);
        assert_eq!(
            (first.seqlen_q, first.seqlen_k, first.kv_group),
            (100, 50, 2)
        );
        assert_eq!(first.q.ptr, q.ptr);
        assert_eq!(out.shape, [1, 4, 100, 64]);
        let (third, out) = (&p.sequences[1].plan, &p.sequences[1].out);
        assert_eq!(p.sequences[1].first, 100);
        assert_eq!((third.seqlen_q, third.seqlen_k), (200, 250));
        assert_eq!(third.q.ptr, q.ptr + 100 * 4 * 64 * 2);
        assert_eq!(third.k.ptr, k.ptr + 250 * 2 * 64 * 2);
        assert_eq!(third.q.strides, [200 * 256, 64, 256, 1]);
        assert_eq!(out.ptr, q.ptr + 100 * 4 * 64 * 2);
        // The view ends at the sequence's last row: the kernel masks the next one's rows.
        assert_eq!(out.shape[2], 200);
        assert_eq!(p.lse_shape, None, "no log-sum-exp asked for");
    }

    #[test]
    fn the_log_sum_exp_is_nheads_by_every_packed_row() {
        // FlashAttention-2's varlen shape: q's rows, the 10 past the last offset included.
        let (q, k) = (packed(310, 4, 64), packed(500, 2, 64));
        let p = plan_varlen(
            (&q, &k, &k),
            &q,
            (&offsets(3), &offsets(3)),
            (&[0, 100, 300], &[0, 250, 500]),
            (200, 250),
            &Options {
                return_lse: true,
                ..Options::default()
            },
        )
        .expect("valid");
        assert_eq!(p.lse_shape, Some([4, 310]));
        assert!(p.sequences.iter().all(|s| s.plan.return_lse));
    }

    #[test]
    fn windows_are_normalised_by_max_seqlen_k() {
        // Right bound 60 >= max_seqlen_k = 60 is unbounded; 59 stays, though it is above
        // this sequence's 40 keys (FlashAttention normalises by the maximum).
        let (q, k) = (packed(100, 2, 64), packed(100, 2, 64));
        for (right, want) in [(60, -1), (59, 59)] {
            let p = plan_varlen(
                (&q, &k, &k),
                &q,
                (&offsets(3), &offsets(3)),
                (&[0, 100, 100], &[0, 40, 100]),
                (100, 60),
                &Options {
                    window_size: (5, right),
                    ..Options::default()
                },
            )
            .expect("valid");
            assert_eq!(p.sequences[0].plan.window, (5, want));
        }
    }

    #[test]
    fn bad_offsets_and_lengths_name_the_argument() {
        let (q, k) = (packed(100, 2, 64), packed(80, 2, 64));
        let msg = |cu: (&[i64], &[i64]), max| call(&q, &k, cu, max).expect_err("bad").message;
        assert!(
            msg((&[1, 100], &[0, 80]), (100, 80))
                .starts_with("cu_seqlens_q: expected offsets from 0")
        );
        assert!(
            msg((&[0, 60, 50], &[0, 40, 80]), (100, 80))
                .starts_with("cu_seqlens_q: expected offsets")
        );
        assert!(
            msg((&[0, 100], &[0, 81]), (100, 81)).starts_with("cu_seqlens_k: expected offsets")
        );
        assert!(
            msg((&[0, 100], &[0, 40, 80]), (100, 80))
                .starts_with("cu_seqlens_k: expected batch + 1 offsets")
        );
        assert!(msg((&[0], &[0]), (100, 80)).contains("at least 2"));
        assert_eq!(
            msg((&[0, 100], &[0, 80]), (99, 80)),
            "max_seqlen_q: sequence 0 has 100 rows, more than max_seqlen_q = 99"
        );
        assert!(
            msg((&[0, 100], &[0, 80]), (100, -1)).starts_with("max_seqlen_k: expected a length")
        );
    }

    #[test]
    fn shapes_and_offset_tensors_are_checked() {
        let (q, k) = (packed(100, 2, 64), packed(80, 2, 64));
        let cu: (&[i64], &[i64]) = (&[0, 100], &[0, 80]);
        let mut q4 = q.clone();
        q4.shape.push(1);
        q4.strides.push(1);
        let e = call(&q4, &k, cu, (100, 80)).expect_err("4-D");
        assert_eq!(
            e.message,
            "q: expected a 3-D tensor [total_q, nheads, headdim], got shape [100, 2, 64, 1]"
        );
        let mut cu64 = offsets(2);
        cu64.dtype = TorchDType::Other("torch.int64".into());
        let e = plan_varlen(
            (&q, &k, &k),
            &q,
            (&cu64, &offsets(2)),
            cu,
            (100, 80),
            &Options::default(),
        )
        .expect_err("int64");
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(
            e.message,
            "cu_seqlens_q: expected dtype torch.int32, got torch.int64"
        );
        let mut cpu = offsets(2);
        cpu.device = TorchDevice::Other("cpu".into());
        let e = plan_varlen(
            (&q, &k, &k),
            &q,
            (&offsets(2), &cpu),
            cu,
            (100, 80),
            &Options::default(),
        )
        .expect_err("cpu");
        assert!(
            e.message
                .starts_with("cu_seqlens_k: expected a tensor on cuda:0"),
            "{e}"
        );
        let e = plan_varlen(
            (&q, &k, &k),
            &k,
            (&offsets(2), &offsets(2)),
            cu,
            (100, 80),
            &Options::default(),
        )
        .expect_err("out");
        assert_eq!(
            e.message,
            "out: expected shape [100, 2, 64] (q's), got [80, 2, 64]"
        );
        // Per-sequence checks are flash_attn_func's.
        let k3 = packed(80, 3, 64);
        let e = call(&q, &k3, cu, (100, 80)).expect_err("heads");
        assert!(e.message.contains("must be a multiple"), "{e}");
    }
}
