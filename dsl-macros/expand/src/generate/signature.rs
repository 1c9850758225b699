//! The signature's generated parts: the `signature` table, the locals that `build` binds for
//! each parameter, and the argument lists of `launch` and `interpret`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};

use crate::parse::signature::{Dtype, Elem, LaunchKind, LaunchParam, Signature};
use crate::paths;

/// `ParamSig { .. }` entries; `comptime` is the kernel's comptime struct type, whose declared
/// defaults give a struct field's element type.
pub fn signature_table(sig: &Signature, comptime: &TokenStream) -> TokenStream {
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
                    Elem::Field(field) => {
                        let f = field.to_string();
                        (
                            quote_spanned!(field.span()=> #dsl::declared_dtype(<#comptime as #dsl::Comptime>::PARAMS, #f)),
                            quote!(#option::Some(#f)),
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

/// `let` statements binding every parameter inside `build`: the comptime values from
/// `spec` (destructured from the kernel's generated struct `comptime`, or the comptime struct
/// parameter itself, with a check that each tensor's element type names a `DType` field of
/// it), tensor handles, scalar values.
pub fn bind_params(sig: &Signature, spec: &syn::Ident, comptime: &TokenStream) -> TokenStream {
    let ir = paths::ir(proc_macro2::Span::call_site());
    let comptime_binds = match &sig.comptime_struct {
        Some(p) => {
            let (name, ty) = (&p.name, &p.ty);
            let checks = sig.launch.iter().filter_map(|l| match &l.kind {
                LaunchKind::Tensor {
                    dtype: Elem::Field(f),
                    ..
                } => Some(quote_spanned!(f.span()=> let _: #ir::DType = #name.#f;)),
                _ => None,
            });
            quote_spanned! {name.span()=>
                let #name: #ty = ::core::clone::Clone::clone(&#spec.comptime);
                #(#checks)*
            }
        }
        None if sig.comptime.is_empty() => TokenStream::new(),
        None => {
            let names = sig.comptime.iter().map(|c| &c.name);
            quote!(let #comptime { #(#names),* } = #spec.comptime;)
        }
    };
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
    quote!(#comptime_binds #(#launch)*)
}

/// Which entry point an argument list is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `launch` on a GPU device.
    Launch,
    /// `interpret` on the CPU interpreter.
    Interpret,
}

/// The typed launch parameters of `launch`/`interpret` after `grid`, in order.
pub fn entry_params(sig: &Signature, entry: Entry) -> TokenStream {
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
    quote!(#(#launch,)*)
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
            LaunchKind::Scalar(Dtype::U32) => "U32",
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
        Dtype::U32 => quote!(u32),
        Dtype::Bf16 | Dtype::F16 | Dtype::F32 => quote!(f32),
    }
}
