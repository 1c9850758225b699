//! Random kernels built through the builder API from the fuzzer's bytes, run through the
//! verifier, every target's pass pipeline and PTX writer, and the interpreter
//! (`kiln_tests::random_kernel`). A panic, abort or hang is a bug; errors are answers.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(kernel) = kiln_tests::random_kernel::kernel(data) {
        kiln_tests::random_kernel::exercise(&kernel);
    }
});
