//! FlashAttention-2 forward: `o = softmax(q k^T * scale) v`, bf16 or f16, with masks and caps,
//! over dense batches or packed variable-length ones.

use kiln::ir::dsl::{Index, Tensor};
use kiln::prelude::*;

/// Query rows per block unless `block_m` says otherwise: two consumer warpgroups on sm_90a.
pub const BLOCK_M: usize = 128;
/// `log2(e)`: the softmax runs in base 2.
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Masks the score tile `s` of query rows `q0..q0 + bm` and keys `k0..k0 + bn` (laid out as
/// `axes` says) to `-inf` where a key lies past `sk` or outside the query's [`Window`] `w`:
/// query `i` sees key `j` iff `i + sk - sq - left <= j` and `j <= i + sk - sq + right`
/// (bottom-right aligned, as FlashAttention-2), and with `chunk` also in the chunk of
/// `i + sk - sq`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mask(
    s: Value,
    axes: ScoreAxes,
    q0: Value,
    k0: Value,
    sq: Value,
    sk: Value,
    (bm, bn): (usize, usize),
    w: Window,
) -> Value {
    let cols = axes.keys(k0, (bm, bn));
    let keep = if w.chunk > 0 {
        // Each query's bounds once ([bm]: a division per query, not per score), then broadcast.
        let diag = iota([bm], 0) + q0 + (sk - sq);
        let first = w.first_key(diag, None);
        cols < sk && cols >= axes.per_query(first) && cols <= axes.per_query(w.last_key(diag, None))
    } else {
        let keep = keep_left(cols < sk, cols, axes, (q0, sq, sk), (bm, bn), w);
        if w.right >= 0 {
            let rows = axes.queries(q0, (bm, bn));
            keep && cols <= rows + w.ahead(sk - sq)
        } else {
            keep
        }
    };
    select(keep, s, f32::NEG_INFINITY)
}

/// How a score tile lays out its block pair: queries along its rows (the forward's `S = Q
/// K^T`) or keys along its rows (`S^T = K Q^T`: the backward's keys-major dK/dV walk, whose
/// products then take the key block as their M dimension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScoreAxes {
    /// `[bm, bn]`: row `i` is query `q0 + i`.
    QueryRows,
    /// `[bn, bm]`: row `j` is key `k0 + j`.
    KeyRows,
}

impl ScoreAxes {
    /// The tile's shape for `bm` queries and `bn` keys.
    pub(crate) fn shape(self, (bm, bn): (usize, usize)) -> [usize; 2] {
        match self {
            ScoreAxes::QueryRows => [bm, bn],
            ScoreAxes::KeyRows => [bn, bm],
        }
    }

    /// Whether the rows are keys.
    pub(crate) fn keys_major(self) -> bool {
        self == ScoreAxes::KeyRows
    }

    fn query_dim(self) -> usize {
        match self {
            ScoreAxes::QueryRows => 0,
            ScoreAxes::KeyRows => 1,
        }
    }

    /// Each score's query index, the first being `q0`.
    #[track_caller]
    pub(crate) fn queries(self, q0: Value, blocks: (usize, usize)) -> Value {
        iota(self.shape(blocks), self.query_dim()) + q0
    }

    /// Each score's key index, the first being `k0`.
    #[track_caller]
    pub(crate) fn keys(self, k0: Value, blocks: (usize, usize)) -> Value {
        iota(self.shape(blocks), 1 - self.query_dim()) + k0
    }

    /// A per-query vector (`[bm]`) broadcast across the keys.
    #[track_caller]
    pub(crate) fn per_query(self, v: Value) -> Value {
        match self {
            ScoreAxes::QueryRows => v.col(),
            ScoreAxes::KeyRows => v.row(),
        }
    }
}

/// Folds one block of scaled scores `s` (and its values `vs`) into the running row maximum
/// `m`, row sum `l` and unnormalised output `acc`; returns the updated three.
#[kernel_fn]
fn online_update(s: Value, vs: Value, acc: Value, m: Value, l: Value) -> (Value, Value, Value) {
    let m_new = max(&m, &row_max(&s));
    // A row with no visible key so far has m_new = -inf; exponentiate against 0 so its terms
    // are exp2(-inf) = 0 rather than NaN.
    let m_use = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
    let p = exp2(&(s - m_use.col()));
    let alpha = exp2(&(m - m_use));
    let l = l * alpha + row_sum(&p);
    let acc = acc * alpha.col() + mma(&p.cast_to(elem_type(vs)), &vs);
    (acc, m_new, l)
}

/// Attention over `q: [batch, heads, sq, d]`, `k: [batch, heads / kv_group, sk, d]` and `v`
/// (k's but `dv` wide; `dtype`: bf16, f16; `sq`, `sk` may differ) into `o: [.., sq, dv]`, scores
/// `s = q.k * scale`, soft-capped when `softcap > 0` (`forward` says how), with comptime
/// [`AttentionParams`]. Grid: `(cdiv(sq, block_m), heads, batch)` (`grid = [block_m, 1, 1]`):
/// ```no_run
/// # use kiln::prelude::*; use kiln_examples::attention::{AttentionParams, attention};
/// # fn f(dev: &kiln::runtime::Device, [q, k, v, o]: [&kiln::runtime::DeviceTensor; 4]) {
/// let p = AttentionParams { d: 64, causal: true, ..AttentionParams::default() };
/// let grid = attention.grid(&p, [q.shape()[2], q.shape()[1], q.shape()[0]]);
/// attention.launch(dev, &p, grid, q, k, v, o, 0.125).expect("launch");
/// # }
/// ```
#[kernel(num_warps = 4, grid = [block_m, 1, 1])]
pub fn attention(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    o: TensorMut<dtype, 4>,
    scale: f32,
    #[comptime] p: AttentionParams,
) {
    forward(q, k, v, o, None, None, scale, p);
}

