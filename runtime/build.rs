//! `KILN_COMPILER_FINGERPRINT`: a hash of the compiler's sources (kiln-ir and kiln-ptx beside
//! this crate in the workspace), part of the disk cache's module keys, so a module compiled by
//! another version of the passes or the PTX writer is never reused. Outside the workspace
//! (no sibling sources) the crate version alone stands for the compiler.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// Every file under `dir`, sorted.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut h = DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut h);
    for crate_dir in ["ir", "codegen-ptx"] {
        let src = root.join("..").join(crate_dir).join("src");
        println!("cargo:rerun-if-changed={}", src.display());
        let mut paths = Vec::new();
        files(&src, &mut paths);
        paths.sort();
        for p in paths {
            p.strip_prefix(&root).unwrap_or(&p).hash(&mut h);
            std::fs::read(&p).unwrap_or_default().hash(&mut h);
        }
    }
    println!(
        "cargo:rustc-env=KILN_COMPILER_FINGERPRINT={:016x}",
        h.finish()
    );
}
