//! FlashAttention-2's backward pass: the gradients `dq`, `dk`, `dv` of [`attention`]'s inputs
//! given `dout = dL/do`, its output `o` and the log-sum-exp `lse` [`attention_lse`] writes,
//! with every mask and cap of the forward, in three kernels (docs/kernels.md says how they
//! divide the work).
//!
//! [`attention`]: crate::attention::attention
//! [`attention_lse`]: crate::attention::attention_lse

use kiln::ir::dsl::{Index, Tensor};
use kiln::prelude::*;

use crate::attention::{
    KeyWalk, LOG2E, Rows, ScoreAxes, Varlen, Window, kv_head, mask, score_factor, soft_cap,
};

/// The comptime parameters of the backward kernels; the first seven mean what
/// [`AttentionParams`](crate::attention::AttentionParams)'s do (the forward's call must have
/// had the same, [`AttentionBwdParams::of_forward`]).
#[comptime]
pub struct AttentionBwdParams {
    /// Head dim: 64, 96, 128 or 256 (a multiple of 32).
    #[comptime(default = 128)]
    pub d: usize,
    /// Head dim of `v`, `o`, `dout` and `dv` when it differs from `d` (the forward's
    /// [`AttentionParams::dv`](crate::attention::AttentionParams::dv), by `d`'s rules); 0: `d`.
    #[comptime(default = 0)]
    pub dv: usize,
    /// Whether each query sees only the keys up to its diagonal (aligned bottom-right).
    #[comptime(default = false)]
    pub causal: bool,
    /// Query heads per key/value head.
    #[comptime(default = 1)]
    pub kv_group: usize,
    /// The element type of `q`, `k`, `v`, `o`, `dout` and the gradients: bf16 or f16.
    #[comptime(default = DType::Bf16)]
    pub dtype: DType,
    /// Keys before its diagonal a query sees; -1: all of them.
    #[comptime(default = -1)]
    pub window_left: i32,
    /// Keys after its diagonal a query sees; -1: all of them (`causal` makes it 0).
    #[comptime(default = -1)]
    pub window_right: i32,
    /// Keys per chunk a query sees (FlashAttention 3's `attention_chunk`); 0: no chunks.
    #[comptime(default = 0)]
    pub attention_chunk: i32,
    /// The soft-cap of the scores; 0: off.
    #[comptime(default = 0.0)]
    pub softcap: f32,
    /// Query rows per block (a multiple of 16; 0: [`query_block`]'s choice for `d`).
    #[comptime(default = 0)]
    pub block_m: usize,
    /// Keys per block of `attention_bwd_dkdv` (a multiple of 16; 0: [`key_block`]'s choice).
    #[comptime(default = 0)]
    pub block_n: usize,
    /// dQ by [`attention_bwd_dq`] (reproducible bits) instead of atomics.
    #[comptime(default = false)]
    pub deterministic: bool,
    /// Warps per block of every backward kernel (each takes 16 or more rows of every tile:
    /// `block_m` and `block_n` at least `16 num_warps`).
    #[comptime(default = 4)]
    pub num_warps: usize,
    /// Whether the dense `attention_bwd_dkdv` computes its scores keys-major, `S^T = K Q^T`
    /// (the key block every product's M): on sm_90a a warp-specialised ring, whose consumers
    /// stage `dS` through shared memory for dQ. The deterministic kernel, which leaves dQ to
    /// [`attention_bwd_dq`], always does.
    #[comptime(default = false)]
    pub keys_major: bool,
    /// Columns of dK and dV one `attention_bwd_dkdv` block accumulates (a divisor of `d`, a
    /// multiple of 16; 0: [`key_columns`]'s choice). Blocks of the same keys split the rest.
    /// With a `dv` of its own, the columns of dK; dV is split into as many chunks.
    #[comptime(default = 0)]
    pub key_cols: usize,
}

impl AttentionBwdParams {
    /// The backward of a forward call with `p`'s mask, cap, heads and dtype, in the kernels'
    /// own blocks.
    pub fn of_forward(p: &crate::attention::AttentionParams, deterministic: bool) -> Self {
        AttentionBwdParams {
            d: p.d,
            dv: p.dv,
            causal: p.causal,
            kv_group: p.kv_group,
            dtype: p.dtype,
            window_left: p.window_left,
            window_right: p.window_right,
            attention_chunk: p.attention_chunk,
            softcap: p.softcap,
            block_m: 0,
            block_n: 0,
            deterministic,
            num_warps: 4,
            keys_major: false,
            key_cols: 0,
        }
    }

    /// These parameters with the dK/dV tiles measured best for `target` where `self` leaves
    /// them to the defaults (0; `num_warps` 4), for a call whose kernels take sm_90a's rings
    /// or, `no_ring`, one whose kernels cannot (a packed batch's masked loads, or tensors not
    /// all 16-byte aligned: the rings' TMA needs them). On sm_90a
    /// up to `d = 128` one block accumulates every column of its keys (no block recomputes `P`
    /// and `dS` for another's columns); a dense batch whose dQ is the walk's
    /// (`deterministic`: [`Self::dq_walk_is_faster`]) takes at `d = 128` 128 keys a block in
    /// the ring's two consumer warpgroups, and at `d = 256` without a group 128 of the 256
    /// columns; one whose ring adds dQ itself ([`Self::adds_dq_in_ring`]) that ring's tiles.
    /// Other targets keep the defaults (their column splits avoid spills), and so does the walk
    /// at `d = 64`: two warpgroups of 64 keys measured 0.90-1.03x its default tiles (H100).
    /// `kiln check attention_bwd_dkdv --target sm_90a -D d=D -D key_cols=C ...` (ptxas 13.5,
    /// bf16 and f16 alike):
    ///
    /// | d | blocks (m, n, warps) | key_cols | registers | shared, dQ adds | blocks/SM |
    /// |---|---|---|---|---|---|
    /// | 64 | 64, 64, 4 (default) | 64 | 160 | 81 KiB, bulk | 2 |
    /// | 64 | 128, 128, 8 (queries-major ring adding dQ) | 64 | 168 (two consumer warpgroups) | 211 KiB, bulk | 1 |
    /// | 64 | **128, 128, 8** (keys-major ring adding dQ) | 64 | 168 (two consumer warpgroups) | 195 KiB, bulk | 1 |
    /// | 96 | 64, 64, 4 (default) | 32 | 128 | 97 KiB, bulk | 2 |
    /// | 96 | **64, 64, 4** | **96** | 203 | 113 KiB, bulk | 2 |
    /// | 96 | 128, 128, 8 | 96 | 255, spills 68 B | 208 KiB | 1 |
    /// | 128 | 64, 64, 4 (default) | 64 | 167 | 112 KiB, per element | 2 |
    /// | 128 | **64, 64, 4** (packed) | **128** | 252 | 112 KiB, per element | 2 |
    /// | 128 | **64, 128, 8** (dense) | **128** | 168 (two consumer warpgroups) | 193 KiB, none (the walk's dQ) | 1 |
    /// | 128 | 128, 128, 8 | 64 or 128 | needs 256 KiB of shared memory | | |
    /// | 256 | 64, 64, 4 (default, packed) | 64 | 160 | 225 KiB, bulk | 1 |
    /// | 256 | **64, 64, 4** (dense, no group) | **128** | 232 (packed causal: spills 40 B; grouped f16 unaligned: 16 B) | 225 KiB | 1 |
    /// | 256 | 64, 64, 4 | 256 | 255, spills 2252 B | 208 KiB | 1 |
    ///
    /// `scripts/gpu-check.sh bwd-tiles --quick` on an H100 (s = 1k and 4k, causal or not,
    /// TFLOP/s): at `d = 128` 64 keys a block 174-373, 128 keys in two warpgroups 209-414
    /// (1.11-1.20x); at `d = 256` 64 columns 88-166, 128 columns 119-242 (1.36-1.52x).
    /// With a soft-cap or a window the unsplit tiles reach 255 registers and spill (d = 128
    /// with every feature: 4 to 16 bytes; d = 64: up to 228), so those keep the defaults, as
    /// does a packed batch beyond `d = 128`'s columns (its kernels take no ring, their loads
    /// masked). 128 keys in one warpgroup's rows need 128-row query blocks (sm_90a runs
    /// `max rows / 16` warps); the dQ walk keeps its own tiles ([`Self::query_tiles`]). With
    /// sm_80's `mma.sync`, `d = 96` and `128` unsplit spill (28, 60 bytes).
    pub fn tuned(self, target: kiln::ir::Target, no_ring: bool) -> Self {
        // A soft-cap (its gradient keeps the scores) or a window's masks take the registers
        // these tiles leave: 4 to 228 bytes of spills; such calls keep the defaults.
        let windowed = self.window_left >= 0 || self.window_right >= 0 || self.attention_chunk > 0;
        // A `dv` of its own was not measured: its tiles keep the defaults' register budget.
        let own_dv = self.value_dim() != self.d;
        if target != kiln::ir::Target::Sm90a || self.softcap != 0.0 || windowed || own_dv {
            return self;
        }
        // The ring of two consumer warpgroups that adds dQ itself (below).
        if self.adds_dq_in_ring(target, no_ring) {
            let bm = if self.d == 64 { 128 } else { 64 };
            return self.with_blocks((bm, 128, 8, self.d), true);
        }
        // The dense kernels' ring with dQ left to the walk: what the wider tiles were measured
        // in.
        let ring_walk = !no_ring && self.deterministic;
        let (bm, bn, warps, cols) = match (self.d, ring_walk) {
            (96, _) | (128, false) => (64, 64, 4, self.d),
            (128, true) => (64, 128, 8, 128),
            // A group's walk over its query heads takes the registers that 128 columns leave
            // (f16, unaligned: 16 bytes of spills).
            (256, true) if self.kv_group == 1 => (64, 64, 4, 128),
            _ => return self,
        };
        self.with_blocks((bm, bn, warps, cols), self.keys_major)
    }

