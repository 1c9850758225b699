//! A CPU interpreter of the semantic tile IR (as built, before any pass), with the GPU's
//! numeric types. It is the reference every GPU result is checked against. Its semantics, where
//! the [`crate::kernel::OpKind`] docs leave a choice (block order, integer faults, rounding,
//! `mma` and reduction order), are listed at [`run`]. Both entry points verify the kernel
//! first, so the walker can rely on the verifier's invariants; where it meets IR that breaks
//! them anyway it returns [`InterpError::Internal`], never panics.

mod access;
mod error;
mod eval;
mod exec;
mod memory;
mod scheduled;
mod value;

pub use error::{ArgProblem, InterpError};
pub use scheduled::run_scheduled;

use crate::dsl::{KernelDef, ParamSig, Spec};
use crate::host::HostTensor;
use crate::kernel::Kernel;
use crate::verify::verify;

/// One launch argument, in the kernel's parameter order.
#[derive(Debug)]
pub enum HostArg<'a> {
    /// A tensor the kernel only reads (`Tensor<T, N>`).
    Tensor(&'a HostTensor),
    /// A tensor the kernel may write (`TensorMut<T, N>`); it may also be passed to a
    /// read-only parameter.
    TensorMut(&'a mut HostTensor),
    /// An `f32` scalar.
    F32(f32),
    /// An `i32` scalar.
    I32(i32),
    /// A `u32` scalar.
    U32(u32),
}

/// Runs `kernel` over `grid` (blocks along x, y, z) with `args` in parameter order. The
/// kernel is verified first and every argument checked against its parameter.
/// Its `print` ops write their lines to stdout.
///
/// Semantics, beyond the [`crate::kernel::OpKind`] docs:
/// - Grid blocks run one after another, z outermost, then y, then x innermost; within a
///   block, ops run in program order. A kernel whose blocks race on the same output elements
///   therefore sees one particular order here, which the GPU does not promise.
/// - i32 arithmetic wraps; integer division or remainder by zero is a runtime fault
///   ([`InterpError::DivisionByZero`]), as is a `for` step that is not positive.
/// - Float ops compute in f32 and round the result to the value's dtype (bf16 and f16 round
///   to nearest even after every op). `exp2` is f32 `exp2` (exact to within 1 ulp), which
///   is within the hardware `ex2.approx` error bound; `exp2` and `exp` results below f32's
///   normal range are 0, as the hardware's (`.ftz`) are. Float `max`/`min` ignore a NaN operand.
/// - Casts between floats, and from i32 to float, round to nearest even; float to i32
///   truncates toward zero, saturates, and maps NaN to 0 (PTX `cvt.rzi.sat.s32.f32`).
/// - `mma` multiplies exactly (a product of two bf16 or f16 values is exact in f32) and
///   accumulates in f32 starting from the accumulator operand (or 0), adding k = 0..K in
///   order. Tensor cores add in another order, so GPU results differ by f32 rounding only.
/// - Reductions combine in index order; `sum` accumulates in f32 and rounds to the dtype
///   once; identities are `-inf` (max), `+inf` (min) and 0 (sum).
/// - Loads read 0 outside the tensor and stores skip elements outside it; no access leaves
///   a tensor's data whatever the coordinates.
pub fn run(kernel: &Kernel, grid: [u32; 3], args: &mut [HostArg<'_>]) -> Result<(), InterpError> {
    run_with(kernel, grid, args, false).map(drop)
}

/// [`run`], returning the lines its `print` ops wrote instead of writing them to stdout.
pub fn run_captured(
    kernel: &Kernel,
    grid: [u32; 3],
    args: &mut [HostArg<'_>],
) -> Result<Vec<String>, InterpError> {
    run_with(kernel, grid, args, true)
}

fn run_with(
    kernel: &Kernel,
    grid: [u32; 3],
    args: &mut [HostArg<'_>],
    capture: bool,
) -> Result<Vec<String>, InterpError> {
    let g = checked(kernel, grid, args)?;
    let mut machine = exec::Machine::new(kernel, args, g, capture);
    machine.run_grid()?;
    Ok(machine.printed())
}

/// Verifies `kernel`, checks `args` against its parameters and `grid` against the i32 block
/// index; returns the grid as block indices.
fn checked(kernel: &Kernel, grid: [u32; 3], args: &[HostArg<'_>]) -> Result<[i32; 3], InterpError> {
    verify(kernel).map_err(InterpError::Verify)?;
    memory::check_args(&kernel.params, args)?;
    let mut g = [0i32; 3];
    for ((slot, extent), axis) in g.iter_mut().zip(grid).zip(["x", "y", "z"]) {
        *slot = i32::try_from(extent).map_err(|_| InterpError::GridTooLarge { axis, extent })?;
    }
    Ok(g)
}

/// Builds `def` for `comptime` and runs it. The [`Spec`] takes `comptime` as given and marks a
/// tensor parameter 16-byte aligned when its argument's outer strides are multiples of 16
/// bytes (host addresses count as aligned), as the runtime would for device buffers.
pub fn run_def<K: KernelDef + ?Sized>(
    def: &K,
    comptime: &K::Comptime,
    grid: [u32; 3],
    args: &mut [HostArg<'_>],
) -> Result<(), InterpError> {
    let aligned16 = def
        .signature()
        .iter()
        .zip(args.iter())
        .filter_map(|(sig, arg)| match (sig, arg.tensor()) {
            (ParamSig::Tensor { name, .. }, Some(t)) => {
                Some((name.to_string(), memory::is_aligned16(t)))
            }
            _ => None,
        })
        .collect();
    let spec = Spec {
        comptime: comptime.clone(),
        aligned16,
    };
    let kernel = def.build(&spec).map_err(InterpError::Build)?;
    run(&kernel, grid, args)
}
