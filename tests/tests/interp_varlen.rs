//! Single-launch variable-length attention (`attention_varlen`, `attention_varlen_lse`) on the
//! CPU interpreter and on the CPU execution of its sm_90a and sm_100a schedules, against the
//! f64 reference of each sequence alone: odd lengths, zero-length sequences (no query, no
//! key, neither), `sq != sk` both ways, causal rows that see no key, windows, soft-caps,
//! grouped heads, f16, the log-sum-exp, every input distribution, poisoned outputs whose
//! padding rows no block may write. Then the two ops it is built on, `load_scalar` and the
//! bounded store, on their edges, and offsets of any value (decreasing, past the tensors, too
//! few), which must never reach outside a tensor.

mod ptx_examples;
mod varlen_params;

use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ir::interp::{HostArg, run_def, run_scheduled};
use kiln::ir::passes::run_pipeline;
use kiln::ir::sched::RoleKind;
use kiln::ir::{DType, HostTensor, Kernel, Target, TensorData};
use kiln::prelude::*;
use kiln_examples::attention::{AttentionParams, BLOCK_M, attention_varlen, attention_varlen_lse};
use kiln_tests::check::poisoned;
use kiln_tests::inputs::{Dist, Rng};
use kiln_tests::varlen::{Packed, Varlen, bhsd, packed};

/// Runs `c` on `packed_inputs` with the kernel `def` on the interpreter (`kernel: None`) or
/// the scheduled `kernel` on `ctas` CTAs, `block` = `(block_n, block_m)`; returns `o` and the
/// log-sum-exp when `lse`.
fn run(
    c: &Varlen,
    p: &Packed,
    scheduled: Option<(&Kernel, u32)>,
    (block_n, block_m): (usize, usize),
    lse: bool,
) -> (HostTensor, Option<HostTensor>) {
    let (o, mut l) = c.outputs();
    let (q, k, v, mut o) = (bhsd(&p.q), bhsd(&p.k), bhsd(&p.v), bhsd(&o));
    let mut args = vec![
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut o),
    ];
    if lse {
        args.push(HostArg::TensorMut(&mut l));
    }
    args.extend([
        HostArg::Tensor(&p.cu_q),
        HostArg::Tensor(&p.cu_k),
        HostArg::F32(p.scale),
    ]);
    let grid = c.grid(block_m);
    let def: &dyn KernelDef<Comptime = AttentionParams> = if lse {
        &attention_varlen_lse
    } else {
        &attention_varlen
    };
    match scheduled {
        Some((kernel, ctas)) => run_scheduled(kernel, grid, ctas, &mut args),
        None => run_def(
            def,
            &varlen_params::params(c, block_n, block_m),
            grid,
            &mut args,
        ),
    }
    .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    drop(args);
    (packed(o), lse.then_some(l))
}

/// The calls the interpreter runs: every feature over ragged batches.
fn calls() -> Vec<Varlen> {
    let ragged = [
        (100, 130),
        (0, 50),
        (257, 200),
        (40, 0),
        (1, 1),
        (0, 0),
        (130, 300),
    ];
    vec![
        Varlen::new(&ragged),
        Varlen {
            causal: true,
            ..Varlen::new(&ragged)
        },
        Varlen {
            dtype: DType::F16,
            causal: true,
            h: 4,
            h_kv: 2,
            ..Varlen::new(&[(300, 90), (77, 77), (5, 260)])
        },
        Varlen {
            window: (33, 17),
            ..Varlen::new(&[(200, 460), (150, 150), (320, 100)])
        },
        Varlen {
            window: (20, -1),
            causal: true,
            softcap: 5.0,
            ..Varlen::new(&[(333, 333), (64, 200), (0, 9)])
        },
        Varlen {
            d: 128,
            softcap: 20.0,
            h: 2,
            h_kv: 1,
            ..Varlen::new(&[(129, 65), (1, 300)])
        },
    ]
}

#[test]
fn varlen_matches_reference_per_sequence() {
    let mut rng = Rng::from_env();
    for (i, c) in calls().into_iter().enumerate() {
        for dist in Dist::ALL {
            let lse = (i + dist as usize).is_multiple_of(2);
            let p = c.inputs(&mut rng, dist);
            let (o, l) = run(&c, &p, None, (0, BLOCK_M), lse);
            c.check(&c.case("attention_varlen", dist, &rng), &p, &o, l.as_ref());
        }
    }
}

