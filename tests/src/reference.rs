//! f64 reference implementations. Each reads its inputs as stored (already rounded to their
//! dtype) and computes in f64, so the only error left to measure is the kernel's.
//! Results are flat row-major vectors in the output's natural shape.

use kiln_ir::HostTensor;

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
    let [b, h, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let sk = k.shape[2];
    let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let mut out = vec![0.0; b * h * sq * d];
    let mut s = vec![0.0; sk];
    for bh in 0..b * h {
        let (qb, kb) = (&qv[bh * sq * d..], &kv[bh * sk * d..]);
        let vb = &vv[bh * sk * d..];
        for i in 0..sq {
            // Keys visible to query i: all, or j <= i + sk - sq when causal.
            let last = i as i64 + sk as i64 - sq as i64;
            let visible = if causal {
                usize::try_from(last + 1).unwrap_or(0).min(sk)
            } else {
                sk
            };
            if visible == 0 {
                continue;
            }
            for (j, sj) in s.iter_mut().enumerate().take(visible) {
                *sj = scale * (0..d).map(|c| qb[i * d + c] * kb[j * d + c]).sum::<f64>();
            }
            let m = s[..visible]
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            let mut l = 0.0;
            let o = &mut out[(bh * sq + i) * d..(bh * sq + i + 1) * d];
            for j in 0..visible {
                let p = (s[j] - m).exp();
                l += p;
                for c in 0..d {
                    o[c] += p * vb[j * d + c];
                }
            }
            for x in o.iter_mut() {
                *x /= l;
            }
        }
    }
    out
}
