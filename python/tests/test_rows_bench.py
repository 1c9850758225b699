"""bench/rows.py's logic without a GPU: the plan (points, bytes, skips, input sets) always; with
torch, each kernel's inputs, its two calls, the float64 reference and the error check, kiln's
side on the interpreter (Kernel.interpret) over CPU tensors. The timing needs the GPU."""

import importlib.util
import os
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("rows", os.path.join(HERE, "..", "..", "bench", "rows.py"))
rows = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rows)


def args(**kw):
    a = types.SimpleNamespace(quick=False, only=None, dtypes="f32,bf16", shapes=None)
    a.__dict__.update(kw)
    return a


def test_set_puts_comptime_values_on_top_of_the_configs_choice():
    ops = types.SimpleNamespace(config_norm_backward=lambda m, n, dt: {"BM": 1, "RB": 32})
    over = rows.parse_overrides(["norm_backward.OCC=2", "norm_backward.RB=16"])
    assert over == {"norm_backward": {"OCC": 2, "RB": 16}}
    rows.apply_overrides(ops, over)
    assert ops.config_norm_backward(4, 8, None) == {"BM": 1, "RB": 16, "OCC": 2}
    flags = rows.parse_overrides(["cross_entropy_reduce.MEAN=true", "cross_entropy_backward.REDUCED=false"])
    assert flags == {"cross_entropy_reduce": {"MEAN": True}, "cross_entropy_backward": {"REDUCED": False}}
    for bad in (["OCC=2"], ["norm_backward.OCC"], ["norm_backward.OCC=x"], ["norm_backward.OCC=True"]):
        with pytest.raises(SystemExit):
            rows.parse_overrides(bad)
    with pytest.raises(SystemExit):
        rows.apply_overrides(ops, {"nope": {"X": 1}})


def test_the_plan_covers_every_kernel_shape_and_dtype():
    points = rows.plan(args())
    assert len(points) == len(rows.KERNELS) * len(rows.SHAPES) * 2
    assert {(p["m"], p["n"]) for p in points} >= {(32768, 8192), (65536, 4096), (16384, 16384), (4096, 4097)}
    skipped = {(p["kernel"], p["dtype"], p["n"]) for p in points if p["skip"]}
    assert ("rotary", "f32", 4097) in skipped
    assert not any(p["skip"] for p in points if p["kernel"] in ("softmax", "layer_norm", "copy", "dropout"))
    # Each point's rotating sets exceed twice the L2 together.
    for p in points:
        assert p["input_sets"] * p["bytes"] >= 2 * rows.L2_DEFAULT or p["input_sets"] == 16


def test_bytes_count_inputs_once_and_outputs_once():
    m, n = 1000, 300
    assert rows.nbytes("softmax", m, n, "bf16") == 2 * m * n * 2
    assert rows.nbytes("layer_norm", m, n, "f32") == 2 * m * n * 4 + 2 * n * 4 + 8 * m
    assert rows.nbytes("rms_norm_backward", m, n, "bf16") == 3 * m * n * 2 + 2 * n * 2 + 4 * m
    assert rows.nbytes("cross_entropy_fwd_bwd", m, n, "f32") == 2 * m * n * 4 + 12 * m


def test_only_and_shapes_select_points_and_refuse_unknown_names():
    points = rows.plan(args(only="softmax", shapes="128x100", dtypes="bf16"))
    assert [(p["kernel"], p["m"], p["n"]) for p in points] == [("copy", 128, 100), ("softmax", 128, 100)]
    with pytest.raises(SystemExit, match="unknown kernel"):
        rows.plan(args(only="softmaxx"))
    with pytest.raises(SystemExit, match="--shapes"):
        rows.plan(args(shapes="12by4"))


def test_dry_run_prints_the_plan(capsys):
    assert rows.main(["--dry-run", "--quick"]) == 0
    assert "points measured" in capsys.readouterr().out


@pytest.mark.parametrize("kernel", [k for k in rows.KERNELS])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_each_case_runs_and_checks_on_the_cpu(kernel, dtype, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import kiln_attn
    from kiln_attn import ops
    from test_ops_interp import Interpreted

    monkeypatch.setattr(ops, "_k", lambda name: Interpreted(kiln_attn.kernel(name)))
    monkeypatch.setattr(ops, "_GRIDS", {})
    monkeypatch.setattr(ops, "_tensor", lambda name, t: t)
    m, n = 6, 256  # n a multiple of rotary's head dim
    if rows.applicable(kernel, m, n, dtype):
        pytest.skip(rows.applicable(kernel, m, n, dtype))
    case = rows.Case(torch, F, ops, kernel, m, n, dtype, 2, 1, device="cpu")
    case.ref = case.reference()
    for side in ("torch",) if kernel == "copy" else ("kiln", "torch"):
        out = (case.kiln if side == "kiln" else case.peer)(0)
        err, _ = case.rel_err(out, case.ref)
        assert err <= rows.BOUND[dtype], f"{side}: {err}"
        (case.kiln if side == "kiln" else case.peer)(1)  # the second input set
