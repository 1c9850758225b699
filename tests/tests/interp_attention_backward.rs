//! Attention's backward kernels (`kiln_examples::attention_backward`) on the CPU interpreter
//! against the f64 reference gradients (`reference::attention_backward_f64`, itself checked by
//! finite differences here), by FlashAttention's rule (`check::assert_within_rule`): dense and
//! causal (bottom-right, `sq != sk`), grouped and multi-query heads, bf16 and f16, sliding
//! windows, chunks (`attention_chunk`), soft-caps, head dims 64, 96, 128 and 256 and sm_90a's
//! tiles, lengths no multiple of any block, rows that see no key (their dq 0, nothing NaN),
//! large inputs, outputs poisoned; the deterministic mode's dq bitwise reproducible.

mod bwd_varlen;

use bwd_varlen::{Packed, Problem};
use kiln_examples::attention_backward::{
    AttentionBwdParams, attention_bwd_dkdv, attention_bwd_dkdv_varlen,
    attention_bwd_dkdv_varlen_used, attention_bwd_dq, attention_bwd_dq_convert,
    attention_bwd_dq_convert_varlen, attention_bwd_dq_varlen, attention_bwd_dq_varlen_used,
    attention_bwd_preprocess, attention_bwd_preprocess_varlen,
};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, assert_within_rule, poisoned, rel_error};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference::{
    self, AttentionDims, AttentionGrads, AttentionMath, Rounding, attention_backward_f64,
    attention_backward_f64_dv,
};

/// One backward call: shapes and the comptime features.
#[derive(Clone, Copy, Debug)]
struct Call {
    dims: AttentionDims,
    /// Head dim of `v`, `o`, `dout`; 0: `dims.d`.
    dv: usize,
    dtype: DType,
    causal: bool,
    window: (i32, i32),
    /// Keys per chunk (`attention_chunk`); 0: none.
    chunk: i32,
    softcap: f32,
    deterministic: bool,
    /// The dK/dV kernel's scores keys-major with dQ by atomics (`keys_major`).
    keys_major: bool,
    /// With sm_90a's measured tiles ([`AttentionBwdParams::tuned`]), not the defaults.
    tuned: bool,
    /// Query rows, keys and warps of a block (every key column in it), where not the
    /// defaults'.
    blocks: Option<(usize, usize, usize)>,
}

impl Call {
    /// `d = 64`, bf16, one batch of two heads, no mask, no cap, atomics: what each test changes.
    fn new(sq: usize, sk: usize) -> Call {
        Call {
            dims: AttentionDims {
                b: 1,
                h: 2,
                h_kv: 2,
                sq,
                sk,
                d: 64,
            },
            dv: 0,
            dtype: DType::Bf16,
            causal: false,
            window: (-1, -1),
            chunk: 0,
            softcap: 0.0,
            deterministic: false,
            keys_major: false,
            tuned: false,
            blocks: None,
        }
    }

    fn params(&self) -> AttentionBwdParams {
        let p = AttentionBwdParams {
            d: self.dims.d,
            dv: self.dv,
            causal: self.causal,
            kv_group: self.dims.h / self.dims.h_kv,
            dtype: self.dtype,
            window_left: self.window.0,
            window_right: self.window.1,
            attention_chunk: self.chunk,
            softcap: self.softcap,
            block_m: 0,
            block_n: 0,
            deterministic: self.deterministic,
            num_warps: 4,
            keys_major: self.keys_major,
            key_cols: 0,
        };
        match (self.tuned, self.blocks) {
            (true, _) => p.tuned(kiln_ir::Target::Sm90a, false),
            (false, Some((block_m, block_n, num_warps))) => AttentionBwdParams {
                block_m,
                block_n,
                num_warps,
                key_cols: p.d,
                ..p
            },
            (false, None) => p,
        }
    }

    /// The head dim of `v`, `o`, `dout`.
    fn value_dim(&self) -> usize {
        if self.dv == 0 { self.dims.d } else { self.dv }
    }

