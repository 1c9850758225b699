//! The integer, bit, transcendental and random-number ops under the interpreter, against
//! independent references: Philox4x32-10 written out here (itself checked against the
//! Random123 known-answer vectors), PTX's integer semantics, and f64 `std` maths. Lengths
//! that are no multiple of any tile, inputs of every distribution, outputs poisoned.

mod ops_kernels;

use kiln_ir::{DType, HostTensor, TensorData};
use kiln_tests::check::poisoned;
use kiln_tests::inputs::{Dist, Rng, tensor};
use ops_kernels::*;

/// Lengths: one element, a partial tile, several tiles with a ragged tail.
const LENGTHS: [usize; 3] = [1, 1000, 4097];

/// Philox4x32-10 of `ctr` under `key`, from the construction in Salmon et al. (SC'11).
pub fn philox_reference(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for _ in 0..10 {
        let p0 = u64::from(0xD251_1F53u32) * u64::from(c[0]);
        let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [
            k[0].wrapping_add(0x9E37_79B9),
            k[1].wrapping_add(0xBB67_AE85),
        ];
    }
    c
}

/// Triton's `uint_to_uniform_float` for a u32.
fn uniform_reference(x: u32) -> f32 {
    let s = x as i32;
    let s = if s < 0 { -(s as i64) - 1 } else { s as i64 };
    s as i32 as f32 * 4.656_612_734_2e-10_f64 as f32
}

fn u32s(t: &HostTensor) -> &[u32] {
    match &t.data {
        TensorData::U32(v) => v,
        _ => panic!("not a u32 tensor"),
    }
}

fn i32s(t: &HostTensor) -> &[i32] {
    match &t.data {
        TensorData::I32(v) => v,
        _ => panic!("not an i32 tensor"),
    }
}

fn f32s(t: &HostTensor) -> &[f32] {
    match &t.data {
        TensorData::F32(v) => v,
        _ => panic!("not an f32 tensor"),
    }
}

fn grid(n: usize, block: usize) -> [u32; 3] {
    [n.div_ceil(block) as u32, 1, 1]
}

