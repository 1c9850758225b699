//! Kernels of the memory-operation tests (`memory_ops`, `memory_ops_ptx`,
//! `gpu_memory_ops`): a histogram built with atomic adds, a MoE-style row gather and
//! scatter, atomics through index tiles (with duplicate indices), masked loads with a fill
//! value and masked stores, and an element gather; and their f64 / exact references.

#![allow(dead_code)]

use kiln::ir::{DType, HostTensor, TensorData};
use kiln::prelude::*;

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
pub fn ints(rng: &mut kiln_tests::inputs::Rng, shape: &[usize], lo: i64, hi: i64) -> HostTensor {
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
