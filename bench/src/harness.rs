//! Timing loops: warm-up runs, then each timed run between CUDA events on the device's stream
//! with the caller rotating its inputs, summarised by the median; and a progress bar.

use indicatif::{ProgressBar, ProgressStyle};
use kiln_runtime::{Device, LaunchError, RuntimeError};

/// Per-run GPU times of one configuration, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Samples {
    ms: Vec<f64>,
}

impl Samples {
    /// Samples from raw times; `None` if empty.
    pub fn new(ms: Vec<f64>) -> Option<Samples> {
        (!ms.is_empty()).then_some(Samples { ms })
    }

    /// The median (mean of the middle two for an even count).
    pub fn median(&self) -> f64 {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    /// The fastest run.
    pub fn min(&self) -> f64 {
        self.ms.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// Every run, in order.
    pub fn all(&self) -> &[f64] {
        &self.ms
    }
}

/// Runs `run(i)` `warmup` times untimed, then `iters` times, each timed alone with CUDA
/// events behind a GPU hold ([`Device::time`]: GPU time, not the host's launch latency).
/// `i` counts every call, so `run` can pick input set `i % sets` (rotation).
pub fn measure<E: From<RuntimeError> + From<LaunchError>>(
    device: &Device,
    warmup: usize,
    iters: usize,
    mut run: impl FnMut(usize) -> Result<(), E>,
) -> Result<Samples, E> {
    for i in 0..warmup {
        run(i)?;
    }
    device.synchronize()?;
    let mut ms = Vec::with_capacity(iters);
    for i in warmup..warmup + iters {
        let ((), t) = device.time(|| run(i))?;
        ms.push(t as f64);
    }
    // `iters` is at least 1 (the command line refuses 0), so this is never empty.
    Ok(Samples::new(ms).unwrap_or(Samples { ms: vec![f64::NAN] }))
}

/// TFLOP/s for `flops` floating-point operations in `ms` milliseconds.
pub fn tflops(flops: f64, ms: f64) -> f64 {
    flops / (ms * 1e-3) / 1e12
}

/// A progress bar on stderr (`[3/20] gemm 4096x4096x4096`), hidden when stderr is not a
/// terminal so logs stay clean.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A progress bar over `total` steps.
    pub fn new(total: usize) -> Progress {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template("[{pos}/{len}] {bar:30} {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress { bar }
    }

    /// Announces the next step.
    pub fn step(&mut self, what: &str) {
        self.bar.inc(1);
        self.bar.set_message(what.to_string());
    }

    /// Ends the bar.
    pub fn finish(&self) {
        self.bar.finish_with_message("done");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Samples::new(vec![5.0, 1.0, 3.0]).expect("non-empty");
        assert_eq!((s.median(), s.min()), (3.0, 1.0));
        let s = Samples::new(vec![4.0, 1.0, 3.0, 2.0]).expect("non-empty");
        assert_eq!(s.median(), 2.5);
        assert!(Samples::new(vec![]).is_none());
    }

    #[test]
    fn tflops_of_a_gemm() {
        // 2*4096^3 flops in 1 ms = 137.4 TFLOP/s.
        let t = tflops(2.0 * 4096f64.powi(3), 1.0);
        assert!((t - 137.438_953_472).abs() < 1e-6, "{t}");
    }
}
