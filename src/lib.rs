//! kiln: write GPU kernels as Rust functions under `#[kernel]`; kiln compiles them to PTX
//! and launches them. This facade re-exports what users need.
pub use kiln_ir as ir;
