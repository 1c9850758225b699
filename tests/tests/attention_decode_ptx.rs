//! The decode kernels (`kiln_examples::attention_decode`) through the compiler: every kernel
//! at every head dim (64, 96, 128, 256) and dtype (bf16, f16), dense and paged (pages holding
//! whole key blocks, read as tiles, and pages of 1 and 16 keys, gathered row by row), with
//! every mask, the soft-cap and grouped heads, compiles for sm_80 and sm_90a into PTX that
//! ptxas assembles without spills. The registers of each are printed (`--nocapture`). Their
//! numbers are checked on the interpreter (`interp_attention_decode`) and on the GPU
//! (`gpu_attention_decode`).

use kiln_examples::attention_decode::{
    DecodeParams, attention_decode, attention_decode_combine, attention_decode_split,
    kv_cache_append, rotary_q,
};
use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::{DType, Target};

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
        let what = format!("{} {p:?} on {target}", def.name());
        let m = kiln_ptx::compile(&k, target).map_err(|e| format!("{what}: {e}"))?;
        let r = kiln_ptx::ptxas::check(&m.ptx, target).map_err(|e| format!("{what}: {e}"))?;
        println!("{what}: {r}");
        if r.spills() {
            return Err(format!("{what} spills: {r}"));
        }
        most = most.max(r.registers);
    }
    Ok(most)
}

/// The attention variants of head dim `d` and `dtype`: dense and unmasked; paged by 256
/// (whole blocks per page) with GQA 8, causal, a window and a soft-cap; paged by 16 and by 1
/// (gathered rows) with GQA 4 and a two-sided window.
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
    ]
}

#[test]
fn every_decode_kernel_assembles_without_spills() {
    let mut failures = Vec::new();
    for d in [64, 96, 128, 256] {
        for dtype in [DType::Bf16, DType::F16] {
            for p in attention_variants(d, dtype) {
                for r in [
                    assemble(&attention_decode, p),
                    assemble(&attention_decode_split, p),
                ] {
                    match r {
                        Ok(regs) => {
                            println!("d = {d} {dtype} page {}: {regs} registers", p.page_size)
                        }
                        Err(e) => failures.push(e),
                    }
                }
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
                failures.extend(assemble(&kv_cache_append, p).err());
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
                failures.extend(assemble(&rotary_q, p).err());
            }
            let p = DecodeParams {
                d,
                dtype,
                ..DecodeParams::default()
            };
            failures.extend(assemble(&attention_decode_combine, p).err());
        }
    }
    let (known, unknown): (Vec<String>, Vec<String>) = failures.into_iter().partition(|f| known(f));
    for f in &known {
        println!("known: {f}");
    }
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
    assert_eq!(known.len(), 4, "the known spills changed: {known:?}");
}

/// The compiles known to spill, an open bug: on sm_90a at d = 128 with every feature (GQA 8,
/// pages of 256, causal, a window, a soft-cap) the `P V` product on wgmma (A in registers)
/// leaves ptxas 4 bytes short at 255 registers, in both dtypes and both forms; the queries
/// held in registers across the key loop take 32 of them, which wgmma would read from shared
/// memory once loaded A operands are staged there. A spill not listed fails the test, and so
/// does a listed one that no longer spills.
fn known(failure: &str) -> bool {
    failure.contains("d: 128,")
        && failure.contains("kv_group: 8, page_size: 256, causal: true")
        && failure.contains("on sm_90a spills: registers 255,")
        && failure.contains("spills 4 B stored")
}
