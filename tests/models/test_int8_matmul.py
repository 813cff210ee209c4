"""The CPU int8 product of the int8-mixed arms: bitwise torchao's own, layer outputs and gradients."""

import pytest
import torch

from divergence.models import int8_matmul
from divergence.models.int8_matmul import EXACT_IN_FP32, exact_int_mm

pytest.importorskip("torchao")


def _int8(shape, seed):
    return torch.randint(-128, 128, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


@pytest.mark.parametrize("k", [64, EXACT_IN_FP32, EXACT_IN_FP32 + 8])
def test_the_float_product_is_the_int32_product_exactly(k):
    a, b = _int8((32, k), 0), _int8((k, 24), 1)
    assert torch.equal(exact_int_mm(a, b).to(torch.int64), torch._int_mm(a, b).to(torch.int64))


def test_the_worst_case_sum_is_exact_at_the_fp32_limit_and_goes_to_fp64_past_it():
    a = torch.full((32, EXACT_IN_FP32), -128, dtype=torch.int8)
    assert exact_int_mm(a, a.T).dtype == torch.float32
    assert torch.equal(exact_int_mm(a, a.T), torch._int_mm(a, a.T.contiguous()).float())
    wide = torch.full((32, 2 * EXACT_IN_FP32), -128, dtype=torch.int8)
    assert exact_int_mm(wide, wide.T).dtype == torch.float64


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 2 * EXACT_IN_FP32])
def test_the_scaled_product_is_torchao_s_bitwise_in_the_scales_format(k, scale_dtype):
    from divergence.models.optimizations import convert_int8

    convert_int8({})  # installs the exact product, keeping torchao's
    a, b = _int8((32, k), 2), _int8((k, 16), 3)
    row = torch.rand(32, generator=torch.Generator().manual_seed(4)).to(scale_dtype)
    col = torch.rand(16, generator=torch.Generator().manual_seed(5)).to(scale_dtype)
    mine, theirs = int8_matmul.scaled_int8_mm(a, b, row, col), int8_matmul._TORCHAO[0](a, b, row, col)
    assert mine.dtype == theirs.dtype == scale_dtype and torch.equal(mine, theirs)


def _layer_step(seed=0):
    """Output and gradients of torchao's Int8 mixed-precision linear on a fixed input."""
    from divergence.models.optimizations import convert_int8

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.Linear(32, 16))
    convert_int8({"net": net})
    x = torch.randn(4, 20, 48, requires_grad=True)
    out = net(x)
    out.square().sum().backward()
    return out.detach(), x.grad, [p.grad for p in net.parameters()]


def test_an_int8_mixed_layer_trains_bitwise_as_with_torchao_s_own_product(monkeypatch):
    mine = _layer_step()
    assert int8_matmul._TORCHAO, "convert_int8 installs the exact CPU product"
    from torchao.prototype.quantized_training import int8_mixed_precision as torchao_int8

    assert torchao_int8.scaled_int8_mm is int8_matmul.scaled_int8_mm
    monkeypatch.setattr(torchao_int8, "scaled_int8_mm", int8_matmul._TORCHAO[0])
    monkeypatch.setattr(int8_matmul, "use_exact_cpu_int8_mm", lambda: None)  # convert_int8 leaves it be
    theirs = _layer_step()
    assert torchao_int8.scaled_int8_mm is int8_matmul._TORCHAO[0]  # torchao's own ran
    assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
    assert all(torch.equal(p, q) for p, q in zip(mine[2], theirs[2]))
    assert not torch.equal(mine[0], _fp32_output())  # the layers did quantize


def _fp32_output():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.Linear(32, 16))
    return net(torch.randn(4, 20, 48)).detach()
