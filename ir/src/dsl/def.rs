//! What a `#[kernel]` function becomes: a [`KernelDef`] that builds a [`Kernel`] for a
//! [`Spec`] (its comptime arguments plus what the runtime specialises on).

use std::collections::BTreeMap;
use std::fmt;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, Param};
use crate::types::DType;

/// The type of a comptime argument (`const N: usize` generics and `#[comptime]` parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ComptimeKind {
    /// `usize` (const generics and `#[comptime] n: usize`).
    Usize,
    /// `i32`.
    I32,
    /// `bool`.
    Bool,
    /// `f32`.
    F32,
    /// [`DType`]: an element type, which tensor parameters may name (`Tensor<T, 2>`) so that
    /// one kernel source serves several (`bf16` and `f16`).
    DType,
}

impl ComptimeKind {
    /// The Rust type name.
    pub fn name(self) -> &'static str {
        match self {
            ComptimeKind::Usize => "usize",
            ComptimeKind::I32 => "i32",
            ComptimeKind::Bool => "bool",
            ComptimeKind::F32 => "f32",
            ComptimeKind::DType => "DType",
        }
    }
}

/// A comptime argument's value. Two values are equal when they are bit for bit the same (an
/// `f32` by its bits: `-0.0` and `0.0` are different specialisations), so a value can key a
/// cache.
#[derive(Clone, Copy, Debug)]
pub enum ComptimeValue {
    /// A `usize`.
    Usize(usize),
    /// An `i32`.
    I32(i32),
    /// A `bool`.
    Bool(bool),
    /// An `f32`.
    F32(f32),
    /// An element type.
    DType(DType),
}

impl ComptimeValue {
    /// The value with an `f32` as its bits: what equality and hashing compare.
    fn bits(&self) -> (ComptimeKind, u64) {
        match *self {
            ComptimeValue::Usize(n) => (ComptimeKind::Usize, n as u64),
            ComptimeValue::I32(n) => (ComptimeKind::I32, n as u32 as u64),
            ComptimeValue::Bool(b) => (ComptimeKind::Bool, b as u64),
            ComptimeValue::F32(x) => (ComptimeKind::F32, x.to_bits() as u64),
            ComptimeValue::DType(d) => (ComptimeKind::DType, d as u64),
        }
    }

    /// The value's kind.
    pub fn kind(&self) -> ComptimeKind {
        match self {
            ComptimeValue::Usize(_) => ComptimeKind::Usize,
            ComptimeValue::I32(_) => ComptimeKind::I32,
            ComptimeValue::Bool(_) => ComptimeKind::Bool,
            ComptimeValue::F32(_) => ComptimeKind::F32,
            ComptimeValue::DType(_) => ComptimeKind::DType,
        }
    }

    /// Parses `text` as a value of `kind` (as given on the command line: `-D d=128`; an
    /// element type by its name, `-D T=f16`).
    pub fn parse(kind: ComptimeKind, text: &str) -> Option<ComptimeValue> {
        match kind {
            ComptimeKind::Usize => text.parse().ok().map(ComptimeValue::Usize),
            ComptimeKind::I32 => text.parse().ok().map(ComptimeValue::I32),
            ComptimeKind::Bool => text.parse().ok().map(ComptimeValue::Bool),
            ComptimeKind::F32 => text.parse().ok().map(ComptimeValue::F32),
            ComptimeKind::DType => [DType::Bf16, DType::F16, DType::F32, DType::I32]
                .into_iter()
                .find(|d| d.name() == text)
                .map(ComptimeValue::DType),
        }
    }
}

impl fmt::Display for ComptimeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComptimeValue::Usize(v) => write!(f, "{v}"),
            ComptimeValue::I32(v) => write!(f, "{v}"),
            ComptimeValue::Bool(v) => write!(f, "{v}"),
            ComptimeValue::F32(v) => write!(f, "{v:?}"),
            ComptimeValue::DType(v) => write!(f, "{v}"),
        }
    }
}

/// A comptime parameter of a kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct ComptimeParam {
    /// Name as written in the signature.
    pub name: &'static str,
    /// Its type.
    pub kind: ComptimeKind,
    /// The value `kiln ptx`/`kiln ir` use when no `-D` is given, from
    /// `#[comptime(default = ..)]`; `None` if the kernel declares none.
    pub default: Option<ComptimeValue>,
    /// The candidates the autotuner times, from `#[comptime(tune = [..])]`; empty if the
    /// parameter is not tuned.
    pub tune: &'static [ComptimeValue],
}

