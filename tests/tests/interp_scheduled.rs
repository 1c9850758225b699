//! The CPU execution of the scheduled kernels ([`kiln_ir::interp::run_scheduled`]): the
//! example gemm on sm_90a (persistent, grouped tiles) and sm_100a (tensor memory), and the
//! example attention on sm_90a (Q once per tile, rotated body, longest-first tiles), each
//! after the whole pass pipeline, run with their TMA boxes, stage rings and tile walks on
//! few CTAs (so every CTA walks several tiles and the ring wraps across them), against the
//! f64 reference. Then copies of real schedules with one deliberate fault each, which the
//! protocol check cannot see (it proves orders, not addresses), and the execution must.

mod ptx_examples;
mod softcap;

use kiln::ir::dsl::KernelDef;
use kiln::ir::interp::{HostArg, InterpError, run_scheduled};
use kiln::ir::passes::run_pipeline;
use kiln::ir::sched::{Op, Region, RoleKind, Sched};
use kiln::ir::{DType, Kernel, Target};
use kiln_examples::attention::BLOCK_M;
use kiln_tests::check::{Case, as_stored, assert_close, poisoned, rel_error, tolerance};
use kiln_tests::inputs::{AttentionShape, Dist, Rng, gemm_operands, tensor};
use kiln_tests::reference::{self, Activation};
use kiln_tests::scheduled::{run_gemm, run_gemm_scaled};

/// `kernel` after the pass pipeline for `target`.
fn compiled(kernel: &str, overrides: &[(&str, &str)], target: Target) -> Kernel {
    let mut k = ptx_examples::build(kernel, overrides);
    run_pipeline(&mut k, target, &mut |_, _| {})
        .unwrap_or_else(|d| panic!("{kernel} {overrides:?} on {target}: {d}"));
    k
}

/// Shapes with ragged edges in every dimension, one with a single K block, and one of many
/// K blocks (the ring wraps within a tile).
const GEMM_SHAPES: [(usize, usize, usize); 3] = [(130, 70, 50), (200, 130, 64), (64, 64, 520)];

#[test]
fn scheduled_gemm_matches_reference() {
    let mut rng = Rng::from_env();
    for target in [Target::Sm90a, Target::Sm100a] {
        for b_col_major in [false, true] {
            let flag = b_col_major.to_string();
            let kernel = compiled("gemm", &[("b_col_major", &flag)], target);
            let semantic = ptx_examples::build("gemm", &[("b_col_major", &flag)]);
            let s = sched_of(&kernel);
            assert!(
                s.persistent() && !s.stores.is_empty(),
                "the gemm is persistent and stores through TMA on {target}"
            );
            for shape in GEMM_SHAPES {
                for dist in Dist::ALL {
                    for ctas in [1, 3] {
                        let (a, b, want) = gemm_operands(&mut rng, shape, b_col_major, dist);
                        let c = run_gemm(&kernel, (128, 128), &[&a, &b], shape.1, ctas)
                            .unwrap_or_else(|e| panic!("{target}: {e}"));
                        // The schedule moves the data and adds in the interpreter's order:
                        // the result is the semantic interpreter's, to the bit.
                        let plain = run_gemm(&semantic, (128, 128), &[&a, &b], shape.1, ctas)
                            .expect("interprets");
                        assert_eq!(
                            c.to_f64_vec(),
                            plain.to_f64_vec(),
                            "{target} b_col_major={b_col_major} {shape:?} {dist}: scheduled and \
                             semantic runs differ"
                        );
                        let case = Case {
                            kernel: format!(
                                "scheduled gemm on {target}, b_col_major={b_col_major}, {ctas} CTA(s)"
                            ),
                            shape: format!("m={} n={} k={}", shape.0, shape.1, shape.2),
                            dist,
                            seed: rng.seed(),
                        };
                        assert_close(&case, &c, &want, tolerance(DType::Bf16));
                    }
                }
            }
        }
    }
}

