//! Writes the PTX of every example kernel variant (plus GEMM tile variants) and a launch
//! summary (`<name>.json`: entry, threads, dynamic shared memory) into a directory, for GPU
//! checks and benchmarks outside the test suite.
//!
//! `cargo run -p kiln-tests --example ptx_dump -- DIR`

#[path = "../tests/ptx_examples/mod.rs"]
mod ptx_examples;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: ptx_dump DIR (the directory receives NAME.ptx and NAME.json)")?;
    let variants = [
        ("gemm_bk64", ptx_examples::build("gemm", &[("BK", "64")])),
        ("gemm_256", ptx_examples::build("gemm", &[("BN", "256")])),
    ];
    for (name, k) in ptx_examples::all().into_iter().chain(variants) {
        let m = kiln_ptx::compile(&k, kiln_ir::Target::Sm80)?;
        std::fs::write(format!("{dir}/{name}.ptx"), &m.ptx)?;
        std::fs::write(
            format!("{dir}/{name}.json"),
            format!(
                "{{\"entry\": \"{}\", \"threads\": {}, \"smem\": {}}}",
                m.entry, m.threads_per_block, m.dynamic_smem_bytes
            ),
        )?;
    }
    Ok(())
}