/// The comptime parameters [`attention`], [`attention_lse`] and their varlen forms share: a
/// launch, the compile cache and the autotuner pass one of these to any of the four
/// (`AttentionParams::default()`: head dim 128, no mask, the kernel's own blocks); `-D
/// NAME=VALUE` sets a field on the command line. Each distinct value compiles once.
#[comptime]
pub struct AttentionParams {
    /// Head dim of `q` and `k`: a power of two or a multiple of 32 (the tiles' width; a tensor
    /// narrower than its tile reads 0 past its last column, and nothing is stored there).
    #[comptime(default = 128)]
    pub d: usize,
    /// Head dim of `v` and `o` when it differs from `d` (FlashAttention 3's `headdim_v`,
    /// MLA's 128 beside a `d` of 192), by the same rules; 0: `d`
    /// ([`AttentionParams::value_dim`]).
    #[comptime(default = 0)]
    pub dv: usize,
    /// Whether each query sees only the keys up to its diagonal (aligned bottom-right).
    #[comptime(default = false)]
    pub causal: bool,
    /// Keys per block, a multiple of 16; 0: the kernel's own choice, `key_block`.
    #[comptime(default = 0, tune = [64, 128, 160, 192])]
    pub block_n: usize,
    /// Query heads per key/value head (grouped-query attention; `heads` is multi-query).
    #[comptime(default = 1)]
    pub kv_group: usize,
    /// The element type of `q`, `k`, `v` and `o`: bf16 or f16.
    #[comptime(default = DType::Bf16)]
    pub dtype: DType,
    /// Keys before its diagonal a query sees (a sliding window, [`Window`]); -1: all of them.
    #[comptime(default = -1)]
    pub window_left: i32,
    /// Keys after its diagonal a query sees; -1: all of them (`causal` makes it 0).
    #[comptime(default = -1)]
    pub window_right: i32,
    /// Keys per chunk (FlashAttention 3's `attention_chunk`): a query sees only the keys of
    /// its diagonal's chunk, within its window ([`Window`]); 0: no chunks.
    #[comptime(default = 0)]
    pub attention_chunk: i32,
    /// The soft-cap of the scores, `softcap * tanh(s / softcap)`; 0: off.
    #[comptime(default = 0.0)]
    pub softcap: f32,
    /// Query rows per block, default [`BLOCK_M`]; on sm_90a 64 per consumer warpgroup, so 64,
    /// 128 or 192 (three warpgroups, meant for d = 64). The autotuner tries 128 and 192.
    #[comptime(default = BLOCK_M, tune = [128, 192])]
    pub block_m: usize,
}

impl AttentionParams {
    /// The head dim of `v` and `o`: `dv`, or `d` when it is 0.
    pub fn value_dim(&self) -> usize {
        if self.dv == 0 { self.d } else { self.dv }
    }
}

/// [`attention`] over a packed batch of variable-length sequences in one launch
/// (FlashAttention's `flash_attn_varlen_func`): `q` and `o` are `[1, heads, total_q, d]`, `k`
/// and `v` `[1, heads / kv_group, total_k, d]` (a packed `[total, heads, d]` tensor viewed
/// through its strides), and sequence `b`'s queries are rows `cu_seqlens_q[b]..
/// cu_seqlens_q[b + 1]`, its keys rows `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` (`[batch + 1]`
/// offsets each, read in the kernel). Every mask is the dense kernel's within each sequence
/// (causal and windows aligned bottom-right per sequence). A block stores only its own
/// sequence's rows, and every load and store stays inside its tensor whatever the offsets:
/// an offset read past `cu_seqlens_*` is 0, a sequence of negative length has no rows.
///
/// Grid: `(cdiv(max_seqlen_q, block_m), heads, batch)`, `attention_varlen.grid(&p,
/// [max_seqlen_q, heads, batch])`; the blocks past a sequence's rows do no work.
#[kernel(num_warps = 4, grid = [block_m, 1, 1])]
pub fn attention_varlen(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    o: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionParams,
) {
    let packed = Varlen::new(cu_seqlens_q, cu_seqlens_k);
    forward(q, k, v, o, None, Some(packed), scale, p);
}

/// What `scale` is multiplied by before the softmax: `log2(e)` (it runs in base 2), or with a
/// soft-cap `1 / softcap` (the cap's tanh takes `s / softcap`; [`soft_cap`] applies `log2(e)`).
pub(crate) fn score_factor(softcap: f32) -> f32 {
    if softcap > 0.0 { 1.0 / softcap } else { LOG2E }
}

/// Whether key block `j` needs the mask: `past_unmasked` (keys past some row's right bound or
/// `sk`), or it lies before `first_unmasked` (keys before some row's left bound, if any).
#[track_caller]
fn needs_mask(past_unmasked: Value, j: Value, first_unmasked: Option<Value>) -> Value {
    use kiln::ir::dsl::{Compare, Logic};
    match first_unmasked {
        Some(lo) => Logic::or(past_unmasked, Compare::lt(j, lo)),
        None => past_unmasked,
    }
}

