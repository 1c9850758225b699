//! f64 reference implementations. Each reads its inputs as stored (already rounded to their
//! dtype) and computes in f64, so the only error left to measure is the kernel's.
//! Results are flat row-major vectors in the output's natural shape.

use kiln_ir::{DType, HostTensor};

use crate::check::{sum_tolerance, tolerance};

/// `a + b` elementwise (same shape).
pub fn vector_add(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| x + y)
        .collect()
}

/// Softmax of each row of a 2-D tensor `[rows, cols]`.
pub fn softmax_rows(x: &HostTensor) -> Vec<f64> {
    let cols = x.shape[1];
    let v = x.to_f64_vec();
    let mut out = Vec::with_capacity(v.len());
    for row in v.chunks(cols) {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|&a| (a - m).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|&a| a / s));
    }
    out
}

/// `a @ b` for `a: [m, k]`, `b: [k, n]`, giving `[m, n]`.
pub fn gemm(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for kk in 0..k {
            let x = av[i * k + kk];
            for j in 0..n {
                out[i * n + j] += x * bv[kk * n + j];
            }
        }
    }
    out
}

/// `a @ bt^T` for `a: [m, k]`, `bt: [n, k]` (B stored column-major), giving `[m, n]`.
pub fn gemm_bt(a: &HostTensor, bt: &HostTensor) -> Vec<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], bt.shape[0]);
    let (av, bv) = (a.to_f64_vec(), bt.to_f64_vec());
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|kk| av[i * k + kk] * bv[j * k + kk]).sum();
        }
    }
    out
}

/// Attention forward: `softmax(scale * q k^T) v` per batch and head, for `q: [b, h, sq, d]`,
/// `k, v: [b, h, sk, d]`, giving `[b, h, sq, d]`. With `causal`, query `i` sees keys
/// `j <= i + sk - sq` (bottom-right aligned, as FlashAttention-2); a row that sees no key
/// outputs 0.
pub fn attention(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    attention_all(q, k, v, scale, causal_window(causal), None)
}

/// Attention as FlashAttention-2 computes it with a sliding window and a soft-cap: query `i`
/// sees key `j` iff `i + sk - sq - left <= j <= i + sk - sq + right` (a negative bound is
/// unbounded; causal is `(-1, 0)`), scores `scale * q.k`, soft-capped to `cap * tanh(s /
/// cap)` when `cap` is given; a row that sees no key outputs 0.
pub fn attention_window(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: f64,
    window: impl Into<Window>,
    cap: Option<f64>,
) -> Vec<f64> {
    attention_all(q, k, v, scale, window.into(), cap)
}

/// The window of a causal (`(-1, 0)`) or unmasked (`(-1, -1)`) call.
fn causal_window(causal: bool) -> Window {
    Window::from(if causal { (-1, 0) } else { (-1, -1) })
}

/// The keys a query row sees: `left` before and `right` after its diagonal key `i + sk - sq`
/// (a negative bound unbounded; causal is `(-1, 0)`), and with `chunk > 0` (FlashAttention
/// 3's `attention_chunk`) only the keys `j` with `floor(j / chunk) = floor(diag / chunk)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Keys before the diagonal; negative: all.
    pub left: i64,
    /// Keys after the diagonal; negative: all.
    pub right: i64,
    /// Keys per chunk; 0: no chunks.
    pub chunk: i64,
}

impl From<(i64, i64)> for Window {
    fn from((left, right): (i64, i64)) -> Window {
        Window {
            left,
            right,
            chunk: 0,
        }
    }
}

impl Window {
    /// The keys (of `sk`) the row with diagonal key `diag` sees.
    pub fn keys(self, diag: i64, sk: usize) -> std::ops::Range<usize> {
        let mut lo = if self.left >= 0 { diag - self.left } else { 0 };
        let mut hi = if self.right >= 0 {
            diag + self.right + 1
        } else {
            sk as i64
        };
        if self.chunk > 0 {
            let start = diag.div_euclid(self.chunk) * self.chunk;
            (lo, hi) = (lo.max(start), hi.min(start + self.chunk));
        }
        let (lo, hi) = (lo.max(0), hi.min(sk as i64));
        lo as usize..hi.max(lo) as usize
    }
}

