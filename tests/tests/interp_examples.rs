//! Every example kernel of `kiln-examples` under the interpreter against its f64 reference:
//! several shapes including ones that are not tile multiples, every input distribution,
//! comptime variants, and outputs poisoned with NaN before each run.

mod gemm_family;

use gemm_family::Tile;
use kiln_examples::attention::{AttentionParams, BLOCK_M};
use kiln_examples::softmax::SoftmaxComptime;
use kiln_ir::dsl::KernelDef;
use kiln_ir::interp::{HostArg, run_def};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{AttentionShape, Dist, Rng, tensor, with_row_padding};
use kiln_tests::reference;

fn cdiv(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

#[test]
fn vector_add_matches_reference() {
    let def = &kiln_examples::vector_add::vector_add;
    let mut rng = Rng::from_env();
    for n in [1, 1023, 1024, 5000] {
        for dist in Dist::ALL {
            let a = tensor(&mut rng, &[n], DType::F32, dist);
            let b = tensor(&mut rng, &[n], DType::F32, dist);
            let mut c = poisoned(&[n], DType::F32);
            let mut args = [
                HostArg::Tensor(&a),
                HostArg::Tensor(&b),
                HostArg::TensorMut(&mut c),
            ];
            // Grid: (cdiv(n, 1024), 1, 1).
            run_def(def, &(), [cdiv(n, 1024), 1, 1], &mut args).unwrap();
            let case = Case {
                kernel: "vector_add".into(),
                shape: format!("n={n}"),
                dist,
                seed: rng.seed(),
            };
            assert_close(
                &case,
                &c,
                &reference::vector_add(&a, &b),
                tolerance(DType::F32),
            );
        }
    }
}

#[test]
fn softmax_matches_reference() {
    let def = &kiln_examples::softmax::softmax;
    let mut rng = Rng::from_env();
    for (bm, bn) in [(4, 512), (8, 128)] {
        let ct = SoftmaxComptime {
            BM: bm,
            BN: bn,
            ..Default::default()
        };
        for (m, n) in [(1, 1), (7, 1000), (33, 513), (16, 1024)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                // Normal inputs go through padded rows: a non-contiguous outer stride.
                let x = if dist == Dist::Normal {
                    with_row_padding(&x, 5)
                } else {
                    x
                };
                let mut y = poisoned(&[m, n], DType::F32);
                let mut args = [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)];
                // Grid: (cdiv(M, BM), 1, 1).
                run_def(def, &ct, [cdiv(m, bm), 1, 1], &mut args).unwrap();
                let case = Case {
                    kernel: format!("softmax<BM={bm},BN={bn}>"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(
                    &case,
                    &y,
                    &reference::softmax_rows(&x),
                    tolerance(DType::F32),
                );
            }
        }
    }
}

#[test]
fn gemm_matches_reference() {
    let def = &kiln_examples::gemm::gemm;
    let mut rng = Rng::from_env();
    for b_col_major in [false, true] {
        for (bm, bn, bk, stages) in [(128, 128, 32, 3), (64, 64, 64, 4)] {
            let ct = Tile::new((bm, bn, bk, stages), b_col_major, DType::Bf16).gemm();
            for (m, n, k) in [(130, 70, 50), (1, 1, 1), (128, 128, 64), (65, 200, 97)] {
                for dist in Dist::ALL {
                    let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
                    // Normal inputs read `a` through padded rows (strides not 16-byte aligned).
                    let a = if dist == Dist::Normal {
                        with_row_padding(&a, 3)
                    } else {
                        a
                    };
                    // Column-major B is passed as `b^T: [n, k]`.
                    let (b_shape, b_pad) = if b_col_major {
                        ([n, k], 5)
                    } else {
                        ([k, n], 0)
                    };
                    let b = tensor(&mut rng, &b_shape, DType::Bf16, dist);
                    // Normal inputs read column-major `b` through padded rows too.
                    let b = if dist == Dist::Normal && b_pad > 0 {
                        with_row_padding(&b, b_pad)
                    } else {
                        b
                    };
                    let mut c = poisoned(&[m, n], DType::Bf16);
                    let mut args = [
                        HostArg::Tensor(&a),
                        HostArg::Tensor(&b),
                        HostArg::TensorMut(&mut c),
                    ];
                    // Grid: (cdiv(M, BM), cdiv(N, BN), 1).
                    run_def(def, &ct, [cdiv(m, bm), cdiv(n, bn), 1], &mut args).unwrap();
                    let case = Case {
                        kernel: format!("gemm<BM={bm},BN={bn},BK={bk},b_col_major={b_col_major}>"),
                        shape: format!("m={m} n={n} k={k}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let want = if b_col_major {
                        reference::gemm_bt(&a, &b)
                    } else {
                        reference::gemm(&a, &b)
                    };
                    assert_close(&case, &c, &want, tolerance(DType::Bf16));
                }
            }
        }
    }
}

/// The attention kernel's comptime values: `d`, `causal`, `kv_group` and `block_m` as given,
/// the rest at their defaults (bf16, no window, no soft-cap, the kernel's own key block).
fn attention_comptime(d: usize, causal: bool, kv_group: usize, block_m: usize) -> AttentionParams {
    AttentionParams {
        d,
        causal,
        kv_group,
        block_m,
        ..AttentionParams::default()
    }
}

/// Runs the attention kernel with `block_m` query rows per block on fresh inputs of `p` and
/// checks it against the f64 reference.
fn run_attention(rng: &mut Rng, p: &AttentionShape, dist: Dist, block_m: usize) {
    let def = &kiln_examples::attention::attention;
    let [q, k, v] = p.tensors(rng, dist);
    // Normal inputs read `k` through padded rows (strides not 16-byte aligned).
    let k = if dist == Dist::Normal {
        with_row_padding(&k, 1)
    } else {
        k
    };
    // The usual 1/sqrt(d), perturbed so that no test depends on one exact scale.
    let scale = (rng.uniform(0.5, 1.5) / (p.d as f64).sqrt()) as f32;
    let mut o = poisoned(&[p.b, p.h, p.sq, p.d], DType::Bf16);
    let ct = attention_comptime(p.d, p.causal, 1, block_m);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut o),
        HostArg::F32(scale),
    ];
    run_def(def, &ct, p.grid(block_m), &mut args).unwrap();
    let case = Case {
        kernel: format!("attention<d={},causal={},block_m={block_m}>", p.d, p.causal),
        shape: format!("b={} h={} sq={} sk={} scale={scale}", p.b, p.h, p.sq, p.sk),
        dist,
        seed: rng.seed(),
    };
    let want = reference::attention(&q, &k, &v, f64::from(scale), p.causal);
    assert_close(&case, &o, &want, tolerance(DType::Bf16));
}

