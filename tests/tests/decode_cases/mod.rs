//! The decode kernels' calls (`kiln_examples::attention_decode`), their inputs in
//! FlashAttention's layouts, the views the kernels read them through, and the f64 reference
//! of `flash_attn_with_kvcache`: the cache after the append, the output and the log-sum-exp.
//! Shared by the interpreter's and the GPU's tests.

#![allow(dead_code)]

use kiln_examples::attention_decode::{DecodeParams, ROTARY_HEADS};
use kiln_ir::{DType, HostTensor, TensorData};
use kiln_tests::check::{Case, as_stored, assert_close, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};

/// One `flash_attn_with_kvcache` call.
#[derive(Clone, Debug)]
pub struct Call {
    pub heads_k: usize,
    /// Query heads per key/value head.
    pub group: usize,
    pub d: usize,
    /// The value head dim (`headdim_v`) when it differs from `d`; 0: `d`.
    pub dv: usize,
    /// Query tokens per sequence.
    pub sq: usize,
    /// New keys and values per sequence, appended before the attention (0: none).
    pub s_new: usize,
    /// Each sequence's cache length before the append (its batch is `lens.len()`).
    pub lens: Vec<usize>,
    /// Each sequence's first key (`cache_leftpad`); empty: all 0.
    pub leftpad: Vec<usize>,
    /// Keys per page, or `None` for a dense cache.
    pub page: Option<usize>,
    /// A dense cache with more rows than sequences, sequence `b` in row `cache_batch_idx[b]`
    /// (a random permutation).
    pub batch_idx: bool,
    pub causal: bool,
    pub window: (i32, i32),
    /// Keys per chunk (`attention_chunk`, counted from the leftpad); 0: none.
    pub chunk: i32,
    pub softcap: f32,
    /// `(rotary_dim, interleaved)`.
    pub rotary: Option<(usize, bool)>,
    /// 1: `attention_decode`; more: `attention_decode_split` and the combine.
    pub splits: usize,
    pub dtype: DType,
}

impl Call {
    /// A dense, unmasked, unrotated bf16 call, one split.
    pub fn new(heads_k: usize, group: usize, d: usize, sq: usize, lens: &[usize]) -> Call {
        Call {
            heads_k,
            group,
            d,
            dv: 0,
            sq,
            s_new: 0,
            lens: lens.to_vec(),
            leftpad: Vec::new(),
            page: None,
            batch_idx: false,
            causal: false,
            window: (-1, -1),
            chunk: 0,
            softcap: 0.0,
            rotary: None,
            splits: 1,
            dtype: DType::Bf16,
        }
    }

    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    pub fn heads(&self) -> usize {
        self.heads_k * self.group
    }

    /// The head dim of the values and the output.
    pub fn dv(&self) -> usize {
        if self.dv == 0 { self.d } else { self.dv }
    }

    fn leftpad(&self, b: usize) -> usize {
        self.leftpad.get(b).copied().unwrap_or(0)
    }

    /// The longest sequence after the append.
    fn longest(&self) -> usize {
        self.lens.iter().max().copied().unwrap_or(0) + self.s_new
    }

    /// Keys per page (a dense cache: its length, longer than any sequence by a ragged margin).
    pub fn page_len(&self) -> usize {
        self.page.unwrap_or(self.longest() + 37)
    }

    /// Pages per sequence in the page table (one spare, pointing at a poisoned page).
    fn pages_per_seq(&self) -> usize {
        match self.page {
            Some(p) => self.longest().div_ceil(p) + 1,
            None => 1,
        }
    }

    /// Pages (or dense rows) of the cache.
    fn pages(&self) -> usize {
        match self.page {
            Some(_) => self.batch() * self.pages_per_seq() + 3,
            None if self.batch_idx => self.batch() + 2,
            None => self.batch(),
        }
    }

    pub fn params(&self) -> DecodeParams {
        let (rotary_dim, rotary_interleaved) = self.rotary.unwrap_or((0, true));
        DecodeParams {
            d: self.d,
            dv: self.dv,
            dtype: self.dtype,
            kv_group: self.group,
            page_size: self.page.unwrap_or(0),
            causal: self.causal,
            window_left: self.window.0,
            window_right: self.window.1,
            attention_chunk: self.chunk,
            softcap: self.softcap,
            rotary_dim,
            rotary_interleaved,
            ..DecodeParams::default()
        }
    }

