//! Kernels of the memory-operation tests (`memory_ops`, `memory_ops_ptx`,
//! `gpu_memory_ops`): a histogram built with atomic adds, a MoE-style row gather and
//! scatter, atomics through index tiles (with duplicate indices), masked loads with a fill
//! value and masked stores, and an element gather; and their f64 / exact references.

#![allow(dead_code)]

use kiln::ir::{DType, HostTensor, TensorData};
use kiln::prelude::*;
use kiln_tests::inputs::Rng;

/// Elements of `x` per histogram block.
pub const HIST_BLOCK: usize = 256;
/// Rows and columns per block of the row kernels.
pub const ROWS: usize = 32;
/// Columns per block of the row kernels.
pub const COLS: usize = 64;
/// Tile of the masked-load kernel.
pub const MASK_TILE: [usize; 2] = [32, 32];

/// The library's histogram (`kiln_examples::histogram`), at [`HIST_BLOCK`] elements per
/// block.
pub use kiln_examples::histogram::{HistogramComptime, histogram};

/// [`histogram`]'s comptime at [`HIST_BLOCK`].
pub const HIST: HistogramComptime = HistogramComptime { BLOCK: HIST_BLOCK };

/// `y[r, :] = x[idx[r], :]` (MoE token gather): rows whose index is outside `x` read `fill`.
///
/// Grid: `(cdiv(rows, ROWS), cdiv(cols, COLS), 1)`.
#[kernel(num_warps = 4)]
pub fn gather_rows(
    x: Tensor<dtype, 2>,
    idx: Tensor<i32, 1>,
    y: TensorMut<dtype, 2>,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let (rb, cb) = (block_id().x, block_id().y);
    let rows = idx.tile([ROWS], [rb * ROWS]).load();
    let t = x.rows(&rows, COLS, [0, cb * COLS]).load();
    y.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).store(t);
}

/// `y[idx[r], :] = x[r, :]` (MoE un-permute); indices are distinct.
///
/// Grid: `(cdiv(rows, ROWS), cdiv(cols, COLS), 1)`.
#[kernel(num_warps = 4)]
pub fn scatter_rows(
    x: Tensor<dtype, 2>,
    idx: Tensor<i32, 1>,
    y: TensorMut<dtype, 2>,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let (rb, cb) = (block_id().x, block_id().y);
    // Past the end of `idx`, -1: no row.
    let rows = idx.tile([ROWS], [rb * ROWS]).load_masked(true, -1);
    let t = x.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).load();
    y.rows(&rows, COLS, [0, cb * COLS]).store(t);
}

/// The atomic [`AtomicOp`] number `op` (a comptime `usize`).
pub fn atomic_op(op: usize) -> AtomicOp {
    match op {
        0 => AtomicOp::Add,
        1 => AtomicOp::Max,
        2 => AtomicOp::Min,
        3 => AtomicOp::Xchg,
        _ => AtomicOp::Cas,
    }
}

/// `acc[idx[r], c] = op(acc[idx[r], c], x[r, c])` atomically for the rows `r` of `x` with a
/// positive `keep[r]` (indices may repeat: MoE combine); `old[r, c]` gets what each
/// read (0 where skipped). `cas` compares with `cmp[r, c]`.
///
/// Grid: `(cdiv(rows, ROWS), cdiv(cols, COLS), 1)`.
#[kernel(num_warps = 4)]
pub fn atomic_rows(
    x: Tensor<dtype, 2>,
    cmp: Tensor<dtype, 2>,
    idx: Tensor<i32, 1>,
    keep: Tensor<i32, 1>,
    acc: TensorMut<dtype, 2>,
    old: TensorMut<dtype, 2>,
    #[comptime(default = 0)] op: usize,
    #[comptime(default = DType::F32)] dtype: DType,
    #[comptime(default = 0)] order: usize,
) {
    let (rb, cb) = (block_id().x, block_id().y);
    let rows = idx.tile([ROWS], [rb * ROWS]).load();
    let on: Value = keep.tile([ROWS], [rb * ROWS]).load() > 0;
    let v = x.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).load();
    let opts = AtomicOpts::new()
        .mask(on.col())
        .sem(sem_of(order))
        .scope(scope_of(order));
    let compare = if op == 4 {
        Some(cmp.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).load())
    } else {
        None
    };
    let o = acc
        .rows(&rows, COLS, [0, cb * COLS])
        .atomic(atomic_op(op), v, compare, opts);
    old.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).store(o);
}

