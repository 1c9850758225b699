//! The kernel's signature: const generics and `#[comptime]` parameters (Rust values while
//! tracing) and launch parameters (tensors and scalars).

use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, FnArg, GenericArgument, GenericParam, Ident, Meta, Pat, PathArguments,
    ReturnType, Type,
};

use super::{Errors, int_literal};

/// The Rust type of a comptime parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ComptimeKind {
    /// `usize`.
    Usize,
    /// `i32`.
    I32,
    /// `bool`.
    Bool,
    /// `f32`.
    F32,
    /// `DType`: an element type that tensor parameters may name.
    DType,
}

impl ComptimeKind {
    /// The kind a field or parameter of type `ty` has, if `ty` is one of the five.
    pub fn from_type(ty: &Type) -> Option<ComptimeKind> {
        match last_ident(ty)?.to_string().as_str() {
            "usize" => Some(ComptimeKind::Usize),
            "i32" => Some(ComptimeKind::I32),
            "bool" => Some(ComptimeKind::Bool),
            "f32" => Some(ComptimeKind::F32),
            "DType" => Some(ComptimeKind::DType),
            _ => None,
        }
    }

    /// The Rust type (a primitive's name, or `DType`, which the generated code names by its
    /// absolute path) and the `ComptimeKind`/`ComptimeValue` variant name.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            ComptimeKind::Usize => ("usize", "Usize"),
            ComptimeKind::I32 => ("i32", "I32"),
            ComptimeKind::Bool => ("bool", "Bool"),
            ComptimeKind::F32 => ("f32", "F32"),
            ComptimeKind::DType => ("DType", "DType"),
        }
    }
}

/// A comptime parameter (const generic or `#[comptime]` argument).
pub struct ComptimeParam {
    /// Its name.
    pub name: Ident,
    /// Its type.
    pub kind: ComptimeKind,
    /// `#[comptime(default = ..)]`.
    pub default: Option<Expr>,
    /// `#[comptime(tune = [..])]`: the autotuner's candidates.
    pub tune: Vec<Expr>,
}

/// An element type of a tensor or scalar parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// `bf16`.
    Bf16,
    /// `f16`.
    F16,
    /// `f32`.
    F32,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
}

impl Dtype {
    fn from_type(ty: &Type) -> Option<Dtype> {
        match last_ident(ty)?.to_string().as_str() {
            "bf16" => Some(Dtype::Bf16),
            "f16" => Some(Dtype::F16),
            "f32" => Some(Dtype::F32),
            "i32" => Some(Dtype::I32),
            "u32" => Some(Dtype::U32),
            _ => None,
        }
    }

    /// The `DType` variant name.
    pub fn variant(self) -> &'static str {
        match self {
            Dtype::Bf16 => "Bf16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
        }
    }
}

/// The element type of a tensor parameter.
pub enum Elem {
    /// A fixed one: `Tensor<bf16, 2>`.
    Fixed(Dtype),
    /// A comptime `DType` parameter's value: `Tensor<T, 2>`, with `T`'s default.
    Param {
        /// The parameter.
        name: Ident,
        /// Its `#[comptime(default = ..)]` expression (boxed: an `Expr` is large).
        default: Box<Expr>,
    },
    /// A `DType` field of the kernel's comptime struct parameter: `Tensor<dtype, 4>` where
    /// the kernel takes `#[comptime] p: AttentionParams` (the struct's own declaration holds
    /// the default, which the generated code reads and the compiler checks).
    Field(Ident),
}

/// What a launch parameter is.
pub enum LaunchKind {
    /// `Tensor<T, R>` / `TensorMut<T, R>`.
    Tensor {
        /// Element type.
        dtype: Elem,
        /// Rank, 1..=5.
        rank: usize,
        /// `TensorMut`.
        mutable: bool,
    },
    /// `f32` or `i32` by value.
    Scalar(Dtype),
}

/// A launch parameter.
pub struct LaunchParam {
    /// Its name.
    pub name: Ident,
    /// Its kind.
    pub kind: LaunchKind,
}

