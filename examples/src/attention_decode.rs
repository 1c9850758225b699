//! Decoding against a key/value cache, FlashAttention's `flash_attn_with_kvcache` and
//! `flash_attn_combine`: a few new query tokens per sequence attend to a long cache, dense or
//! paged, into which the new keys and values were first appended in place.
//!
//! In launch order: [`kv_cache_append`] (and [`rotary_q`]), then [`attention_decode`] or
//! [`attention_decode_split`] (split-KV, [`num_splits`] choosing the split), then
//! [`attention_decode_combine`]. Each kernel's doc says what it does; the cache layout, shared
//! by dense and paged caches, and the sm_90a lowering: `docs/kernels.md`.

use kiln::ir::dsl::Tensor;
use kiln::prelude::*;

use crate::attention::{LOG2E, Window, score_factor, soft_cap};

/// The comptime parameters the decode kernels share (`DecodeParams::default()`: head dim
/// 128, bf16, a dense cache, no mask, no rotary); `-D NAME=VALUE` sets a field on the
/// command line.
#[comptime]
pub struct DecodeParams {
    /// Head dim of `q` and `k` (and of `v` unless `dv` says otherwise): 64, 96, 128 or 256
    /// (any multiple of 32; a tensor narrower than the tile reads 0 past its last column).
    #[comptime(default = 128)]
    pub d: usize,
    /// Head dim of `v` and `o` when it differs from `d` (`headdim_v`), the same rules; 0:
    /// `d`.
    #[comptime(default = 0)]
    pub dv: usize,
    /// The element type of `q`, the cache, the new keys and values, `cos`, `sin` and `o`.
    #[comptime(default = DType::Bf16)]
    pub dtype: DType,
    /// Query heads per key/value head (grouped-query attention), packed into a block's rows.
    #[comptime(default = 1)]
    pub kv_group: usize,
    /// Keys per cache page; 0: a dense cache (one page per sequence, as long as the cache).
    #[comptime(default = 0)]
    pub page_size: usize,
    /// Whether each query sees only the keys up to its diagonal (aligned bottom-right against
    /// the cache's length after the append).
    #[comptime(default = false)]
    pub causal: bool,
    /// Keys before its diagonal a query sees; -1: all of them.
    #[comptime(default = -1)]
    pub window_left: i32,
    /// Keys after its diagonal a query sees; -1: all of them (`causal` makes it 0).
    #[comptime(default = -1)]
    pub window_right: i32,
    /// Keys per chunk a query sees (FlashAttention 3's `attention_chunk`, chunks counted
    /// from the sequence's leftpad); 0: no chunks.
    #[comptime(default = 0)]
    pub attention_chunk: i32,
    /// The soft-cap of the scores, `softcap * tanh(s / softcap)`; 0: off.
    #[comptime(default = 0.0)]
    pub softcap: f32,
    /// The rotary dim (even, at most `d`); 0: no rotary embedding.
    #[comptime(default = 0)]
    pub rotary_dim: usize,
    /// The rotary layout: pairs `(x[2i], x[2i + 1])` (GPT-J) when true, else `(x[i],
    /// x[i + rotary_dim / 2])` (GPT-NeoX).
    #[comptime(default = true)]
    pub rotary_interleaved: bool,
    /// Packed query rows per block of the attention kernels (64 per warpgroup on sm_90a).
    #[comptime(default = 64)]
    pub block_m: usize,
    /// Keys per block of the attention kernels (a multiple of 16; 0: [`decode_key_block`]'s
    /// choice).
    #[comptime(default = 0)]
    pub block_n: usize,
    /// Rows per block of [`kv_cache_append`] and heads per block of
    /// [`attention_decode_combine`].
    #[comptime(default = 16)]
    pub block_rows: usize,
}

/// How many blocks share the value columns of head dim `d` (the grid's y is `heads_k *
/// value_blocks(d)`): 1 up to d = 128; beyond, blocks of 64 columns (d = 256: four), since a
/// row of 128 or more f32 output columns does not fit a thread's registers beside the
/// query's d = 256 (ptxas spills). Each block reads all of the keys and its share of the
/// values, so a wide head reads its keys once per value block (from L2 when the blocks run
/// side by side; not measured).
pub fn value_blocks(d: usize) -> usize {
    value_split(d, d)
}

/// [`value_blocks`] for a key head dim `d` and a value head dim `dv`: 1 while the query's
/// and the output's columns together are at most 256 (the widest pair that fits beside each
/// other without a spill, d = dv = 128), else the fewest blocks of at most 64 value columns
/// each as wide as a tile may be (a power of two or a multiple of 32: 96 in three of 32).
pub fn value_split(d: usize, dv: usize) -> usize {
    if d + dv <= 256 {
        return 1;
    }
    let tile = |w: usize| w.is_power_of_two() || w.is_multiple_of(32);
    (dv.div_ceil(64)..=dv.max(1))
        .find(|&n| dv.is_multiple_of(n) && tile(dv / n))
        .unwrap_or(1)
}