/// [`attention_varlen`], which also writes each query row's log-sum-exp (as [`attention_lse`])
/// into `lse: [1, heads, total_q]` (FlashAttention-2's varlen `[nheads, total_q]`: sequence
/// `b`'s rows are columns `cu_seqlens_q[b]..`). Same grid and comptime parameters.
#[kernel(num_warps = 4, grid = [block_m, 1, 1])]
pub fn attention_varlen_lse(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    o: TensorMut<dtype, 4>,
    lse: TensorMut<f32, 3>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionParams,
) {
    let packed = Varlen::new(cu_seqlens_q, cu_seqlens_k);
    forward(q, k, v, o, Some(lse), Some(packed), scale, p);
}

/// [`attention`], which also writes each query row's log-sum-exp into `lse: [batch, heads,
/// sq]` (f32, natural log: `ln sum_j e^(s_j)` over the scores the row sees, soft-capped when
/// `softcap > 0`; `+inf` for a row that sees no key, as FlashAttention-2 writes it). Same
/// grid and comptime parameters.
#[kernel(num_warps = 4, grid = [block_m, 1, 1])]
pub fn attention_lse(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    o: TensorMut<dtype, 4>,
    lse: TensorMut<f32, 3>,
    scale: f32,
    #[comptime] p: AttentionParams,
) {
    forward(q, k, v, o, Some(lse), None, scale, p);
}

/// A sliding-window mask with FlashAttention's semantics: query `i` of `sq` sees key `j` of
/// `sk` iff `i + sk - sq - left <= j <= i + sk - sq + right` (aligned bottom-right, as the
/// causal mask), a negative bound being unbounded; causal is `(-1, 0)`. With `chunk > 0`
/// (FlashAttention 3's `attention_chunk`) the query also sees only the keys of its chunk: `j`
/// and its diagonal `p = i + sk - sq` in the same `floor(. / chunk)`. The key-block walk
/// starts at the first block a row of the query block may see (`left_blocks`) and stops
/// after the last; blocks every row sees whole skip the mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Keys before the diagonal (`i + sk - sq`) a row sees; negative: all of them.
    pub left: i32,
    /// Keys after the diagonal a row sees; negative: all of them.
    pub right: i32,
    /// Keys per chunk; 0: no chunks.
    pub chunk: i32,
}

impl Window {
    /// The window of `attention`'s comptime values: `(left, right)`, where `causal` makes
    /// `right` 0 (FlashAttention's rule for a causal call with a window), and `chunk`.
    pub fn new(causal: bool, left: i32, right: i32, chunk: i32) -> Window {
        let right = if causal { 0 } else { right };
        Window {
            left,
            right,
            chunk: chunk.max(0),
        }
    }

    /// Whether some row's first visible key is bounded (by `left` or its chunk).
    pub(crate) fn bounds_left(self) -> bool {
        self.left >= 0 || self.chunk > 0
    }

    /// Whether some row's last visible key is bounded (by `right` or its chunk).
    pub(crate) fn bounds_right(self) -> bool {
        self.right >= 0 || self.chunk > 0
    }

    /// The window seen from the keys: the rows that see key `j` are the diagonals `p` with
    /// `j - right <= p <= j + left` in `j`'s chunk (`p` sees `j` iff `j` sees `p` under it).
    pub(crate) fn transposed(self) -> Window {
        Window {
            left: self.right,
            right: self.left,
            chunk: self.chunk,
        }
    }

    /// `x + right` (for `right >= 0`), or `x` itself when `right` is 0, so the causal mask
    /// adds no instruction.
    #[track_caller]
    pub(crate) fn ahead(self, x: Value) -> Value {
        if self.right == 0 { x } else { x + self.right }
    }

    /// The first key diagonal `p` (a scalar or a tile) sees when [`Window::bounds_left`]:
    /// `p - left`, or the start of its chunk (chunks counted from key `origin`, else 0), the
    /// later.
    #[track_caller]
    pub(crate) fn first_key(self, p: Value, origin: Option<Value>) -> Value {
        if self.chunk <= 0 {
            return p - self.left;
        }
        let start = chunk_start(p, origin, self.chunk);
        if self.left >= 0 {
            max(p - self.left, start)
        } else {
            start
        }
    }

    /// The last key diagonal `p` sees when [`Window::bounds_right`]: `p + right`, or the last
    /// of its chunk, the earlier.
    #[track_caller]
    pub(crate) fn last_key(self, p: Value, origin: Option<Value>) -> Value {
        if self.chunk <= 0 {
            return self.ahead(p);
        }
        let end = chunk_start(p, origin, self.chunk) + (self.chunk - 1);
        if self.right >= 0 {
            min(self.ahead(p), end)
        } else {
            end
        }
    }
}

/// The first key of the chunk of `chunk` keys holding key `p` (a scalar or a tile), chunks
/// counted from key `origin` (0 when `None`): `origin + floor((p - origin) / chunk) chunk`,
/// rounding down below `origin` too (integer division truncates toward 0).
#[track_caller]
fn chunk_start(p: Value, origin: Option<Value>, chunk: i32) -> Value {
    use kiln::ir::dsl::Compare;
    let x = match origin {
        Some(o) => p - o,
        None => p,
    };
    let start = select(Compare::lt(x, 0), (x + 1) / chunk - 1, x / chunk) * chunk;
    match origin {
        Some(o) => start + o,
        None => start,
    }
}