/// Memory order number `order` of [`atomic_rows`].
pub fn sem_of(order: usize) -> MemSem {
    match order % 4 {
        0 => MemSem::Relaxed,
        1 => MemSem::Acquire,
        2 => MemSem::Release,
        _ => MemSem::AcqRel,
    }
}

/// Scope of memory order number `order` of [`atomic_rows`].
pub fn scope_of(order: usize) -> MemScope {
    match order % 3 {
        0 => MemScope::Gpu,
        1 => MemScope::Cta,
        _ => MemScope::Sys,
    }
}

/// Atomic add of `x` into the tile of `acc` at the same place, result unused (`red`):
/// several blocks (`grid.z` of them) add into each tile.
///
/// Grid: `(cdiv(rows, ROWS), cdiv(cols, COLS), repeats)`.
#[kernel(num_warps = 4)]
pub fn atomic_add_tiles(
    x: Tensor<dtype, 2>,
    acc: TensorMut<dtype, 2>,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let (rb, cb) = (block_id().x, block_id().y);
    let v = x.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).load();
    acc.tile([ROWS, COLS], [rb * ROWS, cb * COLS]).atomic_add(v);
}

/// `y = where(x > t, x, fill)` through a masked load whose masked-off and outside elements
/// read `fill`, stored only where the column is below `limit` (a masked store).
///
/// Grid: `(cdiv(rows, 32), cdiv(cols, 32), 1)`.
#[kernel(num_warps = 4)]
pub fn masked_copy(x: Tensor<f32, 2>, y: TensorMut<f32, 2>, t: f32, fill: f32, limit: i32) {
    let (rb, cb) = (block_id().x, block_id().y);
    let [r, c] = MASK_TILE;
    let peek = x.tile([r, c], [rb * r, cb * c]).load();
    let v = x.tile([r, c], [rb * r, cb * c]).load_masked(peek > t, fill);
    let cols = iota([c], 0) + cb * c;
    y.tile([r, c], [rb * r, cb * c])
        .store_masked(v, (cols < limit).row());
}

/// `y[i] = x[ri[i], ci[i]]` element by element (outside indices read 0).
///
/// Grid: `(cdiv(n, HIST_BLOCK), 1, 1)`.
#[kernel(num_warps = 4)]
pub fn gather_elems(
    x: Tensor<f32, 2>,
    ri: Tensor<i32, 1>,
    ci: Tensor<i32, 1>,
    y: TensorMut<f32, 1>,
) {
    let i = block_id().x;
    let r = ri.tile([HIST_BLOCK], [i * HIST_BLOCK]).load();
    let c = ci.tile([HIST_BLOCK], [i * HIST_BLOCK]).load();
    let v = x.elems([r, c]).load();
    y.tile([HIST_BLOCK], [i * HIST_BLOCK]).store(v);
}

/// Integer data of `shape`: uniform in `lo..hi`.
pub fn ints(rng: &mut Rng, shape: &[usize], lo: i64, hi: i64) -> HostTensor {
    HostTensor::from_fn(shape, DType::I32, |_| {
        (lo + rng.range(0, (hi - lo) as usize) as i64) as f64
    })
}

/// The i32 elements of `t`.
pub fn i32s(t: &HostTensor) -> Vec<i32> {
    match &t.data {
        TensorData::I32(v) => v.clone(),
        _ => t.to_f64_vec().iter().map(|&x| x as i32).collect(),
    }
}

/// The exact histogram of `x` over `bins` bins (values outside are not counted) on top of
/// `init`.
pub fn histogram_ref(x: &[i32], init: &[i32]) -> Vec<i32> {
    let mut h = init.to_vec();
    for &b in x {
        if let Some(slot) = usize::try_from(b).ok().and_then(|b| h.get_mut(b)) {
            *slot += 1;
        }
    }
    h
}

