//! Random kernels from the fuzzer's bytes (`kiln_tests::random_kernel`) through the whole
//! pipeline for every target: passes (the verifier after each), PTX writer and, when
//! `KILN_PTXAS` is set, ptxas; then the interpreter. Unlike `ir`, which only looks for
//! panics, this target fails on every kiln bug the checker sees: an internal error, an error
//! that names no source line or quotes the IR, a kernel a pass leaves unverifiable, PTX that
//! ptxas rejects, an interpreter error that is kiln's. An "unsupported at your line" error is
//! an answer.
//!
//! `KILN_PTXAS=$(scripts/ensure-cuda-tool ptxas) RUSTC_BOOTSTRAP=1 cargo fuzz run pipeline`.
//! On the stable toolchain, the same judge runs for a given time from a seed:
//! `KILN_FUZZ_SECONDS=600 KILN_SEED=N cargo test -p kiln-tests --test random_kernels`.

#![no_main]

use kiln_tests::random_kernel::{check, interpret, kernel};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(k) = kernel(data) else { return };
    let ptxas = std::env::var_os("KILN_PTXAS").is_some();
    for target in kiln_ir::Target::ALL {
        let outcome = check(&k, target, ptxas);
        assert!(
            !outcome.is_bug(),
            "{}: {}\n{outcome:?}",
            target.name(),
            outcome.category()
        );
    }
    if let Err(e) = interpret(&k) {
        panic!("the interpreter: {e}");
    }
});

