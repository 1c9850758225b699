//! The attention example's FlashAttention features on the CPU interpreter against the f64
//! reference: f16 beside bf16, sliding windows `(left, right)` (bottom-right aligned, causal
//! being `(-1, 0)`), chunks (`attention_chunk`), logit soft-capping, head dim 96, the log-sum-exp output
//! (`attention_lse`), and their combinations with grouped heads; shapes that are not multiples of the tiles, `sq != sk`, rows that see no key, every
//! input distribution, outputs poisoned before the run.

use kiln_examples::attention::{AttentionParams, BLOCK_M, attention, attention_lse};
use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, assert_close, poisoned, rel_error, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// One call of the attention kernel: shapes and the comptime features.
#[derive(Clone, Copy, Debug)]
struct Call {
    b: usize,
    h: usize,
    h_kv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dtype: DType,
    causal: bool,
    window: (i32, i32),
    /// Keys per chunk (`attention_chunk`); 0: none.
    chunk: i32,
    softcap: f32,
    /// Run `attention_lse` and check its log-sum-exp too.
    lse: bool,
}

impl Call {
    /// `d = 64`, bf16, one batch of two heads, no mask, no cap: what each test changes.
    fn new(sq: usize, sk: usize) -> Call {
        Call {
            b: 1,
            h: 2,
            h_kv: 2,
            sq,
            sk,
            d: 64,
            dtype: DType::Bf16,
            causal: false,
            window: (-1, -1),
            chunk: 0,
            softcap: 0.0,
            lse: false,
        }
    }

    /// The window the reference applies: FlashAttention's, where causal makes `right` 0.
    fn reference_window(&self) -> reference::Window {
        let right = if self.causal { 0 } else { self.window.1 };
        reference::Window {
            left: i64::from(self.window.0),
            right: i64::from(right),
            chunk: i64::from(self.chunk),
        }
    }
}

/// `t: [b, hkv, s, d]` with each head repeated `group` times (`[b, hkv * group, s, d]`): the
/// keys and values every query head of a grouped-query call reads.
fn repeat_heads(t: &HostTensor, group: usize) -> HostTensor {
    let [b, hkv, s, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    let h = hkv * group;
    HostTensor::from_fn(&[b, h, s, d], t.dtype(), |i| {
        let (x, j, hh, n) = (i % d, i / d % s, i / (d * s) % h, i / (d * s * h));
        t.data.get_f64(t.offset(&[n, hh / group, j, x]))
    })
}

/// Runs `c` on the interpreter over inputs drawn from `dist` into a poisoned output, checks it
/// against the f64 reference, and returns the output (as f64) for further checks.
fn run(rng: &mut Rng, c: Call, dist: Dist) -> Vec<f64> {
    let q = tensor(rng, &[c.b, c.h, c.sq, c.d], c.dtype, dist);
    let k = tensor(rng, &[c.b, c.h_kv, c.sk, c.d], c.dtype, dist);
    let v = tensor(rng, &[c.b, c.h_kv, c.sk, c.d], c.dtype, dist);
    // The usual 1/sqrt(d), perturbed so that no test depends on one exact scale.
    let scale = (rng.uniform(0.5, 1.5) / (c.d as f64).sqrt()) as f32;
    let mut o = poisoned(&[c.b, c.h, c.sq, c.d], c.dtype);
    let group = c.h / c.h_kv;
    let p = AttentionParams {
        d: c.d,
        dv: 0,
        causal: c.causal,
        block_n: 0,
        kv_group: group,
        dtype: c.dtype,
        window_left: c.window.0,
        window_right: c.window.1,
        attention_chunk: c.chunk,
        softcap: c.softcap,
        block_m: BLOCK_M,
    };
    let grid = attention.grid(&p, [c.sq, c.h, c.b]);
    let mut lse = poisoned(&[c.b, c.h, c.sq], DType::F32);
    if c.lse {
        attention_lse
            .interpret(&p, grid, &q, &k, &v, &mut o, &mut lse, scale)
            .unwrap();
    } else {
        attention
            .interpret(&p, grid, &q, &k, &v, &mut o, scale)
            .unwrap();
    }
    let case = Case {
        kernel: format!(
            "attention<d={},{:?},causal={},window={:?},chunk={},softcap={},kv_group={group}>",
            c.d, c.dtype, c.causal, c.window, c.chunk, c.softcap
        ),
        shape: format!(
            "b={} h={} h_kv={} sq={} sk={} scale={scale}",
            c.b, c.h, c.h_kv, c.sq, c.sk
        ),
        dist,
        seed: rng.seed(),
    };
    let cap = (c.softcap > 0.0).then_some(f64::from(c.softcap));
    let want = reference::attention_window(
        &q,
        &repeat_heads(&k, group),
        &repeat_heads(&v, group),
        f64::from(scale),
        c.reference_window(),
        cap,
    );
    assert_close(&case, &o, &want, tolerance(c.dtype));
    if c.lse {
        check_lse(
            &case,
            &lse,
            &reference::attention_lse(
                &q,
                &repeat_heads(&k, group),
                f64::from(scale),
                c.reference_window(),
                cap,
            ),
        );
    }
    o.to_f64_vec()
}

/// The log-sum-exp against the reference: `+inf` exactly where a row sees no key, elsewhere
/// within f32's tolerance (relative norm error over those rows).
fn check_lse(case: &Case, got: &HostTensor, want: &[f64]) {
    let got = got.to_f64_vec();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            *g == f64::INFINITY,
            *w == f64::INFINITY,
            "{case:?}: lse[{i}] = {g}, want {w}"
        );
    }
    let (g, w): (Vec<f64>, Vec<f64>) = got
        .iter()
        .zip(want)
        .filter(|(_, w)| w.is_finite())
        .map(|(g, w)| (*g, *w))
        .unzip();
    let err = rel_error(&g, &w);
    assert!(
        err < tolerance(DType::F32),
        "{case:?}: lse relative error {err:.3e}"
    );
}

