//! The attention example's FlashAttention features (f16, sliding windows, soft-capping, head
//! dim 96) through the compiler: on sm_90a the passes find the same schedule as for the
//! default kernel (one TMA ring, the rotated loop with ping-ponging warpgroups, persistent
//! tiles, the TMA-store epilogue) and its protocol is proved; on both targets the PTX
//! assembles with `ptxas` without spills (and on sm_90a without advisories). Their numbers
//! are checked on the interpreter (`interp_attention_features`) and on the GPU
//! (`gpu_examples`).

mod ptx_examples;

use kiln_ir::passes::{PASSES, protocol_check};
use kiln_ir::tile_scheduler::TileScheduler;
use kiln_ir::{Kernel, Target};

/// Comptime overrides of one variant.
type Variant = &'static [(&'static str, &'static str)];

/// The features one at a time and together, at the head dims FlashAttention users run, with
/// the key blocks `tuned_block_n` launches on sm_90a (128 up to d = 128; d = 96 builds
/// d = 128's kernel).
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
];

/// The variants compiled for sm_80 with the kernel's own key blocks, and the spill stores
/// ptxas may report: none at d = 64; at d = 96 and 128 what the default d = 128 kernel
/// already spills (40 bytes, `ptx_snapshots`' FIXME: 192 accumulator registers per thread),
/// and not a byte more, except a window with both bounds (48 bytes, measured: its loop keeps
/// the left bound's first unmasked block live).
const SM80: &[(Variant, u32)] = &[
    (&[("dtype", "f16"), ("d", "64")], 0),
    (
        &[("window_left", "100"), ("window_right", "30"), ("d", "64")],
        0,
    ),
    (&[("window_left", "64"), ("causal", "true"), ("d", "64")], 0),
    (&[("softcap", "30"), ("d", "64")], 0),
    (
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
    (&[("dtype", "f16")], 40),
    (&[("window_left", "100"), ("window_right", "30")], 48),
    (&[("softcap", "30"), ("causal", "true")], 40),
    (&[("d", "96")], 40),
    (&[("d", "96"), ("dtype", "f16"), ("window_left", "64")], 40),
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
        let kernel = ptx_examples::build("attention", v);
        let mut k = scheduled(&kernel);
        assert_eq!(k.schedule.rings.len(), 1, "{v:?}");
        let ring = k.schedule.rings.values().next().expect("one ring");
        let o = ring.overlap.as_ref().expect("the loop is rotated");
        let turns = o.turns.expect("two warpgroups ping-pong");
        assert_eq!(turns.warpgroups, 2, "{v:?}");
        assert!(o.rescale.is_some(), "{v:?}");
        assert!(ring.persistent, "{v:?}");
        // A window's walk, like the causal one, depends on the block: longest tiles first.
        assert!(
            matches!(
                k.schedule.tiles,
                Some(TileScheduler::LongestFirst | TileScheduler::Strided)
            ),
            "{v:?}: {:?}",
            k.schedule.tiles
        );
        protocol_check::run(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{v:?}: {d}"));
        let m = kiln_ptx::compile(&kernel, Target::Sm90a).expect("compile");
        assert!(
            !m.tensor_maps.is_empty() && m.persistent,
            "{v:?}: TMA, persistent"
        );
        assert!(m.ptx.contains("rotated loop: steady state"), "{v:?}");
        let report =
            kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert!(!report.spills(), "{v:?} on sm_90a spills: {report}");
        assert!(
            report.warnings.is_empty(),
            "{v:?} on sm_90a: ptxas advisories: {report}"
        );
    }
}

#[test]
fn sm80_assembles_every_feature_without_new_spills() {
    for &(v, known) in SM80 {
        let kernel = ptx_examples::build("attention", v);
        let m = kiln_ptx::compile(&kernel, Target::Sm80).expect("compile");
        let report =
            kiln_ptx::ptxas::check(&m.ptx, Target::Sm80).unwrap_or_else(|e| panic!("{v:?}: {e}"));
        assert!(
            report.spill_store_bytes <= known && report.spill_load_bytes <= known,
            "{v:?} on sm_80 spills more than {known} bytes: {report}"
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
        let (def, spec) = kiln_examples::spec("attention", &[("softcap", cap)], true)
            .unwrap_or_else(|e| panic!("{cap}: {e}"));
        let e = def.build(&spec).expect_err("rejected");
        assert!(e.to_string().contains("softcap must be 0"), "{cap}: {e}");
    }
}