    /// The reference's math: FlashAttention's window, where causal makes `right` 0.
    fn math(&self, scale: f32) -> AttentionMath {
        let right = if self.causal { 0 } else { self.window.1 };
        AttentionMath {
            scale: f64::from(scale),
            window: reference::Window {
                left: i64::from(self.window.0),
                right: i64::from(right),
                chunk: i64::from(self.chunk),
            },
            cap: (self.softcap > 0.0).then_some(f64::from(self.softcap)),
        }
    }
}

/// The kernels' inputs: `q, k, v, dout`, the forward's stored `o` (rounded to the dtype) and
/// `lse` (f32), as the reference computes them, and the scale.
struct Inputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    dout: HostTensor,
    o: HostTensor,
    lse: HostTensor,
    scale: f32,
}

fn inputs(rng: &mut Rng, c: &Call, dist: Dist) -> Inputs {
    let AttentionDims {
        b,
        h,
        h_kv,
        sq,
        sk,
        d,
    } = c.dims;
    let dv = c.value_dim();
    let q = tensor(rng, &[b, h, sq, d], c.dtype, dist);
    let k = tensor(rng, &[b, h_kv, sk, d], c.dtype, dist);
    let v = tensor(rng, &[b, h_kv, sk, dv], c.dtype, dist);
    let dout = tensor(rng, &[b, h, sq, dv], c.dtype, dist);
    // The usual 1/sqrt(d), perturbed so that no test depends on one exact scale.
    let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
    let math = c.math(scale);
    let [qv, kv, vv] = [&q, &k, &v].map(HostTensor::to_f64_vec);
    let o = reference::attention_forward_f64_dv([&qv, &kv, &vv], c.dims, dv, math);
    let o = HostTensor::from_fn(&[b, h, sq, dv], c.dtype, |i| o[i]);
    let lse = reference::attention_lse_f64(&qv, &kv, c.dims, math);
    let lse = HostTensor::from_fn(&[b, h, sq], DType::F32, |i| lse[i]);
    Inputs {
        q,
        k,
        v,
        dout,
        o,
        lse,
        scale,
    }
}

/// The kernels' gradients, `(dq, dk, dv)`.
struct Got {
    dq: HostTensor,
    dk: HostTensor,
    dv: HostTensor,
}

/// Runs the backward kernels of `c` on the interpreter over `x`, every output poisoned.
fn backward(c: &Call, x: &Inputs) -> Got {
    let AttentionDims {
        b,
        h,
        h_kv,
        sq,
        sk,
        d,
    } = c.dims;
    let p = c.params();
    // The query-side kernels' tiles beside the dK/dV kernel's.
    let qp = p.query_tiles();
    let mut delta = poisoned(&[b, h, sq], DType::F32);
    let mut dq_accum = poisoned(&[b, h, sq, d], DType::F32);
    let mut dq = poisoned(&[b, h, sq, d], c.dtype);
    let mut dk = poisoned(&[b, h_kv, sk, d], c.dtype);
    let mut dv = poisoned(&[b, h_kv, sk, c.value_dim()], c.dtype);
    let qgrid = qp.query_grid([sq, h, b]);
    attention_bwd_preprocess
        .interpret(&qp, qgrid, &x.o, &x.dout, &mut delta, &mut dq_accum)
        .unwrap();
    attention_bwd_dkdv
        .interpret(
            &p,
            p.key_grid([sk, h_kv, b]),
            &x.q,
            &x.k,
            &x.v,
            &x.dout,
            &x.lse,
            &delta,
            &mut dq_accum,
            &mut dk,
            &mut dv,
            x.scale,
        )
        .unwrap();
    if c.deterministic {
        // The accumulator is the atomics' alone: still poisoned.
        assert!(dq_accum.to_f64_vec().iter().all(|x| x.is_nan()));
        attention_bwd_dq
            .interpret(
                &qp,
                qp.dq_grid([sq, h, b]),
                &x.q,
                &x.k,
                &x.v,
                &x.dout,
                &x.lse,
                &delta,
                &mut dq,
                x.scale,
            )
            .unwrap();
    } else {
        attention_bwd_dq_convert
            .interpret(&qp, qgrid, &dq_accum, &mut dq, x.scale)
            .unwrap();
    }
    Got { dq, dk, dv }
}

