//! A user's own kernels, defined in this file, seen by the CLI library (`kiln::cli`) as the
//! bundled `kiln` command sees the examples: `#[kernel]` registers them, so `list`, `ir`,
//! `ptx` and `check` work on them with no list edited. The examples crate is linked too, and
//! its kernels come through the same registry.

use kiln::cli::run_args;
use kiln::ir::dsl::registry::{self, Registered};
use kiln::ir::dsl::{KernelDef, registered};
use kiln::ir::{DType, HostTensor};
use kiln::prelude::*;
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};

/// `y = max(x * s + 1, 0)` over `[M, N]` f32, any `M` and `N` (the edge tiles are masked by
/// the load and the store).
#[kernel(grid = [BM, BN, 1])]
pub fn user_scale_relu(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    s: f32,
    #[comptime(default = 32)] BM: usize,
    #[comptime(default = 64)] BN: usize,
) {
    let (r, c) = (block_id().x * BM, block_id().y * BN);
    let t = x.tile([BM, BN], [r, c]).load();
    y.tile([BM, BN], [r, c])
        .store(max(&(t * s + 1.0), &zeros::<f32>([BM, BN])));
}

/// Two kernels of one name in two modules: the CLI tells them apart by path.
mod first {
    use kiln::prelude::*;

    /// `y = x + 1`.
    #[kernel(grid = [256, 1, 1])]
    pub fn user_twin(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let i = block_id().x * 256;
        y.tile([256], [i]).store(x.tile([256], [i]).load() + 1.0);
    }
}

mod second {
    use kiln::prelude::*;

    /// `y = x * 2`.
    #[kernel(grid = [128, 1, 1])]
    pub fn user_twin(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let i = block_id().x * 128;
        y.tile([128], [i]).store(x.tile([128], [i]).load() * 2.0);
    }
}

/// `kiln ARGS..` through the library, as a user's one-line `src/bin/kiln.rs` runs it.
fn kiln(args: &[&str]) -> Result<String, String> {
    run_args(std::iter::once("kiln").chain(args.iter().copied()))
}

