"""Build the networks a recipe names: UNet, text encoder, VAE and the DDPM noise scheduler.

Random weights come from ``model.seed`` alone: each network is built on the CPU inside
``torch.random.fork_rng`` with its own derived seed, so initialization neither reads nor
disturbs the global RNG, and a GPU run starts from the same weights as a CPU run.
Pretrained parts load from a local folder or a hub id (``divergence.models.pretrained``); a
missing folder is a ``UserInputError`` that says what to put where. The transformer denoisers
are built in ``divergence.models.denoiser``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from divergence.recipe.seeds import derive_seed
from divergence.errors import UserInputError
from divergence.models.pretrained import is_hub_id, load_pretrained
from divergence.recipe.model import ModelConfig, NoiseConfig, TextEncoderConfig, UNetConfig, VAEConfig


@contextlib.contextmanager
def seeded(seed: int, part: str):
    """Run a block with the global CPU RNG seeded from ``(seed, part)``, restoring it afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, part))
        yield


def build_unet(config: UNetConfig, channels: int, sample_size: int, cross_attention_dim: int, seed: int):
    """A ``UNet2DConditionModel`` denoising ``channels``-channel images of side ``sample_size``."""
    from diffusers import UNet2DConditionModel

    if config.path is not None:
        unet = load_pretrained(
            UNet2DConditionModel,
            config,
            "model.unet",
            "a UNet2DConditionModel folder (config.json + diffusion_pytorch_model.safetensors)",
        )
        check_fits(unet.config, channels, cross_attention_dim, "model.unet", "cross_attention_dim")
        return unet
    with seeded(seed, "unet"):
        return UNet2DConditionModel(
            sample_size=sample_size,
            in_channels=channels,
            out_channels=channels,
            down_block_types=config.down_block_types,
            up_block_types=config.up_block_types,
            mid_block_type="UNetMidBlock2DCrossAttn" if config.mid_block else None,
            block_out_channels=config.block_out_channels,
            layers_per_block=config.layers_per_block,
            attention_head_dim=config.attention_heads,  # diffusers' name for the head count
            norm_num_groups=config.norm_num_groups,
            cross_attention_dim=cross_attention_dim,
        )


def build_text_encoder(config: TextEncoderConfig, tokenizer, seed: int):
    """A ``CLIPTextModel``: from ``config.path`` when given, else random with the recipe's sizes."""
    from transformers import CLIPTextConfig, CLIPTextModel

    if config.path is not None:
        model = load_pretrained(
            CLIPTextModel,
            config,
            "model.text_encoder",
            "a CLIPTextModel folder (config.json + model.safetensors), e.g. the "
            "'text_encoder' folder of Stable Diffusion 1.5",
        )
    else:
        te_config = CLIPTextConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            max_position_embeddings=tokenizer.max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            projection_dim=config.hidden_size,
        )
        with seeded(seed, "text_encoder"):
            model = CLIPTextModel(te_config)
    # One fixed attention implementation for the text encoder in every arm: the variant under
    # study applies to the denoiser (see divergence.models.attention).
    model.set_attn_implementation("eager")
    if model.config.max_position_embeddings < tokenizer.max_length:
        raise UserInputError(
            f"model.tokenizer.max_length {tokenizer.max_length} exceeds the text encoder's "
            f"{model.config.max_position_embeddings} positions; lower model.tokenizer.max_length"
        )
    model.requires_grad_(config.train)
    return model


def build_vae(config: VAEConfig, seed: int):
    """A frozen ``AutoencoderKL``: from ``config.path`` when given, else random (for timing only)."""
    from diffusers import AutoencoderKL

    if config.path is not None:
        vae = load_pretrained(
            AutoencoderKL,
            config,
            "model.vae",
            "an AutoencoderKL folder (config.json + diffusion_pytorch_model.safetensors), "
            "e.g. the 'vae' folder of Stable Diffusion 1.5",
        )
    else:
        levels = len(config.block_out_channels)
        with seeded(seed, "vae"):
            vae = AutoencoderKL(
                down_block_types=("DownEncoderBlock2D",) * levels,
                up_block_types=("UpDecoderBlock2D",) * levels,
                block_out_channels=config.block_out_channels,
                latent_channels=config.latent_channels,
                layers_per_block=2,
                norm_num_groups=min(32, min(config.block_out_channels)),
            )
    vae.requires_grad_(False).eval()
    return vae


def build_noise_scheduler(config: NoiseConfig):
    """The DDPM forward process of training (diffusers ``DDPMScheduler``)."""
    from diffusers import DDPMScheduler

    return DDPMScheduler(
        num_train_timesteps=config.num_train_timesteps,
        beta_schedule=config.beta_schedule,
        beta_start=config.beta_start,
        beta_end=config.beta_end,
        prediction_type=config.prediction_type,
        clip_sample=False,
    )


def check_local_paths(model: ModelConfig, data_source: str, data_path: str | None) -> None:
    """One error listing every local folder the recipe names but the disk lacks, before any work.

    Hub ids (``org/name``) are not local folders: ``divergence.models.pretrained`` loads them."""
    denoiser = model.unet if model.denoiser == "unet" else model.transformer
    parts = [  # model parts may name a hub id instead of a folder
        (f"model.{model.denoiser}.path", denoiser.path, f"a {model.denoiser} folder (config.json + weights)"),
        ("model.text_encoder.path", model.text_encoder.path, "a CLIPTextModel folder (config.json + weights)"),
        (
            "model.vae.path",
            model.vae.path if model.vae is not None else None,
            "an AutoencoderKL folder (config.json + weights)",
        ),
    ]
    wanted = [
        (
            "model.tokenizer.path",
            model.tokenizer.path if model.tokenizer.kind == "clip" else None,
            "a CLIP tokenizer folder (vocab.json, merges.txt, ...)",
        ),
        *[(key, path, what) for key, path, what in parts if path is None or not is_hub_id(path)],
        ("data.path", data_path if data_source != "shapes" else None, f"the {data_source} data"),
    ]
    missing = [
        f"{key} {path!r} should hold {what}"
        for key, path, what in wanted
        if path is not None and not Path(path).expanduser().exists()
    ]
    if missing:
        raise UserInputError(
            f"local files missing: {'; '.join(missing)}. Put them there or override those keys, e.g. data.path=..."
        )


def check_fits(config, channels: int, context_dim: int, key: str, context_key: str) -> None:
    """A pretrained denoiser must take the codec's channels (and, for a UNet, the text width)."""
    if config.in_channels != channels:
        raise UserInputError(
            f"{key}.path: the pretrained model takes {config.in_channels} input channels but the "
            f"codec gives {channels}; set model.vae to match (pixel space is 3 channels)"
        )
    got = getattr(config, context_key, None) if context_key else None
    if got is not None and got != context_dim:
        raise UserInputError(
            f"{key}.path: the pretrained UNet cross-attends to width {got} but the text encoder "
            f"gives {context_dim}; use a matching model.text_encoder"
        )