/// The element type of tile `v`, which `P` is cast to for the `P V` mma (bf16 for a poisoned
/// value, whose build has already failed).
fn elem_type(v: Value) -> DType {
    v.ty().map_or(DType::Bf16, |t| t.dtype())
}

/// The body of [`attention`], [`attention_lse`] and their varlen forms (the log-sum-exp
/// written when `lse` is given; the sequences of a packed batch read from `packed`'s offsets
/// when it is given, [`Rows`]).
///
/// Online softmax (FlashAttention-2): a block owns `block_m` query rows and walks, 2-stage
/// pipelined, the key blocks of `BN` keys its rows may see ([`Window`]: causal, sliding
/// windows), keeping the running row maximum `m`, row sum `l` and unnormalised output `acc`.
/// Key blocks in which no key is masked for any of the block's rows skip the mask (a block-
/// uniform branch). Rows that see no key get `m = -inf`, `l = 0` and output 0. Grouped-query
/// attention: query head `h` reads key/value head `h / kv_group` ([`kv_head`]). Tiles are as
/// wide as the head: 96 maps onto mma fragments and TMA boxes as 128 does, unpadded.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Option<Tensor>,
    packed: Option<Varlen>,
    scale: Value,
    p: AttentionParams,
) {
    let AttentionParams {
        d,
        causal,
        block_m: bm,
        kv_group,
        dtype,
        window_left,
        window_right,
        softcap,
        ..
    } = p;
    let w = Window::new(causal, window_left, window_right, p.attention_chunk);
    let bn = key_block(&p, (w, softcap), packed.is_some());
    let (mb, h, b) = (block_id().x, block_id().y, block_id().z);
    let rows = Rows::of(q, k, b, packed);
    let (sq, sk, batch) = (rows.sq, rows.sk, rows.batch);
    let (q0, dv) = (mb * bm, p.value_dim());
    let qs = q.tile([bm, d], [batch, h, rows.query(q0), 0]).load();
    let qk_scale = scale * score_factor(softcap);
    let mut acc = zeros::<f32>([bm, dv]);
    let mut m = full::<f32>([bm], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([bm]);
    let walk = KeyWalk::of(rows, q0, (bm, bn), w);
    for j in pipelined(walk.first..walk.end, stages = 2) {
        let k0 = j * bn;
        let ks = k
            .tile([bn, d], [batch, kv_head(h, kv_group), rows.key(k0), 0])
            .load();
        let vs = v
            .tile([bn, dv], [batch, kv_head(h, kv_group), rows.key(k0), 0])
            .load();
        let s = soft_cap(mma(&qs, &ks.t()) * qk_scale, softcap);
        // Uniform across the block: only the blocks on a window's edges and sk's pay for it.
        let s = if walk.masks(j) {
            mask(s, ScoreAxes::QueryRows, q0, k0, sq, sk, (bm, bn), w)
        } else {
            s
        };
        (acc, m, l) = online_update(s, vs, acc, m, l);
    }
    // Fully masked rows have l = 0 and acc = 0: scale by 1 so they output 0. One reciprocal
    // per row, then a product per element (not a division per element).
    let inv_l = recip(&select(l == 0.0, 1.0, l));
    let out = o.tile([bm, dv], [batch, h, rows.query(q0), 0]);
    rows.store(out, (acc * inv_l.col()).cast_to(dtype), 2);
    store_lse(lse, m, l, bm, (rows, h, q0));
}

/// Writes each row's log-sum-exp into `lse`, when given, at `[batch, h, q0..]` (of `rows`'s
/// sequence): from the running maximum `m` and sum `l` of the base-2 scaled scores, `ln sum
/// e^s = (m + log2(l)) ln 2`; `+inf` where `l = 0` (a row that sees no key: FlashAttention-2's
/// value).
fn store_lse(lse: Option<Tensor>, m: Value, l: Value, bm: usize, at: (Rows, Value, Value)) {
    if let Some(lse) = lse {
        write_lse(lse, m, l, bm, at);
    }
}

/// [`store_lse`]'s store.
#[kernel_fn]
fn write_lse(lse: Tensor, m: Value, l: Value, bm: usize, (rows, h, q0): (Rows, Value, Value)) {
    let log_sum = (m + log2(&l)) * std::f32::consts::LN_2;
    let at = lse.tile([bm], [rows.batch, h, rows.query(q0)]);
    rows.store(at, select(l == 0.0, f32::INFINITY, log_sum), 2);
}

/// The offsets of a packed varlen batch ([`attention_varlen`]): sequence `b`'s query rows are
/// `cu_q[b]..cu_q[b + 1]`, its keys `cu_k[b]..cu_k[b + 1]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Varlen {
    cu_q: Tensor,
    cu_k: Tensor,
    used: Option<(Tensor, Tensor)>,
}

impl Varlen {
    /// The offsets `cu_seqlens_q`, `cu_seqlens_k` (`i32`, `[batch + 1]`).
    pub(crate) fn new(cu_q: Tensor, cu_k: Tensor) -> Varlen {
        Varlen::of(cu_q, cu_k, None)
    }
}

/// Where a block's sequence lies in `q`, `k`, `v`, `o` (and `lse`): batch `block_id().z` of
/// dense tensors, or in a packed batch ([`Varlen`]) the rows its offsets give, in batch 0.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    /// The batch coordinate.
    pub(crate) batch: Index,
    /// The sequence's query rows and keys.
    pub(crate) sq: Value,
    pub(crate) sk: Value,
    /// In a packed batch: the sequence's first query row and first key, and the row past its
    /// last query (where its stores stop).
    pub(crate) packed: Option<(Value, Value, Value)>,
}

