"""Ring attention on the GPU: two processes sharing one CUDA device (gloo between them, the
shards staged through host memory) against single-device `flash_attn_func` on the whole
sequence, forward and backward, causal with the zigzag split and not causal, GQA, bf16.
Skipped without CUDA. (NCCL rings across several GPUs need a machine with several.)"""

import os
import socket
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
import torch.distributed as dist  # noqa: E402

import kiln_attn  # noqa: E402

WORLD = 2
# (causal, zigzag, seqlen, nheads, nheads_k, head dim)
CONFIGS = [(True, True, 4096, 8, 2, 128), (False, False, 2000, 4, 4, 64)]


def inputs(config, seed):
    _, _, s, h, hk, d = config
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda n: torch.randn((2, s, n, d), generator=g, device="cuda").to(torch.bfloat16)  # noqa: E731
    return make(h), make(hk), make(hk), make(h)


def shard(x, rank, zigzag):
    return kiln_attn.ring.zigzag_shard(x, rank, WORLD) if zigzag else x.chunk(WORLD, dim=1)[rank]


def unshard(parts, zigzag):
    return kiln_attn.ring.zigzag_unshard(parts) if zigzag else torch.cat(parts, dim=1)


def worker(rank, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        for i, config in enumerate(CONFIGS):
            causal, zigzag = config[0], config[1]
            q, k, v, dout = (shard(t, rank, zigzag) for t in inputs(config, 7 + i))
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = kiln_attn.ring_attention(*leaves, causal=causal, zigzag=zigzag)
            out.backward(dout)
            torch.save(
                {"out": out.detach().cpu(), **{n: t.grad.cpu() for n, t in zip(("dq", "dk", "dv"), leaves)}},
                os.path.join(out_dir, f"{i}-{rank}.pt"),
            )
    finally:
        dist.destroy_process_group()


def test_two_processes_on_one_gpu_match_single_device_attention():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        torch.multiprocessing.spawn(worker, args=(port, out_dir), nprocs=WORLD, join=True)
        for i, config in enumerate(CONFIGS):
            causal, zigzag = config[0], config[1]
            q, k, v, dout = inputs(config, 7 + i)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            ref = kiln_attn.flash_attn_func(*leaves, causal=causal)
            ref.backward(dout)
            want = {"out": ref.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
            parts = [torch.load(os.path.join(out_dir, f"{i}-{r}.pt")) for r in range(WORLD)]
            for name, w in want.items():
                got = unshard([p[name] for p in parts], zigzag).cuda()
                rel = ((got.float() - w.float()).norm() / w.float().norm()).item()
                # Two bf16 roundings apart (the ring merges blocks in f32, single-device attention
                # accumulates in one pass): the same bound as FlashAttention's own tests.
                assert rel < 2e-2, f"{name}: relative error {rel:.3g} against flash_attn_func, {config}"