/// The exact gradients of `x` and those of the rounded computation (the rule's yardstick).
fn references(c: &Call, x: &Inputs) -> (AttentionGrads, AttentionGrads) {
    let [q, k, v, dout] = [&x.q, &x.k, &x.v, &x.dout].map(HostTensor::to_f64_vec);
    let math = c.math(x.scale);
    let dv = c.value_dim();
    let at = |r| attention_backward_f64_dv([&q, &k, &v, &dout], c.dims, dv, math, r);
    (at(Rounding::Exact), at(Rounding::Stored(c.dtype)))
}

/// Runs `c` on inputs drawn from `dist`, checks dq, dk and dv, and returns the kernels'.
fn run(rng: &mut Rng, c: Call, dist: Dist) -> Got {
    let x = inputs(rng, &c, dist);
    let got = backward(&c, &x);
    let (exact, rounded) = references(&c, &x);
    let case = Case {
        kernel: format!("attention backward {:?}", c.params()),
        shape: format!("{:?} dv={} scale={}", c.dims, c.value_dim(), x.scale),
        dist,
        seed: rng.seed(),
    };
    assert_within_rule(&case, "dq", &got.dq, &exact.dq, &rounded.dq, c.dtype);
    assert_within_rule(&case, "dk", &got.dk, &exact.dk, &rounded.dk, c.dtype);
    assert_within_rule(&case, "dv", &got.dv, &exact.dv, &rounded.dv, c.dtype);
    got
}

#[test]
fn dense_and_causal_match_reference() {
    // Lengths no multiple of the 64-row blocks, sq = sk, sq > sk (the first causal rows see
    // no key) and sq < sk; every input distribution on one shape.
    let mut rng = Rng::from_env();
    for (sq, sk, causal) in [
        (100, 100, false),
        (150, 90, true),
        (70, 130, true),
        (1, 3, false),
    ] {
        let c = Call {
            causal,
            ..Call::new(sq, sk)
        };
        run(&mut rng, c, Dist::Normal);
    }
    for dist in Dist::ALL {
        let c = Call {
            causal: true,
            ..Call::new(90, 110)
        };
        run(&mut rng, c, dist);
    }
}

#[test]
fn keys_major_scores_with_dq_atomics_match_reference() {
    // The dK/dV kernel keys-major (`S^T = K Q^T`, dQ from the staged `dS`) with atomics:
    // causal with sq > sk and sq < sk, grouped heads, a window with a soft-cap, head dims
    // 128 (two column blocks) and 256 (four), lengths no multiple of the blocks.
    let mut rng = Rng::from_env();
    let base = |sq, sk| Call {
        keys_major: true,
        ..Call::new(sq, sk)
    };
    let mut grouped = Call {
        causal: true,
        ..base(80, 70)
    };
    grouped.dims.h = 4;
    grouped.dims.h_kv = 1;
    let mut wide = base(90, 110);
    wide.dims.d = 128;
    let mut widest = Call {
        causal: true,
        ..base(70, 65)
    };
    widest.dims.d = 256;
    for (c, dist) in [
        (base(100, 100), Dist::Normal),
        (
            Call {
                causal: true,
                ..base(150, 90)
            },
            Dist::Large,
        ),
        (
            Call {
                causal: true,
                ..base(70, 130)
            },
            Dist::Normal,
        ),
        (grouped, Dist::Normal),
        (
            Call {
                window: (40, 10),
                softcap: 20.0,
                ..base(120, 100)
            },
            Dist::Normal,
        ),
        (wide, Dist::Uniform),
        (widest, Dist::Normal),
    ] {
        run(&mut rng, c, dist);
    }
}

#[test]
fn keys_major_80_query_rows_add_dq_from_its_transpose() {
    // 80 query rows against 128 keys at d = 128, keys-major: dQ is computed transposed
    // (`K^T dS^T`) and added from its transpose. Lengths no multiple of 80 or 128, causal
    // both ways, a group, and the large distribution.
    let mut rng = Rng::from_env();
    let base = |sq, sk| {
        let mut c = Call {
            keys_major: true,
            blocks: Some((80, 128, 8)),
            ..Call::new(sq, sk)
        };
        c.dims.d = 128;
        c
    };
    let mut grouped = Call {
        causal: true,
        ..base(170, 150)
    };
    grouped.dims.h = 4;
    grouped.dims.h_kv = 2;
    for (c, dist) in [
        (base(170, 200), Dist::Normal),
        (
            Call {
                causal: true,
                ..base(250, 130)
            },
            Dist::Large,
        ),
        (grouped, Dist::Uniform),
    ] {
        run(&mut rng, c, dist);
    }
}