#[test]
fn varlen_matches_the_dense_kernel_per_sequence() {
    // One sequence is the dense kernel's call: the same bits, not just within tolerance (at
    // one key block: the kernels' own choices differ).
    let mut rng = Rng::from_env();
    let c = Varlen {
        causal: true,
        pad: (0, 0),
        ..Varlen::new(&[(150, 90)])
    };
    let p = c.inputs(&mut rng, Dist::Normal);
    let (o, _) = run(&c, &p, None, (64, BLOCK_M), false);
    let (q, k, v) = (bhsd(&p.q), bhsd(&p.k), bhsd(&p.v));
    let mut dense = bhsd(&c.outputs().0);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut dense),
        HostArg::F32(p.scale),
    ];
    let ct = varlen_params::params(&c, 64, BLOCK_M);
    run_def(
        &kiln_examples::attention::attention,
        &ct,
        [2, 2, 1],
        &mut args,
    )
    .expect("runs");
    assert_eq!(o.to_f64_vec(), packed(dense).to_f64_vec());
}

/// `attention_varlen` (or its lse form) with `overrides`, after the pass pipeline for
/// `target`.
fn compiled(lse: bool, overrides: &[(&str, &str)], target: Target) -> Kernel {
    let name = if lse {
        "attention_varlen_lse"
    } else {
        "attention_varlen"
    };
    let mut k = ptx_examples::build(name, overrides);
    run_pipeline(&mut k, target, &mut |_, _| {})
        .unwrap_or_else(|d| panic!("{name} {overrides:?} on {target}: {d}"));
    k
}

#[test]
fn scheduled_varlen_matches_reference_per_sequence() {
    // The sm_90a schedule: warp specialised, persistent (two CTAs walk every sequence's
    // tiles, the ring continuing across them, empty walks included), rotated; the bounded
    // stores stay register stores (no TMA). sm_100a: the FlashAttention-4 roles.
    let mut rng = Rng::from_env();
    let ragged = [(300, 200), (0, 40), (130, 390), (64, 0), (1, 1)];
    let variants = [
        (Target::Sm90a, "64", "128", "128", false),
        (Target::Sm90a, "128", "160", "128", true),
        (Target::Sm90a, "64", "128", "192", true),
        (Target::Sm100a, "64", "0", "128", true),
        (Target::Sm100a, "128", "0", "128", false),
    ];
    for (target, d, block_n, block_m, lse) in variants {
        for causal in [false, true] {
            let flag = causal.to_string();
            let overrides = [
                ("d", d),
                ("block_n", block_n),
                ("block_m", block_m),
                ("causal", &flag),
            ];
            let kernel = compiled(lse, &overrides, target);
            let s = kernel.schedule.sched.as_ref().expect("a schedule");
            assert!(s.persistent(), "{overrides:?}: persistent");
            assert!(
                s.stores.is_empty(),
                "{overrides:?}: bounded stores from registers"
            );
            if target == Target::Sm90a {
                assert!(s.role(RoleKind::Consumer).is_some(), "{overrides:?}: roles");
            } else {
                assert_eq!(s.work_tiles, 2, "{overrides:?}: FA4");
            }
            let c = Varlen {
                d: d.parse().expect("d"),
                causal,
                ..Varlen::new(&ragged)
            };
            for dist in [Dist::Normal, Dist::Large] {
                let p = c.inputs(&mut rng, dist);
                let bm = block_m.parse().expect("block_m");
                let (o, l) = run(&c, &p, Some((&kernel, 2)), (0, bm), lse);
                let case = c.case(&format!("scheduled attention_varlen@{target}"), dist, &rng);
                c.check(&case, &p, &o, l.as_ref());
            }
        }
    }
}