    /// `self` with blocks `(bm, bn, warps)` where the caller left the defaults, `cols`
    /// columns where it left them to the kernel, and `keys_major`.
    fn with_blocks(
        self,
        (bm, bn, warps, cols): (usize, usize, usize, usize),
        keys_major: bool,
    ) -> Self {
        let blocks_default = self.block_m == 0 && self.block_n == 0 && self.num_warps == 4;
        AttentionBwdParams {
            block_m: if blocks_default { bm } else { self.block_m },
            block_n: if blocks_default { bn } else { self.block_n },
            num_warps: if blocks_default {
                warps
            } else {
                self.num_warps
            },
            key_cols: if self.key_cols == 0 {
                cols
            } else {
                self.key_cols
            },
            keys_major,
            ..self
        }
    }

    /// Whether dK and dV may come from a ring of two consumer warpgroups that also adds dQ
    /// (TMA reductions of its dS K into `dq_accum`: one kernel computing S and dP once, where
    /// the walk's second ring computes them again for dQ): on sm_90a, a call whose kernels
    /// take rings (not `no_ring`) at `d = 64` or `128` with no soft-cap, window or `dv` of its
    /// own, when dQ need not be reproducible. Keys-major, a warpgroup 64 keys: at `d = 128`
    /// 64 queries against 128 keys (dQ's columns split between the warpgroups), at `d = 64`
    /// 128 queries against 128 keys (each thread's 32 query columns' LSE and delta read from
    /// the stage where they are used). At `d = 64` the queries-major form (a warpgroup 64
    /// query rows, P^T and dS^T staged) ran 0.87-0.90x of it (H100, one process, s = 2k..8k,
    /// causal or not; with 4 query heads a key head 0.84-0.93x). A group of query heads walks
    /// all of its heads' query blocks in one loop: its rings ran 1.12-1.30x the walk's
    /// (group 4, s = 2k..8k).
    pub fn adds_dq_in_ring(&self, target: kiln::ir::Target, no_ring: bool) -> bool {
        let windowed = self.window_left >= 0 || self.window_right >= 0 || self.attention_chunk > 0;
        target == kiln::ir::Target::Sm90a
            && !no_ring
            && !self.deterministic
            && matches!(self.d, 64 | 128)
            && self.value_dim() == self.d
            && self.softcap == 0.0
            && !windowed
    }

    /// The tiles of the query-side kernels ([`attention_bwd_preprocess`], [`attention_bwd_dq`],
    /// [`attention_bwd_dq_convert`]) beside `self`'s dK/dV tiles: the same query block (their
    /// grids and `delta`'s rows share it) with the default key block and four warps. The dQ
    /// walk is a ring of one consumer warpgroup; two warpgroups of 64 keys measured slower
    /// for it (H100, d = 128, s = 1k and 4k: 0.91-0.96x of four warps) and a 64-row query
    /// block has no rows for a second warpgroup outside the ring.
    pub fn query_tiles(self) -> Self {
        AttentionBwdParams {
            block_n: 0,
            num_warps: 4,
            ..self
        }
    }

    /// Whether dQ by [`attention_bwd_dq`]'s walk is faster than dQ by atomics on `target`
    /// (`no_ring`: kernels that take no ring, [`Self::tuned`]), so that a caller who did not
    /// ask for reproducible bits gets them anyway. On sm_90a a dense batch's walk runs as two
    /// warp-specialised rings (dK/dV keys-major, then dQ): on the H200 it ran 2.2-3.8x faster
    /// than the atomics kernel at every point measured (s = 1k and 4k, d = 64, 128 and 256,
    /// causal or not: 110-368 against 37-155 TFLOP/s, `scripts/gpu-check.sh attention
    /// --backward --quick`). Without a ring (a packed batch, unaligned tensors), and on other
    /// targets, the walk recomputes every score a second time, so atomics stay. The exception
    /// on sm_90a: where a ring of two consumer warpgroups adds dQ itself
    /// ([`Self::adds_dq_in_ring`]: no score is computed twice), atomics are faster.
    ///
    /// On an H100 in one process (`scripts/gpu-check.sh attention --backward --bwd-candidate
    /// 'kiln_walk=block_n=128,block_m=64,num_warps=8,key_cols=d|'`, b s = 16k, 16 heads, ms),
    /// `d = 128`'s keys-major ring adding dQ against the walk: s = 1k 0.785 / 0.762, 2k
    /// 1.314 / 1.367, 4k 2.396 / 2.741, 8k 4.80 / 5.50; causal 1k 0.605 / 0.508, 2k 0.874 /
    /// 0.817, 4k 1.447 / 1.470, 8k 2.58 / 2.90: it wins once a key block walks 2048 query rows
    /// or more (half of `seqlen_q` on average when causal, times the group's query heads): a
    /// short walk leaves its per-tile start, dK/dV epilogue and the dQ adds' contention to few
    /// iterations. At `d = 64` the keys-major ring against the default of then
    /// (`--bwd-candidate 'kiln_km64=keys_major=true,block_n=128,block_m=128,num_warps=8,
    /// key_cols=d'`, b s = 16k, 32 heads, TFLOP/s): the walk at s = 1k 421 / 361, causal 1k
    /// 288 / 280; the queries-major ring (itself ahead of the walk there) at 2k 495 / 434, 4k
    /// 520 / 468, 8k 525 / 455, causal 4k 460 / 406, 8k 496 / 445: it wins from 512 walked
    /// rows (causal s = 1k) on. With 4 query heads a key head (`--group 4`) the rings against
    /// the walk: d = 64 s = 2k 501 / 392, 4k 487 / 383, causal 8k 498 / 383; d = 128 2k 540 /
    /// 482, 4k 582 / 479, causal 8k 520 / 455.
    pub fn dq_walk_is_faster(
        &self,
        target: kiln::ir::Target,
        no_ring: bool,
        seqlen_q: usize,
    ) -> bool {
        let adds = AttentionBwdParams {
            deterministic: false,
            ..*self
        };
        let walked = self.kv_group * if self.causal { seqlen_q / 2 } else { seqlen_q };
        let least = if self.d == 64 { 512 } else { 2048 };
        let ring_wins = adds.adds_dq_in_ring(target, no_ring) && walked >= least;
        target == kiln::ir::Target::Sm90a && !no_ring && !ring_wins
    }

