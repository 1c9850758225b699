//! The sm_100a attention schedule's rules (placeholder while the writer is built).

use super::ProtocolError;
use crate::ring::Ring;
use crate::tmem::attention::AttentionPlan;

/// A broken attention schedule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttentionError {
    /// Placeholder.
    #[error("placeholder")]
    Placeholder,
}

/// Checks the plan against its ring.
pub(super) fn check_attention(_ring: &Ring, _plan: &AttentionPlan) -> Result<(), ProtocolError> {
    Ok(())
}