#[test]
fn offsets_of_any_value_stay_inside_the_tensors() {
    // Decreasing offsets (a negative length), offsets past the tensors' rows, negative ones,
    // and a grid with more sequences than the offsets hold (those past them read 0): the run
    // never faults, a row no sequence covers is never written, and the rows of the well
    // formed first sequence that no other covers are those of a run without the others.
    let mut rng = Rng::from_env();
    let c = Varlen::new(&[(60, 70)]);
    let p = c.inputs(&mut rng, Dist::Normal);
    let (good, _) = run(&c, &p, None, (0, BLOCK_M), true);
    let (good, row) = (good.to_f64_vec(), c.h * c.d);
    let offsets = |cu: &[i32]| HostTensor::new(&[cu.len()], TensorData::I32(cu.to_vec()));
    let cases: [(&[i32], &[i32], u32); 4] = [
        (&[0, 60, 30, 40], &[0, 70, 10, 500], 3),
        (&[0, 60, 1 << 30, i32::MAX], &[0, 70, -5, i32::MIN], 3),
        (&[0, 60, -100, 50], &[0, 70, 0, 40], 3),
        (&[0, 60], &[0, 70], 4),
    ];
    for (cu_q, cu_k, batch) in cases {
        let bad = Packed {
            cu_q: offsets(cu_q).expect("offsets"),
            cu_k: offsets(cu_k).expect("offsets"),
            ..p.clone()
        };
        let (o, mut l) = c.outputs();
        let (q, k, v, mut o) = (bhsd(&bad.q), bhsd(&bad.k), bhsd(&bad.v), bhsd(&o));
        let mut args = [
            HostArg::Tensor(&q),
            HostArg::Tensor(&k),
            HostArg::Tensor(&v),
            HostArg::TensorMut(&mut o),
            HostArg::TensorMut(&mut l),
            HostArg::Tensor(&bad.cu_q),
            HostArg::Tensor(&bad.cu_k),
            HostArg::F32(bad.scale),
        ];
        let grid = [c.totals().0.div_ceil(BLOCK_M) as u32, c.h as u32, batch];
        run_def(
            &attention_varlen_lse,
            &varlen_params::params(&c, 0, BLOCK_M),
            grid,
            &mut args,
        )
        .unwrap_or_else(|e| panic!("{cu_q:?} {cu_k:?}: {e}"));
        let o = packed(o).to_f64_vec();
        // The rows sequence `b` covers (an offset past the tensor reads 0).
        let at = |i: usize| cu_q.get(i).copied().unwrap_or(0).max(0) as usize;
        let covered_by = |b: usize, r: usize| (at(b)..at(b + 1)).contains(&r);
        for r in 0..c.totals().0 {
            let (got, want) = (&o[r * row..][..row], &good[r * row..][..row]);
            let others = (1..batch as usize).any(|b| covered_by(b, r));
            if !covered_by(0, r) && !others {
                assert!(got.iter().all(|x| x.is_nan()), "{cu_q:?}: row {r} written");
            } else if !others {
                assert_eq!(got, want, "{cu_q:?}: row {r} of the first sequence");
            }
        }
    }
}

/// Copies `cu[block_id().x + at]` into `out[block_id().x]`.
#[kernel]
fn gather_offsets(cu: Tensor<i32, 1>, out: TensorMut<i32, 1>, at: i32) {
    let x = cu.scalar([block_id().x + at]);
    out.tile([1], [block_id().x]).store(full::<i32>([1], x));
}

#[test]
fn scalar_loads_outside_the_tensor_read_zero() {
    let cu = HostTensor::new(&[4], TensorData::I32(vec![7, -3, 11, 42])).unwrap();
    let mut out = poisoned(&[7], DType::I32);
    let mut args = [
        HostArg::Tensor(&cu),
        HostArg::TensorMut(&mut out),
        HostArg::I32(-2),
    ];
    run_def(&gather_offsets, &Default::default(), [7, 1, 1], &mut args).expect("runs");
    assert_eq!(out.to_f64_vec(), [0.0, 0.0, 7.0, -3.0, 11.0, 42.0, 0.0]);
}

/// Copies the `16 x 8` tile of `x` into `out`, but for the rows at or past `limit`.
#[kernel]
fn clipped_copy(x: Tensor<f32, 2>, out: TensorMut<f32, 2>, limit: i32) {
    let t = x.tile([16, 8], [0, 0]).load();
    out.tile([16, 8], [0, 0]).store_bounded(t, 0, limit);
}

#[test]
fn bounded_stores_skip_rows_past_the_limit() {
    // A limit inside the tile, at its edges, past the tensor (12 rows) and negative.
    let x = HostTensor::from_fn(&[12, 8], DType::F32, |i| i as f64 + 1.0);
    for limit in [-3, 0, 5, 12, 16, 1000] {
        let mut out = poisoned(&[12, 8], DType::F32);
        let mut args = [
            HostArg::Tensor(&x),
            HostArg::TensorMut(&mut out),
            HostArg::I32(limit),
        ];
        run_def(&clipped_copy, &Default::default(), [1, 1, 1], &mut args).expect("runs");
        let rows = limit.clamp(0, 12) as usize;
        let got = out.to_f64_vec();
        assert!(
            got[..rows * 8]
                .iter()
                .zip(x.to_f64_vec())
                .all(|(g, w)| *g == w),
            "{limit}"
        );
        assert!(
            got[rows * 8..].iter().all(|g| g.is_nan()),
            "limit {limit}: {got:?}"
        );
    }
}

#[test]
fn the_varlen_kernels_build_for_every_target() {
    // Every target's backend writes the scalar loads and the bounded stores (the PTX
    // snapshots assemble them).
    for def in [
        &attention_varlen as &dyn KernelDef<Comptime = AttentionParams>,
        &attention_varlen_lse,
    ] {
        let spec = Spec::uniform(AttentionParams::default(), def.signature(), true);
        let kernel = def.build(&spec).expect("builds");
        for target in [Target::Sm80, Target::Sm90a, Target::Sm100a] {
            kiln::ptx::compile(&kernel, target).unwrap_or_else(|e| panic!("{target}: {e}"));
        }
    }
}