#[test]
fn attention_matches_reference() {
    let mut rng = Rng::from_env();
    for d in [64, 128] {
        for (sq, sk, causal) in [(100, 100, false), (100, 100, true), (150, 90, true)] {
            for dist in Dist::ALL {
                let p = AttentionShape {
                    b: 1,
                    h: 2,
                    sq,
                    sk,
                    d,
                    causal,
                };
                run_attention(&mut rng, &p, dist, BLOCK_M);
            }
        }
    }
}

#[test]
fn attention_batches_and_long_keys() {
    // Several key blocks per query block, batch > 1, sq < sk with causal masking, and a
    // whole query block (sq = 300, sk = 40) that sees no key.
    let mut rng = Rng::from_env();
    for (sq, sk, causal) in [(130, 300, false), (60, 200, true), (300, 40, true)] {
        let p = AttentionShape {
            b: 2,
            h: 1,
            sq,
            sk,
            d: 64,
            causal,
        };
        run_attention(&mut rng, &p, Dist::Normal, BLOCK_M);
    }
}

#[test]
fn attention_of_192_row_blocks_matches_reference() {
    // FlashAttention-3's d = 64 query block (three consumer warpgroups on sm_90a): ragged
    // sequences (1000; 385 = 2 * 192 + 1, the small analogue of 4097), sq != sk both ways,
    // causal with sq > sk (rows that see no key), and large magnitudes.
    let mut rng = Rng::from_env();
    let cases = [
        (1000, 1000, true, Dist::Normal),
        (385, 385, false, Dist::Large),
        (385, 130, true, Dist::Normal),
        (200, 520, false, Dist::Uniform),
        (200, 520, true, Dist::Large),
    ];
    for (sq, sk, causal, dist) in cases {
        let p = AttentionShape {
            b: 1,
            h: 2,
            sq,
            sk,
            d: 64,
            causal,
        };
        run_attention(&mut rng, &p, dist, 192);
    }
}

