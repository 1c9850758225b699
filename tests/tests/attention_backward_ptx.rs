//! Attention's backward kernels (`kiln_examples::attention_backward`) through the compiler:
//! every kernel and feature compiles for sm_80 (mma.sync and cp.async) and sm_90a (cp.async
//! and wgmma without warp roles), with its tensors 16-byte aligned and not, into PTX that ptxas assembles without
//! spills. The register counts are printed (`--nocapture`). Their numbers are checked on the
//! interpreter (`interp_attention_backward`) and on the GPU (`gpu_attention_backward`).

use kiln_examples::attention_backward::{
    AttentionBwdParams, attention_bwd_dkdv, attention_bwd_dkdv_varlen,
    attention_bwd_dkdv_varlen_used, attention_bwd_dq, attention_bwd_dq_convert,
    attention_bwd_dq_convert_varlen, attention_bwd_dq_varlen, attention_bwd_dq_varlen_used,
    attention_bwd_preprocess, attention_bwd_preprocess_varlen,
};
use kiln_ir::DType;
use kiln_ir::Target;
use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_tests::codegen::{self, Check};

/// Compiles `def` with `p` for `targets`, aligned and not: `Err` naming the first compile
/// that fails or spills, else the most registers a compile used.
fn assemble_on<D: KernelDef<Comptime = AttentionBwdParams>>(
    def: &D,
    p: AttentionBwdParams,
    targets: &[Target],
    alignments: &[bool],
) -> Result<u32, String> {
    let mut most = 0;
    for &aligned in alignments {
        let spec = Spec::uniform(p, def.signature(), aligned);
        let k = def
            .build(&spec)
            .map_err(|d| format!("{} {p:?}: {d}", def.name()))?;
        for &target in targets {
            let what = format!("{} {p:?} on {target}, aligned {aligned}", def.name());
            let m = kiln_ptx::compile(&k, target).map_err(|e| format!("{what}: {e}"))?;
            let r = kiln_ptx::ptxas::check(&m.ptx, target).map_err(|e| format!("{what}: {e}"))?;
            println!("{what}: {r}");
            if r.spills() {
                return Err(format!("{what} spills: {r}"));
            }
            most = most.max(r.registers);
        }
    }
    Ok(most)
}

/// The check of `def` with `p` ([`assemble`] on `targets`) as a job for
/// [`kiln_tests::codegen::run_all`].
fn job<D>(def: &'static D, p: AttentionBwdParams, targets: &'static [Target]) -> Check
where
    D: KernelDef<Comptime = AttentionBwdParams> + Sync,
{
    job_as(def, p, targets, &[true, false])
}

/// [`job`] with the tensors 16-byte aligned or not as `alignments` lists.
fn job_as<D>(
    def: &'static D,
    p: AttentionBwdParams,
    targets: &'static [Target],
    alignments: &'static [bool],
) -> Check
where
    D: KernelDef<Comptime = AttentionBwdParams> + Sync,
{
    Box::new(move || assemble_on(def, p, targets, alignments))
}

/// Both targets.
const BOTH: &[Target] = &[Target::Sm80, Target::Sm90a];

/// Every backward kernel (dense and varlen) of `p`, each a check on both targets.
fn all_kernels(p: AttentionBwdParams) -> Vec<Check> {
    vec![
        job(&attention_bwd_preprocess, p, BOTH),
        job(&attention_bwd_dkdv, p, BOTH),
        job(&attention_bwd_dq, p, BOTH),
        job(&attention_bwd_dq_convert, p, BOTH),
        job(&attention_bwd_preprocess_varlen, p, BOTH),
        job(&attention_bwd_dkdv_varlen, p, BOTH),
        job(&attention_bwd_dq_varlen, p, BOTH),
        job(&attention_bwd_dq_convert_varlen, p, BOTH),
    ]
}

