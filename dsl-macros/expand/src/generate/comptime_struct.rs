//! A comptime struct and its impls: the struct `#[kernel]` generates from a signature's
//! comptime parameters (`GemmComptime`), and the one `#[comptime]` re-emits. Equality and
//! hashing go through each field's `ComptimeValue`, so an `f32` field counts by its bits.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::{Ident, Visibility};

use crate::parse::comptime_struct::ComptimeStruct;
use crate::parse::signature::{ComptimeKind, ComptimeParam};
use crate::paths;

/// One field of a comptime struct to generate.
pub struct Field<'a> {
    /// Attributes kept on the field (its doc comment).
    pub attrs: TokenStream,
    /// Its visibility.
    pub vis: TokenStream,
    /// The parameter it holds.
    pub param: &'a ComptimeParam,
}

/// A comptime struct to generate.
pub struct StructModel<'a> {
    /// Attributes kept on the struct (its doc comment).
    pub attrs: TokenStream,
    /// Its visibility.
    pub vis: &'a Visibility,
    /// Its name.
    pub name: &'a Ident,
    /// Its fields, in parameter order.
    pub fields: Vec<Field<'a>>,
}

/// The Rust type of a comptime parameter of `kind` in generated code: the primitive, or
/// `::kiln::ir::DType`.
pub fn comptime_ty(kind: ComptimeKind, span: Span) -> TokenStream {
    match kind {
        ComptimeKind::DType => {
            let ir = paths::ir(span);
            quote_spanned!(span=> #ir::DType)
        }
        _ => {
            let ty = format_ident!("{}", kind.names().0, span = span);
            quote!(#ty)
        }
    }
}

/// The expansion of `#[comptime] struct ..`.
pub fn generate_comptime_struct(s: &ComptimeStruct) -> TokenStream {
    let attrs = &s.attrs;
    let fields = s
        .fields
        .iter()
        .map(|f| {
            let (attrs, vis) = (&f.attrs, &f.vis);
            Field {
                attrs: quote!(#(#attrs)*),
                vis: quote!(#vis),
                param: &f.param,
            }
        })
        .collect();
    generate_struct(&StructModel {
        attrs: quote!(#(#attrs)*),
        vis: &s.vis,
        name: &s.name,
        fields,
    })
}

/// The struct `model` describes, with `Clone`, `Copy`, `Debug`, `PartialEq`, `Eq`, `Hash`,
/// `Default` (when every field has a default) and `Comptime`.
pub fn generate_struct(model: &StructModel<'_>) -> TokenStream {
    let StructModel {
        attrs,
        vis,
        name,
        fields,
    } = model;
    let dsl = paths::dsl(Span::call_site());
    let decls = fields.iter().map(|f| {
        let (attrs, vis, name) = (&f.attrs, &f.vis, &f.param.name);
        let ty = comptime_ty(f.param.kind, name.span());
        quote!(#attrs #vis #name: #ty)
    });
    let names: Vec<&Ident> = fields.iter().map(|f| &f.param.name).collect();
    let slots: Vec<Ident> = (0..fields.len())
        .map(|i| format_ident!("__kiln_v{i}", span = Span::mixed_site()))
        .collect();
    let params = fields.iter().map(|f| param_entry(f.param));
    let default = default_impl(name, fields);
    let equal = if names.is_empty() {
        quote!(true)
    } else {
        quote!(#(#dsl::ComptimeArg::to_value(self.#names) == #dsl::ComptimeArg::to_value(other.#names))&&*)
    };
    quote! {
        #attrs
        #[allow(non_snake_case)]
        #[derive(::core::clone::Clone, ::core::marker::Copy, ::core::fmt::Debug)]
        #vis struct #name {
            #(#decls,)*
        }

        impl ::core::cmp::PartialEq for #name {
            fn eq(&self, other: &#name) -> bool {
                #equal
            }
        }

        impl ::core::cmp::Eq for #name {}

        impl ::core::hash::Hash for #name {
            fn hash<H: ::core::hash::Hasher>(&self, state: &mut H) {
                #(::core::hash::Hash::hash(&#dsl::ComptimeArg::to_value(self.#names), state);)*
            }
        }

        #default

        impl #dsl::Comptime for #name {
            const PARAMS: &'static [#dsl::ComptimeParam] = &[#(#params),*];

            fn values(&self) -> ::std::vec::Vec<#dsl::ComptimeValue> {
                ::std::vec![#(#dsl::ComptimeArg::to_value(self.#names)),*]
            }

            fn from_values(values: &[#dsl::ComptimeValue]) -> ::core::option::Option<#name> {
                let [#(#slots),*] = values else {
                    return ::core::option::Option::None;
                };
                ::core::option::Option::Some(#name {
                    #(#names: #dsl::ComptimeArg::from_value(*#slots)?,)*
                })
            }
        }
    }
}

/// `impl Default` from the declared defaults, or nothing when a field has none.
fn default_impl(name: &Ident, fields: &[Field<'_>]) -> TokenStream {
    let mut inits = Vec::new();
    for f in fields {
        let Some(d) = &f.param.default else {
            return TokenStream::new();
        };
        let field = &f.param.name;
        let span = field.span();
        let ty = comptime_ty(f.param.kind, span);
        inits.push(quote_spanned!(span=> #field: { let d: #ty = #d; d }));
    }
    quote! {
        impl ::core::default::Default for #name {
            fn default() -> #name {
                #name { #(#inits,)* }
            }
        }
    }
}

/// The `ComptimeParam { .. }` entry of one parameter.
fn param_entry(c: &ComptimeParam) -> TokenStream {
    let span = c.name.span();
    let dsl = paths::dsl(span);
    let name = c.name.to_string();
    let option = paths::option(span);
    let ty = comptime_ty(c.kind, span);
    let variant = format_ident!("{}", c.kind.names().1);
    let default = match &c.default {
        Some(d) => {
            quote_spanned!(span=> #option::Some(#dsl::ComptimeValue::#variant({ let d: #ty = #d; d })))
        }
        None => quote!(#option::None),
    };
    let tune = c
        .tune
        .iter()
        .map(|t| quote_spanned!(span=> #dsl::ComptimeValue::#variant({ let v: #ty = #t; v })));
    quote_spanned! {span=>
        #dsl::ComptimeParam {
            name: #name,
            kind: #dsl::ComptimeKind::#variant,
            default: #default,
            tune: &[#(#tune),*],
        }
    }
}

/// The doc comment of a generated field: the parameter as declared.
pub fn field_doc(c: &ComptimeParam) -> String {
    let mut doc = format!("`{}: {}`", c.name, c.kind.names().0);
    if let Some(d) = &c.default {
        doc.push_str(&format!(", default `{}`", quote!(#d)));
    }
    if !c.tune.is_empty() {
        let tune: Vec<String> = c.tune.iter().map(|t| quote!(#t).to_string()).collect();
        doc.push_str(&format!("; the autotuner tries {}", tune.join(", ")));
    }
    doc.push('.');
    doc
}