/// A launch parameter as declared in the kernel's signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamSig {
    /// `Tensor<T, RANK>` (read-only) or `TensorMut<T, RANK>`.
    Tensor {
        /// Name.
        name: &'static str,
        /// Element type; when `dtype_param` is set, that parameter's declared default.
        dtype: DType,
        /// The comptime [`ComptimeKind::DType`] parameter `T` of `Tensor<T, RANK>`, whose value
        /// is the element type in each specialisation ([`ParamSig::specialised`]).
        dtype_param: Option<&'static str>,
        /// Rank.
        rank: usize,
        /// Whether declared `TensorMut`.
        mutable: bool,
    },
    /// A scalar passed by value (`f32` or `i32`).
    Scalar {
        /// Name.
        name: &'static str,
        /// Type.
        dtype: DType,
    },
}

impl ParamSig {
    /// The parameter's name.
    pub fn name(&self) -> &'static str {
        match self {
            ParamSig::Tensor { name, .. } | ParamSig::Scalar { name, .. } => name,
        }
    }

    /// This declaration in the specialisation whose comptime values are `comptime`: a tensor
    /// whose element type is a comptime parameter gets that parameter's value (its declared
    /// default when `comptime` has none, which building the kernel then reports).
    pub fn specialised(&self, comptime: &BTreeMap<String, ComptimeValue>) -> ParamSig {
        match *self {
            ParamSig::Tensor {
                name,
                dtype,
                dtype_param: Some(param),
                rank,
                mutable,
            } => ParamSig::Tensor {
                name,
                dtype: match comptime.get(param) {
                    Some(ComptimeValue::DType(d)) => *d,
                    _ => dtype,
                },
                dtype_param: None,
                rank,
                mutable,
            },
            ref other => other.clone(),
        }
    }

    /// The IR parameter this declaration becomes; `aligned16` is the specialisation's
    /// alignment fact for a tensor (ignored for a scalar). A tensor whose element type is a
    /// comptime parameter must be [`ParamSig::specialised`] first (else it takes the default).
    pub fn to_param(&self, aligned16: bool) -> Param {
        match *self {
            ParamSig::Tensor {
                name,
                dtype,
                rank,
                mutable,
                ..
            } => Param::Tensor {
                name: name.to_string(),
                dtype,
                rank,
                mutable,
                aligned16,
            },
            ParamSig::Scalar { name, dtype } => Param::Scalar {
                name: name.to_string(),
                dtype,
            },
        }
    }
}

/// Prints the declaration as written in the kernel's signature: `q: Tensor<bf16, 4>`,
/// `o: TensorMut<bf16, 4>`, `a: Tensor<T, 2>` (element type a comptime parameter),
/// `scale: f32`.
impl fmt::Display for ParamSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamSig::Tensor {
                name,
                dtype,
                dtype_param,
                rank,
                mutable,
            } => {
                let ty = if *mutable { "TensorMut" } else { "Tensor" };
                match dtype_param {
                    Some(t) => write!(f, "{name}: {ty}<{t}, {rank}>"),
                    None => write!(f, "{name}: {ty}<{dtype}, {rank}>"),
                }
            }
            ParamSig::Scalar { name, dtype } => write!(f, "{name}: {dtype}"),
        }
    }
}

impl PartialEq for ComptimeValue {
    fn eq(&self, other: &ComptimeValue) -> bool {
        self.bits() == other.bits()
    }
}

impl Eq for ComptimeValue {}

impl std::hash::Hash for ComptimeValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bits().hash(state);
    }
}

/// Everything a kernel is specialised on: comptime arguments by name, and for each tensor
/// parameter (by name) whether its base address and outer strides are 16-byte aligned.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Spec {
    /// Comptime argument values by parameter name.
    pub comptime: BTreeMap<String, ComptimeValue>,
    /// Alignment facts for tensor parameters, by name. A tensor missing here counts as not
    /// aligned.
    pub aligned16: BTreeMap<String, bool>,
}