/// `t: [b, hkv, s, d]` with each head repeated `group` times in a row (`[b, hkv * group, s,
/// d]`): the keys and values every query head of a grouped-query kernel reads.
fn repeat_heads(t: &HostTensor, group: usize) -> HostTensor {
    let [b, hkv, s, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    let shape = [b, hkv * group, s, d];
    HostTensor::from_fn(&shape, t.dtype(), |i| {
        let (x, j, h, n) = (
            i % d,
            i / d % s,
            i / (d * s) % (hkv * group),
            i / (d * s * hkv * group),
        );
        t.data.get_f64(t.offset(&[n, h / group, j, x]))
    })
}

#[test]
fn attention_grouped_and_multi_query_heads() {
    // Query head h reads key/value head h / kv_group: 4 query heads over 2 (grouped-query)
    // and over 1 (multi-query) key/value heads, against the reference on repeated heads.
    let mut rng = Rng::from_env();
    let def = &kiln_examples::attention::attention;
    let (b, h, sq, sk, d) = (2, 4, 130, 75, 64);
    for (hkv, causal) in [(2, false), (1, true)] {
        let group = h / hkv;
        let q = tensor(&mut rng, &[b, h, sq, d], DType::Bf16, Dist::Normal);
        let k = tensor(&mut rng, &[b, hkv, sk, d], DType::Bf16, Dist::Normal);
        let v = tensor(&mut rng, &[b, hkv, sk, d], DType::Bf16, Dist::Normal);
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let mut o = poisoned(&[b, h, sq, d], DType::Bf16);
        let ct = attention_comptime(d, causal, group, BLOCK_M);
        let mut args = [
            HostArg::Tensor(&q),
            HostArg::Tensor(&k),
            HostArg::Tensor(&v),
            HostArg::TensorMut(&mut o),
            HostArg::F32(scale),
        ];
        run_def(def, &ct, [cdiv(sq, BLOCK_M), h as u32, b as u32], &mut args).unwrap();
        let case = Case {
            kernel: format!("attention<d={d},causal={causal},kv_group={group}>"),
            shape: format!("b={b} h={h} hkv={hkv} sq={sq} sk={sk}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        let (k, v) = (repeat_heads(&k, group), repeat_heads(&v, group));
        let want = reference::attention(&q, &k, &v, f64::from(scale), causal);
        assert_close(&case, &o, &want, tolerance(DType::Bf16));
    }
}

#[test]
fn fully_masked_rows_output_zero() {
    // sq = 150 > sk = 90 causal: queries 0..60 see no key; their output must be exactly 0.
    let mut rng = Rng::from_env();
    let def = &kiln_examples::attention::attention;
    let (sq, sk, d) = (150, 90, 64);
    let q = tensor(&mut rng, &[1, 1, sq, d], DType::Bf16, Dist::Normal);
    let k = tensor(&mut rng, &[1, 1, sk, d], DType::Bf16, Dist::Normal);
    let v = tensor(&mut rng, &[1, 1, sk, d], DType::Bf16, Dist::Normal);
    let mut o: HostTensor = poisoned(&[1, 1, sq, d], DType::Bf16);
    let ct = attention_comptime(d, true, 1, BLOCK_M);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut o),
        HostArg::F32(0.125),
    ];
    run_def(def, &ct, [cdiv(sq, BLOCK_M), 1, 1], &mut args).unwrap();
    let out = o.to_f64_vec();
    let masked = (sq - sk) * d;
    assert!(
        out[..masked].iter().all(|&x| x == 0.0),
        "rows that see no key must be 0, KILN_SEED={}",
        rng.seed()
    );
    assert!(
        out[masked..].iter().all(|x| x.is_finite()),
        "KILN_SEED={}",
        rng.seed()
    );
}

#[test]
fn typed_interpret_methods_agree_with_references() {
    // The `interpret` methods the macro generates: the comptime struct, the grid (from the
    // kernel's grid function), then the launch arguments in order.
    let mut rng = Rng::from_env();
    let (m, n) = (9, 700);
    let x = tensor(&mut rng, &[m, n], DType::F32, Dist::Normal);
    let mut y = poisoned(&[m, n], DType::F32);
    let softmax = kiln_examples::softmax::softmax;
    let c = SoftmaxComptime {
        BM: 4,
        BN: 256,
        ..Default::default()
    };
    softmax
        .interpret(&c, softmax.grid(&c, [m, 1, 1]), &x, &mut y)
        .unwrap();
    let case = Case {
        kernel: "softmax.interpret<BM=4,BN=256>".into(),
        shape: format!("m={m} n={n}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    assert_close(
        &case,
        &y,
        &reference::softmax_rows(&x),
        tolerance(DType::F32),
    );

    let (sq, sk, d) = (70, 130, 128);
    let q = tensor(&mut rng, &[1, 1, sq, d], DType::Bf16, Dist::Uniform);
    let k = tensor(&mut rng, &[1, 1, sk, d], DType::Bf16, Dist::Uniform);
    let v = tensor(&mut rng, &[1, 1, sk, d], DType::Bf16, Dist::Uniform);
    let mut o = poisoned(&[1, 1, sq, d], DType::Bf16);
    let scale = 1.0 / (d as f32).sqrt();
    let attention = kiln_examples::attention::attention;
    let p = attention_comptime(d, true, 1, BLOCK_M);
    attention
        .interpret(
            &p,
            attention.grid(&p, [sq, 1, 1]),
            &q,
            &k,
            &v,
            &mut o,
            scale,
        )
        .unwrap();
    let case = Case {
        kernel: "attention.interpret<d=128,causal=true>".into(),
        shape: format!("b=1 h=1 sq={sq} sk={sk}"),
        dist: Dist::Uniform,
        seed: rng.seed(),
    };
    let want = reference::attention(&q, &k, &v, f64::from(scale), true);
    assert_close(&case, &o, &want, tolerance(DType::Bf16));
}