/// The features one at a time and together, at head dims 64 and 128.
fn variants(d: usize) -> Vec<AttentionBwdParams> {
    let base = AttentionBwdParams {
        d,
        ..AttentionBwdParams::default()
    };
    vec![
        base,
        AttentionBwdParams {
            causal: true,
            ..base
        },
        AttentionBwdParams {
            dtype: DType::F16,
            kv_group: 4,
            ..base
        },
        AttentionBwdParams {
            window_left: 100,
            window_right: 30,
            ..base
        },
        AttentionBwdParams {
            softcap: 30.0,
            causal: true,
            ..base
        },
        AttentionBwdParams {
            dtype: DType::F16,
            causal: true,
            window_left: 64,
            softcap: 20.0,
            kv_group: 2,
            ..base
        },
        AttentionBwdParams {
            attention_chunk: 200,
            causal: true,
            ..base
        },
    ]
}

/// Every variant of head dim `d`, both dQ modes: the compiles that fail or spill.
fn failures(d: usize) -> Vec<String> {
    let mut checks = Vec::new();
    for p in variants(d) {
        for deterministic in [false, true] {
            checks.extend(all_kernels(AttentionBwdParams { deterministic, ..p }));
        }
    }
    codegen::failures(checks)
}

/// Asserts that no compile of `failures` failed or spilled.
fn assert_none(failures: Vec<String>) {
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn head_dim_64_assembles_without_spills() {
    assert_none(failures(64));
}

#[test]
fn head_dim_128_assembles_without_spills() {
    assert_none(failures(128));
}

#[test]
fn keys_major_dkdv_assembles_without_spills() {
    // The dense dK/dV kernel keys-major with dQ by atomics (on sm_90a a warp-specialised ring
    // staging dS for dQ), every feature variant at head dims 64 and 128, and 256 plain: no
    // compile fails or spills, on either target.
    let mut checks = Vec::new();
    let ps = variants(64)
        .into_iter()
        .chain(variants(128))
        .chain(variants(256).into_iter().take(1));
    for p in ps {
        let p = AttentionBwdParams {
            keys_major: true,
            ..p
        };
        checks.push(job(&attention_bwd_dkdv, p, BOTH));
    }
    // sm_90a with two consumer warpgroups of 64 keys at d = 128 and TMA-able tensors: dQ's
    // 64 query rows split in column blocks, one a warpgroup; every feature variant but the
    // soft-cap's (whose gradient keeps the scores: its accumulators do not fit the consumers'
    // registers, a refusal). Tensors TMA cannot read take the plain lowering, dQ's 64 rows
    // over the 8 warps as 4 x 2, every variant.
    for p in variants(128) {
        let p = AttentionBwdParams {
            keys_major: true,
            block_n: 128,
            block_m: 64,
            num_warps: 8,
            key_cols: 128,
            ..p
        };
        for aligned in [true, false] {
            if aligned && p.softcap != 0.0 {
                continue;
            }
            checks.push(Box::new(move || {
                let what = format!("attention_bwd_dkdv {p:?} on sm_90a, aligned {aligned}");
                let spec = Spec::uniform(p, attention_bwd_dkdv.signature(), aligned);
                let k = attention_bwd_dkdv.build(&spec).expect("builds");
                let m =
                    kiln_ptx::compile(&k, Target::Sm90a).unwrap_or_else(|e| panic!("{what}: {e}"));
                let r = kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).expect("assembles");
                println!("{what}: {r}");
                if r.spills() {
                    return Err(format!("{what} spills: {r}"));
                }
                Ok(r.registers)
            }));
        }
    }
    assert_none(codegen::failures(checks));
}

#[test]
fn two_warpgroups_at_d64_assemble_without_spills() {
    // sm_90a, the dense dK/dV kernel with two consumer warpgroups, 128 queries against 128
    // keys at d = 64, both ways: keys-major (the default where the ring adds dQ: 64 keys a
    // warpgroup, P^T and dS^T the register A of dV and dK, dS^T staged for dQ, each thread's
    // 32 query columns' LSE and delta read from their stage where used) and queries-major
    // (FlashAttention 3's form: 64 query rows a warpgroup, P^T and dS^T staged for dV and
    // dK, dQ from dS in registers). On a ring, dQ added in bulk. Every feature variant but
    // the soft-cap's (refused: its accumulators do not fit the consumers' registers), on
    // the ring: a call whose tensors are not all aligned takes no ring and is not given these
    // tiles (`AttentionBwdParams::tuned`'s `no_ring`).
    let mut checks = Vec::new();
    for keys_major in [true, false] {
        for p in variants(64) {
            let p = AttentionBwdParams {
                block_n: 128,
                block_m: 128,
                num_warps: 8,
                keys_major,
                ..p
            };
            if p.softcap == 0.0 {
                checks.push(job_as(&attention_bwd_dkdv, p, &[Target::Sm90a], &[true]));
            }
        }
    }
    assert_none(codegen::failures(checks));
}