    /// `cdiv(seqlen_q * kv_group, block_m)`.
    pub fn row_blocks(&self) -> usize {
        (self.sq * self.group).div_ceil(self.params().block_m)
    }

    pub fn append_grid(&self) -> [u32; 3] {
        let p = self.params();
        [
            self.s_new.div_ceil(p.block_rows) as u32,
            self.heads_k as u32,
            self.batch() as u32,
        ]
    }

    pub fn attention_grid(&self) -> [u32; 3] {
        [
            (self.splits * self.row_blocks()) as u32,
            (self.heads_k * self.params().value_blocks()) as u32,
            self.batch() as u32,
        ]
    }

    pub fn rotary_grid(&self) -> [u32; 3] {
        [
            self.sq as u32,
            self.batch() as u32,
            self.heads().div_ceil(ROTARY_HEADS) as u32,
        ]
    }

    pub fn combine_grid(&self) -> [u32; 3] {
        [
            self.heads().div_ceil(self.params().block_rows) as u32,
            self.sq as u32,
            self.batch() as u32,
        ]
    }

    pub fn case(&self, what: &str, dist: Dist, rng: &Rng) -> Case {
        Case {
            kernel: what.to_string(),
            shape: format!("{self:?}"),
            dist,
            seed: rng.seed(),
        }
    }

