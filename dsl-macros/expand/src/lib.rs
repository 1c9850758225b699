//! kiln-macros-expand: what kiln's attribute macros (`#[kernel]`, `#[kernel_fn]`,
//! `#[comptime]`) do, on `proc_macro2` token streams, so tests and the fuzzer can call it
//! (`kiln-macros` is the proc-macro shell around it). `parse/` reads and checks the item,
//! `generate/` writes tokens; the two mirror each other by file name.
//!
//! **Architecture invariant:** the macro never panics on user input. Every unsupported
//! construct is a `syn::Error` at its token; all are reported at once.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{ItemFn, ItemStruct};

mod generate;
mod parse;
mod paths;

/// The expansion of `#[kernel(args)] item` (see `kiln_macros::kernel`): the kernel
/// definition, or spanned errors and a placeholder struct. Never panics.
///
/// The macro does not compile anything: it rewrites the body so that running it *traces* the
/// kernel through `kiln::ir::dsl`, and generates a unit struct implementing `KernelDef` with
/// typed `launch`/`interpret` methods, and the kernel's comptime struct.
pub fn kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    let args_result = syn::parse2::<parse::kernel::KernelArgs>(args);
    let item = match syn::parse2::<ItemFn>(item) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let fallback = fallback_struct(&item);
    let checked = parse::kernel::parse_kernel(item);
    let grid = match (&args_result, &checked) {
        (Ok(args), Ok(k)) => parse::kernel::check_grid(args, k),
        _ => Ok(()),
    };
    match (args_result, checked, grid) {
        (Ok(args), Ok(k), Ok(())) => generate::kernel::generate_kernel(&args, k),
        (a, k, g) => {
            let mut errors = parse::Errors::default();
            a.err()
                .into_iter()
                .chain(k.err())
                .chain(g.err())
                .for_each(|e| errors.push(e));
            let err = errors.finish(()).err().map(|e| e.to_compile_error());
            quote!(#err #fallback)
        }
    }
}

/// The expansion of `#[comptime(args)] struct ..` (see `kiln_macros::comptime`): the struct
/// with its comptime impls, or spanned errors and the struct as written (so code naming it
/// keeps resolving). Never panics. It declares comptime parameters once for several kernels.
pub fn comptime(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = match syn::parse2::<ItemStruct>(item) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let fallback = fallback_comptime_struct(&item);
    match parse::comptime_struct::parse_comptime_struct(args, item) {
        Ok(s) => generate::comptime_struct::generate_comptime_struct(&s),
        Err(e) => {
            let e = e.to_compile_error();
            quote!(#e #fallback)
        }
    }
}

/// The expansion of `#[kernel_fn(args)] item` (see `kiln_macros::kernel_fn`), which makes a
/// helper callable from kernels. Never panics.
pub fn kernel_fn(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut item = match syn::parse2::<ItemFn>(item) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut errors = parse::Errors::default();
    if !args.is_empty() {
        errors.at(args, "`#[kernel_fn]` takes no options");
    }
    parse::body::check_body(&item.block, &mut errors);
    if let Err(e) = errors.finish(()) {
        let e = e.to_compile_error();
        return quote!(#e #item);
    }
    generate::body::rewrite_body(&mut item.block);
    item.attrs.push(syn::parse_quote!(#[allow(
        non_snake_case,
        unused_mut,
        unused_braces,
        unused_parens,
        clippy::all
    )]));
    quote!(#item)
}

/// On errors, only the unit struct is emitted (besides the errors): the body is not valid
/// tracing code, so emitting it would bury the real errors under type errors, while code
/// elsewhere that names the kernel (a registry) keeps resolving.
fn fallback_struct(item: &ItemFn) -> proc_macro2::TokenStream {
    let (vis, name) = (&item.vis, &item.sig.ident);
    quote! {
        #[allow(non_camel_case_types)]
        #vis struct #name;
    }
}

/// On errors in a `#[comptime]` struct, the struct with its attributes stripped from it and
/// its fields, so that the kernels naming it report its errors, not a missing type.
fn fallback_comptime_struct(item: &ItemStruct) -> proc_macro2::TokenStream {
    let mut item = item.clone();
    item.attrs.retain(|a| a.path().is_ident("doc"));
    for f in item.fields.iter_mut() {
        f.attrs.retain(|a| a.path().is_ident("doc"));
    }
    quote!(#[allow(dead_code)] #item)
}
