//! Every example kernel on the GPU through its typed `launch`, against the f64 reference and
//! against the CPU interpreter (typed `interpret`): several shapes including non-multiples of
//! the tiles, every input distribution (large magnitudes included), causal attention with
//! fully masked rows (sq > sk), outputs poisoned with NaN before each run, and inputs with
//! non-contiguous outer strides; views whose base or outer stride is not 16-byte aligned
//! (their own specialisation); the compile cache; and the typed GPU path's validation errors.
//! Without a GPU the tests are reported ignored, with the reason.

mod gemm_family;
mod gpu_common;

use std::sync::Arc;
use std::time::Duration;

use std::process::ExitCode;

use gemm_family::Tile;
use gpu_common::{Needs, device, upload_padded};
use kiln_examples::attention::{AttentionParams, attention};
use kiln_examples::gemm::{GemmComptime, gemm};
use kiln_examples::softmax::{SoftmaxComptime, softmax};
use kiln_examples::vector_add::vector_add;
use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor, DiskCache, LaunchError, Origin};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// A poisoned output tensor on the device.
fn output(dev: &Device, dtype: DType, shape: &[usize]) -> DeviceTensor {
    let t = dev.alloc(dtype, shape).expect("alloc");
    dev.fill_nan(&t).expect("poison");
    t
}

/// Checks the GPU result against the f64 reference and against the interpreter's result.
fn check(case: Case, dtype: DType, gpu: &DeviceTensor, reference: &[f64], interp: &HostTensor) {
    let got = gpu.download().expect("download");
    assert_close(&case, &got, reference, tolerance(dtype));
    let vs_interp = Case {
        kernel: format!("{} (GPU vs interpreter)", case.kernel),
        ..case
    };
    assert_close(&vs_interp, &got, &interp.to_f64_vec(), tolerance(dtype));
}

fn gpu_vector_add_matches_reference_and_interpreter() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    for n in [1, 1000, 1024, 4097] {
        for dist in Dist::ALL {
            let a = tensor(&mut rng, &[n], DType::F32, dist);
            let b = tensor(&mut rng, &[n], DType::F32, dist);
            let grid = [n.div_ceil(1024) as u32, 1, 1];
            let c = output(&dev, DType::F32, &[n]);
            let (da, db) = (
                dev.upload(&a).expect("upload"),
                dev.upload(&b).expect("upload"),
            );
            vector_add.launch(&dev, grid, &da, &db, &c).expect("launch");
            let mut ci = poisoned(&[n], DType::F32);
            vector_add
                .interpret(grid, &a, &b, &mut ci)
                .expect("interpret");
            let case = Case {
                kernel: "vector_add".into(),
                shape: format!("n={n}"),
                dist,
                seed: rng.seed(),
            };
            check(case, DType::F32, &c, &reference::vector_add(&a, &b), &ci);
        }
    }
}

fn gpu_softmax_matches_reference_and_interpreter() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    // (BM, BN): the defaults and a variant with a narrower column tile.
    for (bm, bn) in [(4usize, 512usize), (2, 128)] {
        for (m, n) in [(1, 1), (7, 100), (33, 513), (64, 1024)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                let c = SoftmaxComptime {
                    BM: bm,
                    BN: bn,
                    ..Default::default()
                };
                let grid = softmax.grid(&c, [m, 1, 1]);
                let dx = upload_padded(&dev, &x, 3);
                let y = output(&dev, DType::F32, &[m, n]);
                softmax.launch(&dev, &c, grid, &dx, &y).expect("launch");
                let mut yi = poisoned(&[m, n], DType::F32);
                softmax.interpret(&c, grid, &x, &mut yi).expect("interpret");
                let case = Case {
                    kernel: format!("softmax BM={bm} BN={bn}"),
                    shape: format!("m={m} n={n}, x row stride {}", n + 3),
                    dist,
                    seed: rng.seed(),
                };
                check(case, DType::F32, &y, &reference::softmax_rows(&x), &yi);
            }
        }
    }
}

