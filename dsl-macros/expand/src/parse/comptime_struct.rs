//! `#[comptime] struct NAME { .. }`: comptime parameters declared once as a struct, which
//! several kernels take as their one comptime parameter (`#[comptime] p: NAME`).

use proc_macro2::TokenStream;
use syn::{Attribute, Fields, Ident, ItemStruct, Visibility};

use super::Errors;
use super::signature::{ComptimeKind, ComptimeOptions, ComptimeParam, comptime_attr};

/// Attributes that still mean something on the generated struct and its fields.
const KEPT_ATTRS: &[&str] = &["doc", "cfg", "allow", "expect", "warn", "deny"];

/// A field: a comptime parameter, with the attributes it keeps (its doc comment).
pub struct ComptimeField {
    /// Kept attributes.
    pub attrs: Vec<Attribute>,
    /// The field's visibility.
    pub vis: Visibility,
    /// The parameter it declares.
    pub param: ComptimeParam,
}

/// A checked comptime struct.
pub struct ComptimeStruct {
    /// Kept attributes (doc comments and the like).
    pub attrs: Vec<Attribute>,
    /// The struct's visibility.
    pub vis: Visibility,
    /// Its name.
    pub name: Ident,
    /// Its fields, in declaration order: the parameters' order.
    pub fields: Vec<ComptimeField>,
}

/// Checks `item` as a comptime struct; `args` are the attribute's (it takes none).
pub fn parse_comptime_struct(args: TokenStream, item: ItemStruct) -> syn::Result<ComptimeStruct> {
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.at(
            args,
            "`#[comptime]` on a struct takes no options; give each field `#[comptime(default = .., tune = [..])]`",
        );
    }
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        errors.at(&item.generics, "a comptime struct cannot be generic");
    }
    check_attrs(&item.attrs, "a comptime struct", &mut errors);
    let named = match &item.fields {
        Fields::Named(f) => Some(f),
        other => {
            errors.at(
                other,
                "a comptime struct has named fields, one per comptime parameter",
            );
            None
        }
    };
    let mut fields = Vec::new();
    for f in named.into_iter().flat_map(|n| &n.named) {
        let (comptime, kept): (Vec<Attribute>, Vec<Attribute>) = f
            .attrs
            .iter()
            .cloned()
            .partition(|a| a.path().is_ident("comptime"));
        check_attrs(&kept, "a comptime struct's field", &mut errors);
        let ComptimeOptions { default, tune } =
            comptime_attr(&comptime, &mut errors).unwrap_or_default();
        let Some(name) = f.ident.clone() else {
            continue;
        };
        match ComptimeKind::from_type(&f.ty) {
            Some(kind) => fields.push(ComptimeField {
                attrs: kept,
                vis: f.vis.clone(),
                param: ComptimeParam {
                    name,
                    kind,
                    default,
                    tune,
                },
            }),
            None => errors.at(
                &f.ty,
                "a comptime struct's fields are usize, i32, bool, f32 or DType",
            ),
        }
    }
    errors.finish(ComptimeStruct {
        attrs: item.attrs,
        vis: item.vis,
        name: item.ident,
        fields,
    })
}

/// Reports every attribute of `attrs` that the generated item would not keep.
fn check_attrs(attrs: &[Attribute], what: &str, errors: &mut Errors) {
    for a in attrs {
        if !KEPT_ATTRS.iter().any(|k| a.path().is_ident(k)) {
            errors.at(
                a,
                format_args!(
                    "this attribute cannot go on {what}; kept attributes: {} (Clone, Copy, Debug, PartialEq, Eq and Hash are derived)",
                    KEPT_ATTRS.join(", ")
                ),
            );
        }
    }
}