    /// The head dim of `v`, `o`, `dout` and `dv`: `dv`, or `d` when it is 0.
    pub fn value_dim(&self) -> usize {
        if self.dv == 0 { self.d } else { self.dv }
    }

    /// Query rows per block: `block_m`, or [`query_block`]'s choice.
    pub fn rows(&self) -> usize {
        query_block(self.block_m, self.d)
    }

    /// Keys per block of `attention_bwd_dkdv`: `block_n`, or [`key_block`]'s choice.
    pub fn keys(&self) -> usize {
        key_block(self.block_n, self.d)
    }

    /// Columns of dK (and of dV when `dv = d`) one `attention_bwd_dkdv` block accumulates
    /// (`key_cols`, or [`key_columns`]'s choice; with a wider `dv`, `d` in as many chunks as
    /// [`AttentionBwdParams::value_cols`] makes of `dv` where those are tiles, so that every
    /// block owns a chunk of each: d = 64 beside dv = 128 in two of 32).
    pub fn key_cols(&self) -> usize {
        if self.key_cols != 0 {
            return self.key_cols;
        }
        let (d, dv) = (self.d, self.value_dim());
        let cols = key_columns(d);
        let splits_v = dv / key_columns(dv);
        let w = d / splits_v.max(1);
        let tile = w >= 16 && (w.is_power_of_two() || w.is_multiple_of(32));
        if dv > d && splits_v > d / cols && d.is_multiple_of(splits_v) && tile {
            w
        } else {
            cols
        }
    }

    /// Columns of dV one `attention_bwd_dkdv` block accumulates: [`AttentionBwdParams::
    /// key_cols`] when `dv = d`, else [`key_columns`]'s choice for `dv`, so that a block's f32
    /// dK and dV (a thread's largest state) are no wider than at `dv = d`.
    pub fn value_cols(&self) -> usize {
        let dv = self.value_dim();
        if dv == self.d {
            self.key_cols()
        } else {
            key_columns(dv)
        }
    }

    /// How many blocks of `attention_bwd_dkdv` share one key block: the column chunks of dK
    /// or of dV, whichever are more (with a `dv` of its own, block `j` of a key block owns
    /// chunk `j` of each that has one; the others' products are recomputed and not stored).
    pub fn column_splits(&self) -> usize {
        let of = |n: usize, w: usize| n / w.max(1);
        of(self.d, self.key_cols())
            .max(of(self.value_dim(), self.value_cols()))
            .max(1)
    }

    /// Columns of dQ one [`attention_bwd_dq`] block accumulates ([`dq_columns`]).
    pub fn dq_cols(&self) -> usize {
        dq_columns(self.d)
    }

    /// The grid of [`attention_bwd_preprocess`] and [`attention_bwd_dq_convert`] (and their
    /// varlen forms, `sq` the longest sequence): `(cdiv(sq, rows), heads, batch)`.
    pub fn query_grid(&self, [sq, heads, batch]: [usize; 3]) -> [u32; 3] {
        [sq.div_ceil(self.rows()) as u32, heads as u32, batch as u32]
    }

    /// The grid of [`attention_bwd_dq`] (and its varlen form, `sq` the longest sequence):
    /// `(cdiv(sq, rows) * d / dq_cols, heads, batch)`.
    pub fn dq_grid(&self, [sq, heads, batch]: [usize; 3]) -> [u32; 3] {
        let splits = self.d / self.dq_cols();
        [
            (sq.div_ceil(self.rows()) * splits) as u32,
            heads as u32,
            batch as u32,
        ]
    }

    /// The grid of [`attention_bwd_dkdv`] (and its varlen form, `sk` the longest sequence):
    /// `(cdiv(sk, keys) * column_splits, kv_heads, batch)`.
    pub fn key_grid(&self, [sk, kv_heads, batch]: [usize; 3]) -> [u32; 3] {
        let splits = self.column_splits();
        [
            (sk.div_ceil(self.keys()) * splits) as u32,
            kv_heads as u32,
            batch as u32,
        ]
    }
}

/// Query rows per block when `block_m` is 0: 64 (four warps of 16 rows, the fewest rows the
/// lowering spreads a tile over).
pub fn query_block(block_m: usize, _d: usize) -> usize {
    if block_m == 0 { 64 } else { block_m }
}

/// The columns of dK and dV one `attention_bwd_dkdv` block accumulates: all `d` up to 64,
/// else 64, or 32 of a `d` no multiple of 64 (96): a key block's whole `[block_n,
/// d]` f32 dK and dV (64 registers a thread each at d = 128 with four warps) spill beside
/// the rest of the loop's state. Blocks of the same keys split the columns, each
/// recomputing `P` and `dS` (`2 bm bn d` products of the `5 bm bn d` a block pair costs).
pub fn key_columns(d: usize) -> usize {
    match d {
        ..=64 => d.max(1),
        _ if d.is_multiple_of(64) => 64,
        _ if d.is_multiple_of(32) => 32,
        _ => d,
    }
}

/// The columns of dQ one [`attention_bwd_dq`] block accumulates: all `d` up to 128, else
/// 128 (or 64, 32: what divides `d`): a whole `[block_m, 256]` f32 accumulator (128 registers
/// a thread with four warps) spills beside the scores. Blocks of the same queries split the
/// columns, each recomputing `P` and `dS`.
pub fn dq_columns(d: usize) -> usize {
    match d {
        ..=128 => d.max(1),
        _ if d.is_multiple_of(128) => 128,
        _ if d.is_multiple_of(64) => 64,
        _ if d.is_multiple_of(32) => 32,
        _ => d,
    }
}

/// Rejects (a diagnostic at the caller, the kernel's line) the parameters the backward does
/// not compute: a head dim that is neither a power of two up to 64 nor a multiple of 32 (the
/// column chunks would miss columns), no query head per key/value head.
#[track_caller]
fn validate(p: &AttentionBwdParams) {
    let d = p.d;
    let head_dim = |d: usize| d != 0 && (d <= 64 && d.is_power_of_two() || d.is_multiple_of(32));
    if !head_dim(d) {
        reject("attention backward: `d` must be a power of two up to 64 or a multiple of 32");
    }
    if !head_dim(p.value_dim()) {
        reject("attention backward: `dv` must be a power of two up to 64 or a multiple of 32");
    }
    if p.kv_group == 0 {
        reject("attention backward: `kv_group` must be at least 1");
    }
    let c = p.key_cols;
    if c != 0 && (c > d || !d.is_multiple_of(c) || c != d && !c.is_multiple_of(16)) {
        reject(
            "attention backward: `key_cols` must divide `d` and be a multiple of 16 (or 0: \
             the default)",
        );
    }
}

/// Keys per block of `attention_bwd_dkdv` when `block_n` is 0: 64 (four warps of 16 rows).
pub fn key_block(block_n: usize, _d: usize) -> usize {
    if block_n == 0 { 64 } else { block_n }
}

