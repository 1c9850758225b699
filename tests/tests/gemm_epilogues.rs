//! The fused-epilogue GEMMs of `kiln_examples::gemm_epilogue` (`gemm_bias_act`,
//! `gemm_alpha_beta`) on the CPU: the interpreter against the f64 reference for every
//! activation, shapes that are not tile multiples, every input distribution, row- and
//! column-major B and outputs poisoned with NaN; their sm_80 and sm_90a PTX assembled by
//! ptxas without spills (sm_90a also without advisories, and scheduled as the gemm is: TMA
//! ring, persistent tiles, TMA-store epilogue); IR and PTX snapshots of their defaults.

mod gemm_family;

use gemm_family::Tile;
use kiln_examples::gemm::{GemmComptime, gemm};
use kiln_examples::gemm_epilogue::{gemm_alpha_beta, gemm_bias_act};
use kiln_ir::Target;
use kiln_ir::dsl::{AnyKernelDef, Comptime, ComptimeValue, KernelDecl, KernelDef, Spec};
use kiln_ir::interp::{HostArg, run_def};
use kiln_ir::passes::run_pipeline;
use kiln_ir::print::print_kernel;
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, as_stored, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor, with_row_padding};
use kiln_tests::reference::{self, Activation};

/// `(m, n, k)`: non-multiples of the 128 x 128 x 64 tile (and of the small tile below), K
/// shorter than one ring stage, and one element.
const SHAPES: [(usize, usize, usize); 3] = [(130, 70, 50), (257, 129, 100), (1, 1, 1)];

/// `(BM, BN, BK, STAGES)`: the defaults, and a small tile that gives the shapes above
/// several blocks in both dimensions and several trips of the ring.
const TILES: [(usize, usize, usize, usize); 2] = [(128, 128, 64, 3), (128, 64, 32, 4)];

/// The element types the kernels are tested in.
const DTYPES: [DType; 2] = [DType::Bf16, DType::F16];

/// `(alpha, beta)` pairs: general, negative, and each term alone.
const ALPHA_BETA: [(f32, f32); 3] = [(0.75, -1.25), (1.0, 0.0), (0.0, 2.0)];

/// Random `a: [m, k]` and `b` (`[k, n]`, or `[n, k]` holding B column-major) of `dtype`,
/// normal inputs read through padded rows, and the f64 `a @ B`.
fn operands(
    rng: &mut Rng,
    (m, n, k): (usize, usize, usize),
    b_col_major: bool,
    dtype: DType,
    dist: Dist,
) -> (HostTensor, HostTensor, Vec<f64>) {
    let pad = |t: HostTensor, p| {
        if dist == Dist::Normal {
            with_row_padding(&t, p)
        } else {
            t
        }
    };
    let a = pad(tensor(rng, &[m, k], dtype, dist), 3);
    let b_shape = if b_col_major { [n, k] } else { [k, n] };
    let b = pad(tensor(rng, &b_shape, dtype, dist), 5);
    let ab = if b_col_major {
        reference::gemm_bt(&a, &b)
    } else {
        reference::gemm(&a, &b)
    };
    (a, b, ab)
}

/// Every variant the interpreter tests run, `(tile, b_col_major)`: both B layouts on the
/// default tile, the small tile with row-major B.
fn variants() -> [((usize, usize, usize, usize), bool); 3] {
    [(TILES[0], false), (TILES[0], true), (TILES[1], false)]
}

fn grid(m: usize, n: usize, (bm, bn, _, _): (usize, usize, usize, usize)) -> [u32; 3] {
    [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1]
}

/// The plain gemm in each dtype (its bf16 default is also in `interp_examples`): one source,
/// `f16` through the comptime `dtype`.
#[test]
fn gemm_matches_reference_in_each_dtype() {
    let mut rng = Rng::from_env();
    for dtype in DTYPES {
        for (tile, b_col_major) in variants() {
            let ct = Tile::new(tile, b_col_major, dtype).gemm();
            for (m, n, k) in SHAPES {
                for dist in Dist::ALL {
                    let (a, b, ab) = operands(&mut rng, (m, n, k), b_col_major, dtype, dist);
                    let mut c = poisoned(&[m, n], dtype);
                    let mut args = [
                        HostArg::Tensor(&a),
                        HostArg::Tensor(&b),
                        HostArg::TensorMut(&mut c),
                    ];
                    run_def(&gemm, &ct, grid(m, n, tile), &mut args).unwrap();
                    let case = Case {
                        kernel: format!("gemm<{dtype}, tile={tile:?}, b_col_major={b_col_major}>"),
                        shape: format!("m={m} n={n} k={k}"),
                        dist,
                        seed: rng.seed(),
                    };
                    assert_close(&case, &c, &ab, tolerance(dtype));
                }
            }
        }
    }
}