fn gpu_gemm_matches_reference_and_interpreter() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    for b_col_major in [false, true] {
        for (bm, bn, bk, stages) in [(128usize, 128usize, 32usize, 3usize), (64, 64, 64, 4)] {
            for (m, n, k) in [(128, 128, 32), (130, 70, 50), (257, 129, 100)] {
                for dist in Dist::ALL {
                    let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
                    // Column-major B is passed as `b^T: [n, k]`.
                    let b_shape = if b_col_major { [n, k] } else { [k, n] };
                    let b = tensor(&mut rng, &b_shape, DType::Bf16, dist);
                    let tile = Tile::new((bm, bn, bk, stages), b_col_major, DType::Bf16).gemm();
                    let grid = gemm.grid(&tile, [m, n, 1]);
                    // `a` contiguous, `b` with padded rows: both addressing paths.
                    let (da, db) = (dev.upload(&a).expect("upload"), upload_padded(&dev, &b, 8));
                    let c = output(&dev, DType::Bf16, &[m, n]);
                    gemm.launch(&dev, &tile, grid, &da, &db, &c)
                        .expect("launch");
                    let mut ci = poisoned(&[m, n], DType::Bf16);
                    gemm.interpret(&tile, grid, &a, &b, &mut ci)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!(
                            "gemm BM={bm} BN={bn} BK={bk} STAGES={stages} b_col_major={b_col_major}"
                        ),
                        shape: format!("m={m} n={n} k={k}, b row stride {}", b_shape[1] + 8),
                        dist,
                        seed: rng.seed(),
                    };
                    let want = if b_col_major {
                        reference::gemm_bt(&a, &b)
                    } else {
                        reference::gemm(&a, &b)
                    };
                    check(case, DType::Bf16, &c, &want, &ci);
                }
            }
        }
    }
}

fn gpu_attention_matches_reference_and_interpreter() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    // (batch, heads, sq, sk, d, causal); sq > sk with causal gives fully masked rows.
    let cases = [
        (1, 2, 128, 128, 64, false),
        (2, 1, 100, 100, 64, true),
        (1, 2, 150, 90, 64, true),
        (1, 2, 150, 90, 128, true),
        (1, 1, 200, 333, 128, false),
        (1, 1, 64, 300, 128, true),
    ];
    for (b, h, sq, sk, d, causal) in cases {
        for dist in Dist::ALL {
            let q = tensor(&mut rng, &[b, h, sq, d], DType::Bf16, dist);
            let k = tensor(&mut rng, &[b, h, sk, d], DType::Bf16, dist);
            let v = tensor(&mut rng, &[b, h, sk, d], DType::Bf16, dist);
            let scale = 1.0 / (d as f32).sqrt();
            let p = AttentionParams {
                d,
                causal,
                ..AttentionParams::default()
            };
            let grid = attention.grid(&p, [sq, h, b]);
            let dq = dev.upload(&q).expect("upload");
            let dk = upload_padded(&dev, &k, 8);
            let dv = dev.upload(&v).expect("upload");
            let o = output(&dev, DType::Bf16, &[b, h, sq, d]);
            attention
                .launch(&dev, &p, grid, &dq, &dk, &dv, &o, scale)
                .expect("launch");
            let mut oi = poisoned(&[b, h, sq, d], DType::Bf16);
            attention
                .interpret(&p, grid, &q, &k, &v, &mut oi, scale)
                .expect("interpret");
            let case = Case {
                kernel: format!("attention d={d} causal={causal}"),
                shape: format!("b={b} h={h} sq={sq} sk={sk}, k row stride {}", d + 8),
                dist,
                seed: rng.seed(),
            };
            let want = reference::attention(&q, &k, &v, scale as f64, causal);
            check(case, DType::Bf16, &o, &want, &oi);
        }
    }
}

