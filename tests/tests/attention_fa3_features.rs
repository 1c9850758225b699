//! FlashAttention 3's forward features beyond 2's. `headdim_v != headdim` (MLA's 192 / 128 among
//! the pairs): the dense and varlen forward kernels on the CPU interpreter against an f64
//! reference (tensors narrower than their tiles, ragged lengths, causal and windowed masks with
//! rows that see no key, grouped heads, outputs poisoned), and the forward and decode kernels'
//! PTX for the pairs FlashAttention users run assembling without a spill on sm_80 and sm_90a,
//! the sm_90a forward keeping its warp-specialised schedule (the decode numbers:
//! `interp_attention_decode`). `seqused_q` / `seqused_k` (`attention_varlen_used[_lse]`): each
//! sequence attends with its first used rows to its first used keys, rows past them unwritten.

mod ptx_examples;

use kiln_examples::attention::{
    AttentionParams, attention_lse, attention_varlen_lse, attention_varlen_used_lse,
};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor, Target, TensorData};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};

/// The `(d, dv)` pairs the PTX must assemble for without a spill.
const PAIRS: [(usize, usize); 4] = [(192, 128), (128, 64), (64, 128), (256, 128)];

/// One dense call: the tensors' head dims `(d, dv)`, the kernel's tile widths (at least as
/// wide: the columns past a tensor's last read 0), shapes and mask.
#[derive(Clone, Copy, Debug)]
struct Call {
    b: usize,
    h: usize,
    h_kv: usize,
    sq: usize,
    sk: usize,
    dims: (usize, usize),
    tiles: (usize, usize),
    causal: bool,
    window: (i32, i32),
    dtype: DType,
    target: Target,
}

impl Call {
    fn new((d, dv): (usize, usize), (sq, sk): (usize, usize)) -> Call {
        Call {
            b: 2,
            h: 2,
            h_kv: 2,
            sq,
            sk,
            dims: (d, dv),
            tiles: (d, dv),
            causal: false,
            window: (-1, -1),
            dtype: DType::Bf16,
            target: Target::Sm90a,
        }
    }

    fn params(&self) -> AttentionParams {
        AttentionParams {
            kv_group: self.h / self.h_kv,
            dtype: self.dtype,
            window_left: self.window.0,
            window_right: self.window.1,
            attention_chunk: 0,
            ..AttentionParams::tuned_pair(self.target, self.tiles, self.causal, (self.sq, self.sk))
        }
    }

    /// The window the reference applies, causal folded in.
    fn window(&self) -> (i64, i64) {
        let right = if self.causal { 0 } else { self.window.1 };
        (i64::from(self.window.0), i64::from(right))
    }
}

/// Attention's output `[sq, dv]` and log-sum-exp `[sq]` for one (batch, head) in f64: `q(i,
/// x)`, `k(j, x)` over `d` columns, `v(j, x)` over `dv`; query `i` sees key `j` iff `i + sk -
/// sq - left <= j <= i + sk - sq + right` (a negative bound unbounded); a row that sees no key
/// outputs 0 with log-sum-exp `+inf`.
#[allow(clippy::too_many_arguments)]
fn reference_head(
    q: impl Fn(usize, usize) -> f64,
    k: impl Fn(usize, usize) -> f64,
    v: impl Fn(usize, usize) -> f64,
    (sq, sk): (usize, usize),
    (d, dv): (usize, usize),
    scale: f64,
    (left, right): (i64, i64),
    (out, lse): (&mut Vec<f64>, &mut Vec<f64>),
) {
    for i in 0..sq {
        let diag = i as i64 + sk as i64 - sq as i64;
        let seen: Vec<usize> = (0..sk as i64)
            .filter(|&j| left < 0 || j >= diag - left)
            .filter(|&j| right < 0 || j <= diag + right)
            .map(|j| j as usize)
            .collect();
        if seen.is_empty() {
            out.extend(std::iter::repeat_n(0.0, dv));
            lse.push(f64::INFINITY);
            continue;
        }
        let s: Vec<f64> = seen
            .iter()
            .map(|&j| scale * (0..d).map(|x| q(i, x) * k(j, x)).sum::<f64>())
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|z| (z - m).exp()).collect();
        let l: f64 = p.iter().sum();
        for x in 0..dv {
            out.push(
                seen.iter()
                    .zip(&p)
                    .map(|(&j, pj)| pj * v(j, x))
                    .sum::<f64>()
                    / l,
            );
        }
        lse.push(m + l.ln());
    }
}