/// A tensor of another dtype than the specialisation's is refused by the interpreter (the
/// launch validates against the specialised signature the same way).
#[test]
fn a_tensor_of_another_dtype_is_refused() {
    let ct = Tile::new(TILES[0], false, DType::F16).gemm();
    let a = HostTensor::full(&[4, 4], DType::Bf16, 1.0);
    let b = HostTensor::full(&[4, 4], DType::F16, 1.0);
    let mut c = poisoned(&[4, 4], DType::F16);
    let mut args = [
        HostArg::Tensor(&a),
        HostArg::Tensor(&b),
        HostArg::TensorMut(&mut c),
    ];
    let err = run_def(&gemm, &ct, [1, 1, 1], &mut args).expect_err("bf16 `a` for f16 gemm");
    assert!(
        err.to_string()
            .contains("expected a f16 tensor, found bf16"),
        "{err}"
    );
}

#[test]
fn bias_act_matches_reference() {
    let mut rng = Rng::from_env();
    for dtype in DTYPES {
        for (tile, b_col_major) in variants() {
            for (act_no, act) in Activation::ALL.into_iter().enumerate() {
                let ct = Tile::new(tile, b_col_major, dtype).bias_act(act_no);
                for (m, n, k) in SHAPES {
                    for dist in Dist::ALL {
                        let (a, b, ab) = operands(&mut rng, (m, n, k), b_col_major, dtype, dist);
                        let bias = tensor(&mut rng, &[n], dtype, dist);
                        let mut c = poisoned(&[m, n], dtype);
                        let mut args = [
                            HostArg::Tensor(&a),
                            HostArg::Tensor(&b),
                            HostArg::Tensor(&bias),
                            HostArg::TensorMut(&mut c),
                        ];
                        run_def(&gemm_bias_act, &ct, grid(m, n, tile), &mut args).unwrap();
                        let case = Case {
                            kernel: format!(
                                "gemm_bias_act<{dtype}, act={act:?}, tile={tile:?}, b_col_major={b_col_major}>"
                            ),
                            shape: format!("m={m} n={n} k={k}"),
                            dist,
                            seed: rng.seed(),
                        };
                        let want = reference::bias_act(&ab, &bias, act);
                        let tol = reference::bias_act_tolerance(
                            (&a, &b, b_col_major),
                            &ab,
                            &bias,
                            act,
                            dtype,
                        );
                        assert_close(&case, &c, &as_stored(&want, dtype), tol);
                    }
                }
            }
        }
    }
}

#[test]
fn alpha_beta_matches_reference() {
    let mut rng = Rng::from_env();
    for dtype in DTYPES {
        for (tile, b_col_major) in variants() {
            let ct = Tile::new(tile, b_col_major, dtype).alpha_beta();
            for (m, n, k) in SHAPES {
                for dist in Dist::ALL {
                    for (alpha, beta) in ALPHA_BETA {
                        let (a, b, ab) = operands(&mut rng, (m, n, k), b_col_major, dtype, dist);
                        // Normal inputs read `c` through padded rows too.
                        let c = tensor(&mut rng, &[m, n], dtype, dist);
                        let c = if dist == Dist::Normal {
                            with_row_padding(&c, 7)
                        } else {
                            c
                        };
                        let mut d = poisoned(&[m, n], dtype);
                        let mut args = [
                            HostArg::Tensor(&a),
                            HostArg::Tensor(&b),
                            HostArg::Tensor(&c),
                            HostArg::TensorMut(&mut d),
                            HostArg::F32(alpha),
                            HostArg::F32(beta),
                        ];
                        run_def(&gemm_alpha_beta, &ct, grid(m, n, tile), &mut args).unwrap();
                        let case = Case {
                            kernel: format!(
                                "gemm_alpha_beta<{dtype}, alpha={alpha}, beta={beta}, tile={tile:?}, b_col_major={b_col_major}>"
                            ),
                            shape: format!("m={m} n={n} k={k}"),
                            dist,
                            seed: rng.seed(),
                        };
                        let want =
                            reference::alpha_beta(&ab, &c, f64::from(alpha), f64::from(beta));
                        assert_close(&case, &d, &as_stored(&want, dtype), tolerance(dtype));
                    }
                }
            }
        }
    }
}

#[test]
fn an_unknown_activation_is_a_diagnostic() {
    let spec = Spec::new(Tile::new(TILES[0], false, DType::Bf16).bias_act(4));
    let err = gemm_bias_act.build(&spec).expect_err("act = 4 builds");
    let text = err.to_string();
    assert!(
        text.contains("`act` must be 0 (none), 1 (relu), 2 (gelu) or 3 (silu)"),
        "{text}"
    );
}

