//! Packed variable-length attention batches (the example's `attention_varlen` kernels): the
//! offsets, fresh packed inputs, the kernels' grid, and the check of a
//! run's output (and log-sum-exp) against the f64 reference of each sequence on its own.
//!
//! The packed tensors have rows past the last sequence, poisoned in the outputs: no block may
//! write them, so the check finds them still NaN.

use kiln_ir::{DType, HostTensor, TensorData};

use crate::check::{Case, error_against, lse_terms, poisoned, tolerance};
use crate::inputs::{Dist, Rng, tensor};
use crate::reference;

/// One varlen call: the sequences, the packed tensors' heads and head dim, and the comptime
/// features.
#[derive(Clone, Debug)]
pub struct Varlen {
    /// `(query rows, keys)` of each sequence, in batch order (either may be 0).
    pub seqs: Vec<(usize, usize)>,
    /// Rows of the packed query and key tensors past the last sequence.
    pub pad: (usize, usize),
    /// Query heads.
    pub h: usize,
    /// Key/value heads (`h / h_kv` query heads share one).
    pub h_kv: usize,
    /// Head dimension.
    pub d: usize,
    /// Element type of q, k, v and the output.
    pub dtype: DType,
    /// Causal mask (aligned bottom-right in each sequence).
    pub causal: bool,
    /// The sliding window `(left, right)`, a negative bound unbounded.
    pub window: (i32, i32),
    /// The soft-cap (0: off).
    pub softcap: f32,
}

/// The inputs of one run: packed `[total, heads, d]` tensors (contiguous) and the offsets.
#[derive(Clone, Debug)]
pub struct Packed {
    /// `[total_q, h, d]`.
    pub q: HostTensor,
    /// `[total_k, h_kv, d]`.
    pub k: HostTensor,
    /// `[total_k, h_kv, d]`.
    pub v: HostTensor,
    /// `cu_seqlens_q`: i32 `[batch + 1]`.
    pub cu_q: HostTensor,
    /// `cu_seqlens_k`: i32 `[batch + 1]`.
    pub cu_k: HostTensor,
    /// The softmax scale.
    pub scale: f32,
}

impl Varlen {
    /// bf16, `d = 64`, two heads of their own, no mask or cap: what each test changes.
    pub fn new(seqs: &[(usize, usize)]) -> Varlen {
        Varlen {
            seqs: seqs.to_vec(),
            pad: (3, 5),
            h: 2,
            h_kv: 2,
            d: 64,
            dtype: DType::Bf16,
            causal: false,
            window: (-1, -1),
            softcap: 0.0,
        }
    }

    /// The offsets `cu_seqlens_q`, `cu_seqlens_k`.
    pub fn offsets(&self) -> (Vec<i32>, Vec<i32>) {
        let running = |len: fn(&(usize, usize)) -> usize| {
            std::iter::once(0)
                .chain(self.seqs.iter().scan(0, move |at, s| {
                    *at += len(s);
                    Some(*at)
                }))
                .map(|x| i32::try_from(x).expect("offsets fit in i32"))
                .collect()
        };
        (running(|s| s.0), running(|s| s.1))
    }

    /// Rows of the packed query and key tensors (the sequences' and the padding).
    pub fn totals(&self) -> (usize, usize) {
        let (q, k): (usize, usize) = (
            self.seqs.iter().map(|s| s.0).sum(),
            self.seqs.iter().map(|s| s.1).sum(),
        );
        (q + self.pad.0, k + self.pad.1)
    }

    /// Fresh inputs drawn from `dist` (the scale `1/sqrt(d)` perturbed, so no test depends on
    /// one exact value).
    pub fn inputs(&self, rng: &mut Rng, dist: Dist) -> Packed {
        let (tq, tk) = self.totals();
        let (cu_q, cu_k) = self.offsets();
        let offsets = |cu: Vec<i32>| {
            HostTensor::new(&[cu.len()], TensorData::I32(cu)).expect("an offsets tensor")
        };
        Packed {
            q: tensor(rng, &[tq, self.h, self.d], self.dtype, dist),
            k: tensor(rng, &[tk, self.h_kv, self.d], self.dtype, dist),
            v: tensor(rng, &[tk, self.h_kv, self.d], self.dtype, dist),
            cu_q: offsets(cu_q),
            cu_k: offsets(cu_k),
            scale: (rng.uniform(0.5, 1.5) / (self.d as f64).sqrt()) as f32,
        }
    }

    /// Poisoned outputs: `o` as q, `[total_q, h, d]`, and the log-sum-exp `[1, h, total_q]`
    /// (FlashAttention-2's `[nheads, total_q]` as the kernel's rank-3 tensor).
    pub fn outputs(&self) -> (HostTensor, HostTensor) {
        let tq = self.totals().0;
        (
            poisoned(&[tq, self.h, self.d], self.dtype),
            poisoned(&[1, self.h, tq], DType::F32),
        )
    }

    /// The grid, `(cdiv(max_seqlen_q, block_m), heads, batch)`.
    pub fn grid(&self, block_m: usize) -> [u32; 3] {
        let max_q = self.seqs.iter().map(|s| s.0).max().unwrap_or(0);
        [
            max_q.div_ceil(block_m) as u32,
            self.h as u32,
            self.seqs.len() as u32,
        ]
    }

    /// A case for the check's messages.
    pub fn case(&self, kernel: &str, dist: Dist, rng: &Rng) -> Case {
        Case {
            kernel: format!(
                "{kernel}<d={},{:?},causal={},window={:?},softcap={},kv_group={}>",
                self.d,
                self.dtype,
                self.causal,
                self.window,
                self.softcap,
                self.h / self.h_kv
            ),
            shape: format!(
                "seqs={:?} pad={:?} h={} h_kv={}",
                self.seqs, self.pad, self.h, self.h_kv
            ),
            dist,
            seed: rng.seed(),
        }
    }

