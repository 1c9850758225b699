//! Rewrites a kernel body for tracing ([`rewrite_body`]). User tokens keep their spans and
//! every generated call is spanned at the construct it replaces, so `Location::caller()` in
//! the DSL lands on the user's source.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{BinOp, Block, Expr, ExprForLoop, ExprIf, Ident};

use crate::parse::body::{assigned_outer, assigned_outer_expr, pat_idents};
use crate::paths;

/// Rewrites `block` in place: index lists, comparisons, `&&` and `||`, and runtime `if` and
/// `for` become calls of the DSL's traits (the table on `kiln_ir::dsl::trace`); `for i in
/// unroll(a..b)` stays a Rust loop. Outer variables a construct assigns are passed in and
/// returned by value.
pub fn rewrite_body(block: &mut Block) {
    Rewriter.visit_block_mut(block);
}

struct Rewriter;

impl VisitMut for Rewriter {
    /// Items (`const X: usize = ..;`) are plain Rust evaluated at compile time: the tracing
    /// rewrites (calls of non-`const` trait methods) would not compile there.
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}

    fn visit_expr_mut(&mut self, e: &mut Expr) {
        // Variables are found on the code as written, before inner constructs are rewritten.
        let vars = match e {
            Expr::If(i) => Some(if_vars(i)),
            Expr::ForLoop(f) => {
                let mut bound = Vec::new();
                pat_idents(&f.pat, &mut bound);
                Some(assigned_outer([&f.body], &bound))
            }
            _ => None,
        };
        visit_mut::visit_expr_mut(self, e);
        let new = match e {
            Expr::Array(a) => {
                for el in a.elems.iter_mut() {
                    let dsl = paths::dsl(el.span());
                    *el = syn::parse_quote_spanned!(el.span()=> #dsl::IntoIndex::into_index(#el));
                }
                return;
            }
            Expr::Binary(b) => match binary_call(&b.op) {
                Some((tr, method)) => {
                    let (l, r) = (&b.left, &b.right);
                    let span = b.left.span();
                    let dsl = paths::dsl(span);
                    let tr = Ident::new(tr, span);
                    let method = Ident::new(method, span);
                    quote_spanned!(span=> #dsl::#tr::#method(#l, #r))
                }
                None => return,
            },
            Expr::If(i) => gen_if(i, &vars.unwrap_or_default()),
            Expr::ForLoop(f) => match gen_for(f, &vars.unwrap_or_default()) {
                Some(t) => t,
                None => return,
            },
            _ => return,
        };
        *e = Expr::Verbatim(new);
    }
}

/// The trait and method a comparison or logic operator becomes.
fn binary_call(op: &BinOp) -> Option<(&'static str, &'static str)> {
    Some(match op {
        BinOp::Lt(_) => ("Compare", "lt"),
        BinOp::Le(_) => ("Compare", "le"),
        BinOp::Gt(_) => ("Compare", "gt"),
        BinOp::Ge(_) => ("Compare", "ge"),
        BinOp::Eq(_) => ("Compare", "eq"),
        BinOp::Ne(_) => ("Compare", "ne"),
        BinOp::And(_) => ("Logic", "and"),
        BinOp::Or(_) => ("Logic", "or"),
        _ => return None,
    })
}

fn if_vars(i: &ExprIf) -> Vec<Ident> {
    let mut vars = assigned_outer([&i.then_branch], &[]);
    if let Some((_, e)) = &i.else_branch {
        for v in assigned_outer_expr(e) {
            if !vars.contains(&v) {
                vars.push(v);
            }
        }
    }
    vars
}

/// A hygienic name for generated locals, invisible to user code.
fn hidden(name: &str) -> Ident {
    format_ident!("__kiln_{}", name, span = Span::mixed_site())
}

/// `(a, b,)` and `(mut a, mut b,)` for carried variables, and their write-back.
fn carried(vars: &[Ident]) -> (TokenStream, TokenStream, TokenStream) {
    let tuple = quote!((#(#vars,)*));
    let pat = quote!((#(mut #vars,)*));
    let v = hidden("v");
    let write_back = if vars.is_empty() {
        quote!()
    } else {
        // The read after the write-back stands for the reads the loop's next iteration makes
        // in the user's code, so rustc does not call the last assignment unused.
        quote!(#tuple = #v; let _ = (#(&#vars,)*);)
    };
    (tuple, pat, write_back)
}

fn gen_if(i: &ExprIf, vars: &[Ident]) -> TokenStream {
    let span = i.if_token.span;
    let dsl = paths::dsl(span);
    let (tuple, pat, write_back) = carried(vars);
    let (r, v) = (hidden("r"), hidden("v"));
    let cond = &i.cond;
    let then_b = &i.then_branch;
    let else_b = match &i.else_branch {
        Some((_, e)) => quote!(#e),
        None => quote!({}),
    };
    quote_spanned! {span=>
        {
            let (#r, #v) = #dsl::Condition::branch(
                #cond,
                #tuple,
                |#pat| { let #r = #then_b; (#r, #tuple) },
                |#pat| { let #r = #else_b; (#r, #tuple) },
            );
            #write_back
            #r
        }
    }
}

/// The traced loop, or `None` for `for i in unroll(..)` (a Rust loop, left as written).
fn gen_for(f: &ExprForLoop, vars: &[Ident]) -> Option<TokenStream> {
    if is_call_to(&f.expr, "unroll") {
        return None;
    }
    let span = f.for_token.span;
    let dsl = paths::dsl(span);
    let range = loop_range(&f.expr);
    let (tuple, pat, write_back) = carried(vars);
    let v = hidden("v");
    let iv = &f.pat;
    let body = &f.body;
    Some(quote_spanned! {span=>
        {
            let #v = #dsl::for_loop(#range, #tuple, |#iv, #pat| { #body; #tuple });
            #write_back
        }
    })
}

fn is_call_to(e: &Expr, name: &str) -> bool {
    match e {
        Expr::Call(c) => {
            matches!(&*c.func, Expr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == name))
        }
        _ => false,
    }
}

/// A `for` header as a `LoopRange`: `a..b`, `(a..b).step_by(s)`, `pipelined(r, stages = n)`;
/// anything else is passed through (and must be a `LoopRange`).
fn loop_range(e: &Expr) -> TokenStream {
    let dsl = paths::dsl(e.span());
    match e {
        Expr::Range(r) => {
            let lo = r.start.as_ref().map_or_else(|| quote!(0), |s| quote!(#s));
            let hi = &r.end;
            quote_spanned!(e.span()=> #dsl::range(#lo, #hi))
        }
        Expr::Paren(p) => loop_range(&p.expr),
        Expr::MethodCall(m) if m.method == "step_by" => {
            let recv = loop_range(&m.receiver);
            let args = &m.args;
            quote_spanned!(m.method.span()=> #recv.step_by(#args))
        }
        Expr::Call(c) if is_call_to(e, "pipelined") && c.args.len() == 2 => {
            let range = loop_range(&c.args[0]);
            let stages = match &c.args[1] {
                Expr::Assign(a) => &a.right,
                other => other,
            };
            quote_spanned!(e.span()=> #dsl::pipelined(#range, #stages))
        }
        other => quote!(#other),
    }
}
