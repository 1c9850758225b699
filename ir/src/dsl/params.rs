//! Kernel parameters as the macro's generated `build` sees them: the IR [`Param`] list from a
//! signature and a [`Spec`], comptime arguments read from the spec, scalar parameters.

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::kernel::{Loc, OpKind, Param};
use crate::types::DType;

use super::def::{ComptimeKind, ComptimeValue, ParamSig, Spec};
use super::value::{self, Value};

/// The IR parameters for `signature` in `spec`: element types that are comptime parameters
/// resolved from its comptime values, alignment facts taken from it.
pub fn params_for(signature: &[ParamSig], spec: &Spec) -> Vec<Param> {
    signature
        .iter()
        .map(|p| {
            p.specialised(&spec.comptime)
                .to_param(spec.aligned16.get(p.name()).copied().unwrap_or(false))
        })
        .collect()
}

/// A Rust type a comptime parameter may have: `usize`, `i32`, `bool`, `f32`, [`DType`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a comptime parameter type",
    note = "comptime parameters are usize, i32, bool, f32 or DType"
)]
pub trait ComptimeArg: Sized + Copy {
    /// The kind recorded in the kernel's [`super::def::ComptimeParam`].
    const KIND: ComptimeKind;
    /// The Rust value of `v`, if it has this kind.
    fn from_value(v: ComptimeValue) -> Option<Self>;
    /// As a [`ComptimeValue`].
    fn to_value(self) -> ComptimeValue;
}

/// Implements [`ComptimeArg`] for one type and its [`ComptimeValue`] variant.
macro_rules! comptime_arg {
    ($($t:ty => $variant:ident),*) => {$(
        impl ComptimeArg for $t {
            const KIND: ComptimeKind = ComptimeKind::$variant;
            fn from_value(v: ComptimeValue) -> Option<$t> {
                match v {
                    ComptimeValue::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn to_value(self) -> ComptimeValue {
                ComptimeValue::$variant(self)
            }
        }
    )*};
}
comptime_arg!(usize => Usize, i32 => I32, bool => Bool, f32 => F32, DType => DType);

/// The comptime argument `name` from `spec`; a diagnostic at the parameter if it is missing
/// or of another kind.
#[track_caller]
pub fn comptime<T: ComptimeArg>(spec: &Spec, name: &str) -> Result<T, Diagnostic> {
    let loc = Loc::caller();
    match spec.comptime.get(name) {
        Some(v) => T::from_value(*v).ok_or_else(|| {
            Diagnostic::new(
                loc,
                format!(
                    "comptime parameter `{name}` is a {}, but the spec gives {} `{v}`",
                    T::KIND.name(),
                    v.kind().name()
                ),
            )
        }),
        None => Err(Diagnostic::new(
            loc,
            format!(
                "no value given for comptime parameter `{name}: {}`",
                T::KIND.name()
            ),
        )),
    }
}

/// The value of scalar parameter number `index` (launch order).
#[track_caller]
pub fn scalar_param(index: usize) -> Value {
    value::emit(OpKind::ScalarParam(index), &[], Loc::caller())
}

/// The comptime map the generated `launch`/`interpret` pass on, from `(name, value)` pairs.
pub fn comptime_map(entries: &[(&str, ComptimeValue)]) -> BTreeMap<String, ComptimeValue> {
    entries
        .iter()
        .map(|(name, v)| ((*name).to_string(), *v))
        .collect()
}
