"""KernelAttnProcessor inside tiny real diffusers models: with the sdpa kernel it is diffusers'
own AttnProcessor2_0, bit for bit; with other kernels it computes the same attention."""

import pytest
import torch
from diffusers import Transformer2DModel
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

from divergence.attention.kernels import get_kernel
from divergence.attention.processor import KernelAttnProcessor


def _set(model, make):
    modules = [m for m in model.modules() if isinstance(m, Attention)]
    assert modules
    for module in modules:
        module.set_processor(make())


@pytest.fixture(scope="module")
def transformer():
    torch.manual_seed(0)
    model = Transformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=16,
        num_layers=1,
        norm_num_groups=4,
        cross_attention_dim=12,
    ).eval()
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(2, 16, 4, 4, generator=g), torch.randn(2, 5, 12, generator=g)


def test_sdpa_kernel_equals_attn_processor_2_0(transformer):
    model, x, enc = transformer
    with torch.no_grad():
        _set(model, AttnProcessor2_0)
        expected = model(x, encoder_hidden_states=enc).sample
        _set(model, lambda: KernelAttnProcessor("sdpa"))
        got = model(x, encoder_hidden_states=enc).sample
    assert torch.equal(got, expected)


def test_other_kernels_match_closely(transformer):
    model, x, enc = transformer
    with torch.no_grad():
        _set(model, AttnProcessor2_0)
        expected = model(x, encoder_hidden_states=enc).sample
        _set(model, lambda: KernelAttnProcessor(get_kernel("tiled", block_q=4, block_kv=4)))
        got = model(x, encoder_hidden_states=enc).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_group_norm_residual_rescale_and_mask_paths():
    """A bare Attention module with the options AttnProcessor2_0 handles: 4-D input, group norm,
    residual connection, output rescaling and an attention mask."""
    torch.manual_seed(0)
    attn = Attention(
        query_dim=16, heads=2, dim_head=8, norm_num_groups=4, residual_connection=True, rescale_output_factor=2.0
    ).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 3, 3, generator=g)
    mask = torch.ones(2, 9)
    mask[:, -2:] = 0
    mask = (1 - mask) * -10000.0  # diffusers' additive convention
    with torch.no_grad():
        attn.set_processor(AttnProcessor2_0())
        expected = attn(x, attention_mask=mask)
        attn.set_processor(KernelAttnProcessor("sdpa"))
        assert torch.equal(attn(x, attention_mask=mask), expected)
        attn.set_processor(KernelAttnProcessor("baseline"))
        torch.testing.assert_close(attn(x, attention_mask=mask), expected, atol=1e-5, rtol=1e-5)
