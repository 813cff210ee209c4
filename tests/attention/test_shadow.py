"""ShadowAttnProcessor: the model sees the primary's output; the recorder sees the deviation."""

import torch
from diffusers.models.attention_processor import Attention

from divergence.attention.kernels import get_kernel
from divergence.attention.processor import KernelAttnProcessor
from divergence.attention.shadow import ShadowAttnProcessor, ShadowRecorder


def _attn():
    torch.manual_seed(0)
    return Attention(query_dim=16, heads=2, dim_head=8).eval()


def _x(seed=0):
    return torch.randn(2, 24, 16, generator=torch.Generator().manual_seed(seed))


def test_returns_the_primary_and_records_the_difference():
    attn, x = _attn(), _x()
    tiled = get_kernel("tiled", block_q=4, block_kv=4)
    with torch.no_grad():
        attn.set_processor(KernelAttnProcessor("baseline"))
        primary_out = attn(x)
        recorder = ShadowRecorder()
        attn.set_processor(ShadowAttnProcessor("baseline", tiled, recorder=recorder, layer_name="attn1"))
        assert torch.equal(attn(x), primary_out)

    # The same q, k, v the processor builds, to recompute the deviation independently.
    q = attn.to_q(x).view(2, -1, 2, 8).transpose(1, 2)
    k = attn.to_k(x).view(2, -1, 2, 8).transpose(1, 2)
    v = attn.to_v(x).view(2, -1, 2, 8).transpose(1, 2)
    diff = (get_kernel("baseline")(q, k, v) - tiled(q, k, v)).abs().double()
    stats = recorder.drain()
    assert set(stats) == {"attn1"} and stats["attn1"]["calls"] == 1
    assert stats["attn1"]["max_abs_diff"] == diff.max().item() > 0
    assert abs(stats["attn1"]["mean_abs_diff"] - diff.mean().item()) < 1e-12
    assert recorder.drain() == {}  # drained


def test_every_kth_call_and_mean_over_calls():
    attn, recorder = _attn(), ShadowRecorder()
    attn.set_processor(
        ShadowAttnProcessor(
            "sdpa-math", get_kernel("tiled", block_q=4, block_kv=4), every=2, recorder=recorder, layer_name="a"
        )
    )
    with torch.no_grad():
        for seed in range(5):  # calls 0, 2, 4 are compared
            attn(_x(seed))
    assert recorder.drain()["a"]["calls"] == 3


def test_identical_kernels_record_zero_and_gradients_flow_through_primary():
    attn, recorder = _attn(), ShadowRecorder()
    attn.set_processor(ShadowAttnProcessor("sdpa", "sdpa", recorder=recorder, layer_name="a"))
    x = _x().requires_grad_(True)
    attn(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert recorder.drain()["a"] == {"max_abs_diff": 0.0, "mean_abs_diff": 0.0, "calls": 1}
