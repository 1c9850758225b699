//! The sm_90a specialisations kiln launches, assembled by the ptxas of the GPU host's driver
//! release ([`Tool::JitPtxas`], CUDA 13.0), which allocates registers and reports advisories
//! unlike the pinned one of the snapshot tests: each must assemble with no spill, warning or
//! advisory (a C7519 injected fence, a C75xx serialised wgmma). Attention: every tile of
//! `tile_candidates` (which `tuned_blocks` picks from) for every head dim, causal or not, plain
//! and with the features that add registers; gemm: the autotuner's tiles on the H200 and the
//! cluster and column-major variants. The ptxas: `$KILN_PTXAS_JIT`, else
//! `.tools/cuda-jit/bin/ptxas` (`scripts/ensure-cuda-tool ptxas-jit` installs it).

mod gemm_family;

use gemm_family::Tile;
use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ir::{DType, Diagnostic, Kernel, Target};
use kiln::ptx::ptxas::{self, Tool};
use kiln_examples::attention::{
    AttentionParams, attention, attention_lse, attention_varlen, attention_varlen_lse,
    tile_candidates,
};
use kiln_examples::gemm::gemm;
use kiln_examples::gemm_epilogue::{gemm_alpha_beta, gemm_bias_act};

/// An attention kernel: they all take [`AttentionParams`].
type AttentionKernel = dyn KernelDef<Comptime = AttentionParams>;

/// One specialisation to check: a kernel and its comptime values.
#[derive(Clone, Copy, Debug)]
enum Specialisation {
    /// One of the attention kernels.
    Attention(&'static str, AttentionParams),
    /// A gemm-family kernel at a tile; `gemm_bias_act` with gelu, its widest epilogue.
    Gemm(&'static str, Tile),
}

impl Specialisation {
    /// The IR, every tensor 16-byte aligned (what the launches specialise on).
    fn build(&self) -> Result<Kernel, Diagnostic> {
        match *self {
            Specialisation::Attention(name, p) => {
                let def = attention_kernel(name);
                def.build(&Spec::uniform(p, def.signature(), true))
            }
            Specialisation::Gemm("gemm", t) => build(&gemm, t.gemm()),
            Specialisation::Gemm("gemm_bias_act", t) => build(&gemm_bias_act, t.bias_act(2)),
            Specialisation::Gemm(_, t) => build(&gemm_alpha_beta, t.alpha_beta()),
        }
    }
}

/// `def` with `comptime`, every tensor 16-byte aligned.
fn build<K: KernelDef>(def: &K, comptime: K::Comptime) -> Result<Kernel, Diagnostic> {
    def.build(&Spec::uniform(comptime, def.signature(), true))
}

/// The attention kernel called `name`.
fn attention_kernel(name: &str) -> &'static AttentionKernel {
    match name {
        "attention_lse" => &attention_lse,
        "attention_varlen" => &attention_varlen,
        "attention_varlen_lse" => &attention_varlen_lse,
        _ => &attention,
    }
}

/// The attention specialisations the Python package and the benchmark launch, dense and
/// varlen.
fn attention_specs() -> Vec<Specialisation> {
    let plain = AttentionParams::default();
    let features = [
        plain,
        AttentionParams {
            softcap: 30.0,
            window_left: 100,
            window_right: 20,
            ..plain
        },
        AttentionParams {
            kv_group: 2,
            dtype: DType::F16,
            ..plain
        },
    ];
    let mut specs = Vec::new();
    for d in [64, 96, 128, 256] {
        for tile in tile_candidates(Target::Sm90a, d) {
            let blocks = |p: AttentionParams| AttentionParams {
                d,
                block_m: tile.block_m,
                block_n: tile.block_n,
                ..p
            };
            for causal in [false, true] {
                for extra in features {
                    let p = AttentionParams {
                        causal,
                        ..blocks(extra)
                    };
                    specs.push(Specialisation::Attention("attention", p));
                    specs.push(Specialisation::Attention("attention_varlen", p));
                }
            }
            specs.push(Specialisation::Attention("attention_lse", blocks(plain)));
            specs.push(Specialisation::Attention(
                "attention_varlen_lse",
                blocks(plain),
            ));
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
fn gemm_specs() -> Vec<Specialisation> {
    let mut specs = Vec::new();
    for name in ["gemm", "gemm_bias_act", "gemm_alpha_beta"] {
        for &(bm, bn, bk, stages, cluster, col) in GEMM_TILES {
            // The fused epilogues' autotune space stops at 128 rows.
            if bm == 192 && name != "gemm" {
                continue;
            }
            let tile = Tile {
                cluster,
                ..Tile::new((bm, bn, bk, stages), col, DType::Bf16)
            };
            specs.push(Specialisation::Gemm(name, tile));
        }
    }
    specs
}

/// Why the specialisation `s` fails the check (a spill or a warning), if it does.
fn check(s: &Specialisation) -> Option<String> {
    let what = format!("{s:?}");
    let kernel = s.build().unwrap_or_else(|e| panic!("{what}: {e}"));
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
