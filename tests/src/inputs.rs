//! Seeded random inputs. Every test draws fresh inputs: the seed comes from the clock unless
//! `KILN_SEED` is set, and every assertion message prints it so a failure can be replayed
//! with `KILN_SEED=<seed> cargo test ...`.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_ir::host::{contiguous_strides, row_major_offsets};
use kiln_ir::{DType, HostTensor};

/// A SplitMix64 generator: tiny, fast, and good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng {
    seed: u64,
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { seed, state: seed }
    }

    /// A generator seeded from `KILN_SEED` if it is set to an integer, else from the clock.
    pub fn from_env() -> Rng {
        let seed = std::env::var("KILN_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0x5eed, |d| d.as_nanos() as u64)
            });
        Rng::new(seed)
    }

    /// The seed this generator started from (print it in every assertion).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // in (0, 1], so ln is finite
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A uniform integer in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }
}

/// A distribution of tensor elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Uniform in (-1, 1).
    Uniform,
    /// Normal(0, 1).
    Normal,
    /// Large magnitudes: normal * 100 for f32 and i32 tensors; normal * 10 for bf16 and f16
    /// tensors, so that q.k attention scores with d = 64..128 reach about 1e4.
    Large,
    /// Every element equal to one value drawn from normal(0, 1) (ties in max, flat softmax).
    AllEqual,
}

impl Dist {
    /// Every distribution, for tests that sweep them.
    pub const ALL: [Dist; 4] = [Dist::Uniform, Dist::Normal, Dist::Large, Dist::AllEqual];
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dist::Uniform => "uniform(-1,1)",
            Dist::Normal => "normal(0,1)",
            Dist::Large => "large",
            Dist::AllEqual => "all-equal",
        })
    }
}

/// A contiguous tensor of `shape` and `dtype` drawn from `dist`, rounded to the dtype (i32
/// tensors round to the nearest integer). A u32 tensor holds bit patterns: `Uniform` draws
/// all 32 bits, `Normal` and `AllEqual` small integers wrapped to u32 (a negative one lands
/// just below 2^32), `Large` integers near 2^31, where signed and unsigned readings differ.
pub fn tensor(rng: &mut Rng, shape: &[usize], dtype: DType, dist: Dist) -> HostTensor {
    if dtype == DType::U32 {
        let n = shape.iter().product();
        let constant = (rng.normal() * 100.0).round() as i64 as u32;
        let data = (0..n)
            .map(|_| match dist {
                Dist::Uniform => rng.next_u64() as u32,
                Dist::Normal => (rng.normal() * 100.0).round() as i64 as u32,
                Dist::Large => ((rng.normal() * 1e6).round() as i64 + (1 << 31)) as u32,
                Dist::AllEqual => constant,
            })
            .collect();
        return HostTensor::new(shape, kiln_ir::TensorData::U32(data))
            .unwrap_or_else(|_| HostTensor::full(shape, dtype, 0.0));
    }
    let large = match dtype {
        DType::Bf16 | DType::F16 => 10.0,
        DType::F32 | DType::I32 | DType::U32 | DType::Bool => 100.0,
    };
    let constant = rng.normal();
    HostTensor::from_fn(shape, dtype, |_| {
        let x = match dist {
            Dist::Uniform => rng.uniform(-1.0, 1.0),
            Dist::Normal => rng.normal(),
            Dist::Large => rng.normal() * large,
            Dist::AllEqual => constant,
        };
        if dtype == DType::I32 { x.round() } else { x }
    })
}

/// Gemm operands of `(m, n, k)` drawn from `dist` (`b` as `[n, k]` when `b_col_major`, else
/// `[k, n]`), and their f64 product.
pub fn gemm_operands(
    rng: &mut Rng,
    (m, n, k): (usize, usize, usize),
    b_col_major: bool,
    dist: Dist,
) -> (HostTensor, HostTensor, Vec<f64>) {
    let a = tensor(rng, &[m, k], DType::Bf16, dist);
    let b_shape = if b_col_major { [n, k] } else { [k, n] };
    let b = tensor(rng, &b_shape, DType::Bf16, dist);
    let want = if b_col_major {
        crate::reference::gemm_bt(&a, &b)
    } else {
        crate::reference::gemm(&a, &b)
    };
    (a, b, want)
}

/// One attention problem: `q: [b, h, sq, d]`, `k, v: [b, h, sk, d]`, causal or not.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Batch.
    pub b: usize,
    /// Heads.
    pub h: usize,
    /// Query rows.
    pub sq: usize,
    /// Keys.
    pub sk: usize,
    /// Head dimension.
    pub d: usize,
    /// Whether the mask is causal (aligned bottom-right).
    pub causal: bool,
}

impl AttentionShape {
    /// Fresh bf16 `q`, `k`, `v` of this shape drawn from `dist`.
    pub fn tensors(&self, rng: &mut Rng, dist: Dist) -> [HostTensor; 3] {
        let (q, kv) = (
            [self.b, self.h, self.sq, self.d],
            [self.b, self.h, self.sk, self.d],
        );
        [q, kv, kv].map(|shape| tensor(rng, &shape, DType::Bf16, dist))
    }

    /// The example kernel's grid with `block_m` query rows per block: `(cdiv(sq, block_m),
    /// heads, batch)`.
    pub fn grid(&self, block_m: usize) -> [u32; 3] {
        [
            self.sq.div_ceil(block_m) as u32,
            self.h as u32,
            self.b as u32,
        ]
    }
}

/// A copy of `t` whose rows (second-to-last dimension) are `pad` elements further apart
/// than in a contiguous layout, with the padding filled with NaN: a non-contiguous tensor
/// that exercises strided addressing. Tensors of rank < 2 are returned unchanged.
pub fn with_row_padding(t: &HostTensor, pad: usize) -> HostTensor {
    let rank = t.shape.len();
    if rank < 2 {
        return t.clone();
    }
    let mut padded = t.shape.clone();
    padded[rank - 1] += pad;
    let strides = contiguous_strides(&padded);
    let mut out = HostTensor::full(&[strides[0] * t.shape[0]], t.dtype(), f64::NAN);
    out.shape = t.shape.clone();
    out.strides = strides;
    for (o, v) in row_major_offsets(&out.shape, &out.strides)
        .into_iter()
        .zip(t.to_f64_vec())
    {
        out.data.set_f64(o, v);
    }
    out
}