#[test]
fn sm100a_gemm_on_two_epilogue_warpgroups_matches_reference() {
    // Two epilogue warpgroups, each copying half of every accumulator row out of TMEM: the
    // 128 x 256 tile of BN = 256, and bias + GELU at BN = 128 (a row plus the bias and the
    // activation's temporaries would be more than one thread should hold).
    let mut rng = Rng::from_env();
    let (m, n, k) = (200, 300, 130);
    let kernel = compiled("gemm", &[("BN", "256")], Target::Sm100a);
    let semantic = ptx_examples::build("gemm", &[("BN", "256")]);
    assert_eq!(
        kernel
            .schedule
            .sched
            .as_ref()
            .and_then(|s| s.role(RoleKind::Epilogue))
            .map(|r| r.warps),
        Some(8)
    );
    for ctas in [1, 3] {
        let (a, b, want) = gemm_operands(&mut rng, (m, n, k), false, Dist::Normal);
        let c = run_gemm(&kernel, (128, 256), &[&a, &b], n, ctas).unwrap_or_else(|e| panic!("{e}"));
        let plain = run_gemm(&semantic, (128, 256), &[&a, &b], n, ctas).expect("interprets");
        assert_eq!(
            c.to_f64_vec(),
            plain.to_f64_vec(),
            "scheduled and semantic runs differ"
        );
        let case = Case {
            kernel: format!("scheduled gemm BN=256 on sm_100a, {ctas} CTA(s)"),
            shape: format!("m={m} n={n} k={k}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &c, &want, tolerance(DType::Bf16));
    }
    let kernel = compiled("gemm_bias_act", &[("act", "2")], Target::Sm100a);
    assert_eq!(
        kernel
            .schedule
            .sched
            .as_ref()
            .and_then(|s| s.role(RoleKind::Epilogue))
            .map(|r| r.warps),
        Some(8)
    );
    let (a, b, ab) = gemm_operands(&mut rng, (m, n, k), false, Dist::Normal);
    let bias = tensor(&mut rng, &[n], DType::Bf16, Dist::Normal);
    let want = as_stored(
        &reference::bias_act(&ab, &bias, Activation::GeluTanh),
        DType::Bf16,
    );
    for ctas in [1, 3] {
        let c = run_gemm(&kernel, (128, 128), &[&a, &b, &bias], n, ctas)
            .unwrap_or_else(|e| panic!("{e}"));
        let case = Case {
            kernel: format!("scheduled gemm_bias_act act=2 on sm_100a, {ctas} CTA(s)"),
            shape: format!("m={m} n={n} k={k}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &c, &want, tolerance(DType::Bf16));
    }
}

#[test]
fn sm100a_fused_epilogues_held_in_chunks_match_reference() {
    // BN = 256: each epilogue thread holds its half row in chunks (the code after the loop
    // runs once per chunk of columns on the GPU), for every activation and alpha/beta.
    let mut rng = Rng::from_env();
    let (m, n, k) = (200, 300, 130);
    let chunked = |kernel: &Kernel| {
        let epilogue = sched_of(kernel)
            .role(RoleKind::Epilogue)
            .expect("an epilogue role");
        let reads = epilogue
            .program
            .end
            .iter()
            .filter(|op| matches!(op, Op::Run(Region::Epilogue(_))))
            .count();
        assert_eq!(epilogue.warps, 8);
        assert!(
            reads > 1,
            "{} reads its block in {reads} chunk(s)",
            kernel.name
        );
    };
    let (a, b, ab) = gemm_operands(&mut rng, (m, n, k), false, Dist::Normal);
    let bias = tensor(&mut rng, &[n], DType::Bf16, Dist::Normal);
    for (act, activation) in Activation::ALL.into_iter().enumerate() {
        let act = act.to_string();
        let kernel = compiled(
            "gemm_bias_act",
            &[("BN", "256"), ("act", &act)],
            Target::Sm100a,
        );
        chunked(&kernel);
        let want = as_stored(&reference::bias_act(&ab, &bias, activation), DType::Bf16);
        let c = run_gemm(&kernel, (128, 256), &[&a, &b, &bias], n, 3)
            .unwrap_or_else(|e| panic!("act={act}: {e}"));
        let case = Case {
            kernel: format!("scheduled gemm_bias_act BN=256 act={act} on sm_100a, 3 CTAs"),
            shape: format!("m={m} n={n} k={k}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &c, &want, tolerance(DType::Bf16));
    }
    let kernel = compiled("gemm_alpha_beta", &[("BN", "256")], Target::Sm100a);
    chunked(&kernel);
    let c = tensor(&mut rng, &[m, n], DType::Bf16, Dist::Normal);
    let want = as_stored(&reference::alpha_beta(&ab, &c, 0.75, -1.25), DType::Bf16);
    let d = run_gemm_scaled(&kernel, (128, 256), &[&a, &b, &c], &[0.75, -1.25], n, 3)
        .unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        kernel: "scheduled gemm_alpha_beta BN=256 on sm_100a, 3 CTAs".into(),
        shape: format!("m={m} n={n} k={k}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    assert_close(&case, &d, &want, tolerance(DType::Bf16));
}

/// Runs the compiled attention `kernel` on fresh inputs of `p` over `ctas` CTAs and checks
/// it against the f64 reference; `cap`: the soft-capped test kernel with that cap; `block_m`:
/// the kernel's query rows per block.
fn check_attention(
    rng: &mut Rng,
    (kernel, block_m): (&Kernel, usize),
    p: &AttentionShape,
    dist: Dist,
    ctas: u32,
    cap: Option<f32>,
) {
    let [q, k, v] = p.tensors(rng, dist);
    let scale = (rng.uniform(0.5, 1.5) / (p.d as f64).sqrt()) as f32;
    let mut o = poisoned(&[p.b, p.h, p.sq, p.d], DType::Bf16);
    let mut args = vec![
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut o),
        HostArg::F32(scale),
    ];
    args.extend(cap.map(HostArg::F32));
    run_scheduled(kernel, p.grid(block_m), ctas, &mut args).unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        kernel: format!(
            "scheduled attention, d={} causal={} cap={cap:?} block_m={block_m}, {ctas} CTA(s)",
            p.d, p.causal
        ),
        shape: format!("b={} h={} sq={} sk={}", p.b, p.h, p.sq, p.sk),
        dist,
        seed: rng.seed(),
    };
    let scale = f64::from(scale);
    let want = match cap {
        Some(cap) => reference::attention_softcap(&q, &k, &v, scale, f64::from(cap)),
        None => reference::attention(&q, &k, &v, scale, p.causal),
    };
    assert_close(&case, &o, &want, tolerance(DType::Bf16));
}

#[test]
fn a_tile_without_iterations_stores_the_initial_accumulator() {
    // K = 0: no tile's loop runs. On sm_100a no mma writes the TMEM accumulator, and the
    // epilogue takes the loop's initial zeros instead of copying it.
    let mut rng = Rng::from_env();
    for target in [Target::Sm90a, Target::Sm100a] {
        let kernel = compiled("gemm", &[], target);
        let (a, b, want) = gemm_operands(&mut rng, (300, 130, 0), false, Dist::Normal);
        let c = run_gemm(&kernel, (128, 128), &[&a, &b], 130, 2).expect("runs");
        assert!(want.iter().all(|&x| x == 0.0));
        assert_eq!(c.to_f64_vec(), want, "{target}");
    }
}

#[test]
fn scheduled_gemm_of_one_or_three_consumer_warpgroups_matches_reference() {
    // The small-M tile (64 rows, one consumer warpgroup) and the 192-row tile (three), on the
    // same ring, walk and epilogue.
    let mut rng = Rng::from_env();
    for (bm, warps) in [(64, 4), (192, 12)] {
        let kernel = compiled("gemm", &[("BM", &bm.to_string())], Target::Sm90a);
        let consumer = sched_of(&kernel).role(RoleKind::Consumer);
        assert_eq!(consumer.map(|r| r.warps), Some(warps));
        for shape in [(130, 70, 50), (200, 130, 64), (400, 130, 200)] {
            let (a, b, want) = gemm_operands(&mut rng, shape, false, Dist::Normal);
            let c = run_gemm(&kernel, (bm, 128), &[&a, &b], shape.1, 2)
                .unwrap_or_else(|e| panic!("{e}"));
            let case = Case {
                kernel: format!("scheduled gemm on sm_90a, BM={bm}, 2 CTAs"),
                shape: format!("m={} n={} k={}", shape.0, shape.1, shape.2),
                dist: Dist::Normal,
                seed: rng.seed(),
            };
            assert_close(&case, &c, &want, tolerance(DType::Bf16));
        }
    }
}

/// Runs the scheduled attention `kernel` over ragged query and key blocks: sq > sk (when
/// causal, the first 100 rows see no key) and sq < sk, several key blocks per tile, batch and
/// heads so that two CTAs walk several tiles each; normal inputs, then `other`.
fn check_attention_shapes(rng: &mut Rng, kernel: &Kernel, d: usize, causal: bool, other: Dist) {
    for ((sq, sk), dist) in [((300, 200), Dist::Normal), ((130, 390), other)] {
        let p = AttentionShape {
            b: 2,
            h: 2,
            sq,
            sk,
            d,
            causal,
        };
        check_attention(rng, (kernel, BLOCK_M), &p, dist, 2, None);
    }
}

#[test]
fn scheduled_attention_matches_reference() {
    // sm_90a: the rotated ring with the per-warp deferral; sm_100a: FlashAttention-4's roles
    // (pairs of Q tiles over one key walk, S/P/O in tensor memory, the correction's rescale,
    // the per-row deferral, the polynomial share of the exponentials; odd query-tile counts
    // leave a pair's second tile past the grid, and causal with sq > sk gives tiles whose own
    // range is empty inside a non-empty walk). d = 96 runs its own 96-column tiles (three
    // 64-byte-swizzled boxes a row); d = 128 with 160-key blocks is sm_90a's tuned choice, a
    // block that does not divide the test lengths. The other distributions take turns.
    let mut rng = Rng::from_env();
    let variants = [
        (Target::Sm90a, "64", "128"),
        (Target::Sm90a, "128", "128"),
        (Target::Sm90a, "128", "64"),
        (Target::Sm90a, "128", "160"),
        (Target::Sm90a, "96", "0"),
        (Target::Sm100a, "64", "0"),
        (Target::Sm100a, "96", "0"),
        (Target::Sm100a, "128", "0"),
    ];
    let others = [Dist::Large, Dist::AllEqual, Dist::Uniform];
    for (v, (target, d, block_n)) in variants.into_iter().enumerate() {
        for causal in [false, true] {
            let flag = causal.to_string();
            let overrides = [("d", d), ("block_n", block_n), ("causal", &flag)];
            let kernel = compiled("attention", &overrides, target);
            if target == Target::Sm90a {
                let s = sched_of(&kernel);
                let defers = s.overlap.as_ref().is_some_and(|o| o.defer.is_some());
                assert!(defers, "{overrides:?}: rotated, the maximum deferred");
                // O's TMA store takes 64-column boxes: d = 96 stores from registers.
                let tma_store = d != "96";
                assert_eq!(!s.stores.is_empty(), tma_store, "{overrides:?}");
            } else {
                assert_eq!(
                    sched_of(&kernel).work_tiles,
                    2,
                    "{overrides:?}: the FA4 pair"
                );
            }
            let d = d.parse().expect("d");
            let other = others[(2 * v + usize::from(causal)) % 3];
            check_attention_shapes(&mut rng, &kernel, d, causal, other);
        }
    }
}

#[test]
fn scheduled_attention_on_three_consumer_warpgroups_matches_reference() {
    // d = 64 with 192-row query blocks: three consumer warpgroups taking turns, each tile's
    // rows over 12 warps; ragged sequences (1000; 385 = 2 * 192 + 1, the small analogue of
    // 4097), sq != sk both ways, rows that see no key (causal, sq > sk), large magnitudes,
    // on two CTAs that walk several tiles each.
    let mut rng = Rng::from_env();
    for causal in [false, true] {
        let flag = causal.to_string();
        let overrides = [("d", "64"), ("block_m", "192"), ("causal", &flag)];
        let kernel = compiled("attention", &overrides, Target::Sm90a);
        let s = sched_of(&kernel);
        let consumer = s.role(RoleKind::Consumer);
        assert_eq!(consumer.map(|r| r.warps), Some(12), "{overrides:?}");
        let turns = s.overlap.as_ref().and_then(|o| o.turns);
        assert_eq!(turns.map(|t| t.warpgroups), Some(3), "{overrides:?}");
        assert!(!s.stores.is_empty(), "O through TMA");
        let shapes = [
            ((1000, 1000), 1, Dist::Normal),
            ((385, 385), 2, Dist::Large),
            ((385, 130), 2, Dist::Normal),
            ((200, 520), 2, Dist::Uniform),
        ];
        for ((sq, sk), b, dist) in shapes {
            let p = AttentionShape {
                b,
                h: 2,
                sq,
                sk,
                d: 64,
                causal,
            };
            check_attention(&mut rng, (&kernel, 192), &p, dist, 2, None);
        }
    }
}

#[test]
fn sm100a_attention_with_both_q_tiles_in_one_buffer_is_wrong() {
    // Tile 1's Q loaded over tile 0's: both softmax warpgroups see the second tile's queries.
    let mut kernel = compiled("attention", &[("d", "64")], Target::Sm100a);
    let s = sched(&mut kernel);
    let q0 = s
        .loads
        .iter()
        .find(|(h, l)| s.once(*h) && l.work_tile == 0)
        .map(|(_, l)| l.tma.offset)
        .expect("Q tile 0");
    let q1 = s
        .loads
        .iter()
        .find(|(h, l)| s.once(*h) && l.work_tile == 1)
        .map(|(h, _)| h)
        .expect("Q tile 1");
    s.loads[q1].tma.offset = q0;
    let mut rng = Rng::new(11);
    let (q, k, v) = (
        tensor(&mut rng, &[1, 1, 256, 64], DType::Bf16, Dist::Normal),
        tensor(&mut rng, &[1, 1, 256, 64], DType::Bf16, Dist::Normal),
        tensor(&mut rng, &[1, 1, 256, 64], DType::Bf16, Dist::Normal),
    );
    let mut o = poisoned(&[1, 1, 256, 64], DType::Bf16);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut o),
        HostArg::F32(0.125),
    ];
    run_scheduled(&kernel, [2, 1, 1], 1, &mut args).expect("runs");
    let want = reference::attention(&q, &k, &v, 0.125, false);
    let err = rel_error(&o.to_f64_vec(), &want);
    assert!(
        err.is_nan() || err >= 0.1,
        "aliased Q tiles still match: {err:e}"
    );
}

#[test]
fn scheduled_attention_d256_stores_in_rounds() {
    // d = 256: the 64 KB output tile is staged in two 32 KB rounds; one block of 64 keys.
    let mut rng = Rng::from_env();
    for causal in [false, true] {
        let flag = causal.to_string();
        let kernel = compiled(
            "attention",
            &[("d", "256"), ("causal", &flag)],
            Target::Sm90a,
        );
        let st = sched_of(&kernel).stores.first().expect("a TMA store");
        assert_eq!(st.rounds, 2, "causal={causal}");
        let p = AttentionShape {
            b: 1,
            h: 2,
            sq: 200,
            sk: 130,
            d: 256,
            causal,
        };
        check_attention(&mut rng, (&kernel, BLOCK_M), &p, Dist::Normal, 2, None);
    }
}

#[test]
fn scheduled_softcap_attention_matches_reference() {
    // A second kernel of attention's shape (a mask in every block, no deferral): the same
    // rotated schedule, found by structure.
    let mut rng = Rng::from_env();
    let mut kernel = softcap::softcap_attention
        .build(&softcap::spec(64))
        .expect("builds");
    run_pipeline(&mut kernel, Target::Sm90a, &mut |_, _| {}).expect("compiles");
    let p = AttentionShape {
        b: 1,
        h: 2,
        sq: 200,
        sk: 150,
        d: 64,
        causal: false,
    };
    for dist in [Dist::Normal, Dist::Large] {
        let cap = rng.uniform(5.0, 30.0) as f32;
        check_attention(&mut rng, (&kernel, BLOCK_M), &p, dist, 2, Some(cap));
    }
}

/// The schedule IR of a compiled kernel.
fn sched(kernel: &mut Kernel) -> &mut Sched {
    kernel.schedule.sched.as_mut().expect("a schedule")
}

/// The schedule IR of a compiled kernel, to read.
fn sched_of(kernel: &Kernel) -> &Sched {
    kernel.schedule.sched.as_ref().expect("a schedule")
}

/// Ring load `i` of a compiled kernel's schedule (the ring's loads come first).
fn load(kernel: &mut Kernel, i: usize) -> &mut kiln::ir::sched::tma::TmaLoad {
    &mut sched(kernel).loads[kiln::ir::sched::LoadId::from_index(i)].tma
}

/// The compiled gemm with one edit, and what running it gives on a problem of three K
/// blocks per tile and two tiles per CTA.
fn broken_gemm(target: Target, edit: fn(&mut Kernel)) -> Result<f64, InterpError> {
    let mut kernel = compiled("gemm", &[], target);
    edit(&mut kernel);
    let mut rng = Rng::new(7);
    let (a, b, want) = gemm_operands(&mut rng, (256, 128, 96 * 2), false, Dist::Normal);
    let c = run_gemm(&kernel, (128, 128), &[&a, &b], 128, 1)?;
    Ok(rel_error(&c.to_f64_vec(), &want))
}

#[test]
fn faults_the_protocol_check_cannot_see_give_wrong_results() {
    for target in [Target::Sm90a, Target::Sm100a] {
        // The real schedule is exact (up to f32 rounding).
        let err = broken_gemm(target, |_| {}).expect("runs");
        assert!(err < 1e-2, "{target}: the real schedule: {err:e}");
        // Every stage of A at one address: TMA overwrites the stage the consumer is about
        // to read with a later block of K.
        let err = broken_gemm(target, |k| load(k, 0).stage_stride = 0).expect("runs");
        assert!(
            err.is_nan() || err >= 0.1,
            "{target}: aliased stages still match: {err:e}"
        );
        // B's buffer placed over A's.
        let err = broken_gemm(target, |k| {
            let a = load(k, 0).offset;
            load(k, 1).offset = a;
        })
        .expect("runs");
        assert!(
            err.is_nan() || err >= 0.1,
            "{target}: overlapping buffers still match: {err:e}"
        );
        // The epilogue's staging tile placed over A's stages: the producer's loads for the
        // next tile land in it before the bulk copy of the last one has read it.
        let err = broken_gemm(target, |k| {
            let a = load(k, 0).offset;
            let st = sched(k).stores.first_mut().expect("a TMA store");
            st.offset = a;
        })
        .expect("runs");
        assert!(
            err.is_nan() || err >= 0.1,
            "{target}: a staging tile over a stage still matches: {err:e}"
        );
    }
    // Boxes that miss part of their tile, or leave shared memory, are schedule errors.
    let shifted = broken_gemm(Target::Sm90a, |k| load(k, 0).boxes[0].origin[1] += 8);
    assert!(
        matches!(&shifted, Err(InterpError::Schedule { what, .. }) if what.contains("reaches past")),
        "{shifted:?}"
    );
    let outside = broken_gemm(Target::Sm90a, |k| load(k, 1).offset += 1 << 20);
    assert!(
        matches!(&outside, Err(InterpError::Schedule { what, .. }) if what.contains("past the block")),
        "{outside:?}"
    );
}

#[test]
fn a_rotated_part_that_reads_a_later_value_is_a_schedule_error() {
    // Moving the head mma into the tail section makes the code between read products that
    // no earlier part of its iteration computed.
    let mut kernel = compiled("attention", &[("d", "64")], Target::Sm90a);
    let o = sched(&mut kernel).overlap.as_mut().expect("rotated");
    o.tail_ops.insert(0, o.head);
    let mut rng = Rng::new(3);
    let p = AttentionShape {
        b: 1,
        h: 1,
        sq: 64,
        sk: 64,
        d: 64,
        causal: false,
    };
    let q = tensor(&mut rng, &[p.b, p.h, p.sq, p.d], DType::Bf16, Dist::Normal);
    let mut o = poisoned(&[p.b, p.h, p.sq, p.d], DType::Bf16);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&q),
        HostArg::Tensor(&q),
        HostArg::TensorMut(&mut o),
        HostArg::F32(0.125),
    ];
    let err = run_scheduled(&kernel, [1, 1, 1], 1, &mut args).expect_err("a broken rotation");
    assert!(
        matches!(&err, InterpError::Schedule { what, .. } if what.contains("runs before")),
        "{err}"
    );
}

#[test]
fn scheduled_keys_major_backward_matches_the_interpreter() {
    // The keys-major dK/dV ring at d = 64: Q and dO feed the wgmmas, the forward's LSE and
    // delta are tiles the consumers read into registers from the stage, and dQ leaves
    // through atomic adds. Lengths no multiple of a block (the last tiles past the tensor
    // read TMA's zeros); the scheduled execution must compute what the kernel means.
    use kiln::ir::dsl::{KernelDecl, Spec};
    use kiln::ir::host::{HostTensor, TensorData};
    use kiln::ir::interp::run;
    use kiln::ir::sched::tma::Operand;
    use kiln_examples::attention_backward::{AttentionBwdParams, attention_bwd_dkdv};
    let mut rng = Rng::from_env();
    let p = AttentionBwdParams {
        d: 64,
        keys_major: true,
        ..Default::default()
    };
    let mut kernel = attention_bwd_dkdv
        .build(&Spec::uniform(p, attention_bwd_dkdv.signature(), true))
        .unwrap_or_else(|d| panic!("{d}"));
    let plain = kernel.clone();
    run_pipeline(&mut kernel, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
    let registers = sched_of(&kernel)
        .loads
        .iter()
        .filter(|(_, l)| l.tma.operand == Operand::Registers)
        .count();
    assert_eq!(registers, 2, "the LSE and delta tiles ride the ring");
    let (b, h, sq, sk, d) = (1, 2, 150, 130, 64);
    let [q, dout] = [0, 1].map(|_| tensor(&mut rng, &[b, h, sq, d], DType::Bf16, Dist::Normal));
    let [k, v] = [0, 1].map(|_| tensor(&mut rng, &[b, h, sk, d], DType::Bf16, Dist::Normal));
    let stats = |rng: &mut Rng, lo: f64, hi: f64| {
        let x = (0..b * h * sq)
            .map(|_| rng.uniform(lo, hi) as f32)
            .collect();
        HostTensor::new(&[b, h, sq], TensorData::F32(x)).expect("shape")
    };
    let (lse, delta) = (stats(&mut rng, 3.0, 5.0), stats(&mut rng, -1.0, 1.0));
    let grid = p.key_grid([sk, h, b]);
    let outputs = || {
        [
            HostTensor::new(&[b, h, sq, d], TensorData::F32(vec![0.0; b * h * sq * d])),
            Ok(poisoned(&[b, h, sk, d], DType::Bf16)),
            Ok(poisoned(&[b, h, sk, d], DType::Bf16)),
        ]
        .map(|t| t.expect("shape"))
    };
    let (mut want, mut got) = (outputs(), outputs());
    for (k_run, out) in [(&plain, &mut want), (&kernel, &mut got)] {
        let [dq, dk, dv] = out;
        let mut args = vec![
            HostArg::Tensor(&q),
            HostArg::Tensor(&k),
            HostArg::Tensor(&v),
            HostArg::Tensor(&dout),
            HostArg::Tensor(&lse),
            HostArg::Tensor(&delta),
            HostArg::TensorMut(dq),
            HostArg::TensorMut(dk),
            HostArg::TensorMut(dv),
            HostArg::F32(0.125),
        ];
        if k_run.schedule.sched.is_some() {
            run_scheduled(k_run, grid, 2, &mut args).unwrap_or_else(|e| panic!("{e}"));
        } else {
            run(k_run, grid, &mut args).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    for (name, g, w) in [
        ("dq_accum", &got[0], &want[0]),
        ("dk", &got[1], &want[1]),
        ("dv", &got[2], &want[2]),
    ] {
        let case = Case {
            kernel: format!("scheduled keys-major backward {name}"),
            shape: format!("b={b} h={h} sq={sq} sk={sk} d={d}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, g, &w.to_f64_vec(), tolerance(DType::F32));
    }
}