/// Attention with the logit soft-cap of Gemma 2: scores `cap * tanh(scale * q.k / cap)`,
/// then [`attention`] (not causal).
pub fn attention_softcap(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: f64,
    cap: f64,
) -> Vec<f64> {
    attention_all(q, k, v, scale, Window::from((-1, -1)), Some(cap))
}

/// Every output row of [`attention_window`].
fn attention_all(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: f64,
    window: Window,
    cap: Option<f64>,
) -> Vec<f64> {
    let [b, h, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let sk = k.shape[2];
    let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let mut out = Vec::with_capacity(b * h * sq * d);
    for bh in 0..b * h {
        let (qb, kb, vb) = (&qv[bh * sq * d..], &kv[bh * sk * d..], &vv[bh * sk * d..]);
        for i in 0..sq {
            out.extend(attention_row_by(
                |j, x| qb[j * d + x],
                |j, x| kb[j * d + x],
                |j, x| vb[j * d + x],
                [sq, sk, d],
                (scale, cap),
                window,
                i,
            ));
        }
    }
    out
}

/// Row `[b, h, i]` of [`attention`]'s output (`d` values), reading the inputs in place through
/// their strides: benchmarks check sampled rows of outputs too large for the whole reference.
pub fn attention_row(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: f64,
    causal: bool,
    [b, h, i]: [usize; 3],
) -> Vec<f64> {
    let at = |t: &HostTensor, j: usize, x: usize| t.data.get_f64(t.offset(&[b, h, j, x]));
    attention_row_by(
        |j, x| at(q, j, x),
        |j, x| at(k, j, x),
        |j, x| at(v, j, x),
        [q.shape[2], k.shape[2], q.shape[3]],
        (scale, None),
        causal_window(causal),
        i,
    )
}

/// The keys query `i` sees ([`Window::keys`] of its diagonal key `i + sk - sq`) and their
/// scores, `scale * q.k` soft-capped to `cap * tanh(s / cap)` when a cap is given.
fn row_scores(
    q: impl Fn(usize, usize) -> f64,
    k: impl Fn(usize, usize) -> f64,
    [sq, sk, d]: [usize; 3],
    (scale, cap): (f64, Option<f64>),
    window: Window,
    i: usize,
) -> (std::ops::Range<usize>, Vec<f64>) {
    let keys = window.keys(i as i64 + sk as i64 - sq as i64, sk);
    let scores = keys
        .clone()
        .map(|j| scale * (0..d).map(|x| q(i, x) * k(j, x)).sum::<f64>())
        .map(|s| cap.map_or(s, |c| c * (s / c).tanh()))
        .collect();
    (keys, scores)
}

/// Output row `i` of one (batch, head) of attention, with element `x` of row `j` of q, k and
/// v read by the given functions, over the keys and scores of [`row_scores`]; a row that sees
/// no key is 0. The one implementation behind [`attention`], [`attention_window`],
/// [`attention_softcap`] and [`attention_row`].
fn attention_row_by(
    q: impl Fn(usize, usize) -> f64,
    k: impl Fn(usize, usize) -> f64,
    v: impl Fn(usize, usize) -> f64,
    dims: [usize; 3],
    scaling: (f64, Option<f64>),
    window: Window,
    i: usize,
) -> Vec<f64> {
    let d = dims[2];
    let (keys, scores) = row_scores(q, k, dims, scaling, window, i);
    if keys.is_empty() {
        return vec![0.0; d];
    }
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let l: f64 = p.iter().sum();
    let mut o = vec![0.0; d];
    for (j, pj) in keys.zip(&p) {
        for (x, ox) in o.iter_mut().enumerate() {
            *ox += pj * v(j, x);
        }
    }
    o.iter_mut().for_each(|x| *x /= l);
    o
}

/// The log-sum-exp of every score row of [`attention_window`], `[b, h, sq]`: `ln sum_j
/// e^(s_j)` over the keys the row sees (natural log, soft-capped scores when `cap` is given),
/// `+inf` for a row that sees no key (FlashAttention-2's value).
pub fn attention_lse(
    q: &HostTensor,
    k: &HostTensor,
    scale: f64,
    window: impl Into<Window>,
    cap: Option<f64>,
) -> Vec<f64> {
    let window = window.into();
    let [b, h, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let sk = k.shape[2];
    let (qv, kv) = (q.to_f64_vec(), k.to_f64_vec());
    let mut out = Vec::with_capacity(b * h * sq);
    for bh in 0..b * h {
        let (qb, kb) = (&qv[bh * sq * d..], &kv[bh * sk * d..]);
        for i in 0..sq {
            let (keys, scores) = row_scores(
                |j, x| qb[j * d + x],
                |j, x| kb[j * d + x],
                [sq, sk, d],
                (scale, cap),
                window,
                i,
            );
            out.push(if keys.is_empty() {
                f64::INFINITY
            } else {
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln()
            });
        }
    }
    out
}

/// An epilogue activation of `gemm_bias_act`, computed in f64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// The identity.
    None,
    /// `max(x, 0)`.
    Relu,
    /// GELU in its tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
    /// (what the kernel computes; the exact `erf` form differs from it by up to about 1e-3).
    GeluTanh,
    /// `x / (1 + e^-x)`.
    Silu,
}

impl Activation {
    /// Every activation, in the kernel's `act` numbering (0, 1, 2, 3).
    pub const ALL: [Activation; 4] = [
        Activation::None,
        Activation::Relu,
        Activation::GeluTanh,
        Activation::Silu,
    ];

    /// The activation of `x`.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::None => x,
            Activation::Relu => x.max(0.0),
            Activation::GeluTanh => {
                // 0.5 (1 + tanh(u)) = sigmoid(2u).
                let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
                x * sigmoid(2.0 * u)
            }
            Activation::Silu => x * sigmoid(x),
        }
    }
}

