//! Random kernels through the whole compiler (`kiln_tests::random_kernel`): thousands of
//! programs built from fresh random bytes (seed printed), each verified, scheduled and
//! written for every target and interpreted. Errors are fine; a panic fails the test with
//! the bytes that caused it. The `ir` fuzz target (`fuzz/`) runs the same code for longer.

use kiln_tests::inputs::Rng;
use kiln_tests::random_kernel::{exercise, kernel};

#[test]
fn random_kernels_never_panic_the_compiler() {
    let mut rng = Rng::from_env();
    let mut built = 0;
    for case in 0..1500 {
        let len = 16 + (rng.uniform(0.0, 240.0) as usize);
        let bytes: Vec<u8> = (0..len).map(|_| rng.uniform(0.0, 256.0) as u8).collect();
        let outcome = std::panic::catch_unwind(|| {
            if let Some(k) = kernel(&bytes) {
                exercise(&k);
                true
            } else {
                false
            }
        });
        match outcome {
            Ok(b) => built += usize::from(b),
            Err(_) => panic!(
                "case {case} (seed {}) panicked; bytes: {bytes:?}",
                rng.seed()
            ),
        }
    }
    // The generator must mostly produce kernels, or the test proves nothing.
    assert!(
        built > 1000,
        "only {built} of 1500 byte strings built a kernel"
    );
}