#[test]
fn philox_reference_matches_random123_known_answers() {
    // Random123's kat_vectors for philox4x32_10.
    assert_eq!(
        philox_reference([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        philox_reference([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
    );
    assert_eq!(
        philox_reference(
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0]
        ),
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
    );
}

#[test]
fn randint4x_matches_the_reference_bit_for_bit() {
    let mut rng = Rng::from_env();
    for block in [128, 512] {
        let ct = PhiloxWordsComptime { BLOCK: block };
        for n in LENGTHS {
            for dist in Dist::ALL {
                let offs = tensor(&mut rng, &[n], DType::I32, dist);
                let (lo, hi) = (rng.next_u64() as u32, rng.next_u64() as i32);
                let mut w = poisoned(&[4, n], DType::U32);
                philox_words
                    .interpret(&ct, grid(n, block), &offs, &mut w, lo, hi)
                    .unwrap();
                let got = u32s(&w);
                for (i, &o) in i32s(&offs).iter().enumerate() {
                    let want = philox_reference([o as u32, 0, 0, 0], [lo, hi as u32]);
                    for k in 0..4 {
                        assert_eq!(
                            got[k * n + i],
                            want[k],
                            "word {k} of offset {o} key ({lo:#x}, {hi:#x}), n={n} block={block} \
                             {dist} (replay with KILN_SEED={})",
                            rng.seed()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn randint_and_rand_match_the_reference_and_randn_is_normal() {
    let mut rng = Rng::from_env();
    let ct = RandDrawsComptime { BLOCK: 512 };
    for n in LENGTHS {
        for dist in Dist::ALL {
            let offs = tensor(&mut rng, &[n], DType::U32, dist);
            // Negative seeds are sign-extended to 64 bits, as Triton widens an int32 seed.
            let seed = rng.next_u64() as i32;
            let key = [seed as u32, if seed < 0 { u32::MAX } else { 0 }];
            let mut ri = poisoned(&[n], DType::U32);
            let mut ru = poisoned(&[n], DType::F32);
            let mut rn = poisoned(&[n], DType::F32);
            rand_draws
                .interpret(&ct, grid(n, 512), &offs, &mut ri, &mut ru, &mut rn, seed)
                .unwrap();
            for (i, &o) in u32s(&offs).iter().enumerate() {
                let w = philox_reference([o, 0, 0, 0], key);
                let ctx = format!(
                    "offset {o} seed {seed} n={n} {dist} (KILN_SEED={})",
                    rng.seed()
                );
                assert_eq!(u32s(&ri)[i], w[0], "randint: {ctx}");
                let u = f32s(&ru)[i];
                assert_eq!(
                    u.to_bits(),
                    uniform_reference(w[0]).to_bits(),
                    "rand: {ctx}"
                );
                assert!((0.0..1.0).contains(&u), "rand out of [0, 1): {u} {ctx}");
                // Box-Muller in f64 on the same uniforms.
                let u1 = f64::from(uniform_reference(w[0]).max(1e-7));
                let u2 = f64::from(uniform_reference(w[1]));
                let want = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let got = f64::from(f32s(&rn)[i]);
                assert!(
                    (got - want).abs() <= 2e-6 * want.abs().max(1.0),
                    "randn = {got}, want {want}: {ctx}"
                );
            }
        }
    }
}

#[test]
fn rand4x_maps_each_philox_word_as_rand_does() {
    let mut rng = Rng::from_env();
    let ct = Rand4xDrawsComptime { BLOCK: 512 };
    for n in LENGTHS {
        for dist in Dist::ALL {
            let offs = tensor(&mut rng, &[n], DType::U32, dist);
            let (lo, hi) = (rng.next_u64() as u32, rng.next_u64() as u32);
            let mut u = poisoned(&[4, n], DType::F32);
            rand4x_draws
                .interpret(&ct, grid(n, 512), &offs, &mut u, lo, hi)
                .unwrap();
            for (i, &o) in u32s(&offs).iter().enumerate() {
                let w = philox_reference([o, 0, 0, 0], [lo, hi]);
                for (k, &word) in w.iter().enumerate() {
                    let got = f32s(&u)[k * n + i];
                    let ctx = format!(
                        "word {k} of offset {o}, key ({lo:#x}, {hi:#x}) n={n} {dist} \
                         (KILN_SEED={})",
                        rng.seed()
                    );
                    assert_eq!(got.to_bits(), uniform_reference(word).to_bits(), "{ctx}");
                    assert!((0.0..1.0).contains(&got), "out of [0, 1): {got} {ctx}");
                }
            }
        }
    }
}

#[test]
fn randn_and_rand_have_the_right_distribution() {
    let mut rng = Rng::from_env();
    let n = 100_000;
    let offs = HostTensor::new(&[n], TensorData::U32((0..n as u32).collect())).unwrap();
    let seed = rng.next_u64() as i32;
    let mut ri = poisoned(&[n], DType::U32);
    let mut ru = poisoned(&[n], DType::F32);
    let mut rn = poisoned(&[n], DType::F32);
    rand_draws
        .interpret(
            &RandDrawsComptime { BLOCK: 1024 },
            grid(n, 1024),
            &offs,
            &mut ri,
            &mut ru,
            &mut rn,
            seed,
        )
        .unwrap();
    let ctx = format!("seed {seed} (KILN_SEED={})", rng.seed());
    let normal: Vec<f64> = f32s(&rn).iter().map(|&x| f64::from(x)).collect();
    let mean = normal.iter().sum::<f64>() / n as f64;
    let var = normal.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    // Standard errors: 1/sqrt(n) = 0.003 for the mean, sqrt(2/n) = 0.0045 for the variance.
    assert!(mean.abs() < 0.015, "randn mean {mean}: {ctx}");
    assert!((var - 1.0).abs() < 0.025, "randn variance {var}: {ctx}");
    // Kolmogorov-Smirnov against the normal and the uniform CDFs: at n = 1e5 the 99.9%
    // critical value is 1.95 / sqrt(n) = 0.0062.
    let ks = |mut xs: Vec<f64>, cdf: &dyn Fn(f64) -> f64| {
        xs.sort_by(f64::total_cmp);
        xs.iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = cdf(x);
                (c - i as f64 / n as f64)
                    .abs()
                    .max((c - (i + 1) as f64 / n as f64).abs())
            })
            .fold(0.0, f64::max)
    };
    let phi = |x: f64| 0.5 * (1.0 + erf64(x / std::f64::consts::SQRT_2));
    let d = ks(normal, &phi);
    assert!(d < 0.0062, "randn KS distance {d}: {ctx}");
    let uniform: Vec<f64> = f32s(&ru).iter().map(|&x| f64::from(x)).collect();
    let d = ks(uniform, &|x: f64| x.clamp(0.0, 1.0));
    assert!(d < 0.0062, "rand KS distance {d}: {ctx}");
}

/// `erf` in f64 by its positive series (no cancellation), for the references.
fn erf64(x: f64) -> f64 {
    let a = x.abs();
    if a > 6.0 {
        return 1.0f64.copysign(x);
    }
    let (mut term, mut sum) = (a, 0.0);
    for k in 0..500 {
        sum += term;
        term *= 2.0 * a * a / f64::from(2 * k + 3);
    }
    (std::f64::consts::FRAC_2_SQRT_PI * (-a * a).exp() * sum).copysign(x)
}

/// `|got - want|` in units of the f32 spacing at `want`: 0 where both are the same infinity
/// or both NaN.
fn ulps(got: f32, want: f64) -> f64 {
    if (want.is_nan() && got.is_nan()) || (want.is_infinite() && f64::from(got) == want) {
        return 0.0;
    }
    let w = (want as f32).abs();
    let spacing = f64::from(f32::from_bits(w.to_bits() + 1) - w).max(1e-45);
    (f64::from(got) - want).abs() / spacing
}

/// The f64 references of [`transcendentals`]' rows.
const MATH_REFS: [fn(f64) -> f64; MATH_ROWS] = [
    f64::sin,
    f64::cos,
    f64::tanh,
    erf64,
    |v| 1.0 / (1.0 + (-v).exp()),
    f64::log2,
    |v| v.abs().ln(),
];

#[test]
fn transcendentals_are_within_an_ulp_of_f64() {
    let mut rng = Rng::from_env();
    let ct = TranscendentalsComptime { BLOCK: 256 };
    // Magnitudes from subnormal to 1e30 (sin and cos reduce exactly at every one of them).
    let scales = [1e-40, 1e-6, 1.0, 10.0, 1e4, 1e12, 1e30];
    for n in LENGTHS {
        for dist in Dist::ALL {
            for scale in scales {
                let x = tensor(&mut rng, &[n], DType::F32, dist);
                let x = HostTensor::new(
                    &[n],
                    TensorData::F32(f32s(&x).iter().map(|&v| v * scale as f32).collect()),
                )
                .unwrap();
                let mut y = poisoned(&[MATH_ROWS, n], DType::F32);
                transcendentals
                    .interpret(&ct, grid(n, 256), &x, &mut y)
                    .unwrap();
                for (i, &v) in f32s(&x).iter().enumerate() {
                    for (row, f) in MATH_REFS.iter().enumerate() {
                        let (got, want) = (f32s(&y)[row * n + i], f(f64::from(v)));
                        assert!(
                            ulps(got, want) <= 1.0,
                            "row {row} of x = {v:e}: {got:e}, want {want:e} ({dist}, KILN_SEED={})",
                            rng.seed()
                        );
                    }
                }
            }
        }
    }
}

/// PTX's u32 semantics, written out: shift amounts clamp at 32.
fn u32_reference(x: u32, z: u32) -> [u32; INT_ROWS] {
    let d = z | 1;
    [
        x & z,
        x | z,
        x ^ z,
        if z >= 32 { 0 } else { x << z },
        if z >= 32 { 0 } else { x >> z },
        ((u64::from(x) * u64::from(z)) >> 32) as u32,
        x / d,
        x % d,
        x.min(z),
        x.max(z),
        u32::from(x < z),
        !x,
        x.wrapping_mul(z),
        x.wrapping_add(z),
        x.wrapping_sub(z >> 3),
    ]
}

/// PTX's i32 semantics: the shift amount is read as u32 and clamps at 32; `>>` is arithmetic.
fn i32_reference(x: i32, z: i32) -> [i32; INT_ROWS] {
    let d = z | 1;
    let amount = z as u32;
    [
        x & z,
        x | z,
        x ^ z,
        if amount >= 32 { 0 } else { x << amount },
        if amount >= 32 { x >> 31 } else { x >> amount },
        ((i64::from(x) * i64::from(z)) >> 32) as i32,
        x.wrapping_div(d),
        x.wrapping_rem(d),
        x.min(z),
        x.max(z),
        i32::from(x < z),
        !x,
        x.wrapping_mul(z),
        x >> 3,
        (x << 31) >> 31,
    ]
}

#[test]
fn integer_operators_follow_ptx_semantics() {
    let mut rng = Rng::from_env();
    let ct_u = U32OpsComptime { BLOCK: 256 };
    let ct_i = I32OpsComptime { BLOCK: 256 };
    for n in LENGTHS {
        for dist in Dist::ALL {
            let other = Dist::ALL[rng.range(0, 4)];
            let (a, b) = (
                tensor(&mut rng, &[n], DType::U32, dist),
                tensor(&mut rng, &[n], DType::U32, other),
            );
            let mut y = poisoned(&[INT_ROWS, n], DType::U32);
            u32_ops
                .interpret(&ct_u, grid(n, 256), &a, &b, &mut y)
                .unwrap();
            for i in 0..n {
                let (x, z) = (u32s(&a)[i], u32s(&b)[i]);
                for (row, want) in u32_reference(x, z).into_iter().enumerate() {
                    assert_eq!(
                        u32s(&y)[row * n + i],
                        want,
                        "u32 row {row}: x={x:#x} z={z:#x} ({dist}, KILN_SEED={})",
                        rng.seed()
                    );
                }
            }
            let other = Dist::ALL[rng.range(0, 4)];
            let (a, b) = (
                tensor(&mut rng, &[n], DType::I32, dist),
                tensor(&mut rng, &[n], DType::I32, other),
            );
            let mut y = poisoned(&[INT_ROWS, n], DType::I32);
            i32_ops
                .interpret(&ct_i, grid(n, 256), &a, &b, &mut y)
                .unwrap();
            for i in 0..n {
                let (x, z) = (i32s(&a)[i], i32s(&b)[i]);
                for (row, want) in i32_reference(x, z).into_iter().enumerate() {
                    assert_eq!(
                        i32s(&y)[row * n + i],
                        want,
                        "i32 row {row}: x={x} z={z} ({dist}, KILN_SEED={})",
                        rng.seed()
                    );
                }
            }
        }
    }
}

#[test]
fn casts_and_bitcasts_follow_ptx_semantics() {
    let mut rng = Rng::from_env();
    let ct = CastsComptime { BLOCK: 256 };
    for n in LENGTHS {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[n], DType::F32, dist);
            let a = tensor(&mut rng, &[n], DType::U32, dist);
            let mut yu = poisoned(&[4, n], DType::U32);
            let mut yf = poisoned(&[4, n], DType::F32);
            casts
                .interpret(&ct, grid(n, 256), &x, &a, &mut yu, &mut yf)
                .unwrap();
            for i in 0..n {
                let (v, u) = (f32s(&x)[i], u32s(&a)[i]);
                let bf = half::bf16::from_f32(v);
                let want_u = [v as u32, v.to_bits(), u, (v as i32) as u32];
                let want_f = [
                    u as f32,
                    f32::from_bits(u),
                    half::bf16::from_f32(u as f32).to_f32(),
                    half::f16::from_bits(bf.to_bits()).to_f32(),
                ];
                for row in 0..4 {
                    let ctx = format!(
                        "row {row}: v={v} u={u:#x} ({dist}, KILN_SEED={})",
                        rng.seed()
                    );
                    assert_eq!(u32s(&yu)[row * n + i], want_u[row], "{ctx}");
                    assert_eq!(
                        f32s(&yf)[row * n + i].to_bits(),
                        want_f[row].to_bits(),
                        "{ctx}"
                    );
                }
            }
        }
    }
}

/// Element `e` of a dropout draw: word `e % 4` of Philox of counter `e / 4`, as a uniform.
fn dropout_uniform(seed: u32, e: usize) -> f32 {
    uniform_reference(philox_reference([(e / 4) as u32, 0, 0, 0], [seed, 0])[e % 4])
}

/// Every element's bits, for a bit-for-bit comparison of any float dtype.
fn float_bits(t: &HostTensor) -> Vec<u32> {
    match &t.data {
        TensorData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::Bf16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        TensorData::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        _ => panic!("not a float tensor"),
    }
}

/// The bits of f32 `x` rounded to `dtype` (to nearest even, as the kernel's cast).
fn rounded_bits(x: f32, dtype: DType) -> u32 {
    match dtype {
        DType::F32 => x.to_bits(),
        DType::Bf16 => u32::from(half::bf16::from_f32(x).to_bits()),
        DType::F16 => u32::from(half::f16::from_f32(x).to_bits()),
        other => panic!("dropout takes float tensors, not {other:?}"),
    }
}

/// The example kernel against a reference of its mapping: element `e` is kept when word
/// `e % 4` of Philox(seed, `e / 4`) as a uniform exceeds `p`, and a kept element is
/// `x * (1 / (1 - p))` in f32 rounded to the dtype. Lengths no multiple of 4 or of the
/// block, every dtype, two blocks (the mask must not depend on them), several `p`.
#[test]
fn dropout_keeps_what_rand4x_says_and_scales_it() {
    use kiln_examples::dropout::{DropoutComptime, dropout};
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        for n in [1, 6, 1003, 4097] {
            for p in [0.0f32, 0.1, 0.5, 0.9] {
                let dist = Dist::ALL[rng.range(0, Dist::ALL.len())];
                let x = tensor(&mut rng, &[n], dtype, dist);
                let xs = x.to_f64_vec();
                let seed = rng.next_u64() as u32;
                let ctx = format!(
                    "{dtype:?} n={n} p={p} seed={seed} {dist} (KILN_SEED={})",
                    rng.seed()
                );
                let scale = 1.0 / (1.0 - p);
                let want: Vec<u32> = (0..n)
                    .map(|e| {
                        let kept = dropout_uniform(seed, e) > p;
                        rounded_bits(if kept { xs[e] as f32 * scale } else { 0.0 }, dtype)
                    })
                    .collect();
                let kept = (0..n).filter(|&e| dropout_uniform(seed, e) > p).count();
                // The smallest block (one 16-byte vector) and the default one.
                for block in [16 / dtype.size_bytes(), 1024] {
                    let ct = DropoutComptime {
                        BLOCK: block,
                        dtype,
                    };
                    let mut y = poisoned(&[n], dtype);
                    dropout
                        .interpret(&ct, grid(n, block), &x, &mut y, p, seed)
                        .unwrap();
                    let got = float_bits(&y);
                    if let Some(e) = (0..n).find(|&e| got[e] != want[e]) {
                        panic!(
                            "element {e}: {:#x}, want {:#x} (x = {}, block {block}, {ctx})",
                            got[e], want[e], xs[e]
                        );
                    }
                }
                // At n = 4097 the kept fraction's standard error is at most 0.008.
                if n >= 4097 {
                    let frac = kept as f64 / n as f64;
                    assert!(
                        (frac - (1.0 - f64::from(p))).abs() < 0.04,
                        "kept {frac}: {ctx}"
                    );
                }
            }
        }
    }
}

/// A block that is no whole number of 16-byte vectors, or an integer dtype, is refused at
/// the kernel's line.
#[test]
fn dropout_refuses_a_ragged_block_and_integer_dtypes() {
    use kiln_examples::dropout::{DropoutComptime, dropout};
    let refusal = |dtype: DType, block: usize| {
        let x = HostTensor::full(&[8], dtype, 1.0);
        let mut y = poisoned(&[8], dtype);
        let ct = DropoutComptime {
            BLOCK: block,
            dtype,
        };
        let err = dropout
            .interpret(&ct, [1, 1, 1], &x, &mut y, 0.5, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("examples/src/dropout.rs"), "{err}");
        err
    };
    // Four bf16 elements are half a vector (four f32 are one: the test above runs them).
    let err = refusal(DType::Bf16, 4);
    assert!(
        err.contains("BLOCK must be a multiple of one 16-byte vector"),
        "{err}"
    );
    let err = refusal(DType::I32, 256);
    assert!(err.contains("dtype must be f32, bf16 or f16"), "{err}");
}

#[test]
fn misuse_is_a_diagnostic_at_the_users_line() {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::prelude::*;

    #[kernel(grid = [256, 1, 1])]
    fn signed_umulhi(x: Tensor<i32, 1>, y: TensorMut<i32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(umulhi(v, v));
    }
    #[kernel(grid = [256, 1, 1])]
    fn tile_seed(x: Tensor<u32, 1>, y: TensorMut<u32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(randint(v, v));
    }
    #[kernel(grid = [256, 1, 1])]
    fn float_offsets(x: Tensor<f32, 1>, y: TensorMut<u32, 1>, seed: u32) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(randint(seed, v));
    }
    #[kernel(grid = [256, 1, 1])]
    fn negative_u32(x: Tensor<u32, 1>, y: TensorMut<u32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(v & -1);
    }
    #[kernel(grid = [256, 1, 1])]
    fn int_sin(x: Tensor<i32, 1>, y: TensorMut<i32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(sin(v));
    }
    #[kernel(grid = [256, 1, 1])]
    fn float_shift(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(v << 1);
    }
    #[kernel(grid = [256, 1, 1])]
    fn wide_bitcast(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(v.bitcast::<bf16>().cast::<f32>());
    }
    #[kernel(grid = [256, 1, 1])]
    fn take_of_other_rank(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let v = x.tile([256], [0]).load();
        let idx = iota([2, 256], 1);
        y.tile([256], [0]).store(v.take(0, &idx));
    }
    #[kernel(grid = [256, 1, 1])]
    fn take_of_float_indices(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let v = x.tile([256], [0]).load();
        y.tile([256], [0]).store(v.take(0, &v));
    }
    let cases: [(&dyn KernelDef<Comptime = ()>, &str); 9] = [
        (&signed_umulhi, "`umulhi` takes u32 operands, found i32"),
        (&tile_seed, "the seed of `randint` must be a scalar"),
        (
            &float_offsets,
            "the offsets of `randint` must be i32 or u32",
        ),
        (&negative_u32, "integer constant -1 does not fit in u32"),
        (&int_sin, "`sin` is not defined on i32"),
        (&float_shift, "`shl` is not defined on f32"),
        (&wide_bitcast, "cannot bitcast f32 to bf16"),
        (
            &take_of_other_rank,
            "needs indices of the same rank and extents but along 0",
        ),
        (
            &take_of_float_indices,
            "the indices of `take` are a 256 f32 tile",
        ),
    ];
    for (def, want) in cases {
        let err = match def.build(&Spec::uniform((), def.signature(), false)) {
            Ok(k) => kiln::ir::verify::verify(&k).expect_err(want).to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{}: {err}", def.name());
        assert!(
            err.contains("tests/tests/interp_ops.rs:"),
            "{}: {err}",
            def.name()
        );
    }
}

/// Values at the edges of f32 and of each function's ranges.
pub const SPECIAL: [f32; 21] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::MAX,
    -f32::MAX,
    f32::MIN_POSITIVE,
    1e-45,
    0.781_25,
    -0.781_25,
    std::f32::consts::FRAC_PI_2,
    1.0,
    4.0,
    -110.5,
    1.0 / 4096.0,
    // The logarithms' split points, and next to 1 where their results are tiny.
    std::f32::consts::FRAC_1_SQRT_2,
    std::f32::consts::SQRT_2,
    1.000_000_1,
    0.999_999_94,
    -1e-45,
];

#[test]
fn transcendentals_at_special_values() {
    let ct = TranscendentalsComptime { BLOCK: 256 };
    let n = SPECIAL.len();
    let x = HostTensor::new(&[n], TensorData::F32(SPECIAL.to_vec())).unwrap();
    let mut y = poisoned(&[MATH_ROWS, n], DType::F32);
    transcendentals
        .interpret(&ct, [1, 1, 1], &x, &mut y)
        .unwrap();
    for (i, &v) in SPECIAL.iter().enumerate() {
        for (row, f) in MATH_REFS.iter().enumerate() {
            let (got, want) = (f32s(&y)[row * n + i], f(f64::from(v)));
            if want.is_nan() {
                assert!(got.is_nan(), "row {row} at {v:e}: {got:e}, want NaN");
            } else {
                assert!(
                    ulps(got, want) <= 1.0,
                    "row {row} at {v:e}: {got:e}, want {want:e}"
                );
                assert_eq!(
                    got.is_sign_negative(),
                    want.is_sign_negative(),
                    "row {row} at {v:e}: sign of {got:e}, want {want:e}"
                );
            }
        }
    }
}

#[test]
fn rust_integer_seeds_are_64_bit_keys() {
    use kiln::prelude::*;

    #[kernel(grid = [128, 1, 1])]
    fn literal_seeds(offs: Tensor<u32, 1>, y: TensorMut<u32, 2>) {
        let start = block_id().x * 128;
        let o = offs.tile([128], [start]).load();
        y.tile([128], [0, start])
            .store(randint(0x0123_4567_89ab_cdef_u64, o));
        y.tile([128], [1, start]).store(randint(-5, o));
        y.tile([128], [2, start]).store(randint(7_u32, o));
    }
    let mut rng = Rng::from_env();
    let n = 300;
    let offs = tensor(&mut rng, &[n], DType::U32, Dist::Uniform);
    let mut y = poisoned(&[3, n], DType::U32);
    literal_seeds
        .interpret(grid(n, 128), &offs, &mut y)
        .unwrap();
    let keys = [
        [0x89ab_cdef, 0x0123_4567],
        [(-5i32) as u32, u32::MAX],
        [7, 0],
    ];
    for (row, key) in keys.iter().enumerate() {
        for (i, &o) in u32s(&offs).iter().enumerate() {
            assert_eq!(
                u32s(&y)[row * n + i],
                philox_reference([o, 0, 0, 0], *key)[0],
                "seed row {row}, offset {o} (KILN_SEED={})",
                rng.seed()
            );
        }
    }
}

#[test]
fn take_gathers_inside_the_tile_along_each_dimension() {
    let mut rng = Rng::from_env();
    for c in [
        TakesComptime {
            R: 32,
            C: 64,
            K: 16,
        },
        TakesComptime {
            R: 64,
            C: 32,
            K: 128,
        },
    ] {
        for blocks in [1, 3] {
            let inputs = take_inputs(&mut rng, &c, blocks);
            let (r, cc, k) = (c.R, c.C, c.K);
            let mut y0 = poisoned(&[blocks * k, cc], DType::F32);
            let mut y1 = poisoned(&[blocks * r, k], DType::F32);
            let mut yv = poisoned(&[inputs[3].shape[0]], DType::Bf16);
            let [x, i0, i1, v, order] = &inputs;
            takes
                .interpret(
                    &c,
                    [blocks as u32, 1, 1],
                    x,
                    i0,
                    i1,
                    v,
                    order,
                    &mut y0,
                    &mut y1,
                    &mut yv,
                )
                .unwrap();
            let want = take_reference(&c, blocks, &inputs);
            let ctx = format!(
                "R={r} C={cc} K={k} blocks={blocks} KILN_SEED={}",
                rng.seed()
            );
            for (name, got, want) in [
                ("y0", &y0, &want[0]),
                ("y1", &y1, &want[1]),
                ("yv", &yv, &want[2]),
            ] {
                assert_eq!(&got.to_f64_vec(), want, "{name}: {ctx}");
            }
        }
    }
}

/// Each block's keys and values sorted by key, stably, on the host.
fn sorted_blocks(keys: &[i32], vals: &[f32], n: usize) -> (Vec<i32>, Vec<f32>) {
    let (mut sk, mut sv) = (Vec::new(), Vec::new());
    for (kc, vc) in keys.chunks(n).zip(vals.chunks(n)) {
        let mut pairs: Vec<(i32, f32)> = kc.iter().copied().zip(vc.iter().copied()).collect();
        pairs.sort_by_key(|p| p.0);
        sk.extend(pairs.iter().map(|p| p.0));
        sv.extend(pairs.iter().map(|p| p.1));
    }
    (sk, sv)
}

#[test]
fn a_tile_sorts_by_key_with_take() {
    let mut rng = Rng::from_env();
    for n in [64, 128] {
        let c = SortByKeyComptime { N: n };
        for len in [1, n - 3, 5 * n + 7] {
            // Few distinct keys (experts), so ties are common and stability matters.
            let keys = HostTensor::from_fn(&[len], DType::I32, |_| rng.uniform(0.0, 8.0).floor());
            let vals = tensor(&mut rng, &[len], DType::F32, Dist::Normal);
            let mut sk = poisoned(&[len], DType::I32);
            let mut sv = poisoned(&[len], DType::F32);
            let grid = [len.div_ceil(n) as u32, 1, 1];
            sort_by_key
                .interpret(&c, grid, &keys, &vals, &mut sk, &mut sv)
                .unwrap();
            let (wk, wv) = sorted_blocks(i32s(&keys), f32s(&vals), n);
            let ctx = format!("N={n} len={len} KILN_SEED={}", rng.seed());
            assert_eq!(i32s(&sk), &wk[..], "keys: {ctx}");
            assert_eq!(f32s(&sv), &wv[..], "values: {ctx}");
        }
    }
}