/// sm_90a variants at 256 columns, through ptxas only: beside the 128-register accumulator
/// their epilogue runs on chunks of its columns (`epilogue_columns`), the gemm's whole.
const SM90A_WIDE: &[(&str, &dyn AnyKernelDef, Overrides, Option<u32>)] = &[
    ("gemm_bn256", &gemm, &[("BN", "256")], None),
    (
        "gemm_bias_act_bn256",
        &gemm_bias_act,
        &[("BN", "256")],
        Some(64),
    ),
    (
        "gemm_bias_act_relu_bn256",
        &gemm_bias_act,
        &[("BN", "256"), ("act", "1")],
        Some(64),
    ),
    (
        "gemm_bias_act_gelu_bn256",
        &gemm_bias_act,
        &[("BN", "256"), ("act", "2")],
        Some(64),
    ),
    (
        "gemm_bias_act_silu_bn256",
        &gemm_bias_act,
        &[("BN", "256"), ("act", "3")],
        Some(64),
    ),
    (
        "gemm_bias_act_gelu_bn256_cluster",
        &gemm_bias_act,
        &[("BN", "256"), ("act", "2"), ("CLUSTER_M", "2")],
        Some(64),
    ),
    (
        "gemm_alpha_beta_bn256",
        &gemm_alpha_beta,
        &[("BN", "256")],
        Some(64),
    ),
];

/// Comptime values, as `-D NAME=VALUE` pairs (the tables mix three comptime structs).
type Overrides = &'static [(&'static str, &'static str)];

/// `(name, kernel, comptime overrides, snapshot)`: the defaults of both kernels with
/// snapshots; the other activations, column-major B and f16 through ptxas only (their PTX
/// differs from a snapshotted one by a few lines).
const VARIANTS: &[(&str, &dyn AnyKernelDef, Overrides, bool)] = &[
    ("gemm_bias_act", &gemm_bias_act, &[], true),
    ("gemm_bias_act_relu", &gemm_bias_act, &[("act", "1")], false),
    ("gemm_bias_act_gelu", &gemm_bias_act, &[("act", "2")], false),
    ("gemm_bias_act_silu", &gemm_bias_act, &[("act", "3")], false),
    ("gemm_alpha_beta", &gemm_alpha_beta, &[], true),
    (
        "gemm_alpha_beta_bcol",
        &gemm_alpha_beta,
        &[("b_col_major", "true")],
        false,
    ),
    ("gemm_f16", &gemm, &[("dtype", "f16")], false),
    (
        "gemm_bias_act_gelu_f16",
        &gemm_bias_act,
        &[("act", "2"), ("dtype", "f16")],
        false,
    ),
    (
        "gemm_alpha_beta_f16",
        &gemm_alpha_beta,
        &[("dtype", "f16")],
        false,
    ),
];

/// `def` at its defaults with `overrides`, every tensor 16-byte aligned.
fn build(def: &dyn AnyKernelDef, overrides: &[(&str, &str)]) -> kiln_ir::Kernel {
    def.build_defines(&kiln_examples::owned(overrides), true)
        .unwrap_or_else(|e| panic!("{} does not build: {e}", def.name()))
}

/// Snapshots (where asked) of the IR after every pass and of the PTX, for `target`, and
/// the PTX assembled by ptxas without spills (and on sm_90a without advisories).
fn check_target(target: Target, suffix: &str) {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    let under = |sub: &str| {
        let mut s = insta::Settings::clone_current();
        s.set_snapshot_path(format!("../snapshots/{sub}"));
        s.set_prepend_module_to_snapshot(false);
        s
    };
    for &(name, def, overrides, snapshot) in VARIANTS {
        let kernel = build(def, overrides);
        if snapshot {
            let mut k = kernel.clone();
            let mut dumps = Vec::new();
            run_pipeline(&mut k, target, &mut |pass, k| {
                dumps.push((pass.to_string(), print_kernel(k)))
            })
            .expect("pipeline");
            for (pass, text) in dumps {
                under("ir")
                    .bind(|| insta::assert_snapshot!(format!("{name}{suffix}@{pass}"), text));
            }
        }
        let m = kiln_ptx::compile(&kernel, target).expect("compile");
        if snapshot {
            under("ptx").bind(|| insta::assert_snapshot!(format!("{name}@{target}"), m.ptx));
        }
        let report =
            kiln_ptx::ptxas::check(&m.ptx, target).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!report.spills(), "{name} on {target} spills: {report}");
        if target == Target::Sm90a {
            assert!(!m.tensor_maps.is_empty(), "{name}: TMA on sm_90a");
            assert!(
                report.warnings.is_empty(),
                "{name} on sm_90a: ptxas advisories (wgmma serialisation?): {report}"
            );
        }
    }
}

