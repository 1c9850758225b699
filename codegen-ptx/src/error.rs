//! Why a kernel could not be compiled: always a diagnostic at the user's source, whose
//! [`DiagKind`] says whether the kernel is wrong, uses a construct this backend does not
//! lower yet, or hit a kiln bug.

use kiln_ir::{DiagKind, Diagnostic};

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// A diagnostic at the user's source: the kernel is wrong or over a budget, or this
    /// backend does not lower it yet, or kiln broke an invariant ([`CodegenError::kind`]).
    #[error("{0}")]
    Diagnostic(#[from] Diagnostic),
}

impl CodegenError {
    /// The diagnostic, with the user's source location.
    pub fn diagnostic(&self) -> &Diagnostic {
        match self {
            CodegenError::Diagnostic(d) => d,
        }
    }

    /// The same error with a further note (a hint in the DSL's words).
    pub fn note(self, note: impl Into<String>) -> CodegenError {
        match self {
            CodegenError::Diagnostic(d) => CodegenError::Diagnostic(d.note(note)),
        }
    }

    /// Whether the kernel is wrong, unsupported here, or kiln has a bug.
    pub fn kind(&self) -> DiagKind {
        self.diagnostic().kind
    }
}
