"""Recipe sections that choose the model: denoiser, text conditioning, latent codec, noise, attention.

Block-type names are diffusers' own registered names (not class paths); everything else is numbers.
Cross-section checks (a UNet that fits the data resolution) live in ``divergence.recipe.run``.

Every model part (UNet, transformer, text encoder, VAE) can start from pretrained weights:
``path`` is a local folder written by ``save_pretrained`` or a Hugging Face hub id
(``org/name``), with ``revision``, ``subfolder`` and ``variant`` as ``from_pretrained`` takes
them (see ``divergence.models.pretrained``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from divergence.config.schema import require

DOWN_BLOCKS = ("CrossAttnDownBlock2D", "DownBlock2D")
UP_BLOCKS = ("CrossAttnUpBlock2D", "UpBlock2D")


@dataclass(frozen=True)
class Pretrained:
    """Where a part's pretrained weights come from; ``path: null`` builds it from the recipe's numbers."""

    # A local folder written by ``save_pretrained``, or a hub id such as ``org/name``; a hub id
    # downloads unless HF_HUB_OFFLINE=1 (then only the local hub cache is read).
    path: str | None = None
    # Hub revision (branch, tag or commit); null: the default branch.
    revision: str | None = None
    # Folder inside ``path`` holding this part, e.g. ``unet`` or ``transformer`` of a pipeline.
    subfolder: str | None = None
    # Weight-file variant, e.g. ``fp16`` (``diffusion_pytorch_model.fp16.safetensors``).
    variant: str | None = None

    def __post_init__(self):
        for key in ("path", "revision", "subfolder", "variant"):
            value = getattr(self, key)
            require(
                value is None or (isinstance(value, str) and value.strip() != ""),
                key,
                f"must be a non-empty string or null, got {value!r}",
            )
        require(
            self.path is not None or (self.revision, self.subfolder, self.variant) == (None, None, None),
            "path",
            "is null, so revision, subfolder and variant have nothing to apply to; set path",
        )


@dataclass(frozen=True)
class UNetConfig(Pretrained):
    """The denoiser, a diffusers ``UNet2DConditionModel``; channels in and out follow the codec.

    With ``path`` set, the architecture numbers below are ignored: the folder's config wins."""

    # Channels of each resolution level, from the input resolution down.
    block_out_channels: tuple[int, ...] = (32, 48, 64)
    # Resnet (and transformer) layers per level.
    layers_per_block: int = 1
    # diffusers block names per level, input side; cross-attention blocks read the caption.
    down_block_types: tuple[str, ...] = ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    # diffusers block names per level, output side (deepest level first).
    up_block_types: tuple[str, ...] = ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
    # A cross-attention block at the lowest resolution between the two halves.
    mid_block: bool = True
    # Attention heads of every transformer block (what diffusers' UNet2DConditionModel calls
    # ``attention_head_dim``, for historical reasons); must divide every level's channels.
    attention_heads: int = 4
    # Groups of the GroupNorm layers; must divide every entry of block_out_channels.
    norm_num_groups: int = 8

    def __post_init__(self):
        super().__post_init__()
        levels = len(self.block_out_channels)
        require(levels >= 1, "block_out_channels", "needs at least one level")
        require(all(c > 0 for c in self.block_out_channels), "block_out_channels", "must be positive")
        require(self.layers_per_block >= 1, "layers_per_block", f"must be >= 1, got {self.layers_per_block}")
        for key, names, allowed in (
            ("down_block_types", self.down_block_types, DOWN_BLOCKS),
            ("up_block_types", self.up_block_types, UP_BLOCKS),
        ):
            require(len(names) == levels, key, f"has {len(names)} entries; block_out_channels has {levels}")
            for name in names:
                require(name in allowed, key, f"{name!r} is not one of {', '.join(allowed)}")
        require(self.attention_heads >= 1, "attention_heads", "must be >= 1")
        require(self.norm_num_groups >= 1, "norm_num_groups", "must be >= 1")
        for c in self.block_out_channels:
            require(
                c % self.norm_num_groups == 0,
                "norm_num_groups",
                f"{self.norm_num_groups} does not divide block_out_channels entry {c}",
            )
            require(
                c % self.attention_heads == 0,
                "attention_heads",
                f"{self.attention_heads} does not divide block_out_channels entry {c}",
            )


