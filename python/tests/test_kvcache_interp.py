"""flash_attn_with_kvcache and flash_attn_combine through PyTorch on kiln's CPU interpreter,
against a float64 reference of FlashAttention's semantics (append, rotary, page lookup,
bottom-right masks, chunks, soft-cap, GQA): fresh inputs (KILN_SEED fixes them), ragged cache
lengths, NaN in every slot no sequence holds and in the outputs before the call; the cache
after the call equals the reference's. Skipped without torch."""

import functools
import math
import os
import random
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

import kiln_attn  # noqa: E402
from kiln_attn import fa3  # noqa: E402

SEED = int(os.environ.get("KILN_SEED", random.randrange(1 << 31)))


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty and torch.empty_like return NaN-filled float tensors during the test: an
    output element no kernel writes stays NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(empty_like(*a, **k)))


def draw(shape, dtype, dist, g):
    if dist == "normal":
        x = torch.randn(shape, generator=g, dtype=torch.float64)
    elif dist == "uniform":
        x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    else:  # large magnitudes: scores in the hundreds, softmax rows nearly one-hot
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 6
    return x.to(dtype)


@dataclass
class Case:
    lens: list
    heads_k: int = 2
    group: int = 2
    d: int = 32
    # v's head dim (headdim_v, FlashAttention 3's); 0: d.
    dv: int = 0
    sq: int = 1
    s_new: int = 0
    page: int = 0  # 0: a dense cache
    batch_idx: bool = False
    leftpad: list = field(default_factory=list)
    causal: bool = False
    window: tuple = (-1, -1)
    # FlashAttention 3's attention_chunk (through kiln_attn.fa3), counted from the leftpad.
    chunk: int = 0
    softcap: float = 0.0
    rotary: tuple = None  # (rotary_dim, interleaved)
    splits: int = 1
    dtype: torch.dtype = torch.bfloat16
    dist: str = "normal"
    int_seqlens: bool = False
    block_table: bool = False
    # k_cache and v_cache as views into one (pages, page, 2, nheads_k, d) buffer.
    packed: bool = False

    @property
    def b(self):
        return len(self.lens)

    @property
    def d_v(self):
        return self.dv or self.d

    def longest(self):
        return max(self.lens) + self.s_new


