//! Errors from the backend name the user's source line in the DSL's words: kernels kiln does
//! not lower yet (a layout conversion it cannot insert, a reduction it cannot write) come back
//! as an "unsupported" or "internal" error at the line that wrote the offending op, never as
//! a panic or a dump of the IR; and a ptxas failure is mapped back to the user's line.

use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ir::{Kernel, Target};
use kiln::prelude::*;

/// The 1-based line of this file holding `marker`.
fn line_of(marker: &str) -> u32 {
    let src = include_str!("codegen_errors.rs");
    let i = src
        .lines()
        .position(|l| l.contains(marker) && !l.contains("line_of("))
        .unwrap_or_else(|| panic!("marker {marker} not found"));
    i as u32 + 1
}

fn build<K: KernelDef<Comptime = ()>>(def: &K) -> Kernel {
    def.build(&Spec::uniform((), def.signature(), true))
        .unwrap_or_else(|d| panic!("builds: {d}"))
}

/// A vector loaded in one layout and broadcast with `.col()` against a 2-D tile in another.
#[kernel(num_warps = 4)]
fn col_compare(data: Tensor<i32, 1>, out: TensorMut<i32, 1>) {
    let v = data.tile([64], [0]).load();
    let hit = iota([64, 128], 0) < 1000 && v.col() == iota([64, 128], 1); // MARK-col-compare
    out.tile([128], [0]).store(col_sum(&select(hit, 1, 0)));
}

/// A row sum added into a loop-carried vector.
#[kernel(num_warps = 4)]
fn carried_row_sum(x: Tensor<f32, 2>, out: TensorMut<f32, 1>) {
    let mut acc = zeros::<f32>([64]);
    for j in 0..4 {
        let t = x.tile([64, 32], [0, j * 32]).load();
        acc = acc + row_sum(&t); // MARK-carried
    }
    out.tile([64], [0]).store(acc);
}

/// A loaded vector broadcast over a loaded tile's rows.
#[kernel(num_warps = 4)]
fn col_broadcast(x: Tensor<f32, 2>, b: Tensor<f32, 1>, out: TensorMut<f32, 2>) {
    let t = x.tile([64, 64], [0, 0]).load();
    let v = b.tile([64], [0]).load();
    out.tile([64, 64], [0, 0]).store(t + v.col()); // MARK-bcast
}

/// A loop-carried vector that starts as one tile's column sums and takes another tile's row
/// maxima: the layout pass gives the row reduction the carried vector's layout.
#[kernel(num_warps = 2)]
fn carried_mixed_reductions(x: Tensor<f32, 2>, out: TensorMut<f32, 1>) {
    let a = x.tile([64, 16], [0, 0]).load();
    let mut acc = col_sum(&a);
    for j in 0..2 {
        let t = x.tile([16, 32], [j * 16, 0]).load();
        acc = max(acc, row_max(&t)); // MARK-mixed
    }
    out.tile([16], [0]).store(acc);
}

/// Every target's answer for `k`: PTX that ptxas accepts, or an error of the kernel or an
/// unsupported construct (not a kiln bug) at `line` of this file that prints no IR.
fn compiles_or_errs_at(k: &Kernel, line: u32) {
    for t in Target::ALL {
        match kiln_ptx::compile(k, t) {
            Ok(m) => {
                // Without ptxas installed there is nothing to assemble with.
                if let Err(e @ kiln_ptx::ptxas::PtxasError::Rejected { .. }) =
                    kiln_ptx::ptxas::check(&m.ptx, t)
                {
                    panic!("{}: ptxas rejects the PTX: {e}", t.name());
                }
            }
            Err(e) => {
                let d = e.diagnostic();
                let shown = e.to_string();
                eprintln!("{}: {shown}", t.name());
                assert_eq!((d.loc.file, d.loc.line), (file!(), line), "{shown}");
                assert!(!shown.contains('%'), "prints IR: {shown}");
                assert!(!shown.contains("rt<"), "prints IR: {shown}");
                assert_ne!(e.kind(), kiln::ir::DiagKind::Internal, "{shown}");
            }
        }
    }
}

#[test]
fn col_compare_errs_at_the_users_line() {
    compiles_or_errs_at(&build(&col_compare), line_of("MARK-col-compare"));
}