/// `delta[b, h, i] = sum_x dout[b, h, i, x] * o[b, h, i, x]` (f32) for `o, dout: [batch,
/// heads, sq, d]` into `delta: [batch, heads, sq]`, and `dq_accum: [batch, heads, sq, d]`
/// (f32) zeroed for [`attention_bwd_dkdv`]'s atomics (untouched when `deterministic`).
/// Grid: [`AttentionBwdParams::query_grid`].
#[kernel(num_warps = num_warps)]
pub fn attention_bwd_preprocess(
    o: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    delta: TensorMut<f32, 3>,
    dq_accum: TensorMut<f32, 4>,
    #[comptime] p: AttentionBwdParams,
) {
    preprocess(o, dout, delta, dq_accum, None, p);
}

/// [`attention_bwd_preprocess`] over a packed varlen batch (as
/// [`attention_varlen`](crate::attention::attention_varlen) reads it): `o`, `dout`,
/// `dq_accum` are `[1, heads, total_q, d]`, `delta` `[1, heads, total_q]`. Grid:
/// [`AttentionBwdParams::query_grid`] of the longest sequence.
#[kernel(num_warps = num_warps)]
pub fn attention_bwd_preprocess_varlen(
    o: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    delta: TensorMut<f32, 3>,
    dq_accum: TensorMut<f32, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    #[comptime] p: AttentionBwdParams,
) {
    let packed = Varlen::new(cu_seqlens_q, cu_seqlens_k);
    preprocess(o, dout, delta, dq_accum, Some(packed), p);
}

/// The body of [`attention_bwd_preprocess`] and its varlen form.
#[kernel_fn]
fn preprocess(
    o: Tensor,
    dout: Tensor,
    delta: Tensor,
    dq_accum: Tensor,
    packed: Option<Varlen>,
    p: AttentionBwdParams,
) {
    validate(&p);
    let (bm, d, dv) = (p.rows(), p.d, p.value_dim());
    let (mb, h, b) = (block_id().x, block_id().y, block_id().z);
    let rows = Rows::of(o, o, b, packed);
    let q0 = mb * bm;
    // In column chunks of at most 64: two whole f32 [bm, 256] tiles would spill. `o` and
    // `dout` are `dv` wide, `dq_accum` `d`: one loop zeroes the latter when they match. A
    // runtime loop: unrolled, ptxas loads every chunk up front, and at four chunks its
    // occupancy choice (96 registers) spilled.
    let w = dq_chunk(dv);
    let mut sum = zeros::<f32>([bm]);
    for c in 0..dv / w {
        let at = [rows.batch, h, rows.query(q0), c * w];
        let os = o.tile([bm, w], at).load().cast::<f32>();
        let dos = dout.tile([bm, w], at).load().cast::<f32>();
        sum = sum + row_sum(&(os * dos));
        if !p.deterministic && dv == d {
            zero_dq(dq_accum.tile([bm, w], at), rows, (bm, w));
        }
    }
    if !p.deterministic && dv != d {
        let w = dq_chunk(d);
        for c in unroll(0..d / w) {
            let at = [rows.batch, h, rows.query(q0), c * w];
            zero_dq(dq_accum.tile([bm, w], at), rows, (bm, w));
        }
    }
    let rows_at = [rows.batch, h, rows.query(q0)];
    rows.store(delta.tile([bm], rows_at), sum, 2);
}

/// Zeroes `tile` (`[bm, w]` of `dq_accum`), in a packed batch only the sequence's rows.
#[track_caller]
fn zero_dq(tile: kiln::ir::dsl::TileView, rows: Rows, (bm, w): (usize, usize)) {
    rows.store(tile, zeros::<f32>([bm, w]), 2);
}

/// dK and dV, and (unless `deterministic`) dQ's shares added into `dq_accum`, for `q, dout:
/// [batch, heads, sq, d]`, `k, v, dk, dv: [batch, heads / kv_group, sk, d]` (`dtype`), the
/// forward's `lse: [batch, heads, sq]` and [`attention_bwd_preprocess`]'s `delta` and zeroed
/// `dq_accum` (f32; untouched when `deterministic`), `scale` the forward's. A key/value
/// head's dK and dV sum over the query heads of its group. Grid:
/// [`AttentionBwdParams::key_grid`].
#[kernel(num_warps = num_warps)]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dkdv(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    lse: Tensor<f32, 3>,
    delta: Tensor<f32, 3>,
    dq_accum: TensorMut<f32, 4>,
    dk: TensorMut<dtype, 4>,
    dv: TensorMut<dtype, 4>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let io = BwdTensors::new((q, k, v, dout), (lse, delta));
    dkdv(io, dq_accum, (dk, dv), None, scale, p);
}

/// [`attention_bwd_dkdv`] over a packed varlen batch: `q`, `dout`, `dq_accum` `[1, heads,
/// total_q, d]`, `k`, `v`, `dk`, `dv` `[1, heads / kv_group, total_k, d]`, `lse`, `delta`
/// `[1, heads, total_q]`, sequence `b`'s rows and keys given by `cu_seqlens_q/k` (as
/// [`attention_varlen`](crate::attention::attention_varlen)). Grid:
/// [`AttentionBwdParams::key_grid`] of the longest sequence.
#[kernel(num_warps = num_warps)]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dkdv_varlen(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    lse: Tensor<f32, 3>,
    delta: Tensor<f32, 3>,
    dq_accum: TensorMut<f32, 4>,
    dk: TensorMut<dtype, 4>,
    dv: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let io = BwdTensors::new((q, k, v, dout), (lse, delta));
    let packed = Varlen::new(cu_seqlens_q, cu_seqlens_k);
    dkdv(io, dq_accum, (dk, dv), Some(packed), scale, p);
}

/// [`attention_bwd_dkdv_varlen`] of [`attention_varlen_used`]'s call (`seqused_q`,
/// `seqused_k`: `[batch]`, i32): sequence `b`'s first `seqused_q[b]` rows and
/// `seqused_k[b]` keys, its keys past those get dK = dV = 0 (FlashAttention 3's: the
/// forward never read them). [`attention_bwd_preprocess_varlen`] and
/// [`attention_bwd_dq_convert_varlen`] serve it as they are: they zero and convert every
/// row of the sequences, and no row past `seqused_q[b]` adds into `dq_accum`.
///
/// [`attention_varlen_used`]: crate::attention::attention_varlen_used
#[kernel(num_warps = num_warps)]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dkdv_varlen_used(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    lse: Tensor<f32, 3>,
    delta: Tensor<f32, 3>,
    dq_accum: TensorMut<f32, 4>,
    dk: TensorMut<dtype, 4>,
    dv: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    seqused_q: Tensor<i32, 1>,
    seqused_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let io = BwdTensors::new((q, k, v, dout), (lse, delta));
    let packed = Varlen::of(cu_seqlens_q, cu_seqlens_k, Some((seqused_q, seqused_k)));
    dkdv(io, dq_accum, (dk, dv), Some(packed), scale, p);
}

/// `dq = dq_accum * scale` in `dtype`, `dq_accum: [batch, heads, sq, d]` (f32) as
/// [`attention_bwd_dkdv`] left it. Grid: [`AttentionBwdParams::query_grid`].
#[kernel(num_warps = num_warps)]
pub fn attention_bwd_dq_convert(
    dq_accum: Tensor<f32, 4>,
    dq: TensorMut<dtype, 4>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    dq_convert(dq_accum, dq, None, scale, p);
}

/// [`attention_bwd_dq_convert`] over a packed varlen batch (`[1, heads, total_q, d]`).
#[kernel(num_warps = num_warps)]
pub fn attention_bwd_dq_convert_varlen(
    dq_accum: Tensor<f32, 4>,
    dq: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let packed = Varlen::new(cu_seqlens_q, cu_seqlens_k);
    dq_convert(dq_accum, dq, Some(packed), scale, p);
}