/// The log-sum-exp against the reference: `+inf` exactly where a row sees no key, elsewhere
/// within f32's rounding of the sums.
fn check_lse(case: &Case, got: &HostTensor, want: &[f64]) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{case}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= 1e-4 * w.abs().max(1.0)
        } else {
            g == w
        };
        assert!(ok, "{case}: lse[{i}] = {g}, want {w}");
    }
}

/// Runs `c` on the interpreter (`attention_lse`) over inputs drawn from `dist` into poisoned
/// outputs and checks both against the reference.
fn run_dense(rng: &mut Rng, c: Call, dist: Dist) {
    let (d, dv) = c.dims;
    let q = tensor(rng, &[c.b, c.h, c.sq, d], c.dtype, dist);
    let k = tensor(rng, &[c.b, c.h_kv, c.sk, d], c.dtype, dist);
    let v = tensor(rng, &[c.b, c.h_kv, c.sk, dv], c.dtype, dist);
    let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
    let mut o = poisoned(&[c.b, c.h, c.sq, dv], c.dtype);
    let mut lse = poisoned(&[c.b, c.h, c.sq], DType::F32);
    let p = c.params();
    let grid = attention_lse.grid(&p, [c.sq, c.h, c.b]);
    attention_lse
        .interpret(&p, grid, &q, &k, &v, &mut o, &mut lse, scale)
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let (mut want_o, mut want_lse) = (Vec::new(), Vec::new());
    let group = c.h / c.h_kv;
    for n in 0..c.b {
        for h in 0..c.h {
            let qb = &qv[(n * c.h + h) * c.sq * d..];
            let kvh = n * c.h_kv + h / group;
            let (kb, vb) = (&kv[kvh * c.sk * d..], &vv[kvh * c.sk * dv..]);
            reference_head(
                |i, x| qb[i * d + x],
                |j, x| kb[j * d + x],
                |j, x| vb[j * dv + x],
                (c.sq, c.sk),
                (d, dv),
                f64::from(scale),
                c.window(),
                (&mut want_o, &mut want_lse),
            );
        }
    }
    let case = Case {
        kernel: format!("attention_lse<{:?}>", p),
        shape: format!("{c:?}"),
        dist,
        seed: rng.seed(),
    };
    assert_close(&case, &o, &want_o, tolerance(c.dtype));
    check_lse(&case, &lse, &want_lse);
}

#[test]
fn dense_value_head_dims_match_reference() {
    let mut rng = Rng::from_env();
    let calls = [
        // MLA's pair, causal with more queries than keys (the first rows see no key), GQA.
        Call {
            h: 4,
            h_kv: 2,
            causal: true,
            ..Call::new((192, 128), (150, 70))
        },
        // Values wider than keys, f16, a two-sided window, sm_80's 64-row blocks.
        Call {
            dtype: DType::F16,
            window: (30, 5),
            target: Target::Sm80,
            ..Call::new((64, 128), (131, 90))
        },
        // Values narrower than keys, multi-query.
        Call {
            h: 4,
            h_kv: 1,
            ..Call::new((128, 64), (70, 200))
        },
        Call {
            b: 1,
            causal: true,
            ..Call::new((256, 128), (33, 77))
        },
        // Head dims no tile is as wide as, in the next tiles up (columns past them read 0).
        Call {
            tiles: (64, 96),
            causal: true,
            ..Call::new((40, 72), (65, 65))
        },
        Call {
            tiles: (256, 32),
            dtype: DType::F16,
            ..Call::new((200, 24), (17, 129))
        },
    ];
    for c in calls {
        for dist in Dist::ALL {
            run_dense(&mut rng, c, dist);
        }
    }
}

/// A contiguous i32 tensor.
fn i32_tensor(values: &[i32]) -> HostTensor {
    HostTensor::new(&[values.len()], TensorData::I32(values.to_vec())).expect("shape")
}