/// `block_n`, or when it is 0 the decode kernels' own choice for head dim `d` and pages of
/// `page_size` keys (0: a dense cache): the most keys whose tiles fit sm_80's registers
/// without a spill (ptxas, 4 warps). Tiles read straight from a page (a dense cache, or pages
/// holding whole blocks) are staged in shared memory: 64 keys up to d = 128, 16 beyond.
/// Tiles gathered row by row through the page table (smaller pages) are held in registers:
/// half as many.
pub fn decode_key_block(block_n: usize, d: usize, page_size: usize) -> usize {
    let whole = if d <= 128 { 64 } else { 16 };
    match block_n {
        0 if page_size == 0 || page_size.is_multiple_of(whole) => whole,
        0 => (whole / 2).max(16),
        n => n,
    }
}

/// Rejects (a diagnostic at the caller, the kernel's line) the parameters the decode
/// kernels do not compute: a head dim that is not a multiple of 16 up to 128 or of 64 beyond
/// (the mma's K step; the value blocks of [`value_blocks`]), no query head per key/value
/// head, a rotary dim that is odd or wider than the head, a query block that is not whole
/// warps of 16 rows (64 per 4 warps), no rows per block.
#[track_caller]
fn validate(p: &DecodeParams) {
    let head = |d: usize| d != 0 && (d <= 128 && d.is_multiple_of(16) || d.is_multiple_of(64));
    let d = p.d;
    if !head(d) {
        reject("decode: `d` must be a multiple of 16 up to 128, or of 64 beyond");
    }
    let dv = p.value_dim();
    if !head(dv) || !dv.is_multiple_of(8 * value_split(d, dv)) {
        reject("decode: `dv` must be 0 (`d`), or a multiple of 16 up to 128, or of 64 beyond");
    }
    if p.kv_group == 0 {
        reject("decode: `kv_group` must be at least 1");
    }
    if p.rotary_dim % 2 == 1 || p.rotary_dim > d {
        reject("decode: `rotary_dim` must be even and at most `d`");
    }
    if p.block_m == 0 || !p.block_m.is_multiple_of(64) {
        reject("decode: `block_m` must be a multiple of 64 (16 rows for each of 4 warps)");
    }
    if p.block_rows == 0 {
        reject("decode: `block_rows` must be at least 1");
    }
    if p.block_n != 0 && !p.block_n.is_multiple_of(16) {
        reject("decode: `block_n` must be a multiple of 16 (0: the kernels' choice)");
    }
}

impl DecodeParams {
    /// The head dim of `v` and `o`: `dv`, or `d` when it is 0.
    pub fn value_dim(&self) -> usize {
        if self.dv == 0 { self.d } else { self.dv }
    }

    /// How many blocks share a head's value columns ([`value_split`]): the attention grid's y
    /// is `heads_k * value_blocks()`.
    pub fn value_blocks(&self) -> usize {
        value_split(self.d, self.value_dim())
    }

    /// The keys per block of the attention kernels ([`decode_key_block`], for the wider of
    /// the two head dims).
    pub fn key_block(&self) -> usize {
        decode_key_block(self.block_n, self.d.max(self.value_dim()), self.page_size)
    }

    /// The window and chunks of these parameters (`causal` making `right` 0).
    fn window(&self) -> Window {
        Window::new(
            self.causal,
            self.window_left,
            self.window_right,
            self.attention_chunk,
        )
    }

    /// Whether the queries carry their own positions (causal, a window or chunks) for the
    /// rotary embedding; otherwise every query of a sequence sits at `cache_seqlens[b]`, as
    /// FlashAttention rotates them.
    fn local(&self) -> bool {
        let w = self.window();
        w.bounds_left() || w.bounds_right()
    }
}

/// The number of splits of the keys [`attention_decode_split`] should run with for `batch`
/// sequences of `heads_k` key/value heads, `row_blocks` packed query blocks each
/// (`cdiv(seqlen_q * kv_group, block_m)`), `keys` keys (the longest sequence) in blocks of
/// `block_n`, on `sms` multiprocessors: 1 when the blocks already fill the GPU (80% of the
/// SMs), else the smallest count whose last wave keeps at least 85% of the best count's SM
/// use, each split at least two key blocks and at most 128 splits. A waves' efficiency of
/// `n` blocks on `sms` SMs is `n / (sms * ceil(n / sms))`.
pub fn num_splits(
    (batch, heads_k, row_blocks): (usize, usize, usize),
    (keys, block_n): (usize, usize),
    sms: usize,
) -> usize {
    let blocks = batch * heads_k * row_blocks;
    let sms = sms.max(1);
    if blocks == 0 || blocks * 10 >= sms * 8 {
        return 1;
    }
    let key_blocks = keys.div_ceil(block_n.max(1));
    let most = (key_blocks / 2).clamp(1, 128);
    let efficiency = |splits: usize| {
        let n = blocks * splits;
        n as f64 / (sms * n.div_ceil(sms)) as f64
    };
    let best = (1..=most).map(efficiency).fold(0.0, f64::max);
    (1..=most)
        .find(|&s| efficiency(s) >= 0.85 * best)
        .unwrap_or(1)
}