def make_inputs(c, g):
    """FlashAttention's tensors for case `c`: the caches NaN wherever no sequence holds a key,
    a random page table (one spare entry per sequence pointing at a NaN page) or a random
    cache_batch_idx."""
    b, hk, d, dt = c.b, c.heads_k, c.d, c.dtype
    h = hk * c.group
    x = {"q": draw((b, c.sq, h, d), dt, c.dist, g)}
    if c.s_new:
        x["k"] = draw((b, c.s_new, hk, d), dt, c.dist, g)
        x["v"] = draw((b, c.s_new, hk, c.d_v), dt, c.dist, g)
    if c.page:
        pps = -(-c.longest() // c.page) + 1
        pages = b * pps + 2
        page_len = c.page
        table = torch.randperm(pages, generator=g)[: b * pps].reshape(b, pps).to(torch.int32)
        x["page_table"] = table
        rows = [[(int(table[i, j // c.page]), j % c.page) for j in range(pps * c.page)] for i in range(b)]
        capacity = pps * c.page
    else:
        page_len = c.longest() + 5
        capacity = page_len
        pages = b + 2 if c.batch_idx else b
        idx = torch.randperm(pages, generator=g)[:b].to(torch.int32) if c.batch_idx else torch.arange(b, dtype=torch.int32)
        if c.batch_idx:
            x["cache_batch_idx"] = idx
        rows = [[(int(idx[i]), j) for j in range(page_len)] for i in range(b)]
    kc = draw((pages, page_len, hk, d), dt, c.dist, g)
    vc = draw((pages, page_len, hk, c.d_v), dt, c.dist, g)
    held = torch.zeros((pages, page_len), dtype=torch.bool)
    for i, n in enumerate(c.lens):
        lp = c.leftpad[i] if c.leftpad else 0
        for j in range(lp, n):
            held[rows[i][j]] = True
    kc[~held] = float("nan")
    vc[~held] = float("nan")
    if c.packed:
        both = torch.stack([kc, vc], dim=2)
        kc, vc = both[:, :, 0], both[:, :, 1]
    x["k_cache"], x["v_cache"] = kc, vc
    x["cache_seqlens"] = c.lens[0] if c.int_seqlens else torch.tensor(c.lens, dtype=torch.int32)
    if c.leftpad:
        x["cache_leftpad"] = torch.tensor(c.leftpad, dtype=torch.int32)
    if c.rotary:
        r = c.rotary[0]
        angle = torch.rand((capacity, r // 2), generator=g, dtype=torch.float64) * 2 * math.pi
        x["rotary_cos"], x["rotary_sin"] = angle.cos().to(dt), angle.sin().to(dt)
    return x, rows, capacity


def rotate(x, cos, sin, interleaved):
    """x (..., d) rotated by cos, sin (..., r / 2) in f64, FlashAttention's two layouts."""
    r = 2 * cos.shape[-1]
    x = x.double().clone()
    if interleaved:
        a, b = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = x[..., : r // 2].clone(), x[..., r // 2 : r].clone()
        x[..., : r // 2], x[..., r // 2 : r] = a * cos - b * sin, b * cos + a * sin
    return x


def reference(c, x, rows, capacity):
    """FlashAttention's flash_attn_with_kvcache in f64: (appended k_cache, v_cache, out, lse)."""
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    h, g = c.heads_k * c.group, c.group
    scale = c.d ** -0.5
    left, right = c.window
    left = -1 if left >= capacity else left
    right = -1 if right >= capacity else right
    if c.causal:
        right = 0
    local = left >= 0 or right >= 0 or c.chunk > 0
    out = torch.zeros((c.b, c.sq, h, c.d_v), dtype=torch.float64)
    lse = torch.full((c.b, h, c.sq), math.inf, dtype=torch.float64)
    lens = [c.lens[0]] * c.b if c.int_seqlens else c.lens
    for i in range(c.b):
        n = lens[i]
        lp = c.leftpad[i] if c.leftpad else 0
        q = x["q"][i].double()
        if c.s_new:
            kn, vn = x["k"][i].double(), x["v"][i].double()
            if c.rotary:
                pos = torch.arange(n, n + c.s_new)
                kn = rotate(kn, x["rotary_cos"][pos].double()[:, None], x["rotary_sin"][pos].double()[:, None], c.rotary[1])
            for t in range(c.s_new):
                kc[rows[i][n + t]] = kn[t].to(c.dtype)
                vc[rows[i][n + t]] = vn[t].to(c.dtype)
        if c.rotary:
            pos = torch.arange(n, n + c.sq) if local else torch.full((c.sq,), n)
            q = rotate(q, x["rotary_cos"][pos].double()[:, None], x["rotary_sin"][pos].double()[:, None], c.rotary[1])
            # The kernels attend with the rotated queries stored in q's dtype.
            q = q.to(c.dtype).double()
        sk = n + c.s_new
        keys = torch.stack([kc[rows[i][j]] for j in range(sk)]).double() if sk else torch.zeros((0, c.heads_k, c.d), dtype=torch.float64)
        vals = torch.stack([vc[rows[i][j]] for j in range(sk)]).double() if sk else torch.zeros((0, c.heads_k, c.d_v), dtype=torch.float64)
        keys = keys.repeat_interleave(g, dim=1)  # (sk, h, d)
        vals = vals.repeat_interleave(g, dim=1)
        s = torch.einsum("thd,jhd->htj", q, keys.double()) * scale
        if c.softcap > 0:
            s = c.softcap * torch.tanh(s / c.softcap)
        t = torch.arange(c.sq)[:, None]
        j = torch.arange(sk)[None, :]
        keep = j >= lp
        diag = t + sk - c.sq
        if left >= 0:
            keep = keep & (j >= diag - left)
        if right >= 0:
            keep = keep & (j <= diag + right)
        if c.chunk > 0:
            same = torch.div(j - lp, c.chunk, rounding_mode="floor") == torch.div(diag - lp, c.chunk, rounding_mode="floor")
            keep = keep & same
        s = s.masked_fill(~keep, -math.inf)
        m = s.amax(dim=-1, keepdim=True) if sk else torch.full((h, c.sq, 1), -math.inf)
        seen = torch.isfinite(m)
        p = torch.exp(s - torch.where(seen, m, 0.0))
        den = p.sum(-1, keepdim=True)
        o = torch.einsum("htj,jhd->thd", p, torch.nan_to_num(vals)) / torch.where(seen, den, 1.0).permute(1, 0, 2)
        out[i] = torch.where(seen.permute(1, 0, 2), o, 0.0)
        lse[i] = torch.where(seen[..., 0], (m + den.log())[..., 0], math.inf)
    return kc, vc, out, lse


def call(c, x, fn=None):
    """The case's call of `fn` (flash_attn_with_kvcache) on the inputs `x`."""
    fn = fn or kiln_attn.flash_attn_with_kvcache
    kw = {k: v for k, v in x.items() if k not in ("q", "k_cache", "v_cache")}
    if c.block_table:
        kw["block_table"] = kw.pop("page_table")
    if c.rotary:
        kw["rotary_interleaved"] = c.rotary[1]
    if c.chunk:
        fn = fa3.flash_attn_with_kvcache
        kw["attention_chunk"] = c.chunk
    return fn(x["q"], x["k_cache"], x["v_cache"], causal=c.causal, window_size=c.window, softcap=c.softcap,
              num_splits=c.splits, return_softmax_lse=True, **kw)


def run(c, x, fn=None):
    with kiln_attn.interpreter():
        return call(c, x, fn)


def snapshot(x):
    """The inputs before a call (which appends into the caches in place)."""
    return {k: (t.clone() if isinstance(t, torch.Tensor) else t) for k, t in x.items()}


def check(c, x, rows, capacity, got, before):
    """`got` (out, lse) and the caches of `x` after the call against the reference run on the
    inputs as they were `before` it."""
    want_k, want_v, want_out, want_lse = reference(c, before, rows, capacity)
    out, lse = got
    what = f"{c} seed {SEED}"
    # The cache after the call: the appended (rotated) keys in the cache's dtype, rounding of
    # the f32 rotation aside; every other slot (NaN included) untouched.
    tol = 1e-2 if c.dtype == torch.bfloat16 else 1e-3
    torch.testing.assert_close(x["k_cache"].double(), want_k.double(), equal_nan=True, atol=tol * 4, rtol=tol, msg=what)
    torch.testing.assert_close(x["v_cache"], want_v, equal_nan=True, atol=0, rtol=0, msg=what)
    assert out.dtype == c.dtype and out.shape == want_out.shape, what
    assert lse.dtype == torch.float32 and lse.shape == want_lse.shape, what
    assert not out.isnan().any(), f"output left unwritten (NaN): {what}"
    scale = max(1.0, float(torch.nan_to_num(x["v_cache"].double()).abs().max()))
    if "v" in x:
        scale = max(scale, float(x["v"].double().abs().max()))
    err = float((out.double() - want_out).abs().max())
    assert err <= 2e-2 * scale, f"max |out - ref| = {err} (scale {scale}): {what}"
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), f"rows without keys: {what}"
    finite = torch.isfinite(want_lse)
    lerr = float((lse.double()[finite] - want_lse[finite]).abs().max()) if finite.any() else 0.0
    assert lerr <= 1e-2 * max(1.0, float(want_lse[finite].abs().max()) if finite.any() else 1.0), f"lse error {lerr}: {what}"


CASES = {
    # Dense cache, no append, lengths 0 and 1 (a row with no key), GQA, one pass.
    "dense": Case(lens=[0, 1, 37]),
    # Dense rows picked by cache_batch_idx, three new keys, four queries, causal, 3 splits.
    "batch_idx_append_causal_split3": Case(lens=[0, 1, 20], s_new=3, sq=4, batch_idx=True, causal=True, splits=3,
                                           dist="large"),
    # Pages of 16 keys, a random page table, rotary (interleaved), kiln's choice of splits.
    "page16_rotary_auto": Case(lens=[5, 0, 40], s_new=2, page=16, rotary=(16, True), splits=0, dist="uniform"),
    # Pages of one key, GPT-NeoX rotary on 4 queries with a window, 3 splits.
    "page1_window_neox_split3": Case(lens=[3, 1, 9], s_new=4, sq=4, page=1, window=(3, 1), rotary=(32, False),
                                     splits=3),
    # Pages of 256 keys (one holding the whole sequence), soft-cap, head dim 64, MQA.
    "page256_softcap": Case(lens=[0, 100, 254], s_new=1, page=256, softcap=30.0, d=64, heads_k=1, group=4,
                            block_table=True, dist="large"),
    # Left padding, causal, four queries, fp16, MHA, split.
    "leftpad_causal_fp16": Case(lens=[3, 4, 30], leftpad=[0, 2, 5], sq=4, causal=True, dtype=torch.float16,
                                group=1, splits=2),
    # Forty query heads of one key/value head, three tokens: 120 packed rows, one block of 128
    # (sm_90a's choice past 64 rows, which the interpreter plans as), split.
    "gqa40_one_row_block_split3": Case(lens=[7, 0, 50], heads_k=1, group=40, sq=3, s_new=3, page=16, splits=3,
                                       rotary=(32, True), causal=True),
    # Four tokens: 160 packed rows, two blocks of 128 (the second part-filled), kiln's splits.
    "gqa40_two_row_blocks": Case(lens=[7, 0, 50], heads_k=1, group=40, sq=4, s_new=4, page=16, splits=0,
                                 causal=True),
    # Head dim 256 (four value blocks), a left window only, kiln's choice of splits.
    "d256_left_window": Case(lens=[1, 33, 70], d=256, heads_k=1, group=3, sq=2, s_new=2, window=(20, -1),
                             splits=0),
    # MLA's head dims (keys 192, values 128: two value blocks), pages of 16, an append,
    # causal, 3 splits.
    "mla_192_128_page16_split3": Case(lens=[9, 0, 40], d=192, dv=128, heads_k=1, group=4, sq=2, s_new=2, page=16,
                                      causal=True, splits=3),
    # Values wider than keys, dense, rotary on the keys, one pass.
    "dv_wider_dense_rotary": Case(lens=[0, 12, 31], d=32, dv=64, s_new=1, rotary=(16, True), dist="large"),
    # Head dims in no tile width (72 runs in 80, 40 in 48), a window, kiln's choice of splits.
    "d72_dv40_window_auto": Case(lens=[5, 60, 1], d=72, dv=40, sq=3, s_new=1, window=(10, 0), splits=0,
                                 dtype=torch.float16),
    # Caches that are strided views into one key/value buffer: appended in place there.
    "packed_kv_buffer": Case(lens=[7, 0, 30], s_new=2, sq=2, page=16, packed=True, rotary=(16, False), causal=True,
                             splits=2),
    # An int cache_seqlens, rotary on a causal call (queries at their own positions).
    "int_seqlens_rotary_causal": Case(lens=[17, 17, 17], s_new=2, sq=2, int_seqlens=True, causal=True,
                                      rotary=(32, True), splits=0),
    # Head dims off the 16-byte grid run on zero-padded copies (FlashAttention 2's rule): the
    # appended rows written back into the caller's caches, the output cut back, the scale from
    # the unpadded head dim. Keys 100 wide (rotated over all 100 columns), values 72: only q,
    # k and k_cache padded; paged, causal, 3 splits.
    "d100_dv72_page16_rotary_split3": Case(lens=[9, 0, 40], d=100, dv=72, sq=2, s_new=3, page=16,
                                           rotary=(100, True), causal=True, splits=3),
    # Values 100 wide, keys 72: only v and v_cache padded; dense rows by cache_batch_idx,
    # GPT-NeoX rotary on part of the keys.
    "d72_dv100_batch_idx_neox": Case(lens=[3, 20, 1], d=72, dv=100, s_new=2, batch_idx=True, rotary=(40, False),
                                     dist="large"),
    # Both padded, no append (the copies are only read), paged, kiln's choice of splits.
    "d100_page16_no_append": Case(lens=[5, 0, 40], d=100, sq=2, page=16, causal=True, splits=0),
    # Head dim 3 (padded to 8, the narrowest tile), pages of one key, rotary, 2 splits.
    "d3_page1_rotary_split2": Case(lens=[3, 1, 9], d=3, s_new=2, page=1, rotary=(2, False), splits=2,
                                   dtype=torch.float16),
    # Multiples of 8 as they are: 40 (tile 64) dense with rotary, 200 (tile 256, four value
    # blocks) paged; and 202 / 36 padded, keys in the widest tile.
    "d40_dense_rotary": Case(lens=[0, 12, 31], d=40, s_new=1, rotary=(40, True)),
    "d200_page16_rotary": Case(lens=[2, 30, 0], d=200, heads_k=1, group=2, s_new=2, page=16, rotary=(64, False),
                               splits=2),
    "d202_dv36_dense_append": Case(lens=[2, 30, 0], d=202, dv=36, heads_k=1, group=2, s_new=2, splits=0),
    # Padded caches that are strided views into one key/value buffer.
    # FlashAttention 3's attention_chunk, counted from each leftpad: causal, paged by 16, an
    # append, rotary at the queries' own positions, 3 splits; then dense with a left window
    # wider than the chunk and kiln's choice of splits.
    "chunk24_leftpad_causal_paged": Case(lens=[40, 3, 70], leftpad=[0, 5, 30], s_new=2, sq=5, page=16, causal=True,
                                         chunk=24, rotary=(16, False), splits=3),
    "chunk16_window_dense_auto": Case(lens=[9, 50], leftpad=[2, 0], sq=3, window=(20, -1), chunk=16, splits=0),
    "packed_d36": Case(lens=[7, 0, 30], d=36, s_new=2, sq=2, page=16, packed=True, rotary=(16, True), causal=True),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_the_f64_reference(name, poisoned):
    c = CASES[name]
    g = torch.Generator().manual_seed(SEED + list(CASES).index(name))
    x, rows, capacity = make_inputs(c, g)
    before = snapshot(x)
    check(c, x, rows, capacity, run(c, x), before)


def test_return_without_lse_and_fa3s_entry(poisoned):
    c = Case(lens=[2, 9, 0], s_new=1, page=16, sq=1)
    g = torch.Generator().manual_seed(SEED + 7)
    x, rows, capacity = make_inputs(c, g)
    x2 = snapshot(x)
    got = run(c, x, fa3.flash_attn_with_kvcache)
    check(c, x, rows, capacity, got, x2)
    with kiln_attn.interpreter():
        out = kiln_attn.flash_attn_with_kvcache(x2["q"], x2["k_cache"], x2["v_cache"], x2["k"], x2["v"],
                                                cache_seqlens=x2["cache_seqlens"], page_table=x2["page_table"])
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, got[0], atol=0, rtol=0)


def test_window_spellings_and_both_rules_agree_below_seqlen_q():
    # Four queries against a cache of 40 keys (the cache's length being FlashAttention's
    # seqlen_k): right = 2 lies below seqlen_q - 1 = 3 and masks the last key for the first
    # query under both rules; right = 40 is unbounded under both.
    c = Case(lens=[6, 6, 6], sq=4, window=(-1, 2))
    g = torch.Generator().manual_seed(SEED + 11)
    x, rows, capacity = make_inputs(c, g)
    with kiln_attn.interpreter():
        a = fa3.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"],
                                        window_size=[-1, 2])
        b = kiln_attn.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"],
                                              window_size=torch.tensor([-1, 2]))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    want = reference(c, x, rows, capacity)[2]
    assert float((a.double() - want).abs().max()) <= 2e-2 * max(1.0, float(torch.nan_to_num(x["v_cache"].double()).abs().max()))


def test_a_padded_call_runs_the_kernels_on_padded_copies_bit_for_bit(poisoned):
    # Head dims 100 / 36 against the same call on the tensors padded by hand to 104 / 40 (the
    # kernels' own path, given the scale of 100): the same output and lse bit for bit, and the
    # caller's caches equal to the hand-padded ones cut back, every slot, NaN ones included.
    # The last sequence's length puts two of its new keys past its pages (dense: past its row),
    # which the kernels skip: the write-back must not invent them.
    for page in (0, 16):
        c = Case(lens=[4, 0, 13], d=100, dv=36, s_new=3, sq=2, page=page, rotary=(100, True), splits=2)
        g = torch.Generator().manual_seed(SEED + 17 + page)
        x, _, capacity = make_inputs(c, g)
        x["cache_seqlens"][2] = capacity - 1
        # Table rows for the skipped positions too (the kernels rotate before they skip).
        x["rotary_cos"], x["rotary_sin"] = (torch.cat([t, t[:2]]) for t in (x["rotary_cos"], x["rotary_sin"]))
        by_hand = snapshot(x)
        for name in ("q", "k", "v", "k_cache", "v_cache"):
            by_hand[name] = torch.nn.functional.pad(by_hand[name], (0, -by_hand[name].shape[-1] % 8))
        before = snapshot(x)
        got = run(c, x)
        with kiln_attn.interpreter():
            want = call(c, by_hand, functools.partial(kiln_attn.flash_attn_with_kvcache, softmax_scale=c.d ** -0.5))
        what = f"page {page} seed {SEED}"
        # (The last sequence's attention reads the NaN slots between its keys: NaN both ways.)
        torch.testing.assert_close(got[0], want[0][..., : c.d_v], atol=0, rtol=0, equal_nan=True, msg=what)
        torch.testing.assert_close(got[1], want[1], atol=0, rtol=0, equal_nan=True, msg=what)
        for name in ("k_cache", "v_cache"):
            mine = x[name]
            torch.testing.assert_close(mine, by_hand[name][..., : mine.shape[-1]], atol=0, rtol=0, equal_nan=True,
                                       msg=what)
            # Exactly the appended slots changed (all NaN before): three new keys of sequences 0
            # and 1, one of sequence 2.
            changed = ~((mine == before[name]) | (mine.isnan() & before[name].isnan())).all(-1).all(-1)
            assert int(changed.sum()) == 2 * c.s_new + 1, what


def combine_reference(op, lp):
    m = lp.amax(0)
    seen = torch.isfinite(m)
    w = torch.exp(lp - torch.where(seen, m, 0.0)[None])
    den = w.sum(0)
    out = (op * w[..., None]).sum(0) / torch.where(seen, den, 1.0)[..., None]
    lse = torch.where(seen, m + den.log(), math.inf)
    return torch.where(seen[..., None], out, 0.0), lse


@pytest.mark.parametrize("d", [32, 36, 3])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, "out"])
def test_combine_matches_the_f64_reference(out_dtype, d, poisoned):
    # Head dims 36 and 3 run on a zero-padded copy of out_partial (FlashAttention 3's rule).
    g = torch.Generator().manual_seed(SEED + 13)
    n, b, s, h = 3, 2, 3, 5
    op = draw((n, b, s, h, d), torch.float32, "normal", g)
    lp = draw((n, b, s, h), torch.float32, "large", g)
    lp[1, 0, 1] = -math.inf  # a split that saw no key
    lp[:, 1, 2, 3] = -math.inf  # a row no split saw a key for
    lp[0, 1, 0, :] = 80.0  # magnitudes exp() overflows in f32
    want_out, want_lse = combine_reference(op.double(), lp.double())
    with kiln_attn.interpreter():
        if out_dtype == "out":
            dst = torch.full((b, s, h, d), float("nan"), dtype=torch.float16)
            out, lse = kiln_attn.flash_attn_combine(op, lp, out=dst)
            assert out is dst
        else:
            out, lse = kiln_attn.flash_attn_combine(op, lp, out_dtype=out_dtype)
    assert out.dtype == (torch.float16 if out_dtype == "out" else out_dtype or torch.float32)
    assert lse.shape == (b, s, h) and lse.dtype == torch.float32
    tol = 1e-5 if out.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), want_out, atol=tol * 4, rtol=tol)
    assert torch.isinf(lse[1, 2, 3]) and lse[1, 2, 3] > 0
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", ["page16_rotary_auto", "int_seqlens_rotary_causal", "d100_dv72_page16_rotary_split3",
                                  "chunk24_leftpad_causal_paged"])
def test_torch_compile_traces_a_decode_step_without_a_graph_break(backend, name):
    # The custom op torch.ops.kiln_attn._flash_attn_with_kvcache: traced with fullgraph=True,
    # the step appends into the caches in place and gives the eager call's bits.
    c = CASES[name]
    g = torch.Generator().manual_seed(SEED + 11)
    x, rows, capacity = make_inputs(c, g)
    before = snapshot(x)
    eager_x = snapshot(x)
    torch._dynamo.reset()
    step = torch.compile(lambda x: call(c, x), backend=backend, fullgraph=True)
    with kiln_attn.interpreter():
        got = step(x)
    check(c, x, rows, capacity, got, before)
    want = run(c, eager_x)
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(x["k_cache"], eager_x["k_cache"], atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["page16_rotary_auto", "d100_dv72_page16_rotary_split3"])
def test_the_decode_custom_op_passes_opcheck(name):
    # The padded path too: its write-back is the op's declared mutation, its output no alias.
    from kiln_attn import kvcache_op

    c = CASES[name]
    g = torch.Generator().manual_seed(SEED + 12)
    x, _, _ = make_inputs(c, g)
    args = (x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"], x["rotary_cos"], x["rotary_sin"],
            x["cache_seqlens"], None, None, None, x["page_table"], None, False, -1, -1, 0.0, True, 2, False)
    with kiln_attn.interpreter():
        torch.library.opcheck(kvcache_op._flash_attn_with_kvcache, args,
                              test_utils=("test_schema", "test_faketensor"))
