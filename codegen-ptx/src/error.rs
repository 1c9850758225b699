//! Why a kernel could not be compiled: a diagnostic at the user's source, or a construct the
//! backend does not implement. A bug of kiln is a diagnostic reading "internal kiln error".

use kiln_ir::{Diagnostic, Target};

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The kernel is wrong or over a budget; reported at the user's source.
    #[error("{0}")]
    Diagnostic(#[from] Diagnostic),
    /// The kernel uses something this target's backend does not implement.
    #[error("`{op}` is not supported on {target}")]
    Unsupported {
        /// The operation, as the IR prints it.
        op: String,
        /// The target.
        target: Target,
    },
}