/// Asserts `got == want` element for element (NaN equal to NaN), naming the first mismatch.
pub fn assert_same(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len())
        .find(|&i| got[i].to_bits() != want[i].to_bits() && !(got[i].is_nan() && want[i].is_nan()))
    {
        let bad = (0..got.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        panic!(
            "{what}: {bad} element(s) differ, the first at {i}: got {}, want {}",
            got[i], want[i]
        );
    }
}

/// Split-K `c += a @ b` (bf16 inputs, f32 `c`): block `(mb, nb, z)` multiplies K blocks
/// `z * KSPLIT..(z + 1) * KSPLIT` of `BK` and adds its partial tile into `c` atomically.
///
/// Grid: `(cdiv(m, 128), cdiv(n, 128), cdiv(k, KSPLIT * 64))`.
#[kernel(num_warps = 4)]
pub fn splitk_gemm(a: Tensor<bf16, 2>, b: Tensor<bf16, 2>, c: TensorMut<f32, 2>) {
    const BM: usize = 128;
    const BN: usize = 128;
    const BK: usize = 64;
    let (mb, nb, z) = (block_id().x, block_id().y, block_id().z);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(z * KSPLIT..(z + 1) * KSPLIT, stages = 2) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).atomic_add(acc);
}

/// K blocks per split of [`splitk_gemm`].
pub const KSPLIT: usize = 2;

/// `y += x` then `z = y; y = x` (exchange) on a 16-element tile of a one-warp block: its
/// layout holds each element in several lanes, so one lane applies it and shuffles the old
/// value to the others.
///
/// Grid: `(1, 1, 1)`.
#[kernel(num_warps = 1)]
pub fn small_atomics(x: Tensor<f32, 1>, y: TensorMut<f32, 1>, z: TensorMut<f32, 1>) {
    let v = x.tile([16], [0]).load();
    y.tile([16], [0]).atomic_add(v);
    let old = y.tile([16], [0]).atomic_xchg(v);
    z.tile([16], [0]).store(old);
}