#[test]
fn grouped_and_multi_query_heads_sum_over_the_group() {
    // 4 query heads over 2 key/value heads and over 1, batch 2: each key/value head's dK and
    // dV are the sums over the query heads of its group.
    let mut rng = Rng::from_env();
    for (h_kv, causal) in [(2, false), (1, true)] {
        let mut c = Call {
            causal,
            ..Call::new(80, 70)
        };
        c.dims.b = 2;
        c.dims.h = 4;
        c.dims.h_kv = h_kv;
        run(&mut rng, c, Dist::Normal);
    }
}

#[test]
fn f16_and_head_dims_96_128_256_match_reference() {
    let mut rng = Rng::from_env();
    // d = 128 splits dK and dV into two blocks of 64 columns, d = 96 into three of 32, d = 256
    // into four of 64 (and the deterministic dQ into two of 128).
    for (dtype, d, causal, dist, deterministic) in [
        (DType::F16, 64, true, Dist::Normal, false),
        (DType::F16, 64, false, Dist::Large, true),
        (DType::Bf16, 128, true, Dist::Normal, true),
        (DType::F16, 128, false, Dist::Uniform, false),
        (DType::Bf16, 96, true, Dist::Normal, true),
        (DType::Bf16, 256, false, Dist::Normal, false),
        (DType::Bf16, 256, true, Dist::Large, true),
    ] {
        let mut c = Call {
            dtype,
            causal,
            deterministic,
            ..Call::new(90, 75)
        };
        c.dims.d = d;
        run(&mut rng, c, dist);
    }
}

#[test]
fn sm90a_tiles_match_reference() {
    // The sm_90a choices: d = 96 and 128 with every dK/dV column in one block (128 keys in
    // two warpgroups under the walk), d = 256 in blocks of 128 columns under the walk
    // (lengths past one and two blocks, causal walks with rows that see no key, a group);
    // each case's tiles differ from the defaults.
    let mut rng = Rng::from_env();
    for (d, sq, sk, causal, window, h_kv, deterministic, dist) in [
        (96, 200, 150, true, (-1, -1), 2, false, Dist::Normal),
        (128, 130, 260, true, (-1, -1), 1, true, Dist::Large),
        (96, 100, 100, false, (-1, -1), 2, false, Dist::Uniform),
        (96, 90, 75, true, (-1, -1), 2, false, Dist::Normal),
        (128, 90, 140, false, (-1, -1), 1, true, Dist::Normal),
        (128, 70, 70, true, (-1, -1), 2, false, Dist::Large),
        (256, 100, 140, true, (-1, -1), 2, true, Dist::Normal),
    ] {
        let mut c = Call {
            causal,
            window,
            deterministic,
            tuned: true,
            ..Call::new(sq, sk)
        };
        c.dims.d = d;
        c.dims.h = 2;
        c.dims.h_kv = h_kv;
        let p = c.params();
        assert_ne!(p, Call { tuned: false, ..c }.params(), "{p:?}");
        run(&mut rng, c, dist);
    }
}

#[test]
fn sliding_windows_match_reference() {
    // 64-key blocks over 150 keys: windows narrower than a block (the walk starts past the
    // first query block and stops before the last), windows straddling block edges, one-sided
    // windows, causal with a left bound; sq < sk and sq > sk.
    let mut rng = Rng::from_env();
    let windows: [((i32, i32), bool); 6] = [
        ((20, 0), false),
        ((10, 5), true),
        ((7, 9), false),
        ((0, 0), false),
        ((-1, 40), false),
        ((70, -1), false),
    ];
    for (i, (window, causal)) in windows.into_iter().enumerate() {
        // Every window on sq = sk, and on sq < sk or sq > sk in turn.
        for (sq, sk) in [(150, 150), [(70, 150), (150, 70)][i % 2]] {
            let c = Call {
                window,
                causal,
                ..Call::new(sq, sk)
            };
            run(&mut rng, c, Dist::Normal);
        }
    }
}