/// The body of [`attention_bwd_dq_convert`] and its varlen form.
#[kernel_fn]
fn dq_convert(
    dq_accum: Tensor,
    dq: Tensor,
    packed: Option<Varlen>,
    scale: Value,
    p: AttentionBwdParams,
) {
    validate(&p);
    let (bm, d) = (p.rows(), p.d);
    let (mb, h, b) = (block_id().x, block_id().y, block_id().z);
    let rows = Rows::of(dq_accum, dq_accum, b, packed);
    let at = [rows.batch, h, rows.query(mb * bm), 0];
    let acc = dq_accum.tile([bm, d], at).load();
    rows.store(dq.tile([bm, d], at), (acc * scale).cast_to(p.dtype), 2);
}

/// dQ without atomics (`deterministic`): for `q, dout, dq: [batch, heads, sq, d]`, `k, v:
/// [batch, heads / kv_group, sk, d]`, the forward's `lse` and [`attention_bwd_preprocess`]'s
/// `delta` (`[batch, heads, sq]`), each block owns `block_m` query rows (and
/// [`dq_columns`] of their dQ) and walks the key blocks they see, as the forward does. Grid:
/// [`AttentionBwdParams::dq_grid`].
#[kernel(num_warps = num_warps)]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dq(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    lse: Tensor<f32, 3>,
    delta: Tensor<f32, 3>,
    dq: TensorMut<dtype, 4>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let io = BwdTensors::new((q, k, v, dout), (lse, delta));
    dq_walk(io, dq, None, scale, p);
}

/// [`attention_bwd_dq`] over a packed varlen batch (shapes as [`attention_bwd_dkdv_varlen`]'s).
#[kernel(num_warps = num_warps)]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dq_varlen(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    lse: Tensor<f32, 3>,
    delta: Tensor<f32, 3>,
    dq: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let io = BwdTensors::new((q, k, v, dout), (lse, delta));
    let packed = Varlen::new(cu_seqlens_q, cu_seqlens_k);
    dq_walk(io, dq, Some(packed), scale, p);
}

/// [`attention_bwd_dq_varlen`] with used lengths, as [`attention_bwd_dkdv_varlen_used`]:
/// rows past `seqused_q[b]` get dQ = 0.
#[kernel(num_warps = num_warps)]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dq_varlen_used(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    dout: Tensor<dtype, 4>,
    lse: Tensor<f32, 3>,
    delta: Tensor<f32, 3>,
    dq: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    seqused_q: Tensor<i32, 1>,
    seqused_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionBwdParams,
) {
    let io = BwdTensors::new((q, k, v, dout), (lse, delta));
    let packed = Varlen::of(cu_seqlens_q, cu_seqlens_k, Some((seqused_q, seqused_k)));
    dq_walk(io, dq, Some(packed), scale, p);
}

/// Loads `tile` of `shape` whose first row is row `first` of a sequence of `len`: in a packed
/// batch the rows past `len` (the next sequence's, or rows no sequence owns, which may hold
/// anything, NaN included) read as 0 and are never read from memory. For the row statistics
/// `lse` and `delta`, whose NaN would survive the mask (`-inf - NaN`), and for the `mma`
/// operands, whose NaN or infinity would survive `P = 0` (`0 * inf`); the lowering copies the
/// latter into shared memory clipped at the bound.
#[track_caller]
fn load_seq<const R: usize>(
    tile: kiln::ir::dsl::TileView,
    rows: Rows,
    (first, len): (Value, Value),
    shape: [Index; R],
) -> Value {
    use kiln::ir::dsl::Compare;
    match rows.packed {
        Some(_) => tile.load_masked(Compare::lt(iota(shape, 0) + first, len), 0),
        None => tile.load(),
    }
}

/// The forward's `lse` and `delta` of query rows `q0..q0 + bm` of head `h` (`[bm]`, rows past
/// the sequence 0: [`load_seq`]).
#[kernel_fn]
fn load_row_stats(
    io: BwdTensors,
    rows: Rows,
    (h, q0): (Value, Value),
    bm: usize,
) -> (Value, Value) {
    let row_at = [rows.batch, h, rows.query(q0)];
    let seq = (q0, rows.sq);
    (
        load_seq(io.lse.tile([bm], row_at), rows, seq, [bm]),
        load_seq(io.delta.tile([bm], row_at), rows, seq, [bm]),
    )
}

/// The inputs every gradient kernel reads.
#[derive(Clone, Copy, Debug)]
struct BwdTensors {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    lse: Tensor,
    delta: Tensor,
}

impl BwdTensors {
    /// `q, k, v, dout` and `lse, delta`.
    fn new(
        (q, k, v, dout): (Tensor, Tensor, Tensor, Tensor),
        (lse, delta): (Tensor, Tensor),
    ) -> BwdTensors {
        BwdTensors {
            q,
            k,
            v,
            dout,
            lse,
            delta,
        }
    }
}

/// One block pair's recomputed probabilities and score gradient: for query rows `q0..` and
/// keys `k0..` with Q `qs`, dO `dos`, K `ks`, V `vs` in the same column chunks (`[bm, w]`,
/// `[bn, w]`; one chunk of all `d` columns, or several: [`product_nt`]), `P = exp2(S log2(e)
/// - lse log2(e))` masked as the forward, and `dS = P (dP - delta)`, `dP = dO V^T`, times the
/// soft-cap's derivative `1 - tanh^2`. Returns `(P, dS)` as f32 tiles laid out as `axes` says
/// (`[bm, bn]`, or keys-major `[bn, bm]`: `P^T` and `dS^T`, from `K Q^T` and `V dO^T`).
/// `mask_it` (a block-uniform flag) applies the mask, and in a packed batch the bound of the
/// sequence's rows (`rows_bound`): rows past it belong to the next sequence.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn probs_and_grad(
    axes: ScoreAxes,
    (qs, dos, ks, vs): (&[Value], &[Value], &[Value], &[Value]),
    (lse_t, delta_t): (Value, Value),
    (q0, k0, sq, sk): (Value, Value, Value, Value),
    mask_it: Value,
    rows_bound: bool,
    qk_scale: Value,
    (bm, bn): (usize, usize),
    w: Window,
    softcap: f32,
) -> (Value, Value) {
    let keys_major = axes.keys_major();
    let scores = if keys_major {
        product_nt(ks, qs)
    } else {
        product_nt(qs, ks)
    };
    // Scores in base 2 (soft-capped: `softcap * log2(e) * tanh`), as the forward's.
    let s = soft_cap(scores * qk_scale, softcap);
    let masked = if mask_it {
        let s = mask(s, axes, q0, k0, sq, sk, (bm, bn), w);
        if rows_bound {
            select(axes.queries(q0, (bm, bn)) < sq, s, f32::NEG_INFINITY)
        } else {
            s
        }
    } else {
        s
    };
    // A row that sees no key has lse = +inf: every term is exp2(-inf) = 0.
    let probs = exp2(&(masked - axes.per_query(lse_t * LOG2E)));
    let dp = if keys_major {
        product_nt(vs, dos)
    } else {
        product_nt(dos, vs)
    };
    let ds = probs * (dp - axes.per_query(delta_t));
    (probs, cap_grad(ds, masked, softcap))
}

/// `ds` times the soft-cap's derivative `1 - tanh^2(s_raw / softcap)`, read from the capped
/// base-2 scores `s = softcap * log2(e) * tanh(..)` as masked (a masked score is `-inf`, its
/// factor clamped to 0 as its `P` is; the clamp also keeps a rounded `|tanh|` a hair above
/// 1 from flipping the sign); `ds` itself without a cap. The masked scores, not the capped
/// ones before the mask, so that only one `[bm, bn]` score tile stays live.
#[kernel_fn]
fn cap_grad(ds: Value, s: Value, softcap: f32) -> Value {
    if softcap > 0.0 {
        let t = s * (1.0 / (softcap * LOG2E));
        ds * max(&(1.0 - t * t), 0.0)
    } else {
        ds
    }
}

