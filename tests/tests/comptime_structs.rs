//! The comptime structs `#[kernel]` and `#[comptime]` generate: equality and hashing by bits
//! (an `f32` by its bits, so `-0.0` and `0.0` are two specialisations, both as the in-memory
//! compile cache's `Spec` keys and in the text key of dumps and autotuning), the autotuner's
//! candidates as structs, `-D` text parsed into them in one place, the declared defaults, and
//! the grid functions `grid = [..]` declares.

use std::collections::HashSet;

use kiln::ir::dsl::{Comptime, ComptimeValue, DefineError, KernelDecl, KernelDef, Spec};
use kiln::prelude::*;
use kiln_examples::attention::{AttentionParams, attention, attention_varlen};
use kiln_examples::gemm::{GemmComptime, gemm};

/// A tuned `usize`, a tuned `bool` and an `f32`.
#[comptime]
struct Tiles {
    #[comptime(default = 0, tune = [64, 128])]
    bn: usize,
    #[comptime(default = false, tune = [false, true])]
    fast: bool,
    #[comptime(default = 0.0)]
    cap: f32,
}

#[test]
fn candidates_cover_every_combination_of_the_tuned_fields() {
    let base = Tiles {
        bn: 0,
        fast: false,
        cap: 30.0,
    };
    let keys: Vec<String> = base.tuning_candidates().iter().map(Comptime::key).collect();
    assert_eq!(
        keys,
        [
            "bn=64,fast=false,cap=30.0",
            "bn=64,fast=true,cap=30.0",
            "bn=128,fast=false,cap=30.0",
            "bn=128,fast=true,cap=30.0"
        ]
    );
}

#[test]
fn an_f32_field_counts_by_its_bits() {
    let at = |cap| Tiles {
        bn: 64,
        fast: false,
        cap,
    };
    assert_ne!(at(0.0), at(-0.0));
    assert_eq!(at(f32::NAN), at(f32::NAN));
    // The cache key: a launch's Spec, hashed and compared as the struct.
    let soft = |softcap| {
        let p = AttentionParams {
            softcap,
            ..AttentionParams::default()
        };
        Spec::uniform(p, attention.signature(), true)
    };
    let (zero, negative_zero) = (soft(0.0), soft(-0.0));
    assert_ne!(zero, negative_zero);
    let specs: HashSet<_> = [zero.clone(), negative_zero.clone(), soft(0.0)].into();
    assert_eq!(specs.len(), 2, "-0.0 and 0.0 are two specialisations");
    // The text key of dumps and autotuning records.
    assert_ne!(zero.key(), negative_zero.key());
    assert!(
        negative_zero.key().contains("softcap=-0.0"),
        "{}",
        negative_zero.key()
    );
}

#[test]
fn values_round_trip_and_refuse_other_kinds() {
    use ComptimeValue as V;
    let t = Tiles {
        bn: 1,
        fast: true,
        cap: 2.0,
    };
    assert_eq!(t.values(), [V::Usize(1), V::Bool(true), V::F32(2.0)]);
    assert_eq!(Tiles::from_values(&t.values()), Some(t));
    assert_eq!(
        Tiles::from_values(&[V::Usize(1), V::I32(1), V::F32(2.0)]),
        None
    );
    assert_eq!(Tiles::from_values(&[V::Usize(1)]), None);
    let names: Vec<&str> = Tiles::PARAMS.iter().map(|p| p.name).collect();
    assert_eq!(names, ["bn", "fast", "cap"]);
}

#[test]
fn defines_parse_into_the_struct_over_defaults_or_a_base() {
    let defines = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(Tiles::from_defines(&[]), Ok(Tiles::default()));
    let t = Tiles::from_defines(&defines(&[("cap", "-0.0"), ("bn", "64")])).expect("valid");
    assert_eq!(
        (t.bn, t.fast, t.cap.to_bits()),
        (64, false, (-0.0f32).to_bits())
    );
    let over = t
        .with_defines(&defines(&[("fast", "true")]))
        .expect("valid");
    assert_eq!(over, Tiles { fast: true, ..t });
    assert_eq!(
        Tiles::from_defines(&defines(&[("bn", "-1")])),
        Err(DefineError::BadValue {
            name: "bn",
            kind: kiln::ir::dsl::ComptimeKind::Usize,
            text: "-1".into()
        })
    );
    let unknown = Tiles::from_defines(&defines(&[("block_n", "64")])).expect_err("unknown");
    assert_eq!(
        unknown.to_string(),
        "no comptime parameter `block_n`; the parameters are: bn, fast, cap"
    );
}

#[test]
fn kernels_generate_their_struct_with_the_declared_defaults() {
    let g = GemmComptime::default();
    assert_eq!(
        (
            g.CLUSTER_M,
            g.BM,
            g.BN,
            g.BK,
            g.STAGES,
            g.b_col_major,
            g.dtype
        ),
        (1, 128, 128, 64, 3, false, DType::Bf16)
    );
    let names: Vec<&str> = gemm.comptime_params().iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "CLUSTER_M",
            "BM",
            "BN",
            "BK",
            "STAGES",
            "b_col_major",
            "dtype"
        ]
    );
    // The four attention kernels share one struct, and so its parameters.
    assert_eq!(attention.comptime_params(), AttentionParams::PARAMS);
    assert_eq!(attention_varlen.comptime_params(), AttentionParams::PARAMS);
}

#[test]
fn grid_functions_tile_the_problem_as_declared() {
    // gemm: `grid = [BM, BN, 1]`.
    let g = GemmComptime {
        BM: 64,
        ..GemmComptime::default()
    };
    assert_eq!(gemm.grid(&g, [1000, 300, 1]), [16, 3, 1]);
    // attention: `grid = [block_m, 1, 1]` over `[sq, heads, batch]`.
    let p = AttentionParams {
        block_m: 192,
        ..AttentionParams::default()
    };
    assert_eq!(attention.grid(&p, [1000, 8, 2]), [6, 8, 2]);
    // A zero tile gives a zero grid, which a launch refuses, rather than a division panic.
    let zero = AttentionParams { block_m: 0, ..p };
    assert_eq!(attention.grid(&zero, [1000, 8, 2]), [0, 8, 2]);
    // vector_add: `grid = [1024, 1, 1]`, no comptime values.
    let va = kiln_examples::vector_add::vector_add;
    assert_eq!(va.grid(&(), [3000, 1, 1]), [3, 1, 1]);
}
