//! The decode kernels (`kiln_examples::attention_decode`) through the compiler: every kernel
//! at every head dim (64, 96, 128, 256) and dtype (bf16, f16), dense and paged (pages holding
//! whole key blocks, read as tiles, and pages of 1 and 16 keys, gathered row by row), with
//! every mask, the soft-cap and grouped heads, compiles for sm_80 and sm_90a into PTX that
//! ptxas assembles without spills (and, on sm_90a, the driver JIT's ptxas too): any spill
//! fails. The registers of each are printed (`--nocapture`). Their
//! numbers are checked on the interpreter (`interp_attention_decode`) and on the GPU
//! (`gpu_attention_decode`).

use kiln_examples::attention_decode::{
    DecodeParams, attention_decode, attention_decode_combine, attention_decode_split,
    kv_cache_append, rotary_q,
};
use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::{DType, Target};
use kiln_ptx::ptxas::{self, Tool};
use kiln_tests::codegen::{self, Check};

/// Compiles `def` with `p` for both targets (tensors 16-byte aligned): `Err` naming the
/// compile that fails or spills, else the most registers either used.
fn assemble<D: KernelDef<Comptime = DecodeParams>>(
    def: &D,
    p: DecodeParams,
) -> Result<u32, String> {
    let spec = Spec::uniform(p, def.signature(), true);
    let k = def
        .build(&spec)
        .map_err(|d| format!("{} {p:?}: {d}", def.name()))?;
    let mut most = 0;
    for target in [Target::Sm80, Target::Sm90a] {
        let m = kiln_ptx::compile(&k, target)
            .map_err(|e| format!("{} {p:?} on {target}: {e}", def.name()))?;
        // The driver JIT's ptxas (an older release) assembles what runs on the GPU when no
        // cubin is cached; it is checked on sm_90a, where registers are tightest.
        let jit = target == Target::Sm90a && ptxas::find(Tool::JitPtxas).is_ok();
        let tools = [Some(Tool::Ptxas), jit.then_some(Tool::JitPtxas)];
        for tool in tools.into_iter().flatten() {
            let by = match tool {
                Tool::JitPtxas => "the driver JIT's ptxas",
                _ => "ptxas",
            };
            let what = format!("{} {p:?} on {target} ({by})", def.name());
            let r = ptxas::check_with(tool, &m.ptx, target).map_err(|e| format!("{what}: {e}"))?;
            println!("{what}: {r}");
            if r.spills() {
                return Err(format!("{what} spills: {r}"));
            }
            most = most.max(r.registers);
        }
    }
    Ok(most)
}

/// The attention variants of head dim `d` and `dtype`: dense and unmasked; paged by 256
/// (whole blocks per page) with GQA 8, causal, a window and a soft-cap; paged by 16 and by 1
/// (gathered rows) with GQA 4 and a two-sided window; paged by 16, causal with chunks.
fn attention_variants(d: usize, dtype: DType) -> Vec<DecodeParams> {
    let base = DecodeParams {
        d,
        dtype,
        ..DecodeParams::default()
    };
    vec![
        base,
        DecodeParams {
            page_size: 256,
            kv_group: 8,
            causal: true,
            window_left: 100,
            softcap: 30.0,
            ..base
        },
        DecodeParams {
            page_size: 16,
            kv_group: 4,
            window_left: 40,
            window_right: 3,
            ..base
        },
        DecodeParams {
            page_size: 1,
            kv_group: 4,
            softcap: 10.0,
            ..base
        },
        DecodeParams {
            page_size: 16,
            kv_group: 4,
            causal: true,
            attention_chunk: 256,
            ..base
        },
    ]
}

#[test]
fn every_decode_kernel_assembles_without_spills() {
    let mut checks: Vec<Check> = Vec::new();
    for d in [64, 96, 128, 256] {
        for dtype in [DType::Bf16, DType::F16] {
            for p in attention_variants(d, dtype) {
                checks.push(Box::new(move || assemble(&attention_decode, p)));
                checks.push(Box::new(move || assemble(&attention_decode_split, p)));
            }
            for (page_size, rotary_dim, rotary_interleaved) in
                [(0, 0, true), (16, d / 2, false), (1, d, true)]
            {
                let p = DecodeParams {
                    d,
                    dtype,
                    page_size,
                    rotary_dim,
                    rotary_interleaved,
                    ..DecodeParams::default()
                };
                checks.push(Box::new(move || assemble(&kv_cache_append, p)));
            }
            for rotary_interleaved in [false, true] {
                let p = DecodeParams {
                    d,
                    dtype,
                    rotary_dim: d,
                    rotary_interleaved,
                    causal: true,
                    ..DecodeParams::default()
                };
                checks.push(Box::new(move || assemble(&rotary_q, p)));
            }
            let p = DecodeParams {
                d,
                dtype,
                ..DecodeParams::default()
            };
            checks.push(Box::new(move || assemble(&attention_decode_combine, p)));
        }
    }
    let failures = codegen::failures(checks);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