/// `sum_j a[j] b[j]^T` over the column chunks `a[j]` (`[m, w]`) and `b[j]` (`[n, w]`) of two
/// tiles: their product `a b^T` (one mma when one chunk holds every column).
#[track_caller]
fn product_nt(a: &[Value], b: &[Value]) -> Value {
    let mut acc = mma(a[0], b[0].t());
    for (x, y) in a.iter().zip(b).skip(1) {
        acc = mma_acc(x, y.t(), acc);
    }
    acc
}

/// The query blocks that see key block `k0..k0 + bn` (of `sk` keys, `sq` queries, window
/// `w`): `lo..hi`, and the blocks in which every row sees every key of it, `unmasked_lo..
/// unmasked_hi` (`None`: unbounded on that side). Query `i` sees key `j` iff `i + sk - sq -
/// left <= j <= i + sk - sq + right`.
struct QueryWalk {
    lo: Option<Value>,
    hi: Value,
    unmasked_lo: Option<Value>,
    unmasked_hi: Option<Value>,
}

impl QueryWalk {
    #[track_caller]
    fn of(k0: Value, sq: Value, sk: Value, (bm, bn): (usize, usize), w: Window) -> QueryWalk {
        if w.chunk > 0 {
            return QueryWalk::chunked(k0, (sq, sk), (bm, bn), w);
        }
        let all = cdiv(sq, bm);
        let (lo, unmasked_lo) = if w.right >= 0 {
            // Row i sees key j from i >= j - (sk - sq) - right on: the block's first key
            // from row k0 - (sk - sq) - right, its last from bn - 1 rows later.
            let first = k0 - (sk - sq) - w.right;
            let lo = max(first, 0) / bm;
            (Some(lo), Some(cdiv(max(first + (bn - 1), 0), bm)))
        } else {
            (None, None)
        };
        let (hi, unmasked_hi) = if w.left >= 0 {
            // Row i sees key j up to i <= j - (sk - sq) + left: the block's last key up to
            // row k0 + bn - 1 - (sk - sq) + left, its first up to bn - 1 rows before.
            let last = k0 - (sk - sq) + w.left;
            let hi = min(all, max(cdiv(last + bn, bm), 0));
            (hi, Some(max(last + 1, 0) / bm))
        } else {
            (all, None)
        };
        QueryWalk {
            lo,
            hi,
            unmasked_lo,
            unmasked_hi,
        }
    }

    /// [`QueryWalk::of`] with chunks: the rows that see key `j` are the diagonals the
    /// transposed window gives `j` ([`Window::transposed`]), less `sk - sq`; the first key
    /// bounds the start and the last the end, as a query block's rows bound its key walk.
    #[track_caller]
    fn chunked(k0: Value, (sq, sk): (Value, Value), (bm, bn): (usize, usize), w: Window) -> Self {
        let t = w.transposed();
        let shift = sk - sq;
        let last_key = k0 + (bn - 1);
        let first = t.first_key(k0, None) - shift;
        let last = t.last_key(last_key, None) - shift;
        QueryWalk {
            lo: Some(max(first, 0) / bm),
            hi: min(cdiv(sq, bm), max(cdiv(last + 1, bm), 0)),
            unmasked_lo: Some(cdiv(max(t.first_key(last_key, None) - shift, 0), bm)),
            unmasked_hi: Some(max(t.last_key(k0, None) - shift + 1, 0) / bm),
        }
    }

    /// How many query blocks the walk visits.
    #[track_caller]
    fn count(&self) -> Value {
        match self.lo {
            Some(lo) => max(self.hi - lo, 0),
            None => max(self.hi, 0),
        }
    }

    /// Whether query block `mb` needs the mask: it lies outside `unmasked_lo..unmasked_hi`,
    /// or `outside` holds already.
    #[track_caller]
    fn masks(&self, mb: Value, outside: Value) -> Value {
        use kiln::ir::dsl::{Compare, Logic};
        let m = match self.unmasked_lo {
            Some(lo) => Logic::or(outside, Compare::lt(mb, lo)),
            None => outside,
        };
        match self.unmasked_hi {
            Some(hi) => Logic::or(m, Compare::ge(mb, hi)),
            None => m,
        }
    }
}

/// The body of [`attention_bwd_dkdv`] and its varlen form: see the module's step 2. The
/// query blocks of all `kv_group` heads are one loop (`kv_group x` the blocks that see the
/// key block), so the pipeline runs across heads.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn dkdv(
    io: BwdTensors,
    dq_accum: Tensor,
    (dk, dv): (Tensor, Tensor),
    packed: Option<Varlen>,
    scale: Value,
    p: AttentionBwdParams,
) {
    validate(&p);
    let (d, dv_dim, dtype, group) = (p.d, p.value_dim(), p.dtype, p.kv_group);
    let (bm, bn) = (p.rows(), p.keys());
    let w = Window::new(p.causal, p.window_left, p.window_right, p.attention_chunk);
    let (cols, vcols) = (p.key_cols(), p.value_cols());
    let (hk, b) = (block_id().y, block_id().z);
    // Block x owns key block x / splits and the columns of its first chunk of dK and dV.
    let split = ColumnSplit::of(block_id().x, (d, cols), (dv_dim, vcols));
    let (nb, chunks, vchunks) = (split.block, split.chunks_k, split.chunks_v);
    let rows = Rows::of(io.q, io.k, b, packed);
    let (sq, sk, batch) = (rows.sq, rows.sk, rows.batch);
    let k0 = nb * bn;
    let keys = (k0, sk);
    // Every operand in the same column chunks (V and dO in `dv`'s): the products over all
    // columns sum over them, and chunk 0 (the block's own columns) is also the B operand of
    // its dK, dV and dQ columns, so no column is staged twice.
    let ks = key_chunks(io.k, rows, (hk, keys), (bn, cols), &chunks);
    let vs = key_chunks(io.v, rows, (hk, keys), (bn, vcols), &vchunks);
    let walk = QueryWalk::of(k0, sq, sk, (bm, bn), w);
    // A block past its sequence's keys (the grid covers the longest) walks nothing.
    let n_m = key_walk_end(rows, k0, walk.count());
    let keys_partial = k0 + bn > sk;
    let qk_scale = scale * score_factor(p.softcap);
    // Keys-major scores, `S^T = K Q^T` (always without dQ: `deterministic` leaves it to
    // `attention_bwd_dq`): the key block is every product's M, K and V its held A operands,
    // P^T and dS^T register A operands of dV and dK, Q's and dO's stage tiles B operands read
    // both ways, and dQ = (dS^T)^T K reads a staged A: the form a warp-specialised ring takes.
    // A packed batch's masked loads take no ring (and keys-major, its row bounds spill 60
    // bytes at d = 256 on sm_80): queries-major.
    let axes = if (p.deterministic || p.keys_major) && packed.is_none() {
        ScoreAxes::KeyRows
    } else {
        ScoreAxes::QueryRows
    };
    // Queries-major, sm_90a's ring stages P^T and dS^T for dV and dK each iteration. With one
    // consumer warpgroup that was not timed, so it keeps the lowering that was; with two
    // (FlashAttention 3's d = 64 form: 128 queries against 128 keys, a warpgroup 64 query
    // rows each, the query statistics a row's, dS the register A of dQ) it takes the ring.
    if !axes.keys_major() && p.num_warps < 8 {
        warp_specialize(false);
    }
    let mut acc_k = zeros::<f32>([bn, cols]);
    let mut acc_v = zeros::<f32>([bn, vcols]);
    for t in pipelined(0..n_m * group, stages = 2) {
        let (h, mb) = head_and_block(t, n_m, (walk.lo, hk), group);
        let q0 = mb * bm;
        let (qs, dos) = query_chunks(io, rows, (h, q0), bm, ((cols, &chunks), (vcols, &vchunks)));
        let (lse_t, delta_t) = load_row_stats(io, rows, (h, q0), bm);
        let mask_it = walk.masks(mb, keys_partial);
        let mask_it = with_rows_bound(mask_it, rows, q0 + bm > sq);
        let (probs, ds) = probs_and_grad(
            axes,
            (&qs, &dos, &ks, &vs),
            (lse_t, delta_t),
            (q0, k0, sq, sk),
            mask_it,
            packed.is_some(),
            qk_scale,
            (bm, bn),
            w,
            p.softcap,
        );
        if axes.keys_major() {
            acc_v = mma_acc(&probs.cast_to(dtype), &dos[0], &acc_v);
            let ds = ds.cast_to(dtype);
            if !p.deterministic {
                // dQ = dS K has the block's query rows as M: whole 64-row wgmma blocks, or
                // else (FlashAttention-3's 80 queries at d = 128) its transpose, dQ^T = K^T
                // dS^T, whose M is the key columns (K read transposed, dS^T staged as B).
                let dq = if bm.is_multiple_of(64) {
                    mma(&ds.t(), &ks[0])
                } else {
                    mma(&ks[0].t(), &ds).t()
                };
                add_dq_owned(
                    dq_accum,
                    dq,
                    rows,
                    (h, q0),
                    (chunks[0], (bm, cols)),
                    split.owns_k,
                );
            }
            acc_k = mma_acc(&ds, &qs[0], &acc_k);
        } else {
            acc_v = mma_acc(&probs.cast_to(dtype).t(), &dos[0], &acc_v);
            let ds = ds.cast_to(dtype);
            add_dq_owned(
                dq_accum,
                mma(&ds, &ks[0]),
                rows,
                (h, q0),
                (chunks[0], (bm, cols)),
                split.owns_k,
            );
            acc_k = mma_acc(&ds.t(), &qs[0], &acc_k);
        }
    }
    let c0 = chunks[0];
    let (_, k_end) = grad_ends(rows, packed, b);
    let key_row = rows.key(k0);
    let out_at = [batch, hk, key_row, c0];
    store_keys(
        dk.tile([bn, cols], out_at),
        (acc_k * scale).cast_to(dtype),
        rows,
        (k_end, split.owns_k),
    );
    let v_at = [batch, hk, key_row, vchunks[0]];
    store_keys(
        dv.tile([bn, vcols], v_at),
        acc_v.cast_to(dtype),
        rows,
        (k_end, split.owns_v),
    );
}