/// `1 / (1 + e^-x)`, with the kernels' exponential: `e^-|x|` below f32's normal range is 0 (the
/// DSL's `exp`, as the GPU's fast exponential), so far below 0 the sigmoid is 0, not a
/// subnormal-scaled tiny number that no f32 kernel could produce.
fn sigmoid(x: f64) -> f64 {
    let e = (-x.abs()).exp();
    let e = if e < f64::from(f32::MIN_POSITIVE) {
        0.0
    } else {
        e
    };
    if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

/// `act(ab + bias)` for the `[m, n]` product `ab` (from [`gemm`] or [`gemm_bt`]) and
/// `bias: [n]` added to every row.
pub fn bias_act(ab: &[f64], bias: &HostTensor, act: Activation) -> Vec<f64> {
    let bias = bias.to_f64_vec();
    ab.iter()
        .enumerate()
        .map(|(i, &x)| act.apply(x + bias[i % bias.len()]))
        .collect()
}

/// The tolerance of `act(a @ B + bias)` computed with an f32 accumulator (`B` is `b`, or `b^T`
/// when `b_col_major`; `ab` its f64 product) against its f64 reference, for an output of
/// `dtype`: `dtype`'s own, plus
/// what the accumulator's rounding becomes through the activation. An f32 sum of `k + 1` terms
/// errs by up to [`sum_tolerance`]`(k + 1)` of the sum of its terms' magnitudes, whatever its
/// value: where the terms cancel (an output near 0 from products near 1, as all-equal inputs
/// can give), that is a large error relative to the output which no f32 accumulation avoids.
/// So that share is scaled by the activation's slope at each element and its terms'
/// magnitudes, against the output's norm; elsewhere it is far below `dtype`'s tolerance.
pub fn bias_act_tolerance(
    (a, b, b_col_major): (&HostTensor, &HostTensor, bool),
    ab: &[f64],
    bias: &HostTensor,
    act: Activation,
    dtype: DType,
) -> f64 {
    let abs = |t: &HostTensor| {
        let v = t.to_f64_vec();
        HostTensor::from_fn(&t.shape, DType::F32, |i| v[i].abs())
    };
    let magnitudes = if b_col_major {
        gemm_bt(&abs(a), &abs(b))
    } else {
        gemm(&abs(a), &abs(b))
    };
    let bias = bias.to_f64_vec();
    let n = bias.len();
    let slope = |x: f64| {
        let h = 1e-6 * x.abs().max(1.0);
        ((act.apply(x + h) - act.apply(x - h)) / (2.0 * h)).abs()
    };
    let (mut carried, mut out) = (0.0, 0.0);
    for (i, (&x, &m)) in ab.iter().zip(&magnitudes).enumerate() {
        let x = x + bias[i % n];
        carried += (slope(x) * (m + bias[i % n].abs())).powi(2);
        out += act.apply(x).powi(2);
    }
    let k = a.shape[1];
    if out == 0.0 {
        // An all-zero reference is compared by absolute error: `dtype`'s tolerance alone.
        return tolerance(dtype);
    }
    tolerance(dtype) + sum_tolerance(k + 1) * (carried / out).sqrt()
}

/// `alpha * ab + beta * c` for the `[m, n]` product `ab` and `c: [m, n]`.
pub fn alpha_beta(ab: &[f64], c: &HostTensor, alpha: f64, beta: f64) -> Vec<f64> {
    ab.iter()
        .zip(c.to_f64_vec())
        .map(|(&x, c)| alpha * x + beta * c)
        .collect()
}

/// The class of row `r` of cross-entropy targets `target: [m, w]` (column 0, the low word
/// of an int64 index when `w = 2`), or `None` when the row is ignored: negative, or
/// `ignore_index`.
pub fn cross_entropy_class(target: &HostTensor, r: usize, ignore_index: i32) -> Option<usize> {
    let t = target.data.get_f64(r * target.shape[1]);
    (t >= 0.0 && t != f64::from(ignore_index)).then_some(t as usize)
}

/// Per-row cross-entropy of logits `x: [m, v]` against `target` ([`cross_entropy_class`];
/// an ignored row gives loss 0): `(loss, lse)`.
pub fn cross_entropy(
    x: &HostTensor,
    target: &HostTensor,
    ignore_index: i32,
) -> (Vec<f64>, Vec<f64>) {
    let v = x.shape[1];
    let xs = x.to_f64_vec();
    let mut loss = Vec::new();
    let mut lse = Vec::new();
    for (r, row) in xs.chunks(v).enumerate() {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let l = m + row.iter().map(|&a| (a - m).exp()).sum::<f64>().ln();
        loss.push(cross_entropy_class(target, r, ignore_index).map_or(0.0, |t| l - row[t]));
        lse.push(l);
    }
    (loss, lse)
}

/// The gradient with respect to the logits of `sum_r g[r] loss[r]` ([`cross_entropy`]):
/// `(softmax(x) - onehot(target)) * g`, ignored rows 0.
pub fn cross_entropy_backward(
    x: &HostTensor,
    target: &HostTensor,
    ignore_index: i32,
    g: &[f64],
) -> Vec<f64> {
    let v = x.shape[1];
    let p = softmax_rows(x);
    p.chunks(v)
        .enumerate()
        .flat_map(|(r, row)| {
            let t = cross_entropy_class(target, r, ignore_index);
            let d = if t.is_some() { g[r] } else { 0.0 };
            row.iter()
                .enumerate()
                .map(move |(c, &pc)| (pc - f64::from(u8::from(t == Some(c)))) * d)
        })
        .collect()
}

/// Softmax's backward: `y * (dy - rowsum(dy * y))` for `y, dy: [m, n]`.
pub fn softmax_backward(y: &HostTensor, dy: &HostTensor) -> Vec<f64> {
    let n = y.shape[1];
    let (ys, ds) = (y.to_f64_vec(), dy.to_f64_vec());
    ys.chunks(n)
        .zip(ds.chunks(n))
        .flat_map(|(yr, dr)| {
            let s: f64 = yr.iter().zip(dr).map(|(a, b)| a * b).sum();
            yr.iter()
                .zip(dr)
                .map(move |(a, b)| a * (b - s))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The terms [`softmax_backward`]'s elements are made of, `|y| (|dy| + sum |y dy|)`: what
/// its error is measured against (`dy - sum y dy` cancels where `y` is near 1).
pub fn softmax_backward_terms(y: &HostTensor, dy: &HostTensor) -> Vec<f64> {
    let n = y.shape[1];
    let abs = |t: &HostTensor| t.to_f64_vec().into_iter().map(f64::abs).collect::<Vec<_>>();
    let (ys, ds) = (abs(y), abs(dy));
    ys.chunks(n)
        .zip(ds.chunks(n))
        .flat_map(|(yr, dr)| {
            let s: f64 = yr.iter().zip(dr).map(|(a, b)| a * b).sum();
            yr.iter().zip(dr).map(move |(a, b)| a * (b + s))
        })
        .collect()
}

/// Row statistics of layer norm over `x: [m, n]`: `(mean, rstd)` with `rstd =
/// 1 / sqrt(var + eps)` (biased variance), or RMS norm's `rstd = 1 / sqrt(mean(x^2) + eps)`
/// when `rms`.
pub fn norm_stats(x: &HostTensor, eps: f64, rms: bool) -> (Vec<f64>, Vec<f64>) {
    let n = x.shape[1];
    let xs = x.to_f64_vec();
    xs.chunks(n)
        .map(|row| {
            let mean = if rms {
                0.0
            } else {
                row.iter().sum::<f64>() / n as f64
            };
            let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n as f64;
            (mean, 1.0 / (var + eps).sqrt())
        })
        .unzip()
}

/// Layer norm's (or, with `rms`, RMS norm's) backward for `y = xhat * w (+ b)`:
/// `(dx [m, n], dw [n], db [n])` given the forward's `mean` and `rstd` (see [`norm_stats`];
/// `mean` is ignored when `rms`).
pub fn norm_backward(
    x: &HostTensor,
    w: &HostTensor,
    mean: &[f64],
    rstd: &[f64],
    dy: &HostTensor,
    rms: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = x.shape[1];
    let (xs, ws, ds) = (x.to_f64_vec(), w.to_f64_vec(), dy.to_f64_vec());
    let mut dx = Vec::with_capacity(xs.len());
    let (mut dw, mut db) = (vec![0.0; n], vec![0.0; n]);
    for (r, (xr, dr)) in xs.chunks(n).zip(ds.chunks(n)).enumerate() {
        let mu = if rms { 0.0 } else { mean[r] };
        let xhat: Vec<f64> = xr.iter().map(|a| (a - mu) * rstd[r]).collect();
        let g: Vec<f64> = dr.iter().zip(&ws).map(|(d, w)| d * w).collect();
        let c1 = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n as f64;
        let c2 = if rms {
            0.0
        } else {
            g.iter().sum::<f64>() / n as f64
        };
        for c in 0..n {
            dx.push((g[c] - xhat[c] * c1 - c2) * rstd[r]);
            dw[c] += dr[c] * xhat[c];
            db[c] += dr[c];
        }
    }
    (dx, dw, db)
}

/// Rotary embedding, rotate-half form, of `x: [b, s, h, d]` with `cos, sin: [s_ro, r / 2]`
/// at positions `t + offset` (see `kiln_examples::rotary`).
pub fn rotary(
    x: &HostTensor,
    cos: &HostTensor,
    sin: &HostTensor,
    r: usize,
    offset: usize,
) -> Vec<f64> {
    let [_, s, h, d] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let half = r / 2;
    let xs = x.to_f64_vec();
    let (cs, ss) = (cos.to_f64_vec(), sin.to_f64_vec());
    let mut out = xs.clone();
    for (row, chunk) in xs.chunks(d).enumerate() {
        let t = (row / h) % s + offset;
        for i in 0..half {
            let (c, sn) = (cs[t * half + i], ss[t * half + i]);
            let (a, b) = (chunk[i], chunk[i + half]);
            out[row * d + i] = a * c - b * sn;
            out[row * d + i + half] = b * c + a * sn;
        }
    }
    out
}

/// Layer norm of each row of `x: [rows, cols]` with weight and bias `w, b: [cols]`:
/// `(y, mean, rstd)`, `y = (x - mean) * rstd * w + b`, `rstd = 1/sqrt(var + eps)` (biased
/// variance, computed from the deviations).
pub fn layer_norm_rows(
    x: &HostTensor,
    w: &HostTensor,
    b: &HostTensor,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let cols = x.shape[1];
    let (v, w, b) = (x.to_f64_vec(), w.to_f64_vec(), b.to_f64_vec());
    let (mut y, mut means, mut rstds) = (Vec::with_capacity(v.len()), Vec::new(), Vec::new());
    for row in v.chunks(cols) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        y.extend((0..cols).map(|c| (row[c] - mean) * rstd * w[c] + b[c]));
        means.push(mean);
        rstds.push(rstd);
    }
    (y, means, rstds)
}

/// RMS norm of each row of `x: [rows, cols]` with weight `w: [cols]`: `(y, rstd)`,
/// `y = x * rstd * w`, `rstd = 1/sqrt(mean(x^2) + eps)`.
pub fn rms_norm_rows(x: &HostTensor, w: &HostTensor, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let cols = x.shape[1];
    let (v, w) = (x.to_f64_vec(), w.to_f64_vec());
    let (mut y, mut rstds) = (Vec::with_capacity(v.len()), Vec::new());
    for row in v.chunks(cols) {
        let ms = row.iter().map(|a| a * a).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (ms + eps).sqrt();
        y.extend((0..cols).map(|c| row[c] * rstd * w[c]));
        rstds.push(rstd);
    }
    (y, rstds)
}

/// The shape of one attention problem over flat row-major f64 data: `q, o, do: [b, h, sq, d]`,
/// `k, v: [b, h_kv, sk, d]`, query head `x` reading key/value head `x / (h / h_kv)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch.
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads (dividing `h`).
    pub h_kv: usize,
    /// Query rows.
    pub sq: usize,
    /// Keys.
    pub sk: usize,
    /// Head dim.
    pub d: usize,
}

/// What an attention problem computes beside its shape: scores `scale * q.k`, soft-capped to
/// `cap * tanh(s / cap)` when `cap` is given, masked to the `(left, right)` window of
/// [`attention_window`] (negative: unbounded; causal is `(-1, 0)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionMath {
    /// The score scale.
    pub scale: f64,
    /// The window (and chunks).
    pub window: Window,
    /// The soft-cap, if any.
    pub cap: Option<f64>,
}

/// Where [`attention_backward_f64`] rounds, as a 16-bit kernel stores its operands: nowhere
/// (the exact gradient), or to `dtype` at the output `o` the forward stores (which `delta`
/// is computed from), at `P` and `dS` before their products, and at the gradients stored. The rounded gradient's error
/// against the exact one is the yardstick of FlashAttention's test rule: a kernel passes
/// within twice it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// f64 throughout.
    Exact,
    /// `o`, `P`, `dS` and the gradients rounded to this dtype.
    Stored(kiln_ir::DType),
}

