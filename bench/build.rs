//! Records the commit the benchmarks were built from (`KILN_COMMIT`), since the GPU host that
//! runs them has the binaries but not the repository.

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let hash = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=KILN_COMMIT={hash}{suffix}");
    // In a worktree `.git` is a file, so ask git where HEAD and the index live.
    for file in ["HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", file]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