#[test]
fn sm80_ptx_assembles_without_spills() {
    check_target(Target::Sm80, "");
}

#[test]
fn sm90a_ptx_assembles_clean() {
    check_target(Target::Sm90a, "@sm_90a");
}

/// The sm_90a IR of `def` with `overrides` after the `tma_store` pass, the last that
/// schedules the epilogue.
fn after_tma_store(def: &dyn AnyKernelDef, overrides: &[(&str, &str)]) -> String {
    let mut k = build(def, overrides);
    let mut after = String::new();
    run_pipeline(&mut k, Target::Sm90a, &mut |pass, k| {
        if pass == "tma_store" {
            after = print_kernel(k);
        }
    })
    .expect("pipeline");
    after
}

/// At 256 columns the fused epilogues run on chunks of the accumulator's columns, as the IR
/// after `tma_store` says, and assemble for sm_90a without spills or advisories; the plain
/// gemm's copy-convert-store runs whole.
#[test]
fn sm90a_wide_epilogues_run_in_column_chunks_without_spills() {
    for &(name, def, overrides, columns) in SM90A_WIDE {
        let after = after_tma_store(def, overrides);
        let line = after.lines().find(|l| l.contains("    epilogue on "));
        let expected = columns.map(|c| format!("epilogue on {c} accumulator columns at a time"));
        match (line, &expected) {
            (Some(l), Some(e)) => assert!(l.contains(e.as_str()), "{name}: {l}"),
            (None, None) => {}
            _ => panic!("{name}: expected {expected:?}, the IR says {line:?}"),
        }
        let m = kiln_ptx::compile(&build(def, overrides), Target::Sm90a).expect("compile");
        let report =
            kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !report.spills() && report.warnings.is_empty(),
            "{name} on sm_90a: {report}"
        );
    }
}

/// The sm_90a schedule the gemm gets, found in the IR after the last schedule pass: a TMA
/// ring, warp specialisation, persistent tiles, and the epilogue stored through shared
/// memory by TMA.
#[test]
fn sm90a_schedules_each_epilogue_as_the_gemm() {
    for &(name, def, overrides, _) in VARIANTS {
        let after = after_tma_store(def, overrides);
        for line in [
            "sched op",
            "tiles: persistent CTAs",
            "role consumer: warps 0..8 (2 replicas)",
            "role producer: warps 8..12",
            "store op",
        ] {
            assert!(
                after.contains(line),
                "{name}: no `{line}` after tma_store:\n{after}"
            );
        }
    }
}

/// The comptime element type: declared as the parameter's name (what `kiln list` prints),
/// resolved per specialisation (what a launch validates against), parsed from `-D`.
#[test]
fn a_comptime_dtype_names_the_element_type() {
    use kiln_ir::dsl::{ComptimeKind, ParamSig, specialise};
    let declared: Vec<String> = gemm.signature().iter().map(ToString::to_string).collect();
    assert_eq!(
        declared,
        [
            "a: Tensor<dtype, 2>",
            "b: Tensor<dtype, 2>",
            "c: TensorMut<dtype, 2>"
        ]
    );
    let dtype = gemm.comptime_params().iter().find(|p| p.name == "dtype");
    assert_eq!(
        dtype.map(|p| (p.kind, p.default)),
        Some((ComptimeKind::DType, Some(ComptimeValue::DType(DType::Bf16))))
    );
    assert_eq!(
        ComptimeValue::parse(ComptimeKind::DType, "f16"),
        Some(ComptimeValue::DType(DType::F16))
    );
    assert_eq!(ComptimeValue::parse(ComptimeKind::DType, "f64"), None);
    let ct = Tile::new(TILES[0], false, DType::F16).alpha_beta();
    let resolved = specialise(gemm_alpha_beta.signature(), &ct);
    let dtypes: Vec<Option<DType>> = resolved
        .iter()
        .map(|p| match p {
            ParamSig::Tensor {
                dtype, dtype_param, ..
            } => {
                assert_eq!(*dtype_param, None, "{p}");
                Some(*dtype)
            }
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    let h = Some(DType::F16);
    assert_eq!(dtypes, [h, h, h, h, None, None]);
    assert_eq!(resolved[4].to_string(), "alpha: f32");
    let bad = GemmComptime::from_defines(&[("dtype".into(), "f64".into())]);
    assert_eq!(
        bad.map(|_| ()).map_err(|e| e.to_string()),
        Err("comptime parameter `dtype` is a DType, and `f64` is not one".to_string())
    );
}
