//! What `#[kernel] fn NAME` becomes: a unit struct `NAME`, its `KernelDef` impl (whose
//! `build` traces the rewritten body), and typed `launch`/`interpret` methods.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};

use super::body::rewrite_body;
use super::signature::{
    Entry, bind_params, comptime_map, comptime_table, entry_args, entry_params, signature_table,
};
use crate::parse::kernel::{KernelArgs, KernelFn};
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
    let num_warps = args.num_warps;
    let spec = format_ident!("__kiln_spec", span = Span::mixed_site());
    let map = format_ident!("__kiln_comptime", span = Span::mixed_site());
    let comptime = comptime_table(sig);
    let signature = signature_table(sig);
    let binds = bind_params(sig, &spec);
    let launch_params = entry_params(sig, Entry::Launch);
    let interp_params = entry_params(sig, Entry::Interpret);
    let fill_map = comptime_map(sig);
    let launch_args = entry_args(sig, Entry::Launch);
    let interp_args = entry_args(sig, Entry::Interpret);
    quote! {
        #(#attrs)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, Default)]
        #vis struct #name;

        impl #dsl::KernelDef for #name {
            fn name(&self) -> &'static str {
                #name_str
            }

            fn comptime_params(&self) -> &'static [#dsl::ComptimeParam] {
                const PARAMS: &[#dsl::ComptimeParam] = &[#comptime];
                PARAMS
            }

            fn signature(&self) -> &'static [#dsl::ParamSig] {
                const SIGNATURE: &[#dsl::ParamSig] = &[#signature];
                SIGNATURE
            }

            #[allow(non_snake_case, unused_mut, unused_variables, unused_braces, unused_parens, clippy::all)]
            fn build(&self, #spec: &#dsl::Spec) -> #result<#ir::Kernel, #ir::Diagnostic> {
                #dsl::trace(
                    #name_str,
                    #dsl::params_for(#dsl::KernelDef::signature(self), #spec),
                    #ir::KernelOptions { num_warps: #num_warps, ..::core::default::Default::default() },
                    || {
                        #binds
                        let () = #body;
                        #result::Ok(())
                    },
                )
            }
        }

        impl #name {
            /// Launches the kernel on `dev` over `grid` blocks: comptime arguments first (in
            /// declaration order), then the launch arguments in order.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub fn launch(
                &self,
                dev: &#rt::Device,
                grid: [u32; 3],
                #launch_params
            ) -> #result<(), #rt::LaunchError> {
                let #map = #fill_map;
                dev.launch(self, &#map, grid, &[#launch_args])
            }

            /// Runs the kernel on the CPU interpreter over `grid` blocks, with the same
            /// argument order as `launch`.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub fn interpret(
                &self,
                grid: [u32; 3],
                #interp_params
            ) -> #result<(), #interp::InterpError> {
                let #map = #fill_map;
                #interp::run_def(self, &#map, grid, &mut [#interp_args])
            }
        }
    }
}
