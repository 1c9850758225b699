//! Running the example kernels on the CPU execution of their schedule
//! ([`kiln_ir::interp::run_scheduled`]).

use kiln_ir::interp::{HostArg, InterpError, run_scheduled};
use kiln_ir::{DType, HostTensor, Kernel};

use crate::check::poisoned;

/// `c = a @ B` (`B` as the compiled gemm `kernel` takes `b`) with block tile `bm x bn`, on
/// `ctas` CTAs; `c` is `[a.rows, n]`, poisoned before the run.
pub fn run_gemm(
    kernel: &Kernel,
    (bm, bn): (usize, usize),
    (a, b): (&HostTensor, &HostTensor),
    n: usize,
    ctas: u32,
) -> Result<HostTensor, InterpError> {
    let m = a.shape[0];
    let mut c = poisoned(&[m, n], DType::Bf16);
    let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
    let mut args = [
        HostArg::Tensor(a),
        HostArg::Tensor(b),
        HostArg::TensorMut(&mut c),
    ];
    run_scheduled(kernel, grid, ctas, &mut args)?;
    Ok(c)
}