impl Rows {
    /// Batch `b`'s rows: the whole of `q`'s and `k`'s, or the sequence's of `packed`.
    pub(crate) fn of(q: Tensor, k: Tensor, b: Value, packed: Option<Varlen>) -> Rows {
        match packed {
            None => Rows {
                batch: Index::Value(b),
                sq: q.dim(2),
                sk: k.dim(2),
                packed: None,
            },
            Some(p) => {
                let ((q_start, q_end), (k_start, k_end)) = offsets(p, b);
                Rows {
                    batch: Index::Const(0),
                    sq: q_end - q_start,
                    sk: k_end - k_start,
                    packed: Some((q_start, k_start, q_end)),
                }
            }
        }
    }

    /// The tensor row of the sequence's query row `i`.
    #[track_caller]
    pub(crate) fn query(self, i: Value) -> Value {
        self.packed.map_or(i, |(q_start, _, _)| q_start + i)
    }

    /// The tensor row of the sequence's key `j`.
    #[track_caller]
    pub(crate) fn key(self, j: Value) -> Value {
        self.packed.map_or(j, |(_, k_start, _)| k_start + j)
    }

    /// The end of the key walk of the query block at `q0`: `n_blocks`, or in a packed batch 0
    /// when the block starts at or past the sequence's last row (the grid covers the longest
    /// sequence), so the walk is empty but the loop stays the kernel's top-level ring.
    #[track_caller]
    pub(crate) fn walk_end(self, q0: Value, n_blocks: Value) -> Value {
        use kiln::ir::dsl::Compare;
        match self.packed {
            Some(_) => select(Compare::lt(q0, self.sq), n_blocks, 0),
            None => n_blocks,
        }
    }

    /// Stores `value` into `tile`, in a packed batch only the sequence's rows (along tensor
    /// dimension `dim`).
    #[track_caller]
    pub(crate) fn store(self, tile: kiln::ir::dsl::TileView, value: Value, dim: usize) {
        match self.packed {
            Some((_, _, q_end)) => tile.store_bounded(value, dim, q_end),
            None => tile.store(value),
        }
    }
}

/// Sequence `b`'s query rows and keys in packed batch `p`: `(start, end)` of each.
#[kernel_fn]
fn offsets(p: Varlen, b: Value) -> ((Value, Value), (Value, Value)) {
    let q = (p.cu_q.scalar([b]), p.cu_q.scalar([b + 1]));
    used_ends(p, b, (q, (p.cu_k.scalar([b]), p.cu_k.scalar([b + 1]))))
}

/// The key/value head query head `h` reads when `kv_group` query heads share one (grouped-
/// query attention; `kv_group = heads` is multi-query): `h / kv_group`. Resolved while
/// building, so `kv_group = 1` (every query head has its own) adds no instruction.
#[kernel_fn]
pub(crate) fn kv_head(h: Value, kv_group: usize) -> Value {
    if kv_group == 1 { h } else { h / kv_group }
}

/// `keep` narrowed, when the window has a left bound, to the keys at or after each row's
/// first one (`j >= i + sk - sq - left`); `keep` itself otherwise.
#[kernel_fn]
fn keep_left(
    keep: Value,
    cols: Value,
    axes: ScoreAxes,
    (q0, sq, sk): (Value, Value, Value),
    blocks: (usize, usize),
    w: Window,
) -> Value {
    if w.left >= 0 {
        let rows = axes.queries(q0, blocks);
        keep && cols >= rows + (sk - sq - w.left)
    } else {
        keep
    }
}

/// The key blocks query block `q0..q0 + bm` (of its sequence's `sq` queries against `sk`
/// keys, window `w`) walks, `first..end`, and those every row of it sees whole,
/// `first_unmasked..end_unmasked` (the others need the mask).
pub(crate) struct KeyWalk {
    /// The first key block its first row may see (a constant 0 without a left bound).
    pub(crate) first: Index,
    /// The first key block no row sees past its left bound (`None`: no left bound).
    pub(crate) first_unmasked: Option<Value>,
    /// The block past the last one its last row may see (0 for a block past its sequence's
    /// rows: [`Rows::walk_end`]).
    pub(crate) end: Value,
    /// The first key block some row sees past its right bound, or past `sk`.
    pub(crate) end_unmasked: Value,
}

impl KeyWalk {
    /// The walk of the query block at `q0` of `rows`'s sequence. A row's window is monotone
    /// in the row (so is its chunk), so the first row bounds the start and the last the end.
    #[track_caller]
    pub(crate) fn of(rows: Rows, q0: Value, (bm, bn): (usize, usize), w: Window) -> Self {
        let (sq, sk) = (rows.sq, rows.sk);
        let (first, first_unmasked) = left_blocks(q0, sq, sk, (bm, bn), w);
        let all_blocks = cdiv(sk, bn);
        let (end, end_unmasked) = if w.chunk > 0 {
            let last = w.last_key(q0 + (bm - 1) + (sk - sq), None) + 1;
            let end = min(all_blocks, max(cdiv(last, bn), 0));
            let first_row_last = w.last_key(q0 + (sk - sq), None) + 1;
            (end, min(sk / bn, max(first_row_last / bn, 0)))
        } else if w.right >= 0 {
            // The last row of this block sees keys up to (q0 + bm - 1) + sk - sq + right.
            let end = min(all_blocks, max(cdiv(w.ahead(q0 + bm + sk - sq), bn), 0));
            (end, min(sk / bn, max(w.ahead(q0 + 1 + sk - sq) / bn, 0)))
        } else {
            (all_blocks, sk / bn)
        };
        KeyWalk {
            first,
            first_unmasked,
            end: rows.walk_end(q0, end),
            end_unmasked,
        }
    }