/// `#[comptime] p: AttentionParams`: a kernel's one comptime parameter, a struct under
/// `#[comptime]` that other kernels may take too.
pub struct StructParam {
    /// The binding the body reads (`p`).
    pub name: Ident,
    /// The struct's type.
    pub ty: Type,
}

/// A parsed kernel signature.
#[derive(Default)]
pub struct Signature {
    /// Const generics first, then `#[comptime]` arguments, each in declaration order.
    pub comptime: Vec<ComptimeParam>,
    /// The comptime struct parameter, when the kernel takes one instead of `comptime`.
    pub comptime_struct: Option<StructParam>,
    /// Launch parameters in order.
    pub launch: Vec<LaunchParam>,
}

/// Names the generated `launch`/`interpret` methods use for their own arguments.
const RESERVED: &[&str] = &["dev", "grid", "comptime"];

/// Parses a kernel signature, recording every problem in `errors`.
pub fn parse_signature(sig: &syn::Signature, errors: &mut Errors) -> Signature {
    if let Some(t) = &sig.asyncness {
        errors.at(
            t,
            "a kernel cannot be `async`; kernels run on the GPU, remove `async`",
        );
    }
    if let Some(t) = &sig.unsafety {
        errors.at(
            t,
            "a kernel cannot be `unsafe`; kiln checks every access, remove `unsafe`",
        );
    }
    if let Some(t) = &sig.constness {
        errors.at(t, "a kernel cannot be a `const fn`");
    }
    if let Some(t) = &sig.abi {
        errors.at(t, "a kernel cannot declare an ABI");
    }
    if let Some(v) = &sig.variadic {
        errors.at(v, "a kernel cannot be variadic");
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        errors.at(
            ty,
            "a kernel returns nothing; write its results with `.store(..)` into a `TensorMut`",
        );
    }
    if let Some(w) = &sig.generics.where_clause {
        errors.at(w, "a kernel cannot have a `where` clause");
    }
    let mut out = Signature::default();
    for g in &sig.generics.params {
        match g {
            GenericParam::Const(c) => match ComptimeKind::from_type(&c.ty) {
                Some(kind) => out.comptime.push(ComptimeParam {
                    name: c.ident.clone(),
                    kind,
                    // Rust allows no defaults on a fn's const generics, but the macro consumes
                    // them, so `<const D: usize = 64>` declares the CLI default.
                    default: c.default.clone(),
                    tune: Vec::new(),
                }),
                None => errors.at(&c.ty, "const generic kernel parameters must be usize, i32 or bool"),
            },
            GenericParam::Type(t) => errors.at(
                t,
                "a kernel cannot have generic type parameters; use `const N: usize` or a `#[comptime]` parameter",
            ),
            GenericParam::Lifetime(l) => errors.at(l, "a kernel cannot have lifetime parameters"),
        }
    }
    let mut comptime_args = Vec::new();
    for arg in &sig.inputs {
        let FnArg::Typed(pt) = arg else {
            errors.at(arg, "a kernel is a free function; it cannot take `self`");
            continue;
        };
        let Pat::Ident(pi) = &*pt.pat else {
            errors.at(&pt.pat, "kernel parameters must be plain names");
            continue;
        };
        if let Some(m) = &pi.mutability {
            errors.at(
                m,
                "kernel parameters cannot be `mut`; shadow them with `let` instead",
            );
        }
        let name = pi.ident.clone();
        if RESERVED.contains(&name.to_string().as_str()) {
            errors.at(
                &name,
                format_args!(
                    "`{name}` is reserved: the generated `launch` takes an argument of that name"
                ),
            );
        }
        match comptime_attr(&pt.attrs, errors) {
            Some(ComptimeOptions { default, tune }) => match ComptimeKind::from_type(&pt.ty) {
                Some(kind) => comptime_args.push(ComptimeParam {
                    name,
                    kind,
                    default,
                    tune,
                }),
                None if is_struct_path(&pt.ty) => {
                    let attr = pt.attrs.iter().find(|a| a.path().is_ident("comptime"));
                    if let Some(attr) = attr.filter(|_| default.is_some() || !tune.is_empty()) {
                        errors.at(
                            attr,
                            "a comptime struct declares its defaults and candidates on its fields; write `#[comptime]`",
                        );
                    }
                    if out.comptime_struct.is_some() {
                        errors.at(&name, "a kernel takes at most one comptime struct parameter");
                    } else {
                        out.comptime_struct = Some(StructParam {
                            name,
                            ty: (*pt.ty).clone(),
                        });
                    }
                }
                None => errors.at(
                    &pt.ty,
                    "`#[comptime]` parameters must be usize, i32, bool, f32, DType or a `#[comptime]` struct",
                ),
            },
            None => {
                if let Some(kind) = launch_kind(&pt.ty, errors) {
                    out.launch.push(LaunchParam { name, kind });
                }
            }
        }
    }
    out.comptime.extend(comptime_args);
    if let (Some(p), Some(other)) = (&out.comptime_struct, out.comptime.first()) {
        errors.at(
            &p.name,
            format_args!(
                "`{}` is a comptime struct, so it is the kernel's only comptime parameter; make `{}` a field of it",
                p.name, other.name
            ),
        );
    }
    resolve_elems(&mut out, errors);
    out
}

