//! sm_90a applies an f32 atomic add of a whole tile through shared memory: as 32-column
//! swizzled boxes that one thread reduces through the tensor's map (`cp.reduce.async.bulk
//! .tensor .add`) where the tile's layout allows (an mma accumulator's) in a kernel whose
//! shared memory sits on the swizzle's 1024-byte period (a ring's, a wgmma's), else one `cp.reduce.async.bulk ... .add.f32` per row (the `bulk_add` decision in
//! `lower`), and keeps per-element `red.global.add` where neither can hold: on the PTX text,
//! in the order the hardware needs (wait for the previous group's reads, barrier, stores,
//! proxy fence, barrier, bulk reductions, commit; the last group waited for before `ret`),
//! with the decision as a note at the user's line, assembled by ptxas and the driver's
//! ptxas with no spills. The interpreter's results are the GPU test's (`gpu_bulk_add`).

mod bulk_add_kernels;

use bulk_add_kernels::*;
use kiln::ir::dsl::{Comptime, KernelDef, Spec};
use kiln::ir::{Kernel, Target};
use kiln::prelude::*;
use kiln::ptx::ptxas::{self, Tool};

fn build<K: KernelDef>(def: &K, comptime: K::Comptime, aligned: bool) -> Kernel
where
    K::Comptime: Comptime,
{
    def.build(&Spec::uniform(comptime, def.signature(), aligned))
        .unwrap_or_else(|d| panic!("{d}"))
}

/// The PTX of `k` for `target`, assembled by both ptxas releases (where installed) with no
/// spills.
fn ptx(k: &Kernel, target: Target) -> String {
    let m = kiln::ptx::compile(k, target).unwrap_or_else(|e| panic!("{} {target}: {e}", k.name));
    if ptxas::find_ptxas().is_ok() {
        let r = ptxas::check(&m.ptx, target).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        assert_eq!(
            r.spill_store_bytes + r.spill_load_bytes,
            0,
            "{}: {r:?}",
            k.name
        );
    }
    if ptxas::find(Tool::JitPtxas).is_ok() {
        let r = ptxas::check_with(Tool::JitPtxas, &m.ptx, target)
            .unwrap_or_else(|e| panic!("{} (driver's ptxas): {e}", k.name));
        assert_eq!(
            r.spill_store_bytes + r.spill_load_bytes,
            0,
            "{}: {r:?}",
            k.name
        );
    }
    m.ptx
}

const BULK: &str = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32";
/// A TMA reduction of one staged box into a rank-2 tensor, and into a rank-4 one: only a
/// kernel whose shared memory sits on the swizzle's 1024-byte period (a ring's, a
/// wgmma's) stages boxes.
const BOXES_2D: &str = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group";
const BOXES_4D: &str = "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group";

