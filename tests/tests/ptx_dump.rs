//! Writes the PTX of every example kernel variant to `$KILN_PTX_DIR` (when set), for GPU
//! checks and benchmarks outside the test suite.

mod ptx_examples;

#[test]
fn dump_ptx() {
    let Ok(dir) = std::env::var("KILN_PTX_DIR") else {
        return;
    };
    let variants = [
        ("gemm_bk64", ptx_examples::build("gemm", &[("BK", "64")])),
        ("gemm_256", ptx_examples::build("gemm", &[("BN", "256")])),
    ];
    for (name, k) in ptx_examples::all().into_iter().chain(variants) {
        let m = kiln_ptx::compile(&k, kiln_ir::Target::Sm80).expect("compile");
        std::fs::write(format!("{dir}/{name}.ptx"), &m.ptx).expect("write");
        std::fs::write(
            format!("{dir}/{name}.json"),
            format!(
                "{{\"entry\": \"{}\", \"threads\": {}, \"smem\": {}}}",
                m.entry, m.threads_per_block, m.dynamic_smem_bytes
            ),
        )
        .expect("write");
    }
}
