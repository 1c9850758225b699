//! The `kiln` command end to end: every subcommand on every example, and its errors.

use std::process::Command;

fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn list_names_every_kernel_with_its_comptime_parameters() {
    let (ok, out, _) = kiln(&["list"]);
    assert!(ok);
    for name in ["vector_add", "softmax", "gemm", "attention"] {
        assert!(
            out.contains(&format!("{name}\n")),
            "{name} missing from:\n{out}"
        );
    }
    assert!(
        out.contains("d: usize = 128, dv: usize = 0, causal: bool = false"),
        "{out}"
    );
}

#[test]
fn ir_after_each_pass_and_after_build() {
    let (ok, built, _) = kiln(&["ir", "attention", "--after", "build"]);
    assert!(ok);
    assert!(built.starts_with("kernel attention("), "{built}");
    assert!(
        !built.contains("#mma"),
        "no layouts before the layout pass:\n{built}"
    );
    let (ok, laid, _) = kiln(&["ir", "attention", "--after", "layout"]);
    assert!(ok);
    assert!(
        laid.contains("#mma"),
        "layouts after the layout pass:\n{laid}"
    );
    let (ok, _, err) = kiln(&["ir", "attention", "--after", "nonsense"]);
    assert!(!ok);
    assert!(
        err.contains("no pass named `nonsense`") && err.contains("layout"),
        "{err}"
    );
}

#[test]
fn ptx_honours_defines_and_rejects_bad_ones() {
    let (ok, d128, _) = kiln(&["ptx", "attention", "--target", "sm_80"]);
    assert!(ok);
    assert!(
        d128.contains(".target sm_80") && d128.contains(".entry attention"),
        "{d128}"
    );
    let (ok, d64, _) = kiln(&["ptx", "attention", "-D", "d=64", "-D", "causal=true"]);
    assert!(ok);
    assert_ne!(d64, d128, "d=64 causal must specialise differently");
    let (ok, _, err) = kiln(&["ptx", "attention", "-D", "heads=3"]);
    assert!(
        !ok && err.contains("no comptime parameter `heads`"),
        "{err}"
    );
    let (ok, _, err) = kiln(&["ptx", "attention", "-D", "d=x"]);
    assert!(!ok && err.contains("`d` is a usize"), "{err}");
    let (ok, _, err) = kiln(&["ptx", "gemm", "--target", "sm_75"]);
    assert!(!ok && err.contains("unknown target `sm_75`"), "{err}");
    let (ok, _, err) = kiln(&["ptx", "nope"]);
    assert!(!ok && err.contains("no kernel named `nope`"), "{err}");
}

#[test]
fn check_reports_ptxas_resources() {
    let (ok, out, err) = kiln(&["check", "vector_add", "--target", "sm_80"]);
    assert!(
        ok,
        "kiln check failed (is ptxas installed? scripts/ensure-cuda-tool ptxas):\n{err}"
    );
    assert!(out.contains("registers") && out.contains("spills"), "{out}");
}

#[test]
fn check_without_a_target_tabulates_every_target() {
    let (ok, out, err) = kiln(&["check", "gemm"]);
    assert!(
        ok,
        "kiln check failed (is ptxas installed? scripts/ensure-cuda-tool ptxas):\n{err}"
    );
    assert!(
        out.starts_with("target") && out.contains("blocks/SM"),
        "{out}"
    );
    for target in ["sm_80", "sm_90a", "sm_100a"] {
        assert!(
            out.lines().any(|l| l.starts_with(target)),
            "{target} row missing:\n{out}"
        );
    }
    // The warp-specialised sm_90a gemm: 384 threads, one block per SM.
    let sm90a = out.lines().find(|l| l.starts_with("sm_90a")).unwrap_or("");
    assert!(sm90a.contains(" 384 "), "{sm90a}");
    // The Blackwell gemm: epilogue warpgroup, TMA warp and MMA warp, assembled (not run).
    let sm100a = out.lines().find(|l| l.starts_with("sm_100a")).unwrap_or("");
    assert!(sm100a.contains(" 192 "), "{sm100a}");
}

#[test]
fn check_attention_has_its_sm100a_row() {
    let (ok, out, err) = kiln(&["check", "attention"]);
    assert!(
        ok,
        "kiln check failed (is ptxas installed? scripts/ensure-cuda-tool ptxas):\n{err}"
    );
    // The FlashAttention-4-style schedule: two softmax warpgroups, a correction warpgroup and
    // the load / MMA warpgroup, assembled without spills (not run).
    let sm100a = out.lines().find(|l| l.starts_with("sm_100a")).unwrap_or("");
    assert!(
        sm100a.contains(" 512 ") && sm100a.contains(" 0/0 "),
        "{out}"
    );
}

#[test]
fn ptx_sass_disassembles_the_assembled_kernel() {
    let (ok, out, err) = kiln(&["ptx", "attention", "--target", "sm_90a", "--sass"]);
    assert!(
        ok,
        "kiln ptx --sass failed (are ptxas and nvdisasm installed? scripts/ensure-cuda-tool):\n{err}"
    );
    // Hopper machine code: the wgmma of the rotated loop and the TMA loads.
    assert!(
        out.contains(".target\tsm_90a") || out.contains("sm_90a"),
        "{out}"
    );
    assert!(out.contains("HGMMA") && out.contains("UTMALDG"), "{out}");
}

#[test]
fn cache_ls_and_clear_work_on_the_cache_directory() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let entry = dir.join(format!("{}.cubin", "ab".repeat(32)));
    std::fs::write(&entry, b"KILNCUB1 not a real entry").expect("write");
    std::fs::write(dir.join("unrelated.txt"), b"kept").expect("write");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(args)
            .env("KILN_CACHE_DIR", &dir)
            .output()
            .expect("runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, ls) = run(&["cache", "ls"]);
    assert!(
        ok && ls.contains("1 entries") && ls.contains(".cubin"),
        "{ls}"
    );
    let (ok, cleared) = run(&["cache", "clear"]);
    assert!(ok && cleared.contains("removed 1 entries"), "{cleared}");
    assert!(!entry.exists() && dir.join("unrelated.txt").exists());
    let off = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["cache", "ls"])
        .env("KILN_CACHE_DIR", "off")
        .output()
        .expect("runs");
    assert!(!off.status.success());
    assert!(String::from_utf8_lossy(&off.stderr).contains("the disk cache is off"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