#[test]
fn varlen_value_head_dims_match_reference() {
    // Sequences of (queries, keys): none of either, more queries than keys (causal: the
    // first rows see no key), lengths past one block.
    let seqs = [(37, 50), (0, 10), (20, 0), (150, 131), (9, 3)];
    let mut rng = Rng::from_env();
    for ((d, dv), tiles, causal) in [
        ((192, 128), (192, 128), true),
        ((64, 128), (64, 128), false),
        ((56, 40), (64, 64), true),
    ] {
        let (h, h_kv, dtype) = (4, 2, DType::Bf16);
        let mut cu = (vec![0i32], vec![0i32]);
        for &(sq, sk) in &seqs {
            cu.0.push(cu.0.last().copied().unwrap_or(0) + sq as i32);
            cu.1.push(cu.1.last().copied().unwrap_or(0) + sk as i32);
        }
        let (tq, tk) = (
            *cu.0.last().unwrap() as usize,
            *cu.1.last().unwrap() as usize,
        );
        let max_q = seqs.iter().map(|s| s.0).max().unwrap_or(0);
        for dist in Dist::ALL {
            let q = tensor(&mut rng, &[1, h, tq, d], dtype, dist);
            let k = tensor(&mut rng, &[1, h_kv, tk, d], dtype, dist);
            let v = tensor(&mut rng, &[1, h_kv, tk, dv], dtype, dist);
            let mut o = poisoned(&[1, h, tq, dv], dtype);
            let mut lse = poisoned(&[1, h, tq], DType::F32);
            let scale = 1.0 / (d as f32).sqrt();
            let p = AttentionParams {
                kv_group: h / h_kv,
                dtype,
                ..AttentionParams::tuned_pair(Target::Sm90a, tiles, causal, (tq, tk))
            };
            let grid = attention_varlen_lse.grid(&p, [max_q, h, seqs.len()]);
            let (cu_q, cu_k) = (i32_tensor(&cu.0), i32_tensor(&cu.1));
            attention_varlen_lse
                .interpret(&p, grid, &q, &k, &v, &mut o, &mut lse, &cu_q, &cu_k, scale)
                .unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
            // The reference in the kernel's layout: head-major, sequences along the rows.
            let mut want_o = vec![0.0; h * tq * dv];
            let mut want_lse = vec![0.0; h * tq];
            for hh in 0..h {
                let kvh = hh / (h / h_kv);
                for (s, &(sq, sk)) in seqs.iter().enumerate() {
                    let (q0, k0) = (cu.0[s] as usize, cu.1[s] as usize);
                    let (mut out, mut l) = (Vec::new(), Vec::new());
                    reference_head(
                        |i, x| qv[(hh * tq + q0 + i) * d + x],
                        |j, x| kv[(kvh * tk + k0 + j) * d + x],
                        |j, x| vv[(kvh * tk + k0 + j) * dv + x],
                        (sq, sk),
                        (d, dv),
                        f64::from(scale),
                        if causal { (-1, 0) } else { (-1, -1) },
                        (&mut out, &mut l),
                    );
                    let at = (hh * tq + q0) * dv;
                    want_o[at..at + sq * dv].copy_from_slice(&out);
                    want_lse[hh * tq + q0..hh * tq + q0 + sq].copy_from_slice(&l);
                }
            }
            let case = Case {
                kernel: format!("attention_varlen_lse<{p:?}>"),
                shape: format!("seqs {seqs:?} h {h}/{h_kv} dims ({d}, {dv})"),
                dist,
                seed: rng.seed(),
            };
            assert_close(&case, &o, &want_o, tolerance(dtype));
            check_lse(&case, &lse, &want_lse);
        }
    }
}

/// The comptime overrides of the forward for `(d, dv)` on `target`, in the blocks
/// `AttentionParams::tuned_pair` picks for 4k queries and keys.
fn forward_overrides(target: Target, (d, dv): (usize, usize)) -> Vec<(String, String)> {
    let p = AttentionParams::tuned_pair(target, (d, dv), false, (4096, 4096));
    vec![
        ("d".into(), d.to_string()),
        ("dv".into(), dv.to_string()),
        ("block_m".into(), p.block_m.to_string()),
        ("block_n".into(), p.block_n.to_string()),
    ]
}

/// Compiles `kernel` with `overrides` for `target`, asserts ptxas assembles it without a
/// spill, and returns its PTX.
fn assemble(kernel: &str, overrides: &[(String, String)], target: Target) -> kiln_ptx::PtxModule {
    let o: Vec<(&str, &str)> = overrides
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let built = ptx_examples::build(kernel, &o);
    let m = kiln_ptx::compile(&built, target).unwrap_or_else(|e| panic!("{kernel} {o:?}: {e}"));
    let report = kiln_ptx::ptxas::check(&m.ptx, target)
        .unwrap_or_else(|e| panic!("{kernel} {o:?} on {target}: {e}"));
    assert!(
        !report.spills(),
        "{kernel} {o:?} on {target} spills: {report}"
    );
    m
}