impl Spec {
    /// The same spec with the tensors `names` marked 16-byte aligned (what a launch with
    /// contiguous, aligned allocations of them specialises on).
    pub fn with_aligned16(mut self, names: &[&str]) -> Spec {
        self.aligned16
            .extend(names.iter().map(|n| (n.to_string(), true)));
        self
    }

    /// A stable text key for caches and file names (`d=128,causal=false|q:a16,...`).
    pub fn key(&self) -> String {
        let c: Vec<String> = self
            .comptime
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let a: Vec<String> = self
            .aligned16
            .iter()
            .map(|(k, v)| format!("{k}:{}", if *v { "a16" } else { "a1" }))
            .collect();
        format!("{}|{}", c.join(","), a.join(","))
    }
}

/// A kernel definition, as generated by `#[kernel]`.
pub trait KernelDef: Sync {
    /// The kernel's name (the Rust function's).
    fn name(&self) -> &'static str;
    /// Comptime parameters (const generics first, then `#[comptime]` arguments).
    fn comptime_params(&self) -> &'static [ComptimeParam];
    /// Launch parameters in order, as declared (see [`specialise`] for one specialisation's).
    fn signature(&self) -> &'static [ParamSig];
    /// Builds the kernel's IR for `spec`. Missing or ill-typed comptime values, and every
    /// shape or type error in the body, come back as diagnostics at the user's source.
    fn build(&self, spec: &Spec) -> Result<Kernel, Diagnostic>;
}

/// `signature` in the specialisation whose comptime values are `comptime`: every tensor's
/// element type resolved ([`ParamSig::specialised`]). What a launch validates its arguments
/// against.
pub fn specialise(
    signature: &[ParamSig],
    comptime: &BTreeMap<String, ComptimeValue>,
) -> Vec<ParamSig> {
    signature.iter().map(|p| p.specialised(comptime)).collect()
}

/// Why a [`Spec`] could not be made from defaults and overrides.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `-D name=..` names no comptime parameter of the kernel.
    #[error(
        "kernel `{kernel}` has no comptime parameter `{name}`; it has: {}",
        list_or_none(known)
    )]
    UnknownParam {
        /// The kernel.
        kernel: &'static str,
        /// The unknown name.
        name: String,
        /// The kernel's comptime parameter names.
        known: Vec<&'static str>,
    },
    /// The text of an override does not parse as the parameter's type.
    #[error("comptime parameter `{name}` is a {}, and `{text}` is not one", kind.name())]
    BadValue {
        /// The parameter.
        name: &'static str,
        /// Its type.
        kind: ComptimeKind,
        /// The text given.
        text: String,
    },
    /// A comptime parameter has no default and no override.
    #[error("comptime parameter `{name}: {}` has no default; give it with -D {name}=VALUE", kind.name())]
    Missing {
        /// The parameter.
        name: &'static str,
        /// Its type.
        kind: ComptimeKind,
    },
}

/// `a, b, c`, or `none` for an empty list.
fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

impl Spec {
    /// The spec the CLI and snapshot tests use: each comptime parameter's default, replaced by
    /// `overrides` (`(name, text)` pairs, as in `-D name=text`), with every tensor parameter
    /// marked 16-byte aligned (the common case the runtime specialises on).
    pub fn from_defaults(
        def: &dyn KernelDef,
        overrides: &[(String, String)],
    ) -> Result<Spec, SpecError> {
        let params = def.comptime_params();
        for (name, _) in overrides {
            if !params.iter().any(|p| p.name == name) {
                return Err(SpecError::UnknownParam {
                    kernel: def.name(),
                    name: name.clone(),
                    known: params.iter().map(|p| p.name).collect(),
                });
            }
        }
        let mut spec = Spec::default();
        for p in params {
            let value = match overrides.iter().rev().find(|(n, _)| n == p.name) {
                Some((_, text)) => {
                    ComptimeValue::parse(p.kind, text).ok_or_else(|| SpecError::BadValue {
                        name: p.name,
                        kind: p.kind,
                        text: text.clone(),
                    })?
                }
                None => p.default.ok_or(SpecError::Missing {
                    name: p.name,
                    kind: p.kind,
                })?,
            };
            spec.comptime.insert(p.name.to_string(), value);
        }
        for s in def.signature() {
            if let ParamSig::Tensor { name, .. } = s {
                spec.aligned16.insert(name.to_string(), true);
            }
        }
        Ok(spec)
    }
}