#[test]
fn carried_row_sum_errs_at_the_users_line() {
    compiles_or_errs_at(&build(&carried_row_sum), line_of("MARK-carried"));
}

#[test]
fn col_broadcast_errs_at_the_users_line() {
    compiles_or_errs_at(&build(&col_broadcast), line_of("MARK-bcast"));
}

/// `o = x * 2` on one tile: the op whose PTX the test below breaks.
#[kernel(num_warps = 4)]
fn scale(x: Tensor<f32, 2>, o: TensorMut<f32, 2>) {
    let t = x.tile([32, 32], [0, 0]).load();
    let y = t * 2.0; // MARK-scale
    o.tile([32, 32], [0, 0]).store(y);
}

#[test]
fn a_ptxas_error_names_the_users_line() {
    if kiln_ptx::ptxas::find_ptxas().is_err() {
        eprintln!("skipped: ptxas is not installed (scripts/ensure-cuda-tool ptxas)");
        return;
    }
    let line = line_of("MARK-scale");
    let k = build(&scale);
    for t in [Target::Sm80, Target::Sm90a] {
        let m = kiln_ptx::compile(&k, t).unwrap_or_else(|e| panic!("{e}"));
        // Break the first instruction written for the multiply: ptxas must reject it, and
        // the error must lead back to the multiply's line.
        let marker = format!("{}:{line} ", file!());
        let mut lines: Vec<String> = m.ptx.lines().map(str::to_string).collect();
        let at = lines
            .iter()
            .position(|l| l.contains(&marker))
            .unwrap_or_else(|| panic!("no op comment for line {line}:\n{}", m.ptx));
        let ins = (at + 1..lines.len())
            .find(|&i| lines[i].trim_end().ends_with(';'))
            .unwrap_or_else(|| panic!("no instruction after the comment"));
        lines[ins] = "\tbogus.s32 %r9999, 1;".into();
        let broken = lines.join("\n");
        let e = kiln_ptx::ptxas::check(&broken, t).expect_err("ptxas accepts a bogus opcode");
        let kiln_ptx::ptxas::PtxasError::Rejected { at: ds, .. } = &e else {
            panic!("{e}");
        };
        assert!(!ds.is_empty(), "no error mapped: {e}");
        assert_eq!((ds[0].loc.file, ds[0].loc.line), (file!(), line), "{e}");
        assert_eq!(ds[0].kind, kiln::ir::DiagKind::Internal);
        let shown = e.to_string();
        assert!(
            shown.contains(&format!("--> {}:{line}\n", file!())),
            "{shown}"
        );
        assert!(shown.contains("bogus"), "{shown}");
    }
}

#[test]
fn carried_mixed_reductions_err_at_the_users_line() {
    compiles_or_errs_at(&build(&carried_mixed_reductions), line_of("MARK-mixed"));
}

// What the fuzzer (`tests/random_kernels.rs`) finds kiln cannot lower yet, one minimal
// kernel each: each must compile, or fail at its line without printing IR. When the
// lowering lands they compile, and ptxas checks them.

/// A transpose that is not an `mma` operand.
#[kernel(num_warps = 4)]
fn transpose_stored(x: Tensor<f32, 2>, o: TensorMut<f32, 2>) {
    let t = x.tile([32, 32], [0, 0]).load();
    o.tile([32, 32], [0, 0]).store(t.t()); // MARK-transpose
}

/// An `mma` whose B operand is computed in registers.
#[kernel(num_warps = 4)]
fn register_b(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, c: TensorMut<f32, 2>) {
    let x = a.tile([64, 32], [0, 0]).load();
    let y = (b.tile([32, 64], [0, 0]).load().cast::<f32>() * 2.0).cast::<bf16>();
    c.tile([64, 64], [0, 0]).store(mma(&x, &y)); // MARK-register-b
}

/// A row sum of a bf16 tile.
#[kernel(num_warps = 4)]
fn bf16_row_sum(a: Tensor<bf16, 2>, o: TensorMut<bf16, 1>) {
    let x = a.tile([64, 32], [0, 0]).load();
    o.tile([64], [0]).store(row_sum(&x)); // MARK-bf16-sum
}

