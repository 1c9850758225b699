//! The attention example's FlashAttention features (f16, sliding windows, chunks,
//! soft-capping, head dim 96) through the compiler: on sm_90a the passes find the same schedule as for the
//! default kernel (one TMA ring, the rotated loop with ping-ponging warpgroups, persistent
//! tiles, the TMA-store epilogue), its protocol is proved and its CPU execution
//! (`run_scheduled`) matches the f64 reference; on both targets the PTX assembles with
//! `ptxas` without spills (and on sm_90a without advisories). Their numbers are checked on
//! the interpreter (`interp_attention_features`) and on the GPU (`gpu_attention_features`).

mod ptx_examples;

use kiln_ir::interp::{HostArg, run_scheduled};
use kiln_ir::passes::{PASSES, protocol_check, run_pipeline};
use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::{DType, Kernel, Target};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// Comptime overrides of one variant.
type Variant = &'static [(&'static str, &'static str)];

/// The features one at a time and together, at the head dims FlashAttention users run, with the
/// key blocks of `tile_candidates` on sm_90a (128 up to d = 128; d = 96 in 96-column
/// tiles, its TMA boxes 32 columns wide).
const SM90A: &[Variant] = &[
    &[("dtype", "f16"), ("block_n", "128")],
    &[("dtype", "f16"), ("causal", "true"), ("d", "64")],
    &[
        ("window_left", "256"),
        ("window_right", "0"),
        ("block_n", "128"),
    ],
    &[
        ("window_left", "100"),
        ("window_right", "30"),
        ("d", "64"),
        ("block_n", "128"),
    ],
    &[("window_left", "-1"), ("window_right", "64")],
    &[("softcap", "30"), ("block_n", "128")],
    &[
        ("softcap", "50"),
        ("causal", "true"),
        ("d", "64"),
        ("block_n", "128"),
    ],
    &[("d", "96"), ("block_n", "128")],
    &[
        ("dtype", "f16"),
        ("d", "96"),
        ("block_n", "128"),
        ("causal", "true"),
        ("window_left", "512"),
        ("softcap", "30"),
        ("kv_group", "4"),
    ],
    &[("d", "256"), ("window_left", "1024"), ("window_right", "0")],
    &[
        ("attention_chunk", "1024"),
        ("causal", "true"),
        ("block_n", "128"),
    ],
    &[
        ("attention_chunk", "200"),
        ("window_left", "64"),
        ("d", "64"),
        ("block_n", "128"),
    ],
];

/// The variants compiled for sm_80 with the kernel's own key blocks, and the spill stores
/// ptxas may report: none at d = 64 and d = 96 (96-column tiles: 160 accumulator registers
/// per thread); at d = 128 what the default kernel already spills (40 bytes, `ptx_snapshots`'
/// FIXME: 192 accumulator registers per thread), and not a byte more, except a window with
/// both bounds (48 bytes, measured: its loop keeps the left bound's first unmasked block
/// live).
const SM80: &[(&str, Variant, u32)] = &[
    ("attention", &[("dtype", "f16"), ("d", "64")], 0),
    (
        "attention",
        &[("window_left", "100"), ("window_right", "30"), ("d", "64")],
        0,
    ),
    (
        "attention",
        &[("window_left", "64"), ("causal", "true"), ("d", "64")],
        0,
    ),
    ("attention", &[("softcap", "30"), ("d", "64")], 0),
    (
        "attention",
        &[
            ("dtype", "f16"),
            ("d", "64"),
            ("window_left", "48"),
            ("window_right", "-1"),
            ("softcap", "20"),
            ("kv_group", "2"),
        ],
        0,
    ),
    ("attention", &[("dtype", "f16")], 40),
    (
        "attention",
        &[("window_left", "100"), ("window_right", "30")],
        48,
    ),
    ("attention", &[("softcap", "30"), ("causal", "true")], 40),
    ("attention", &[("d", "96")], 0),
    (
        "attention",
        &[("d", "96"), ("dtype", "f16"), ("window_left", "64")],
        0,
    ),
    ("attention_lse", &[("d", "64"), ("window_left", "30")], 0),
    (
        "attention",
        &[("d", "64"), ("attention_chunk", "200"), ("causal", "true")],
        0,
    ),
    (
        "attention_lse",
        &[("d", "96"), ("attention_chunk", "512")],
        0,
    ),
    ("attention_lse", &[("dtype", "f16")], 40),
];