impl Rounding {
    fn apply(self, x: f64) -> f64 {
        match self {
            Rounding::Exact => x,
            Rounding::Stored(dtype) => HostTensor::from_fn(&[1], dtype, |_| x).data.get_f64(0),
        }
    }
}

/// The gradients of attention's inputs, flat row-major: `dq: [b, h, sq, d]`, `dk, dv: [b,
/// h_kv, sk, d]` (a key/value head's summed over the query heads of its group).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrads {
    /// `dL/dq`.
    pub dq: Vec<f64>,
    /// `dL/dk`.
    pub dk: Vec<f64>,
    /// `dL/dv`.
    pub dv: Vec<f64>,
}

/// Attention's output over f64 data (see [`AttentionDims`], [`AttentionMath`]): `[b, h, sq,
/// d]`, a row that sees no key 0. [`attention_window`] over slices, for finite differences.
pub fn attention_forward_f64(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: AttentionDims,
    math: AttentionMath,
) -> Vec<f64> {
    attention_forward_f64_dv([q, k, v], dims, dims.d, math)
}

/// [`attention_forward_f64`] with `v` and the output `dv` wide (`[b, h_kv, sk, dv]`, `[b, h,
/// sq, dv]`; FlashAttention 3's `headdim_v`) beside `dims.d` for `q` and `k`.
pub fn attention_forward_f64_dv(
    [q, k, v]: [&[f64]; 3],
    dims: AttentionDims,
    dv: usize,
    math: AttentionMath,
) -> Vec<f64> {
    let AttentionDims {
        b,
        h,
        h_kv,
        sq,
        sk,
        d,
    } = dims;
    let group = h / h_kv;
    let mut out = vec![0.0; b * h * sq * dv];
    for bh in 0..b * h {
        let kvh = bh / h * h_kv + bh % h / group;
        let (qb, kb, vb) = (&q[bh * sq * d..], &k[kvh * sk * d..], &v[kvh * sk * dv..]);
        for i in 0..sq {
            let Some((keys, _, p)) = row_probs((qb, kb), [sq, sk, d], math, i) else {
                continue;
            };
            let row = &mut out[(bh * sq + i) * dv..(bh * sq + i + 1) * dv];
            for (j, pj) in keys.zip(&p) {
                for (x, o) in row.iter_mut().enumerate() {
                    *o += pj * vb[j * dv + x];
                }
            }
        }
    }
    out
}

