//! Random kernels through the whole compiler (`kiln_tests::random_kernel`): programs built
//! from fresh random bytes (seed printed) covering elementwise ops, `.col()`/`.row()`
//! broadcasts, reductions, loops carrying accumulators, `if`, bounded loads and stores,
//! `mma` and casts, each verified, scheduled and written for every target (and assembled by
//! ptxas when `KILN_PTXAS` is set) and interpreted.
//!
//! The contract: no panic anywhere, no internal error, no error without the user's line, and
//! ptxas accepts every PTX written. An "unsupported at your line" error is an answer; the
//! test prints the count of each kind with an example.
//!
//! In CI it runs for about 30 seconds. For a longer run (the lead's 10-minute soak):
//! `KILN_FUZZ_SECONDS=600 KILN_PTXAS=$(scripts/ensure-cuda-tool ptxas) cargo test -p
//! kiln-tests --test random_kernels -- --nocapture`; `KILN_SEED=<seed>` replays a run. The
//! `ir` and `pipeline` fuzz targets (`fuzz/`) drive the same code from libFuzzer.

use std::time::Duration;

use kiln_tests::inputs::Rng;
use kiln_tests::random_kernel::fuzz;

#[test]
fn random_kernels_compile_or_fail_cleanly() {
    let mut rng = Rng::from_env();
    let seconds: u64 = std::env::var("KILN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // A soak runs until its time is up and assembles every kernel; CI stops at a case count
    // too, so a slow machine checks fewer kernels rather than taking longer, and assembles
    // one kernel in eight (ptxas is most of the time).
    let soak = std::env::var("KILN_FUZZ_SECONDS").is_ok();
    let cases = if soak { usize::MAX } else { 500 };
    let ptxas = std::env::var("KILN_PTXAS")
        .is_ok()
        .then_some(if soak { 1 } else { 8 });
    let tally = fuzz(&mut rng, cases, Duration::from_secs(seconds), ptxas, true);
    let report = tally.report();
    println!("seed {}\n{report}", rng.seed());
    assert!(
        tally.bugs().next().is_none(),
        "seed {}: kiln bugs among random kernels (replay one with \
         kiln_tests::random_kernel::kernel(&bytes)):\n{report}",
        rng.seed()
    );
    // The generator must mostly produce kernels, and enough of them, or the test proves
    // nothing.
    assert!(
        tally.kernels >= 50 && tally.kernels * 10 >= tally.attempts * 8,
        "seed {}: only {} kernels built from {} byte strings\n{report}",
        rng.seed(),
        tally.kernels,
        tally.attempts
    );
}
