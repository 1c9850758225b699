//! The kernel body: rejects constructs that cannot be traced (each error at its token, naming
//! what to write instead), and finds the outer variables an `if` or `for` assigns, which the
//! generated code threads through as values.

use std::collections::HashSet;

use syn::visit::{self, Visit};
use syn::{Block, Expr, ExprMacro, Ident, Item, Local, Macro, Pat, StmtMacro};

use super::Errors;

/// Macros a kernel body may use: `kprint!` (a print in the kernel) and those that only
/// format text while tracing.
const ALLOWED_MACROS: &[&str] = &[
    "kprint",
    "println",
    "eprintln",
    "format",
    "stringify",
    "concat",
];

/// Records an error for every unsupported construct in `block`.
pub fn check_body(block: &Block, errors: &mut Errors) {
    Checker { errors }.visit_block(block);
}

struct Checker<'a> {
    errors: &'a mut Errors,
}

impl Checker<'_> {
    fn check_macro(&mut self, mac: &Macro) {
        let name = mac.path.segments.last().map(|s| s.ident.to_string());
        if !name.as_deref().is_some_and(|n| ALLOWED_MACROS.contains(&n)) {
            self.errors.at(
                &mac.path,
                format_args!(
                    "this macro is not supported in a kernel; allowed macros: {}",
                    ALLOWED_MACROS.join(", ")
                ),
            );
        }
    }
}

impl<'ast> Visit<'ast> for Checker<'_> {
    fn visit_expr(&mut self, e: &'ast Expr) {
        let e_ = &mut *self.errors;
        match e {
            Expr::While(w) => e_.at(w.while_token, "`while` is not supported in a kernel; use `for i in a..b`"),
            Expr::Loop(l) => e_.at(l.loop_token, "`loop` is not supported in a kernel; use `for i in a..b`"),
            Expr::Break(b) => e_.at(b.break_token, "`break` is not supported in a kernel: loops run their whole range; guard the body with `if`"),
            Expr::Continue(c) => e_.at(c.continue_token, "`continue` is not supported in a kernel: loops run their whole range; guard the body with `if`"),
            Expr::Return(r) => e_.at(r.return_token, "`return` is not supported in a kernel; structure the body with `if`/`else`"),
            Expr::Match(m) => e_.at(m.match_token, "`match` is not supported in a kernel; use `if`/`else`"),
            Expr::Closure(c) => e_.at(c.or1_token, "closures are not supported in a kernel; write a `#[kernel_fn]` helper function"),
            Expr::Try(t) => e_.at(t.question_token, "the `?` operator is not supported in a kernel: kernel ops report errors when the kernel is built"),
            Expr::Async(a) => e_.at(a.async_token, "`async` blocks are not supported in a kernel"),
            Expr::Await(a) => e_.at(a.await_token, "`.await` is not supported in a kernel"),
            Expr::Unsafe(u) => e_.at(u.unsafe_token, "`unsafe` blocks are not supported in a kernel"),
            Expr::TryBlock(t) => e_.at(t.try_token, "`try` blocks are not supported in a kernel"),
            Expr::Yield(y) => e_.at(y.yield_token, "`yield` is not supported in a kernel"),
            Expr::Struct(s) => e_.at(&s.path, "struct literals are not supported in a kernel; use tuples of values"),
            Expr::Let(l) => e_.at(l.let_token, "`if let` is not supported in a kernel; use a plain `if`"),
            Expr::Reference(r) if r.mutability.is_some() => e_.at(r.mutability, "`&mut` is not supported in a kernel: values are `Copy`, reassign them instead"),
            Expr::Macro(ExprMacro { mac, .. }) => self.check_macro(mac),
            Expr::MethodCall(m) if m.method == "tile" => {
                if let Some(t) = &m.turbofish {
                    e_.at(t, "tile shapes are written as an array: `.tile([BM, BN], coords)`");
                }
                if let Some(shape) = m.args.first() {
                    check_shape_literal(shape, e_);
                }
            }
            Expr::Call(c) if shape_fn(&c.func) => {
                if let Some(shape) = c.args.first() {
                    check_shape_literal(shape, e_);
                }
            }
            Expr::ForLoop(f) => {
                if let Some(l) = &f.label {
                    e_.at(l, "loop labels are not supported in a kernel");
                }
                if !matches!(&*f.pat, Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none())
                    && !matches!(&*f.pat, Pat::Wild(_))
                {
                    e_.at(&f.pat, "a kernel `for` binds one name (`for i in a..b`)");
                }
                if let Expr::Call(c) = &*f.expr
                    && matches!(&*c.func, Expr::Path(p) if p.path.is_ident("pipelined"))
                    && c.args.len() != 2
                {
                    e_.at(c, "write `pipelined(a..b, stages = N)`");
                }
            }
            Expr::Range(r) if r.end.is_none() => e_.at(r, "ranges in a kernel need an end: `a..b`"),
            Expr::Range(r) if matches!(r.limits, syn::RangeLimits::Closed(_)) => {
                e_.at(r, "inclusive ranges are not supported in a kernel; write `a..b + 1`")
            }
            _ => {}
        }
        visit::visit_expr(self, e);
    }

    fn visit_stmt_macro(&mut self, m: &'ast StmtMacro) {
        self.check_macro(&m.mac);
    }

    fn visit_item(&mut self, i: &'ast Item) {
        match i {
            Item::Const(_) | Item::Use(_) => visit::visit_item(self, i),
            _ => self.errors.at(
                i,
                "only `const` and `use` items may appear in a kernel; define helpers outside with `#[kernel_fn]`",
            ),
        }
    }
}