#[test]
fn f16_matches_reference() {
    let mut rng = Rng::from_env();
    for (sq, sk, causal) in [(100, 100, false), (150, 90, true), (70, 200, true)] {
        for dist in Dist::ALL {
            let c = Call {
                dtype: DType::F16,
                causal,
                ..Call::new(sq, sk)
            };
            run(&mut rng, c, dist);
        }
    }
}

#[test]
fn sliding_windows_match_reference() {
    // 128-key blocks (d = 64) over 300 keys: windows narrower than a block make the walk
    // start past block 0 and stop before the last; windows that straddle block edges mask
    // blocks on both sides; one-sided windows (left only, right only) and the causal
    // spelling with a left bound; sq < sk and sq > sk.
    let mut rng = Rng::from_env();
    let windows: [((i32, i32), bool); 7] = [
        ((20, 0), false),
        ((20, 5), true),
        ((7, 9), false),
        ((0, 0), false),
        ((-1, 40), false),
        ((100, -1), false),
        ((130, 130), false),
    ];
    for (window, causal) in windows {
        for (sq, sk) in [(300, 300), (130, 300)] {
            let c = Call {
                window,
                causal,
                ..Call::new(sq, sk)
            };
            run(&mut rng, c, Dist::Normal);
        }
    }
    // Every distribution on one window with both edges inside the tiles.
    for dist in Dist::ALL {
        let c = Call {
            window: (33, 17),
            ..Call::new(200, 260)
        };
        run(&mut rng, c, dist);
    }
}

#[test]
fn chunks_match_reference() {
    // FlashAttention 3's `attention_chunk` (128-key blocks at d = 64 over 300 keys): chunks
    // narrower than a block, straddling block edges and wider than a block; alone, causal,
    // with a left window inside the chunk and a two-sided one wider than it; sq = sk, sq < sk
    // (the diagonals shifted into later chunks) and sq > sk (diagonals below key 0, in
    // negative chunks); the log-sum-exp on every other case.
    let mut rng = Rng::from_env();
    let cases: [(i32, (i32, i32), bool); 6] = [
        (48, (-1, -1), false),
        (100, (-1, -1), true),
        (200, (30, -1), false),
        (64, (90, 90), false),
        (17, (-1, 2), true),
        (256, (-1, -1), false),
    ];
    for (i, (chunk, window, causal)) in cases.into_iter().enumerate() {
        for (sq, sk) in [(300, 300), [(130, 300), (300, 130)][i % 2]] {
            let c = Call {
                window,
                chunk,
                causal,
                lse: i % 2 == 0,
                ..Call::new(sq, sk)
            };
            run(&mut rng, c, Dist::Normal);
        }
    }
    // Every distribution, f16 and grouped heads on one chunked call.
    for dist in Dist::ALL {
        let c = Call {
            chunk: 40,
            causal: true,
            dtype: DType::F16,
            h: 4,
            h_kv: 1,
            ..Call::new(150, 170)
        };
        run(&mut rng, c, dist);
    }
}

