//! `KILN_DUMP=ir,ptx` on a user's kernel: a kernel defined in this file (not one of the
//! examples) compiled through the runtime has its IR after every pass and its PTX written to
//! `KILN_DUMP_DIR`, as any kernel does. The GPU test launches it with the variables set; the
//! host test writes the same files through the runtime's dump code on any machine.

mod gpu_common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gpu_common::Needs;
use kiln::ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln::ir::passes::{PASSES, applies};
use kiln::ir::{DType, HostTensor, Target};
use kiln::prelude::*;
use kiln::runtime::Device;
use kiln::runtime::dump::{DumpConfig, stem};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};

/// `y[r, :] = x[r, :] - max(x[r, :])` over `[M, N]` f32 with `N <= BN`, any `M`.
#[kernel(grid = [BM, 1, 1])]
pub fn user_dumped(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 128)] BN: usize,
) {
    let r = block_id().x * BM;
    let n = x.dim(1);
    let cols = iota([BM, BN], 1);
    let t = select(cols < n, x.tile([BM, BN], [r, 0]).load(), f32::NEG_INFINITY);
    y.tile([BM, BN], [r, 0]).store(t - row_max(&t).col());
}

fn main() -> ExitCode {
    let dir = std::env::temp_dir().join(format!("kiln-user-dump-{}", std::process::id()));
    // SAFETY: nothing else runs yet (the harness starts its threads in `run`), so no thread
    // reads the environment while it is written.
    unsafe {
        std::env::set_var("KILN_DUMP", "ir,ptx");
        std::env::set_var("KILN_DUMP_DIR", &dir);
    }
    let code = gpu_common::run(&[
        (
            "the_runtime_dump_writes_a_user_kernels_ir_and_ptx",
            Needs::Nothing,
            the_runtime_dump_writes_a_user_kernels_ir_and_ptx,
        ),
        (
            "gpu_launch_under_kiln_dump_dumps_a_user_kernel",
            Needs::Gpu,
            gpu_launch_under_kiln_dump_dumps_a_user_kernel,
        ),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    code
}

/// The directory `KILN_DUMP_DIR` names, below it `sub` (emptied).
fn dump_dir(sub: &str) -> PathBuf {
    let dir = Path::new(&std::env::var_os("KILN_DUMP_DIR").expect("set in main")).join(sub);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// What the dump of one specialisation of `user_dumped` holds in `dir`, file stem `stem`:
/// the IR as built and after every pass, and the PTX.
fn assert_dumped(dir: &Path, stem: &str, target: Target) {
    let read = |file: String| {
        std::fs::read_to_string(dir.join(&file))
            .unwrap_or_else(|e| panic!("{file} not dumped in {}: {e}", dir.display()))
    };
    let built = read(format!("{stem}.build.ir"));
    assert!(built.starts_with("kernel user_dumped("), "{built}");
    assert!(
        built.contains("// tests/tests/gpu_user_dump.rs:"),
        "the IR names the user's lines:\n{built}"
    );
    // Every pass that applies to the target (the others neither run nor dump).
    for (pass, _, _) in PASSES.iter().filter(|(p, _, _)| applies(p, target)) {
        let ir = read(format!("{stem}.{pass}.ir"));
        assert!(ir.starts_with("kernel user_dumped("), "after {pass}:\n{ir}");
    }
    let ptx = read(format!("{stem}.ptx"));
    assert!(
        ptx.contains(&format!(".target {}", target.name())) && ptx.contains(".entry user_dumped"),
        "{ptx}"
    );
}

fn the_runtime_dump_writes_a_user_kernels_ir_and_ptx() {
    let dir = dump_dir("host");
    let dump = DumpConfig::from_env();
    assert!(dump.ir && dump.ptx, "{dump:?}");
    let dump = DumpConfig {
        dir: dir.clone(),
        ..dump
    };
    let comptime = UserDumpedComptime { BM: 2, BN: 64 };
    for target in Target::ALL {
        let spec = Spec::uniform(comptime, user_dumped.signature(), true);
        let kernel = user_dumped.build(&spec).expect("builds");
        // What `Device::compile` does when it compiles: the passes' IR, then the PTX.
        dump.passes(&kernel, &spec, target).expect("IR dumped");
        let ptx = kiln::ptx::compile(&kernel, target).expect("compiles");
        dump.ptx(user_dumped.name(), &spec, target, &ptx.ptx)
            .expect("PTX dumped");
        assert_dumped(&dir, &stem(user_dumped.name(), &spec, target), target);
    }
}

fn gpu_launch_under_kiln_dump_dumps_a_user_kernel() {
    let dir = dump_dir("");
    let dev = Device::new(0)
        .expect("a GPU")
        .with_target(Target::Sm80)
        .with_disk_cache(None);
    let mut rng = Rng::from_env();
    let comptime = UserDumpedComptime { BM: 4, BN: 128 };
    for (m, n) in [(1, 1), (9, 100), (33, 128)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[m, n], DType::F32, dist);
            let y = dev.alloc(DType::F32, &[m, n]).expect("alloc");
            dev.fill_nan(&y).expect("poison");
            let grid = user_dumped.grid(&comptime, [m, 1, 1]);
            let dx = dev.upload(&x).expect("upload");
            user_dumped
                .launch(&dev, &comptime, grid, &dx, &y)
                .expect("launch");
            let case = Case {
                kernel: "user_dumped".into(),
                shape: format!("m={m} n={n}"),
                dist,
                seed: rng.seed(),
            };
            let got = y.download().expect("download");
            assert_close(&case, &got, &reference(&x), tolerance(DType::F32));
            let mut yi = poisoned(&[m, n], DType::F32);
            user_dumped
                .interpret(&comptime, grid, &x, &mut yi)
                .expect("interpret");
            assert_close(&case, &got, &yi.to_f64_vec(), tolerance(DType::F32));
        }
    }
    // One specialisation (contiguous, aligned tensors): one set of files, named by its spec.
    let spec = Spec::uniform(comptime, user_dumped.signature(), true);
    assert_dumped(
        &dir,
        &stem(user_dumped.name(), &spec, Target::Sm80),
        Target::Sm80,
    );
}

/// `x - max(row)` in f64.
fn reference(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    (0..m)
        .flat_map(|r| {
            let row = &v[r * n..(r + 1) * n];
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row.iter().map(move |x| x - max).collect::<Vec<_>>()
        })
        .collect()
}