/// A 16x16 `mma` in a block of 4 warps.
#[kernel(num_warps = 4)]
fn small_mma(a: Tensor<bf16, 2>, c: TensorMut<f32, 2>) {
    let x = a.tile([16, 16], [0, 0]).load();
    c.tile([16, 16], [0, 0]).store(mma(&x, &x)); // MARK-small-mma
}

/// Column sums of an `mma` accumulator, whose rows are spread over the warps.
#[kernel(num_warps = 4)]
fn col_sum_of_mma(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, o: TensorMut<f32, 1>) {
    let x = a.tile([64, 32], [0, 0]).load();
    let y = b.tile([32, 64], [0, 0]).load();
    o.tile([64], [0]).store(col_sum(&mma(&x, &y))); // MARK-col-sum-mma
}

#[test]
fn what_kiln_does_not_lower_yet_errs_at_the_users_line() {
    compiles_or_errs_at(&build(&transpose_stored), line_of("MARK-transpose"));
    compiles_or_errs_at(&build(&register_b), line_of("MARK-register-b"));
    compiles_or_errs_at(&build(&bf16_row_sum), line_of("MARK-bf16-sum"));
    compiles_or_errs_at(&build(&small_mma), line_of("MARK-small-mma"));
    compiles_or_errs_at(&build(&col_sum_of_mma), line_of("MARK-col-sum-mma"));
}

/// The memory operations added with gathers and atomics, and a bitcast: each op a later
/// stage may have to name.
#[kernel(num_warps = 4)]
fn memory_op_words(
    x: Tensor<f32, 2>,
    idx: Tensor<i32, 1>,
    hist: TensorMut<i32, 1>,
    o: TensorMut<f32, 2>,
) {
    let rows = idx.tile([64], [0]).load();
    let a = x
        .tile([64, 32], [0, 0])
        .load_masked(iota([64, 32], 1) < 20, 0.0);
    let g = x.rows(&rows, 32, [0, 0]).load();
    o.rows(&rows, 32, [0, 0]).store(a + g);
    o.tile([64, 32], [0, 0]).atomic_max(a);
    hist.elems([&(rows & 15)]).atomic_add(1);
    hist.at([0]).atomic_add(1);
    o.tile([64, 32], [0, 0])
        .store(g.bitcast::<i32>().bitcast::<f32>());
}

/// Every op, as an error names it ([`kiln::ir::diag::op_words`]), in the DSL's words: the
/// memory ops by the call that wrote them, none by the IR's mnemonic or value numbers.
#[test]
fn later_stage_errors_name_memory_ops_in_the_dsls_words() {
    let k = build(&memory_op_words);
    let words: Vec<String> = k
        .ops
        .iter()
        .map(|(id, _)| kiln::ir::diag::op_words(&k, id))
        .collect();
    for w in &words {
        assert!(!w.contains('%') && !w.contains("rt<"), "prints IR: {w}");
    }
    for want in [
        "`x.tile(..).load_masked(..)`",
        "`x.rows(..).load()`",
        "`o.rows(..).store(..)`",
        "`o.tile(..).atomic_max(..)`",
        "`hist.elems(..).atomic_add(..)`",
        "`hist.at(..).atomic_add(..)`",
        "`.bitcast::<i32>()`",
        "`.bitcast::<f32>()`",
        "`&`",
    ] {
        assert!(
            words.iter().any(|w| w == want),
            "no {want} among {words:#?}"
        );
    }
}

/// An mma accumulated into a tile of the wrong shape: the builder's error.
#[kernel(num_warps = 4)]
fn mma_wrong_accumulator(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, out: TensorMut<f32, 2>) {
    let x = a.tile([64, 32], [0, 0]).load();
    let y = b.tile([32, 64], [0, 0]).load();
    let acc = zeros::<f32>([64, 32]);
    out.tile([64, 32], [0, 0]).store(mma_acc(&x, &y, &acc)); // MARK-acc
}

/// A tile stored into a tile view of another shape.
#[kernel(num_warps = 4)]
fn store_wrong_shape(x: Tensor<f32, 2>, out: TensorMut<f32, 2>) {
    let t = x.tile([8, 64], [0, 0]).load();
    out.tile([64, 64], [0, 0]).store(t); // MARK-store
}