#[test]
fn head_dim_96_assembles_without_spills() {
    // Every kernel, plain and with every feature (three blocks of 32 columns per key block),
    // without a single spill.
    let mut checks = Vec::new();
    for p in variants(96).into_iter().step_by(5) {
        for deterministic in [false, true] {
            checks.extend(all_kernels(AttentionBwdParams { deterministic, ..p }));
        }
    }
    assert_none(codegen::failures(checks));
}

#[test]
fn head_dim_256_assembles_without_spills() {
    // Every kernel, plain and with every feature, both dQ modes: the dK/dV kernel within
    // shared memory (its four 64-column blocks stage Q, dO, K and V in 64-column chunks, the
    // block's own chunk first, no column twice), the deterministic dQ kernel in two blocks of
    // 128 columns.
    let mut checks = Vec::new();
    for p in variants(256).into_iter().step_by(5) {
        for deterministic in [false, true] {
            checks.extend(all_kernels(AttentionBwdParams { deterministic, ..p }));
        }
    }
    assert_none(codegen::failures(checks));
}

#[test]
fn value_head_dims_and_used_lengths_assemble_without_spills() {
    // A `dv` of its own (MLA's d = 192 beside dv = 128: dK and dV in two chunks of 96 and 64
    // columns; dv wider and narrower than d) plain and with every feature, both dQ modes,
    // every kernel and the varlen kernels with used lengths (`seqused_q`, `seqused_k`), at
    // these head dims and at d = dv = 128. One compile spills, known ([`known_value_dim`]).
    let mut checks = Vec::new();
    for (d, dv) in [(192, 128), (64, 128), (128, 64), (128, 0)] {
        for p in variants(d).into_iter().step_by(5) {
            for deterministic in [false, true] {
                let p = AttentionBwdParams {
                    dv,
                    deterministic,
                    ..p
                };
                checks.extend(all_kernels(p));
                checks.push(job(&attention_bwd_dkdv_varlen_used, p, BOTH));
                checks.push(job(&attention_bwd_dq_varlen_used, p, BOTH));
            }
        }
    }
    codegen::assert_only_known(codegen::failures(checks), known_value_dim, true);
}

/// The compile known to spill, an open bug: the varlen dQ kernel at d = 128 beside dv = 64
/// with every feature (f16) on sm_80, aligned, where ptxas stops at 168 registers unasked
/// (its own occupancy choice: three blocks a multiprocessor) and spills 4 bytes; the same PTX with `.minnctapersm 1` assembles in 202
/// registers without a spill (d = dv = 128 takes 208 unasked).
fn known_value_dim(failure: &str) -> bool {
    failure.starts_with("attention_bwd_dq_varlen AttentionBwdParams { d: 128, dv: 64,")
        && failure.contains("dtype: F16")
        && failure.contains("on sm_80, aligned true spills: registers 168,")
}

#[test]
fn parameters_the_backward_does_not_compute_are_diagnostics() {
    // A head dim (of q and k, or of v) whose column chunks would miss columns, and no query
    // head per key/value head: a diagnostic naming the kernel's source line, never a panic.
    for (d, dv, kv_group) in [(80, 0, 1), (0, 0, 1), (64, 0, 0), (64, 80, 1), (128, 48, 1)] {
        let p = AttentionBwdParams {
            d,
            dv,
            kv_group,
            ..AttentionBwdParams::default()
        };
        for e in [
            attention_bwd_dkdv
                .build(&Spec::uniform(p, attention_bwd_dkdv.signature(), true))
                .err(),
            attention_bwd_preprocess
                .build(&Spec::uniform(
                    p,
                    attention_bwd_preprocess.signature(),
                    true,
                ))
                .err(),
        ] {
            let text = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.contains("attention backward:") && text.contains("attention_backward.rs"),
                "d = {d}, dv = {dv}, kv_group = {kv_group}: {text}"
            );
        }
    }
}