/// Appends the new keys `k_new` and values `v_new` (`[batch, heads_k, seqlen_new, d]`, `v_new`
/// and `v_cache` `dv` wide when `DecodeParams::dv` says so; a
/// view of FlashAttention's `(batch, seqlen_new, nheads_k, d)`) into the caches `k_cache`,
/// `v_cache` (`[pages, heads_k, page, d]`, layout in `docs/kernels.md`) at positions
/// `cache_seqlens[b]..` of each sequence, through `page_table` (`[batch, pages per
/// sequence]`, i32). The keys are rotated first when `rotary_dim > 0`: token `t` by the
/// angle of row `cache_seqlens[b] + t` of `cos`, `sin` (`[seqlen_ro, rotary_dim / 2]`).
/// A position whose page lies past the page table is not written. Grid: `(cdiv(seqlen_new,
/// block_rows), heads_k, batch)`.
#[kernel(num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn kv_cache_append(
    k_new: Tensor<dtype, 4>,
    v_new: Tensor<dtype, 4>,
    k_cache: TensorMut<dtype, 4>,
    v_cache: TensorMut<dtype, 4>,
    page_table: Tensor<i32, 2>,
    cache_seqlens: Tensor<i32, 1>,
    cos: Tensor<dtype, 2>,
    sin: Tensor<dtype, 2>,
    #[comptime] p: DecodeParams,
) {
    validate(&p);
    let dv = p.value_dim();
    let DecodeParams {
        d,
        dtype,
        page_size,
        rotary_dim,
        rotary_interleaved,
        block_rows,
        ..
    } = p;
    let br = block_rows.max(1);
    let (tb, hk, b) = (block_id().x, block_id().y, block_id().z);
    let t = iota([br], 0) + tb * br;
    let start = cache_seqlens.scalar([b]);
    let pos = t + start;
    let (slot, row) = page_of(pos, k_cache, page_size);
    let page = page_table.tile([br], [b, 0]).index(1, slot).load();
    let keep: Value = t < k_new.dim(2) && slot < page_table.dim(1) && pos >= 0;
    let ks = k_new.tile([br, d], [b, hk, tb * br, 0]).load();
    let ks = if rotary_dim > 0 {
        let partner = k_new
            .tile([br, d], [b, hk, tb * br, 0])
            .index(3, partner_cols(d, rotary_dim, rotary_interleaved))
            .load();
        let rope = Rope::new(cos, sin, (d, rotary_dim, rotary_interleaved));
        rope.apply(ks, partner, pos).cast_to(dtype)
    } else {
        ks
    };
    let vs = v_new.tile([br, dv], [b, hk, tb * br, 0]).load();
    k_cache
        .tile([br, d], [0, hk, 0, 0])
        .index(0, page.col())
        .index(2, row)
        .store_masked(ks, keep.col());
    v_cache
        .tile([br, dv], [0, hk, 0, 0])
        .index(0, page.col())
        .index(2, row)
        .store_masked(vs, keep.col());
}

/// Heads per block of [`rotary_q`]: with 8 or 16, ptxas spills a few bytes at some head dims
/// (f16, d = 96 to 256) though the kernel holds little.
pub const ROTARY_HEADS: usize = 4;

/// Rotates the queries `q: [batch, seqlen_q, heads, d]` (FlashAttention's layout) into
/// `q_rot` (alike) for [`attention_decode`] when the call has a rotary dim: query token `t` of
/// sequence `b` at table row `cache_seqlens[b] + t` of `cos`, `sin` when the call is causal
/// or windowed, else every token at row `cache_seqlens[b]` (FlashAttention's positions). A
/// kernel of its own, not the attention's prologue: the rotation's registers would stay live
/// through the attention's key loop. Grid: `(seqlen_q, batch, cdiv(heads, ROTARY_HEADS))`.
#[kernel(num_warps = 4)]
pub fn rotary_q(
    q: Tensor<dtype, 4>,
    cos: Tensor<dtype, 2>,
    sin: Tensor<dtype, 2>,
    cache_seqlens: Tensor<i32, 1>,
    q_rot: TensorMut<dtype, 4>,
    #[comptime] p: DecodeParams,
) {
    validate(&p);
    let (d, br) = (p.d, ROTARY_HEADS);
    let (t, b, h0) = (block_id().x, block_id().y, block_id().z * br);
    let start = cache_seqlens.scalar([b]);
    // One position for the block's heads: the table rows are read once, as a `[1, d]` row.
    let pos = if p.local() {
        full::<i32>([1], t + start)
    } else {
        full::<i32>([1], start)
    };
    let xs = q.tile([br, d], [b, t, h0, 0]).load();
    let partner = q
        .tile([br, d], [b, t, h0, 0])
        .index(3, partner_cols(d, p.rotary_dim, p.rotary_interleaved))
        .load();
    let rope = Rope::new(cos, sin, (d, p.rotary_dim, p.rotary_interleaved));
    q_rot
        .tile([br, d], [b, t, h0, 0])
        .store(rope.apply(xs, partner, pos).cast_to(p.dtype));
}