/// The columns of the tile the note on the first bulk add names (`.. add of a [r, c] tile`).
fn added_columns(p: &str) -> usize {
    let note = p
        .lines()
        .find(|l| l.contains("f32 atomic add of a ["))
        .unwrap_or_else(|| panic!("no bulk add note in\n{p}"));
    let dims = note
        .split("add of a [")
        .nth(1)
        .and_then(|t| t.split(']').next());
    dims.and_then(|d| d.split(", ").nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no tile in {note}"))
}

/// Line numbers of the first line containing each of `steps`, in order, each after the last.
fn in_order(p: &str, steps: &[&str]) -> Vec<usize> {
    let lines: Vec<&str> = p.lines().collect();
    let mut at = 0;
    let mut out = Vec::new();
    for s in steps {
        let i = lines[at..]
            .iter()
            .position(|l| l.contains(s))
            .unwrap_or_else(|| panic!("`{s}` after line {at} in\n{p}"));
        at += i + 1;
        out.push(at);
    }
    out
}

#[test]
fn whole_tile_adds_are_bulk_reductions_on_sm90a() {
    for k in [
        build(&overlapping_adds, (), true),
        build(&overlapping_row_adds, (), true),
    ] {
        let p = ptx(&k, Target::Sm90a);
        let at = in_order(
            &p,
            &[
                "cp.async.bulk.wait_group.read 0",
                "bar.sync 0",
                "st.shared",
                "fence.proxy.async.shared::cta",
                "bar.sync 0",
                BULK,
                "cp.async.bulk.commit_group",
                "cp.async.bulk.wait_group 0",
                "ret;",
            ],
        );
        let lines: Vec<&str> = p.lines().collect();
        // Nothing but the staging stores between the first barrier and the fence, and no
        // per-element add of the tile's values outside the row tail.
        let stores = &lines[at[1]..at[3] - 1];
        assert!(
            stores.iter().all(|l| !l.contains("global")),
            "{}: a global access between the staging stores",
            k.name
        );
        assert_eq!(
            p.matches("red.relaxed").count(),
            3,
            "{}: only the 3-column tail:\n{p}",
            k.name
        );
        assert!(
            p.contains("// note: sm_90a: this f32 atomic add of a [")
                && p.contains("not on the swizzle's 1024-byte period"),
            "{}",
            k.name
        );
        // The other targets keep per-element reductions.
        for t in [Target::Sm80, Target::Sm100a] {
            let q = ptx(&k, t);
            assert!(!q.contains("cp.reduce.async.bulk"), "{} {t}", k.name);
            assert!(
                q.contains("red.relaxed.gpu.global.add.f32"),
                "{} {t}",
                k.name
            );
        }
    }
}

#[test]
fn an_mma_accumulator_is_added_as_boxes_after_the_ring() {
    // Split-K: the ring's consumer warpgroup holds the [64, 64] accumulator (wgmma's layout)
    // and adds it as two boxes at its own named barrier.
    let p = ptx(&build(&split_k_matmul, (), true), Target::Sm90a);
    assert!(p.contains("setmaxnreg"), "no warp roles:\n{p}");
    assert!(p.contains(".param .align 64 .b8 c_tmap[128]"), "{p}");
    assert_eq!(p.matches(BOXES_2D).count(), 2, "{p}");
    let at = in_order(
        &p,
        &[
            "wgmma.mma_async",
            "f32 atomic add of a whole tile: staged in 2 swizzled boxes",
            "cp.async.bulk.wait_group.read 0",
            "bar.sync",
            "st.shared.v2.f32",
            "fence.proxy.async.shared::cta",
            "bar.sync",
            BOXES_2D,
            "cp.async.bulk.commit_group",
        ],
    );
    let lines: Vec<&str> = p.lines().collect();
    assert!(
        lines[at[3] - 1].trim().ends_with(", 128;"),
        "{}",
        lines[at[3] - 1]
    );
    // An accumulator fragment's 8 rows land in 8 different 16-byte chunks of their box:
    // 16 pair stores for the thread's 32 elements, no scalar store.
    let staging = &lines[at[4] - 1..at[5]];
    assert_eq!(
        staging
            .iter()
            .filter(|l| l.contains("st.shared.v2.f32"))
            .count(),
        16,
        "{}",
        staging.join("\n")
    );
    assert!(!staging.iter().any(|l| l.contains("st.shared.f32")));
}

/// A masked add, whose mask leaves the staged row's elements out one by one.
#[kernel(num_warps = 4)]
fn masked_add(x: Tensor<f32, 2>, acc: TensorMut<f32, 2>, limit: i32) {
    let v = x.tile([64, 64], [0, 0]).load();
    let inside = iota([64, 64], 1) < limit;
    acc.tile([64, 64], [0, 0]).atomic_add_masked(v, inside);
}

/// An add at a column the compiler cannot prove 16-byte aligned.
#[kernel(num_warps = 4)]
fn unaligned_column_add(x: Tensor<f32, 2>, acc: TensorMut<f32, 2>, c: i32) {
    let v = x.tile([64, 64], [0, c]).load();
    acc.tile([64, 64], [0, c]).atomic_add(v);
}

/// An add whose old values are read.
#[kernel(num_warps = 4)]
fn add_with_result(x: Tensor<f32, 2>, acc: TensorMut<f32, 2>, old: TensorMut<f32, 2>) {
    let v = x.tile([64, 64], [0, 0]).load();
    let o = acc.tile([64, 64], [0, 0]).atomic_add(v);
    old.tile([64, 64], [0, 0]).store(o);
}

#[test]
fn adds_a_bulk_copy_cannot_make_stay_per_element_with_a_note() {
    let cases: [(Kernel, &str); 4] = [
        (build(&masked_add, (), true), "it is masked"),
        (
            build(&unaligned_column_add, (), true),
            "not known to be a multiple of 4",
        ),
        (build(&add_with_result, (), true), "its old values are read"),
        (
            build(&overlapping_adds, (), false),
            "not known to be 16-byte aligned",
        ),
    ];
    for (k, why) in cases {
        let p = ptx(&k, Target::Sm90a);
        assert!(!p.contains("cp.reduce.async.bulk"), "{}", k.name);
        assert!(!p.contains("cp.async.bulk.wait_group"), "{}", k.name);
        assert!(p.contains("global.add.f32"), "{}", k.name);
        let note = p
            .lines()
            .find(|l| l.contains("stays one red.global.add per element"))
            .unwrap_or_else(|| panic!("{}: no note in\n{p}", k.name));
        assert!(note.contains(why), "{}: {note}", k.name);
        assert!(note.contains("bulk_add"), "{}: {note}", k.name);
    }
}

#[test]
fn attention_backward_adds_dq_in_bulk_where_it_keeps_its_occupancy() {
    use kiln_examples::attention_backward::*;
    // sm_90a's tiles at d = 64 and the defaults at d = 256 hold one block a multiprocessor
    // anyway: bulk. The varlen kernel's add is masked: per element.
    for d in [64, 256] {
        let p = AttentionBwdParams {
            d,
            ..Default::default()
        }
        .tuned(Target::Sm90a, false);
        let dense = ptx(&build(&attention_bwd_dkdv, p, true), Target::Sm90a);
        // dQ's accumulator (all d columns, or a chunk of them) as 32-column boxes.
        assert_eq!(
            dense.matches(BOXES_4D).count(),
            added_columns(&dense) / 32,
            "d {d}"
        );
        let varlen = ptx(&build(&attention_bwd_dkdv_varlen, p, true), Target::Sm90a);
        assert!(
            !varlen.contains("cp.reduce.async.bulk"),
            "varlen d {d}: its dQ add is masked"
        );
        assert!(varlen.contains("stays one red.global.add per element: it is masked"));
    }
    // d = 128's default tiles hold two blocks a multiprocessor, which the staging buffer
    // would make one: per-element adds, and the note says why.
    let p = AttentionBwdParams::default();
    let dense = ptx(&build(&attention_bwd_dkdv, p, true), Target::Sm90a);
    assert!(!dense.contains("cp.reduce.async.bulk"), "{p:?}");
    assert!(
        dense.contains("would leave 1 block(s) a multiprocessor instead of 2"),
        "{p:?}: {}",
        dense
            .lines()
            .filter(|l| l.contains("note"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // sm_90a's d = 128 tiles where dQ need not be reproducible: the keys-major ring of two
    // consumer warpgroups, one block a multiprocessor anyway, adds dQ in boxes.
    let p = AttentionBwdParams::default().tuned(Target::Sm90a, false);
    assert!(p.keys_major && p.num_warps == 8, "{p:?}");
    let dense = ptx(&build(&attention_bwd_dkdv, p, true), Target::Sm90a);
    assert_eq!(dense.matches(BOXES_4D).count(), 4, "{p:?}");
}

#[test]
fn the_keys_major_rings_consumers_add_dq_in_bulk_among_themselves() {
    use kiln_examples::attention_backward::*;
    // Warp-specialised: the consumer warpgroups (warps 0..4) stage and issue the dQ rows at
    // their own named barrier; the producer warpgroup, which holds no tile, never meets it.
    for d in [64, 128] {
        let p = AttentionBwdParams {
            d,
            keys_major: true,
            ..Default::default()
        };
        let p = ptx(&build(&attention_bwd_dkdv, p, true), Target::Sm90a);
        assert!(p.contains("setmaxnreg"), "d {d}: no warp roles");
        let named = p
            .lines()
            .skip_while(|l| !l.contains("f32 atomic add of a whole tile"))
            .find(|l| l.contains("bar.sync"))
            .unwrap_or_else(|| panic!("d {d}: no staging barrier"));
        assert!(named.trim().ends_with(", 128;"), "d {d}: {named}");
        in_order(
            &p,
            &[
                "f32 atomic add of a whole tile",
                "fence.proxy.async.shared::cta",
                BOXES_4D,
                "cp.async.bulk.commit_group",
                "cp.async.bulk.wait_group 0",
            ],
        );
        assert_eq!(p.matches(BOXES_4D).count(), added_columns(&p) / 32, "d {d}");
    }
}

/// The loop around the first line containing `inside`: from the nearest label before it that
/// a branch after it jumps back to, to that branch.
fn enclosing_loop(p: &str, inside: &str) -> String {
    let lines: Vec<&str> = p.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains(inside))
        .unwrap_or_else(|| panic!("no `{inside}` in\n{p}"));
    let (head, back) = (0..at)
        .rev()
        .filter_map(|i| {
            let label = lines[i].trim().strip_suffix(':')?;
            let jump = format!("bra {label};");
            let back = (at..lines.len()).find(|&j| lines[j].contains(&jump))?;
            Some((i, back))
        })
        .next()
        .unwrap_or_else(|| panic!("no loop around `{inside}` in\n{p}"));
    lines[head..=back].join("\n")
}

#[test]
fn the_keys_major_consumers_meet_twice_an_iteration() {
    use kiln_examples::attention_backward::*;
    // The body stages dS for dQ's wgmma and adds dQ in boxes. dS is written without first
    // meeting: the add's second barrier, after every thread waited for dQ's wgmma (the last
    // reader of dS), already orders it after the previous reads. The boxes are written
    // without first meeting: the threads wait for the previous boxes' reductions to have
    // read them before dS's second barrier. So two barriers an iteration, not four.
    let one = AttentionBwdParams {
        d: 64,
        keys_major: true,
        ..Default::default()
    };
    // sm_90a's d = 128 tiles: two consumer warpgroups of 64 keys.
    let two = AttentionBwdParams::default().tuned(Target::Sm90a, false);
    for p in [one, two] {
        let k = build(&attention_bwd_dkdv, p, true);
        let mut scheduled = k.clone();
        kiln::ir::passes::run_pipeline(&mut scheduled, Target::Sm90a, &mut |_, _| {})
            .unwrap_or_else(|d| panic!("{d}"));
        let implied = &scheduled.schedule.implied_barriers;
        assert_eq!(implied.staged.len(), 1, "{p:?}: {implied:?}");
        assert_eq!(
            implied.bulk.values().collect::<Vec<_>>(),
            implied.staged.iter().collect::<Vec<_>>(),
            "{p:?}: the add's wait goes to dS's barrier"
        );
        let ptx = ptx(&k, Target::Sm90a);
        let body = enclosing_loop(&ptx, "f32 atomic add of a whole tile");
        assert_eq!(body.matches("bar.sync").count(), 2, "{p:?}:\n{body}");
        in_order(
            &body,
            &[
                "stmatrix",
                "fence.proxy.async.shared::cta",
                "cp.async.bulk.wait_group.read 0",
                "bar.sync",
                "wgmma.mma_async",
                "f32 atomic add of a whole tile",
                "st.shared.v2.f32",
                "fence.proxy.async.shared::cta",
                "bar.sync",
                BOXES_4D,
                "cp.async.bulk.commit_group",
            ],
        );
        assert_eq!(body.matches("cp.async.bulk.wait_group.read").count(), 1);
    }
}

#[test]
fn two_consumer_warpgroups_split_dq_columns_and_add_them_in_bulk() {
    use kiln_examples::attention_backward::*;
    // 128 keys over two consumer warpgroups (the products' M), 64 query rows of dQ: each
    // warpgroup computes 64 of its 128 columns (m64n64, its B descriptor a box further on
    // in the second), and the 256 consumer threads stage and add them in bulk (the
    // epilogue's TMA stores left the staging room).
    let p = AttentionBwdParams {
        d: 128,
        keys_major: true,
        block_n: 128,
        block_m: 64,
        num_warps: 8,
        key_cols: 128,
        ..Default::default()
    };
    let p = ptx(&build(&attention_bwd_dkdv, p, true), Target::Sm90a);
    let count = |s: &str| p.lines().filter(|l| l.contains(s)).count();
    // S^T and dP^T (M = 128 keys, N = 64 queries) and dQ (N = 128 / 2), 8 k16 steps each;
    // dV and dK (N = 128), 4 each.
    assert_eq!(count("wgmma.mma_async.sync.aligned.m64n64k16"), 24, "{p}");
    assert_eq!(count("wgmma.mma_async.sync.aligned.m64n128k16"), 8, "{p}");
    assert!(
        p.contains("rem.u32") && p.contains("div.u32"),
        "no column block"
    );
    let named = p
        .lines()
        .skip_while(|l| !l.contains("f32 atomic add of a whole tile"))
        .find(|l| l.contains("bar.sync"))
        .expect("a staging barrier");
    assert!(named.trim().ends_with(", 256;"), "{named}");
    in_order(
        &p,
        &[
            "f32 atomic add of a whole tile",
            "fence.proxy.async.shared::cta",
            BOXES_4D,
        ],
    );
    // Both warpgroups' columns staged, then thread 0 reduces the four boxes.
    assert_eq!(p.matches(BOXES_4D).count(), 4, "{p}");
}