/// sm_90a's tiles ([`AttentionBwdParams::tuned`]: every dK/dV column in one block at d = 96
/// and 128, with two consumer warpgroups of 128 keys for a dense walk at d = 128, 128
/// columns for it at d = 256, and the rings that add dQ at d = 64 and 128) for every kernel
/// that takes them, the query-side kernels in
/// their [`AttentionBwdParams::query_tiles`], plain, causal and grouped f16, both dQ modes,
/// assemble without spills: a call's tiles with rings (dense, aligned), and its tiles without
/// (`no_ring`: packed, aligned or not, and dense unaligned).
#[test]
fn sm90a_tiles_assemble_without_spills() {
    let mut checks = Vec::new();
    for d in [64, 96, 128, 256] {
        // The variants it changes: no soft-cap, no window (those keep the defaults), at d = 64
        // only the ring that adds dQ (plain, causal, grouped; its walk's defaults measured
        // faster), and at d = 256 only a dense walk's without a group (128 columns spill in
        // the packed causal kernel and the grouped one).
        let mut changed = Vec::new();
        for p in variants(d) {
            for deterministic in [false, true] {
                for no_ring in [false, true] {
                    let p = AttentionBwdParams { deterministic, ..p };
                    let tuned = p.tuned(Target::Sm90a, no_ring);
                    if tuned != p {
                        changed.push((tuned, no_ring));
                    }
                }
            }
        }
        let want = match d {
            64 => 3,
            256 => 2,
            _ => 12,
        };
        assert_eq!(changed.len(), want, "d {d}");
        for (p, no_ring) in changed {
            let cols = if d == 256 { 128 } else { d };
            assert_eq!(p.key_cols(), cols, "{p:?}");
            let q = p.query_tiles();
            let sm90a = &[Target::Sm90a];
            let dense: &'static [bool] = if no_ring { &[false] } else { &[true] };
            checks.extend([
                job_as(&attention_bwd_preprocess, q, sm90a, dense),
                job_as(&attention_bwd_dkdv, p, sm90a, dense),
                job_as(&attention_bwd_dq, q, sm90a, dense),
                job_as(&attention_bwd_dq_convert, q, sm90a, dense),
            ]);
            if no_ring {
                checks.extend([
                    job(&attention_bwd_preprocess_varlen, q, sm90a),
                    job(&attention_bwd_dkdv_varlen, p, sm90a),
                    job(&attention_bwd_dq_varlen, q, sm90a),
                    job(&attention_bwd_dq_convert_varlen, q, sm90a),
                ]);
            }
        }
    }
    assert_none(codegen::failures(checks));
}

