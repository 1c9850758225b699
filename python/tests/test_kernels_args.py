"""kiln_attn.kernels() / kiln_attn.kernel(name): the registry, the declarations and every
argument and comptime check of a launch, without torch or a GPU (fake tensors: fakes.py).
A well-formed launch gets past every check and, without a CUDA driver, fails only when it
opens the device (RuntimeError)."""

import pytest

import kiln_attn
from fakes import BF16, F16, F32, I32, FakeDType, FakeTensor
from test_args import without_gpu

LIBRARY = ["softmax", "softmax_backward", "layer_norm", "layer_norm_backward", "rms_norm",
           "rms_norm_backward", "sum_partials", "cross_entropy", "cross_entropy_reduce",
           "cross_entropy_backward", "rotary", "dropout"]


def test_every_library_kernel_is_registered():
    names = kiln_attn.kernels()
    assert names == sorted(names)
    for k in LIBRARY + ["attention", "gemm"]:
        assert k in names


def test_a_kernel_shows_its_declaration():
    k = kiln_attn.kernel("softmax")
    assert k.name == "softmax"
    assert k.path == "kiln_examples::softmax::softmax"
    assert k.signature == "softmax(x: Tensor<dtype, 2>, y: TensorMut<dtype, 2>; BM: usize = 4, BN: usize = 512, NW: usize = 4, dtype: DType = f32)"
    assert k.params == [
        {"name": "x", "kind": "tensor", "dtype": "dtype", "rank": 2, "mutable": False},
        {"name": "y", "kind": "tensor", "dtype": "dtype", "rank": 2, "mutable": True},
    ]
    assert k.comptime == [
        {"name": "BM", "kind": "usize", "default": 4},
        {"name": "BN", "kind": "usize", "default": 512},
        {"name": "NW", "kind": "usize", "default": 4},
        {"name": "dtype", "kind": "DType", "default": "f32"},
    ]
    assert kiln_attn.kernel("kiln_examples::softmax::softmax").name == "softmax"
    assert "softmax" in repr(k)
    d = kiln_attn.kernel("dropout")
    assert d.params[2:] == [{"name": "p", "kind": "scalar", "dtype": "f32"}, {"name": "seed", "kind": "scalar", "dtype": "u32"}]


def test_an_unknown_kernel_lists_the_known_ones():
    with pytest.raises(ValueError, match="^no kernel named `softmx`; one of: .*softmax"):
        kiln_attn.kernel("softmx")


@pytest.mark.parametrize("dtype,name", [(F32, "f32"), (BF16, "bf16"), (F16, "f16")])
def test_a_dtype_parameter_comes_from_its_tensor(dtype, name):
    x = FakeTensor((10, 20), dtype=dtype)
    assert kiln_attn.kernel("softmax").comptime_values(x, x) == {"BM": 4, "BN": 512, "NW": 4, "dtype": name}


@pytest.mark.parametrize("dtype,name", [(F32, "f32"), (BF16, "bf16"), (F16, "f16")])
def test_dropout_takes_its_dtype_from_x(dtype, name):
    d = kiln_attn.kernel("dropout")
    assert d.comptime == [
        {"name": "BLOCK", "kind": "usize", "default": 1024},
        {"name": "dtype", "kind": "DType", "default": "f32"},
    ]
    x = FakeTensor((1001,), dtype=dtype)
    assert d.comptime_values(x, x, 0.5, 7) == {"BLOCK": 1024, "dtype": name}
    other = F32 if dtype != F32 else BF16
    with pytest.raises(TypeError, match=rf"^y: expected a {dtype} tensor, got {other}$"):
        d.launch(1, x, FakeTensor((1001,), dtype=other), 0.5, 7)


def test_comptime_values_take_python_values_and_text():
    k = kiln_attn.kernel("layer_norm")
    x = FakeTensor((10, 20), dtype=BF16)
    s = FakeTensor((10,), dtype=F32)
    args = (x, x, x, x, s, s, 1e-5)
    assert k.comptime_values(*args, BM=8, BN="256") == {"BM": 8, "BN": 256, "NW": 4, "dtype": "bf16"}
    assert k.comptime_values(BM=2, dtype="f16") == {"BM": 2, "BN": 1024, "NW": 4, "dtype": "f16"}
    assert k.comptime_values(dtype=FakeDType("torch.float32")) == {"BM": 4, "BN": 1024, "NW": 4, "dtype": "f32"}


@pytest.mark.parametrize("kw,exc,msg", [
    ({"BX": 4}, TypeError, r"^softmax\(\) got an unexpected comptime parameter `BX`; its comptime parameters are: BM, BN, NW, dtype$"),
    ({"BM": 4.0}, TypeError, r"^BM: comptime parameter `BM` is a usize, got float$"),
    ({"BM": True}, TypeError, r"^BM: comptime parameter `BM` is a usize, got bool$"),
    ({"BM": -1}, ValueError, r"comptime parameter `BM` is a usize, and `-1` is not one"),
    ({"BM": "four"}, ValueError, r"comptime parameter `BM` is a usize, and `four` is not one"),
    ({"dtype": 3}, TypeError, r"^dtype: comptime parameter `dtype` is a DType, got int$"),
    ({"dtype": "f64"}, ValueError, r"comptime parameter `dtype` is a DType, and `f64` is not one"),
    ({"dtype": FakeDType("torch.float64")}, TypeError, r"^dtype: kiln kernels take .* got torch.float64$"),
])
def test_bad_comptime_values_are_refused_by_name(kw, exc, msg):
    x = FakeTensor((10, 20), dtype=F32)
    with pytest.raises(exc, match=msg):
        kiln_attn.kernel("softmax").launch(1, x, x, **kw)


