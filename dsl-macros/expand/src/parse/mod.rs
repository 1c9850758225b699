//! Reads the user's item into the macro's model. Every error is collected (not just the
//! first) so one compile shows all of them.

pub mod body;
pub mod comptime_struct;
pub mod kernel;
pub mod signature;

use syn::{Expr, ExprLit, Lit};

/// Collects `syn::Error`s into one.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds an error.
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    /// Adds an error at `span`-carrying `tokens`.
    pub fn at(&mut self, tokens: impl quote::ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// `Err` with every collected error, or `Ok(value)` if there were none.
    pub fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

/// The value of an integer literal expression that fits in `u32` (`num_warps = 8`, a tensor's
/// rank); shared by the parsers of the attribute and of the signature.
pub fn int_literal(e: &Expr) -> Option<u32> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse().ok(),
        _ => None,
    }
}