/// `kernel` after every pass but `protocol_check`, for sm_90a.
fn scheduled(kernel: &Kernel) -> Kernel {
    let mut k = kernel.clone();
    for (name, _, pass) in PASSES {
        if *name != "protocol_check" {
            pass(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{name}: {d}"));
        }
    }
    k
}

#[test]
fn sm90a_schedules_every_feature_as_the_default_kernel() {
    for v in SM90A {
        check_sm90a("attention", v);
    }
}

#[test]
fn sm90a_schedules_the_log_sum_exp_output_too() {
    // Its row-vector store beside the TMA-store epilogue.
    for v in [
        &[("block_n", "128")][..],
        &[("d", "64"), ("causal", "true"), ("block_n", "128")],
        &[
            ("dtype", "f16"),
            ("window_left", "100"),
            ("softcap", "30"),
            ("block_n", "128"),
        ],
        &[("d", "256")],
    ] {
        check_sm90a("attention_lse", v);
    }
}

/// Example `kernel` with comptime overrides `v` gets the default attention's sm_90a schedule
/// (one ring, rotated and ping-ponging, persistent, longest tiles first or strided), its
/// protocol proves, and ptxas assembles it without spills or advisories.
fn check_sm90a(kernel: &str, v: Variant) {
    let built = ptx_examples::build(kernel, v);
    let mut k = scheduled(&built);
    let s = k.schedule.sched.as_ref().expect("one schedule");
    let o = s.overlap.as_ref().expect("the loop is rotated");
    let turns = o.turns.expect("two warpgroups ping-pong");
    assert_eq!(turns.warpgroups, 2, "{kernel} {v:?}");
    assert!(o.rescale.is_some(), "{kernel} {v:?}");
    // A window's walk, like the causal one, depends on the block: longest tiles first.
    assert!(
        matches!(
            s.tiles,
            Some(TileScheduler::LongestFirst | TileScheduler::Strided)
        ),
        "{kernel} {v:?}: {:?}",
        s.tiles
    );
    protocol_check::run(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{kernel} {v:?}: {d}"));
    let m = kiln_ptx::compile(&built, Target::Sm90a).expect("compile");
    assert!(
        !m.tensor_maps.is_empty() && m.persistent,
        "{kernel} {v:?}: TMA, persistent"
    );
    assert!(
        m.ptx.contains("rotated loop: steady state"),
        "{kernel} {v:?}"
    );
    let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a)
        .unwrap_or_else(|e| panic!("{kernel} {v:?}: {e}"));
    assert!(
        !report.spills(),
        "{kernel} {v:?} on sm_90a spills: {report}"
    );
    assert!(
        report.warnings.is_empty(),
        "{kernel} {v:?} on sm_90a: ptxas advisories: {report}"
    );
}

#[test]
fn sm80_assembles_every_feature_without_new_spills() {
    for &(name, v, known) in SM80 {
        let kernel = ptx_examples::build(name, v);
        let m = kiln_ptx::compile(&kernel, Target::Sm80).expect("compile");
        let report =
            kiln_ptx::ptxas::check(&m.ptx, Target::Sm80).unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert!(
            report.spill_store_bytes <= known && report.spill_load_bytes <= known,
            "{name} {v:?} on sm_80 spills more than {known} bytes: {report}"
        );
    }
}

#[test]
fn only_a_left_bound_moves_the_walks_start() {
    // The key loop's lower bound: the constant 0 without a left bound (as for the causal
    // mask), else a block computed from the query block's first row (`max(first, 0) / bn`).
    // Which blocks the walk needs is checked on the interpreter, against the reference.
    let lower_bound = |v: Variant| {
        let text = kiln_ir::print::print_kernel(&ptx_examples::build("attention", v));
        let header = text
            .lines()
            .find(|l| l.contains(" = for "))
            .expect("key loop");
        let lo = header
            .split(" = for ")
            .nth(1)
            .and_then(|r| r.split(" to ").next())
            .and_then(|r| r.split(" = ").nth(1))
            .expect("loop bounds")
            .to_string();
        let def = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{lo} = ")))
            .expect("the bound's definition");
        def.split(" = ").nth(1).expect("op").to_string()
    };
    for v in [&[][..], &[("causal", "true")], &[("window_right", "30")]] {
        assert!(lower_bound(v).starts_with("const 0 "), "{v:?}");
    }
    for v in [
        &[("window_left", "64")][..],
        &[("window_left", "0"), ("causal", "true")],
    ] {
        assert!(lower_bound(v).starts_with("div "), "{v:?}");
    }
}

#[test]
fn bad_softcaps_are_diagnostics() {
    for cap in ["-1", "inf", "NaN"] {
        let e = kiln_examples::build("attention", &[("softcap", cap)], true).expect_err("rejected");
        assert!(e.contains("softcap must be 0"), "{cap}: {e}");
    }
}

/// One scheduled run: the variant's comptime overrides, its dtype, window (the reference's,
/// causal folded in) and cap, and `(sq, sk)`.
type ScheduledCase = (Variant, DType, (i64, i64), Option<f64>, (usize, usize));

#[test]
fn scheduled_sm90a_features_match_reference() {
    // The sm_90a schedule executed on the CPU (TMA boxes, the rotated ring, the persistent
    // tile walk over 2 CTAs, the TMA-store epilogue): a left bound starts the walk past
    // block 0, both edges mask, the cap runs between the mmas, f16 through the ring, and
    // head dim 96 through 96-column tiles of 64-byte-swizzled 32-column boxes.
    let mut rng = Rng::from_env();
    let cases: [ScheduledCase; 5] = [
        (
            &[
                ("d", "64"),
                ("block_n", "128"),
                ("window_left", "20"),
                ("window_right", "0"),
            ],
            DType::Bf16,
            (20, 0),
            None,
            (300, 300),
        ),
        (
            &[
                ("block_n", "128"),
                ("window_left", "33"),
                ("window_right", "17"),
            ],
            DType::Bf16,
            (33, 17),
            None,
            (200, 330),
        ),
        (
            &[
                ("d", "64"),
                ("block_n", "128"),
                ("softcap", "5"),
                ("causal", "true"),
            ],
            DType::Bf16,
            (-1, 0),
            Some(5.0),
            (260, 150),
        ),
        (
            &[("dtype", "f16"), ("block_n", "128"), ("causal", "true")],
            DType::F16,
            (-1, 0),
            None,
            (150, 280),
        ),
        (
            &[("d", "96"), ("block_n", "128"), ("window_right", "40")],
            DType::Bf16,
            (-1, 40),
            None,
            (300, 140),
        ),
    ];
    for (v, dtype, window, cap, (sq, sk)) in cases {
        let mut kernel = ptx_examples::build("attention", v);
        run_pipeline(&mut kernel, Target::Sm90a, &mut |_, _| {})
            .unwrap_or_else(|d| panic!("{v:?}: {d}"));
        let d = v
            .iter()
            .find(|(n, _)| *n == "d")
            .map_or(128, |(_, x)| x.parse().expect("d"));
        let (b, h) = (2, 2);
        let q = tensor(&mut rng, &[b, h, sq, d], dtype, Dist::Normal);
        let k = tensor(&mut rng, &[b, h, sk, d], dtype, Dist::Normal);
        let vt = tensor(&mut rng, &[b, h, sk, d], dtype, Dist::Normal);
        let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
        let mut o = poisoned(&[b, h, sq, d], dtype);
        let mut args = [
            HostArg::Tensor(&q),
            HostArg::Tensor(&k),
            HostArg::Tensor(&vt),
            HostArg::TensorMut(&mut o),
            HostArg::F32(scale),
        ];
        let grid = [sq.div_ceil(128) as u32, h as u32, b as u32];
        run_scheduled(&kernel, grid, 2, &mut args).unwrap_or_else(|e| panic!("{v:?}: {e}"));
        let case = Case {
            kernel: format!("scheduled attention on sm_90a {v:?}, 2 CTAs"),
            shape: format!("b={b} h={h} sq={sq} sk={sk}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        let want = reference::attention_window(&q, &k, &vt, f64::from(scale), window, cap);
        assert_close(&case, &o, &want, tolerance(dtype));
    }
}

#[test]
fn scheduled_sm90a_log_sum_exp_matches_reference() {
    // The lse row store beside the TMA-store epilogue, over the persistent walk; causal with
    // sq > sk, so rows that see no key (+inf) sit in the first tile.
    let mut rng = Rng::from_env();
    let v: Variant = &[
        ("d", "64"),
        ("block_n", "128"),
        ("causal", "true"),
        ("window_left", "50"),
    ];
    let mut kernel = ptx_examples::build("attention_lse", v);
    run_pipeline(&mut kernel, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
    let (b, h, sq, sk, d) = (2, 2, 300, 170, 64);
    let q = tensor(&mut rng, &[b, h, sq, d], DType::Bf16, Dist::Normal);
    let k = tensor(&mut rng, &[b, h, sk, d], DType::Bf16, Dist::Normal);
    let vt = tensor(&mut rng, &[b, h, sk, d], DType::Bf16, Dist::Normal);
    let scale = 0.125;
    let mut o = poisoned(&[b, h, sq, d], DType::Bf16);
    let mut lse = poisoned(&[b, h, sq], DType::F32);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&vt),
        HostArg::TensorMut(&mut o),
        HostArg::TensorMut(&mut lse),
        HostArg::F32(scale),
    ];
    let grid = [sq.div_ceil(128) as u32, h as u32, b as u32];
    run_scheduled(&kernel, grid, 2, &mut args).unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        kernel: "scheduled attention_lse on sm_90a, 2 CTAs".into(),
        shape: format!("b={b} h={h} sq={sq} sk={sk}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    let window = (50, 0);
    let want = reference::attention_window(&q, &k, &vt, f64::from(scale), window, None);
    assert_close(&case, &o, &want, tolerance(DType::Bf16));
    let want = reference::attention_lse(&q, &k, f64::from(scale), window, None);
    let got = lse.to_f64_vec();
    let blind = got
        .iter()
        .zip(&want)
        .filter(|(_, w)| w.is_infinite())
        .count();
    assert_eq!(blind, b * h * (sq - sk), "rows that see no key");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let ok = if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= 1e-4 * w.abs().max(1.0)
        };
        assert!(ok, "lse[{i}] = {g}, want {w}");
    }
}
