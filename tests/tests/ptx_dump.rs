//! Writes the PTX of every test kernel to `$KILN_PTX_DIR` (when set), for GPU checks.

mod ptx_common;

#[test]
fn dump_ptx() {
    let Ok(dir) = std::env::var("KILN_PTX_DIR") else {
        return;
    };
    let variants = [
        ("gemm_bk64", ptx_common::gemm(128, 128, 64, 3, 8)),
        ("gemm_w4", ptx_common::gemm(128, 128, 32, 4, 4)),
        ("gemm_256", ptx_common::gemm(128, 256, 32, 3, 8)),
        ("gemm_bk64_w4", ptx_common::gemm(128, 128, 64, 3, 4)),
    ];
    for (name, k) in ptx_common::all().into_iter().chain(variants) {
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
