//! The sm_90a specialisations kiln launches, assembled by the ptxas of the GPU host's driver
//! release ([`Tool::JitPtxas`], CUDA 13.0): the driver JIT-compiles kiln's PTX as that ptxas
//! does, and it allocates registers and reports advisories unlike the pinned newer one the
//! snapshot tests use. Each must assemble with no spill and no warning or advisory (a C7519
//! injected fence, a C75xx serialised wgmma).
//!
//! The attention specialisations are those `kiln_attn` and the benchmark may launch (every
//! tile of `tile_candidates`, which `tuned_blocks` picks from) for every head dim, causal or
//! not, plain and with the features that add registers; the gemms are the tiles the
//! autotuner has chosen on the H200 (README) and the cluster and column-major variants.
//!
//! The JIT's ptxas comes from `$KILN_PTXAS_JIT`, else `.tools/cuda-jit/bin/ptxas`
//! (`scripts/ensure-cuda-tool ptxas-jit` installs it).

use kiln::ir::Target;
use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ptx::ptxas::{self, Tool};
use kiln_examples::attention::{
    attention, attention_lse, attention_varlen, attention_varlen_lse, tile_candidates,
};

/// Comptime overrides of one specialisation, as `kiln check -D` takes them.
type Defines = Vec<(String, String)>;

fn defines(pairs: &[(&str, String)]) -> Defines {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// The attention specialisations the Python package and the benchmark launch, dense and
/// varlen.
fn attention_specs() -> Vec<(&'static dyn KernelDef, Defines)> {
    let features: [&[(&str, &str)]; 3] = [
        &[],
        &[
            ("softcap", "30"),
            ("window_left", "100"),
            ("window_right", "20"),
        ],
        &[("kv_group", "2"), ("dtype", "f16")],
    ];
    let mut specs = Vec::new();
    for d in [64, 96, 128, 256] {
        for tile in tile_candidates(Target::Sm90a, d) {
            let blocks = [
                ("d", d.to_string()),
                ("block_m", tile.block_m.to_string()),
                ("block_n", tile.block_n.to_string()),
            ];
            for causal in [false, true] {
                for extra in features {
                    let mut pairs = blocks.to_vec();
                    pairs.push(("causal", causal.to_string()));
                    pairs.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
                    specs.push((&attention as &dyn KernelDef, defines(&pairs)));
                    specs.push((&attention_varlen as &dyn KernelDef, defines(&pairs)));
                }
            }
            specs.push((&attention_lse as &dyn KernelDef, defines(&blocks)));
            specs.push((&attention_varlen_lse as &dyn KernelDef, defines(&blocks)));
        }
    }
    specs
}

/// The gemm tiles `(BM, BN, BK, STAGES, CLUSTER_M, b_col_major)` checked for every gemm kernel
/// (`tuned_tile`'s four among them: 128x256 and 128x128 at 4 stages, 64x128 at 5 and 3).
const GEMM_TILES: &[(usize, usize, usize, usize, usize, bool)] = &[
    (128, 256, 64, 3, 1, false),
    (128, 256, 64, 4, 1, false),
    (128, 128, 64, 4, 1, false),
    (64, 128, 64, 4, 1, false),
    (64, 128, 64, 5, 1, false),
    (64, 128, 64, 3, 1, false),
    (192, 128, 64, 3, 1, false),
    (128, 256, 64, 3, 2, false),
    (128, 128, 64, 3, 1, true),
];

/// Every gemm kernel at [`GEMM_TILES`] (the bias-activation one with gelu, its widest
/// epilogue).
fn gemm_specs() -> Vec<(&'static dyn KernelDef, Defines)> {
    let mut specs = Vec::new();
    for name in ["gemm", "gemm_bias_act", "gemm_alpha_beta"] {
        let def = kiln_examples::find(name).expect("an example kernel");
        for &(bm, bn, bk, stages, cluster, col) in GEMM_TILES {
            // The fused epilogues' autotune space stops at 128 rows.
            if bm == 192 && name != "gemm" {
                continue;
            }
            let mut pairs = vec![
                ("BM", bm.to_string()),
                ("BN", bn.to_string()),
                ("BK", bk.to_string()),
                ("STAGES", stages.to_string()),
                ("CLUSTER_M", cluster.to_string()),
                ("b_col_major", col.to_string()),
            ];
            if name == "gemm_bias_act" {
                pairs.push(("act", "2".to_string()));
            }
            specs.push((def, defines(&pairs)));
        }
    }
    specs
}

/// Why the specialisation `defs` of `def` fails the check (a spill or a warning), if it does.
fn check((def, defs): &(&'static dyn KernelDef, Defines)) -> Option<String> {
    let what = format!("{} {defs:?}", def.name());
    let spec = Spec::from_defaults(*def, defs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let kernel = def.build(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
    let module =
        kiln::ptx::compile(&kernel, Target::Sm90a).unwrap_or_else(|e| panic!("{what}: {e}"));
    let report = ptxas::check_with(Tool::JitPtxas, &module.ptx, Target::Sm90a)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    (report.spills() || !report.warnings.is_empty()).then(|| format!("{what}: {report}"))
}

#[test]
fn launched_sm90a_specialisations_assemble_clean_on_the_drivers_ptxas() {
    if let Err(e) = ptxas::find(Tool::JitPtxas) {
        panic!("{e}");
    }
    let checks: Vec<_> = attention_specs().into_iter().chain(gemm_specs()).collect();
    // Two assemblers at a time: ptxas is single-threaded, and CI has two cores.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = checks
            .chunks(checks.len().div_ceil(2))
            .map(|chunk| scope.spawn(move || chunk.iter().filter_map(check).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a ptxas worker panicked"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "the CUDA 13.0 ptxas spills or warns on:\n{}",
        failures.join("\n")
    );
}