    /// Checks output `o` (`[total_q, h, d]`) and, when given, log-sum-exp `lse` (`[1, h,
    /// total_q]`) of a run on `p`: each sequence's rows against the reference of that
    /// sequence alone (relative norm error over all of them; `+inf` log-sum-exp exactly where a
    /// row sees no key), the padding rows still poisoned.
    pub fn check(&self, case: &Case, p: &Packed, o: &HostTensor, lse: Option<&HostTensor>) {
        let (want_o, want_lse) = self.reference(p);
        let (got_o, got_lse) = (o.to_f64_vec(), lse.map(HostTensor::to_f64_vec));
        compare(case, "output", &got_o, &want_o, None, tolerance(self.dtype));
        if let Some(got) = got_lse {
            for (i, (g, w)) in got.iter().zip(&want_lse).enumerate() {
                assert_eq!(
                    *g == f64::INFINITY,
                    *w == f64::INFINITY,
                    "{case:?}: lse[{i}] = {g}, want {w}"
                );
            }
            let finite = |x: &[f64]| -> Vec<f64> {
                x.iter()
                    .zip(&want_lse)
                    .map(|(&x, w)| if *w == f64::INFINITY { 0.0 } else { x })
                    .collect()
            };
            let want = finite(&want_lse);
            let terms = lse_terms(&want);
            compare(
                case,
                "lse",
                &finite(&got),
                &want,
                Some(&terms),
                tolerance(DType::F32),
            );
        }
    }

    /// The expected output `[total_q, h, d]` and log-sum-exp `[h, total_q]`, NaN in the
    /// padding rows.
    fn reference(&self, p: &Packed) -> (Vec<f64>, Vec<f64>) {
        let (h, d, group) = (self.h, self.d, self.h / self.h_kv);
        let tq = self.totals().0;
        let (mut out, mut lse) = (vec![f64::NAN; tq * h * d], vec![f64::NAN; h * tq]);
        let right = if self.causal { 0 } else { self.window.1 };
        let window = (i64::from(self.window.0), i64::from(right));
        let cap = (self.softcap > 0.0).then_some(f64::from(self.softcap));
        let (cu_q, cu_k) = self.offsets();
        for (i, &(sq, sk)) in self.seqs.iter().enumerate() {
            let (q0, k0) = (cu_q[i] as usize, cu_k[i] as usize);
            // The sequence as a dense [1, h, s, d] tensor, head `hh` reading packed head
            // `hh / heads_per`.
            let dense = |t: &HostTensor, start: usize, s: usize, heads_per: usize| {
                HostTensor::from_fn(&[1, h, s, d], t.dtype(), |e| {
                    let (x, r, hh) = (e % d, e / d % s, e / (d * s));
                    t.data.get_f64(t.offset(&[start + r, hh / heads_per, x]))
                })
            };
            let q = dense(&p.q, q0, sq, 1);
            let (k, v) = (dense(&p.k, k0, sk, group), dense(&p.v, k0, sk, group));
            let scale = f64::from(p.scale);
            let o = reference::attention_window(&q, &k, &v, scale, window, cap);
            let l = reference::attention_lse(&q, &k, scale, window, cap);
            for hh in 0..h {
                for r in 0..sq {
                    let at = ((q0 + r) * h + hh) * d;
                    out[at..at + d].copy_from_slice(&o[(hh * sq + r) * d..][..d]);
                    lse[hh * tq + q0 + r] = l[hh * sq + r];
                }
            }
        }
        (out, lse)
    }
}

/// `got` against `want`: NaN exactly where `want` is (rows no block may write), elsewhere
/// within `tol` relative norm error, against the norm of `terms` where given (see
/// [`crate::check::assert_close_to_terms`]).
fn compare(case: &Case, what: &str, got: &[f64], want: &[f64], terms: Option<&[f64]>, tol: f64) {
    if let Some(i) = (0..want.len()).find(|&i| want[i].is_nan() != got[i].is_nan()) {
        panic!(
            "{case:?}: {what}[{i}] = {}, want {} (NaN: a padding row, never written)",
            got[i], want[i]
        );
    }
    let written: Vec<usize> = (0..want.len()).filter(|&i| !want[i].is_nan()).collect();
    let pick = |x: &[f64]| -> Vec<f64> { written.iter().map(|&i| x[i]).collect() };
    let (g, w) = (pick(got), pick(want));
    let err = error_against(&g, &w, &terms.map_or_else(|| w.clone(), pick));
    assert!(
        err < tol,
        "{case:?}: {what} relative error {err:.3e} (tolerance {tol:.1e})"
    );
}

/// `t: [total, heads, d]` as the kernels take it, `[1, heads, total, d]` through its strides
/// (the same elements).
pub fn bhsd(t: &HostTensor) -> HostTensor {
    let [total, heads, d] = [t.shape[0], t.shape[1], t.shape[2]];
    HostTensor {
        shape: vec![1, heads, total, d],
        strides: vec![total * heads * d, d, heads * d, 1],
        data: t.data.clone(),
    }
}

/// The elements of a [`bhsd`] view as the `[total, heads, d]` tensor they are.
pub fn packed(view: HostTensor) -> HostTensor {
    let [heads, total, d] = [view.shape[1], view.shape[2], view.shape[3]];
    HostTensor {
        shape: vec![total, heads, d],
        strides: vec![heads * d, d, 1],
        data: view.data,
    }
}