    /// Fresh inputs drawn from `dist`: the cache holds random keys and values up to each
    /// sequence's length and NaN everywhere else (past the length, in the spare pages),
    /// the page table is a random permutation of the pages.
    pub fn inputs(&self, rng: &mut Rng, dist: Dist) -> Inputs {
        let (b, hk, d, dt) = (self.batch(), self.heads_k, self.d, self.dtype);
        let dv = self.dv();
        let q = tensor(rng, &[b, self.sq, self.heads(), d], dt, dist);
        let k_new = tensor(rng, &[b, self.s_new, hk, d], dt, dist);
        let v_new = tensor(rng, &[b, self.s_new, hk, dv], dt, dist);
        let (pages, len) = (self.pages(), self.page_len());
        let mut k_cache = tensor(rng, &[pages, len, hk, d], dt, dist);
        let mut v_cache = tensor(rng, &[pages, len, hk, dv], dt, dist);
        let mut order: Vec<usize> = (0..pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.range(0, i + 1));
        }
        let pps = self.pages_per_seq();
        let table: Vec<usize> = match self.page {
            Some(_) => order[..b * pps].to_vec(),
            None if self.batch_idx => order[..b].to_vec(),
            None => (0..b).collect(),
        };
        let page_table = i32_tensor(&[b, pps], &table);
        // Poison every key slot no sequence holds (before its leftpad, past its length, the
        // spare pages).
        let mut held = vec![false; pages * len];
        for (s, &n) in self.lens.iter().enumerate() {
            for j in self.leftpad(s)..n {
                let (page, row) = (table[s * pps + j / len], j % len);
                held[page * len + row] = true;
            }
        }
        for (cache, width) in [(&mut k_cache, d), (&mut v_cache, dv)] {
            for (slot, _) in held.iter().enumerate().filter(|(_, h)| !**h) {
                for i in 0..hk * width {
                    cache.data.set_f64(slot * hk * width + i, f64::NAN);
                }
            }
        }
        let seqlens: Vec<usize> = self.lens.clone();
        let leftpad: Vec<usize> = (0..b).map(|s| self.leftpad(s)).collect();
        let (rows, half) = match self.rotary {
            Some((r, _)) => (self.longest() + self.sq + 3, r / 2),
            None => (1, 1),
        };
        let angles: Vec<f64> = (0..rows * half)
            .map(|_| rng.uniform(0.0, std::f64::consts::TAU))
            .collect();
        let cos = HostTensor::from_fn(&[rows, half], dt, |i| angles[i].cos());
        let sin = HostTensor::from_fn(&[rows, half], dt, |i| angles[i].sin());
        Inputs {
            q,
            k_new,
            v_new,
            k_cache,
            v_cache,
            page_table,
            seqlens: i32_tensor(&[b], &seqlens),
            leftpad: i32_tensor(&[b], &leftpad),
            cos,
            sin,
            table,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    /// The reference of the whole call on `x`: the caches after the append, the output
    /// `[batch, sq, heads, d]` and the log-sum-exp `[batch, heads, sq]` (`+inf` for a query
    /// that sees no key).
    pub fn reference(&self, x: &Inputs) -> Reference {
        let (b, hk, d, g) = (self.batch(), self.heads_k, self.d, self.group);
        let dv = self.dv();
        let (len, pps) = (self.page_len(), self.pages_per_seq());
        let slot = |s: usize, j: usize| (x.table[s * pps + j / len], j % len);
        let at = |t: &HostTensor, i: [usize; 4]| t.data.get_f64(t.offset(&i));
        // The append, with the new keys rotated at positions lens[s]..
        let mut k_cache = x.k_cache.clone();
        let mut v_cache = x.v_cache.clone();
        for s in 0..b {
            for t in 0..self.s_new {
                let pos = self.lens[s] + t;
                let (page, row) = slot(s, pos);
                for h in 0..hk {
                    let kx: Vec<f64> = (0..d).map(|c| at(&x.k_new, [s, t, h, c])).collect();
                    let kr = as_stored(&self.rope(&kx, pos, x), self.dtype);
                    for (c, &k) in kr.iter().enumerate() {
                        let o = k_cache.offset(&[page, row, h, c]);
                        k_cache.data.set_f64(o, k);
                    }
                    for c in 0..dv {
                        let o = v_cache.offset(&[page, row, h, c]);
                        v_cache.data.set_f64(o, at(&x.v_new, [s, t, h, c]));
                    }
                }
            }
        }
        let heads = self.heads();
        let mut out = vec![0.0; b * self.sq * heads * dv];
        let mut lse = vec![f64::INFINITY; b * heads * self.sq];
        let (left, right) = (self.window.0, if self.causal { 0 } else { self.window.1 });
        let chunk = i64::from(self.chunk);
        let local = left >= 0 || right >= 0 || chunk > 0;
        for s in 0..b {
            let sk = (self.lens[s] + self.s_new) as i64;
            let lp = self.leftpad(s) as i64;
            for t in 0..self.sq {
                let pos = self.lens[s] + if local { t } else { 0 };
                let diag = t as i64 + sk - self.sq as i64;
                // Chunks are counted from the leftpad (FlashAttention 3's keys start there).
                let same_chunk = |j: i64| {
                    chunk <= 0 || (j - lp).div_euclid(chunk) == (diag - lp).div_euclid(chunk)
                };
                let seen: Vec<usize> = (lp..sk)
                    .filter(|&j| left < 0 || j >= diag - i64::from(left))
                    .filter(|&j| right < 0 || j <= diag + i64::from(right))
                    .filter(|&j| same_chunk(j))
                    .map(|j| j as usize)
                    .collect();
                for h in 0..heads {
                    let qx: Vec<f64> = (0..d).map(|c| at(&x.q, [s, t, h, c])).collect();
                    let qr = if self.rotary.is_some() {
                        as_stored(&self.rope(&qx, pos, x), self.dtype)
                    } else {
                        qx
                    };
                    let scores: Vec<f64> = seen
                        .iter()
                        .map(|&j| {
                            let (page, row) = slot(s, j);
                            let dot: f64 = (0..d)
                                .map(|c| qr[c] * at(&k_cache, [page, row, h / g, c]))
                                .sum();
                            let z = dot * f64::from(x.scale);
                            if self.softcap > 0.0 {
                                let cap = f64::from(self.softcap);
                                cap * (z / cap).tanh()
                            } else {
                                z
                            }
                        })
                        .collect();
                    if scores.is_empty() {
                        continue;
                    }
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|z| (z - m).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    lse[(s * heads + h) * self.sq + t] = m + sum.ln();
                    for c in 0..dv {
                        let y: f64 = seen
                            .iter()
                            .zip(&w)
                            .map(|(&j, wj)| {
                                let (page, row) = slot(s, j);
                                wj * at(&v_cache, [page, row, h / g, c])
                            })
                            .sum();
                        out[((s * self.sq + t) * heads + h) * dv + c] = y / sum;
                    }
                }
            }
        }
        Reference {
            k_cache,
            v_cache,
            out,
            lse,
        }
    }

    /// `x` rotated at table row `pos` (FlashAttention's `apply_rotary_emb`), in f64.
    fn rope(&self, x: &[f64], pos: usize, inputs: &Inputs) -> Vec<f64> {
        let Some((r, interleaved)) = self.rotary else {
            return x.to_vec();
        };
        let half = r / 2;
        let table = |t: &HostTensor, i: usize| t.data.get_f64(t.offset(&[pos, i]));
        let mut y = x.to_vec();
        for i in 0..half {
            let (a, b) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (c, s) = (table(&inputs.cos, i), table(&inputs.sin, i));
            y[a] = x[a] * c - x[b] * s;
            y[b] = x[b] * c + x[a] * s;
        }
        y
    }

    /// Checks the kernels' results `got` against `want` for inputs drawn from `dist`.
    pub fn check(&self, case: &Case, want: &Reference, got: &Results) {
        check_cache(case, "k_cache", &got.k_cache, &want.k_cache, self.dtype);
        check_cache(case, "v_cache", &got.v_cache, &want.v_cache, self.dtype);
        assert_close(case, &got.out, &want.out, tolerance(self.dtype));
        let lse = got.lse.to_f64_vec();
        for (i, (&g, &w)) in lse.iter().zip(&want.lse).enumerate() {
            let ok = if w.is_finite() {
                (g - w).abs() <= 1e-4 * w.abs().max(1.0)
            } else {
                g == w
            };
            assert!(ok, "{case}: lse[{i}] = {g}, want {w}");
        }
        // A query that sees no key outputs exactly 0.
        let out = got.out.to_f64_vec();
        let d = self.dv();
        for (row, &w) in want.lse.iter().enumerate() {
            if w.is_infinite() {
                let (s, rest) = (
                    row / (self.heads() * self.sq),
                    row % (self.heads() * self.sq),
                );
                let (h, t) = (rest / self.sq, rest % self.sq);
                let o = ((s * self.sq + t) * self.heads() + h) * d;
                assert!(
                    out[o..o + d].iter().all(|&y| y == 0.0),
                    "{case}: query {t} of head {h}, sequence {s}, sees no key but outputs {:?}",
                    &out[o..o + 4]
                );
            }
        }
    }

    /// The key block of the attention kernels.
    pub fn block_n(&self) -> usize {
        self.params().key_block()
    }
}

/// A cache after the append equals the reference's: every slot bit for bit (NaN poison
/// included) but the rotated new keys, which may differ by one rounding of the dtype (the
/// kernel rotates in f32, the reference in f64).
fn check_cache(case: &Case, name: &str, got: &HostTensor, want: &HostTensor, dtype: DType) {
    let ulp = match dtype {
        DType::F16 => 2f64.powi(-10),
        _ => 2f64.powi(-7),
    };
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= ulp * b.abs();
        assert!(same, "{case}: {name}[{i}] = {a}, want {b}");
    }
}