/// Row `i`'s keys ([`row_scores`] over `q` and `k` rows `qb`, `kb`), their scores and their
/// probabilities (the softmax over them), or None for a row that sees no key.
fn row_probs(
    (qb, kb): (&[f64], &[f64]),
    [sq, sk, d]: [usize; 3],
    math: AttentionMath,
    i: usize,
) -> Option<(std::ops::Range<usize>, Vec<f64>, Vec<f64>)> {
    let (keys, scores) = row_scores(
        |j, x| qb[j * d + x],
        |j, x| kb[j * d + x],
        [sq, sk, d],
        (math.scale, math.cap),
        math.window,
        i,
    );
    if keys.is_empty() {
        return None;
    }
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let l: f64 = e.iter().sum();
    let p = e.iter().map(|x| x / l).collect();
    Some((keys, scores, p))
}

/// The gradients of `L = sum(o * dout)` for attention's output `o` (the backward pass, given
/// `dout = dL/do`), derived directly: per row, `P = softmax(s)`, `dV += P^T dO`, `dP = dO
/// V^T`, `delta = rowsum(dO * O)`, `dS = P (dP - delta)`, times `1 - tanh^2(s_raw / cap)`
/// under a soft-cap, then `dQ = scale dS K` and `dK += scale dS^T Q`. A row that sees no key
/// contributes nothing (its `dq` is 0). `rounding` says where 16-bit values are rounded.
pub fn attention_backward_f64(
    qkvo: [&[f64]; 4],
    dims: AttentionDims,
    math: AttentionMath,
    rounding: Rounding,
) -> AttentionGrads {
    attention_backward_f64_dv(qkvo, dims, dims.d, math, rounding)
}