fn gpu_typed_launch_rejects_bad_arguments_by_name() {
    let Some(dev) = device() else { return };
    let (m, n, k) = (64, 32, 16);
    let a = dev.alloc(DType::Bf16, &[m, k]).expect("alloc");
    let b = dev.alloc(DType::Bf16, &[k, n]).expect("alloc");
    let c = dev.alloc(DType::Bf16, &[m, n]).expect("alloc");
    let grid = [1, 1, 1];
    // The default 128x128x32, 3-stage bf16 gemm with row-major B.
    let tile = GemmComptime {
        BK: 32,
        ..GemmComptime::default()
    };
    let launch = |grid, a, b, c| gemm.launch(&dev, &tile, grid, a, b, c);

    let f32_a = dev.alloc(DType::F32, &[m, k]).expect("alloc");
    let err = launch(grid, &f32_a, &b, &c).expect_err("dtype");
    assert!(
        matches!(
            err,
            LaunchError::DType {
                param: "a",
                expected: DType::Bf16,
                got: DType::F32
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "argument `a`: expected a bf16 tensor, got f32"
    );

    let rank3 = dev.alloc(DType::Bf16, &[1, k, n]).expect("alloc");
    let err = launch(grid, &a, &rank3, &c).expect_err("rank");
    assert!(
        matches!(
            err,
            LaunchError::Rank {
                param: "b",
                expected: 2,
                got: 3
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "argument `b`: expected a tensor of rank 2, got rank 3"
    );

    let square = dev.alloc(DType::Bf16, &[n, m]).expect("alloc");
    let transposed = square.transpose(0, 1).expect("view");
    let err = launch(grid, &a, &b, &transposed).expect_err("inner stride");
    assert!(
        matches!(
            err,
            LaunchError::InnerStride {
                param: "c",
                stride: 64
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("argument `c`: the innermost stride must be 1"),
        "{err}"
    );

    let short = dev.alloc(DType::Bf16, &[m - 1, n]).expect("alloc");
    let too_big = short.as_strided(&[m, n], &[n, 1], 0).expect("ranks agree");
    let err = launch(grid, &a, &b, &too_big).expect_err("bounds");
    assert!(
        matches!(
            err,
            LaunchError::OutOfBounds {
                param: "c",
                needed: 4096,
                available: 4032,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("needs 4096 bytes, but the allocation holds 4032"),
        "{err}"
    );

    let err = launch([1, 0, 1], &a, &b, &c).expect_err("grid");
    assert!(
        matches!(
            err,
            LaunchError::Grid {
                axis: 'y',
                got: 0,
                ..
            }
        ),
        "{err}"
    );
    dev.synchronize().expect("no launch reached the GPU");
}

fn gpu_misaligned_views_get_their_own_specialisation() {
    let Some(dev) = device() else { return };
    let mut rng = Rng::from_env();
    for dist in [Dist::Uniform, Dist::Large] {
        // vector_add on views starting one element into their allocations: base not 16-byte aligned.
        let n = 3001;
        let a = tensor(&mut rng, &[n], DType::F32, dist);
        let b = tensor(&mut rng, &[n], DType::F32, dist);
        let shifted = |t: &HostTensor| {
            let whole = output(&dev, DType::F32, &[n + 1]);
            let view = whole.narrow(0, 1, n).expect("view");
            view.copy_from_host(t).expect("copy");
            view
        };
        let (da, db) = (shifted(&a), shifted(&b));
        let c = output(&dev, DType::F32, &[n + 1])
            .narrow(0, 1, n)
            .expect("view");
        let grid = [n.div_ceil(1024) as u32, 1, 1];
        vector_add.launch(&dev, grid, &da, &db, &c).expect("launch");
        let case = Case {
            kernel: "vector_add (offset-1 views)".into(),
            shape: format!("n={n}"),
            dist,
            seed: rng.seed(),
        };
        let got = c.download().expect("download");
        assert_close(
            &case,
            &got,
            &reference::vector_add(&a, &b),
            tolerance(DType::F32),
        );

        // gemm with `b` rows 1 element apart from contiguous: outer stride not 16-byte aligned.
        let (m, nn, k) = (70, 90, 40);
        let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
        let b = tensor(&mut rng, &[k, nn], DType::Bf16, dist);
        let (da, db) = (dev.upload(&a).expect("upload"), upload_padded(&dev, &b, 1));
        let c = output(&dev, DType::Bf16, &[m, nn]);
        let tile = GemmComptime {
            BK: 32,
            ..GemmComptime::default()
        };
        gemm.launch(&dev, &tile, [1, 1, 1], &da, &db, &c)
            .expect("launch");
        let case = Case {
            kernel: "gemm (b row stride 91)".into(),
            shape: format!("m={m} n={nn} k={k}"),
            dist,
            seed: rng.seed(),
        };
        let got = c.download().expect("download");
        assert_close(
            &case,
            &got,
            &reference::gemm(&a, &b),
            tolerance(DType::Bf16),
        );
    }
}

fn gpu_compile_cache_reuses_a_specialisation() {
    let Some(dev) = device() else { return };
    let aligned = Spec::uniform((), vector_add.signature(), true);
    let first = dev.compile(&vector_add, &aligned).expect("compile");
    let again = dev.compile(&vector_add, &aligned).expect("cached");
    assert!(
        Arc::ptr_eq(&first, &again),
        "the same spec must not be compiled twice"
    );
    let unaligned = Spec {
        aligned16: Default::default(),
        ..aligned.clone()
    };
    let other = dev.compile(&vector_add, &unaligned).expect("compile");
    assert!(!Arc::ptr_eq(&first, &other), "alignment is part of the key");
    let t = first.times();
    println!(
        "vector_add: build {:?}, codegen {:?}, JIT {:?}",
        t.build, t.codegen, t.load
    );
    // A module from the disk cache (an earlier test or process made it) skips codegen.
    let from_disk = *first.origin() == Origin::DiskCache;
    assert!(t.load > Duration::ZERO && (from_disk || t.codegen > Duration::ZERO));
    assert_eq!(first.local_bytes().expect("attr"), 0, "vector_add spills");
}

fn gpu_disk_cache_loads_without_the_jit_and_rebuilds_bad_entries() {
    let Some(dev) = device() else { return };
    let dir = std::env::temp_dir().join(format!("kiln-disk-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = DiskCache::at(&dir);
    let dev = dev.with_disk_cache(Some(cache.clone()));
    kiln_ptx::ptxas::find_ptxas().expect("the disk cache keeps ptxas's cubins");
    // The compile's cost shows on attention; the cached module's result on vector_add.
    let spec = Spec::uniform(AttentionParams::default(), attention.signature(), true);
    let cold = dev.compile_from_disk(&attention, &spec).expect("cold");
    let warm = dev.compile_from_disk(&attention, &spec).expect("warm");
    assert_eq!(cold.origin(), &Origin::Ptxas);
    assert_eq!(warm.origin(), &Origin::DiskCache);
    assert_eq!(
        warm.info_log(),
        cold.info_log(),
        "the ptxas log is cached too"
    );
    let (c, w) = (cold.times(), warm.times());
    println!(
        "attention {}: cold {:?} + {:?} + ptxas {:?}; warm {:?} + {:?} + load {:?}",
        dev.target().name(),
        c.build,
        c.codegen,
        c.load,
        w.build,
        w.codegen,
        w.load
    );
    assert!(
        w.load < c.load,
        "a cached cubin loads faster than ptxas runs"
    );
    // The cached cubin is the code the driver JIT makes: no spills it would not have.
    let jit = dev.compile_uncached(&attention, &spec).expect("jit");
    assert!(!jit.from_disk_cache());
    assert_eq!(
        warm.local_bytes().expect("attr"),
        jit.local_bytes().expect("attr"),
        "cached and JIT-compiled attention use the same local memory"
    );
    // The warm start found the module the passes made, so neither they nor the PTX writer ran.
    assert!(w.codegen.is_zero(), "warm start ran the passes: {w:?}");
    // Two entries, the cubin and that module. A corrupt one is detected, rebuilt and
    // replaced, never loaded: a bad cubin is assembled again, a bad module compiled again.
    let entries = cache.entries().expect("ls");
    assert_eq!(entries.len(), 2, "{entries:?}");
    for e in &entries {
        let path = cache.dir().join(&e.name);
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x5a;
        std::fs::write(&path, &bytes).expect("corrupt");
        let rebuilt = dev.compile_from_disk(&attention, &spec).expect("rebuilt");
        if e.name.ends_with(".cubin") {
            assert!(!rebuilt.from_disk_cache(), "a corrupt cubin was loaded");
        } else {
            assert!(
                !rebuilt.times().codegen.is_zero(),
                "a corrupt module was used"
            );
        }
        let again = dev
            .compile_from_disk(&attention, &spec)
            .expect("cached again");
        assert!(again.from_disk_cache() && again.times().codegen.is_zero());
    }
    // A kernel loaded from the cache computes what the JIT's does.
    let mut rng = Rng::from_env();
    let n = 3000;
    let (a, b) = (
        tensor(&mut rng, &[n], DType::F32, Dist::Normal),
        tensor(&mut rng, &[n], DType::F32, Dist::Normal),
    );
    let (da, db) = (dev.upload(&a).expect("up"), dev.upload(&b).expect("up"));
    let vspec = Spec::uniform((), vector_add.signature(), true);
    dev.compile_from_disk(&vector_add, &vspec)
        .expect("populate");
    let loaded = dev.compile(&vector_add, &vspec).expect("from the cache");
    assert!(loaded.from_disk_cache());
    let c = output(&dev, DType::F32, &[n]);
    vector_add
        .launch(&dev, vector_add.grid(&(), [n, 1, 1]), &da, &db, &c)
        .expect("launch");
    let want = reference::vector_add(&a, &b);
    let got = c.download().expect("download");
    let case = Case {
        kernel: "vector_add from the disk cache".into(),
        shape: format!("n={n}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    assert_close(&case, &got, &want, tolerance(DType::F32));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_disk_cache_loads_without_the_jit_and_rebuilds_bad_entries",
            Needs::Gpu,
            gpu_disk_cache_loads_without_the_jit_and_rebuilds_bad_entries,
        ),
        (
            "gpu_vector_add_matches_reference_and_interpreter",
            Needs::Gpu,
            gpu_vector_add_matches_reference_and_interpreter,
        ),
        (
            "gpu_softmax_matches_reference_and_interpreter",
            Needs::Gpu,
            gpu_softmax_matches_reference_and_interpreter,
        ),
        (
            "gpu_gemm_matches_reference_and_interpreter",
            Needs::Gpu,
            gpu_gemm_matches_reference_and_interpreter,
        ),
        (
            "gpu_attention_matches_reference_and_interpreter",
            Needs::Gpu,
            gpu_attention_matches_reference_and_interpreter,
        ),
        (
            "gpu_typed_launch_rejects_bad_arguments_by_name",
            Needs::Gpu,
            gpu_typed_launch_rejects_bad_arguments_by_name,
        ),
        (
            "gpu_misaligned_views_get_their_own_specialisation",
            Needs::Gpu,
            gpu_misaligned_views_get_their_own_specialisation,
        ),
        (
            "gpu_compile_cache_reuses_a_specialisation",
            Needs::Gpu,
            gpu_compile_cache_reuses_a_specialisation,
        ),
    ])
}
