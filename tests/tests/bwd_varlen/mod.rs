//! A packed varlen batch for attention's backward kernels, shared by the interpreter tests
//! (`interp_attention_backward.rs`) and the GPU tests (`gpu_attention_backward.rs`): each
//! sequence's dense problem and reference gradients, the packed `[1, heads, total, d]`
//! inputs with every row no block may read NaN, and the check of the packed gradients
//! against each sequence's own (with used lengths, `seqused_q` and `seqused_k`: its dense
//! backward over the used rows and keys, the rest of its gradients 0).

#![allow(dead_code)]

use kiln_examples::attention_backward::AttentionBwdParams;
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, assert_within_rule};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference::{self, AttentionDims, AttentionMath, Rounding};

/// A packed varlen batch: each sequence's `(query rows, keys)`, and rows past the last one
/// in the packed tensors (poisoned in the outputs: no block may write them).
#[derive(Clone, Debug)]
pub struct Packed {
    pub seqs: Vec<(usize, usize)>,
    pub pad: (usize, usize),
}

impl Packed {
    pub fn totals(&self) -> (usize, usize) {
        let (q, k): (Vec<usize>, Vec<usize>) = self.seqs.iter().copied().unzip();
        (
            q.iter().sum::<usize>() + self.pad.0,
            k.iter().sum::<usize>() + self.pad.1,
        )
    }

    /// The longest sequence's `(query rows, keys)`: what the grids cover.
    pub fn longest(&self) -> (usize, usize) {
        let q = self.seqs.iter().map(|s| s.0).max().unwrap_or(0);
        let k = self.seqs.iter().map(|s| s.1).max().unwrap_or(0);
        (q, k)
    }

    /// The offsets `cu_seqlens_q`, `cu_seqlens_k` as i32 tensors.
    pub fn offsets(&self) -> (HostTensor, HostTensor) {
        let cu = |len: fn(&(usize, usize)) -> usize| {
            let mut at = 0;
            let v: Vec<f64> = std::iter::once(0.0)
                .chain(self.seqs.iter().map(|s| {
                    at += len(s);
                    at as f64
                }))
                .collect();
            HostTensor::from_fn(&[v.len()], DType::I32, |i| v[i])
        };
        (cu(|s| s.0), cu(|s| s.1))
    }

    /// `[1, heads, total, d]` holding sequence `i`'s `[heads, len_i, d]` part at its rows
    /// (`query` rows or keys), the pad rows `fill`.
    pub fn pack(
        &self,
        parts: &[Vec<f64>],
        heads: usize,
        d: usize,
        query: bool,
        dtype: DType,
        fill: f64,
    ) -> HostTensor {
        let total = if query {
            self.totals().0
        } else {
            self.totals().1
        };
        let len = |s: &(usize, usize)| if query { s.0 } else { s.1 };
        let mut data = vec![fill; heads * total * d];
        let mut start = 0;
        for (s, part) in self.seqs.iter().zip(parts) {
            let n = len(s);
            for h in 0..heads {
                for r in 0..n {
                    for x in 0..d {
                        data[(h * total + start + r) * d + x] = part[(h * n + r) * d + x];
                    }
                }
            }
            start += n;
        }
        HostTensor::from_fn(&[1, heads, total, d], dtype, |i| data[i])
    }
}

/// One packed backward problem: the comptime parameters, the packed inputs, and each
/// sequence's reference gradients.
pub struct Problem {
    pub packed: Packed,
    pub p: AttentionBwdParams,
    pub h: usize,
    pub h_kv: usize,
    pub scale: f32,
    /// `q, k, v, dout, o, lse`, packed (`lse` `[1, h, total_q]`).
    pub inputs: [HostTensor; 6],
    pub cu_q: HostTensor,
    pub cu_k: HostTensor,
    /// `seqused_q`, `seqused_k` (`[batch]`, i32) when the problem has used lengths.
    pub used: Option<(HostTensor, HostTensor)>,
    /// Per sequence: exact `dq, dk, dv`, then those of the rounded computation.
    want: Vec<[Vec<f64>; 6]>,
}

impl Problem {
    /// Fresh inputs from `dist` for `h` query heads over `h_kv` key/value heads and `p`'s
    /// features; `o` and `lse` the reference forward's. Rows no block may read are NaN: the
    /// pad rows, and the unread inputs of the sequences without keys or queries
    /// ([`poison_unread`]).
    pub fn new(
        rng: &mut Rng,
        packed: Packed,
        p: AttentionBwdParams,
        heads: (usize, usize),
        dist: Dist,
    ) -> Problem {
        Problem::with_used(rng, packed, None, p, heads, dist)
    }

