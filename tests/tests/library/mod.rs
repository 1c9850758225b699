//! Inputs and cases of the kernel library's tests (cross-entropy, softmax's backward, layer
//! norm's and RMS norm's backward), shared by the interpreter test (`interp_library`) and the
//! GPU test (`gpu_library`).

#![allow(dead_code)]

use kiln_ir::{DType, HostTensor};
use kiln_tests::inputs::{Dist, Rng, tensor};

/// Class indices for `m` rows of `v` classes as the cross-entropy kernels read them, `[m,
/// words]` i32 words (2: an int64 tensor's): uniform, with every seventh row ignored
/// (PyTorch's `ignore_index = -100`).
pub fn targets(rng: &mut Rng, m: usize, v: usize, words: usize) -> HostTensor {
    let classes: Vec<f64> = (0..m)
        .map(|r| {
            if r % 7 == 3 {
                -100.0
            } else {
                rng.uniform(0.0, v as f64).floor().min(v as f64 - 1.0)
            }
        })
        .collect();
    // An int64 index's high word: its sign.
    HostTensor::from_fn(&[m, words], DType::I32, |i| match i % words {
        0 => classes[i / words],
        _ => -f64::from(u8::from(classes[i / words] < 0.0)),
    })
}

/// An f32 tensor holding `values` (rounded to f32, as the kernel reads them).
pub fn f32_tensor(shape: &[usize], values: &[f64]) -> HostTensor {
    HostTensor::from_fn(shape, DType::F32, |i| values[i])
}

/// The `(x, w, mean, rstd, dy)` of a norm backward case: the statistics computed in f64
/// from the stored `x` and passed as f32.
pub fn norm_inputs(
    rng: &mut Rng,
    m: usize,
    n: usize,
    dtype: DType,
    dist: Dist,
    rms: bool,
) -> [HostTensor; 5] {
    let x = tensor(rng, &[m, n], dtype, dist);
    let w = tensor(rng, &[n], dtype, Dist::Normal);
    let dy = tensor(rng, &[m, n], dtype, Dist::Normal);
    let (mean, rstd) = kiln_tests::reference::norm_stats(&x, 1e-5, rms);
    [x, w, f32_tensor(&[m], &mean), f32_tensor(&[m], &rstd), dy]
}

/// Shapes `(m, n)` the interpreter checks the library kernels on: none a multiple of the
/// tiles, a row longer than the widest tile.
pub const SHAPES: [(usize, usize); 3] = [(1, 1), (5, 1000), (9, 4100)];

/// Shapes the GPU checks them on besides [`SHAPES`]: more rows than blocks of rows, and a
/// multiple of the tiles.
pub const GPU_SHAPES: [(usize, usize); 3] = [(33, 4097), (64, 1024), (1000, 2050)];

/// `(BM, BN, NW, STAGES)` of the cross-entropy checks: one row and several a block,
/// pipelined and not.
pub const CROSS_ENTROPY_CONFIGS: [(usize, usize, usize, usize); 4] = [
    (1, 2048, 2, 1),
    (4, 512, 4, 1),
    (1, 1024, 2, 2),
    (2, 256, 2, 3),
];

/// `(batch, seqlen, heads, offset)` of the rotary checks: heads no multiple of the head
/// blocks, a position offset.
pub const ROTARY_SHAPES: [(usize, usize, usize, usize); 3] =
    [(1, 1, 1, 0), (2, 7, 9, 0), (1, 5, 16, 3)];

/// The `cos, sin: [positions, r / 2]` tables of rotary dim `r` (base 10000), as `dtype`.
pub fn rotary_tables(positions: usize, r: usize, dtype: DType) -> (HostTensor, HostTensor) {
    let half = r / 2;
    let angle = |i: usize| {
        let (t, k) = (i / half, i % half);
        t as f64 * 10000f64.powf(-2.0 * k as f64 / r as f64)
    };
    (
        HostTensor::from_fn(&[positions, half], dtype, |i| angle(i).cos()),
        HostTensor::from_fn(&[positions, half], dtype, |i| angle(i).sin()),
    )
}