#[test]
fn chunks_match_reference() {
    // FlashAttention 3's `attention_chunk`: chunks narrower than a 64-key block, straddling
    // block edges and wider than a block, alone, causal, with a window inside the chunk and
    // one wider than it; sq = sk, sq < sk (the diagonal shifted into a later chunk) and
    // sq > sk (rows before key 0, in chunks below 0); both dQ modes.
    let mut rng = Rng::from_env();
    let cases: [(i32, (i32, i32), bool); 5] = [
        (40, (-1, -1), false),
        (24, (-1, -1), true),
        (96, (30, -1), false),
        (50, (5, 70), false),
        (128, (-1, 3), true),
    ];
    for (i, (chunk, window, causal)) in cases.into_iter().enumerate() {
        for (sq, sk) in [(150, 150), [(70, 150), (150, 70)][i % 2]] {
            let c = Call {
                window,
                chunk,
                causal,
                deterministic: i % 2 == 1,
                ..Call::new(sq, sk)
            };
            run(&mut rng, c, Dist::Normal);
        }
    }
}

#[test]
fn softcap_matches_reference() {
    // Caps inside the scores' range (large inputs saturate tanh) and above it, with masks,
    // f16 and grouped heads.
    let mut rng = Rng::from_env();
    for (softcap, causal, dtype, dist) in [
        (5.0, false, DType::Bf16, Dist::Normal),
        (30.0, true, DType::Bf16, Dist::Large),
        (1.5, true, DType::F16, Dist::Uniform),
    ] {
        let c = Call {
            softcap,
            causal,
            dtype,
            ..Call::new(100, 80)
        };
        run(&mut rng, c, dist);
    }
    let mut c = Call {
        softcap: 20.0,
        window: (30, 10),
        ..Call::new(90, 100)
    };
    c.dims.h = 4;
    c.dims.h_kv = 1;
    run(&mut rng, c, Dist::Normal);
}

#[test]
fn rows_that_see_no_key_get_zero_dq() {
    // sq = 200 > sk = 60: row i's diagonal key is i - 140, so causal rows 0..140 see no key
    // (two whole query blocks and part of a third); with right bound 5, rows 0..135. Their dq
    // must be exactly 0, and no gradient NaN (their lse is +inf).
    let mut rng = Rng::from_env();
    let (sq, sk, d) = (200, 60, 64);
    for (window, causal, blind) in [((-1, -1), true, 140), ((10, 5), false, 135)] {
        for deterministic in [false, true] {
            let c = Call {
                window,
                causal,
                deterministic,
                ..Call::new(sq, sk)
            };
            let got = run(&mut rng, c, Dist::Large);
            for head in got.dq.to_f64_vec().chunks(sq * d) {
                assert!(
                    head[..blind * d].iter().all(|&x| x == 0.0),
                    "{c:?}: rows that see no key must have dq = 0, KILN_SEED={}",
                    rng.seed()
                );
            }
        }
    }
}

