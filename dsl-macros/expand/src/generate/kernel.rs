//! What `#[kernel] fn NAME` becomes: a unit struct `NAME`; its comptime struct (`NAMEComptime`,
//! generated from the const generics and `#[comptime]` arguments; the type of its
//! `#[comptime]` struct parameter; or `()`); its entry in the link-time kernel registry
//! (`kiln::ir::dsl::registry`); its `KernelDecl` and `KernelDef` impls (whose `build` traces
//! the rewritten body and whose `grid` follows `grid = [..]`); and typed `launch`/`interpret`
//! methods.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;

use super::body::rewrite_body;
use super::comptime_struct::{Field, StructModel, field_doc, generate_struct};
use super::signature::{Entry, bind_params, entry_args, entry_params, signature_table};
use crate::parse::kernel::{GridTile, KernelArgs, KernelFn, Warps};
use crate::paths;

/// The generated items for a checked kernel.
pub fn generate_kernel(args: &KernelArgs, mut k: KernelFn) -> TokenStream {
    rewrite_body(&mut k.body);
    let span = Span::call_site();
    let (dsl, ir, rt, interp) = (
        paths::dsl(span),
        paths::ir(span),
        paths::runtime(span),
        paths::interp(span),
    );
    let result = paths::result(span);
    let KernelFn {
        attrs,
        vis,
        name,
        signature: sig,
        body,
    } = &k;
    let name_str = name.to_string();
    let spec = format_ident!("__kiln_spec", span = Span::mixed_site());
    let num_warps = match &args.num_warps {
        Warps::Literal(n) => quote!(#n),
        Warps::Param(p) => quote_spanned!(p.span()=> #dsl::warp_count(#spec.comptime.#p)?),
    };
    let (comptime, comptime_item) = comptime_struct(&k);
    let signature = signature_table(sig, &comptime);
    let binds = bind_params(sig, &spec, &comptime);
    let grid = grid_fn(args, &comptime);
    let launch_params = entry_params(sig, Entry::Launch);
    let interp_params = entry_params(sig, Entry::Interpret);
    let launch_args = entry_args(sig, Entry::Launch);
    let interp_args = entry_args(sig, Entry::Interpret);
    // A kernel without comptime parameters takes no comptime argument (its struct is `()`).
    let has_comptime = !sig.comptime.is_empty() || sig.comptime_struct.is_some();
    let (comptime_param, comptime_arg) = if has_comptime {
        (quote!(comptime: &#comptime,), quote!(comptime))
    } else {
        (quote!(), quote!(&()))
    };
    quote! {
        #(#attrs)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, Default)]
        #vis struct #name;

        #comptime_item

        // Registered at link time, so the CLI and the tests list the kernel with no hand list.
        #ir::inventory::submit! {
            #dsl::registry::Registered::new(&#name, ::core::module_path!())
        }

        impl #dsl::KernelDecl for #name {
            fn name(&self) -> &'static str {
                #name_str
            }

            fn comptime_params(&self) -> &'static [#dsl::ComptimeParam] {
                <#comptime as #dsl::Comptime>::PARAMS
            }

            fn signature(&self) -> &'static [#dsl::ParamSig] {
                const SIGNATURE: &[#dsl::ParamSig] = &[#signature];
                SIGNATURE
            }
        }

        impl #dsl::KernelDef for #name {
            type Comptime = #comptime;

            #[allow(non_snake_case, unused_mut, unused_variables, unused_braces, unused_parens, clippy::all)]
            fn build(&self, #spec: &#dsl::Spec<#comptime>) -> #result<#ir::Kernel, #ir::Diagnostic> {
                #dsl::trace(
                    #name_str,
                    #dsl::params_for(#dsl::KernelDecl::signature(self), #spec),
                    #ir::KernelOptions { num_warps: #num_warps, ..::core::default::Default::default() },
                    || {
                        #binds
                        let () = #body;
                        #result::Ok(())
                    },
                )
            }

            #grid
        }

        impl #name {
            /// Launches the kernel on `dev` over `grid` blocks (see `KernelDef::grid`) with its
            /// comptime values (when it has any) and the launch arguments in order.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub fn launch(
                &self,
                dev: &#rt::Device,
                #comptime_param
                grid: [u32; 3],
                #launch_params
            ) -> #result<(), #rt::LaunchError> {
                dev.launch(self, #comptime_arg, grid, &[#launch_args])
            }

            /// Runs the kernel on the CPU interpreter over `grid` blocks, with the same
            /// arguments as `launch` (host tensors for device ones).
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub fn interpret(
                &self,
                #comptime_param
                grid: [u32; 3],
                #interp_params
            ) -> #result<(), #interp::InterpError> {
                #interp::run_def(self, #comptime_arg, grid, &mut [#interp_args])
            }
        }
    }
}

/// The kernel's comptime struct type and the item declaring it: `NAMEComptime` generated from
/// the signature's comptime parameters, the type of its comptime struct parameter (declared
/// elsewhere, under `#[comptime]`), or `()` when it has neither.
fn comptime_struct(k: &KernelFn) -> (TokenStream, TokenStream) {
    let sig = &k.signature;
    if let Some(p) = &sig.comptime_struct {
        let ty = &p.ty;
        return (quote!(#ty), TokenStream::new());
    }
    if sig.comptime.is_empty() {
        return (quote!(()), TokenStream::new());
    }
    let name = struct_name(&k.name);
    let doc = format!(
        "The comptime values of [`{}`]: one field per const generic and `#[comptime]` parameter, in declaration order.",
        k.name
    );
    let fields = sig
        .comptime
        .iter()
        .map(|c| {
            let doc = field_doc(c);
            Field {
                attrs: quote!(#[doc = #doc]),
                vis: quote!(pub),
                param: c,
            }
        })
        .collect();
    let item = generate_struct(&StructModel {
        attrs: quote!(#[doc = #doc]),
        vis: &k.vis,
        name: &name,
        fields,
    });
    (quote!(#name), item)
}

/// `attention_varlen` -> `AttentionVarlenComptime`, at the kernel's name.
pub fn struct_name(kernel: &Ident) -> Ident {
    let camel: String = kernel
        .to_string()
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect();
    format_ident!("{camel}Comptime", span = kernel.span())
}

/// `KernelDef::grid` from `grid = [..]`; nothing (the trait's one block per unit of extent)
/// without it.
fn grid_fn(args: &KernelArgs, comptime: &TokenStream) -> TokenStream {
    let Some(tiles) = &args.grid else {
        return TokenStream::new();
    };
    let dsl = paths::dsl(Span::call_site());
    let c = format_ident!("comptime");
    let axes = tiles.iter().enumerate().map(|(i, t)| {
        let tile = match t {
            GridTile::Literal(lit) => quote!(#lit),
            GridTile::Param(p) => quote_spanned!(p.span()=> { let tile: usize = #c.#p; tile }),
        };
        quote!(#dsl::grid_blocks(extents[#i], #tile))
    });
    quote! {
        fn grid(&self, #c: &#comptime, extents: [usize; 3]) -> [u32; 3] {
            [#(#axes),*]
        }
    }
}
