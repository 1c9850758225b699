//! The verifier: checks that a kernel is well formed, collecting every error.
//!
//! It is the first entry of the pass list. The invariants it checks (handles, dominance,
//! types as [`crate::infer::result_types`] gives them, region shapes, `yield` placement) and
//! what it does not check yet are listed at [`verify`].

use std::fmt;

use crate::infer::result_types;
use crate::kernel::{Block, Kernel, OpId, OpKind, ValueDef, ValueId};
use crate::print::{op_str, print_kernel};
use crate::types::{DType, Type};

/// One broken invariant, at an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The offending op (for a region-level error, the op owning the region).
    pub op: OpId,
    /// The op as printed in dumps (empty if `op` is not a valid handle).
    pub text: String,
    /// What is wrong, one sentence.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.op, self.text, self.message)
    }
}

/// Every error the verifier found, with the kernel listing annotated under each bad line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyErrors {
    /// The errors in program order.
    pub errors: Vec<VerifyError>,
    listing: String,
}

impl fmt::Display for VerifyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.listing)?;
        write!(f, "{} verifier error(s)", self.errors.len())
    }
}

impl std::error::Error for VerifyErrors {}

/// Checks `kernel`, collecting every error.
///
/// Invariants checked, for every op reachable from the kernel's body:
/// - every handle (op, operand, result, block argument) names an entity of the kernel, and
///   each op appears in exactly one block;
/// - every operand is defined before its use by an op or block argument that dominates it:
///   a value defined inside a region is visible only in that region (and regions nested in
///   it) and leaves it only through the owner's results; block arguments are used only
///   inside their region;
/// - every value records the op (or block argument position) that defines it, and is
///   defined once;
/// - operand and result types agree with [`crate::infer::result_types`] (which covers tensor
///   parameter indices, ranks and mutability of `load`/`store`, and the scalar i32 bounds of
///   `for`);
/// - `for` has one region whose arguments are the i32 induction variable then the carried
///   values, typed as the init operands and the results, and whose yield passes values of
///   those types; `if` has two argument-less regions whose yields both match its declared
///   results; other ops own no region;
/// - every region ends with exactly one `yield`, and `yield` appears nowhere else (not in
///   the kernel's top-level block).
///
/// Not yet checked: that the top-level block takes no arguments; ops left in the arena but
/// unreachable from the body (passes may leave them); scopes, layouts and memory spaces
/// introduced by later passes.
pub fn verify(kernel: &Kernel) -> Result<(), VerifyErrors> {
    let mut v = Verifier {
        kernel,
        defined: vec![false; kernel.values.len()],
        seen: vec![false; kernel.ops.len()],
        printable: true,
        errors: Vec::new(),
    };
    v.block(&kernel.body, None);
    if v.errors.is_empty() {
        return Ok(());
    }
    let listing = if v.printable {
        annotate(kernel, &v.errors)
    } else {
        v.errors.iter().map(|e| format!("error: {e}\n")).collect()
    };
    Err(VerifyErrors {
        errors: v.errors,
        listing,
    })
}

struct Verifier<'k> {
    kernel: &'k Kernel,
    /// Whether each value is visible at the current point.
    defined: Vec<bool>,
    /// Whether each op has been met in some block.
    seen: Vec<bool>,
    /// False once an op the printer cannot print was found (dangling handle, `for` without
    /// bounds); errors then list without the kernel.
    printable: bool,
    errors: Vec<VerifyError>,
}

