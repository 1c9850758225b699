//! The signature's generated parts: the `comptime_params`/`signature` tables, the locals that
//! `build` binds for each parameter, and the argument lists of `launch` and `interpret`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use crate::parse::signature::{
    ComptimeKind, ComptimeParam, Dtype, Elem, LaunchKind, LaunchParam, Signature,
};
use crate::paths;

/// The Rust type of a comptime parameter of `kind` in generated code: the primitive, or
/// `::kiln::ir::DType`.
fn comptime_ty(kind: ComptimeKind, span: Span) -> TokenStream {
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

/// `ComptimeParam { .. }` entries.
pub fn comptime_table(sig: &Signature) -> TokenStream {
    let entries = sig.comptime.iter().map(|c: &ComptimeParam| {
        let span = c.name.span();
        let dsl = paths::dsl(span);
        let name = c.name.to_string();
        let option = paths::option(span);
        let ty = comptime_ty(c.kind, span);
        let variant = format_ident!("{}", c.kind.names().1);
        let default = match &c.default {
            Some(d) => quote_spanned!(span=> #option::Some(#dsl::ComptimeValue::#variant({ let d: #ty = #d; d }))),
            None => quote!(#option::None),
        };
        let tune = c.tune.iter().map(|t| {
            quote_spanned!(span=> #dsl::ComptimeValue::#variant({ let v: #ty = #t; v }))
        });
        quote_spanned! {span=>
            #dsl::ComptimeParam {
                name: #name,
                kind: #dsl::ComptimeKind::#variant,
                default: #default,
                tune: &[#(#tune),*],
            }
        }
    });
    quote!(#(#entries),*)
}

/// `ParamSig { .. }` entries.
pub fn signature_table(sig: &Signature) -> TokenStream {
    let entries = sig.launch.iter().map(|p: &LaunchParam| {
        let span = p.name.span();
        let dsl = paths::dsl(span);
        let ir = paths::ir(span);
        let name = p.name.to_string();
        match &p.kind {
            LaunchKind::Tensor { dtype, rank, mutable } => {
                let option = paths::option(span);
                let (dtype, param) = match dtype {
                    Elem::Fixed(d) => {
                        let d = format_ident!("{}", d.variant());
                        (quote_spanned!(span=> #ir::DType::#d), quote!(#option::None))
                    }
                    Elem::Param { name: t, default } => {
                        let t = t.to_string();
                        (
                            quote_spanned!(span=> { let d: #ir::DType = #default; d }),
                            quote!(#option::Some(#t)),
                        )
                    }
                };
                quote_spanned!(span=> #dsl::ParamSig::Tensor { name: #name, dtype: #dtype, dtype_param: #param, rank: #rank, mutable: #mutable })
            }
            LaunchKind::Scalar(dtype) => {
                let d = format_ident!("{}", dtype.variant());
                quote_spanned!(span=> #dsl::ParamSig::Scalar { name: #name, dtype: #ir::DType::#d })
            }
        }
    });
    quote!(#(#entries),*)
}

/// `let` statements binding every parameter inside `build`: comptime values from `spec`
/// (the `?` returns a diagnostic at the parameter), tensor handles, scalar values.
pub fn bind_params(sig: &Signature, spec: &syn::Ident) -> TokenStream {
    let comptime = sig.comptime.iter().map(|c| {
        let span = c.name.span();
        let dsl = paths::dsl(span);
        let name = &c.name;
        let ty = comptime_ty(c.kind, span);
        let text = name.to_string();
        quote_spanned!(span=> let #name: #ty = #dsl::comptime::<#ty>(#spec, #text)?;)
    });
    let launch = sig.launch.iter().enumerate().map(|(i, p)| {
        let span = p.name.span();
        let dsl = paths::dsl(span);
        let name = &p.name;
        match &p.kind {
            LaunchKind::Tensor { rank, .. } => {
                quote_spanned!(span=> let #name = #dsl::Tensor::param(#i, #rank);)
            }
            LaunchKind::Scalar(_) => quote_spanned!(span=> let #name = #dsl::scalar_param(#i);),
        }
    });
    quote!(#(#comptime)* #(#launch)*)
}

/// Which entry point an argument list is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `launch` on a GPU device.
    Launch,
    /// `interpret` on the CPU interpreter.
    Interpret,
}

/// The typed parameters of `launch`/`interpret` after `grid`: comptime values, then launch
/// parameters in order.
pub fn entry_params(sig: &Signature, entry: Entry) -> TokenStream {
    let comptime = sig.comptime.iter().map(|c| {
        let name = &c.name;
        let ty = comptime_ty(c.kind, Span::call_site());
        quote!(#name: #ty)
    });
    let launch = sig.launch.iter().map(|p| {
        let name = &p.name;
        let span = p.name.span();
        let ty = match (&p.kind, entry) {
            (LaunchKind::Scalar(d), _) => scalar_ty(*d),
            (LaunchKind::Tensor { .. }, Entry::Launch) => {
                let rt = paths::runtime(span);
                quote!(&#rt::DeviceTensor)
            }
            (LaunchKind::Tensor { mutable, .. }, Entry::Interpret) => {
                let ir = paths::ir(span);
                if *mutable {
                    quote!(&mut #ir::HostTensor)
                } else {
                    quote!(&#ir::HostTensor)
                }
            }
        };
        quote!(#name: #ty)
    });
    quote!(#(#comptime,)* #(#launch,)*)
}

/// The comptime map (`BTreeMap<String, ComptimeValue>`) built from the comptime arguments.
pub fn comptime_map(sig: &Signature) -> TokenStream {
    let dsl = paths::dsl(Span::call_site());
    let entries = sig.comptime.iter().map(|c| {
        let name = &c.name;
        let text = name.to_string();
        quote!((#text, #dsl::ComptimeArg::to_value(#name)))
    });
    quote!(#dsl::comptime_map(&[#(#entries),*]))
}

/// The runtime/interpreter argument array entries.
pub fn entry_args(sig: &Signature, entry: Entry) -> TokenStream {
    let args = sig.launch.iter().map(|p| {
        let name = &p.name;
        let span = p.name.span();
        let path = match entry {
            Entry::Launch => {
                let rt = paths::runtime(span);
                quote!(#rt::KernelArg)
            }
            Entry::Interpret => {
                let interp = paths::interp(span);
                quote!(#interp::HostArg)
            }
        };
        let variant = match &p.kind {
            LaunchKind::Scalar(Dtype::I32) => "I32",
            LaunchKind::Scalar(_) => "F32",
            LaunchKind::Tensor { mutable: true, .. } if entry == Entry::Interpret => "TensorMut",
            LaunchKind::Tensor { .. } => "Tensor",
        };
        let variant = format_ident!("{variant}");
        quote!(#path::#variant(#name))
    });
    quote!(#(#args),*)
}

fn scalar_ty(d: Dtype) -> TokenStream {
    match d {
        Dtype::I32 => quote!(i32),
        Dtype::Bf16 | Dtype::F16 | Dtype::F32 => quote!(f32),
    }
}
