"""Tiny real models from the field's libraries, built from config (no downloads)."""

import pytest
import torch


def tiny_unet(seed: int = 0):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=4,
        norm_num_groups=4,
    )


def tiny_clip(seed: int = 0):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return CLIPTextModel(config)


@pytest.fixture
def unet_pair():
    return tiny_unet(0), tiny_unet(1)