    /// Whether key block `j` of the walk needs the mask (a block-uniform flag).
    #[track_caller]
    pub(crate) fn masks(&self, j: Value) -> Value {
        use kiln::ir::dsl::Compare;
        needs_mask(Compare::ge(j, self.end_unmasked), j, self.first_unmasked)
    }
}

/// For the query block at `q0` and a window with a left bound: the first key block its first
/// row may see (where the walk starts) and the first key block no row of it sees past the
/// left edge of its window (blocks before it need the mask). Without a left bound the walk
/// starts at block 0 (a constant, as for the full and causal masks) and no block is masked on
/// the left.
fn left_blocks(
    q0: Value,
    sq: Value,
    sk: Value,
    (bm, bn): (usize, usize),
    w: Window,
) -> (Index, Option<Value>) {
    if !w.bounds_left() {
        return (Index::Const(0), None);
    }
    if w.chunk > 0 {
        let first = w.first_key(q0 + (sk - sq), None);
        let last_row_first = w.first_key(q0 + (bm - 1) + (sk - sq), None);
        let unmasked = max(cdiv(last_row_first, bn), 0);
        return (Index::Value(max(first, 0) / bn), Some(unmasked));
    }
    // Row q0's first key; the block's last row, q0 + bm - 1, starts bm - 1 keys later.
    let first = q0 + sk - sq - w.left;
    let start = max(first, 0) / bn;
    let unmasked = max(cdiv(first + (bm - 1), bn), 0);
    (Index::Value(start), Some(unmasked))
}

/// Scores `s` (already times `scale / softcap`) soft-capped in base 2, `softcap * log2(e) *
/// tanh(s)`, or `s` when `softcap` is 0 (off). `tanh(y) = 1 - 2 / (e^(2y) + 1)` on the fast
/// exponential: exact at both ends (`e^(2y)` overflows to inf, giving 1, or flushes to 0,
/// giving -1), and within about 1e-7 of tanh near 0 (the cancellation in `1 - ..`), so the
/// capped score is off by at most ~1e-7 * softcap, far below bf16's and f16's rounding.
#[kernel_fn]
pub(crate) fn soft_cap(s: Value, softcap: f32) -> Value {
    if softcap == 0.0 {
        s
    } else if softcap > 0.0 && softcap.is_finite() {
        (1.0 - 2.0 / (exp2(&(s * (2.0 * LOG2E))) + 1.0)) * (softcap * LOG2E)
    } else {
        reject("attention: softcap must be 0 (off) or a positive finite number")
    }
}

/// A query and key block `attention` may launch with, and how fast it runs per query-key
/// product it computes (padding included), relative to the first candidate of its head dim.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileCandidate {
    /// Query rows per block (`block_m`).
    pub block_m: usize,
    /// Keys per block (`block_n`; 0 is the kernel's own choice, `key_block`).
    pub block_n: usize,
    /// Products per second against the head dim's first candidate, measured on the H200.
    pub rate: f64,
}

/// The tiles [`tuned_blocks`] chooses from for head dim `d` on `target`. On sm_90a, whose
/// rotated wgmma schedule has the registers and shared memory for them:
/// - `d <= 64`: 128 or 192 query rows (three consumer warpgroups, whose S and O accumulators
///   fit the 160 registers each gets; FlashAttention-3's d = 64 tile), 128 keys. Per product
///   192 rows run 1.19-1.27x faster (s = 1k and 2k, non-causal, on the H200).
/// - `96 < d <= 128`: 128 rows, 128 or 160 keys (2 stages). Per product 160 keys run 1.03-1.05x
///   faster (s = 1k to 16k on the H200).
///
/// `bench/results/README.md` names the runs these rates come from.
/// - `d <= 96` otherwise: 128 rows and keys.
///
/// A wider head's O does not fit beside S in three warpgroups' registers, and its key block
/// is the kernel's own choice; other targets take the kernel's defaults.
pub fn tile_candidates(target: kiln::ir::Target, d: usize) -> &'static [TileCandidate] {
    const fn tile(block_m: usize, block_n: usize, rate: f64) -> TileCandidate {
        TileCandidate {
            block_m,
            block_n,
            rate,
        }
    }
    const D64: &[TileCandidate] = &[tile(128, 128, 1.0), tile(192, 128, 1.2)];
    const D96: &[TileCandidate] = &[tile(128, 128, 1.0)];
    const D128: &[TileCandidate] = &[tile(128, 128, 1.0), tile(128, 160, 1.045)];
    const DEFAULT: &[TileCandidate] = &[tile(BLOCK_M, 0, 1.0)];
    match (target, d) {
        (kiln::ir::Target::Sm90a, ..=64) => D64,
        (kiln::ir::Target::Sm90a, 65..=96) => D96,
        (kiln::ir::Target::Sm90a, 97..=128) => D128,
        _ => DEFAULT,
    }
}