impl Verifier<'_> {
    fn error(&mut self, op: OpId, message: impl Into<String>) {
        let text = if op.index() < self.kernel.ops.len() && self.printable {
            op_str(self.kernel, op)
        } else {
            String::new()
        };
        self.errors.push(VerifyError {
            op,
            text,
            message: message.into(),
        });
    }

    fn value_ok(&self, v: ValueId) -> bool {
        v.index() < self.kernel.values.len()
    }

    /// Checks a block whose owner is `owner` (`None` for the kernel body). Values defined in
    /// it are hidden again when it ends.
    fn block(&mut self, block: &Block, owner: Option<OpId>) {
        let mut scope: Vec<ValueId> = block.args.clone();
        for &a in &block.args {
            self.define(a);
        }
        let n = block.ops.len();
        for (i, &id) in block.ops.iter().enumerate() {
            if id.index() >= self.kernel.ops.len() {
                self.printable = false;
                let at = owner.unwrap_or(id);
                self.error(at, format!("block refers to {id}, which does not exist"));
                continue;
            }
            if std::mem::replace(&mut self.seen[id.index()], true) {
                self.error(id, "op appears in more than one place");
                continue;
            }
            let is_yield = self.kernel.ops[id].kind == OpKind::Yield;
            match (owner, is_yield, i + 1 == n) {
                (None, true, _) => self.error(id, "`yield` outside a region"),
                (Some(_), true, false) => self.error(id, "`yield` before the end of its region"),
                _ => {}
            }
            self.op(id);
            scope.extend_from_slice(&self.kernel.ops[id].results);
        }
        if let Some(o) = owner {
            let ends_in_yield = block
                .ops
                .last()
                .filter(|y| y.index() < self.kernel.ops.len())
                .is_some_and(|&y| self.kernel.ops[y].kind == OpKind::Yield);
            if !ends_in_yield {
                self.error(o, "a region of this op does not end with `yield`");
            }
        }
        for v in scope {
            if self.value_ok(v) {
                self.defined[v.index()] = false;
            }
        }
    }

    fn define(&mut self, v: ValueId) {
        if self.value_ok(v) {
            self.defined[v.index()] = true;
        }
    }

    /// Why the printer cannot print op `id`, if it cannot: a handle it refers to does not
    /// exist, or a `for` lacks its bounds.
    fn unprintable(&self, id: OpId) -> Option<String> {
        let op = &self.kernel.ops[id];
        let args = op.regions.iter().flat_map(|r| &r.args);
        let values = op.operands.iter().chain(&op.results).chain(args);
        if let Some(v) = values.copied().find(|&v| !self.value_ok(v)) {
            return Some(format!("refers to value {v}, which does not exist"));
        }
        if matches!(op.kind, OpKind::For { .. }) && op.operands.len() < 3 {
            return Some("`for` takes lo, hi and step".into());
        }
        None
    }

    fn op(&mut self, id: OpId) {
        if let Some(problem) = self.unprintable(id) {
            self.printable = false;
            return self.error(id, problem);
        }
        let kernel = self.kernel;
        let op = &kernel.ops[id];
        let mut operand_tys = Vec::with_capacity(op.operands.len());
        for &v in &op.operands {
            if !self.defined[v.index()] {
                let msg = match kernel.values[v].def {
                    ValueDef::BlockArg { op: o, .. } if o == id => {
                        format!("uses {v}, an argument of its own region")
                    }
                    ValueDef::BlockArg { op: o, .. } => {
                        format!("uses {v}, an argument of a region of {o} that does not enclose it")
                    }
                    ValueDef::Op(o, _) => {
                        format!("uses {v} (defined by {o}), which does not dominate this use")
                    }
                };
                self.error(id, msg);
            }
            operand_tys.push(kernel.ty(v).clone());
        }
        for (i, &r) in op.results.iter().enumerate() {
            if kernel.values[r].def != ValueDef::Op(id, i) {
                self.error(id, format!("result {r} records another definition"));
            }
            if self.defined[r.index()] {
                self.error(id, format!("result {r} is already defined"));
            }
        }
        let result_tys: Vec<Type> = op.results.iter().map(|&r| kernel.ty(r).clone()).collect();
        self.types(id, &operand_tys, &result_tys);
        for (ri, region) in op.regions.iter().enumerate() {
            self.region_args(id, ri, region);
            self.block(region, Some(id));
        }
        for &r in &op.results {
            self.define(r);
        }
    }

    /// Checks result types against [`crate::infer::result_types`] and the region structure of
    /// `for` and `if`.
    fn types(&mut self, id: OpId, operands: &[Type], results: &[Type]) {
        let kernel = self.kernel;
        let op = &kernel.ops[id];
        let inferred = result_types(&op.kind, operands, &kernel.params, results.first());
        let inferred = match inferred {
            Ok(t) => t,
            Err(msg) => return self.error(id, msg),
        };
        let (regions, expected_results) = match op.kind {
            OpKind::For { .. } => (1, inferred),
            // `if` results are declared by its yields, checked per region below.
            OpKind::If => (2, results.to_vec()),
            _ => (0, inferred),
        };
        if expected_results != results {
            self.error(
                id,
                format!(
                    "results are ({}), expected ({})",
                    list(results),
                    list(&expected_results)
                ),
            );
        }
        if op.regions.len() != regions {
            self.error(
                id,
                format!("has {} region(s), expected {regions}", op.regions.len()),
            );
        }
        for region in &op.regions {
            let Some(&y) = region.ops.last() else {
                continue;
            };
            if y.index() >= kernel.ops.len() || kernel.ops[y].kind != OpKind::Yield {
                continue;
            }
            let yield_op = &kernel.ops[y];
            let yielded: Vec<Type> = yield_op
                .operands
                .iter()
                .filter(|v| self.value_ok(**v))
                .map(|&v| kernel.ty(v).clone())
                .collect();
            if yielded != results {
                self.error(
                    y,
                    format!(
                        "yields ({}), but {} expects ({})",
                        list(&yielded),
                        id,
                        list(results)
                    ),
                );
            }
        }
    }

    /// Checks a region's block arguments: `for` takes `(i32, carried...)`, `if` none.
    fn region_args(&mut self, id: OpId, index: usize, region: &Block) {
        let kernel = self.kernel;
        let op = &kernel.ops[id];
        let expected: Vec<Type> = match op.kind {
            OpKind::For { .. } => std::iter::once(Type::Scalar(DType::I32))
                .chain(
                    op.results
                        .iter()
                        .filter(|r| self.value_ok(**r))
                        .map(|&r| kernel.ty(r).clone()),
                )
                .collect(),
            _ => Vec::new(),
        };
        let mut got = Vec::with_capacity(region.args.len());
        for (i, &a) in region.args.iter().enumerate() {
            let want = ValueDef::BlockArg {
                op: id,
                region: index,
                index: i,
            };
            if kernel.values[a].def != want {
                self.error(id, format!("block argument {a} records another definition"));
            }
            got.push(kernel.ty(a).clone());
        }
        if got != expected {
            self.error(
                id,
                format!(
                    "region {index} takes ({}), expected ({})",
                    list(&got),
                    list(&expected)
                ),
            );
        }
    }
}

