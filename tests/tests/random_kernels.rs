//! Random kernels through the whole compiler (`kiln_tests::random_kernel`): programs built
//! from fresh random bytes (seed printed), each verified, scheduled, written for every target
//! and interpreted, must end in PTX or in an error at the user's line, never in a bug.
//! `KILN_FUZZ_SECONDS` and `KILN_SEED` lengthen and replay a run (docs/testing.md).

use std::time::Duration;

use kiln_ir::interp::{HostArg, run};
use kiln_ir::{Const, DType, HostTensor, Kernel, KernelOptions, Loc, OpKind, Param, Shape, Target};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::random_kernel::{FILE, check, fuzz};

/// Kernels from fresh random bytes covering elementwise ops, `.col()`/`.row()` broadcasts,
/// reductions, loops carrying accumulators, `if`, bounded loads and stores, `mma` and casts,
/// bit ops, random numbers, masked loads, gathers, scatters, atomics, `take`, 3-D and 4-D
/// tiles and tiles streamed in chunks, each verified, scheduled (the verifier run after
/// every pass), written for every target (assembled by ptxas when `KILN_PTXAS` is set) and
/// interpreted.
///
/// The contract: no panic anywhere, no internal error, no error without the user's line or
/// quoting the IR, no pass leaving a kernel the verifier rejects, no interpreter error that
/// is kiln's, and ptxas accepts every PTX written. An "unsupported at your line" error is an
/// answer; the test prints the count of each kind with an example, and how many kernels
/// held each kind of op. In CI it runs for about 30 seconds; `KILN_FUZZ_SECONDS=600` is the
/// 10-minute soak, `KILN_SEED=<seed>` replays a run. The `ir` and `pipeline` fuzz targets
/// (`fuzz/`) drive the same code from libFuzzer.
#[test]
fn random_kernels_compile_or_fail_cleanly() {
    let mut rng = Rng::from_env();
    let seconds: u64 = std::env::var("KILN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // A soak runs until its time is up and assembles every kernel; CI stops at a case count
    // too, so a slow machine checks fewer kernels rather than taking longer, and assembles
    // one kernel in eight (ptxas is most of the time).
    let soak = std::env::var("KILN_FUZZ_SECONDS").is_ok();
    let cases = if soak { usize::MAX } else { 500 };
    let ptxas = std::env::var("KILN_PTXAS")
        .is_ok()
        .then_some(if soak { 1 } else { 8 });
    // CI's kernels are smaller (shorter byte strings), so one slow kernel cannot take the
    // run's time: the passes take seconds on the largest kernels in a debug build.
    let max_len = if soak { 256 } else { 128 };
    let tally = fuzz(
        &mut rng,
        cases,
        max_len,
        Duration::from_secs(seconds),
        ptxas,
        true,
    );
    let report = tally.report();
    println!("seed {}\n{report}", rng.seed());
    assert!(
        tally.bugs().next().is_none(),
        "seed {}: kiln bugs among random kernels (replay one with \
         kiln_tests::random_kernel::kernel(&bytes)):\n{report}",
        rng.seed()
    );
    // The generator must mostly produce kernels, and enough of them, or the test proves
    // nothing.
    assert!(
        tally.kernels >= 50 && tally.kernels * 10 >= tally.attempts * 8,
        "seed {}: only {} kernels built from {} byte strings\n{report}",
        rng.seed(),
        tally.kernels,
        tally.attempts
    );
}

/// A kernel `out = f(x.tile([rows, cols], [0, 0]).load())` built through the builder, with
/// `f` adding ops after the load (each at its own line of `random_kernel.rs`).
fn one_tile_kernel(
    rows: usize,
    cols: usize,
    f: impl FnOnce(&mut kiln_ir::Builder, kiln_ir::ValueId, &mut dyn FnMut() -> Loc) -> kiln_ir::ValueId,
) -> Kernel {
    let params = vec![
        Param::tensor("x", DType::F32, 2, false),
        Param::tensor("out", DType::F32, 2, true),
    ];
    let mut b = kiln_ir::Builder::new("regression", params, KernelOptions::default());
    let mut line = 0;
    let mut loc = move || {
        line += 1;
        Loc {
            file: FILE,
            line,
            column: 1,
        }
    };
    let zero = b.constant(Const::Int(0), DType::I32, loc()).unwrap();
    let t = b
        .op1(
            OpKind::Load {
                tensor: 0,
                shape: Shape(vec![rows, cols]),
            },
            &[zero, zero],
            loc(),
        )
        .unwrap();
    let y = f(&mut b, t, &mut loc);
    b.op(
        OpKind::Store {
            tensor: 1,
            bound: None,
        },
        &[zero, zero, y],
        loc(),
    )
    .unwrap();
    b.finish().unwrap()
}

/// `k` (a [`one_tile_kernel`]) on the interpreter over `x`: its output of `out_shape`,
/// poisoned with NaN before the run.
fn interpret(k: &Kernel, x: &HostTensor, out_shape: &[usize], rng: &Rng) -> HostTensor {
    let mut out = HostTensor::full(out_shape, DType::F32, f64::NAN);
    run(
        k,
        [1, 1, 1],
        &mut [HostArg::Tensor(x), HostArg::TensorMut(&mut out)],
    )
    .unwrap_or_else(|e| panic!("seed {}: {e}", rng.seed()));
    out
}

/// The maximum of each column of `t`.
fn column_max(b: &mut kiln_ir::Builder, t: kiln_ir::ValueId, loc: Loc) -> kiln_ir::ValueId {
    let op = OpKind::Reduce {
        op: kiln_ir::ReduceOp::Max,
        dim: 0,
    };
    b.op1(op, &[t], loc).unwrap()
}

/// Opens `for i in 0..3` carrying `init` (each op at its own line).
fn three_steps(
    b: &mut kiln_ir::Builder,
    init: kiln_ir::ValueId,
    loc: &mut dyn FnMut() -> Loc,
) -> kiln_ir::builder::ForScope {
    let lo = b.constant(Const::Int(0), DType::I32, loc()).unwrap();
    let hi = b.constant(Const::Int(3), DType::I32, loc()).unwrap();
    let step = b.constant(Const::Int(1), DType::I32, loc()).unwrap();
    b.begin_for(lo, hi, step, &[init], None, loc()).unwrap()
}

/// Every target's outcome for `k`, none a kiln bug (ptxas run where installed).
fn no_bug_on_any_target(k: &Kernel) {
    let ptxas = std::env::var_os("KILN_PTXAS").is_some();
    for t in Target::ALL {
        let outcome = check(k, t, ptxas);
        assert!(!outcome.is_bug(), "{}: {outcome:?}", t.name());
    }
}

/// A bitcast to the value's own type, which the verifier accepts, keeps every bit on the
/// interpreter (which refused it as an op the verifier should have rejected).
#[test]
fn a_bitcast_to_its_own_type_keeps_the_bits() {
    let k = one_tile_kernel(64, 32, |b, t, loc| {
        b.op1(OpKind::Bitcast { to: DType::F32 }, &[t], loc())
            .unwrap()
    });
    let mut rng = Rng::from_env();
    for dist in [Dist::Uniform, Dist::Large] {
        // Not a multiple of the tile: the elements past the tensor are neither read nor
        // written.
        let x = tensor(&mut rng, &[40, 30], DType::F32, dist);
        let mut out = HostTensor::full(&[40, 30], DType::F32, f64::NAN);
        run(
            &k,
            [1, 1, 1],
            &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut out)],
        )
        .unwrap_or_else(|e| panic!("seed {}: {e}", rng.seed()));
        let bits =
            |t: &HostTensor| -> Vec<u64> { t.to_f64_vec().iter().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&out), bits(&x), "seed {}", rng.seed());
    }
    no_bug_on_any_target(&k);
}

