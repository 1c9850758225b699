"""Trains one small causal transformer twice on the same synthetic data, from the same
initial weights, in the same order: once with kiln_attn.flash_attn_func as its attention, once
with PyTorch's scaled_dot_product_attention, and writes both loss curves (JSON and an SVG
plot). Training through kiln's backward must follow the same curve within noise.

    python python/train_compare.py --device cuda --out DIR        # on a GPU (kiln launches)
    python python/train_compare.py --device cpu --out DIR         # kiln's interpreter (slow:
                                                                  # use the small defaults)

The task: sequences of tokens where each token after the second is a function of the two
before it (mod the vocabulary) that the sequence's earlier tokens pick, so the loss falls well
below chance only through attention. q, k and v are bf16 (what flash_attn_func takes); everything else is f32.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

# The installed package, not the source folder beside this script (which has no extension).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
import kiln_attn  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.d)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, attn):
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x)).to(torch.bfloat16)
        q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1)
        q = q.view(b, s, self.heads, self.d)
        k = k.view(b, s, self.kv_heads, self.d)
        v = v.view(b, s, self.kv_heads, self.d)
        y = attn(q, k, v).reshape(b, s, -1).float()
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self, vocab, dim, heads, kv_heads, layers, seq):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, kv_heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, attn):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, attn)
        return self.head(self.norm(x))


def kiln_attention(q, k, v):
    return kiln_attn.flash_attn_func(q, k, v, causal=True)


def sdpa_attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2)


def batches(args, device):
    """The synthetic data: token t[i] = a * (t[i-1] + t[i-2] + 1) mod vocab, a in {1, 2} drawn
    per sequence, so predicting it needs the two tokens before and the sequence's a (read
    from the earlier ones)."""
    g = torch.Generator().manual_seed(args.seed)
    for _ in range(args.steps):
        t = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
        t[:, :2] = torch.randint(0, args.vocab, (args.batch, 2), generator=g)
        coef = torch.randint(1, 3, (args.batch, 1), generator=g).expand(args.batch, 3)
        for i in range(2, args.seq + 1):
            t[:, i] = (coef[:, 0] * t[:, i - 1] + coef[:, 1] * t[:, i - 2] + coef[:, 2]) % args.vocab
        yield t[:, :-1].to(device), t[:, 1:].to(device)


def train(args, attn, device):
    torch.manual_seed(args.seed)
    model = Model(args.vocab, args.dim, args.heads, args.kv_heads, args.layers, args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step, (x, y) in enumerate(batches(args, device)):
        loss = F.cross_entropy(model(x, attn).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0:
            print(f"  step {step}: loss {losses[-1]:.4f}", flush=True)
    return losses


def svg(curves, path, title):
    """A line chart of the loss curves, written without a plotting library."""
    w, h, pad = 720, 420, 50
    n = max(len(c) for c in curves.values())
    top = max(max(c) for c in curves.values())
    low = min(min(c) for c in curves.values())
    x = lambda i: pad + (w - 2 * pad) * i / max(n - 1, 1)  # noqa: E731
    y = lambda v: h - pad - (h - 2 * pad) * (v - low) / max(top - low, 1e-9)  # noqa: E731
    colours = ["#d62728", "#1f77b4", "#2ca02c"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">step (0..{n - 1})</text>',
        f'<text x="{pad - 6}" y="{y(top)}" text-anchor="end">{top:.2f}</text>',
        f'<text x="{pad - 6}" y="{y(low)}" text-anchor="end">{low:.2f}</text>',
    ]
    for (name, c), colour in zip(curves.items(), colours):
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(c))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" opacity="0.8" points="{pts}"/>')
    for i, (name, colour) in enumerate(zip(curves, colours)):
        parts.append(f'<text x="{w - pad - 140}" y="{pad + 16 * i}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    device = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    curves, seconds = {}, {}
    for name, attn in (("sdpa", sdpa_attention), ("kiln", kiln_attention)):
        print(f"{name}:", flush=True)
        t0 = time.time()
        if device.type == "cpu" and name == "kiln":
            with kiln_attn.interpreter():
                curves[name] = train(args, attn, device)
        else:
            curves[name] = train(args, attn, device)
        seconds[name] = time.time() - t0
    tail = max(1, args.steps // 10)
    final = {k: sum(c[-tail:]) / tail for k, c in curves.items()}
    # The noise: the spread of the reference's own loss over its last steps.
    ref_tail = curves["sdpa"][-tail:]
    noise = math.sqrt(sum((v - final["sdpa"]) ** 2 for v in ref_tail) / tail)
    diff = abs(final["kiln"] - final["sdpa"])
    result = {
        "config": vars(args),
        "losses": curves,
        "final_mean_of_last_tenth": final,
        "reference_noise_std": noise,
        "final_difference": diff,
        "agree_within_noise": diff <= 2 * noise + 0.02,
        "seconds": seconds,
        "torch": torch.__version__,
    }
    tag = f"train-{device.type}"
    with open(os.path.join(args.out, f"{tag}.json"), "w") as f:
        json.dump(result, f, indent=1)
    svg(curves, os.path.join(args.out, f"{tag}.svg"), f"loss, kiln attention vs SDPA ({device.type}, {args.steps} steps)")
    print(json.dumps({k: result[k] for k in ("final_mean_of_last_tenth", "reference_noise_std", "final_difference", "agree_within_noise")}))
    return 0 if result["agree_within_noise"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
