//! `-D NAME=VALUE`: comptime values as a person types them (the CLI, text-driven test
//! tables), turned into the values of a kernel's comptime struct ([`super::Comptime`]'s
//! `from_defines` makes the struct of them). This is the only place text becomes comptime
//! values; everything past it passes the typed struct.

use super::comptime_value::{ComptimeKind, ComptimeParam, ComptimeValue};

/// Why `-D` text does not make a kernel's comptime struct.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DefineError {
    /// A define is not `NAME=VALUE`.
    #[error("`{text}`: expected NAME=VALUE")]
    NotAssignment {
        /// The text given.
        text: String,
    },
    /// `-D name=..` names no comptime parameter.
    #[error(
        "no comptime parameter `{name}`; the parameters are: {}",
        list_or_none(known)
    )]
    UnknownParam {
        /// The unknown name.
        name: String,
        /// The comptime parameter names.
        known: Vec<&'static str>,
    },
    /// The text of a define does not parse as the parameter's type.
    #[error("comptime parameter `{name}` is a {}, and `{text}` is not one", kind.name())]
    BadValue {
        /// The parameter.
        name: &'static str,
        /// Its type.
        kind: ComptimeKind,
        /// The text given.
        text: String,
    },
    /// A comptime parameter has no default and no define.
    #[error("comptime parameter `{name}: {}` has no default; give it with -D {name}=VALUE", kind.name())]
    Missing {
        /// The parameter.
        name: &'static str,
        /// Its type.
        kind: ComptimeKind,
    },
    /// A hand-written [`super::Comptime`] impl whose `from_values` refuses the kinds its
    /// `PARAMS` declare (generated impls cannot).
    #[error(
        "internal kiln error: a comptime struct refused values of the kinds its PARAMS declare"
    )]
    Inconsistent,
}

/// `a, b, c`, or `none` for an empty list.
fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// Splits one `NAME=VALUE` define at its first `=`.
pub fn split_define(text: &str) -> Result<(String, String), DefineError> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| DefineError::NotAssignment {
            text: text.to_string(),
        })
}

/// The values of `params` (in their order): `base`'s, or where there is none each
/// parameter's declared default, replaced by `defines` (`(name, text)` pairs; for a name given
/// twice the last counts). What [`Comptime::from_defines`] and [`Comptime::with_defines`]
/// make their struct of.
///
/// [`Comptime::from_defines`]: super::Comptime::from_defines
/// [`Comptime::with_defines`]: super::Comptime::with_defines
pub fn values_from_defines(
    params: &[ComptimeParam],
    base: Option<Vec<ComptimeValue>>,
    defines: &[(String, String)],
) -> Result<Vec<ComptimeValue>, DefineError> {
    if let Some((name, _)) = defines
        .iter()
        .find(|(n, _)| !params.iter().any(|p| p.name == n))
    {
        return Err(DefineError::UnknownParam {
            name: name.clone(),
            known: params.iter().map(|p| p.name).collect(),
        });
    }
    let mut values = Vec::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        let value = match defines.iter().rev().find(|(n, _)| n == p.name) {
            Some((_, text)) => {
                ComptimeValue::parse(p.kind, text).ok_or_else(|| DefineError::BadValue {
                    name: p.name,
                    kind: p.kind,
                    text: text.clone(),
                })?
            }
            None => base
                .as_ref()
                .and_then(|b| b.get(i).copied())
                .or(p.default)
                .ok_or(DefineError::Missing {
                    name: p.name,
                    kind: p.kind,
                })?,
        };
        values.push(value);
    }
    Ok(values)
}