/// The unit roundoff of `dtype`'s floats (half the spacing at 1).
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::Bf16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// RMS norm's `dx` for one column (`n = 1`), element by element against the f64 reference
/// `rdx`, with an absolute bound. There `xhat^2 = x^2 / (x^2 + eps)` is 1 up to `eps`, and
/// `dx = g (1 - xhat^2) rstd` (`g = w dy`) is all cancellation: the kernel's f32 `xhat`
/// (one rounding of `x * rstd`), `c1 = g xhat` and `xhat c1` carry relative errors of
/// `u = 2^-24` each, so `xhat c1` is `g xhat^2 (1 + d)` with `|d| <= 4u` to first order, and
/// `g - xhat c1` is off by up to `4u |g| xhat^2` before it is scaled by `rstd`. The products
/// `w dy`, `(..) * rstd` and the store's rounding to `dtype` (unit roundoff `u_out`) add
/// `(2u + u_out)` relative to the result; elements below f32's normal range may flush to 0.
/// A kernel that dropped or mis-scaled the `xhat c1` term is off by about `|g| rstd`, far
/// outside the bound.
#[allow(clippy::too_many_arguments)]
pub fn assert_one_column_rms_dx(
    case: &kiln_tests::check::Case,
    dx: &HostTensor,
    rdx: &[f64],
    x: &HostTensor,
    w: &HostTensor,
    rstd: &HostTensor,
    dy: &HostTensor,
) {
    assert_eq!(x.shape[1], 1, "{case}: one column only");
    let u = 2f64.powi(-24);
    let uo = unit_roundoff(dx.dtype());
    let (got, xs, ws, rs, ds) = (
        dx.to_f64_vec(),
        x.to_f64_vec(),
        w.to_f64_vec(),
        rstd.to_f64_vec(),
        dy.to_f64_vec(),
    );
    assert_eq!(got.len(), rdx.len(), "{case}: element count");
    for r in 0..rdx.len() {
        let g = ds[r] * ws[0];
        let xhat = xs[r] * rs[r];
        let bound = 4.0 * u * g.abs() * xhat * xhat * rs[r] * (1.0 + uo)
            + (2.0 * u + uo) * rdx[r].abs()
            + f64::from(f32::MIN_POSITIVE);
        let err = (got[r] - rdx[r]).abs();
        assert!(
            err <= bound,
            "{case}: dx[{r}] = {:e}, reference {:e}: error {err:e} above the bound {bound:e} \
             (x {:e}, rstd {:e}, g {g:e})",
            got[r],
            rdx[r],
            xs[r],
            rs[r]
        );
    }
}

/// The routes of a MoE layer sorted by expert, as `moe_experts` takes them: `offsets`
/// (`[E + 1]`, i32), `tokens` and `gates` (`[S]`, i32 and f32) for `t` tokens each routed to
/// `topk` distinct experts of `e`. Expert 0 gets no token whenever `e > topk` and expert 1
/// about half of them, so the experts own none, a few and many row blocks.
pub fn moe_routes(
    rng: &mut Rng,
    t: usize,
    e: usize,
    topk: usize,
) -> (HostTensor, HostTensor, HostTensor) {
    assert!(topk <= e, "top-{topk} of {e} experts");
    let first = usize::from(e > topk);
    let mut routes: Vec<(usize, usize, f64)> = Vec::new();
    for tok in 0..t {
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < topk {
            let pick = if picked.is_empty() && e > first + 1 && rng.uniform(0.0, 1.0) < 0.5 {
                first.max(1).min(e - 1)
            } else {
                first + rng.range(0, e - first)
            };
            if !picked.contains(&pick) {
                picked.push(pick);
            }
        }
        for ex in picked {
            routes.push((ex, tok, rng.uniform(0.05, 1.0)));
        }
    }
    routes.sort_by_key(|&(ex, tok, _)| (ex, tok));
    let mut offsets = vec![0.0; e + 1];
    for &(ex, _, _) in &routes {
        offsets[ex + 1] += 1.0;
    }
    for i in 0..e {
        offsets[i + 1] += offsets[i];
    }
    let s = routes.len();
    (
        HostTensor::from_fn(&[e + 1], DType::I32, |i| offsets[i]),
        HostTensor::from_fn(&[s], DType::I32, |i| routes[i].1 as f64),
        HostTensor::from_fn(&[s], DType::F32, |i| routes[i].2),
    )
}

