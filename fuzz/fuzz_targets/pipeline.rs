//! Random kernels from the fuzzer's bytes (`kiln_tests::random_kernel`) through the whole
//! pipeline for every target (passes with the verifier after each, PTX writer, ptxas when
//! `KILN_PTXAS` is set), then the interpreter. Unlike `ir`, which looks only for panics, this
//! target fails on every kiln bug the checker sees (`random_kernel::Outcome`); an "unsupported
//! at your line" error is an answer. How to run it, and its stable-toolchain twin:
//! `docs/testing.md`, "Fuzzing".

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