#[test]
fn rows_outside_every_window_output_zero() {
    // sq = 300 > sk = 100: row i's diagonal key is i - 200, so with right bound 5 rows
    // 0..195 see no key (a whole query block, and part of the next); left-only windows give
    // every row a key.
    let mut rng = Rng::from_env();
    let (sq, sk, d) = (300, 100, 64);
    for window in [(10, 5), (-1, 5)] {
        let c = Call {
            window,
            ..Call::new(sq, sk)
        };
        let out = run(&mut rng, c, Dist::Normal);
        let blind = 195;
        for head in out.chunks(sq * d) {
            assert!(
                head[..blind * d].iter().all(|&x| x == 0.0),
                "window {window:?}: rows that see no key must be 0, KILN_SEED={}",
                rng.seed()
            );
        }
    }
}

#[test]
fn softcap_matches_reference() {
    // Caps well inside the scores' range (large inputs reach scores of ~1e4, so tanh
    // saturates) and one above it (nearly linear), with masks and f16.
    let mut rng = Rng::from_env();
    for (softcap, causal, dtype) in [
        (5.0, false, DType::Bf16),
        (30.0, true, DType::Bf16),
        (1.5, true, DType::F16),
    ] {
        for dist in Dist::ALL {
            let c = Call {
                softcap,
                causal,
                dtype,
                ..Call::new(150, 90)
            };
            run(&mut rng, c, dist);
        }
    }
}

#[test]
fn head_dim_96_matches_reference() {
    // d = 96 runs tiles 96 columns wide (not d = 128's, padded): lengths that are not
    // multiples of the tiles, causal and not, causal with sq > sk (its first rows see no key
    // and output 0), every input distribution (large magnitudes included).
    let p = AttentionParams {
        d: 96,
        ..AttentionParams::default()
    };
    let spec = Spec::uniform(p, attention.signature(), true);
    let text = kiln_ir::print::print_kernel(&attention.build(&spec).expect("builds"));
    for tile in ["rt<bf16,128x96>", "rt<bf16,64x96>", "rt<f32,128x96>"] {
        assert!(text.contains(tile), "no {tile} in\n{text}");
    }
    assert!(
        !text.contains("x128>"),
        "a tile padded to 128 columns:\n{text}"
    );
    let mut rng = Rng::from_env();
    for (sq, sk, causal) in [(130, 70, false), (70, 130, true), (157, 61, true)] {
        for dist in Dist::ALL {
            let c = Call {
                d: 96,
                causal,
                ..Call::new(sq, sk)
            };
            run(&mut rng, c, dist);
        }
    }
}

#[test]
fn features_combine_with_grouped_heads() {
    // f16, a window, a soft-cap and grouped-query heads (4 query heads over 2 and over 1)
    // in one call, batch 2, d = 96 and d = 128.
    let mut rng = Rng::from_env();
    for (h_kv, d, window, causal) in [(2, 128, (40, -1), false), (1, 96, (25, 0), true)] {
        let c = Call {
            b: 2,
            h: 4,
            h_kv,
            d,
            dtype: DType::F16,
            causal,
            window,
            softcap: 20.0,
            ..Call::new(140, 110)
        };
        run(&mut rng, c, Dist::Normal);
    }
}

#[test]
fn log_sum_exp_matches_reference() {
    // Rows that see no key (sq > sk, causal) get +inf; a window, a soft-cap and f16 change
    // which scores are summed and how; every distribution on one shape.
    let mut rng = Rng::from_env();
    for dist in Dist::ALL {
        let c = Call {
            causal: true,
            lse: true,
            ..Call::new(150, 90)
        };
        run(&mut rng, c, dist);
    }
    for (window, softcap, dtype, d) in [
        ((20, 5), 0.0, DType::Bf16, 64),
        ((-1, -1), 10.0, DType::F16, 64),
        ((40, -1), 30.0, DType::Bf16, 96),
    ] {
        let c = Call {
            window,
            softcap,
            dtype,
            d,
            lse: true,
            ..Call::new(300, 140)
        };
        run(&mut rng, c, Dist::Normal);
    }
}