/// MoE expert GEMM: `c[r, :] = a[idx[r], :] @ b` (bf16 in, f32 out): the routed rows of `a`
/// are gathered straight into the mma's register A operand, 64 rows and 32 of K at a time.
/// Rows whose index is outside `a` are zero.
///
/// Grid: `(cdiv(rows, 64), cdiv(n, 64), 1)`.
#[kernel(num_warps = 4)]
pub fn gathered_gemm(
    a: Tensor<bf16, 2>,
    idx: Tensor<i32, 1>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let rows = idx.tile([64], [mb * 64]).load_masked(true, -1);
    let mut acc = zeros::<f32>([64, 64]);
    for kb in pipelined(0..cdiv(a.dim(1), 32), stages = 2) {
        let x = a.rows(&rows, 32, [0, kb * 32]).load();
        let y = b.tile([32, 64], [kb * 32, nb * 64]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([64, 64], [mb * 64, nb * 64]).store(acc);
}

/// `a[idx[r], :] @ b` in f64 (zero rows for indices outside `a`).
pub fn gathered_gemm_ref(a: &HostTensor, idx: &[i32], b: &HostTensor) -> Vec<f64> {
    let (na, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let mut out = vec![0.0; idx.len() * n];
    for (r, &i) in idx.iter().enumerate() {
        let Some(i) = usize::try_from(i).ok().filter(|&i| i < na) else {
            continue;
        };
        for j in 0..n {
            out[r * n + j] = (0..k).map(|t| av[i * k + t] * bv[t * n + j]).sum();
        }
    }
    out
}

/// Elements per block of [`last_block_sum`], and partials the last block adds per step.
pub const SUM_BLOCK: usize = 256;

/// `total[0] = sum(x)` in one launch: each block stores its partial sum to
/// `partial[block]`, then draws a ticket from `counter[0]` with one acq_rel scalar atomic;
/// the block that draws the last ticket (every other block's partial is then visible to it)
/// adds the partials and resets the counter for the next launch. `counter` starts at 0.
///
/// Grid: `(cdiv(n, SUM_BLOCK), 1, 1)`.
#[kernel(num_warps = 4)]
pub fn last_block_sum(
    x: Tensor<f32, 1>,
    partial: TensorMut<f32, 1>,
    counter: TensorMut<i32, 1>,
    total: TensorMut<f32, 1>,
    tickets: TensorMut<i32, 1>,
) {
    let b = block_id().x;
    let v = x.tile([SUM_BLOCK], [b * SUM_BLOCK]).load().row();
    partial.tile([1], [b]).store(row_sum(&v));
    let order = AtomicOpts::new().sem(MemSem::AcqRel);
    let ticket = counter.at([0]).atomic(AtomicOp::Add, 1, None, order);
    tickets.tile([1], [b]).store(full::<i32>([1], ticket));
    if ticket == grid_dim().x - 1 {
        let mut acc = zeros::<f32>([1]);
        for j in (0..grid_dim().x).step_by(SUM_BLOCK) {
            let p = partial
                .tile([SUM_BLOCK], [j])
                .load_masked(iota([SUM_BLOCK], 0) + j < grid_dim().x, 0.0);
            acc = acc + row_sum(&p.row());
        }
        total.tile([1], [0]).store(acc);
        counter.at([0]).atomic_xchg(0);
    }
}

/// Rows of [`scalar_atomics`]' `old`: one per atomic it applies.
pub const SCALAR_ATOMIC_ROWS: usize = 8;

/// Every scalar atomic, once per block `b` with the values `vi[b]` (i32), `vf[b]` (f32)
/// and `vh[b]` (bf16): `ai[0] += vi`, `ai[1] = max`, `ai[2] = min`, `ai[3] <-> vi`,
/// `ai[4] = cas(0 -> b + 1)`, `af[0] += vf`, `af[1] = max(af[1], vf)` (a CAS loop), and
/// `ah[0] += vh` (a 16-bit CAS loop); `old[k, b]` gets what atomic `k` read. Then an add at
/// `ai[5]`, outside `ai` (5 elements): nothing applied, and the 0 it reads goes to `af[2]`.
///
/// Grid: `(blocks, 1, 1)`.
#[kernel(num_warps = 4)]
pub fn scalar_atomics(
    vi: Tensor<i32, 1>,
    vf: Tensor<f32, 1>,
    vh: Tensor<bf16, 1>,
    ai: TensorMut<i32, 1>,
    af: TensorMut<f32, 1>,
    ah: TensorMut<bf16, 1>,
    old: TensorMut<f32, 2>,
) {
    let b = block_id().x;
    let i = vi.scalar([b]);
    let f = vf.scalar([b]);
    let h = vh.scalar([b]);
    // One atomic per row of `old`: what it read, as f32.
    let o0 = ai.at([0]).atomic_add(i).cast::<f32>();
    old.tile([1, 1], [0, b]).store(full::<f32>([1, 1], o0));
    let o1 = ai.at([1]).atomic_max(i).cast::<f32>();
    old.tile([1, 1], [1, b]).store(full::<f32>([1, 1], o1));
    let o2 = ai.at([2]).atomic_min(i).cast::<f32>();
    old.tile([1, 1], [2, b]).store(full::<f32>([1, 1], o2));
    let o3 = ai.at([3]).atomic_xchg(i).cast::<f32>();
    old.tile([1, 1], [3, b]).store(full::<f32>([1, 1], o3));
    let o4 = ai.at([4]).atomic_cas(0, b + 1).cast::<f32>();
    old.tile([1, 1], [4, b]).store(full::<f32>([1, 1], o4));
    let o5 = af.at([0]).atomic_add(f);
    old.tile([1, 1], [5, b]).store(full::<f32>([1, 1], o5));
    let o6 = af.at([1]).atomic_max(f);
    old.tile([1, 1], [6, b]).store(full::<f32>([1, 1], o6));
    let o7 = ah.at([0]).atomic_add(h).cast::<f32>();
    old.tile([1, 1], [7, b]).store(full::<f32>([1, 1], o7));
    // Outside `ai` (5 elements): nothing applied; the 0 it reads lands in `af[2]`.
    let none = ai.at([5]).atomic_add(1);
    af.tile([1], [2])
        .store(full::<f32>([1], none.cast::<f32>()));
}

/// Inputs of [`scalar_atomics`] for `blocks` blocks: `(vi, vf, vh)`, small integers (every
/// sum of them exact in f32 and bf16, whatever the order).
pub fn scalar_atomic_inputs(rng: &mut Rng, blocks: usize) -> [HostTensor; 3] {
    let vi = ints(rng, &[blocks], -50, 50);
    let vf = HostTensor::from_fn(&[blocks], DType::F32, |_| rng.range(0, 100) as f64 - 50.0);
    let vh = HostTensor::from_fn(&[blocks], DType::Bf16, |_| rng.range(0, 5) as f64 - 2.0);
    [vi, vf, vh]
}

/// The initial `(ai, af, ah)` of [`scalar_atomics`]: `ai[4]` (the cas target) is 0, `af[2]`
/// poisoned (the skipped atomic writes its 0 there).
pub fn scalar_atomic_targets(rng: &mut Rng) -> [HostTensor; 3] {
    let mut ai = ints(rng, &[5], -20, 20);
    ai.data.set_f64(4, 0.0);
    let af = HostTensor::from_fn(&[3], DType::F32, |i| {
        if i == 2 {
            f64::NAN
        } else {
            rng.range(0, 40) as f64 - 20.0
        }
    });
    let ah = HostTensor::from_fn(&[1], DType::Bf16, |_| rng.range(0, 9) as f64 - 4.0);
    [ai, af, ah]
}

/// Checks [`scalar_atomics`]' results in an order-free way: for each atomic, the values it
/// read and the value it left are a chain of its blocks' updates in *some* order (each
/// block's update turns what it read into what the next read), i.e. the multiset of reads
/// plus the final value equals the initial value plus the multiset of `update(read, value)`.
/// Applying an atomic once per thread instead of once per block breaks the chain.
pub fn check_scalar_atomics(
    what: &str,
    v: &[HostTensor; 3],
    init: &[HostTensor; 3],
    fin: &[HostTensor; 3],
    old: &HostTensor,
) {
    let blocks = v[0].shape[0];
    let olds = old.to_f64_vec();
    let (vi, vf, vh) = (v[0].to_f64_vec(), v[1].to_f64_vec(), v[2].to_f64_vec());
    let (ii, fi, hi) = (
        init[0].to_f64_vec(),
        init[1].to_f64_vec(),
        init[2].to_f64_vec(),
    );
    let (iff, ff, hf) = (
        fin[0].to_f64_vec(),
        fin[1].to_f64_vec(),
        fin[2].to_f64_vec(),
    );
    type Update = fn(f64, f64, usize) -> f64;
    let rows: [(f64, f64, &[f64], Update); SCALAR_ATOMIC_ROWS] = [
        (ii[0], iff[0], &vi, |o, v, _| o + v),
        (ii[1], iff[1], &vi, |o, v, _| o.max(v)),
        (ii[2], iff[2], &vi, |o, v, _| o.min(v)),
        (ii[3], iff[3], &vi, |_, v, _| v),
        (ii[4], iff[4], &vi, |o, _, b| {
            if o == 0.0 { b as f64 + 1.0 } else { o }
        }),
        (fi[0], ff[0], &vf, |o, v, _| o + v),
        (fi[1], ff[1], &vf, |o, v, _| o.max(v)),
        (hi[0], hf[0], &vh, |o, v, _| o + v),
    ];
    for (k, (start, end, vals, update)) in rows.into_iter().enumerate() {
        let reads = &olds[k * blocks..(k + 1) * blocks];
        let mut lhs: Vec<f64> = reads.iter().copied().chain([end]).collect();
        let mut rhs: Vec<f64> = (0..blocks)
            .map(|b| update(reads[b], vals[b], b))
            .chain([start])
            .collect();
        lhs.sort_by(f64::total_cmp);
        rhs.sort_by(f64::total_cmp);
        assert_eq!(
            lhs, rhs,
            "{what}: scalar atomic {k} is no chain of one update per block (reads {reads:?}, \
             start {start}, end {end})"
        );
    }
    assert_eq!(ff[2], 0.0, "{what}: an atomic outside its tensor reads 0");
}