/// The `(block_m, block_n)` to launch `attention` with for head dim `d`, `sq` queries and `sk`
/// keys, `causal` or not, on `target`: of [`tile_candidates`], the one with the least
/// [`padded_products`] per unit of its rate. A tile whose last query or key block is mostly
/// padding (s = 1024 in 192-row or 160-key blocks) or whose causal diagonal wastes more of
/// its blocks loses to a smaller tile that fits; otherwise the faster tile wins.
pub fn tuned_blocks(
    target: kiln::ir::Target,
    d: usize,
    causal: bool,
    (sq, sk): (usize, usize),
) -> (usize, usize) {
    let cost = |t: &TileCandidate| {
        padded_products(causal, (sq, sk), (t.block_m, t.block_n.max(1))) as f64 / t.rate
    };
    tile_candidates(target, d)
        .iter()
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))
        .map_or((BLOCK_M, 0), |t| (t.block_m, t.block_n))
}

impl AttentionParams {
    /// Head dim `d`, `causal` or not, in the blocks [`tuned_blocks`] picks on `target` for
    /// `sq` queries and `sk` keys; the other fields at their defaults (bf16, no window, no
    /// soft-cap, one query head per key head).
    pub fn tuned(
        target: kiln::ir::Target,
        d: usize,
        causal: bool,
        (sq, sk): (usize, usize),
    ) -> AttentionParams {
        let (block_m, block_n) = tuned_blocks(target, d, causal, (sq, sk));
        AttentionParams {
            d,
            causal,
            block_n,
            block_m,
            ..AttentionParams::default()
        }
    }
}

/// `p.block_n`, or when it is 0 the kernel's own choice, what fits sm_80's registers best
/// (ptxas, 4 warps): 128 keys when the wider of `d` and `dv` is at most 64 with no mask but
/// causal's and no soft-cap (255 registers, no spill), else 64 (at 128 keys a window's or a
/// cap's registers spill at d = 64, and so do a `packed` varlen batch's sequence offsets: 16
/// bytes).
fn key_block(p: &AttentionParams, (w, softcap): (Window, f32), packed: bool) -> usize {
    let (block_n, d) = (p.block_n, p.d.max(p.value_dim()));
    let plain = w.left < 0 && w.right <= 0 && w.chunk == 0 && softcap == 0.0 && !packed;
    match block_n {
        0 if d <= 64 && plain => 128,
        0 => 64,
        n => n,
    }
}

impl AttentionParams {
    /// [`AttentionParams::tuned`] for a value head dim `dv` beside the key head dim `d`
    /// (`headdim_v`; the same as `tuned` when they are equal): the blocks of the wider head,
    /// and on sm_80 64 query rows when the values are 128 or more wide (then a 128-row
    /// block's f32 output beside the query tile spills, ptxas, 4 warps; 64 rows do not up to
    /// d = dv = 256).
    pub fn tuned_pair(
        target: kiln::ir::Target,
        (d, dv): (usize, usize),
        causal: bool,
        lengths: (usize, usize),
    ) -> AttentionParams {
        if dv == d || dv == 0 {
            return AttentionParams::tuned(target, d, causal, lengths);
        }
        let wide = AttentionParams::tuned(target, d.max(dv), causal, lengths);
        let block_m = if target == kiln::ir::Target::Sm80 && dv >= 128 {
            64
        } else {
            wide.block_m
        };
        AttentionParams {
            d,
            dv,
            block_m,
            ..wide
        }
    }
}

/// The query-key products `attention` computes in `(bm, bn)` blocks, padding included: per
/// query block, `bm * bn` for each key block it visits (every one of `sk`, or when `causal`
/// those up to its last row's diagonal, aligned bottom-right).
pub fn padded_products(causal: bool, (sq, sk): (usize, usize), (bm, bn): (usize, usize)) -> u64 {
    let key_blocks = |keys: usize| keys.div_ceil(bn) as u64;
    let tile = (bm * bn) as u64;
    if !causal {
        return sq.div_ceil(bm) as u64 * key_blocks(sk) * tile;
    }
    (0..sq.div_ceil(bm))
        .map(|i| {
            // Query row r sees keys up to r + sk - sq; the block's last row is its widest.
            let last = ((i + 1) * bm).min(sq) + sk;
            key_blocks(last.saturating_sub(sq).min(sk)) * tile
        })
        .sum()
}

impl Varlen {
    /// The offsets and, when given, FlashAttention 3's `seqused_q` and `seqused_k` (`i32`,
    /// `[batch]`): sequence `b` then uses only its first `seqused_q[b]` query rows and
    /// `seqused_k[b]` keys (each capped at its length by the offsets).
    pub(crate) fn of(cu_q: Tensor, cu_k: Tensor, used: Option<(Tensor, Tensor)>) -> Varlen {
        Varlen { cu_q, cu_k, used }
    }
}

/// The `((q_start, q_end), (k_start, k_end))` of sequence `b` read from the offsets, each end
/// brought down to `start + used[b]` where `p` has used lengths and they are shorter (a
/// negative one leaves the sequence no rows); unchanged, with no op, otherwise.
#[track_caller]
fn used_ends(
    p: Varlen,
    b: Value,
    ((q_start, q_end), (k_start, k_end)): ((Value, Value), (Value, Value)),
) -> ((Value, Value), (Value, Value)) {
    let Some((used_q, used_k)) = p.used else {
        return ((q_start, q_end), (k_start, k_end));
    };
    let q_end = min(q_end, q_start + used_q.scalar([Index::Value(b)]));
    let k_end = min(k_end, k_start + used_k.scalar([Index::Value(b)]));
    ((q_start, q_end), (k_start, k_end))
}