fn list(tys: &[Type]) -> String {
    tys.iter().map(Type::words).collect::<Vec<_>>().join(", ")
}

/// The printed kernel with each error on a line of its own under its op's line.
fn annotate(kernel: &Kernel, errors: &[VerifyError]) -> String {
    let text = print_kernel(kernel);
    let lines: Vec<&str> = text.lines().collect();
    // Mirror the printer's walk to find each op's line: the header is line 0, each op one
    // line, then its regions' contents, an `} else {` between regions and a closing `}`.
    let mut line_of = vec![None; kernel.ops.len()];
    fn walk(kernel: &Kernel, block: &Block, line: &mut usize, line_of: &mut [Option<usize>]) {
        for &op in &block.ops {
            line_of[op.index()] = Some(*line);
            *line += 1;
            let regions = &kernel.ops[op].regions;
            for (i, r) in regions.iter().enumerate() {
                *line += usize::from(i > 0);
                walk(kernel, r, line, line_of);
            }
            *line += usize::from(!regions.is_empty());
        }
    }
    let mut line = 1;
    walk(kernel, &kernel.body, &mut line, &mut line_of);
    let mut out = String::new();
    for (n, l) in lines.iter().enumerate() {
        out.push_str(l);
        out.push('\n');
        let indent = l.len() - l.trim_start().len();
        for e in errors
            .iter()
            .filter(|e| line_of.get(e.op.index()).copied().flatten() == Some(n))
        {
            out.push_str(&format!("{:indent$}; error: {}: {}\n", "", e.op, e.message));
        }
    }
    out
}

#[cfg(test)]
mod tests;