/// Key position `pos` of a sequence as (its entry of the page table, its row in that page):
/// pages of `page_size` keys, or for a dense cache (`page_size` 0) one page as long as
/// `cache` (a position past it lands on the page table's second entry, which a dense cache's
/// `[batch, 1]` table lacks).
#[kernel_fn]
fn page_of(pos: Value, cache: Tensor, page_size: usize) -> (Value, Value) {
    if page_size == 0 {
        let len = max(cache.dim(2), 1);
        (pos / len, pos % len)
    } else {
        (pos / page_size, pos % page_size)
    }
}

/// For each column `c` of a `d`-wide row, the column whose element is rotated with it:
/// `c ^ 1` in the interleaved layout, `c -+ rotary_dim / 2` in the half-split one, `c` itself
/// past the rotary dim. A `[1, d]` i32 tile.
#[kernel_fn]
fn partner_cols(d: usize, rotary_dim: usize, interleaved: bool) -> Value {
    let c = iota([1, d], 1);
    let half = (rotary_dim / 2) as i32;
    let rotated = if interleaved {
        c ^ 1
    } else {
        select(c < half, c + half, c - half)
    };
    select(c < rotary_dim as i32, rotated, c)
}

/// The rotary tables and their shape: `(d, rotary_dim, interleaved)`.
#[derive(Clone, Copy, Debug)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
    d: usize,
    rotary_dim: usize,
    interleaved: bool,
}

impl Rope {
    fn new(cos: Tensor, sin: Tensor, (d, rotary_dim, interleaved): (usize, usize, bool)) -> Rope {
        Rope {
            cos,
            sin,
            d,
            rotary_dim,
            interleaved,
        }
    }

    /// `x` (a `[rows, d]` tile) rotated, row `r` by the angle of table row `pos[r]` (`pos` of
    /// `rows` or 1 entries, the one then for every row), in f32:
    /// `x[c] cos - x[partner] sin` for the first element of each pair, `x[c] cos +
    /// x[partner] sin` for the second, where `partner` is `x` read through
    /// [`partner_cols`]; columns past the rotary dim are `x` itself. Both layouts are this
    /// one formula with their own pairing.
    #[track_caller]
    fn apply(self, x: Value, partner: Value, pos: Value) -> Value {
        rope_apply(self, x, partner, pos)
    }
}

/// [`Rope::apply`]'s body.
#[kernel_fn]
fn rope_apply(r: Rope, x: Value, partner: Value, pos: Value) -> Value {
    let c = iota([1, r.d], 1);
    let half = (r.rotary_dim / 2) as i32;
    let (angle, first) = if r.interleaved {
        (c / 2, (c % 2) == 0)
    } else {
        (select(c < half, c, c - half), c < half)
    };
    let inside = c < r.rotary_dim as i32;
    let at = pos.col();
    let cos = r
        .cos
        .elems([at, angle])
        .load_masked(inside, 1.0)
        .cast::<f32>();
    let sin = r
        .sin
        .elems([at, angle])
        .load_masked(inside, 0.0)
        .cast::<f32>();
    let sin = select(first, -sin, sin);
    x.cast::<f32>() * cos + partner.cast::<f32>() * sin
}