    /// [`Problem::new`] where sequence `i` uses only its first `used[i]` `(query rows, keys)`
    /// (FlashAttention 3's `seqused_q`, `seqused_k`; at most its lengths): its reference is the
    /// dense backward over those, its other rows' and keys' gradients 0, and its inputs past
    /// them (which the forward never wrote or read) NaN.
    pub fn with_used(
        rng: &mut Rng,
        packed: Packed,
        used: Option<Vec<(usize, usize)>>,
        p: AttentionBwdParams,
        (h, h_kv): (usize, usize),
        dist: Dist,
    ) -> Problem {
        let (d, dv, dtype) = (p.d, p.value_dim(), p.dtype);
        let right = if p.causal { 0 } else { p.window_right };
        let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
        let math = AttentionMath {
            scale: f64::from(scale),
            window: reference::Window {
                left: i64::from(p.window_left),
                right: i64::from(right),
                chunk: i64::from(p.attention_chunk),
            },
            cap: (p.softcap > 0.0).then_some(f64::from(p.softcap)),
        };
        let mut parts: Vec<[Vec<f64>; 6]> = Vec::new();
        let mut want = Vec::new();
        for (i, &(sq, sk)) in packed.seqs.iter().enumerate() {
            let (uq, uk) = used.as_ref().map_or((sq, sk), |u| u[i]);
            let dims = AttentionDims {
                b: 1,
                h,
                h_kv,
                sq: uq,
                sk: uk,
                d,
            };
            let q = tensor(rng, &[1, h, uq, d], dtype, dist).to_f64_vec();
            let dout = tensor(rng, &[1, h, uq, dv], dtype, dist).to_f64_vec();
            let k = tensor(rng, &[1, h_kv, uk, d], dtype, dist).to_f64_vec();
            let v = tensor(rng, &[1, h_kv, uk, dv], dtype, dist).to_f64_vec();
            let o = reference::attention_forward_f64_dv([&q, &k, &v], dims, dv, math);
            let o = HostTensor::from_fn(&[1, h, uq, dv], dtype, |i| o[i]).to_f64_vec();
            let lse = reference::attention_lse_f64(&q, &k, dims, math);
            let at =
                |r| reference::attention_backward_f64_dv([&q, &k, &v, &dout], dims, dv, math, r);
            let (exact, rounded) = (at(Rounding::Exact), at(Rounding::Stored(dtype)));
            // Rows and keys past the used ones: inputs NaN, gradients 0.
            let rows = |x: &[f64], w, fill| grow(x, (h, uq, sq), w, fill);
            let keys = |x: &[f64], w, fill| grow(x, (h_kv, uk, sk), w, fill);
            want.push([
                rows(&exact.dq, d, 0.0),
                keys(&exact.dk, d, 0.0),
                keys(&exact.dv, dv, 0.0),
                rows(&rounded.dq, d, 0.0),
                keys(&rounded.dk, d, 0.0),
                keys(&rounded.dv, dv, 0.0),
            ]);
            let nan = f64::NAN;
            parts.push([
                rows(&q, d, nan),
                keys(&k, d, nan),
                keys(&v, dv, nan),
                rows(&dout, dv, nan),
                rows(&o, dv, nan),
                rows(&lse, 1, nan),
            ]);
        }
        poison_unread(&packed, &mut parts);
        let part = |i: usize| -> Vec<Vec<f64>> { parts.iter().map(|p| p[i].clone()).collect() };
        let total_q = packed.totals().0;
        let nan = f64::NAN;
        let lse = packed.pack(&part(5), h, 1, true, DType::F32, nan);
        let inputs = [
            packed.pack(&part(0), h, d, true, dtype, nan),
            packed.pack(&part(1), h_kv, d, false, dtype, nan),
            packed.pack(&part(2), h_kv, dv, false, dtype, nan),
            packed.pack(&part(3), h, dv, true, dtype, nan),
            packed.pack(&part(4), h, dv, true, dtype, nan),
            HostTensor::from_fn(&[1, h, total_q], DType::F32, |i| lse.data.get_f64(i)),
        ];
        let (cu_q, cu_k) = packed.offsets();
        let used = used.map(|u| {
            let lens = |f: fn(&(usize, usize)) -> usize| {
                HostTensor::from_fn(&[u.len()], DType::I32, |i| f(&u[i]) as f64)
            };
            (lens(|x| x.0), lens(|x| x.1))
        });
        Problem {
            packed,
            p,
            h,
            h_kv,
            scale,
            inputs,
            cu_q,
            cu_k,
            used,
            want,
        }
    }