/// The calls the interpreter and the GPU run: every feature in at least one, most of them
/// together.
pub fn calls() -> Vec<Call> {
    vec![
        // Dense, one query, no append: a sequence of 0 keys (no key at all) and one of 1.
        Call::new(2, 1, 64, 1, &[0, 1, 203]),
        // Paged by 16, GQA 4, 5 queries, causal, the append rotated half-split, 3 splits.
        Call {
            s_new: 5,
            page: Some(16),
            causal: true,
            rotary: Some((64, false)),
            splits: 3,
            dtype: DType::F16,
            ..Call::new(2, 4, 128, 5, &[77, 1, 130])
        },
        // Pages of one key, GQA 8, a left window, a soft-cap, interleaved rotary, 7 splits.
        Call {
            s_new: 1,
            page: Some(1),
            window: (20, -1),
            softcap: 30.0,
            rotary: Some((64, true)),
            splits: 7,
            ..Call::new(1, 8, 64, 1, &[0, 45, 150])
        },
        // Pages of 256, 5 queries, causal with a window (keyless rows: 1 key, 5 queries), a
        // leftpad, one pass.
        Call {
            page: Some(256),
            causal: true,
            window: (40, -1),
            leftpad: vec![0, 0, 17],
            ..Call::new(2, 1, 96, 5, &[1, 300, 290])
        },
        // Dense rows through cache_batch_idx, GQA 4, 5 new queries neither causal nor
        // windowed (so all at one rotary position), interleaved rotary of part of the head, 3
        // splits, d = 256.
        Call {
            s_new: 5,
            batch_idx: true,
            rotary: Some((64, true)),
            splits: 3,
            ..Call::new(1, 4, 256, 5, &[33, 0, 111])
        },
        // Multi-query: 16 heads on one key/value head, 5 queries, so 80 packed rows over two
        // row blocks whose windows differ; causal with a left window, dense, 3 splits.
        Call {
            s_new: 4,
            causal: true,
            window: (25, -1),
            splits: 3,
            ..Call::new(1, 16, 64, 5, &[60, 2, 140])
        },
        // MLA's head dims (keys 192, values 128: two value blocks of 64 columns), paged by
        // 16, GQA 4, causal, new keys rotated, 3 splits.
        Call {
            dv: 128,
            s_new: 3,
            page: Some(16),
            causal: true,
            rotary: Some((64, true)),
            splits: 3,
            ..Call::new(1, 4, 192, 4, &[50, 0, 97])
        },
        // Values wider than keys (64 / 128), dense with an append, one pass, f16.
        Call {
            dv: 128,
            s_new: 2,
            dtype: DType::F16,
            ..Call::new(2, 2, 64, 3, &[0, 21, 140])
        },
        // Values narrower than keys (256 / 128, two value blocks; 128 / 64), pages of one
        // key, a window, 5 splits.
        Call {
            dv: 128,
            page: Some(1),
            window: (30, -1),
            splits: 5,
            ..Call::new(1, 2, 256, 2, &[9, 66, 1])
        },
        Call {
            dv: 64,
            leftpad: vec![3, 0, 0],
            softcap: 20.0,
            ..Call::new(2, 1, 128, 5, &[40, 2, 100])
        },
        // Chunks (`attention_chunk`) counted from each sequence's leftpad: 5 causal queries
        // with an append, paged by 16, GQA 4, rotary at the queries' own positions, 3 splits;
        // then chunks with a left window wider than them, dense, one pass.
        Call {
            s_new: 2,
            page: Some(16),
            causal: true,
            chunk: 24,
            leftpad: vec![0, 7, 30],
            rotary: Some((64, false)),
            splits: 3,
            ..Call::new(2, 4, 64, 5, &[50, 3, 160])
        },
        Call {
            chunk: 40,
            window: (60, -1),
            leftpad: vec![0, 11],
            ..Call::new(1, 2, 128, 3, &[130, 95])
        },
        // Paged by 16 with a leftpad, a two-sided window and a soft-cap, f16, 7 splits, fewer
        // new keys than queries.
        Call {
            s_new: 3,
            page: Some(16),
            leftpad: vec![5, 0, 40],
            window: (30, 2),
            softcap: 15.0,
            splits: 7,
            dtype: DType::F16,
            ..Call::new(2, 4, 64, 5, &[18, 1, 231])
        },
    ]
}

