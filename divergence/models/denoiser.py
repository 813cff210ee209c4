"""The denoiser a recipe names: a UNet, or a diffusion transformer behind the same call.

``build_denoiser`` returns either a ``UNet2DConditionModel`` (unchanged, so its checkpoint keys
stay ``unet.<name>``) or a :class:`TransformerDenoiser` holding a diffusers
``PixArtTransformer2DModel`` or ``SD3Transformer2DModel``; ``denoise`` calls either with the
text encoder's output. Conditioning, per backbone (shapes: B batch, L tokens, E text width):

- UNet: cross-attention to the caption's hidden states (B, L, E);
- PixArt: the same, through its ``caption_projection``, and ``added_cond_kwargs`` (resolution
  and aspect ratio, used only when the model was built with ``use_additional_conditions``);
- SD3: joint attention over the projected hidden states, plus the pooled caption embedding
  (B, E), the text encoder's pooled output, in its adaLN timestep embedding.

Where a pretrained transformer expects other widths than the text encoder gives (T5's 4096 for
PixArt, CLIP-L+G for SD3), a seeded linear projection ``context_proj`` / ``pooled_proj`` bridges
them; it is trained with the denoiser.
"""

from __future__ import annotations

import torch

from divergence.models.build import build_unet, check_fits, seeded
from divergence.models.moe import apply_moe
from divergence.models.pretrained import load_pretrained
from divergence.recipe.model import ModelConfig, TransformerConfig


def build_denoiser(
    model: ModelConfig, channels: int, side: int, text_width: int, seed: int, image_side: int | None = None
) -> torch.nn.Module:
    """The recipe's denoiser for ``channels``-channel inputs of side ``side``, seeded by ``seed``.

    ``image_side``: the training images' side in pixels (PixArt's resolution condition)."""
    if model.denoiser == "unet":
        return build_unet(model.unet, channels, side, text_width, seed)
    transformer = build_transformer(model.transformer, channels, side, text_width, seed)
    apply_moe(transformer, model.moe, seed)  # model.moe: experts in place of the MLPs
    return TransformerDenoiser(transformer, model.transformer.kind, text_width, image_side or side, seed)


def build_transformer(config: TransformerConfig, channels: int, side: int, text_width: int, seed: int):
    """A ``PixArtTransformer2DModel`` or ``SD3Transformer2DModel``: pretrained, or random from the recipe."""
    from diffusers import PixArtTransformer2DModel, SD3Transformer2DModel

    cls = PixArtTransformer2DModel if config.kind == "pixart" else SD3Transformer2DModel
    if config.path is not None:
        transformer = load_pretrained(
            cls,
            config,
            "model.transformer",
            f"a {cls.__name__} folder (config.json + diffusion_pytorch_model.safetensors)",
        )
        check_fits(transformer.config, channels, text_width, "model.transformer", "")
        return transformer
    width = config.attention_heads * config.head_dim
    common = dict(
        sample_size=side,
        patch_size=config.patch_size,
        in_channels=channels,
        out_channels=channels,
        num_layers=config.num_layers,
        num_attention_heads=config.attention_heads,
        attention_head_dim=config.head_dim,
    )
    with seeded(seed, "transformer"):
        if config.kind == "pixart":
            return PixArtTransformer2DModel(
                **common, cross_attention_dim=width, caption_channels=text_width, use_additional_conditions=False
            )
        return SD3Transformer2DModel(
            **common,
            joint_attention_dim=text_width,
            caption_projection_dim=width,
            pooled_projection_dim=text_width,
            pos_embed_max_size=side // config.patch_size,
        )


class TransformerDenoiser(torch.nn.Module):
    """A diffusers transformer called like the UNet: ``(x_t, t, text hidden states, pooled) -> eps``."""

    def __init__(self, transformer, kind: str, text_width: int, image_side: int, seed: int):
        super().__init__()
        self.transformer, self.kind, self.image_side = transformer, kind, image_side
        cfg = transformer.config
        context_width = cfg.caption_channels if kind == "pixart" else cfg.joint_attention_dim
        with seeded(seed, "transformer_projections"):
            self.context_proj = torch.nn.Linear(text_width, context_width) if context_width != text_width else None
            pooled = cfg.pooled_projection_dim if kind == "sd3" else text_width
            self.pooled_proj = torch.nn.Linear(text_width, pooled) if pooled != text_width else None

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.transformer.is_gradient_checkpointing

    def enable_gradient_checkpointing(self) -> None:
        self.transformer.enable_gradient_checkpointing()

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        pooled: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, C, h, w) noisy input, () or (B,) timesteps, (B, L, E) caption, (B, E) pooled -> (B, C, h, w)."""
        batch = sample.shape[0]
        timestep = torch.as_tensor(timestep, device=sample.device).reshape(-1).expand(batch)
        context = self.context_proj(encoder_hidden_states) if self.context_proj is not None else encoder_hidden_states
        if self.kind == "sd3":
            if pooled is None:
                raise ValueError("the SD3 transformer needs the pooled caption embedding (the text encoder's [1])")
            pooled = self.pooled_proj(pooled) if self.pooled_proj is not None else pooled
            return self.transformer(
                sample, encoder_hidden_states=context, pooled_projections=pooled, timestep=timestep
            ).sample
        return self.transformer(
            sample,
            encoder_hidden_states=context,
            timestep=timestep,
            added_cond_kwargs=self._added_conditions(batch, sample),
        ).sample

    def _added_conditions(self, batch: int, sample: torch.Tensor) -> dict:
        """PixArt-alpha's micro-conditions: (B, 2) resolution in pixels and (B, 1) aspect ratio, as
        its pipeline passes them; ``None`` when the model does not use them."""
        if not self.transformer.config.use_additional_conditions:
            return {"resolution": None, "aspect_ratio": None}
        side = float(self.image_side)
        resolution = torch.tensor([[side, side]], device=sample.device).expand(batch, 2)
        aspect = torch.ones(batch, 1, device=sample.device)
        return {"resolution": resolution.to(sample.dtype), "aspect_ratio": aspect.to(sample.dtype)}


def denoise(denoiser: torch.nn.Module, sample: torch.Tensor, timestep: torch.Tensor, text) -> torch.Tensor:
    """The denoiser's prediction for ``sample`` at ``timestep``; ``text`` is the text encoder's
    output (``text[0]``: (B, L, E) hidden states, ``text[1]``: (B, E) pooled)."""
    if isinstance(denoiser, TransformerDenoiser):
        return denoiser(sample, timestep, text[0], text[1])
    return denoiser(sample, timestep, encoder_hidden_states=text[0]).sample