/// Key block of block `x` of [`attention_bwd_dkdv`]'s grid (query block of
/// [`attention_bwd_dq`]'s) and the first columns of its `splits` column chunks of `cols`:
/// `(x, [0])` when one block takes all columns, else `x / splits` and chunk `j` at `((x + j)
/// % splits) cols`, chunk 0 the block's own gradient columns.
#[track_caller]
fn block_and_chunks(x: Value, splits: usize, cols: usize) -> (Value, Vec<Index>) {
    if splits <= 1 {
        return (x, vec![Index::Const(0)]);
    }
    let chunk = |j: usize| Index::Value((x + j) % splits * cols);
    (x / splits, (0..splits).map(chunk).collect())
}

/// How block `x` of [`attention_bwd_dkdv`]'s grid splits dK's and dV's columns with the
/// other blocks of its key block: the key block, the column chunks of `d` (`cols` wide) and of
/// `dv` (`vcols` wide) its products sum over, its own first ([`block_and_chunks`]), and,
/// where one of them has fewer chunks than the key block has blocks, whether the block owns
/// one of them (`None`: every block does).
struct ColumnSplit {
    block: Value,
    chunks_k: Vec<Index>,
    chunks_v: Vec<Index>,
    owns_k: Option<Value>,
    owns_v: Option<Value>,
}

impl ColumnSplit {
    #[track_caller]
    fn of(x: Value, (d, cols): (usize, usize), (dv, vcols): (usize, usize)) -> ColumnSplit {
        use kiln::ir::dsl::Compare;
        let (splits_k, splits_v) = (d / cols, dv / vcols);
        if splits_k == splits_v {
            // `dv = d` among them: the one split, its chunks shared when the widths match.
            let (block, chunks_k) = block_and_chunks(x, splits_k, cols);
            let chunks_v = if dv == d {
                chunks_k.clone()
            } else {
                block_and_chunks(x, splits_v, vcols).1
            };
            return ColumnSplit {
                block,
                chunks_k,
                chunks_v,
                owns_k: None,
                owns_v: None,
            };
        }
        let splits = splits_k.max(splits_v);
        let j = x % splits;
        let rotated = |n: usize, w: usize| -> Vec<Index> {
            if n == 1 {
                return vec![Index::Const(0)];
            }
            (0..n).map(|i| Index::Value((j + i) % n * w)).collect()
        };
        let owns = |n: usize| (n < splits).then(|| Compare::lt(j, n));
        ColumnSplit {
            block: x / splits,
            chunks_k: rotated(splits_k, cols),
            chunks_v: rotated(splits_v, vcols),
            owns_k: owns(splits_k),
            owns_v: owns(splits_v),
        }
    }
}

/// The column chunks `0, w, 2w, ..` of `n` columns.
fn plain_chunks(n: usize, w: usize) -> Vec<Index> {
    (0..n / w).map(|j| Index::Const((j * w) as i64)).collect()
}

/// Where a block's gradient stores end, as `(rows, k_end)`: the rows [`Rows::store`] stops
/// at and the tensor row past the sequence's last key. With used lengths (FlashAttention 3's
/// `seqused_q`, `seqused_k`) the ends the offsets give: the rows and keys past the used ones
/// read as 0 and are masked, so their gradients are 0 and are stored as such.
#[track_caller]
fn grad_ends(rows: Rows, packed: Option<Varlen>, b: Value) -> (Rows, Value) {
    match (rows.packed, packed.and_then(|p| p.full_ends(b))) {
        (Some((q_start, k_start, _)), Some((q_end, k_end))) => (
            Rows {
                packed: Some((q_start, k_start, q_end)),
                ..rows
            },
            k_end,
        ),
        _ => (rows, rows.key(rows.sk)),
    }
}

/// Key block `k0..k0 + bn` (`keys = (k0, sk)`) of key/value head `hk` of `t` in the column
/// chunks `[bn, w]` that start at `chunks` (keys past the sequence 0: [`load_seq`]).
#[track_caller]
fn key_chunks(
    t: Tensor,
    rows: Rows,
    (hk, keys): (Value, (Value, Value)),
    (bn, w): (usize, usize),
    chunks: &[Index],
) -> Vec<Value> {
    let shape = [Index::Const(bn as i64), Index::Const(w as i64)];
    let load = |c: Index| {
        let tile = t.tile(
            shape,
            [
                rows.batch,
                Index::Value(hk),
                Index::Value(rows.key(keys.0)),
                c,
            ],
        );
        load_seq(tile, rows, keys, shape)
    };
    chunks.iter().map(|&c| load(c)).collect()
}

/// Column chunks of one width: the width and each chunk's first column.
type Chunks<'a> = (usize, &'a [Index]);

/// Query block `q0..q0 + bm` of head `h`: its Q in the column chunks `[bm, w]` that start at
/// `q_chunks`, its dO in `[bm, wv]` at `v_chunks` (rows past the sequence 0: [`load_seq`]),
/// loaded a chunk of each in turn.
#[track_caller]
fn query_chunks(
    io: BwdTensors,
    rows: Rows,
    (h, q0): (Value, Value),
    bm: usize,
    ((w, q_chunks), (wv, v_chunks)): (Chunks<'_>, Chunks<'_>),
) -> (Vec<Value>, Vec<Value>) {
    let load = |t: Tensor, w: usize, c: Index| {
        let shape = [Index::Const(bm as i64), Index::Const(w as i64)];
        let tile = t.tile(
            shape,
            [rows.batch, Index::Value(h), Index::Value(rows.query(q0)), c],
        );
        load_seq(tile, rows, (q0, rows.sq), shape)
    };
    let (mut qs, mut dos) = (Vec::new(), Vec::new());
    for j in 0..q_chunks.len().max(v_chunks.len()) {
        if let Some(&c) = q_chunks.get(j) {
            qs.push(load(io.q, w, c));
        }
        if let Some(&c) = v_chunks.get(j) {
            dos.push(load(io.dout, wv, c));
        }
    }
    (qs, dos)
}