/// [`attention_varlen`] with FlashAttention 3's `seqused_q` and `seqused_k` (`[batch]`, i32,
/// read in the kernel): sequence `b` attends with its first `seqused_q[b]` query rows to its
/// first `seqused_k[b]` keys (each at most the length its offsets give: a longer one is
/// capped there), its masks aligned to those lengths; its rows past `seqused_q[b]` are not
/// written. Same grid and comptime parameters.
#[kernel(num_warps = 4, grid = [block_m, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_used(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    o: TensorMut<dtype, 4>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    seqused_q: Tensor<i32, 1>,
    seqused_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionParams,
) {
    let packed = Varlen::of(cu_seqlens_q, cu_seqlens_k, Some((seqused_q, seqused_k)));
    forward(q, k, v, o, None, Some(packed), scale, p);
}

/// [`attention_varlen_used`] which also writes the log-sum-exp of each used query row into
/// `lse: [1, heads, total_q]` ([`attention_varlen_lse`]'s layout; rows past `seqused_q[b]`
/// not written).
#[kernel(num_warps = 4, grid = [block_m, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_used_lse(
    q: Tensor<dtype, 4>,
    k: Tensor<dtype, 4>,
    v: Tensor<dtype, 4>,
    o: TensorMut<dtype, 4>,
    lse: TensorMut<f32, 3>,
    cu_seqlens_q: Tensor<i32, 1>,
    cu_seqlens_k: Tensor<i32, 1>,
    seqused_q: Tensor<i32, 1>,
    seqused_k: Tensor<i32, 1>,
    scale: f32,
    #[comptime] p: AttentionParams,
) {
    let packed = Varlen::of(cu_seqlens_q, cu_seqlens_k, Some((seqused_q, seqused_k)));
    forward(q, k, v, o, Some(lse), Some(packed), scale, p);
}

impl Varlen {
    /// With used lengths, the tensor rows past sequence `b`'s last query row and last key by
    /// the offsets alone (the used ones may end sooner); `None` without them.
    #[track_caller]
    pub(crate) fn full_ends(self, b: Value) -> Option<(Value, Value)> {
        let end = |cu: Tensor| cu.scalar([Index::Value(b + 1)]);
        self.used.map(|_| (end(self.cu_q), end(self.cu_k)))
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::print::print_kernel;

    use kiln::ir::Target;

    use super::{AttentionParams, attention, padded_products, tuned_blocks};
    use crate::testing::{build, loop_stages};

    #[test]
    fn padded_products_count_the_blocks_each_query_block_visits() {
        // Dense: every query block visits every key block, the ragged ones padded.
        assert_eq!(
            padded_products(false, (1000, 300), (128, 160)),
            8 * 2 * 128 * 160
        );
        // Causal in 1x1 blocks is the triangle itself, aligned bottom-right.
        assert_eq!(padded_products(true, (6, 6), (1, 1)), 21);
        assert_eq!(padded_products(true, (3, 5), (1, 1)), 3 + 4 + 5);
        // Rows past the keys' diagonal see none: sq > sk leaves the first rows keyless.
        assert_eq!(padded_products(true, (5, 2), (1, 1)), 1 + 2);
        // 128-row blocks of 1024 causal queries visit 1, 2, .., 8 blocks of 128 keys.
        assert_eq!(
            padded_products(true, (1024, 1024), (128, 128)),
            36 * 128 * 128
        );
        assert_eq!(padded_products(true, (0, 1024), (128, 128)), 0);
    }

    #[test]
    fn tuned_blocks_trade_padding_against_the_faster_tile() {
        let pick = |d, causal, s| tuned_blocks(Target::Sm90a, d, causal, (s, s));
        // d = 64: 192 rows, unless a causal 1024 leaves its last block two-thirds padding
        // and its diagonal blocks half empty.
        assert_eq!(pick(64, false, 1024), (192, 128));
        assert_eq!(pick(64, true, 1024), (128, 128));
        for s in [2048, 4096, 8192, 16384] {
            assert_eq!(pick(64, true, s), (192, 128), "s = {s}");
        }
        // d = 128: 160 keys, unless 1024 keys pad the last 160-key block by 60%, or causal
        // diagonals waste more of the 160-key blocks than they gain.
        assert_eq!(pick(128, false, 1024), (128, 128));
        for s in [2048, 4096, 8192, 16384] {
            assert_eq!(pick(128, false, s), (128, 160), "s = {s}");
        }
        assert_eq!(pick(128, true, 1024), (128, 128));
        assert_eq!(pick(128, true, 2048), (128, 128));
        assert_eq!(pick(96, false, 4096), (128, 128));
        assert_eq!(pick(256, false, 4096), (128, 0));
        assert_eq!(
            tuned_blocks(Target::Sm80, 64, false, (4096, 4096)),
            (128, 0)
        );
    }

    #[test]
    fn builds_for_documented_variants() {
        for d in [64, 128] {
            for causal in [false, true] {
                let p = AttentionParams {
                    d,
                    causal,
                    ..AttentionParams::default()
                };
                let k = build(&attention, p);
                let bn = if d == 64 { 128 } else { 64 };
                assert!(
                    print_kernel(&k).contains(&format!("rt<f32,128x{bn}>")),
                    "score tile 128x{bn}"
                );
                assert_eq!(loop_stages(&k), [Some(2)]);
            }
        }
    }
}
