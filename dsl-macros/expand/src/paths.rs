//! Every absolute path the generated code names, built in one place so that a move in the
//! `kiln` facade is a one-line change here.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;

/// `::kiln::ir::dsl`, the tracing frontend.
pub fn dsl(span: Span) -> TokenStream {
    quote_spanned!(span=> ::kiln::ir::dsl)
}

/// `::kiln::ir`, the IR crate.
pub fn ir(span: Span) -> TokenStream {
    quote_spanned!(span=> ::kiln::ir)
}

/// `::kiln::ir::interp`, the CPU interpreter.
pub fn interp(span: Span) -> TokenStream {
    quote_spanned!(span=> ::kiln::ir::interp)
}

/// `::kiln::runtime`, the GPU runtime.
pub fn runtime(span: Span) -> TokenStream {
    quote_spanned!(span=> ::kiln::runtime)
}

/// `::core::result::Result`.
pub fn result(span: Span) -> TokenStream {
    quote_spanned!(span=> ::core::result::Result)
}

/// `::core::option::Option`.
pub fn option(span: Span) -> TokenStream {
    quote_spanned!(span=> ::core::option::Option)
}