/// Decode attention in one pass: `o[b, t, h] = softmax(q[b, t, h] . k^T * scale) v` over the
/// keys sequence `b` sees in its cache, with the log-sum-exp (natural log, `+inf` for a
/// query that sees no key) into `lse: [batch, heads, seqlen_q]`.
///
/// `q: [batch, seqlen_q, heads, d]` and `o: [batch, seqlen_q, heads, dv]` (FlashAttention's
/// layout; `dv` is `DecodeParams::value_dim`, `v_cache`'s last extent); `k_cache`,
/// `v_cache` and `page_table` as `docs/kernels.md` says (after [`kv_cache_append`], which wrote
/// `seqlen_new` keys per sequence); sequence `b` holds keys `cache_leftpad[b] ..
/// cache_seqlens[b] + seqlen_new` (`cache_seqlens` is the length before the append, as
/// FlashAttention's). Causal and window masks are aligned bottom-right against that end;
/// `softcap` caps the scores. With a rotary dim, `q` is [`rotary_q`]'s output.
///
/// Grid: `(cdiv(seqlen_q * kv_group, block_m), heads_k * value_split(d, dv), batch)`
/// ([`value_split`]).
#[kernel(num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    q: Tensor<dtype, 4>,
    k_cache: Tensor<dtype, 4>,
    v_cache: Tensor<dtype, 4>,
    page_table: Tensor<i32, 2>,
    cache_seqlens: Tensor<i32, 1>,
    cache_leftpad: Tensor<i32, 1>,
    o: TensorMut<dtype, 4>,
    lse: TensorMut<f32, 3>,
    scale: f32,
    seqlen_new: i32,
    #[comptime] p: DecodeParams,
) {
    validate(&p);
    let cache = Cache::new(
        (k_cache, v_cache, page_table),
        (cache_seqlens, cache_leftpad),
        seqlen_new,
    );
    decode(q, cache, (o, lse, false), scale, p);
}

/// [`attention_decode`] split over the keys (flash-decoding): block `x = split *
/// row_blocks + m` (`row_blocks = cdiv(seqlen_q * kv_group, block_m)`) walks the `split`-th of
/// `num_splits` equal shares of the key blocks its rows see, and writes its unnormalised
/// share as an f32 partial output `o_partial: [num_splits * batch, seqlen_q, heads, dv]`
/// (FlashAttention's `(num_splits, batch, seqlen_q, nheads, d)`) and its log-sum-exp
/// `lse_partial: [num_splits * batch, seqlen_q, heads]` (`-inf` where the share holds no key
/// the row sees), which [`attention_decode_combine`] merges. Other arguments as
/// [`attention_decode`]'s.
///
/// Grid: `(num_splits * cdiv(seqlen_q * kv_group, block_m), heads_k * value_split(d, dv),
/// batch)`; the kernel reads `num_splits` from the grid.
#[kernel(num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_split(
    q: Tensor<dtype, 4>,
    k_cache: Tensor<dtype, 4>,
    v_cache: Tensor<dtype, 4>,
    page_table: Tensor<i32, 2>,
    cache_seqlens: Tensor<i32, 1>,
    cache_leftpad: Tensor<i32, 1>,
    o_partial: TensorMut<f32, 4>,
    lse_partial: TensorMut<f32, 3>,
    scale: f32,
    seqlen_new: i32,
    #[comptime] p: DecodeParams,
) {
    validate(&p);
    let cache = Cache::new(
        (k_cache, v_cache, page_table),
        (cache_seqlens, cache_leftpad),
        seqlen_new,
    );
    decode(q, cache, (o_partial, lse_partial, true), scale, p);
}

/// The cache a decode block reads.
#[derive(Clone, Copy, Debug)]
struct Cache {
    k: Tensor,
    v: Tensor,
    page_table: Tensor,
    seqlens: Tensor,
    leftpad: Tensor,
    seqlen_new: Value,
}

impl Cache {
    fn new(
        (k, v, page_table): (Tensor, Tensor, Tensor),
        (seqlens, leftpad): (Tensor, Tensor),
        seqlen_new: Value,
    ) -> Cache {
        Cache {
            k,
            v,
            page_table,
            seqlens,
            leftpad,
            seqlen_new,
        }
    }
}

/// The packed rows of a decode block: row `r` of the tile is query token `t[r]` of head
/// `h[r]`, a real query where `valid[r]`.
#[derive(Clone, Copy, Debug)]
struct Packed {
    t: Value,
    h: Value,
    valid: Value,
}

impl Packed {
    /// Rows `r` of `row0..row0 + bm` packing `rows` (`seqlen_q * kv_group`) query rows of
    /// the `kv_group` heads from `h0`.
    #[track_caller]
    fn new(row0: Value, bm: usize, kv_group: usize, h0: Value, rows: Value) -> Packed {
        use kiln::ir::dsl::Compare;
        let r = iota([bm], 0) + row0;
        Packed {
            t: r / kv_group,
            h: r % kv_group + h0,
            valid: Compare::lt(r, rows),
        }
    }
}