/// Whether `func` names a DSL function whose first argument is a tile shape.
fn shape_fn(func: &Expr) -> bool {
    matches!(func, Expr::Path(p) if p.path.segments.last().is_some_and(|s| {
        s.ident == "zeros" || s.ident == "full" || s.ident == "iota"
    }))
}

/// A tile shape must be an array literal whose extents are known while tracing; `[n; 2]`
/// and shapes computed elsewhere cannot be checked.
fn check_shape_literal(shape: &Expr, errors: &mut Errors) {
    match shape {
        Expr::Array(_) => {}
        Expr::Repeat(r) => errors.at(r, "write each tile extent: `[BM, BM]`, not `[BM; 2]`"),
        other => errors.at(
            other,
            "tile shapes are written as an array literal of compile-time extents, like `[BM, D]`",
        ),
    }
}

/// The variables declared outside `block` that `block` assigns (`x = ..`, `x += ..`), in
/// order of first assignment. `bound` are names the construct itself declares (a loop
/// variable).
pub fn assigned_outer<'a>(
    blocks: impl IntoIterator<Item = &'a Block>,
    bound: &[Ident],
) -> Vec<Ident> {
    let mut a = Assigned {
        scopes: vec![bound.iter().map(Ident::to_string).collect()],
        found: Vec::new(),
    };
    for b in blocks {
        a.visit_block(b);
    }
    a.found
}

/// Same as [`assigned_outer`] for an expression (an `else if` branch).
pub fn assigned_outer_expr(e: &Expr) -> Vec<Ident> {
    let mut a = Assigned {
        scopes: vec![HashSet::new()],
        found: Vec::new(),
    };
    a.visit_expr(e);
    a.found
}

struct Assigned {
    scopes: Vec<HashSet<String>>,
    found: Vec<Ident>,
}

impl Assigned {
    fn assign(&mut self, lhs: &Expr) {
        match lhs {
            Expr::Path(p) => {
                if let Some(id) = p.path.get_ident() {
                    let name = id.to_string();
                    let declared = self.scopes.iter().any(|s| s.contains(&name));
                    if !declared && !self.found.iter().any(|f| *f == name) {
                        self.found.push(id.clone());
                    }
                }
            }
            Expr::Tuple(t) => t.elems.iter().for_each(|e| self.assign(e)),
            Expr::Paren(p) => self.assign(&p.expr),
            Expr::Field(f) => self.assign(&f.base),
            Expr::Index(i) => self.assign(&i.expr),
            _ => {}
        }
    }

    fn declare(&mut self, pat: &Pat) {
        let mut names = Vec::new();
        pat_idents(pat, &mut names);
        if let Some(scope) = self.scopes.last_mut() {
            scope.extend(names.iter().map(Ident::to_string));
        }
    }
}

impl<'ast> Visit<'ast> for Assigned {
    fn visit_block(&mut self, b: &'ast Block) {
        self.scopes.push(HashSet::new());
        visit::visit_block(self, b);
        self.scopes.pop();
    }

    fn visit_local(&mut self, l: &'ast Local) {
        if let Some(init) = &l.init {
            self.visit_expr(&init.expr);
            if let Some((_, e)) = &init.diverge {
                self.visit_expr(e);
            }
        }
        self.declare(&l.pat);
    }

    fn visit_expr(&mut self, e: &'ast Expr) {
        match e {
            Expr::Assign(a) => {
                self.assign(&a.left);
                self.visit_expr(&a.right);
            }
            Expr::Binary(b) if is_compound_assign(&b.op) => {
                self.assign(&b.left);
                self.visit_expr(&b.right);
            }
            Expr::ForLoop(f) => {
                match &*f.expr {
                    // `pipelined(r, stages = n)`: `stages = n` names an argument, it assigns
                    // nothing (a nested pipelined loop would otherwise carry `stages`).
                    Expr::Call(c) if matches!(&*c.func, Expr::Path(p) if p.path.is_ident("pipelined")) => {
                        for arg in &c.args {
                            match arg {
                                Expr::Assign(a) => self.visit_expr(&a.right),
                                other => self.visit_expr(other),
                            }
                        }
                    }
                    other => self.visit_expr(other),
                }
                self.scopes.push(HashSet::new());
                self.declare(&f.pat);
                self.visit_block(&f.body);
                self.scopes.pop();
            }
            _ => visit::visit_expr(self, e),
        }
    }
}

fn is_compound_assign(op: &syn::BinOp) -> bool {
    use syn::BinOp::*;
    matches!(
        op,
        AddAssign(_)
            | SubAssign(_)
            | MulAssign(_)
            | DivAssign(_)
            | RemAssign(_)
            | BitXorAssign(_)
            | BitAndAssign(_)
            | BitOrAssign(_)
            | ShlAssign(_)
            | ShrAssign(_)
    )
}

/// The names a pattern binds.
pub fn pat_idents(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                pat_idents(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| pat_idents(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| pat_idents(p, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| pat_idents(p, out)),
        Pat::Type(t) => pat_idents(&t.pat, out),
        Pat::Reference(r) => pat_idents(&r.pat, out),
        Pat::Paren(p) => pat_idents(&p.pat, out),
        Pat::Or(o) => o.cases.iter().take(1).for_each(|p| pat_idents(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| pat_idents(&f.pat, out)),
        _ => {}
    }
}