#[test]
fn forward_pairs_assemble_without_spills_and_keep_the_sm90a_schedule() {
    for pair in PAIRS {
        for kernel in ["attention_lse", "attention_varlen_lse"] {
            let m = assemble(
                kernel,
                &forward_overrides(Target::Sm90a, pair),
                Target::Sm90a,
            );
            // The warp-specialised forward: TMA, persistent, the rotated ping-pong loop.
            assert!(
                !m.tensor_maps.is_empty() && m.persistent,
                "{kernel} {pair:?}"
            );
            assert!(
                m.ptx.contains("rotated loop: steady state"),
                "{kernel} {pair:?}: not the rotated schedule"
            );
            assemble(kernel, &forward_overrides(Target::Sm80, pair), Target::Sm80);
        }
    }
}

#[test]
fn decode_pairs_assemble_without_spills() {
    for (d, dv) in PAIRS {
        for target in [Target::Sm80, Target::Sm90a] {
            for kernel in [
                "kv_cache_append",
                "attention_decode",
                "attention_decode_split",
                "attention_decode_combine",
            ] {
                for page in ["0", "16"] {
                    let o = [("d", d.to_string()), ("dv", dv.to_string())];
                    let mut o: Vec<(String, String)> =
                        o.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                    o.push(("page_size".into(), page.into()));
                    assemble(kernel, &o, target);
                }
            }
        }
    }
}

#[test]
fn equal_head_dims_compile_as_before() {
    // `dv = d` is `dv = 0`: the same kernel, byte for byte.
    for d in [64, 128, 256] {
        let ptx = |dv: usize| {
            let o = [("d", d.to_string()), ("dv", dv.to_string())];
            let o: Vec<(&str, &str)> = o.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let k = ptx_examples::build("attention", &o);
            kiln_ptx::compile(&k, Target::Sm90a).expect("compile").ptx
        };
        assert_eq!(ptx(0), ptx(d), "d = {d}");
    }
    assert_eq!(
        AttentionParams::tuned_pair(Target::Sm80, (128, 128), true, (999, 999)),
        AttentionParams::tuned(Target::Sm80, 128, true, (999, 999))
    );
}

#[test]
fn sm80_takes_64_query_rows_for_wide_values_only() {
    let pick = |t, pair| AttentionParams::tuned_pair(t, pair, false, (4096, 4096)).block_m;
    assert_eq!(pick(Target::Sm80, (192, 128)), 64);
    assert_eq!(pick(Target::Sm80, (64, 128)), 64);
    assert_eq!(pick(Target::Sm80, (128, 64)), 128);
    assert_eq!(pick(Target::Sm90a, (192, 128)), 128);
    let p = AttentionParams::tuned_pair(Target::Sm90a, (64, 128), false, (4096, 4096));
    // The wider head's tiles: d = 64's three-warpgroup block does not hold 128 columns of O.
    assert_eq!((p.d, p.dv, p.block_m), (64, 128, 128));
}