/// A type error the builder finds is reported at the user's line in the DSL's words
/// ("a 64x32 f32 tile"), not as an IR type (`rt<f32,64x32>`).
#[test]
fn builder_errors_name_types_in_the_dsls_words() {
    for (text, line, words) in [
        (
            mma_wrong_accumulator
                .build(&Spec::uniform((), mma_wrong_accumulator.signature(), true))
                .map(drop)
                .map_err(|d| (d.to_string(), d.loc)),
            line_of("MARK-acc"),
            "`mma` accumulator is a 64x32 f32 tile, expected a 64x64 f32 tile",
        ),
        (
            store_wrong_shape
                .build(&Spec::uniform((), store_wrong_shape.signature(), true))
                .map(drop)
                .map_err(|d| (d.to_string(), d.loc)),
            line_of("MARK-store"),
            "storing an 8x64 f32 tile into a 64x64 tile",
        ),
    ] {
        let (shown, loc) = text.expect_err("the build fails");
        eprintln!("{shown}");
        assert_eq!((loc.file, loc.line), (file!(), line), "{shown}");
        assert!(shown.contains(words), "expected `{words}` in: {shown}");
        assert!(
            !shown.contains("rt<") && !shown.contains('%'),
            "prints IR: {shown}"
        );
    }
}

/// A 128x256 f32 accumulator on one warp: 1024 registers a thread.
#[kernel(num_warps = 1)]
fn one_warp_wide_accumulator(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, out: TensorMut<f32, 2>) {
    let mut acc = zeros::<f32>([128, 256]);
    for k in 0..cdiv(a.dim(1), 32) {
        let x = a.tile([128, 32], [0, k * 32]).load();
        let y = b.tile([32, 256], [k * 32, 0]).load();
        acc = mma_acc(&x, &y, &acc); // MARK-wide-acc
    }
    out.tile([128, 256], [0, 0]).store(acc);
}

/// The same accumulator over four warps: 256 registers a thread.
#[kernel(num_warps = 4)]
fn four_warp_wide_accumulator(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, out: TensorMut<f32, 2>) {
    let mut acc = zeros::<f32>([128, 256]);
    for k in 0..cdiv(a.dim(1), 32) {
        let x = a.tile([128, 32], [0, k * 32]).load();
        let y = b.tile([32, 256], [k * 32, 0]).load();
        acc = mma_acc(&x, &y, &acc); // MARK-spilled-acc
    }
    out.tile([128, 256], [0, 0]).store(acc);
}

/// An accumulator a little beyond a thread's registers compiles (ptxas spills it, as a kernel
/// that ran before this check did) with a note at the mma's line saying so and what to change.
#[test]
fn an_accumulator_a_little_beyond_the_registers_compiles_with_a_note() {
    let k = build(&four_warp_wide_accumulator);
    for t in [Target::Sm80, Target::Sm90a] {
        kiln_ptx::compile(&k, t).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        let mut lowered = k.clone();
        kiln::ir::passes::run_pipeline(&mut lowered, t, &mut |_, _| {}).expect("lowers");
        let note = lowered
            .schedule
            .notes
            .iter()
            .find(|n| n.text.contains("256 registers a thread over its 4 warps"))
            .unwrap_or_else(|| panic!("{}: no note in {:?}", t.name(), lowered.schedule.notes));
        assert_eq!(note.loc.line, line_of("MARK-spilled-acc"));
        assert!(note.text.contains("ptxas spills it"), "{}", note.text);
        assert!(note.text.contains("`num_warps = 8`"), "{}", note.text);
    }
}