#[test]
fn deterministic_mode_matches_reference_and_repeats_its_bits() {
    let mut rng = Rng::from_env();
    for (sq, sk, causal, window, softcap) in [
        (130, 100, false, (-1, -1), 0.0),
        (100, 130, true, (-1, -1), 0.0),
        (120, 120, false, (25, 15), 10.0),
    ] {
        let mut c = Call {
            causal,
            window,
            softcap,
            deterministic: true,
            ..Call::new(sq, sk)
        };
        c.dims.h = 4;
        c.dims.h_kv = 2;
        let x = inputs(&mut rng, &c, Dist::Normal);
        let first = backward(&c, &x);
        let (exact, rounded) = references(&c, &x);
        let case = Case {
            kernel: format!("attention backward {:?}", c.params()),
            shape: format!("{:?} scale={}", c.dims, x.scale),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_within_rule(&case, "dq", &first.dq, &exact.dq, &rounded.dq, c.dtype);
        assert_within_rule(&case, "dk", &first.dk, &exact.dk, &rounded.dk, c.dtype);
        assert_within_rule(&case, "dv", &first.dv, &exact.dv, &rounded.dv, c.dtype);
        let again = backward(&c, &x);
        for (name, a, b) in [
            ("dq", &first.dq, &again.dq),
            ("dk", &first.dk, &again.dk),
            ("dv", &first.dv, &again.dv),
        ] {
            assert!(a.data == b.data, "{case}: {name} differs between two runs");
        }
    }
}

/// `dL/dx` of `f` at `x` by central differences, one element at a time.
fn finite_differences(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-5;
    let mut y = x.to_vec();
    (0..x.len())
        .map(|i| {
            y[i] = x[i] + h;
            let up = f(&y);
            y[i] = x[i] - h;
            let down = f(&y);
            y[i] = x[i];
            (up - down) / (2.0 * h)
        })
        .collect()
}

#[test]
fn the_reference_gradients_are_finite_differences_of_the_forward() {
    // Tiny shapes in f64, every feature: the reference backward is derived by hand, so it is
    // checked here against differences of the reference forward's loss `sum(o * dout)`.
    let mut rng = Rng::from_env();
    let dims = AttentionDims {
        b: 1,
        h: 2,
        h_kv: 1,
        sq: 5,
        sk: 4,
        d: 3,
    };
    let mut draw = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.normal()).collect() };
    let (nq, nk) = (
        dims.b * dims.h * dims.sq * dims.d,
        dims.b * dims.h_kv * dims.sk * dims.d,
    );
    let (q, k, v, dout) = (draw(nq), draw(nk), draw(nk), draw(nq));
    for (window, chunk, cap) in [
        ((-1, -1), 0, None),
        ((-1, 0), 0, None),
        ((1, 0), 0, Some(0.7)),
        ((0, 1), 0, Some(3.0)),
        ((-1, -1), 2, None),
        ((1, -1), 3, Some(2.0)),
    ] {
        let math = AttentionMath {
            scale: 0.8,
            window: reference::Window {
                chunk,
                ..window.into()
            },
            cap,
        };
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let o = reference::attention_forward_f64(q, k, v, dims, math);
            o.iter().zip(&dout).map(|(a, b)| a * b).sum()
        };
        let g = attention_backward_f64([&q, &k, &v, &dout], dims, math, Rounding::Exact);
        let fd = [
            finite_differences(&q, |x| loss(x, &k, &v)),
            finite_differences(&k, |x| loss(&q, x, &v)),
            finite_differences(&v, |x| loss(&q, &k, x)),
        ];
        for (name, got, want) in [
            ("dq", &g.dq, &fd[0]),
            ("dk", &g.dk, &fd[1]),
            ("dv", &g.dv, &fd[2]),
        ] {
            let err = rel_error(got, want);
            assert!(
                err < 1e-7,
                "window {window:?} chunk {chunk} cap {cap:?}: {name} off finite differences by \
                 {err:.3e}"
            );
        }
    }
}

#[test]
fn the_reference_gradients_with_a_value_head_dim_are_finite_differences() {
    // `dv` wider and narrower than `d`, causal and soft-capped: the reference forward and
    // backward with their own `dv` agree by differences of `sum(o * dout)`.
    let mut rng = Rng::from_env();
    let dims = AttentionDims {
        b: 1,
        h: 2,
        h_kv: 1,
        sq: 4,
        sk: 5,
        d: 3,
    };
    for (dv, window, cap) in [(5, (-1, 0), None), (2, (-1, -1), Some(1.5))] {
        let mut draw = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.normal()).collect() };
        let (q, k) = (draw(2 * 4 * 3), draw(5 * 3));
        let (v, dout) = (draw(5 * dv), draw(2 * 4 * dv));
        let math = AttentionMath {
            scale: 0.7,
            window: window.into(),
            cap,
        };
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let o = reference::attention_forward_f64_dv([q, k, v], dims, dv, math);
            o.iter().zip(&dout).map(|(a, b)| a * b).sum()
        };
        let g = attention_backward_f64_dv([&q, &k, &v, &dout], dims, dv, math, Rounding::Exact);
        for (name, got, want) in [
            ("dq", &g.dq, finite_differences(&q, |x| loss(x, &k, &v))),
            ("dk", &g.dk, finite_differences(&k, |x| loss(&q, x, &v))),
            ("dv", &g.dv, finite_differences(&v, |x| loss(&q, &k, x))),
        ] {
            let err = rel_error(got, &want);
            assert!(
                err < 1e-7,
                "dv {dv}: {name} off finite differences by {err:.3e}"
            );
        }
    }
}