@dataclass(frozen=True)
class TokenizerConfig:
    """How captions become token ids."""

    # ``bytes``: UTF-8 bytes plus begin/end/pad ids, built in code (no download);
    # ``words``: one id per word of the shapes dataset's captions, built in code (no download);
    # ``clip``: a ``CLIPTokenizer`` read from the local folder ``path``.
    kind: Literal["bytes", "words", "clip"] = "bytes"
    # Local tokenizer folder (vocab.json, merges.txt, ...); required for ``clip``.
    path: str | None = None
    # Tokens per caption, begin and end included; longer captions are truncated.
    max_length: int = 96

    def __post_init__(self):
        require(self.max_length >= 3, "max_length", f"must be >= 3, got {self.max_length}")
        require(
            self.kind != "clip" or self.path is not None,
            "path",
            "kind 'clip' needs a local tokenizer folder, e.g. path: pretrained/sd15/tokenizer",
        )


@dataclass(frozen=True)
class TransformerConfig(Pretrained):
    """A diffusion transformer denoiser (``model.denoiser: transformer``) on patches of the image.

    ``pixart``: diffusers ``PixArtTransformer2DModel`` (self-attention, cross-attention to the
    caption, adaLN-single timestep conditioning); ``sd3``: ``SD3Transformer2DModel`` (MMDiT joint
    attention over caption + image tokens, conditioned on the pooled caption embedding).
    With ``path`` set, the numbers below are ignored: the folder's config wins."""

    kind: Literal["pixart", "sd3"] = "pixart"
    # Transformer blocks.
    num_layers: int = 2
    # Attention heads per block.
    attention_heads: int = 4
    # Width of each head; the model width is attention_heads x head_dim.
    head_dim: int = 16
    # Side of the square patches the image is cut into (tokens = (side / patch_size)^2).
    patch_size: int = 2

    def __post_init__(self):
        super().__post_init__()
        for key in ("num_layers", "attention_heads", "head_dim", "patch_size"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts in place of each transformer block's MLP (``model.moe``; see
    ``divergence.models.moe``): a linear router scores ``experts`` MLPs per token, the ``top_k``
    best compute it, weighted by their renormalised router probabilities; each expert takes at
    most ``capacity = ceil(capacity_factor * tokens * top_k / experts)`` (token, slot) choices
    of a forward pass, the rest are dropped (the token passes through the residual only)."""

    # Expert MLPs per block.
    experts: int = 4
    # Experts each token is sent to.
    top_k: int = 2
    # Slots per expert relative to an even split of the tokens' choices; null: no limit.
    capacity_factor: float | None = 1.25
    # Weight of the load-balancing loss (Switch Transformer, eq. 4) added to the training loss.
    balance_loss: float = 0.01
    # Hidden width of each expert; null: the dense MLP's width (4 x model width) / top_k, so a
    # token costs what it costs in the dense DiT.
    expert_width: int | None = None
    # ``fp32``: router logits and softmax in fp32 whatever the autocast (as MoE practice keeps them);
    # ``autocast``: in the arm's autocast dtype (the ``router-bf16`` variant).
    router_precision: Literal["fp32", "autocast"] = "fp32"
    # ``grouped``: all experts in one batched matmul over a (experts, capacity, width) buffer;
    # ``loop``: one matmul per expert over its tokens (the same math, other orders of sums).
    expert_compute: Literal["grouped", "loop"] = "grouped"

    def __post_init__(self):
        require(self.experts >= 1, "experts", f"must be >= 1, got {self.experts}")
        require(
            1 <= self.top_k <= self.experts,
            "top_k",
            f"must be between 1 and experts ({self.experts}), got {self.top_k}",
        )
        require(
            self.capacity_factor is None or self.capacity_factor > 0,
            "capacity_factor",
            f"must be > 0 or null (no limit), got {self.capacity_factor}",
        )
        require(self.balance_loss >= 0, "balance_loss", f"must be >= 0, got {self.balance_loss}")
        require(
            self.expert_width is None or self.expert_width >= 1,
            "expert_width",
            f"must be >= 1 or null, got {self.expert_width}",
        )


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (peft) on the denoiser's attention projections; everything else is frozen.

    A LoRA layer computes ``W x + (alpha / rank) B A x``; what is tracked and compared is the
    effective change ``delta_W = (alpha / rank) B A`` per layer (Hu et al., 2021, eq. 3), never the
    factors, which are not unique: ``(B R)(R^-1 A) = B A`` for any invertible ``R``."""

    # Rank r of each adapter (A: r x in, B: out x r).
    rank: int = 4
    # Scale numerator: delta_W = (alpha / rank) B A.
    alpha: float = 4.0
    # Module names (last path component) that get an adapter: diffusers' attention projections.
    targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")

    def __post_init__(self):
        require(self.rank >= 1, "rank", f"must be >= 1, got {self.rank}")
        require(self.alpha > 0, "alpha", f"must be > 0, got {self.alpha}")
        require(
            len(self.targets) >= 1 and all(isinstance(t, str) and t.strip() for t in self.targets),
            "targets",
            f"must list module names such as to_q, got {list(self.targets)}",
        )