/// A contiguous i32 tensor.
pub fn i32_tensor(shape: &[usize], values: &[usize]) -> HostTensor {
    let data = values.iter().map(|&v| v as i32).collect();
    HostTensor::new(shape, TensorData::I32(data)).expect("shape")
}

/// `t: [a, s, h, d]` (FlashAttention's layout) as the `[a, h, s, d]` view the kernels read.
pub fn heads_first(t: HostTensor) -> HostTensor {
    let [a, s, h, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    HostTensor {
        shape: vec![a, h, s, d],
        strides: vec![s * h * d, d, h * d, 1],
        data: t.data,
    }
}

/// The inverse of [`heads_first`].
pub fn seq_first(t: HostTensor) -> HostTensor {
    let [a, h, s, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    HostTensor {
        shape: vec![a, s, h, d],
        strides: vec![s * h * d, h * d, d, 1],
        data: t.data,
    }
}

/// A call's inputs, in FlashAttention's layouts.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub q: HostTensor,
    pub k_new: HostTensor,
    pub v_new: HostTensor,
    pub k_cache: HostTensor,
    pub v_cache: HostTensor,
    pub page_table: HostTensor,
    pub seqlens: HostTensor,
    pub leftpad: HostTensor,
    pub cos: HostTensor,
    pub sin: HostTensor,
    /// The page table's entries, row-major.
    pub table: Vec<usize>,
    pub scale: f32,
}

/// The reference of a call.
pub struct Reference {
    pub k_cache: HostTensor,
    pub v_cache: HostTensor,
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
}

/// What the kernels produced.
pub struct Results {
    pub k_cache: HostTensor,
    pub v_cache: HostTensor,
    pub out: HostTensor,
    pub lse: HostTensor,
}