#[test]
fn varlen_matches_each_sequence_on_its_own() {
    // Sequences of odd lengths, one with no keys (its rows see none: dq 0), one with no
    // queries (its keys get dk = dv = 0), sq > sk and sq < sk, causal with a window, chunks
    // (counted per sequence) and grouped heads; both dQ modes. Every gradient of a sequence must equal its dense
    // backward's; the pad rows stay poisoned. Rows no block may read are NaN: the pad rows,
    // and the unread inputs of the second and third sequences, right after the first's.
    let mut rng = Rng::from_env();
    let packed = Packed {
        seqs: vec![(70, 50), (40, 0), (0, 30), (100, 75), (20, 60)],
        pad: (3, 5),
    };
    for (causal, window, chunk, softcap, deterministic) in [
        (false, (-1, -1), 0, 0.0, false),
        (true, (40, -1), 0, 0.0, true),
        (false, (20, 10), 0, 15.0, false),
        (true, (-1, -1), 24, 0.0, false),
        (false, (-1, -1), 33, 0.0, true),
    ] {
        let p = AttentionBwdParams {
            d: 64,
            causal,
            kv_group: 2,
            dtype: DType::Bf16,
            window_left: window.0,
            window_right: window.1,
            attention_chunk: chunk,
            softcap,
            deterministic,
            ..AttentionBwdParams::default()
        };
        let x = Problem::new(&mut rng, packed.clone(), p, (2, 1), Dist::Normal);
        let [dq, dk, dv] = varlen_backward(&x);
        x.check(
            "attention backward varlen",
            &rng,
            Dist::Normal,
            [&dq, &dk, &dv],
        );
    }
}

/// Runs the varlen backward kernels of `x` on the interpreter (with `x`'s used lengths, the
/// `_used` kernels), every output poisoned: `[dq, dk, dv]`.
fn varlen_backward(x: &Problem) -> [HostTensor; 3] {
    let p = x.p;
    let [q, k, v, dout, o, lse] = &x.inputs;
    let (rows, acc_shape, kv_shape) = x.output_shapes();
    let mut delta = poisoned(&rows, DType::F32);
    let mut dq_accum = poisoned(&acc_shape, DType::F32);
    let mut dq = poisoned(&acc_shape, p.dtype);
    let mut dk = poisoned(&kv_shape, p.dtype);
    let mut dv = poisoned(&x.value_shape(), p.dtype);
    let [qgrid, kgrid, dq_grid] = x.grids();
    let (cu_q, cu_k, scale) = (&x.cu_q, &x.cu_k, x.scale);
    attention_bwd_preprocess_varlen
        .interpret(&p, qgrid, o, dout, &mut delta, &mut dq_accum, cu_q, cu_k)
        .unwrap();
    match &x.used {
        None => attention_bwd_dkdv_varlen.interpret(
            &p,
            kgrid,
            q,
            k,
            v,
            dout,
            lse,
            &delta,
            &mut dq_accum,
            &mut dk,
            &mut dv,
            cu_q,
            cu_k,
            scale,
        ),
        Some((used_q, used_k)) => attention_bwd_dkdv_varlen_used.interpret(
            &p,
            kgrid,
            q,
            k,
            v,
            dout,
            lse,
            &delta,
            &mut dq_accum,
            &mut dk,
            &mut dv,
            cu_q,
            cu_k,
            used_q,
            used_k,
            scale,
        ),
    }
    .unwrap();
    if p.deterministic {
        match &x.used {
            None => attention_bwd_dq_varlen.interpret(
                &p, dq_grid, q, k, v, dout, lse, &delta, &mut dq, cu_q, cu_k, scale,
            ),
            Some((used_q, used_k)) => attention_bwd_dq_varlen_used.interpret(
                &p, dq_grid, q, k, v, dout, lse, &delta, &mut dq, cu_q, cu_k, used_q, used_k, scale,
            ),
        }
        .unwrap();
    } else {
        attention_bwd_dq_convert_varlen
            .interpret(&p, qgrid, &dq_accum, &mut dq, cu_q, cu_k, scale)
            .unwrap();
    }
    [dq, dk, dv]
}

