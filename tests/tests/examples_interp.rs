//! The example kernels on the CPU interpreter against f64 references: fresh random inputs
//! (seed from the clock, printed on failure), several distributions including large
//! magnitudes, shapes that are not tile multiples, outputs poisoned with NaN, relative-norm
//! error within the dtype's tolerance.
//!
//! Needs the real interpreter behind `kiln::ir::interp` (the facade's placeholder returns
//! `NotAvailable`, which fails these tests on purpose).

use kiln::ir::{DType, HostTensor};
use kiln_examples::{attention::attention, gemm::gemm, softmax::softmax, vector_add::vector_add};

/// xorshift64: fresh inputs each run, reproducible from the printed seed.
struct Rng {
    seed: u64,
    state: u64,
}

impl Rng {
    fn from_clock() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
            | 1;
        Rng { seed, state: seed }
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }

    fn tensor(&mut self, shape: &[usize], dtype: DType, scale: f64) -> HostTensor {
        HostTensor::from_fn(shape, dtype, |_| self.uniform() * scale)
    }
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn grid(n: usize, tile: usize) -> u32 {
    u32::try_from(n.div_ceil(tile)).unwrap_or(u32::MAX)
}

#[test]
fn vector_add_matches_f64() {
    let mut r = Rng::from_clock();
    for n in [1, 1000, 1024, 3000] {
        for scale in [1.0, 1e30] {
            let a = r.tensor(&[n], DType::F32, scale);
            let b = r.tensor(&[n], DType::F32, scale);
            let mut c = HostTensor::full(&[n], DType::F32, f64::NAN);
            let run = vector_add.interpret([grid(n, 1024), 1, 1], &a, &b, &mut c);
            run.unwrap_or_else(|e| panic!("seed {}: {e:?}", r.seed));
            let want: Vec<f64> = (a.to_f64_vec().iter().zip(b.to_f64_vec()))
                .map(|(x, y)| x + y)
                .collect();
            let e = rel_err(&c.to_f64_vec(), &want);
            assert!(e < 1e-6, "seed {}: n={n} scale={scale}: {e}", r.seed);
        }
    }
}

#[test]
fn softmax_matches_f64() {
    let mut r = Rng::from_clock();
    for (m, n, bm, bn) in [
        (1, 1, 4, 512),
        (5, 700, 4, 512),
        (8, 512, 4, 512),
        (3, 1500, 2, 256),
    ] {
        for scale in [1.0, 50.0, 1e4] {
            let x = r.tensor(&[m, n], DType::F32, scale);
            let mut y = HostTensor::full(&[m, n], DType::F32, f64::NAN);
            let run = softmax.interpret([grid(m, bm), 1, 1], bm, bn, &x, &mut y);
            run.unwrap_or_else(|e| panic!("seed {}: {e:?}", r.seed));
            let xv = x.to_f64_vec();
            let mut want = vec![0.0; m * n];
            for (row, out) in xv.chunks(n).zip(want.chunks_mut(n)) {
                let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                for (o, v) in out.iter_mut().zip(row) {
                    *o = (v - mx).exp() / sum;
                }
            }
            let e = rel_err(&y.to_f64_vec(), &want);
            assert!(e < 1e-5, "seed {}: {m}x{n} scale={scale}: {e}", r.seed);
        }
    }
}

#[test]
fn gemm_matches_f64() {
    let mut r = Rng::from_clock();
    for (m, n, k) in [(64, 64, 32), (130, 70, 45), (200, 129, 100)] {
        for scale in [1.0, 100.0] {
            let a = r.tensor(&[m, k], DType::Bf16, scale);
            let b = r.tensor(&[k, n], DType::Bf16, scale);
            let mut c = HostTensor::full(&[m, n], DType::Bf16, f64::NAN);
            let g = [grid(m, 128), grid(n, 128), 1];
            let run = gemm.interpret(g, 128, 128, 32, &a, &b, &mut c);
            run.unwrap_or_else(|e| panic!("seed {}: {e:?}", r.seed));
            let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
            let want: Vec<f64> = (0..m * n)
                .map(|ij| {
                    (0..k)
                        .map(|p| av[ij / n * k + p] * bv[p * n + ij % n])
                        .sum()
                })
                .collect();
            let e = rel_err(&c.to_f64_vec(), &want);
            assert!(e < 1e-2, "seed {}: {m}x{n}x{k} scale={scale}: {e}", r.seed);
        }
    }
}

/// f64 attention over `[heads, s, d]` slices (batch folded into heads), causal aligned
/// bottom-right; rows that see no key are 0.
fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: [usize; 4],
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let [heads, sq, sk, d] = dims;
    let mut out = vec![0.0; heads * sq * d];
    for h in 0..heads {
        for i in 0..sq {
            let qi = &q[(h * sq + i) * d..][..d];
            let s: Vec<f64> = (0..sk)
                .map(|j| {
                    let visible = !causal || j as i64 <= i as i64 + sk as i64 - sq as i64;
                    let kj = &k[(h * sk + j) * d..][..d];
                    match visible {
                        true => qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale,
                        false => f64::NEG_INFINITY,
                    }
                })
                .collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let p: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let l: f64 = p.iter().sum();
            for x in 0..d {
                let acc: f64 = (0..sk).map(|j| p[j] * v[(h * sk + j) * d + x]).sum();
                out[(h * sq + i) * d + x] = acc / l;
            }
        }
    }
    out
}

#[test]
fn attention_matches_f64() {
    let mut r = Rng::from_clock();
    let cases = [
        (64, false, 130, 200, 1.0),
        (64, true, 130, 200, 1.0),
        (64, true, 200, 70, 1.0),
        (128, true, 64, 64, 4.0),
        (128, false, 100, 150, 4.0),
    ];
    for (d, causal, sq, sk, mag) in cases {
        let (batch, heads) = (2, 2);
        let q = r.tensor(&[batch, heads, sq, d], DType::Bf16, mag);
        let k = r.tensor(&[batch, heads, sk, d], DType::Bf16, mag);
        let v = r.tensor(&[batch, heads, sk, d], DType::Bf16, 1.0);
        let mut o = HostTensor::full(&[batch, heads, sq, d], DType::Bf16, f64::NAN);
        let scale = 1.0 / (d as f32).sqrt();
        let g = [grid(sq, 128), heads as u32, batch as u32];
        let run = attention.interpret(g, d, causal, &q, &k, &v, &mut o, scale);
        run.unwrap_or_else(|e| panic!("seed {}: {e:?}", r.seed));
        let dims = [batch * heads, sq, sk, d];
        let want = attention_ref(
            &q.to_f64_vec(),
            &k.to_f64_vec(),
            &v.to_f64_vec(),
            dims,
            f64::from(scale),
            causal,
        );
        let got = o.to_f64_vec();
        let case = format!("seed {}: d={d} causal={causal} sq={sq} sk={sk}", r.seed);
        assert!(
            got.iter().all(|x| x.is_finite()),
            "{case}: non-finite output"
        );
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "{case}: {e}");
    }
}
