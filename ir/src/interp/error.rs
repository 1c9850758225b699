//! Errors of the interpreter: the kernel did not build or verify, an argument does not fit
//! its parameter, or the kernel faulted at run time.

use crate::diag::Diagnostic;
use crate::kernel::Loc;
use crate::types::DType;
use crate::verify::VerifyErrors;

/// Why [`super::run`] or [`super::run_def`] failed.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    /// The kernel definition failed to build for the given comptime values.
    #[error("the kernel failed to build: {0}")]
    Build(Diagnostic),
    /// The kernel is not well formed (a bug in whatever produced it).
    #[error("the kernel failed verification:\n{0}")]
    Verify(VerifyErrors),
    /// The number of arguments differs from the number of parameters.
    #[error("expected {expected} argument(s), found {found}")]
    ArgCount {
        /// Parameters the kernel declares.
        expected: usize,
        /// Arguments passed.
        found: usize,
    },
    /// An argument does not fit its parameter.
    #[error("argument `{param}`: {problem}")]
    Arg {
        /// The parameter's name.
        param: String,
        /// What is wrong with it.
        problem: ArgProblem,
    },
    /// A grid dimension does not fit the i32 block index.
    #[error("grid dimension {axis} is {extent}, more than i32::MAX blocks")]
    GridTooLarge {
        /// `x`, `y` or `z`.
        axis: &'static str,
        /// The requested extent.
        extent: u32,
    },
    /// Integer division or remainder by zero.
    #[error("{loc}: integer division by zero in {op}")]
    DivisionByZero {
        /// Where the user wrote the division.
        loc: Loc,
        /// The op in the DSL's words (`` `/` ``, `` `%` ``).
        op: String,
    },
    /// A `for` loop ran with a step that is zero or negative.
    #[error("{loc}: loop step is {step}; it must be positive")]
    NonPositiveStep {
        /// Where the user wrote the loop.
        loc: Loc,
        /// The step.
        step: i32,
    },
    /// The scheduled execution found the passes' schedule inconsistent with the kernel (a
    /// bug in kiln's passes): a step reads a value no earlier step computed, a TMA box misses
    /// its tile or leaves shared memory, or the barrier protocol fails.
    #[error("{loc}: the schedule is wrong: {what}")]
    Schedule {
        /// The scheduled loop.
        loc: Loc,
        /// What is wrong.
        what: String,
    },
    /// The interpreter met IR the verifier should have rejected: a bug in kiln.
    #[error("internal kiln error: {loc}: `{op}` should have been rejected by verify")]
    Internal {
        /// The op's location.
        loc: Loc,
        /// The printed op.
        op: String,
    },
}

/// What is wrong with one argument.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgProblem {
    /// A tensor where a scalar is expected, or the reverse, or the wrong scalar type.
    #[error("expected {expected}, found {found}")]
    Kind {
        /// What the parameter takes.
        expected: &'static str,
        /// What was passed.
        found: &'static str,
    },
    /// A `TensorMut` parameter was given a read-only tensor.
    #[error("the kernel writes this tensor; pass it as `HostArg::TensorMut`")]
    NotMutable,
    /// Element type mismatch.
    #[error("expected a {expected} tensor, found {found}")]
    DType {
        /// The parameter's dtype.
        expected: DType,
        /// The tensor's dtype.
        found: DType,
    },
    /// Rank mismatch (shape and strides must both have `expected` entries).
    #[error("expected rank {expected}, found a shape of {shape} and {strides} strides")]
    Rank {
        /// The parameter's rank.
        expected: usize,
        /// Entries in the tensor's shape.
        shape: usize,
        /// Entries in the tensor's strides.
        strides: usize,
    },
    /// The innermost dimension is not contiguous.
    #[error("the innermost stride must be 1, found {stride}")]
    InnerStride {
        /// The innermost stride.
        stride: usize,
    },
    /// An extent does not fit in i32 (kernels index with i32).
    #[error("extent {extent} of dimension {dim} does not fit in i32")]
    ExtentTooLarge {
        /// The dimension.
        dim: usize,
        /// Its extent.
        extent: usize,
    },
    /// The data is shorter than the shape and strides address.
    #[error("shape and strides address {} elements but the data holds {len}", .needed.map_or("more than usize::MAX".to_string(), |n| n.to_string()))]
    DataTooShort {
        /// Elements needed (`None` if the count overflows).
        needed: Option<usize>,
        /// Elements present.
        len: usize,
    },
}
