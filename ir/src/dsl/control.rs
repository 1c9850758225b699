//! Control flow while tracing: `if` on a comptime `bool` runs one branch in Rust; on a bool
//! [`Value`] it emits an IR `if`. `for` over a [`LoopRange`] emits an IR `for`. Variables
//! assigned inside are threaded through by value ([`Carry`]), as the macro arranges.

use crate::diag::Diagnostic;
use crate::kernel::{Loc, ValueId};

use super::context;
use super::index::{Index, IntoIndex};
use super::value::{self, Value};

/// Values that can flow out of runtime control flow: [`Value`], `()` and tuples of them.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be assigned inside runtime control flow",
    label = "assigned in a runtime `if` or `for`",
    note = "only `Value`s (and tuples of them) may change inside an `if` on a runtime condition or a runtime `for`; make the condition `#[comptime]`, use `for i in unroll(a..b)`, or compute the value outside"
)]
pub trait Carry: Sized {
    /// Appends the carried values in order.
    fn flatten(&self, out: &mut Vec<Value>);
    /// Rebuilds a value of the same structure from `vals`, in [`Carry::flatten`]'s order.
    fn rebuild(&self, vals: &mut dyn Iterator<Item = Value>) -> Self;
}

impl Carry for Value {
    fn flatten(&self, out: &mut Vec<Value>) {
        out.push(*self);
    }
    fn rebuild(&self, vals: &mut dyn Iterator<Item = Value>) -> Value {
        vals.next().unwrap_or(Value::POISON)
    }
}

impl Carry for () {
    fn flatten(&self, _: &mut Vec<Value>) {}
    fn rebuild(&self, _: &mut dyn Iterator<Item = Value>) {}
}

/// Implements [`Carry`] for tuples of carried types.
macro_rules! carry_tuple {
    ($(($($t:ident $i:tt),*))*) => {$(
        impl<$($t: Carry),*> Carry for ($($t,)*) {
            fn flatten(&self, out: &mut Vec<Value>) {
                $(self.$i.flatten(out);)*
            }
            fn rebuild(&self, vals: &mut dyn Iterator<Item = Value>) -> Self {
                ($(self.$i.rebuild(vals),)*)
            }
        }
    )*};
}
carry_tuple! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
    (A 0, B 1, C 2, D 3, E 4, F 5)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7)
}

fn flat<T: Carry>(x: &T) -> Vec<Value> {
    let mut out = Vec::new();
    x.flatten(&mut out);
    out
}

/// Handles of the non-poison values (poison means a diagnostic is already recorded, so the
/// kernel will not be returned and the region contents no longer matter).
fn live(values: &[Value]) -> Vec<ValueId> {
    values.iter().filter_map(|v| v.id()).collect()
}

/// The condition of a kernel `if`: `bool` (comptime) or a bool [`Value`] (runtime).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the condition of an `if` in a kernel",
    note = "conditions are Rust `bool`s (decided while tracing) or scalar bool `Value`s"
)]
pub trait Condition<R, V> {
    /// Runs `then_` or `else_` (comptime), or traces both into an IR `if` (runtime). Each
    /// branch takes and returns the carried variables `vars`, and returns the `if`'s value.
    fn branch(
        self,
        vars: V,
        then_: impl FnOnce(V) -> (R, V),
        else_: impl FnOnce(V) -> (R, V),
    ) -> (R, V);
}

impl<R, V> Condition<R, V> for bool {
    fn branch(
        self,
        vars: V,
        then_: impl FnOnce(V) -> (R, V),
        else_: impl FnOnce(V) -> (R, V),
    ) -> (R, V) {
        if self { then_(vars) } else { else_(vars) }
    }
}

impl<R: Carry, V: Carry + Clone> Condition<R, V> for Value {
    #[track_caller]
    fn branch(
        self,
        vars: V,
        then_: impl FnOnce(V) -> (R, V),
        else_: impl FnOnce(V) -> (R, V),
    ) -> (R, V) {
        let loc = Loc::caller();
        let Some(cond) = self.id() else {
            return then_(vars);
        };
        let Some(op) = context::with(|b| b.begin_if(cond, loc)) else {
            return then_(vars);
        };
        let (r1, v1) = then_(vars.clone());
        let mut yields = flat(&r1);
        yields.extend(flat(&v1));
        context::with(|b| b.begin_else(op, &live(&yields), loc));
        let (r2, v2) = else_(vars);
        let mut yields2 = flat(&r2);
        yields2.extend(flat(&v2));
        let results = context::with(|b| b.end_if(op, &live(&yields2), loc)).unwrap_or_default();
        let mut it = results.into_iter().map(Value::from_id);
        let r = r1.rebuild(&mut it);
        let v = v1.rebuild(&mut it);
        (r, v)
    }
}

/// The bounds of a runtime loop: `lo..hi` by `step`, optionally software-pipelined.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopRange {
    lo: Index,
    hi: Index,
    step: Index,
    stages: Option<u32>,
}

/// `lo..hi` as a runtime loop range (the macro rewrites `a..b` in `for` headers to this).
pub fn range(lo: impl IntoIndex, hi: impl IntoIndex) -> LoopRange {
    LoopRange {
        lo: lo.into_index(),
        hi: hi.into_index(),
        step: Index::Const(1),
        stages: None,
    }
}

impl LoopRange {
    /// Steps by `step` (positive) instead of 1.
    pub fn step_by(self, step: impl IntoIndex) -> LoopRange {
        LoopRange {
            step: step.into_index(),
            ..self
        }
    }
}

/// Asks the compiler to software-pipeline the loop `stages` deep (written
/// `pipelined(a..b, stages = 2)` in a `for` header).
pub fn pipelined(range: LoopRange, stages: u32) -> LoopRange {
    LoopRange {
        stages: Some(stages),
        ..range
    }
}

/// A loop unrolled while tracing: `for i in unroll(0..4)` (or `unroll((0..8).step_by(2))`)
/// is a Rust loop and `i` a `usize`.
pub fn unroll<I: Iterator<Item = usize>>(range: I) -> I {
    range
}

/// Traces a runtime `for` over `range`: `body` receives the loop counter (an i32 value) and
/// the carried variables, and returns their next values; returns their values after the loop.
#[track_caller]
pub fn for_loop<V: Carry + Clone>(
    range: LoopRange,
    vars: V,
    body: impl FnOnce(Value, V) -> V,
) -> V {
    let loc = Loc::caller();
    if let Index::Const(s) = range.step
        && s <= 0
    {
        value::fail(Diagnostic::new(
            loc,
            format!("loop step {s} must be positive"),
        ));
        return vars;
    }
    let bounds = [range.lo, range.hi, range.step].map(|b| b.to_value(loc));
    let (Some([lo, hi, step]), init) = (
        value::ids(&bounds).and_then(|v| <[ValueId; 3]>::try_from(v).ok()),
        flat(&vars),
    ) else {
        return vars;
    };
    let Some(scope) = context::with(|b| b.begin_for(lo, hi, step, &live(&init), range.stages, loc))
    else {
        return vars;
    };
    let mut inside = scope.carried.iter().copied().map(Value::from_id);
    let start = vars.rebuild(&mut inside);
    let next = body(Value::from_id(scope.iv), start);
    let results =
        context::with(|b| b.end_for(&scope, &live(&flat(&next)), loc)).unwrap_or_default();
    next.rebuild(&mut results.into_iter().map(Value::from_id))
}
