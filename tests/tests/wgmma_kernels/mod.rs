//! Kernels whose mmas sm_90a runs as wgmma without warp roles (outside a warp-specialised
//! ring), shared by the CPU tests (`wgmma_general.rs`: interpreter vs f64, the PTX's
//! structure, ptxas) and the GPU tests (`gpu_wgmma_general.rs`): both operands read
//! transposed from loaded tiles (A MN-major, B K-major), in one or two warpgroups; two
//! chained mmas whose second A is the first's result in registers (the RS form) and whose
//! B is read untransposed (MN-major); an A gathered before a loop; the f64 references.

#![allow(dead_code)]

use kiln::prelude::*;
use kiln_ir::HostTensor;

/// `c = a^T @ b^T` for `a: [K, M]`, `b: [N, K]`, a pipelined loop over K: A is the transpose
/// of its loaded tile (read MN-major), B too (read K-major); `NW` warps hold `BM = 16 NW`
/// rows, so 8 warps are two warpgroups, each reading its own 64 columns of `a`'s tile. On
/// sm_90a a warp-specialised ring with `WS` (its stages TMA boxes), else wgmma without
/// warp roles (cp.async buffers).
#[kernel(num_warps = NW, grid = [BM, BN, 1])]
pub fn wgmma_transposed(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 64)] BK: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = false)] WS: bool,
) {
    warp_specialize(WS);
    let (mb, nb) = (block_id().x, block_id().y);
    let k = a.dim(0);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = 2) {
        let x = a.tile([BK, BM], [kb * BK, mb * BM]).load();
        let y = b.tile([BN, BK], [nb * BN, kb * BK]).load();
        acc = mma_acc(&x.t(), &y.t(), &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// `o = sum_j bf16(scale * q k_j^T) v_j` over blocks `j` of `BN` keys: attention's forward
/// without the softmax, in a loop that is not pipelined (no TMA ring: each load waits for
/// its copies). The first mma reads `q` (loaded once) and `k_j.t()`, the second takes the
/// first's result from registers as A and `v_j` as B, its accumulator carried across the
/// loop; with `D = 128` every operand's rows span two 128-byte swizzle rows.
#[kernel(num_warps = 4, grid = [BM, 1, 1])]
pub fn wgmma_chain(
    q: Tensor<bf16, 2>,
    k: Tensor<bf16, 2>,
    v: Tensor<bf16, 2>,
    o: TensorMut<f32, 2>,
    scale: f32,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 128)] D: usize,
) {
    let mb = block_id().x;
    let sk = k.dim(0);
    let qt = q.tile([BM, D], [mb * BM, 0]).load();
    let mut acc = zeros::<f32>([BM, D]);
    for j in 0..cdiv(sk, BN) {
        let kt = k.tile([BN, D], [j * BN, 0]).load();
        let vt = v.tile([BN, D], [j * BN, 0]).load();
        let s = mma(&qt, &kt.t()) * scale;
        acc = mma_acc(&s.cast::<bf16>(), &vt, &acc);
    }
    o.tile([BM, D], [mb * BM, 0]).store(acc);
}

/// `c = a[rows] @ (b_0 + b_1 + ..)` for `a: [R, D]`, `rows: [M]`, `b: [J D, N]` (blocks
/// `b_j` of `D` rows), `c: [M, N]`: block `(mb, nb)` gathers its `BM` rows of `a` through
/// the index tile of `rows` once, before a pipelined loop over the `b_j` whose every mma
/// reads them (a decode block's queries across its key loop). A row whose index lies
/// outside `a` (a negative one) reads zeros. sm_90a writes the gathered tile once into
/// shared memory where it is loaded and every wgmma of the loop reads it there (the SS
/// form); `NW = 8` is two warpgroups, `D = 128` rows of 256 bytes (column boxes).
#[kernel(num_warps = NW, grid = [BM, BN, 1])]
pub fn wgmma_held_a(
    a: Tensor<bf16, 2>,
    rows: Tensor<i32, 1>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 64)] D: usize,
    #[comptime(default = 4)] NW: usize,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let idx = rows.tile([BM], [mb * BM]).load();
    let x = a.tile([BM, D], [0, 0]).index(0, idx).load();
    let mut acc = zeros::<f32>([BM, BN]);
    for j in pipelined(0..b.dim(0) / D, stages = 2) {
        let y = b.tile([D, BN], [j * D, nb * BN]).load();
        acc = mma_acc(&x, &y, &acc);
    }
    c.tile([BM, BN], [mb * BM, nb * BN]).store(acc);
}

