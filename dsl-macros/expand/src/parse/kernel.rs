//! `#[kernel(...)]`: the attribute's options and the function item.

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Block, Ident, ItemFn, MetaNameValue, Token, Visibility};

use super::body::check_body;
use super::signature::{Signature, parse_signature};
use super::{Errors, int_literal};

/// The options of `#[kernel(...)]`.
pub struct KernelArgs {
    /// Warps per thread block (`num_warps = N`, default 4).
    pub num_warps: u32,
}

impl Parse for KernelArgs {
    fn parse(input: ParseStream) -> syn::Result<KernelArgs> {
        let options = Punctuated::<MetaNameValue, Token![,]>::parse_terminated(input)?;
        let mut errors = Errors::default();
        let mut num_warps = 4;
        for o in &options {
            if o.path.is_ident("num_warps") {
                match int_literal(&o.value) {
                    Some(n) if (1..=32).contains(&n) => num_warps = n,
                    _ => errors.at(&o.value, "`num_warps` must be an integer literal in 1..=32"),
                }
            } else {
                errors.at(
                    &o.path,
                    "unknown `#[kernel]` option; the only option is `num_warps = N`",
                );
            }
        }
        errors.finish(KernelArgs { num_warps })
    }
}

/// A kernel function, checked.
pub struct KernelFn {
    /// Attributes kept on the generated struct (doc comments and the like).
    pub attrs: Vec<Attribute>,
    /// The function's visibility, given to the generated struct.
    pub vis: Visibility,
    /// The kernel's name.
    pub name: Ident,
    /// Comptime and launch parameters.
    pub signature: Signature,
    /// The body as written (rewritten when generating).
    pub body: Block,
}

/// Attributes that still mean something on the generated struct (docs, lints, `cfg`).
const KEPT_ATTRS: &[&str] = &["doc", "cfg", "allow", "expect", "warn", "deny"];

/// Checks `item` as a kernel: the signature's parameter kinds and the body's constructs.
pub fn parse_kernel(item: ItemFn) -> syn::Result<KernelFn> {
    let mut errors = Errors::default();
    let signature = parse_signature(&item.sig, &mut errors);
    check_body(&item.block, &mut errors);
    for a in &item.attrs {
        if !KEPT_ATTRS.iter().any(|k| a.path().is_ident(k)) {
            errors.at(
                a,
                format_args!(
                    "this attribute cannot go on a kernel; kept attributes: {}",
                    KEPT_ATTRS.join(", ")
                ),
            );
        }
    }
    errors.finish(KernelFn {
        attrs: item.attrs,
        vis: item.vis,
        name: item.sig.ident,
        signature,
        body: *item.block,
    })
}
