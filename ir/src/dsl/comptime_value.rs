//! One comptime parameter, untyped: its kind ([`ComptimeKind`]), its value
//! ([`ComptimeValue`], compared by bits), its declaration ([`ComptimeParam`]) and the Rust
//! types it may have ([`ComptimeArg`]). The typed struct of a kernel's values is
//! [`super::Comptime`]; these are what walks its fields without knowing its type.

use std::fmt;
use std::hash::Hash;

use crate::types::DType;

/// The type of a comptime parameter.
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

/// One comptime parameter's value, untyped. Two values are equal when they are bit for bit
/// the same (an `f32` by its bits: `-0.0` and `0.0` are different specialisations), so a
/// value can key a cache.
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
        self.bits().0
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

impl PartialEq for ComptimeValue {
    fn eq(&self, other: &ComptimeValue) -> bool {
        self.bits() == other.bits()
    }
}

impl Eq for ComptimeValue {}

impl Hash for ComptimeValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bits().hash(state);
    }
}

/// Prints the value as `-D` takes it back (`128`, `false`, `-0.0`, `bf16`).
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

/// A comptime parameter: a field of a [`super::Comptime`] struct.
#[derive(Clone, Debug, PartialEq)]
pub struct ComptimeParam {
    /// Name as written in the signature (or the struct).
    pub name: &'static str,
    /// Its type.
    pub kind: ComptimeKind,
    /// The value `kiln ptx`/`kiln ir` use when no `-D` is given, from
    /// `#[comptime(default = ..)]`; `None` if none is declared.
    pub default: Option<ComptimeValue>,
    /// The candidates the autotuner times, from `#[comptime(tune = [..])]`; empty if the
    /// parameter is not tuned.
    pub tune: &'static [ComptimeValue],
}

/// A Rust type a comptime parameter may have: `usize`, `i32`, `bool`, `f32`, [`DType`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a comptime parameter type",
    note = "comptime parameters are usize, i32, bool, f32 or DType"
)]
pub trait ComptimeArg: Sized + Copy {
    /// The kind recorded in the parameter's [`ComptimeParam`].
    const KIND: ComptimeKind;
    /// The Rust value of `v`, if it has this kind.
    fn from_value(v: ComptimeValue) -> Option<Self>;
    /// As a [`ComptimeValue`] (what generated `PartialEq` and `Hash` impls compare, so an
    /// `f32` field counts by its bits).
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

/// The declared default of the [`DType`] parameter `name` among `params`, for the signature
/// table of a kernel whose tensors name a field of a `#[comptime]` struct as their element
/// type (`Tensor<dtype, 4>`); bf16 when there is no such parameter with a default. The
/// generated code also reads the field as a `DType` (`let _: DType = p.dtype;`), so a name
/// that is no `DType` field is a compile error at the tensor's type, in the compiler's words.
pub const fn declared_dtype(params: &[ComptimeParam], name: &str) -> DType {
    let mut i = 0;
    while i < params.len() {
        if const_str_eq(params[i].name, name)
            && let Some(ComptimeValue::DType(d)) = params[i].default
        {
            return d;
        }
        i += 1;
    }
    DType::Bf16
}

/// `a == b`, in a `const fn`.
const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_dtypes_are_found_by_name() {
        const PARAMS: &[ComptimeParam] = &[ComptimeParam {
            name: "dtype",
            kind: ComptimeKind::DType,
            default: Some(ComptimeValue::DType(DType::F16)),
            tune: &[],
        }];
        const D: DType = declared_dtype(PARAMS, "dtype");
        assert_eq!(D, DType::F16);
        assert_eq!(declared_dtype(PARAMS, "dtyp"), DType::Bf16);
    }

    #[test]
    fn values_compare_by_bits_and_print_as_defines_take_them() {
        use ComptimeValue as V;
        assert_ne!(V::F32(0.0), V::F32(-0.0));
        assert_eq!(V::F32(f32::NAN), V::F32(f32::NAN));
        assert_ne!(V::Usize(1), V::I32(1));
        assert_eq!(V::F32(-0.0).to_string(), "-0.0");
        assert_eq!(
            ComptimeValue::parse(ComptimeKind::F32, "-0.0"),
            Some(V::F32(-0.0))
        );
        assert_eq!(
            ComptimeValue::parse(ComptimeKind::DType, "f16"),
            Some(V::DType(DType::F16))
        );
        assert_eq!(ComptimeValue::parse(ComptimeKind::Usize, "-1"), None);
    }
}