/// The query head and query block of step `t` of the dK/dV walk of key/value head `hk`:
/// `n_m` blocks from `lo` (0 when `None`) for each of the `group` heads `hk * group..`.
#[track_caller]
fn head_and_block(
    t: Value,
    n_m: Value,
    (lo, hk): (Option<Value>, Value),
    group: usize,
) -> (Value, Value) {
    let (h, step) = if group == 1 {
        (hk, t)
    } else {
        (hk * group + t / n_m, t % n_m)
    };
    match lo {
        Some(lo) => (h, lo + step),
        None => (h, step),
    }
}

/// The end of the dK/dV walk of key block `k0`: `n_m`, or in a packed batch 0 when the block
/// starts at or past the sequence's last key.
#[track_caller]
fn key_walk_end(rows: Rows, k0: Value, n_m: Value) -> Value {
    use kiln::ir::dsl::Compare;
    match rows.packed {
        Some(_) => select(Compare::lt(k0, rows.sk), n_m, 0),
        None => n_m,
    }
}

/// `mask_it`, or in a packed batch also when `past_rows` (the query block reaches past the
/// sequence's last row: rows of the next sequence, which the mask must drop).
#[track_caller]
fn with_rows_bound(mask_it: Value, rows: Rows, past_rows: Value) -> Value {
    use kiln::ir::dsl::Logic;
    match rows.packed {
        Some(_) => Logic::or(mask_it, past_rows),
        None => mask_it,
    }
}

/// Columns [`attention_bwd_preprocess`] reads at a time: all up to 64, else 64 or 32
/// (whichever divides them): two whole f32 `[bm, 256]` tiles would spill.
fn dq_chunk(cols: usize) -> usize {
    match cols {
        ..=64 => cols.max(1),
        _ if cols.is_multiple_of(64) => 64,
        _ => 32,
    }
}

/// [`add_dq`], and nothing unless `owns` (when given) holds: a block that owns no dK columns
/// ([`ColumnSplit`]) adds no dQ either.
#[track_caller]
fn add_dq_owned(
    dq_accum: Tensor,
    dq: Value,
    rows: Rows,
    (h, q0): (Value, Value),
    (c0, (bm, w)): (Index, (usize, usize)),
    owns: Option<Value>,
) {
    match owns {
        Some(owns) => add_dq_if(dq_accum, dq, rows, (h, q0), (c0, (bm, w)), owns),
        None => add_dq(dq_accum, dq, rows, (h, q0), (c0, (bm, w))),
    }
}

/// [`add_dq`] of the rows below `sq` only where `owns` holds, none elsewhere.
#[kernel_fn]
fn add_dq_if(
    dq_accum: Tensor,
    dq: Value,
    rows: Rows,
    (h, q0): (Value, Value),
    (c0, (bm, d)): (Index, (usize, usize)),
    owns: Value,
) {
    let at = [rows.batch, h, rows.query(q0), c0];
    let inside = iota([bm, d], 0) + q0 < select(owns, rows.sq, 0);
    dq_accum.tile([bm, d], at).atomic_add_masked(dq, inside);
}

/// Adds columns `c0..c0 + w` of one query block's dQ share `dq` (`[bm, w]`, unscaled) into
/// `dq_accum`, in a packed batch only the sequence's rows.
#[kernel_fn]
fn add_dq(
    dq_accum: Tensor,
    dq: Value,
    rows: Rows,
    (h, q0): (Value, Value),
    (c0, (bm, d)): (Index, (usize, usize)),
) {
    let at = [rows.batch, h, rows.query(q0), c0];
    if rows.packed.is_some() {
        let inside = iota([bm, d], 0) + q0 < rows.sq;
        dq_accum.tile([bm, d], at).atomic_add_masked(dq, inside);
    } else {
        dq_accum.tile([bm, d], at).atomic_add(dq);
    }
}

/// Stores a key block's gradient, in a packed batch only the sequence's keys (up to
/// `k_end`), and nothing unless `owns` (when given) holds ([`ColumnSplit`]).
#[track_caller]
fn store_keys(
    tile: kiln::ir::dsl::TileView,
    value: Value,
    rows: Rows,
    (k_end, owns): (Value, Option<Value>),
) {
    match (owns, rows.packed) {
        (Some(owns), _) => tile.store_bounded(value, 2, select(owns, k_end, 0)),
        (None, Some(_)) => tile.store_bounded(value, 2, k_end),
        (None, None) => tile.store(value),
    }
}

/// The body of [`attention_bwd_dq`] and its varlen form: a block owns `bm` query rows of one
/// head and walks the key blocks they see (the forward's walk, [`KeyWalk`]), accumulating
/// `dQ = scale dS K`.
#[kernel_fn]
fn dq_walk(
    io: BwdTensors,
    dq: Tensor,
    packed: Option<Varlen>,
    scale: Value,
    p: AttentionBwdParams,
) {
    validate(&p);
    let (d, dv, dtype) = (p.d, p.value_dim(), p.dtype);
    let (bm, bn) = (p.rows(), p.keys());
    let w = Window::new(p.causal, p.window_left, p.window_right, p.attention_chunk);
    let cols = p.dq_cols();
    let (h, b) = (block_id().y, block_id().z);
    // Block x owns query block x / splits and the columns of its first chunk of dQ.
    let (mb, chunks) = block_and_chunks(block_id().x, d / cols, cols);
    // dP = dO V^T sums over all of `dv`'s columns, whichever block: plain chunks of them.
    let vcols = if dv == d { cols } else { dq_columns(dv) };
    let vchunks = if dv == d {
        chunks.clone()
    } else {
        plain_chunks(dv, vcols)
    };
    let rows = Rows::of(io.q, io.k, b, packed);
    let (sq, sk, batch) = (rows.sq, rows.sk, rows.batch);
    let q0 = mb * bm;
    let (qs, dos) = query_chunks(io, rows, (h, q0), bm, ((cols, &chunks), (vcols, &vchunks)));
    let (lse_t, delta_t) = load_row_stats(io, rows, (h, q0), bm);
    let walk = KeyWalk::of(rows, q0, (bm, bn), w);
    let qk_scale = scale * score_factor(p.softcap);
    let hk = kv_head(h, p.kv_group);
    let mut acc = zeros::<f32>([bm, cols]);
    for j in pipelined(walk.first..walk.end, stages = 2) {
        let k0 = j * bn;
        let ks = key_chunks(io.k, rows, (hk, (k0, sk)), (bn, cols), &chunks);
        let vs = key_chunks(io.v, rows, (hk, (k0, sk)), (bn, vcols), &vchunks);
        let mask_it = walk.masks(j);
        let mask_it = with_rows_bound(mask_it, rows, q0 + bm > sq);
        let (_, ds) = probs_and_grad(
            ScoreAxes::QueryRows,
            (&qs, &dos, &ks, &vs),
            (lse_t, delta_t),
            (q0, k0, sq, sk),
            mask_it,
            packed.is_some(),
            qk_scale,
            (bm, bn),
            w,
            p.softcap,
        );
        acc = mma_acc(&ds.cast_to(dtype), &ks[0], &acc);
    }
    let q_at = [batch, h, rows.query(q0), chunks[0]];
    let (store_rows, _) = grad_ends(rows, packed, b);
    store_rows.store(dq.tile([bm, cols], q_at), (acc * scale).cast_to(dtype), 2);
}