#[test]
fn keys_major_dk_runs_under_the_dq_bulk_add() {
    // sm_90a, two consumer warpgroups of 64 keys at d = 128: each wgmma group stays in flight
    // until an op reads it (`emit::in_flight`), and `mma_issue` moves dK's mma above dQ's
    // bulk add, so that the add waits for dQ alone (`wait_group 1`: dK still runs) and the
    // body waits for everything once, at its end. The LSE is read from its stage where the
    // softmax uses it (after both mmas' issue: not held across them), and dP is issued right
    // after the scores, both in flight under the
    // softmax (which waits for the scores alone): at the deeper register split the body then
    // takes, both products fit `occupancy`'s count. These are sm_90a's d = 128 tiles.
    let p = AttentionBwdParams::default().tuned(Target::Sm90a, false);
    assert!(
        p.keys_major && p.block_n == 128 && p.num_warps == 8,
        "{p:?}"
    );
    let spec = Spec::uniform(p, attention_bwd_dkdv.signature(), true);
    let k = attention_bwd_dkdv.build(&spec).expect("builds");
    let ptx = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles").ptx;
    // The body's ops by their source comments: the five mmas (scores, dP, dV, dQ, dK in
    // program order), the LSE load, the softmax's exp2 and dQ's add.
    let lines: Vec<&str> = ptx.lines().collect();
    let find = |needle: &str| -> Vec<usize> {
        (0..lines.len())
            .filter(|&i| lines[i].trim_start().starts_with("//") && lines[i].contains(needle))
            .collect()
    };
    let mmas = find("= mma ");
    let [s, dp, dv, dq, dk] = mmas[..] else {
        panic!("expected five mmas, found {}:\n{ptx}", mmas.len());
    };
    let (lse, exp2, add) = (
        find("= load lse")[0],
        find("= exp2 ")[0],
        find("= atomic.add")[0],
    );
    let waits = |from: usize, to: usize| -> Vec<&str> {
        lines[from..to]
            .iter()
            .filter(|l| l.contains("wgmma.wait_group"))
            .map(|l| l.trim())
            .collect()
    };
    assert!(
        s < dp && dp < lse && lse < exp2,
        "the LSE is read where the softmax uses it, after both mmas' issue"
    );
    assert!(dp < exp2, "dP is issued before the softmax");
    assert_eq!(
        waits(dp, exp2),
        ["wgmma.wait_group.sync.aligned 1;"],
        "the softmax waits for the scores alone: dP still runs"
    );
    assert!(
        ptx.contains("setmaxnreg.inc.sync.aligned.u32 240"),
        "the deeper split"
    );
    assert!(waits(dv, dq).is_empty(), "dV runs under dS's staging");
    assert!(dk < add, "dK's mma is issued before dQ's bulk add");
    assert_eq!(
        waits(dk, add),
        ["wgmma.wait_group.sync.aligned 1;"],
        "dQ's add waits for dQ alone: dK still runs"
    );
}

#[test]
fn eighty_query_rows_compute_dq_transposed_on_the_ring() {
    // sm_90a, two consumer warpgroups of 64 keys at d = 128 against 80 query rows (no whole
    // 64-row blocks of dQ): dQ^T = K^T dS^T, K's once-loaded tile read MN-major (`imm-trans-a`)
    // and dS^T staged by the consumers as an MN-major B (rows of 160 bytes: five 32-byte
    // swizzle boxes), dQ added in TMA boxes from its transposed accumulator (no exchange
    // through shared memory); plain, causal and grouped, and f16, each through ptxas.
    for (causal, kv_group, dtype) in [
        (false, 1, DType::Bf16),
        (true, 1, DType::Bf16),
        (false, 4, DType::F16),
    ] {
        let p = AttentionBwdParams {
            causal,
            kv_group,
            dtype,
            keys_major: true,
            block_n: 128,
            block_m: 80,
            num_warps: 8,
            key_cols: 128,
            ..AttentionBwdParams::default()
        };
        let spec = Spec::uniform(p, attention_bwd_dkdv.signature(), true);
        let mut k = attention_bwd_dkdv.build(&spec).expect("builds");
        let ptx = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles").ptx;
        kiln_ir::passes::run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect("lowers");
        assert!(k.schedule.sched.is_some(), "{p:?}: a ring");
        let staged: Vec<_> = k
            .schedule
            .staged
            .iter()
            .map(|s| (s.slot, s.transposed, s.buffer.row_bytes, s.buffer.span()))
            .collect();
        assert_eq!(
            staged,
            [(1, false, 160, Some(32))],
            "{p:?}: dS^T staged as B"
        );
        assert_eq!(k.schedule.scratch, None, "{p:?}: nothing exchanged");
        let boxes = k.schedule.bulk_adds.as_ref().map(|b| b.boxes.len());
        assert_eq!(boxes, Some(1), "{p:?}: dQ added in TMA boxes");
        // dQ^T's wgmmas: m64n80, A and B both transposed (the last two fields).
        let dq: Vec<&str> = ptx
            .lines()
            .filter(|l| l.contains("wgmma.mma_async") && l.contains("m64n80k16"))
            .filter(|l| l.trim_end().ends_with("1, 1;"))
            .collect();
        assert_eq!(dq.len(), 8, "{p:?}: one wgmma per k16 step of 128 keys");
        let r = kiln_ptx::ptxas::check(&ptx, Target::Sm90a).expect("assembles");
        println!("{p:?}: {r}");
    }
}