#[test]
fn the_registry_holds_the_users_kernels_and_the_examples_by_name() {
    let all = registered();
    let names: Vec<&str> = all.iter().map(|k| k.name()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "ordered by name");
    for name in ["user_scale_relu", "user_in_a_test_fn", "gemm", "attention"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let here = module_path!();
    let twins: Vec<String> = all
        .iter()
        .filter(|k| k.name() == "user_twin")
        .map(|k| k.path())
        .collect();
    assert_eq!(
        twins,
        [
            format!("{here}::first::user_twin"),
            format!("{here}::second::user_twin")
        ]
    );
    // The examples' list is their crate's registered kernels: none of this file's.
    let examples: Vec<&str> = all
        .iter()
        .filter(|k| k.crate_name() == "kiln_examples")
        .map(|k| k.name())
        .collect();
    let listed: Vec<&str> = kiln_examples::registry().iter().map(|k| k.name()).collect();
    assert_eq!(listed, examples);
    assert!(listed.len() >= 9 && !listed.contains(&"user_scale_relu"));
    // A kernel defined inside a function registers like any other.
    #[kernel(grid = [64, 1, 1])]
    fn user_in_a_test_fn(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let i = block_id().x * 64;
        y.tile([64], [i]).store(abs(&x.tile([64], [i]).load()));
    }
    let entry: &Registered = registry::find("user_in_a_test_fn").expect("registered");
    assert_eq!(entry.module(), here);
}

#[test]
fn list_shows_the_users_kernels_beside_the_examples() {
    let out = kiln(&["list"]).expect("kiln list");
    assert!(
        out.contains(
            "user_scale_relu\n  comptime: BM: usize = 32, BN: usize = 64\n  params:   \
             x: Tensor<f32, 2>, y: TensorMut<f32, 2>, s: f32\n"
        ),
        "{out}"
    );
    let here = module_path!();
    assert!(
        out.contains(&format!("{here}::first::user_twin\n")),
        "{out}"
    );
    assert!(
        out.starts_with("attention\n") && out.contains("\nvector_add\n"),
        "{out}"
    );
}

#[test]
fn ir_of_a_user_kernel_as_built_and_after_layout_with_defines() {
    let built = kiln(&["ir", "user_scale_relu", "--after", "build", "-D", "BM=16"]).expect("ir");
    assert!(built.starts_with("kernel user_scale_relu("), "{built}");
    assert!(built.contains("rt<f32,16x64>"), "{built}");
    assert!(
        !built.contains('#'),
        "no layouts before the layout pass:\n{built}"
    );
    let laid = kiln(&[
        "ir",
        "user_scale_relu",
        "--after",
        "layout",
        "-D",
        "BM=64",
        "-D",
        "BN=16",
    ])
    .expect("ir");
    assert!(
        laid.contains("rt<f32,64x16,#blocked"),
        "layouts after the layout pass:\n{laid}"
    );
    // The IR names the user's lines.
    assert!(
        laid.contains("// tests/tests/cli_user_kernels.rs:"),
        "{laid}"
    );
    let err = kiln(&["ir", "user_scale_relu", "-D", "BK=8"]).expect_err("no BK");
    assert!(
        err.starts_with("kernel `user_scale_relu`: no comptime parameter `BK`"),
        "{err}"
    );
}

#[test]
fn ptx_of_a_user_kernel_for_each_target() {
    for (target, flag) in [
        ("sm_80", "sm_80"),
        ("sm_90a", "sm_90a"),
        ("sm_100a", "sm_100a"),
    ] {
        let ptx = kiln(&["ptx", "user_scale_relu", "--target", flag]).expect("ptx");
        assert!(
            ptx.contains(&format!(".target {target}")) && ptx.contains(".entry user_scale_relu"),
            "{ptx}"
        );
    }
    // Twins: the name alone is ambiguous, each path picks one.
    let err = kiln(&["ptx", "user_twin"]).expect_err("two kernels");
    assert!(err.starts_with("2 kernels are named `user_twin`"), "{err}");
    let here = module_path!();
    let plus = kiln(&["ptx", &format!("{here}::first::user_twin")]).expect("first");
    let times = kiln(&["ptx", &format!("{here}::second::user_twin")]).expect("second");
    assert_ne!(plus, times);
    let err = kiln(&["ptx", "user_nope"]).expect_err("none");
    assert!(
        err.starts_with("no kernel named `user_nope`; one of: ") && err.contains("user_scale_relu"),
        "{err}"
    );
}

#[test]
fn check_assembles_a_user_kernel_with_ptxas() {
    let out = kiln(&["check", "user_scale_relu", "--target", "sm_90a"]).unwrap_or_else(|e| {
        panic!("kiln check failed (is ptxas installed? scripts/ensure-cuda-tool ptxas):\n{e}")
    });
    assert!(
        out.starts_with("user_scale_relu (sm_90a): 128 threads/block"),
        "{out}"
    );
    assert!(out.contains("spills 0 B stored / 0 B loaded"), "{out}");
    let err = kiln(&["check", "user_nope"]).expect_err("no such kernel");
    assert!(err.starts_with("no kernel named `user_nope`"), "{err}");
    let err = kiln(&["check", "user_scale_relu", "-D", "BM=x"]).expect_err("not a usize");
    assert!(err.contains("`BM` is a usize"), "{err}");
    let table = kiln(&["check", "user_scale_relu", "-D", "BM=8"]).expect("check");
    for target in ["sm_80", "sm_90a", "sm_100a"] {
        let row = table.lines().find(|l| l.starts_with(target));
        assert!(
            row.is_some_and(|r| r.contains(" 128 ") && r.contains(" 0/0 ")),
            "{target}:\n{table}"
        );
    }
}

/// The kernel the CLI inspects is the kernel that runs: the interpreter agrees with an f64
/// reference on shapes that are no multiple of the tiles.
#[test]
fn the_user_kernel_computes_its_definition() {
    let mut rng = Rng::from_env();
    for (m, n, bm, bn) in [(1, 1, 32, 64), (45, 130, 32, 64), (70, 33, 16, 32)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[m, n], DType::F32, dist);
            let s = rng.uniform(-2.0, 2.0) as f32;
            let mut y = poisoned(&[m, n], DType::F32);
            let comptime = UserScaleReluComptime { BM: bm, BN: bn };
            let grid = user_scale_relu.grid(&comptime, [m, n, 1]);
            user_scale_relu
                .interpret(&comptime, grid, &x, &mut y, s)
                .expect("interpret");
            let want: Vec<f64> = reference(&x, s);
            let case = Case {
                kernel: format!("user_scale_relu BM={bm} BN={bn}"),
                shape: format!("m={m} n={n}"),
                dist,
                seed: rng.seed(),
            };
            assert_close(&case, &y, &want, tolerance(DType::F32));
        }
    }
}

/// `max(x * s + 1, 0)` in f64 (the kernel rounds `x * s` to f32 before adding, well inside the
/// f32 tolerance).
fn reference(x: &HostTensor, s: f32) -> Vec<f64> {
    x.to_f64_vec()
        .iter()
        .map(|v| (v * f64::from(s) + 1.0).max(0.0))
        .collect()
}
