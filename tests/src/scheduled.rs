//! Running the example kernels on the CPU execution of their schedule
//! ([`kiln_ir::interp::run_scheduled`]).

use kiln_ir::interp::{HostArg, InterpError, run_scheduled};
use kiln_ir::{DType, HostTensor, Kernel};

use crate::check::poisoned;

/// `c = a @ B` by the compiled gemm-family `kernel` (`B` as it takes `b`; `inputs` are its
/// read-only tensors in parameter order, `a` and `b` first, then e.g. the bias) with block tile
/// `bm x bn`, on `ctas` CTAs; `c` is `[a.rows, n]`, poisoned before the run.
pub fn run_gemm(
    kernel: &Kernel,
    tile: (usize, usize),
    inputs: &[&HostTensor],
    n: usize,
    ctas: u32,
) -> Result<HostTensor, InterpError> {
    run_gemm_scaled(kernel, tile, inputs, &[], n, ctas)
}

/// [`run_gemm`] for a kernel whose f32 scalars follow its output (`gemm_alpha_beta`'s
/// `alpha`, `beta`): `scalars` in parameter order.
pub fn run_gemm_scaled(
    kernel: &Kernel,
    (bm, bn): (usize, usize),
    inputs: &[&HostTensor],
    scalars: &[f32],
    n: usize,
    ctas: u32,
) -> Result<HostTensor, InterpError> {
    let m = inputs[0].shape[0];
    let mut c = poisoned(&[m, n], DType::Bf16);
    let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
    let mut args: Vec<HostArg<'_>> = inputs.iter().map(|t| HostArg::Tensor(t)).collect();
    args.push(HostArg::TensorMut(&mut c));
    args.extend(scalars.iter().map(|&x| HostArg::F32(x)));
    run_scheduled(kernel, grid, ctas, &mut args)?;
    Ok(c)
}