/// [`attention_backward_f64`] with `v`, `dout` and `dv` `dv` wide (`[.., dv]`; FlashAttention
/// 3's `headdim_v`) beside `dims.d` for `q`, `k` and their gradients.
pub fn attention_backward_f64_dv(
    [q, k, v, dout]: [&[f64]; 4],
    dims: AttentionDims,
    dv: usize,
    math: AttentionMath,
    rounding: Rounding,
) -> AttentionGrads {
    let AttentionDims {
        b,
        h,
        h_kv,
        sq,
        sk,
        d,
    } = dims;
    let group = h / h_kv;
    let mut g = AttentionGrads {
        dq: vec![0.0; b * h * sq * d],
        dk: vec![0.0; b * h_kv * sk * d],
        dv: vec![0.0; b * h_kv * sk * dv],
    };
    for bh in 0..b * h {
        let kvh = bh / h * h_kv + bh % h / group;
        let (qb, kb, vb) = (&q[bh * sq * d..], &k[kvh * sk * d..], &v[kvh * sk * dv..]);
        let dob = &dout[bh * sq * dv..];
        for i in 0..sq {
            let Some((keys, scores, p)) = row_probs((qb, kb), [sq, sk, d], math, i) else {
                continue;
            };
            let do_i = &dob[i * dv..(i + 1) * dv];
            // The output row as the forward stores it, and delta from it.
            let delta: f64 = (0..dv)
                .map(|x| {
                    let o: f64 = keys
                        .clone()
                        .zip(&p)
                        .map(|(j, pj)| pj * vb[j * dv + x])
                        .sum();
                    do_i[x] * rounding.apply(o)
                })
                .sum();
            for ((j, &pj), &s) in keys.clone().zip(&p).zip(&scores) {
                let dp: f64 = (0..dv).map(|x| do_i[x] * vb[j * dv + x]).sum();
                let ds = pj * (dp - delta);
                let ds = math.cap.map_or(ds, |c| ds * (1.0 - (s / c).powi(2)));
                let (pr, dsr) = (rounding.apply(pj), rounding.apply(ds));
                let dv_row = &mut g.dv[(kvh * sk + j) * dv..(kvh * sk + j + 1) * dv];
                for (g, o) in dv_row.iter_mut().zip(do_i) {
                    *g += pr * o;
                }
                for x in 0..d {
                    g.dk[(kvh * sk + j) * d + x] += math.scale * dsr * qb[i * d + x];
                    g.dq[(bh * sq + i) * d + x] += math.scale * dsr * kb[j * d + x];
                }
            }
        }
    }
    for x in g.dq.iter_mut().chain(&mut g.dk).chain(&mut g.dv) {
        *x = rounding.apply(*x);
    }
    g
}

/// The log-sum-exp of every score row of [`attention_forward_f64`], `[b, h, sq]`: natural log,
/// `+inf` for a row that sees no key ([`attention_lse`] over slices).
pub fn attention_lse_f64(
    q: &[f64],
    k: &[f64],
    dims: AttentionDims,
    math: AttentionMath,
) -> Vec<f64> {
    let AttentionDims {
        b,
        h,
        h_kv,
        sq,
        sk,
        d,
    } = dims;
    let group = h / h_kv;
    let mut out = Vec::with_capacity(b * h * sq);
    for bh in 0..b * h {
        let kvh = bh / h * h_kv + bh % h / group;
        let (qb, kb) = (&q[bh * sq * d..], &k[kvh * sk * d..]);
        for i in 0..sq {
            let (keys, scores) = row_scores(
                |j, x| qb[j * d + x],
                |j, x| kb[j * d + x],
                [sq, sk, d],
                (math.scale, math.cap),
                math.window,
                i,
            );
            out.push(if keys.is_empty() {
                f64::INFINITY
            } else {
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln()
            });
        }
    }
    out
}