#[test]
fn seqused_varlen_matches_reference_on_the_used_rows_and_keys() {
    // (queries, keys, used queries, used keys): fewer used than given, all used, none used,
    // more used than given (capped), causal alignment to the used lengths.
    let seqs = [
        (37, 50, 20, 31),
        (64, 64, 64, 64),
        (20, 10, 0, 10),
        (9, 30, 9, 0),
        (131, 90, 100, 200),
    ];
    let mut rng = Rng::from_env();
    let (h, h_kv, d, dv, dtype) = (4, 2, 64, 64, DType::Bf16);
    for causal in [false, true] {
        let mut cu = (vec![0i32], vec![0i32]);
        for &(sq, sk, _, _) in &seqs {
            cu.0.push(cu.0.last().copied().unwrap_or(0) + sq as i32);
            cu.1.push(cu.1.last().copied().unwrap_or(0) + sk as i32);
        }
        let used_q: Vec<i32> = seqs.iter().map(|s| s.2 as i32).collect();
        let used_k: Vec<i32> = seqs.iter().map(|s| s.3 as i32).collect();
        let (tq, tk) = (
            *cu.0.last().unwrap() as usize,
            *cu.1.last().unwrap() as usize,
        );
        let max_q = seqs.iter().map(|s| s.0).max().unwrap_or(0);
        for dist in Dist::ALL {
            let q = tensor(&mut rng, &[1, h, tq, d], dtype, dist);
            let k = tensor(&mut rng, &[1, h_kv, tk, d], dtype, dist);
            let v = tensor(&mut rng, &[1, h_kv, tk, dv], dtype, dist);
            let mut o = poisoned(&[1, h, tq, dv], dtype);
            let mut lse = poisoned(&[1, h, tq], DType::F32);
            let scale = 1.0 / (d as f32).sqrt();
            let p = AttentionParams {
                kv_group: h / h_kv,
                dtype,
                ..AttentionParams::tuned(Target::Sm90a, d, causal, (tq, tk))
            };
            let grid = attention_varlen_used_lse.grid(&p, [max_q, h, seqs.len()]);
            let t = |v: &[i32]| i32_tensor(v);
            let (cu_q, cu_k, uq, uk) = (t(&cu.0), t(&cu.1), t(&used_q), t(&used_k));
            attention_varlen_used_lse
                .interpret(
                    &p, grid, &q, &k, &v, &mut o, &mut lse, &cu_q, &cu_k, &uq, &uk, scale,
                )
                .unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
            let (ov, lv) = (o.to_f64_vec(), lse.to_f64_vec());
            let case = Case {
                kernel: format!("attention_varlen_used_lse<{p:?}>"),
                shape: format!("seqs {seqs:?}"),
                dist,
                seed: rng.seed(),
            };
            for hh in 0..h {
                let kvh = hh / (h / h_kv);
                for (s, &(sq, sk, uq, uk)) in seqs.iter().enumerate() {
                    let (uq, uk) = (uq.min(sq), uk.min(sk));
                    let (q0, k0) = (cu.0[s] as usize, cu.1[s] as usize);
                    let (mut want_o, mut want_l) = (Vec::new(), Vec::new());
                    reference_head(
                        |i, x| qv[(hh * tq + q0 + i) * d + x],
                        |j, x| kv[(kvh * tk + k0 + j) * d + x],
                        |j, x| vv[(kvh * tk + k0 + j) * dv + x],
                        (uq, uk),
                        (d, dv),
                        f64::from(scale),
                        if causal { (-1, 0) } else { (-1, -1) },
                        (&mut want_o, &mut want_l),
                    );
                    let at = (hh * tq + q0) * dv;
                    let got = &ov[at..at + uq * dv];
                    let err = kiln_tests::check::rel_error(got, &want_o);
                    assert!(
                        err <= tolerance(dtype) || want_o.iter().all(|&w| w == 0.0),
                        "{case}: head {hh} sequence {s}: error {err}"
                    );
                    for (i, &w) in want_l.iter().enumerate() {
                        let g = lv[hh * tq + q0 + i];
                        let ok = if w.is_finite() {
                            (g - w).abs() <= 1e-4 * w.abs().max(1.0)
                        } else {
                            g == w
                        };
                        assert!(
                            ok,
                            "{case}: head {hh} sequence {s} row {i}: lse {g}, want {w}"
                        );
                    }
                    if want_l.iter().all(|w| w.is_infinite()) {
                        assert!(
                            got.iter().all(|&y| y == 0.0),
                            "{case}: keyless rows output 0"
                        );
                    }
                    // The rows past the used ones keep their poison (NaN): never written.
                    let past = &ov[at + uq * dv..at + sq * dv];
                    assert!(
                        past.iter().all(|y| y.is_nan()),
                        "{case}: rows past seqused_q written"
                    );
                    let past = &lv[hh * tq + q0 + uq..hh * tq + q0 + sq];
                    assert!(
                        past.iter().all(|y| y.is_nan()),
                        "{case}: lse past seqused_q written"
                    );
                }
            }
        }
    }
}

#[test]
fn seqused_kernels_assemble_without_spills_and_keep_the_sm90a_schedule() {
    for kernel in ["attention_varlen_used", "attention_varlen_used_lse"] {
        for pair in [(64, 64), (192, 128)] {
            let m = assemble(
                kernel,
                &forward_overrides(Target::Sm90a, pair),
                Target::Sm90a,
            );
            assert!(
                m.ptx.contains("rotated loop: steady state"),
                "{kernel} {pair:?}: not the rotated schedule"
            );
            assemble(kernel, &forward_overrides(Target::Sm80, pair), Target::Sm80);
        }
    }
}