/// [`wgmma_held_a`] in f64.
pub fn held_a(a: &HostTensor, rows: &[i32], b: &HostTensor) -> Vec<f64> {
    let (r, d, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let blocks = b.shape[0] / d;
    let mut c = vec![0.0; rows.len() * n];
    for (i, &ri) in rows.iter().enumerate() {
        let Ok(ri) = usize::try_from(ri) else {
            continue;
        };
        if ri >= r {
            continue;
        }
        for j in 0..blocks {
            for k in 0..d {
                let x = av[ri * d + k];
                for col in 0..n {
                    c[i * n + col] += x * bv[(j * d + k) * n + col];
                }
            }
        }
    }
    c
}

/// The row indices of [`wgmma_held_a`]'s `m` rows into `a` of `r` rows: a shuffle with
/// repeats, every seventh row outside `a` (fully masked: negative or past the end).
pub fn held_rows(rng: &mut kiln_tests::inputs::Rng, m: usize, r: usize) -> Vec<i32> {
    (0..m)
        .map(|i| match i % 7 {
            3 => -1 - (i as i32),
            6 => (r + i) as i32,
            _ => rng.range(0, r) as i32,
        })
        .collect()
}

/// `a^T @ b^T` in f64 for `a: [K, M]`, `b: [N, K]`.
pub fn gemm_tt(a: &HostTensor, b: &HostTensor) -> Vec<f64> {
    let (k, m, n) = (a.shape[0], a.shape[1], b.shape[0]);
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let mut c = vec![0.0; m * n];
    for p in 0..k {
        for i in 0..m {
            let x = av[p * m + i];
            for j in 0..n {
                c[i * n + j] += x * bv[j * k + p];
            }
        }
    }
    c
}

/// [`wgmma_chain`] in f64, the scores rounded to bf16 as the kernel's A operand holds them.
pub fn chain(q: &HostTensor, k: &HostTensor, v: &HostTensor, scale: f64) -> Vec<f64> {
    let (sq, d, sk) = (q.shape[0], q.shape[1], k.shape[0]);
    let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let mut o = vec![0.0; sq * d];
    for i in 0..sq {
        for j in 0..sk {
            let s = scale * (0..d).map(|c| qv[i * d + c] * kv[j * d + c]).sum::<f64>();
            let s = f64::from(kiln::ir::rounding::to_bf16(s).to_f32());
            for c in 0..d {
                o[i * d + c] += s * vv[j * d + c];
            }
        }
    }
    o
}

/// `c = sum_i a_i w` over the `BM`-row tiles `a_i` of `a: [rows, K]` (rows past `rows` read
/// as 0): the tiles stream through a pipelined loop while the weight tile is loaded once
/// before it, `w: [K, N]` (read MN-major) or, with `WT`, `w: [N, K]` read as `w.t()`
/// (K-major). On sm_90a a warp-specialised ring whose B is a once load, held in shared memory
/// for every iteration. One block per `BN` columns of `c: [BM, N]`.
#[kernel(num_warps = NW, grid = [BN, 1, 1])]
pub fn ring_held_b(
    a: Tensor<bf16, 2>,
    w: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 64)] K: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = false)] WT: bool,
) {
    let nb = block_id().x;
    let rows = a.dim(0);
    let mut acc = zeros::<f32>([BM, BN]);
    if WT {
        let wt = w.tile([BN, K], [nb * BN, 0]).load();
        for i in pipelined(0..cdiv(rows, BM), stages = 2) {
            let x = a.tile([BM, K], [i * BM, 0]).load();
            acc = mma_acc(&x, &wt.t(), &acc);
        }
    } else {
        let wt = w.tile([K, BN], [0, nb * BN]).load();
        for i in pipelined(0..cdiv(rows, BM), stages = 2) {
            let x = a.tile([BM, K], [i * BM, 0]).load();
            acc = mma_acc(&x, &wt, &acc);
        }
    }
    c.tile([BM, BN], [0, nb * BN]).store(acc);
}

/// The [`ring_held_b`] configurations the CPU and GPU tests run: the weight read MN-major and
/// K-major, K of 64 and 128 (boxed), one and two consumer warpgroups, N of 64 and 128.
pub fn ring_held_b_configs() -> [RingHeldBComptime; 4] {
    let base = RingHeldBComptime::default();
    [
        base,
        RingHeldBComptime { WT: true, ..base },
        RingHeldBComptime {
            BM: 128,
            NW: 8,
            K: 128,
            ..base
        },
        RingHeldBComptime {
            BN: 128,
            K: 128,
            WT: true,
            ..base
        },
    ]
}

/// [`ring_held_b`]'s result in f64: `sum_i a_i w` for `a: [rows, K]` in tiles of `bm` rows,
/// `w: [K, N]` (or `[N, K]` when `transposed`), as `[bm, N]`.
pub fn held_b(a: &HostTensor, w: &HostTensor, bm: usize, transposed: bool) -> Vec<f64> {
    let (rows, k) = (a.shape[0], a.shape[1]);
    let n = if transposed { w.shape[0] } else { w.shape[1] };
    let (av, wv) = (a.to_f64_vec(), w.to_f64_vec());
    let weight = |x: usize, j: usize| {
        if transposed {
            wv[j * k + x]
        } else {
            wv[x * n + j]
        }
    };
    let mut c = vec![0.0; bm * n];
    for r in 0..rows {
        for j in 0..n {
            c[(r % bm) * n + j] += (0..k).map(|x| av[r * k + x] * weight(x, j)).sum::<f64>();
        }
    }
    c
}

