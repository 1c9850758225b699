//! Random device inputs for benchmarks: one host tensor per configuration, uploaded into as
//! many device copies as input rotation needs.

use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor, RuntimeError};

/// Uniform(-1, 1) values of `dtype` from a SplitMix64 stream seeded with `seed`.
pub fn uniform(shape: &[usize], dtype: DType, seed: u64) -> HostTensor {
    let mut state = seed;
    HostTensor::from_fn(shape, dtype, |_| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    })
}

/// `n` device copies of `host` (distinct allocations, so rotating among them defeats L2).
pub fn copies(
    device: &Device,
    host: &HostTensor,
    n: usize,
) -> Result<Vec<DeviceTensor>, RuntimeError> {
    (0..n).map(|_| device.upload(host)).collect()
}

/// Relative L2 error `||x - y|| / ||y||` between two tensors' elements (NaN-propagating).
pub fn rel_error(x: &HostTensor, y: &HostTensor) -> f64 {
    let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
    let num: f64 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = y.iter().map(|b| b * b).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
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

    #[test]
    fn rel_error_is_relative_and_sees_nan() {
        let y = HostTensor::full(&[4], DType::F32, 2.0);
        let x = HostTensor::full(&[4], DType::F32, 2.2);
        assert!((rel_error(&x, &y) - 0.1).abs() < 1e-6);
        let mut n = y.clone();
        n.data.set_f64(1, f64::NAN);
        assert!(rel_error(&n, &y).is_nan());
    }
}
