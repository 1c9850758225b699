//! Writes the PTX of every test kernel to `$KILN_PTX_DIR` (when set), for GPU checks.

mod ptx_common;

#[test]
fn dump_ptx() {
    let Ok(dir) = std::env::var("KILN_PTX_DIR") else {
        return;
    };
    for (name, k) in ptx_common::all() {
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