/// `init[t, :] + sum_{slots s of token t} gates[s] * x[t, :] @ w[e(s)]` in f64: what
/// `moe_experts` leaves in `out`.
pub fn moe_reference(
    x: &HostTensor,
    w: &HostTensor,
    routes: &(HostTensor, HostTensor, HostTensor),
    init: &HostTensor,
) -> Vec<f64> {
    let (h, n) = (x.shape[1], w.shape[2]);
    let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
    let (offsets, tokens, gates) = (
        routes.0.to_f64_vec(),
        routes.1.to_f64_vec(),
        routes.2.to_f64_vec(),
    );
    let mut out = init.to_f64_vec();
    for ex in 0..w.shape[0] {
        for s in offsets[ex] as usize..offsets[ex + 1] as usize {
            let tok = tokens[s] as usize;
            for j in 0..n {
                let dot: f64 = (0..h)
                    .map(|k| xv[tok * h + k] * wv[(ex * h + k) * n + j])
                    .sum();
                out[tok * n + j] += gates[s] * dot;
            }
        }
    }
    out
}

/// A router's choices as `moe_count` and `moe_scatter` take them: `experts` and `weights`
/// (`[t * topk]`, token-major), `topk` distinct experts of `e` per token, except every
/// eleventh route, dropped (expert -1).
pub fn moe_choices(rng: &mut Rng, t: usize, e: usize, topk: usize) -> (HostTensor, HostTensor) {
    let mut ex = Vec::with_capacity(t * topk);
    for _ in 0..t {
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < topk {
            let p = rng.range(0, e);
            if !picked.contains(&p) {
                picked.push(p);
            }
        }
        ex.extend(picked);
    }
    let experts = HostTensor::from_fn(&[t * topk], DType::I32, |s| {
        if s % 11 == 10 { -1.0 } else { ex[s] as f64 }
    });
    let weights = HostTensor::from_fn(&[t * topk], DType::F32, |_| rng.uniform(0.05, 1.0));
    (experts, weights)
}

/// The routes of `moe_choices` grouped by expert as `moe_experts` takes them (tokens in
/// order within an expert), for the reference.
pub fn moe_grouped(
    experts: &HostTensor,
    weights: &HostTensor,
    e: usize,
    topk: usize,
) -> (HostTensor, HostTensor, HostTensor) {
    let (ev, wv) = (experts.to_f64_vec(), weights.to_f64_vec());
    let mut routes: Vec<(usize, usize, f64)> = (0..ev.len())
        .filter(|&s| ev[s] >= 0.0)
        .map(|s| (ev[s] as usize, s / topk, wv[s]))
        .collect();
    routes.sort_by_key(|&(ex, tok, _)| (ex, tok));
    let mut offsets = vec![0.0; e + 1];
    for &(ex, _, _) in &routes {
        offsets[ex + 1] += 1.0;
    }
    for i in 0..e {
        offsets[i + 1] += offsets[i];
    }
    let s = routes.len();
    (
        HostTensor::from_fn(&[e + 1], DType::I32, |i| offsets[i]),
        HostTensor::from_fn(&[s.max(1)], DType::I32, |i| {
            routes.get(i).map_or(-1.0, |r| r.1 as f64)
        }),
        HostTensor::from_fn(&[s.max(1)], DType::F32, |i| {
            routes.get(i).map_or(0.0, |r| r.2)
        }),
    )
}

/// Asserts that `(offsets, tokens, gates)` from `moe_count` and `moe_scatter` hold exactly
/// the routes of `want` (from [`moe_grouped`]): the same offsets, and per expert the same
/// (token, gate) pairs in any order.
pub fn assert_same_routes(
    what: &str,
    got: (&HostTensor, &HostTensor, &HostTensor),
    want: &(HostTensor, HostTensor, HostTensor),
) {
    let offsets = got.0.to_f64_vec();
    assert_eq!(offsets, want.0.to_f64_vec(), "{what}: offsets");
    let (gt, gg) = (got.1.to_f64_vec(), got.2.to_f64_vec());
    let (wt, wg) = (want.1.to_f64_vec(), want.2.to_f64_vec());
    for ex in 0..offsets.len() - 1 {
        let range = offsets[ex] as usize..offsets[ex + 1] as usize;
        let pairs = |t: &[f64], g: &[f64]| {
            let mut p: Vec<(i64, u64)> = range
                .clone()
                .map(|i| (t[i] as i64, g[i].to_bits()))
                .collect();
            p.sort_unstable();
            p
        };
        assert_eq!(
            pairs(&gt, &gg),
            pairs(&wt, &wg),
            "{what}: expert {ex}'s routes"
        );
    }
}