/// The body of [`attention_decode`] and [`attention_decode_split`]: online softmax
/// (FlashAttention-2) over the key blocks of the block's share, the key tiles read straight
/// from a page when a page holds whole key blocks (`page_size` a multiple of the key block,
/// or a dense cache), else gathered row by row through the page table.
#[kernel_fn]
fn decode(
    q: Tensor,
    c: Cache,
    (o, lse, split): (Tensor, Tensor, bool),
    scale: Value,
    p: DecodeParams,
) {
    let (d, bm, g) = (p.d, p.block_m.max(64), p.kv_group.max(1));
    let bn = p.key_block();
    let w = p.window();
    // Block y is `hk * value_blocks + cb`: the block computes value columns `cb * dv ..`.
    let (vb, dv) = (p.value_blocks(), p.value_dim() / p.value_blocks());
    let (bx, by, b) = (block_id().x, block_id().y, block_id().z);
    let (hk, cb) = if vb == 1 {
        (by, by * 0)
    } else {
        (by / vb, by % vb)
    };
    let sq = q.dim(1);
    let row_blocks = cdiv(sq * g, bm);
    // The split kernel's block x is `share * row_blocks + m`.
    let (mb, share) = if split {
        (bx % row_blocks, bx / row_blocks)
    } else {
        (bx, bx * 0)
    };
    let rows = Packed::new(mb * bm, bm, g, hk * g, sq * g);
    let start = c.seqlens.scalar([b]);
    let sk = start + c.seqlen_new;
    let lp = max(c.leftpad.scalar([b]), 0);
    let qs = q
        .tile([bm, d], [b, 0, 0, 0])
        .index(1, rows.t.col())
        .index(2, rows.h)
        .load();
    // The keys the block's rows may see: from the leftpad (or the first row's window) to the
    // end (or the last row's window), in key blocks.
    let t_first = min(mb * bm / g, max(sq - 1, 0));
    let t_last = min((mb * bm + bm - 1) / g, max(sq - 1, 0));
    let lo = if w.chunk > 0 {
        max(lp, w.first_key(t_first + (sk - sq), Some(lp)))
    } else if w.left >= 0 {
        max(lp, t_first + sk - sq - w.left)
    } else {
        lp
    };
    let hi = if w.chunk > 0 {
        min(sk, w.last_key(t_last + (sk - sq), Some(lp)) + 1)
    } else if w.right >= 0 {
        min(sk, t_last + sk - sq + w.right + 1)
    } else {
        sk
    };
    let first_block = max(lo, 0) / bn;
    let end_block = select(hi > lo, cdiv(hi, bn), first_block);
    let (j0, j1) = if split {
        let per_split = cdiv(end_block - first_block, grid_dim().x / row_blocks);
        let j0 = min(first_block + share * per_split, end_block);
        (j0, min(j0 + per_split, end_block))
    } else {
        (first_block, end_block)
    };
    let qk_scale = scale * score_factor(p.softcap);
    let mut acc = zeros::<f32>([bm, dv]);
    let mut m = full::<f32>([bm], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([bm]);
    for j in pipelined(j0..j1, stages = 2) {
        let k0 = j * bn;
        let (ks, vs) = key_tiles(c, (hk, b), (k0, cb * dv), (bn, (d, dv), p.page_size));
        // Rows outside lp..sk may hold anything (a cache is often allocated uninitialised):
        // their zero weights would still carry a NaN or inf through the mma. Only the blocks
        // on the two edges pay for the select (a block-uniform branch).
        let vs = if k0 < lp || k0 + bn > sk {
            keys_only(vs, k0, (lp, sk), bn)
        } else {
            vs
        };
        let s = soft_cap(mma(&qs, &ks.t()) * qk_scale, p.softcap);
        let s = decode_mask(s, rows.t, k0, (sq, sk, lp), (bm, bn), w);
        let m_new = max(&m, &row_max(&s));
        // A row with no visible key so far has m_new = -inf; exponentiate against 0 so its
        // terms are exp2(-inf) = 0 rather than NaN.
        let m_use = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let pr = exp2(&(s - m_use.col()));
        let alpha = exp2(&(m - m_use));
        l = l * alpha + row_sum(&pr);
        acc = acc * alpha.col() + mma(&pr.cast_to(p.dtype), &vs);
        m = m_new;
    }
    let inv_l = recip(&select(l == 0.0, 1.0, l));
    let log_sum = (m + log2(&l)) * std::f32::consts::LN_2;
    // Every column block has the row's log-sum-exp; the first writes it.
    let lse_rows = rows.valid && cb == 0;
    if split {
        let at = share * q.dim(0) + b;
        store_rows(o, acc * inv_l.col(), rows, (at, cb * dv), (bm, dv));
        let lse_at = lse.tile([bm], [at, 0, 0]).index(1, rows.t).index(2, rows.h);
        lse_at.store_masked(select(l == 0.0, f32::NEG_INFINITY, log_sum), lse_rows);
    } else {
        let y = (acc * inv_l.col()).cast_to(p.dtype);
        store_rows(o, y, rows, (b, cb * dv), (bm, dv));
        let lse_at = lse.tile([bm], [b, 0, 0]).index(1, rows.h).index(2, rows.t);
        lse_at.store_masked(select(l == 0.0, f32::INFINITY, log_sum), lse_rows);
    }
}

/// Stores the packed `[bm, dv]` tile `y` into `o: [.., seqlen_q, heads, d]` at batch `b`,
/// columns `c0..`, row `r` at token `t[r]`, head `h[r]`, the valid rows only.
#[kernel_fn]
fn store_rows(
    o: Tensor,
    y: Value,
    rows: Packed,
    (b, c0): (Value, Value),
    (bm, dv): (usize, usize),
) {
    o.tile([bm, dv], [b, 0, 0, c0])
        .index(1, rows.t.col())
        .index(2, rows.h)
        .store_masked(y, rows.valid.col());
}

/// The `[bn, d]` key tile and `[bn, dv]` value tile (columns `c0..`) of keys `k0..` of
/// sequence `b`, key/value head `hk`: one page's rows when a page holds whole key blocks, else
/// each row through the page table.
#[kernel_fn]
fn key_tiles(
    c: Cache,
    (hk, b): (Value, Value),
    (k0, c0): (Value, Value),
    (bn, (d, dv), page_size): (usize, (usize, usize), usize),
) -> (Value, Value) {
    if page_size == 0 || page_size.is_multiple_of(bn) {
        let (slot, row) = page_of(k0, c.k, page_size);
        let page = c.page_table.scalar([b, slot]);
        let ks = c.k.tile([bn, d], [page, hk, row, 0]).load();
        let vs = c.v.tile([bn, dv], [page, hk, row, c0]).load();
        (ks, vs)
    } else {
        let (slot, row) = page_of(iota([bn], 0) + k0, c.k, page_size);
        let page = c.page_table.tile([bn], [b, 0]).index(1, slot).load();
        let ks =
            c.k.tile([bn, d], [0, hk, 0, 0])
                .index(0, page.col())
                .index(2, row)
                .load();
        let vs =
            c.v.tile([bn, dv], [0, hk, 0, c0])
                .index(0, page.col())
                .index(2, row)
                .load();
        (ks, vs)
    }
}

/// The `[bn, d]` value tile `vs` of keys `k0..` with 0 in the rows of keys outside `lp..sk`.
#[kernel_fn]
fn keys_only(vs: Value, k0: Value, (lp, sk): (Value, Value), bn: usize) -> Value {
    let j = iota([bn], 0) + k0;
    select((j >= lp && j < sk).col(), vs, 0.0)
}

/// The score tile `s` with `-inf` where packed row `r` (query token `t[r]` of `sq`) may not
/// see key `k0 + c`: before the leftpad `lp`, at or past the end `sk`, or outside the
/// bottom-right aligned window `w` (a negative bound unbounded): `t + sk - sq - left <= j <=
/// t + sk - sq + right`, and with chunks in the chunk of `t + sk - sq` (counted from `lp`).
#[kernel_fn]
fn decode_mask(
    s: Value,
    t: Value,
    k0: Value,
    (sq, sk, lp): (Value, Value, Value),
    (bm, bn): (usize, usize),
    w: Window,
) -> Value {
    let cols = iota([bm, bn], 1) + k0;
    let keep = cols < sk && cols >= lp;
    let keep = if w.chunk > 0 {
        // Each row's bounds once ([bm]), then broadcast along the keys.
        let diag = t + (sk - sq);
        let first = w.first_key(diag, Some(lp));
        keep && cols >= first.col() && cols <= w.last_key(diag, Some(lp)).col()
    } else {
        let diag = t.col() + (sk - sq);
        let keep = if w.left >= 0 {
            keep && cols >= diag - w.left
        } else {
            keep
        };
        if w.right >= 0 {
            keep && cols <= diag + w.right
        } else {
            keep
        }
    };
    select(keep, s, f32::NEG_INFINITY)
}

/// Merges the splits of [`attention_decode_split`]: for each query row, with `lse_s` the
/// log-sum-exp of split `s`, `lse = ln sum_s e^(lse_s)` and `o = sum_s e^(lse_s - lse)
/// o_s` (FlashAttention's `flash_attn_combine`). `o_partial: [num_splits * batch, seqlen_q,
/// heads, dv]` and `lse_partial: [num_splits * batch, seqlen_q, heads]` (f32) as the split
/// kernel writes them; `o: [batch, seqlen_q, heads, dv]` (`dtype`; `dv` the value head dim,
/// `DecodeParams::value_dim`), `lse: [batch, heads,
/// seqlen_q]`; `num_splits` is `o_partial`'s first extent over `o`'s. A row no split saw a
/// key for gets `o = 0` and `lse = +inf`, as [`attention_decode`] writes it.
///
/// Grid: `(cdiv(heads, block_rows), seqlen_q, batch)`.
#[kernel(num_warps = 4)]
pub fn attention_decode_combine(
    o_partial: Tensor<f32, 4>,
    lse_partial: Tensor<f32, 3>,
    o: TensorMut<dtype, 4>,
    lse: TensorMut<f32, 3>,
    #[comptime] p: DecodeParams,
) {
    validate(&p);
    let (d, bh) = (p.value_dim(), p.block_rows.max(1));
    let (hb, t, b) = (block_id().x, block_id().y, block_id().z);
    let h0 = hb * bh;
    let batch = o.dim(0);
    let splits = o_partial.dim(0) / max(batch, 1);
    let mut m = full::<f32>([bh], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([bh]);
    let mut acc = zeros::<f32>([bh, d]);
    for s in 0..splits {
        let at = s * batch + b;
        let ls = lse_partial.tile([bh], [at, t, h0]).load() * LOG2E;
        let os = o_partial.tile([bh, d], [at, t, h0, 0]).load();
        let m_new = max(&m, &ls);
        let m_use = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let alpha = exp2(&(m - m_use));
        let w = exp2(&(ls - m_use));
        l = l * alpha + w;
        acc = acc * alpha.col() + os * w.col();
        m = m_new;
    }
    let inv_l = recip(&select(l == 0.0, 1.0, l));
    o.tile([bh, d], [b, t, h0, 0])
        .store((acc * inv_l.col()).cast_to(p.dtype));
    let log_sum = (m + log2(&l)) * std::f32::consts::LN_2;
    // `lse` is `[batch, heads, seqlen_q]`: the block's heads run along dimension 1.
    lse.tile([bh], [b, 0, 0])
        .index(1, iota([bh], 0) + h0)
        .index(2, full::<i32>([bh], t))
        .store(select(l == 0.0, f32::INFINITY, log_sum));
}

#[cfg(test)]
mod tests {
    use super::{
        DecodeParams, attention_decode, decode_key_block, num_splits, value_blocks, value_split,
    };
    use crate::testing::build;

    #[test]
    fn splits_fill_the_gpu_only_when_the_blocks_do_not() {
        // 64 sequences of 8 key/value heads are 512 blocks: more than the 132 SMs hold.
        assert_eq!(num_splits((64, 8, 1), (32768, 64), 132), 1);
        // One sequence of 8 heads: 15 splits fill 120 of 132 SMs (91%), the first count
        // within 85% of the best (33 splits, two whole waves).
        assert_eq!(num_splits((1, 8, 1), (32768, 64), 132), 15);
        // Too few keys to split: each split takes at least two key blocks.
        assert_eq!(num_splits((1, 8, 1), (64, 64), 132), 1);
        assert_eq!(num_splits((1, 8, 1), (300, 64), 132), 2);
        for (batch, keys) in [(1, 1 << 17), (2, 5000), (3, 999), (0, 100)] {
            let s = num_splits((batch, 4, 2), (keys, 64), 132);
            assert!(
                (1..=128).contains(&s),
                "batch {batch} keys {keys}: {s} splits"
            );
            assert!(s == 1 || s <= keys.div_ceil(64) / 2);
        }
        assert_eq!(num_splits((1, 1, 1), (1 << 20, 64), 0), 1);
    }

    #[test]
    fn blocks_follow_the_head_dim_and_the_page() {
        assert_eq!(decode_key_block(0, 128, 0), 64);
        assert_eq!(decode_key_block(0, 128, 256), 64);
        assert_eq!(decode_key_block(0, 128, 16), 32);
        assert_eq!(decode_key_block(0, 256, 16), 16);
        assert_eq!(decode_key_block(0, 256, 1), 16);
        assert_eq!(decode_key_block(48, 64, 1), 48);
        assert_eq!([64, 96, 128, 256].map(value_blocks), [1, 1, 1, 4]);
        assert_eq!(value_split(192, 128), 2);
        assert_eq!(value_split(128, 64), 1);
        assert_eq!(value_split(64, 128), 1);
        assert_eq!(value_split(192, 96), 3);
        assert_eq!(value_split(256, 192), 3);
    }

    #[test]
    fn builds_for_its_defaults_and_rejects_what_it_does_not_compute() {
        use kiln::ir::dsl::{KernelDecl, KernelDef, Spec};
        build(&attention_decode, DecodeParams::default());
        let base = DecodeParams::default();
        for p in [
            DecodeParams { d: 72, ..base },
            DecodeParams {
                kv_group: 0,
                ..base
            },
            DecodeParams {
                rotary_dim: 130,
                ..base
            },
            DecodeParams {
                block_m: 48,
                ..base
            },
        ] {
            let spec = Spec::uniform(p, attention_decode.signature(), true);
            let e = attention_decode.build(&spec).expect_err("rejected");
            assert!(e.to_string().contains("decode: `"), "{e}");
        }
    }
}
