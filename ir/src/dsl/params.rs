//! Kernel parameters as the macro's generated `build` sees them: the IR [`Param`] list from a
//! signature and a [`Spec`], and scalar parameters.

use crate::kernel::{Loc, OpKind, Param};

use super::comptime::Comptime;
use super::def::{ParamSig, Spec};
use super::value::{self, Value};

/// The IR parameters for `signature` in `spec`: element types that are comptime parameters
/// resolved from its comptime values, alignment facts taken from it.
pub fn params_for<C: Comptime>(signature: &[ParamSig], spec: &Spec<C>) -> Vec<Param> {
    signature
        .iter()
        .map(|p| {
            p.specialised(&spec.comptime)
                .to_param(spec.aligned16.get(p.name()).copied().unwrap_or(false))
        })
        .collect()
}

/// The value of scalar parameter number `index` (launch order).
#[track_caller]
pub fn scalar_param(index: usize) -> Value {
    value::emit(OpKind::ScalarParam(index), &[], Loc::caller())
}
