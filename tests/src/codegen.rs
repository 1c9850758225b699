//! Code generation checks shared by the test files: a kernel compiles for sm_80 and sm_90a,
//! with its tensors 16-byte aligned and not, into compact PTX that ptxas assembles without
//! spills.

use std::sync::Mutex;

use kiln_ir::Target;
use kiln_ir::dsl::{KernelDef, Spec};

/// The most PTX lines a library kernel may take: code grows with the registers a thread
/// holds, not with the tile.
pub const MAX_PTX_LINES: usize = 4000;

/// Compiles `def` with `comptime` for sm_80 and sm_90a, every tensor parameter 16-byte
/// aligned and then none: each module contains `marker` (`""` for any), has fewer than
/// [`MAX_PTX_LINES`] lines, and ptxas assembles it without spills.
pub fn assembles_clean<D: KernelDef>(def: &D, comptime: D::Comptime, marker: &str)
where
    D::Comptime: Copy,
{
    for aligned in [false, true] {
        let spec = Spec::uniform(comptime, def.signature(), aligned);
        let k = def
            .build(&spec)
            .unwrap_or_else(|d| panic!("{}: {d}", def.name()));
        for target in [Target::Sm80, Target::Sm90a] {
            let what = format!("{} on {target}, aligned {aligned}", k.name);
            let m = kiln_ptx::compile(&k, target).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                m.ptx.contains(marker),
                "{what}: no `{marker}` in\n{}",
                m.ptx
            );
            let lines = m.ptx.lines().count();
            assert!(lines < MAX_PTX_LINES, "{what}: {lines} lines of PTX");
            let report =
                kiln_ptx::ptxas::check(&m.ptx, target).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(!report.spills(), "{what} spills: {report}");
        }
    }
}

/// Asserts that the compile `failures` (one message each, naming the compile) are exactly
/// the known ones: those `known` accepts are printed, any other fails, and so does a known
/// one that no longer fails when `expect_known` says some must (the list is kept in step with
/// the bug it records).
pub fn assert_only_known(failures: Vec<String>, known: impl Fn(&str) -> bool, expect_known: bool) {
    let (known, unknown): (Vec<String>, Vec<String>) = failures.into_iter().partition(|f| known(f));
    for f in &known {
        println!("known: {f}");
    }
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
    assert_eq!(
        !known.is_empty(),
        expect_known,
        "the known failures changed: {known:?}"
    );
}

/// One compile to check, run by [`run_all`].
pub type Job<'a, R> = Box<dyn FnOnce() -> R + Send + 'a>;

/// A compile check: the most registers it used, or why it failed or spilled.
pub type Check = Job<'static, Result<u32, String>>;

/// The failures of `checks`, run on every core ([`run_all`]).
pub fn failures(checks: Vec<Check>) -> Vec<String> {
    run_all(checks)
        .into_iter()
        .filter_map(Result::err)
        .collect()
}

/// Runs `jobs` on as many threads as the machine has cores and returns their results in the
/// jobs' order. A test's matrix of compiles is mostly ptxas, a process a compile, so one
/// thread left the other cores idle for minutes.
pub fn run_all<'a, R: Send>(jobs: Vec<Job<'a, R>>) -> Vec<R> {
    let count = jobs.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let queue = Mutex::new(jobs.into_iter().enumerate());
    let done = Mutex::new(Vec::with_capacity(count));
    std::thread::scope(|scope| {
        for _ in 0..threads.min(count) {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                    let Some((i, job)) = next else { break };
                    let r = job();
                    done.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}