/// A loop carrying a column maximum (a reduction's sliced layout) through a reshape to its
/// own shape, then a reshape adding the unit dimension: the layout pass gave the first
/// reshape's operand the layout of a tile with the unit dimension, which the PTX writer
/// refused as an internal error (found by `random_kernels_compile_or_fail_cleanly`).
#[test]
fn a_reshape_to_its_own_shape_keeps_a_reductions_layout() {
    for unit_first in [true, false] {
        let (rows, cols) = (64, 32);
        let k = one_tile_kernel(rows, cols, |b, t, loc| {
            let reshape = |b: &mut kiln_ir::Builder, v, shape: Vec<usize>, loc| {
                b.op1(
                    OpKind::Reshape {
                        shape: Shape(shape),
                    },
                    &[v],
                    loc,
                )
                .unwrap()
            };
            let m = column_max(b, t, loc());
            let scope = three_steps(b, m, loc);
            let same = reshape(b, scope.carried[0], vec![cols], loc());
            let m = b.end_for(&scope, &[same], loc()).unwrap()[0];
            let shape = if unit_first {
                vec![1, cols]
            } else {
                vec![cols, 1]
            };
            reshape(b, m, shape, loc())
        });
        no_bug_on_any_target(&k);
        let mut rng = Rng::from_env();
        for dist in [Dist::Uniform, Dist::Large] {
            let x = tensor(&mut rng, &[rows, cols], DType::F32, dist);
            let out_shape = if unit_first { [1, cols] } else { [cols, 1] };
            let out = interpret(&k, &x, &out_shape, &rng);
            let xs = x.to_f64_vec();
            let want: Vec<f64> = (0..cols)
                .map(|c| {
                    (0..rows)
                        .map(|r| xs[r * cols + c])
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            assert_eq!(out.to_f64_vec(), want, "seed {}", rng.seed());
        }
    }
}

/// A loop whose body stores a column maximum of a tile large enough to stream in chunks,
/// while it carries another tile that is stored after it: strip mining moved the loop into
/// the chunk loop, leaving the store after it reading a value defined inside (the verifier
/// caught it as an internal error; found by `random_kernels_compile_or_fail_cleanly`).
#[test]
fn a_loop_streamed_in_chunks_keeps_what_else_it_carries() {
    let (rows, cols, width) = (64, 256, 32);
    let k = one_tile_kernel(rows, cols, |b, t, loc| {
        let m = column_max(b, t, loc());
        let ramp = b
            .op1(
                OpKind::Iota {
                    shape: Shape(vec![1, width]),
                    dim: 1,
                },
                &[],
                loc(),
            )
            .unwrap();
        let ramp = b
            .op1(OpKind::Cast { to: DType::F32 }, &[ramp], loc())
            .unwrap();
        let scope = three_steps(b, ramp, loc);
        let row = b
            .op1(
                OpKind::Reshape {
                    shape: Shape(vec![1, cols]),
                },
                &[m],
                loc(),
            )
            .unwrap();
        let (one, zero) = (
            b.constant(Const::Int(1), DType::I32, loc()).unwrap(),
            b.constant(Const::Int(0), DType::I32, loc()).unwrap(),
        );
        b.op(
            OpKind::Store {
                tensor: 1,
                bound: None,
            },
            &[one, zero, row],
            loc(),
        )
        .unwrap();
        let twice = b
            .op1(
                OpKind::Binary(kiln_ir::BinaryOp::Add),
                &[scope.carried[0], scope.carried[0]],
                loc(),
            )
            .unwrap();
        b.end_for(&scope, &[twice], loc()).unwrap()[0]
    });
    no_bug_on_any_target(&k);
    let mut rng = Rng::from_env();
    for dist in [Dist::Uniform, Dist::Large] {
        let x = tensor(&mut rng, &[rows, cols], DType::F32, dist);
        let out = interpret(&k, &x, &[2, cols], &rng);
        let xs = x.to_f64_vec();
        let got = out.to_f64_vec();
        for c in 0..cols {
            let max = (0..rows)
                .map(|r| xs[r * cols + c])
                .fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(got[cols + c], max, "seed {}: column {c}", rng.seed());
            let first = if c < width { 8.0 * c as f64 } else { f64::NAN };
            assert!(
                got[c] == first || (c >= width && got[c].is_nan()),
                "seed {}: out[0, {c}] = {}",
                rng.seed(),
                got[c]
            );
        }
    }
}

/// Replays one kernel of a fuzz report: `KILN_FUZZ_BYTES="[118, 113, ...]" cargo test -p
/// kiln-tests --test random_kernels replay -- --ignored --nocapture` prints its IR, and each
/// target's outcome and the interpreter's with the time each took; `KILN_REPLAY_PTX=FILE`
/// also writes its sm_80 PTX there.
#[test]
#[ignore = "a tool: replays the kernel of KILN_FUZZ_BYTES"]
fn replay() {
    let text = std::env::var("KILN_FUZZ_BYTES").expect("set KILN_FUZZ_BYTES to a report's bytes");
    let bytes: Vec<u8> = text
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|b| b.trim().parse().expect("a byte"))
        .collect();
    let Some(k) = kiln_tests::random_kernel::kernel(&bytes) else {
        println!("the builder refuses these bytes");
        return;
    };
    println!("{}", kiln_ir::print::print_kernel(&k));
    // Where the time goes on sm_80: each pass, then the PTX writer.
    let mut p = k.clone();
    let mut last = std::time::Instant::now();
    let ran = kiln_ir::passes::run_pipeline(&mut p, Target::Sm80, &mut |pass, _| {
        println!("  pass {pass}: {:.2} s", last.elapsed().as_secs_f64());
        last = std::time::Instant::now();
    });
    if ran.is_ok() {
        let ptx = kiln_ptx::writer::Writer::new(&p, Target::Sm80)
            .write()
            .map_or_else(|_| String::new(), |m| m.ptx);
        let lines = ptx.lines().count();
        if let Some(file) = std::env::var_os("KILN_REPLAY_PTX") {
            std::fs::write(&file, &ptx).expect("KILN_REPLAY_PTX names a writable file");
        }
        println!(
            "  PTX writer: {:.2} s, {lines} lines",
            last.elapsed().as_secs_f64()
        );
    }
    let ptxas = std::env::var_os("KILN_PTXAS").is_some();
    for t in Target::ALL {
        let start = std::time::Instant::now();
        let outcome = check(&k, t, ptxas);
        println!(
            "{}: {:.2} s: {}",
            t.name(),
            start.elapsed().as_secs_f64(),
            outcome.category()
        );
        if outcome.is_bug() {
            println!("{outcome:?}");
        }
    }
    let start = std::time::Instant::now();
    let answer = kiln_tests::random_kernel::interpret(&k);
    println!(
        "interpreter: {:.2} s: {answer:?}",
        start.elapsed().as_secs_f64()
    );
}
