//! The case loop the kernel tests share: every problem shape under every input distribution,
//! fresh inputs for each, and every failing case reported, not only the first.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::check::Case;
use crate::inputs::{Dist, Rng};

/// Runs `case` once for each shape of `shapes` under each distribution of `dists` (shapes
/// outermost), handing it `rng` to draw that case's inputs from and the [`Case`] its checks
/// report: `kernel`, the shape as `label` writes it, the distribution and `rng`'s seed.
///
/// A case that panics (a failed check, launch or interpretation) does not stop the cases after
/// it; once all have run, the sweep panics with the message of each one that failed, so one
/// run shows which shapes and distributions fail together. `case` itself builds the inputs,
/// poisons the outputs, runs the kernel and compares against the f64 reference: the sweep
/// weakens none of that, it only owns the loop.
pub fn sweep<S: Copy>(
    rng: &mut Rng,
    kernel: &str,
    shapes: impl IntoIterator<Item = S>,
    dists: &[Dist],
    label: impl Fn(S) -> String,
    mut case: impl FnMut(&mut Rng, S, &Case),
) {
    let mut failures = Vec::new();
    let mut cases = 0;
    for shape in shapes {
        for &dist in dists {
            cases += 1;
            let this = Case {
                kernel: kernel.to_string(),
                shape: label(shape),
                dist,
                seed: rng.seed(),
            };
            // Unwind safety: after a failed case the generator is only drawn on, and the
            // closure's own state is the test's to judge; nothing is read half-updated.
            let ran = catch_unwind(AssertUnwindSafe(|| case(rng, shape, &this)));
            if let Err(panic) = ran {
                failures.push(panic_message(&this, panic.as_ref()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases of {kernel} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What a caught panic said, or the case it came from where it carried no text.
fn panic_message(case: &Case, panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        format!("{case}: panicked")
    }
}

/// A shape as the tests' failure messages write it, `[3, 5, 7]`: a `label` for [`sweep`].
pub fn dims<const N: usize>(shape: [usize; N]) -> String {
    format!("{shape:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_runs_and_every_failure_is_reported() {
        let mut rng = Rng::new(7);
        let mut ran = Vec::new();
        let swept = catch_unwind(AssertUnwindSafe(|| {
            sweep(
                &mut rng,
                "k",
                [[1, 2], [3, 4]],
                &Dist::ALL,
                dims,
                |_, s, case| {
                    ran.push((s, case.dist));
                    assert!(s[0] != 3 || case.dist != Dist::ALL[0], "{case}: too big");
                    assert!(s[0] != 1 || case.dist != Dist::ALL[1], "{case}: too small");
                },
            )
        }));
        assert_eq!(ran.len(), 2 * Dist::ALL.len());
        let message = *swept
            .expect_err("two cases fail")
            .downcast::<String>()
            .unwrap();
        assert!(message.starts_with(&format!("2 of {} cases of k failed", ran.len())));
        assert!(message.contains("shape [[3, 4]]") && message.contains("too big"));
        assert!(message.contains("shape [[1, 2]]") && message.contains("too small"));
        assert!(message.contains("KILN_SEED=7"), "{message}");
    }
}