def test_a_bad_comptime_value_is_refused_before_the_grid_too():
    with pytest.raises(TypeError, match="BM"):
        kiln_attn.kernel("softmax").grid(100, BM=1.5)


def test_the_kernels_grid():
    k = kiln_attn.kernel("softmax")
    assert k.grid(4097) == (1025, 1, 1)
    assert k.grid(4097, BM=16) == (257, 1, 1)
    assert kiln_attn.kernel("rotary").grid((7, 2, 17), BH=8) == (7, 2, 3)
    with pytest.raises(ValueError, match="^extents: expected 1 to 3"):
        k.grid(())
    with pytest.raises(TypeError, match="^extents: "):
        k.grid("x")


def layer_norm_args(**over):
    x = FakeTensor((10, 20), dtype=BF16)
    w = FakeTensor((20,), dtype=BF16)
    s = FakeTensor((10,), dtype=F32)
    args = {"x": x, "w": w, "b": w, "y": x, "mean": s, "rstd": s, "eps": 1e-5}
    args.update(over)
    return list(args.values())


@pytest.mark.parametrize("over,exc,msg", [
    ({"w": [1.0]}, TypeError, r"^w: expected a torch.Tensor, got list$"),
    ({"x": 3}, TypeError, r"^x: expected a torch.Tensor, got int$"),
    ({"b": FakeTensor((20,), dtype=F16)}, TypeError, r"^b: expected a torch.bfloat16 tensor, got torch.float16$"),
    ({"mean": FakeTensor((10,), dtype=BF16)}, TypeError, r"^mean: expected a torch.float32 tensor, got torch.bfloat16$"),
    ({"w": FakeTensor((4, 5), dtype=BF16)}, ValueError, r"^w: expected a 1-D tensor, got shape \[4, 5\]$"),
    ({"y": FakeTensor((10, 20), dtype=BF16, device="cpu")}, ValueError, r"^y: expected a CUDA tensor, got one on cpu$"),
    ({"y": FakeTensor((10, 20), dtype=BF16, device="cuda:1")}, ValueError, r"^y: expected a tensor on cuda:0 \(where x is\), got one on cuda:1$"),
    ({"x": FakeTensor((10, 20), dtype=BF16, strides=(-20, 1))}, ValueError, r"^x: expected non-negative strides"),
    ({"eps": "small"}, TypeError, r"^eps: expected a number \(f32\), got str$"),
    ({"eps": True}, TypeError, r"^eps: expected a number \(f32\), got bool$"),
    ({"x": FakeTensor((10, 20), dtype=FakeDType("torch.float64"))}, TypeError, r"^x: expected a torch.bfloat16 tensor, got torch.float64$"),
])
def test_bad_arguments_are_refused_by_name(over, exc, msg):
    with pytest.raises(exc, match=msg):
        kiln_attn.kernel("layer_norm").launch(1, *layer_norm_args(**over))


def test_the_argument_count_is_checked():
    with pytest.raises(TypeError, match=r"^layer_norm\(\) takes 7 launch argument\(s\) \(x, w, b, y, mean, rstd, eps\), got 6$"):
        kiln_attn.kernel("layer_norm").launch(1, *layer_norm_args()[:-1])


@pytest.mark.parametrize("seed,exc,msg", [
    (-1, ValueError, r"^seed: -1 does not fit the kernel's u32$"),
    (1 << 32, ValueError, r"^seed: 4294967296 does not fit the kernel's u32$"),
    (1.5, TypeError, r"^seed: expected an int \(u32\), got float$"),
])
def test_integer_scalars_are_range_checked(seed, exc, msg):
    x = FakeTensor((100,), dtype=F32)
    with pytest.raises(exc, match=msg):
        kiln_attn.kernel("dropout").launch(1, x, x, 0.5, seed)


@pytest.mark.parametrize("grid,exc,msg", [
    (0, ValueError, r"^grid: block counts are 1 to 2\^32 - 1"),
    ((1, 2, 3, 4), ValueError, r"^grid: expected 1 to 3 block counts, got 4$"),
    ((), ValueError, r"^grid: expected 1 to 3 block counts, got 0$"),
    ("big", TypeError, r"^grid: expected an int or a tuple"),
])
def test_the_grid_is_checked(grid, exc, msg):
    with pytest.raises(exc, match=msg):
        kiln_attn.kernel("layer_norm").launch(grid, *layer_norm_args())


@without_gpu
def test_a_well_formed_launch_fails_only_at_the_device():
    with pytest.raises(RuntimeError, match="^kiln_attn: no CUDA driver"):
        kiln_attn.kernel("layer_norm").launch((3, 1, 1), *layer_norm_args(), BM=4)
    t = FakeTensor((10, 2), dtype=I32)
    f = FakeTensor((10,), dtype=F32)
    with pytest.raises(RuntimeError, match="^kiln_attn: no CUDA driver"):
        kiln_attn.kernel("cross_entropy").launch(10, FakeTensor((10, 50), dtype=F16), t, f, f, -100)