/// `o = sum_j bf16(q k_j^T) k_j` over the `BN`-row blocks `k_j` of `k: [rows, D]` (rows past
/// the end read as 0), `q: [.., D]` loaded once: each block's tile is read by both mmas, as
/// `k_j.t()` (K-major) and as `k_j` (MN-major), the way attention's dQ walk reads K. On sm_90a
/// one stage load of the ring serves both operands. `NW` warps hold `BM = 16 NW` rows.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn ring_shared_b(
    q: Tensor<bf16, 2>,
    k: Tensor<bf16, 2>,
    o: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 64)] D: usize,
    #[comptime(default = 4)] NW: usize,
) {
    let mb = block_id().x;
    let qt = q.tile([BM, D], [mb * BM, 0]).load();
    let mut acc = zeros::<f32>([BM, D]);
    for j in pipelined(0..cdiv(k.dim(0), BN), stages = 2) {
        let kt = k.tile([BN, D], [j * BN, 0]).load();
        let s = mma(&qt, &kt.t());
        acc = mma_acc(&s.cast::<bf16>(), &kt, &acc);
    }
    o.tile([BM, D], [mb * BM, 0]).store(acc);
}

/// The [`ring_shared_b`] configurations the CPU and GPU tests run: one and two consumer
/// warpgroups, D of 64 and 128 (boxed rows), 64 and 128 keys a block.
pub fn ring_shared_b_configs() -> [RingSharedBComptime; 3] {
    let base = RingSharedBComptime::default();
    [
        base,
        RingSharedBComptime {
            BM: 128,
            NW: 8,
            D: 128,
            ..base
        },
        RingSharedBComptime {
            BN: 128,
            D: 128,
            ..base
        },
    ]
}

/// A keys-major walk with a staged A (attention backward's dK and dQ without the softmax): a
/// block holds `k`'s `BN` rows (A, loaded once) and walks `q` in blocks of `BM` rows (B, per
/// stage): `s^T = k q^T` (`[BN, BM]`), then `oq = (s^T)^T k` for the query block (A the
/// transpose of a register tile: the consumers stage it through shared memory, read
/// MN-major) and `ok += s^T q` (A in registers, the RS form; `q`'s stage read K-major for
/// the scores and MN-major here). `WS = false` turns warp specialisation off.
#[kernel(num_warps = NW)]
pub fn ring_staged_a(
    q: Tensor<bf16, 2>,
    k: Tensor<bf16, 2>,
    oq: TensorMut<f32, 2>,
    ok: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 64)] D: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = true)] WS: bool,
) {
    warp_specialize(WS);
    let kt = k.tile([BN, D], [0, 0]).load();
    let mut acc = zeros::<f32>([BN, D]);
    for j in pipelined(0..cdiv(q.dim(0), BM), stages = 2) {
        let qt = q.tile([BM, D], [j * BM, 0]).load();
        let st = mma(&kt, &qt.t()).cast::<bf16>();
        oq.tile([BM, D], [j * BM, 0]).store(mma(&st.t(), &kt));
        acc = mma_acc(&st, &qt, &acc);
    }
    ok.tile([BN, D], [0, 0]).store(acc);
}

/// The [`ring_staged_a`] configurations the CPU and GPU tests run: one and two consumer
/// warpgroups, D of 64 and 128 (boxed rows).
pub fn ring_staged_a_configs() -> [RingStagedAComptime; 3] {
    let base = RingStagedAComptime::default();
    [
        base,
        RingStagedAComptime { D: 128, ..base },
        RingStagedAComptime {
            BM: 128,
            BN: 128,
            NW: 8,
            ..base
        },
    ]
}

/// [`ring_staged_a`]'s results in f64 (the scores unrounded): `oq[i] = sum_j (k_j . q_i) k_j`
/// (`[m, D]`) and `ok[j] = sum_i (k_j . q_i) q_i` (`[n, D]`).
pub fn staged_a(q: &HostTensor, k: &HostTensor) -> (Vec<f64>, Vec<f64>) {
    let (m, d, n) = (q.shape[0], q.shape[1], k.shape[0]);
    let (qv, kv) = (q.to_f64_vec(), k.to_f64_vec());
    let (mut oq, mut ok) = (vec![0.0; m * d], vec![0.0; n * d]);
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..d).map(|x| qv[i * d + x] * kv[j * d + x]).sum();
            for x in 0..d {
                oq[i * d + x] += s * kv[j * d + x];
                ok[j * d + x] += s * qv[i * d + x];
            }
        }
    }
    (oq, ok)
}

/// [`ring_shared_b`]'s result in f64 (the scores unrounded): `sum_j (q k_j^T) k_j`, `[m, D]`.
pub fn shared_b(q: &HostTensor, k: &HostTensor) -> Vec<f64> {
    let (m, d, rows) = (q.shape[0], q.shape[1], k.shape[0]);
    let (qv, kv) = (q.to_f64_vec(), k.to_f64_vec());
    let mut o = vec![0.0; m * d];
    for i in 0..m {
        for j in 0..rows {
            let s: f64 = (0..d).map(|x| qv[i * d + x] * kv[j * d + x]).sum();
            for x in 0..d {
                o[i * d + x] += s * kv[j * d + x];
            }
        }
    }
    o
}
