//! A packed varlen batch for attention's backward kernels, shared by the interpreter tests
//! (`interp_attention_backward.rs`) and the GPU tests (`gpu_attention_backward.rs`): each
//! sequence's dense problem and reference gradients, the packed `[1, heads, total, d]`
//! inputs with every row no block may read NaN, and the check of the packed gradients
//! against each sequence's own.

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
        (h, h_kv): (usize, usize),
        dist: Dist,
    ) -> Problem {
        let (d, dtype) = (p.d, p.dtype);
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
        for &(sq, sk) in &packed.seqs {
            let dims = AttentionDims {
                b: 1,
                h,
                h_kv,
                sq,
                sk,
                d,
            };
            let [q, dout] = [0; 2].map(|_| tensor(rng, &[1, h, sq, d], dtype, dist).to_f64_vec());
            let [k, v] = [0; 2].map(|_| tensor(rng, &[1, h_kv, sk, d], dtype, dist).to_f64_vec());
            let o = reference::attention_forward_f64(&q, &k, &v, dims, math);
            let o = HostTensor::from_fn(&[1, h, sq, d], dtype, |i| o[i]).to_f64_vec();
            let lse = reference::attention_lse_f64(&q, &k, dims, math);
            let at = |r| reference::attention_backward_f64([&q, &k, &v, &dout], dims, math, r);
            let (exact, rounded) = (at(Rounding::Exact), at(Rounding::Stored(dtype)));
            want.push([
                exact.dq, exact.dk, exact.dv, rounded.dq, rounded.dk, rounded.dv,
            ]);
            parts.push([q, k, v, dout, o, lse]);
        }
        poison_unread(&packed, &mut parts);
        let part = |i: usize| -> Vec<Vec<f64>> { parts.iter().map(|p| p[i].clone()).collect() };
        let total_q = packed.totals().0;
        let nan = f64::NAN;
        let lse = packed.pack(&part(5), h, 1, true, DType::F32, nan);
        let inputs = [
            packed.pack(&part(0), h, d, true, dtype, nan),
            packed.pack(&part(1), h_kv, d, false, dtype, nan),
            packed.pack(&part(2), h_kv, d, false, dtype, nan),
            packed.pack(&part(3), h, d, true, dtype, nan),
            packed.pack(&part(4), h, d, true, dtype, nan),
            HostTensor::from_fn(&[1, h, total_q], DType::F32, |i| lse.data.get_f64(i)),
        ];
        let (cu_q, cu_k) = packed.offsets();
        Problem {
            packed,
            p,
            h,
            h_kv,
            scale,
            inputs,
            cu_q,
            cu_k,
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

    /// Shapes of `delta`, `dq_accum` and `dq` (as q), and `dk`, `dv` (as k).
    pub fn output_shapes(&self) -> ([usize; 3], [usize; 4], [usize; 4]) {
        let (tq, tk) = self.packed.totals();
        let d = self.p.d;
        ([1, self.h, tq], [1, self.h, tq, d], [1, self.h_kv, tk, d])
    }

    /// Checks the packed gradients against each sequence's, with FlashAttention's rule; the
    /// pad rows must still be poisoned (NaN).
    pub fn check(&self, kernel: &str, rng: &Rng, dist: Dist, [dq, dk, dv]: [&HostTensor; 3]) {
        let (h, h_kv, d) = (self.h, self.h_kv, self.p.d);
        let case = Case {
            kernel: format!("{kernel} {:?}", self.p),
            shape: format!(
                "seqs {:?} h={h} h_kv={h_kv} d={d} scale={}",
                self.packed.seqs, self.scale
            ),
            dist,
            seed: rng.seed(),
        };
        for (name, got, i, heads, query) in [
            ("dq", dq, 0, h, true),
            ("dk", dk, 1, h_kv, false),
            ("dv", dv, 2, h_kv, false),
        ] {
            let pack = |j: usize| {
                let parts: Vec<Vec<f64>> = self.want.iter().map(|w| w[j].clone()).collect();
                self.packed
                    .pack(&parts, heads, d, query, DType::F32, f64::NAN)
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
