//! Random kernels from the fuzzer's bytes (`kiln_tests::random_kernel`) through the whole
//! pipeline for every target: passes, PTX writer and, when `KILN_PTXAS` is set, ptxas. Unlike
//! `ir`, which only looks for panics, this target fails on every kiln bug the checker sees:
//! an internal error, an error that names no source line, or PTX that ptxas rejects. An
//! "unsupported at your line" error is an answer.
//!
//! `KILN_PTXAS=$(scripts/ensure-cuda-tool ptxas) RUSTC_BOOTSTRAP=1 cargo fuzz run pipeline`

#![no_main]

use kiln_tests::random_kernel::{check, kernel};
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
});

