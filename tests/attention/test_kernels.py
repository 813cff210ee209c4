"""The kernel registry: names, options, device/dtype checks that fail early and never fall back."""

import pytest
import torch

from divergence.attention.kernels import KERNELS, available_kernels, get_kernel
from divergence.attention.reference import golden_attention
from divergence.errors import UserInputError

NAMES = ("baseline", "sdpa", "sdpa-flash", "sdpa-math", "sdpa-efficient", "sdpa-cudnn", "flash-attn", "tiled")


def test_registry_names():
    assert set(NAMES) <= set(KERNELS)
    for name in NAMES:
        assert get_kernel(name).name == name


def test_unknown_kernel_and_options():
    with pytest.raises(UserInputError, match="unknown attention kernel 'flashy'; known: baseline"):
        get_kernel("flashy")
    with pytest.raises(UserInputError, match="kernel 'sdpa-math' takes no options"):
        get_kernel("sdpa-math", block_q=4)
    with pytest.raises(UserInputError, match="unknown option 'tile'"):
        get_kernel("tiled", tile=4)


def test_cpu_kernels_available():
    names = available_kernels("cpu", torch.bfloat16, head_dim=16)
    assert {"baseline", "sdpa", "sdpa-flash", "sdpa-math", "tiled"} <= set(names)
    assert "sdpa-efficient" not in names and "sdpa-cudnn" not in names


@pytest.mark.parametrize("name,reason", [("sdpa-efficient", "runs on CUDA"), ("sdpa-cudnn", "runs on CUDA")])
def test_check_gives_one_line_reason(name, reason):
    with pytest.raises(UserInputError, match=reason) as err:
        get_kernel(name).check("cpu", torch.float32)
    assert "\n" not in str(err.value)


def test_flash_attn_check_names_the_package_or_device():
    kernel = get_kernel("flash-attn")
    with pytest.raises(UserInputError, match="flash-attn|CUDA"):
        kernel.check("cpu", torch.bfloat16)


def test_forced_backend_does_not_fall_back():
    x = torch.randn(1, 1, 8, 16)
    with pytest.raises(RuntimeError, match="No viable backend"):
        get_kernel("sdpa-efficient")(x, x, x)  # PyTorch would otherwise quietly use math


@pytest.mark.parametrize("name", ["baseline", "sdpa", "sdpa-flash", "sdpa-math", "tiled"])
def test_kernels_compute_attention(name):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 48, 16, generator=g) for _ in range(3))
    kernel = get_kernel(name, block_q=16, block_kv=16) if name == "tiled" else get_kernel(name)
    for causal in (False, True):
        out = kernel(q, k, v, causal=causal)
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(out.double(), golden_attention(q, k, v, causal=causal), atol=1e-5, rtol=1e-5)


def test_tiled_takes_accumulate_by_name_as_recipes_write_it():
    assert get_kernel("tiled", accumulate="fp32").options["accumulate"] is torch.float32
    assert get_kernel("tiled", accumulate="none").options["accumulate"] is None
    with pytest.raises(UserInputError, match="accumulate 'fp8'"):
        get_kernel("tiled", accumulate="fp8")
