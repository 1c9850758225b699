//! User-facing diagnostics: a message at a source location, with notes.

use std::fmt;

use crate::kernel::Loc;

/// An error in a user's kernel (a shape or dtype mismatch, a resource over budget, an
/// unsupported construct on a target), reported at the user's source location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// One sentence saying what is wrong.
    pub message: String,
    /// Where the user wrote the offending code.
    pub loc: Loc,
    /// Further facts and hints, one sentence each.
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// A diagnostic with no notes.
    pub fn new(loc: Loc, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            loc,
            notes: Vec::new(),
        }
    }

    /// Adds a note.
    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// An internal compiler error: a bug in kiln, not in the user's kernel.
    pub fn internal(loc: Loc, what: impl fmt::Display) -> Diagnostic {
        Diagnostic::new(loc, format!("internal kiln error: {what}"))
            .note("this is a bug in kiln; the kernel should have been rejected earlier or accepted")
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.message)?;
        if self.loc.is_known() {
            write!(f, "\n  --> {}", self.loc)?;
        }
        for n in &self.notes {
            write!(f, "\n  = note: {n}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}