#[test]
fn value_head_dims_of_their_own_match_reference() {
    // FlashAttention 3's `headdim_v`: MLA's d = 192 beside dv = 128 (dK in three column chunks
    // of 64, dV in two: three blocks a key block, the third storing no dV; dQ in three of 64),
    // dv narrower than d (128 / 64: the second block stores no dV) and wider (64 / 128: dK in
    // two chunks of 32 beside dV's two of 64; 32 / 256: dK's one chunk against dV's four, so
    // three blocks store no dK and add no dQ), dv = 32 beside d = 64 (one block); causal,
    // grouped heads, both dQ modes.
    let mut rng = Rng::from_env();
    for (d, dv, splits, causal, h_kv, deterministic) in [
        (192, 128, 3, false, 2, false),
        (192, 128, 3, true, 1, true),
        (64, 128, 2, true, 2, false),
        (64, 128, 2, false, 1, true),
        (128, 64, 2, true, 1, false),
        (128, 64, 2, false, 2, true),
        (64, 32, 1, true, 2, false),
        (32, 256, 4, true, 2, false),
        (32, 256, 4, false, 1, true),
    ] {
        let mut c = Call {
            dv,
            causal,
            deterministic,
            ..Call::new(90, 75)
        };
        c.dims.d = d;
        c.dims.h = 2;
        c.dims.h_kv = h_kv;
        let p = c.params();
        assert_eq!(p.column_splits(), splits, "{p:?}");
        run(&mut rng, c, Dist::Normal);
    }
}

#[test]
fn varlen_with_value_head_dims_of_their_own_matches_each_sequence() {
    let mut rng = Rng::from_env();
    let packed = Packed {
        seqs: vec![(70, 50), (40, 0), (0, 30), (100, 75)],
        pad: (3, 5),
    };
    for (d, dv, causal, deterministic) in [(64, 128, true, false), (128, 64, false, true)] {
        let p = AttentionBwdParams {
            d,
            dv,
            causal,
            kv_group: 2,
            deterministic,
            ..AttentionBwdParams::default()
        };
        let x = Problem::new(&mut rng, packed.clone(), p, (2, 1), Dist::Normal);
        let [dq, dk, dv] = varlen_backward(&x);
        x.check(
            "attention backward varlen dv",
            &rng,
            Dist::Normal,
            [&dq, &dk, &dv],
        );
    }
}

#[test]
fn varlen_with_used_lengths_matches_each_sequence_over_its_used_rows() {
    // FlashAttention 3's `seqused_q`, `seqused_k`: each sequence's gradients are its dense
    // backward's over its used rows and keys; its rows past them get dq = 0 and its keys
    // dk = dv = 0; the inputs past them (never written by the forward) are NaN; pad rows stay
    // poisoned. Used lengths shorter than, equal to and 0 against the offsets; causal (aligned
    // to the used lengths), a window, grouped heads, a dv of its own; both dQ modes.
    let mut rng = Rng::from_env();
    let packed = Packed {
        seqs: vec![(70, 50), (40, 30), (30, 30), (100, 75), (20, 60)],
        pad: (3, 5),
    };
    let used = vec![(45, 50), (40, 0), (0, 20), (100, 66), (13, 33)];
    for (causal, window, dv, deterministic) in [
        (false, (-1, -1), 0, false),
        (true, (-1, -1), 0, true),
        (false, (20, 10), 0, true),
        (true, (-1, -1), 128, false),
    ] {
        let p = AttentionBwdParams {
            d: 64,
            dv,
            causal,
            kv_group: 2,
            window_left: window.0,
            window_right: window.1,
            deterministic,
            ..AttentionBwdParams::default()
        };
        let x = Problem::with_used(
            &mut rng,
            packed.clone(),
            Some(used.clone()),
            p,
            (2, 1),
            Dist::Normal,
        );
        let [dq, dk, dv] = varlen_backward(&x);
        x.check(
            "attention backward varlen used",
            &rng,
            Dist::Normal,
            [&dq, &dk, &dv],
        );
    }
}
