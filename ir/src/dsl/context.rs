//! The tracing context: the [`Builder`] that the `#[kernel]` macro's generated code drives, kept
//! in a thread-local stack while [`trace`] runs the kernel body, with the first [`Diagnostic`]
//! raised (why only the first: [`trace`], "Errors"). The helpers that turn builder calls into
//! [`Value`](super::Value)s live with the type, in `super::value`, so this stack knows nothing
//! of values.

use std::cell::RefCell;

use crate::builder::Builder;
use crate::diag::Diagnostic;
use crate::kernel::{Kernel, KernelOptions, Loc, Param};

/// One kernel being traced.
struct Context {
    builder: Builder,
    error: Option<Diagnostic>,
}

thread_local! {
    /// A stack, so that a kernel body may itself build another kernel (tests do).
    static CONTEXTS: RefCell<Vec<Context>> = const { RefCell::new(Vec::new()) };
}

/// Runs `body` with a fresh builder for a kernel `name(params)` and returns the kernel, or
/// the first diagnostic raised while tracing (or returned by `body`).
///
/// # What the macro rewrites in a kernel body (and in a `#[kernel_fn]`)
///
/// | written | traced as |
/// | --- | --- |
/// | `[e0, e1]` | `[IntoIndex::into_index(e0), ..]`: shapes and coordinates ([`Index`](crate::dsl::Index)) |
/// | `a < b`, `<=`, `>`, `>=`, `==`, `!=` | [`Compare`](crate::dsl::Compare): `bool` on Rust values, a bool [`Value`](crate::dsl::Value) otherwise |
/// | `a && b`, `a \|\| b` | [`Logic`](crate::dsl::Logic) (both sides are evaluated) |
/// | `if c { .. } else { .. }` | [`Condition::branch`](crate::dsl::Condition::branch): a Rust `if` for `c: bool`, an IR `if` for a `Value` |
/// | `for i in a..b`, `(a..b).step_by(s)`, `pipelined(a..b, stages = n)` | [`for_loop`](crate::dsl::for_loop): an IR `for`, `i` an i32 `Value` |
/// | `for i in unroll(a..b)` | a Rust loop, `i` a `usize` |
///
/// Outer variables assigned inside a runtime `if` or `for` are passed in and returned by
/// value ([`Carry`](crate::dsl::Carry)); they must be `Value`s (or tuples of them). Items
/// inside the body (`const B: usize = 128;`) are left alone: they are plain Rust, so they cannot name
/// comptime parameters (const generics become ordinary locals while tracing); write
/// `let bn = d / 2;` instead.
///
/// # Comptime values
///
/// A kernel's comptime parameters are one typed struct ([`Comptime`](crate::dsl::Comptime)),
/// which `build` reads from its [`Spec`](crate::dsl::Spec) and binds as locals (or, for a
/// `#[comptime]` struct parameter, as that struct); see [`comptime`](crate::dsl::comptime)
/// and [`defines`](crate::dsl::defines) for the text the CLI takes.
///
/// # Errors
///
/// Operators cannot return `Result`, so the first [`crate::Diagnostic`] raised while tracing
/// is recorded and a poison `Value` returned; ops reading poison are skipped, and `build`
/// returns that first diagnostic. Nothing here panics.
pub fn trace(
    name: &str,
    params: Vec<Param>,
    options: KernelOptions,
    body: impl FnOnce() -> Result<(), Diagnostic>,
) -> Result<Kernel, Diagnostic> {
    CONTEXTS.with(|c| {
        c.borrow_mut().push(Context {
            builder: Builder::new(name, params, options),
            error: None,
        })
    });
    let result = body();
    let cx = CONTEXTS.with(|c| c.borrow_mut().pop());
    let cx = cx.ok_or_else(|| Diagnostic::internal(Loc::default(), "tracing context lost"))?;
    if let Some(e) = cx.error {
        return Err(e);
    }
    result?;
    let mut kernel = cx.builder.finish()?;
    super::cleanup::remove_unused_grid_queries(&mut kernel);
    Ok(kernel)
}

/// Runs `f` on the current builder. A diagnostic from `f` is recorded (if it is the first)
/// and gives `None`; so does calling outside [`trace`], where there is nothing to build.
pub(crate) fn with<R>(f: impl FnOnce(&mut Builder) -> Result<R, Diagnostic>) -> Option<R> {
    CONTEXTS.with(|c| {
        let mut stack = c.borrow_mut();
        let cx = stack.last_mut()?;
        match f(&mut cx.builder) {
            Ok(r) => Some(r),
            Err(e) => {
                cx.error.get_or_insert(e);
                None
            }
        }
    })
}
