//! User-facing diagnostics: a message at a source location, with notes.

use std::fmt;

use crate::kernel::{Kernel, Loc, OpId, OpKind, ValueDef, ValueId};

/// Whose move a diagnostic asks for: the user's (the kernel is wrong), kiln's (a construct it
/// does not lower yet), or a kiln bug. Callers and the fuzzer tell them apart by this, never
/// by the message's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DiagKind {
    /// The kernel is wrong or over a budget (a shape or dtype mismatch, too much shared
    /// memory): the user changes the kernel.
    Invalid,
    /// The kernel is valid but kiln does not lower this construct on this target yet; the
    /// message says what to write instead where there is a way.
    Unsupported,
    /// A broken invariant inside kiln: a bug, whatever the kernel.
    Internal,
}

/// An error in a user's kernel (a shape or dtype mismatch, a resource over budget, an
/// unsupported construct on a target), reported at the user's source location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Whose move it is (see [`DiagKind`]).
    pub kind: DiagKind,
    /// One sentence saying what is wrong.
    pub message: String,
    /// Where the user wrote the offending code.
    pub loc: Loc,
    /// Further facts and hints, one sentence each.
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// A diagnostic with no notes.
    pub fn new(loc: Loc, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            kind: DiagKind::Invalid,
            message: message.into(),
            loc,
            notes: Vec::new(),
        }
    }

    /// Adds a note.
    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// A valid construct kiln does not lower on some target yet, at the user's `loc`.
    pub fn unsupported(loc: Loc, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            kind: DiagKind::Unsupported,
            ..Diagnostic::new(loc, message)
        }
    }

    /// An internal compiler error: a bug in kiln, not in the user's kernel.
    pub fn internal(loc: Loc, what: impl fmt::Display) -> Diagnostic {
        Diagnostic {
            kind: DiagKind::Internal,
            ..Diagnostic::new(loc, format!("internal kiln error: {what}"))
        }
        .note("this is a bug in kiln; the kernel should have been rejected earlier or accepted")
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.message)?;
        if self.loc.is_known() {
            write!(f, "\n  --> {}", self.loc)?;
        }
        for n in &self.notes {
            write!(f, "\n  = note: {n}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

/// Op `op` of `kernel` as the user wrote it in the DSL (`` `row_sum` ``, `` `+` ``,
/// `` `.col()` ``, `` `x.tile(..).load()` ``), for messages at the user's line: never the IR's
/// printed form, whose value numbers the user has never seen.
pub fn op_words(kernel: &Kernel, op: OpId) -> String {
    let Some(o) = kernel.ops.get(op) else {
        return "this operation".into();
    };
    let tensor = |i: usize| kernel.params.get(i).map_or("?", |p| p.name());
    let dims = |v: Option<&ValueId>| {
        v.and_then(|&v| kernel.values.get(v))
            .and_then(|d| d.ty.shape().map(|s| s.dims().to_vec()))
    };
    match &o.kind {
        OpKind::Const(c) => format!("the constant `{c}`"),
        OpKind::ScalarParam(i) => format!("the parameter `{}`", tensor(*i)),
        OpKind::BlockId(a) => format!("`block_id().{}`", a.name()),
        OpKind::GridDim(a) => format!("`grid_dim().{}`", a.name()),
        OpKind::TensorDim { tensor: t, dim } => format!("`{}.dim({dim})`", tensor(*t)),
        OpKind::Unary(u) => match u.name() {
            "neg" => "`-`".into(),
            "not" => "`!`".into(),
            f => format!("`{f}`"),
        },
        OpKind::Binary(b) => match b.name() {
            "add" => "`+`".into(),
            "sub" => "`-`".into(),
            "mul" => "`*`".into(),
            "div" => "`/`".into(),
            "rem" => "`%`".into(),
            "and" => "`&&`".into(),
            "or" => "`||`".into(),
            "lt" => "`<`".into(),
            "le" => "`<=`".into(),
            "gt" => "`>`".into(),
            "ge" => "`>=`".into(),
            "eq" => "`==`".into(),
            "ne" => "`!=`".into(),
            "bitand" => "`&`".into(),
            "bitor" => "`|`".into(),
            "bitxor" => "`^`".into(),
            "shl" => "`<<`".into(),
            "shr" => "`>>`".into(),
            "mulhi" => "`umulhi`/`mulhi`".into(),
            f => format!("`{f}`"),
        },
        OpKind::Select => "`select`".into(),
        OpKind::Cast { to } => format!("`.cast::<{to}>()`"),
        OpKind::Splat { .. } => "`full` (a scalar spread over a tile)".into(),
        OpKind::Iota { .. } => "`iota`".into(),
        OpKind::Reshape { shape } => match (dims(o.operands.first()).as_deref(), shape.dims()) {
            (Some([_]), [_, 1]) => "`.col()`".into(),
            (Some([_]), [1, _]) => "`.row()`".into(),
            _ => format!("a reshape to [{shape}]"),
        },
        OpKind::Transpose => "`.t()`".into(),
        OpKind::Permute { perm } => format!("`.permute({perm:?})`"),
        OpKind::Reduce { op: r, dim } => match (dims(o.operands.first()).map(|d| d.len()), dim) {
            (Some(2), 1) => format!("`row_{}`", r.name()),
            (Some(2), 0) => format!("`col_{}`", r.name()),
            _ => format!("a `{}` reduction over dimension {dim}", r.name()),
        },
        OpKind::Mma if o.operands.len() > 2 => "`mma_acc`".into(),
        OpKind::Mma => "`mma`".into(),
        OpKind::Load { tensor: t, .. } => format!("`{}.tile(..).load()`", tensor(*t)),
        OpKind::LoadScalar { tensor: t } => format!("`{}.scalar(..)`", tensor(*t)),
        OpKind::Take { .. } => "`take`".into(),
        OpKind::Bitcast { to } => format!("`.bitcast::<{to}>()`"),
        OpKind::Convert => "a layout conversion".into(),
        OpKind::Gather {
            tensor: t, access, ..
        } => format!(
            "`{}.{}.{}`",
            tensor(*t),
            view_words(access),
            if access.masked {
                "load_masked(..)"
            } else {
                "load()"
            }
        ),
        OpKind::Scatter { tensor: t, access } => format!(
            "`{}.{}.{}`",
            tensor(*t),
            view_words(access),
            if access.masked {
                "store_masked(..)"
            } else {
                "store(..)"
            }
        ),
        OpKind::Atomic {
            tensor: t,
            op: a,
            access,
            ..
        } => format!(
            "`{}.{}.atomic_{}(..)`",
            tensor(*t),
            view_words(access),
            a.name()
        ),
        OpKind::ScalarAtomic {
            tensor: t, op: a, ..
        } => {
            format!("`{}.at(..).atomic_{}(..)`", tensor(*t), a.name())
        }
        OpKind::Store { tensor: t, .. } => format!("`{}.tile(..).store(..)`", tensor(*t)),
        OpKind::For { .. } => "this `for` loop".into(),
        OpKind::If => "this `if`".into(),
        OpKind::Print { .. } => "`print!`".into(),
        OpKind::Yield => "the value this block yields".into(),
        // Ops added since: their IR mnemonic is the nearest word there is.
        #[allow(unreachable_patterns)]
        _ => format!(
            "`{}`",
            crate::print::op_str(kernel, op)
                .split(" = ")
                .last()
                .and_then(|s| s.split_whitespace().next())
                .unwrap_or("this operation")
        ),
    }
}

/// How the user picked the elements an addressed memory op reads or writes: `elems(..)`
/// when index tiles address every dimension, `rows(..)` when some, else `tile(..)`.
fn view_words(access: &crate::kernel::Access) -> &'static str {
    if access.dims.iter().all(|&d| d == crate::kernel::Addr::Index) {
        "elems(..)"
    } else if access.indexed() {
        "rows(..)"
    } else {
        "tile(..)"
    }
}

/// Value `v` in the words of an error at op `at`: which operand of the user's op, or whose
/// result, never its IR number.
pub fn value_words(kernel: &Kernel, at: OpId, v: ValueId) -> String {
    let line = |op: OpId| kernel.ops.get(op).map_or(0, |o| o.loc.line);
    let of_at = kernel
        .ops
        .get(at)
        .and_then(|o| o.operands.iter().position(|&x| x == v));
    if let Some(i) = of_at {
        return format!("operand {} of {}", i + 1, op_words(kernel, at));
    }
    match kernel.values.get(v).map(|d| d.def) {
        Some(ValueDef::Op(def, _)) => format!(
            "the result of {} (line {})",
            op_words(kernel, def),
            line(def)
        ),
        Some(ValueDef::BlockArg { op, .. }) => format!(
            "a value carried by {} (line {})",
            op_words(kernel, op),
            line(op)
        ),
        None => "a value the kernel does not define".into(),
    }
}