    /// The grids of the row kernels (preprocess, dQ conversion), of the dK/dV kernel and of
    /// the deterministic dQ kernel.
    pub fn grids(&self) -> [[u32; 3]; 3] {
        let (max_q, max_k) = self.packed.longest();
        let b = self.packed.seqs.len();
        [
            self.p.query_grid([max_q, self.h, b]),
            self.p.key_grid([max_k, self.h_kv, b]),
            self.p.dq_grid([max_q, self.h, b]),
        ]
    }

    /// Shape of `dv` (as v: `dv` wide).
    pub fn value_shape(&self) -> [usize; 4] {
        [1, self.h_kv, self.packed.totals().1, self.p.value_dim()]
    }

    /// Shapes of `delta`, `dq_accum` and `dq` (as q), and `dk` (as k).
    pub fn output_shapes(&self) -> ([usize; 3], [usize; 4], [usize; 4]) {
        let (tq, tk) = self.packed.totals();
        let d = self.p.d;
        ([1, self.h, tq], [1, self.h, tq, d], [1, self.h_kv, tk, d])
    }

    /// Checks the packed gradients against each sequence's, with FlashAttention's rule; the
    /// pad rows must still be poisoned (NaN).
    pub fn check(&self, kernel: &str, rng: &Rng, dist: Dist, [dq, dk, dv]: [&HostTensor; 3]) {
        let (h, h_kv, d, d_v) = (self.h, self.h_kv, self.p.d, self.p.value_dim());
        let case = Case {
            kernel: format!("{kernel} {:?}", self.p),
            shape: format!(
                "seqs {:?} h={h} h_kv={h_kv} d={d} scale={}",
                self.packed.seqs, self.scale
            ),
            dist,
            seed: rng.seed(),
        };
        for (name, got, i, heads, width, query) in [
            ("dq", dq, 0, h, d, true),
            ("dk", dk, 1, h_kv, d, false),
            ("dv", dv, 2, h_kv, d_v, false),
        ] {
            let pack = |j: usize| {
                let parts: Vec<Vec<f64>> = self.want.iter().map(|w| w[j].clone()).collect();
                self.packed
                    .pack(&parts, heads, width, query, DType::F32, f64::NAN)
                    .to_f64_vec()
            };
            let (exact, rounded) = (pack(i), pack(i + 3));
            let got = got.to_f64_vec();
            let pad_untouched = got
                .iter()
                .zip(&exact)
                .filter(|(_, e)| e.is_nan())
                .all(|(g, _)| g.is_nan());
            assert!(pad_untouched, "{case}: {name} wrote a pad row");
            let keep = |v: &[f64]| -> Vec<f64> {
                v.iter()
                    .zip(&exact)
                    .filter(|(_, e)| !e.is_nan())
                    .map(|(x, _)| *x)
                    .collect()
            };
            let kept = keep(&got);
            let got = HostTensor::from_fn(&[kept.len()], DType::F32, |j| kept[j]);
            assert_within_rule(
                &case,
                name,
                &got,
                &keep(&exact),
                &keep(&rounded),
                self.p.dtype,
            );
        }
    }
}

/// `[heads, used, w]` data `x` as `[heads, len, w]`, the rows past `used` `fill`.
fn grow(x: &[f64], (heads, used, len): (usize, usize, usize), w: usize, fill: f64) -> Vec<f64> {
    let mut out = vec![fill; heads * len * w];
    for hd in 0..heads {
        let (from, to) = (hd * used * w, hd * len * w);
        out[to..to + used * w].copy_from_slice(&x[from..from + used * w]);
    }
    out
}

/// Makes NaN the inputs of each sequence that no gradient reads (`[q, k, v, dout, o, lse]`
/// per sequence): the queries, `dout` and `o` of one with no keys (its dq is 0), the keys and
/// values of one with no queries (its dk and dv are 0). Beside other sequences' rows, they
/// show a block reading past its own sequence's end as NaN.
fn poison_unread(packed: &Packed, parts: &mut [[Vec<f64>; 6]]) {
    for (&(sq, sk), p) in packed.seqs.iter().zip(parts) {
        let unread: &[usize] = match (sq, sk) {
            (_, 0) => &[0, 3, 4],
            (0, _) => &[1, 2],
            _ => &[],
        };
        for &i in unread {
            p[i].fill(f64::NAN);
        }
    }
}
