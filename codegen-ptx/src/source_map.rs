//! From a line of kiln's PTX back to the user's source: the writer precedes every op's
//! instructions with a comment `// <file>:<line>  <op>` (`emit::Emitter::op_comment`), so the
//! nearest such comment above a PTX line names the user's line that PTX line was written
//! for. ptxas (and the driver's JIT, which runs the same assembler) report errors as
//! `<name>, line <n>; error : <message>`; [`map_log`] turns each into a diagnostic there.

use std::collections::BTreeSet;
use std::sync::Mutex;

use kiln_ir::{Diagnostic, Loc};

/// The user's source location whose op the PTX at 1-based line `line` of `ptx` was written
/// for: the nearest op comment at or above it; `None` above the first op.
pub fn source_at(ptx: &str, line: usize) -> Option<Loc> {
    let lines: Vec<&str> = ptx.lines().take(line).collect();
    lines.iter().rev().find_map(|l| op_comment_loc(l))
}

/// Every error ptxas reported in `log` for `ptx`, as a diagnostic at the user's line that PTX
/// line was written for, with ptxas's message and the PTX instruction in notes. Kiln wrote
/// the PTX, so each is an internal error: whatever the kernel, PTX kiln writes must assemble.
pub fn map_log(ptx: &str, log: &str) -> Vec<Diagnostic> {
    let lines: Vec<&str> = ptx.lines().collect();
    log.lines()
        .filter_map(parse_error)
        .map(|(n, message)| {
            let loc = source_at(ptx, n).unwrap_or_default();
            let instruction = lines.get(n.wrapping_sub(1)).map_or("", |l| l.trim());
            Diagnostic::internal(
                loc,
                format!("ptxas rejected the PTX written for this line: {message}"),
            )
            .note(format!("PTX line {n}: `{instruction}`"))
        })
        .collect()
}

/// `log` with the diagnostics of [`map_log`] before it, for an error message.
pub fn annotate(ptx: &str, log: &str) -> String {
    let mut out = String::new();
    for d in map_log(ptx, log) {
        out.push_str(&d.to_string());
        out.push('\n');
    }
    out.push_str(log);
    out
}

/// `(line, message)` of a ptxas error line `<name>, line <n>; error   : <message>`.
fn parse_error(l: &str) -> Option<(usize, &str)> {
    let (head, message) = l.split_once("; error")?;
    let n = head.rsplit_once(", line ")?.1.trim().parse().ok()?;
    let message = message
        .trim_start()
        .strip_prefix(':')
        .unwrap_or(message)
        .trim();
    Some((n, message))
}

/// The location in an op comment `\t// <file>:<line>  <op>` (file ending in `.rs`).
fn op_comment_loc(l: &str) -> Option<Loc> {
    let rest = l.trim_start().strip_prefix("// ")?;
    let at = rest.split_whitespace().next()?;
    let (file, line) = at.rsplit_once(':')?;
    let line: u32 = line.parse().ok()?;
    (file.ends_with(".rs") && line > 0).then(|| Loc {
        file: intern(file),
        line,
        column: 0,
    })
}

/// `file` as the `&'static str` a [`Loc`] holds: each distinct name is leaked once, and a
/// program has few source files.
fn intern(file: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&n) = names.get(file) {
        return n;
    }
    let n: &'static str = Box::leak(file.to_owned().into_boxed_str());
    names.insert(n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::DiagKind;

    const PTX: &str = "\
.version 8.0
.visible .entry k()
{
\t.reg .b32 %r<4>;
\t// src/kernels.rs:12  %1 = add %0, %0
\tmov.b32 %r1, 1;
\t// TMA store, part 1 of 2: wait
\tadd.s32 %r2, %r1, %q9;
\t// src/kernels.rs:14  store out[%2, %3], %1
\tret;
}
";

    #[test]
    fn a_ptx_line_maps_to_the_op_comment_above_it() {
        let at = |n| source_at(PTX, n).map(|l| (l.file, l.line));
        assert_eq!(at(4), None);
        assert_eq!(at(5), Some(("src/kernels.rs", 12)));
        assert_eq!(at(8), Some(("src/kernels.rs", 12)));
        assert_eq!(at(10), Some(("src/kernels.rs", 14)));
    }

    #[test]
    fn ptxas_errors_become_diagnostics_at_the_users_line() {
        let log = "ptxas /tmp/tmpxft_0_stdin, line 8; error   : Unknown symbol '%q9'\n\
                   ptxas application ptx input, line 10; error   : Illegal thing\n\
                   ptxas fatal   : Ptx assembly aborted due to errors\n";
        let ds = map_log(PTX, log);
        assert_eq!(ds.len(), 2);
        assert_eq!((ds[0].loc.file, ds[0].loc.line), ("src/kernels.rs", 12));
        assert_eq!(ds[0].kind, DiagKind::Internal);
        assert!(ds[0].message.ends_with("Unknown symbol '%q9'"), "{}", ds[0]);
        assert!(
            ds[0].notes.iter().any(|n| n.contains("add.s32 %r2")),
            "{}",
            ds[0]
        );
        assert_eq!(ds[1].loc.line, 14);
        let shown = annotate(PTX, log);
        assert!(shown.contains("--> src/kernels.rs:12\n"), "{shown}");
        assert!(shown.ends_with(log), "{shown}");
    }
}