/// Whether `ty` may name a `#[comptime]` struct: a path without `<..>` arguments.
fn is_struct_path(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => {
            p.qself.is_none()
                && p.path
                    .segments
                    .iter()
                    .all(|s| matches!(s.arguments, PathArguments::None))
        }
        _ => false,
    }
}

/// Resolves the element types `launch_kind` left as names (`Tensor<T, 2>`) against the
/// comptime parameters, which may come after the tensor in the signature; with a comptime
/// struct parameter, the names are its fields (which the compiler checks).
fn resolve_elems(sig: &mut Signature, errors: &mut Errors) {
    for p in &mut sig.launch {
        let LaunchKind::Tensor { dtype, .. } = &mut p.kind else {
            continue;
        };
        if sig.comptime_struct.is_some()
            && let Elem::Param { name, .. } = dtype
        {
            *dtype = Elem::Field(name.clone());
            continue;
        }
        let Elem::Param { name, default } = dtype else {
            continue;
        };
        match sig.comptime.iter().find(|c| c.name == *name) {
            Some(ComptimeParam {
                kind: ComptimeKind::DType,
                default: Some(d),
                ..
            }) => **default = d.clone(),
            Some(ComptimeParam {
                kind: ComptimeKind::DType,
                default: None,
                ..
            }) => errors.at(
                &*name,
                format_args!(
                    "`{name}` names a tensor's element type, so it needs a default, which the declared signature shows: `#[comptime(default = DType::Bf16)] {name}: DType`"
                ),
            ),
            Some(_) => errors.at(
                &*name,
                format_args!("`{name}` is a comptime parameter, but not of type `DType`; an element type must be one"),
            ),
            None => errors.at(&*name, ELEM_HINT),
        }
    }
}

/// What a tensor's element type may be.
const ELEM_HINT: &str = "tensor element types are bf16, f16, f32, i32 and u32, or a `#[comptime] T: DType` parameter's name";

/// The options of a `#[comptime(..)]` attribute.
#[derive(Default)]
pub struct ComptimeOptions {
    /// `default = VALUE`.
    pub default: Option<Expr>,
    /// `tune = [VALUES]`.
    pub tune: Vec<Expr>,
}

