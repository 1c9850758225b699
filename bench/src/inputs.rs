//! Random device inputs for benchmarks: one host tensor per configuration, uploaded into as
//! many device copies as input rotation needs.

use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor, RuntimeError};
use kiln_tests::inputs::Rng;

/// Uniform(-1, 1) values of `dtype` from the tests' generator seeded with `seed` (a fixed
/// seed per configuration, so every run of a benchmark times the same data).
pub fn uniform(shape: &[usize], dtype: DType, seed: u64) -> HostTensor {
    let mut rng = Rng::new(seed);
    HostTensor::from_fn(shape, dtype, |_| rng.uniform(-1.0, 1.0))
}

/// `n` device copies of `host` (distinct allocations, so rotating among them defeats L2).
pub fn copies(
    device: &Device,
    host: &HostTensor,
    n: usize,
) -> Result<Vec<DeviceTensor>, RuntimeError> {
    (0..n).map(|_| device.upload(host)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_seeded() {
        let a = uniform(&[1000], DType::F32, 1);
        let v = a.to_f64_vec();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(v.iter().any(|&x| x < -0.9) && v.iter().any(|&x| x > 0.9));
        assert_eq!(a, uniform(&[1000], DType::F32, 1));
        assert_ne!(a, uniform(&[1000], DType::F32, 2));
    }
}