@dataclass(frozen=True)
class TextEncoderConfig(Pretrained):
    """The caption encoder, a transformers ``CLIPTextModel``. With ``path`` set (a pretrained
    CLIPTextModel folder or hub id) the numbers below are ignored; null builds one from them with
    random weights (seeded by model.seed)."""

    # Width of the token embeddings, which the UNet cross-attends to.
    hidden_size: int = 64
    # Transformer layers.
    num_layers: int = 2
    # Attention heads; must divide hidden_size.
    num_heads: int = 4
    # Width of the feed-forward layers.
    intermediate_size: int = 128
    # Train the text encoder with the UNet (true) or keep it frozen (false).
    train: bool = True

    def __post_init__(self):
        super().__post_init__()
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        require(
            self.hidden_size % self.num_heads == 0,
            "num_heads",
            f"{self.num_heads} does not divide hidden_size {self.hidden_size}",
        )


@dataclass(frozen=True)
class VAEConfig(Pretrained):
    """A frozen diffusers ``AutoencoderKL``: the model then trains in its latent space. With
    ``path`` set (a pretrained AutoencoderKL folder or hub id) the numbers below are ignored; null
    builds one from them with random weights (for smoke tests and timing only)."""

    # Channels of each encoder level when built from numbers; downsampling is 2**(levels-1).
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    # Channels of the latent image (the UNet's input and output).
    latent_channels: int = 4
    # Latents are multiplied by this before training (Stable Diffusion 1.x: 0.18215).
    scaling_factor: float = 0.18215

    def __post_init__(self):
        super().__post_init__()
        require(len(self.block_out_channels) >= 1, "block_out_channels", "needs at least one level")
        require(self.latent_channels >= 1, "latent_channels", "must be >= 1")
        require(self.scaling_factor > 0, "scaling_factor", "must be > 0")


@dataclass(frozen=True)
class ModelConfig:
    """The model an arm trains: a denoiser (UNet or transformer) + text encoder, optionally in a
    VAE's latent space, optionally through LoRA adapters."""

    # Seed of the weight initialization, independent of data.seed: two runs that differ only
    # here start from different weights and see the same data.
    seed: int = 0
    # The denoiser: ``unet`` (model.unet) or ``transformer`` (model.transformer).
    denoiser: Literal["unet", "transformer"] = "unet"
    unet: UNetConfig = field(default_factory=UNetConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)
    # null: train every denoiser weight; a mapping: train LoRA adapters only (see LoraConfig).
    lora: LoraConfig | None = None
    # null: dense MLPs; a mapping: each transformer block's MLP is a mixture of experts (MoEConfig).
    moe: MoEConfig | None = None
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    text_encoder: TextEncoderConfig = field(default_factory=TextEncoderConfig)
    # null: pixel space (the UNet sees RGB in [-1, 1]).
    vae: VAEConfig | None = None
    # Recompute the denoiser's activations in the backward pass instead of storing them.
    gradient_checkpointing: bool = False

    def __post_init__(self):
        require(
            self.moe is None or self.denoiser == "transformer",
            "moe",
            "replaces a transformer's MLPs; set model.denoiser: transformer (or model.moe: null)",
        )


@dataclass(frozen=True)
class NoiseConfig:
    """The DDPM forward process and what the UNet predicts."""

    # Diffusion steps of the training process.
    num_train_timesteps: int = 1000
    # diffusers beta schedule name.
    beta_schedule: Literal["linear", "scaled_linear", "squaredcos_cap_v2"] = "scaled_linear"
    beta_start: float = 0.00085
    beta_end: float = 0.012
    # ``epsilon``: predict the noise; ``v_prediction``: predict v = alpha * noise - sigma * x0.
    prediction_type: Literal["epsilon", "v_prediction"] = "epsilon"

    def __post_init__(self):
        require(self.num_train_timesteps >= 2, "num_train_timesteps", "must be >= 2")
        require(
            0 < self.beta_start < self.beta_end < 1,
            "beta_start",
            f"need 0 < beta_start < beta_end < 1, got {self.beta_start} and {self.beta_end}",
        )


@dataclass(frozen=True)
class AttentionConfig:
    """The attention implementation every attention module of the UNet uses."""

    # A kernel registered in divergence.attention: baseline, sdpa, sdpa-flash, sdpa-math,
    # sdpa-efficient, sdpa-cudnn, flash-attn, tiled; or ``shadow`` (two kernels at once).
    name: str = "sdpa"
    # Keyword options of the kernel (tiled: block_q, block_kv, accumulate, block_order;
    # shadow: primary, secondary, every).
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        require(bool(self.name.strip()), "name", "is empty; name an attention kernel such as sdpa")