/// `Some(options)` if `attrs` hold `#[comptime]` or `#[comptime(default = .., tune = [..])]`.
pub fn comptime_attr(attrs: &[Attribute], errors: &mut Errors) -> Option<ComptimeOptions> {
    let mut found: Option<ComptimeOptions> = None;
    for a in attrs {
        if !a.path().is_ident("comptime") {
            errors.at(a, "only `#[comptime]` is allowed on kernel parameters");
            continue;
        }
        // Once the attribute is there the parameter is comptime, even if its options are
        // wrong: reporting it as an unsupported launch parameter too would mislead.
        let options = found.get_or_insert_with(ComptimeOptions::default);
        match &a.meta {
            Meta::Path(_) => {}
            Meta::List(list) => {
                let parsed = list.parse_args_with(
                    syn::punctuated::Punctuated::<syn::MetaNameValue, syn::Token![,]>::parse_terminated,
                );
                match parsed {
                    Ok(items) => {
                        for nv in items {
                            if nv.path.is_ident("default") {
                                options.default = Some(nv.value);
                            } else if nv.path.is_ident("tune") {
                                match nv.value {
                                    Expr::Array(arr) if !arr.elems.is_empty() => {
                                        options.tune = arr.elems.into_iter().collect();
                                    }
                                    other => errors.at(
                                        &other,
                                        "write the candidates as a non-empty array: `tune = [64, 128]`",
                                    ),
                                }
                            } else {
                                errors.at(
                                    &nv.path,
                                    "unknown `#[comptime]` option; the options are `default = VALUE` and `tune = [VALUES]`",
                                );
                            }
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
            Meta::NameValue(nv) => errors.at(nv, "write `#[comptime(default = VALUE)]`"),
        }
    }
    found
}

/// The kind of a launch parameter of type `ty`.
fn launch_kind(ty: &Type, errors: &mut Errors) -> Option<LaunchKind> {
    let hint = "kernel parameters are `Tensor<T, R>`, `TensorMut<T, R>`, `f32`, `i32`, `u32`, or `#[comptime]` values";
    let Type::Path(p) = ty else {
        errors.at(
            ty,
            format_args!("unsupported kernel parameter type; {hint}"),
        );
        return None;
    };
    let Some(seg) = p.path.segments.last() else {
        errors.at(ty, hint);
        return None;
    };
    let mutable = match seg.ident.to_string().as_str() {
        "Tensor" => false,
        "TensorMut" => true,
        "f32" => return Some(LaunchKind::Scalar(Dtype::F32)),
        "i32" => return Some(LaunchKind::Scalar(Dtype::I32)),
        "u32" => return Some(LaunchKind::Scalar(Dtype::U32)),
        _ => {
            errors.at(
                ty,
                format_args!("unsupported kernel parameter type; {hint}"),
            );
            return None;
        }
    };
    let args: Vec<&GenericArgument> = match &seg.arguments {
        PathArguments::AngleBracketed(a) => a.args.iter().collect(),
        _ => Vec::new(),
    };
    let [GenericArgument::Type(elem), rank] = args.as_slice() else {
        errors.at(
            ty,
            "write `Tensor<T, R>` with an element type T and a rank R in 1..=5",
        );
        return None;
    };
    // A name that is no dtype is resolved against the comptime parameters later (they may
    // follow the tensor), so its default is a placeholder until `resolve_elems`.
    let dtype = match (Dtype::from_type(elem), elem_name(elem)) {
        (Some(d), _) => Some(Elem::Fixed(d)),
        (None, Some(name)) => Some(Elem::Param {
            default: Box::new(syn::parse_quote!(#name)),
            name,
        }),
        (None, None) => {
            errors.at(elem, ELEM_HINT);
            None
        }
    };
    let rank_expr = match rank {
        GenericArgument::Const(e) => Some(e.clone()),
        GenericArgument::Type(Type::Path(tp)) => Some(Expr::Path(syn::ExprPath {
            attrs: Vec::new(),
            qself: None,
            path: tp.path.clone(),
        })),
        _ => None,
    };
    let rank_span = rank.span();
    let rank = match rank_expr.as_ref().and_then(int_literal) {
        Some(r @ 1..=5) => Some(r as usize),
        _ => {
            errors.push(syn::Error::new(
                rank_span,
                "a tensor's rank must be an integer literal in 1..=5",
            ));
            None
        }
    };
    Some(LaunchKind::Tensor {
        dtype: dtype?,
        rank: rank?,
        mutable,
    })
}

/// The name of a path type of one segment without arguments (`T`), which may name a comptime
/// `DType` parameter.
fn elem_name(ty: &Type) -> Option<Ident> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.get_ident().cloned(),
        _ => None,
    }
}

fn last_ident(ty: &Type) -> Option<&Ident> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| &s.ident),
        _ => None,
    }
}