/// An accumulator no thread can hold is an error at the mma's line, naming the tile,
/// `num_warps` and the limit, on sm_80 and sm_90a, at once (not a ptxas run of minutes).
/// (sm_100a keeps accumulators in tensor memory and lowers only TMA rings.)
#[test]
fn an_accumulator_beyond_a_threads_registers_errs_at_the_mma() {
    let k = build(&one_warp_wide_accumulator);
    for t in [Target::Sm80, Target::Sm90a] {
        let start = std::time::Instant::now();
        let e = kiln_ptx::compile(&k, t).expect_err("no thread holds it");
        assert!(
            start.elapsed().as_secs() < 10,
            "{}: took {:?}",
            t.name(),
            start.elapsed()
        );
        let shown = e.to_string();
        eprintln!("{}: {shown}", t.name());
        let d = e.diagnostic();
        assert_eq!(
            (d.loc.file, d.loc.line),
            (file!(), line_of("MARK-wide-acc")),
            "{shown}"
        );
        for words in [
            "a 128x256 f32 tile",
            "1024 registers a thread over its one warp",
            "num_warps = 1",
            "255 registers",
            "`num_warps = 8`",
        ] {
            assert!(shown.contains(words), "expected `{words}` in: {shown}");
        }
        assert_ne!(e.kind(), kiln::ir::DiagKind::Internal, "{shown}");
    }
}

/// A 1024-thread block whose 512 x 128 accumulator would be one 128-column wgmma a warpgroup:
/// 64 accumulator registers a thread in one instruction, against the 64 a thread of such a
/// block holds (ptxas refused it outright, "Insufficient registers"; found by the
/// whole-pipeline fuzzer).
#[kernel(num_warps = 32)]
fn wide_block_mma(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, out: TensorMut<f32, 2>) {
    let mut acc = zeros::<f32>([512, 128]);
    for k in pipelined(0..cdiv(a.dim(1), 32), stages = 2) {
        let x = a.tile([512, 32], [0, k * 32]).load();
        let y = b.tile([32, 128], [k * 32, 0]).load();
        acc = mma_acc(&x, &y, &acc); // MARK-wide-block
    }
    out.tile([512, 128], [0, 0]).store(acc);
}

/// On sm_90a such an mma stays on mma.sync (which spills what does not fit) with a note at
/// its line saying why, and every target's PTX assembles.
#[test]
fn a_wgmma_wider_than_the_blocks_registers_stays_on_mma_sync() {
    let k = build(&wide_block_mma);
    compiles_or_errs_at(&k, line_of("MARK-wide-block"));
    let mut lowered = k.clone();
    kiln::ir::passes::run_pipeline(&mut lowered, Target::Sm90a, &mut |_, _| {}).expect("lowers");
    let note = lowered
        .schedule
        .notes
        .iter()
        .find(|n| {
            n.text
                .contains("accumulator registers a thread in one wgmma")
        })
        .unwrap_or_else(|| panic!("no note in {:?}", lowered.schedule.notes));
    assert_eq!(note.loc.line, line_of("MARK-wide-block"));
    assert!(
        note.text.contains("1024 threads leaves each thread 64"),
        "{}",
        note.text
    );
}

/// A `[1, 64]` row of indices that indexes a `take` along rows (where a rank-1 slice layout
/// suits it) and is also selected under a `[64, 64]` mask and stored (found by the
/// whole-pipeline fuzzer: the layout pass gave the rank-2 row the take's rank-1 slice
/// layout, and the broadcast test read a dimension its distribution did not have).
#[kernel(num_warps = 4)]
fn row_index_take(y: Tensor<bf16, 2>, out: TensorMut<f32, 2>, rows: TensorMut<f32, 2>) {
    let hit = iota([64, 64], 1) >= 75;
    let t = y.tile([64, 64], [0, 0]).load();
    let idx = iota([1, 64], 1) * 1 + 14;
    let picked = t.take_or(0, idx, -1e30);
    let idx = idx.reshape([1, 64]);
    let both = select(hit, idx, idx);
    rows.tile([1, 64], [0, 0]).store(idx.cast::<f32>());
    out.tile([64, 64], [0, 0]).store(both.cast::<f32>());
    rows.tile([1, 64], [1, 0]).store(picked.cast::<f32>());
}

#[test]
fn a_row_index_in_a_slice_layout_compiles_or_fails_cleanly() {
    let k = build(&row_index_take);
    for t in Target::ALL {
        if let Err(e) = kiln_ptx::compile(&k, t) {
            let shown = e.to_string();
            eprintln!("{}: {shown}", t.name());
            assert_ne!(e.kind(), kiln::ir::DiagKind::Internal, "{shown}");
            assert!(!shown.contains("rt<"), "prints IR: {shown}");
        }
    }
}
