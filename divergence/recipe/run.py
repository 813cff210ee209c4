"""The recipe of one training run: model, attention, noise, data, training, samples, logging.

A run recipe is what one arm of a pair trains; a pair recipe (``divergence.recipe.pair``) is a
base run recipe plus the variants that make its two arms differ. ``load_run_recipe`` reads the
YAML, applies ``key=value`` overrides and validates everything before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal

from divergence.pairfolder.settings import LogConfig
from divergence.recipe.limits import check_strategy
from divergence.recipe.model import AttentionConfig, ModelConfig, NoiseConfig
from divergence.config.schema import apply_overrides, load_yaml, parse, require

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
# AdamW implementations (train.adamw_impl): default lets torch choose; divergence.training.optim maps each.
ADAMW_IMPLS = ("default", "loop", "foreach", "fused")
# ``diffusers.optimization.get_scheduler``'s names (SchedulerType) that need no extra rules
LR_SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial")
POLYNOMIAL_LR_END = 1e-7  # get_polynomial_decay_schedule_with_warmup's lr_end (get_scheduler passes none)
# The train keys that say what hardware a job runs on, not what it computes: the jobs of one pair may
# differ in them (``training.folder_check.PER_JOB_KEYS``), and a calibration's recipe identity leaves
# them out (``analysis.calibration``).
HARDWARE_KEYS = ("accelerator", "devices", "num_nodes", "strategy", "cpu_threads")

DEFAULT_PROMPTS = (
    "a large red circle in the centre",
    "a small blue square at the top left",
    "a large green triangle at the bottom right",
    "a small yellow circle at the left and a large purple square at the right",
)


@dataclass(frozen=True)
class DataConfig:
    """Where images and captions come from, and the seed of everything random about inputs."""

    # ``shapes``: the embedded procedurally generated dataset; ``imagefolder``: a folder with
    # metadata.jsonl (diffusers' convention); ``webdataset``: .tar shards.
    source: Literal["shapes", "imagefolder", "webdataset"] = "shapes"
    # The folder (imagefolder), or a folder of .tar shards / one .tar file (webdataset).
    path: str | None = None
    # Seed of data order, caption dropout, crops, noise and timesteps: inputs are a pure
    # function of (seed, global step), whatever the model seed, precision or attention.
    seed: int = 0
    # Side of the square training images, in pixels.
    resolution: int = 32
    # Examples in the shapes dataset.
    num_examples: int = 10000
    # Shapes per image of the shapes dataset, at most (2: one or two; 1: one, as the sample score reads).
    max_shapes: int = 2
    # Probability that a caption is replaced by the empty one (classifier-free guidance).
    caption_dropout: float = 0.1
    # Centre crop (true) or a seeded random crop (false) after resizing the short side.
    center_crop: bool = True
    # Seeded horizontal flips (off for shapes: captions name left and right).
    random_flip: bool = False
    # metadata.jsonl column / webdataset extension holding the caption.
    caption_column: str = "text"
    # DataLoader worker processes preparing batches ahead of the model (0: in the main process).
    workers: int = 0

    def __post_init__(self):
        require(
            self.source == "shapes" or self.path is not None,
            "path",
            f"source {self.source!r} needs a local path to the data",
        )
        require(self.resolution >= 8, "resolution", f"must be >= 8, got {self.resolution}")
        require(self.num_examples >= 1, "num_examples", "must be >= 1")
        require(self.max_shapes in (1, 2), "max_shapes", f"must be 1 or 2, got {self.max_shapes}")
        require(0.0 <= self.caption_dropout < 1.0, "caption_dropout", f"must be in [0, 1), got {self.caption_dropout}")
        require(self.workers >= 0, "workers", "must be >= 0")
        require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class EMAConfig:
    """An exponential moving average of the trainable weights, as ``diffusers.training_utils.EMAModel``.

    After every optimizer step ``s`` (counted from 1): ``ema <- ema - (1 - d_s) (ema - w)`` with
    ``n = max(0, s - update_after_step - 1)``, ``d_s = 0`` when ``n = 0``, else
    ``clip(1 - (1 + n / inv_gamma)^-power if use_warmup else (1 + n) / (10 + n), min_decay, decay)``.
    """

    # The largest decay (EMAModel's decay; diffusers' scripts: 0.9999).
    decay: float = 0.9999
    # The smallest decay once updating (EMAModel's min_decay).
    min_decay: float = 0.0
    # Optimizer steps before the average starts moving (it copies the weights until then).
    update_after_step: int = 0
    # Warm-up 1 - (1 + n / inv_gamma)^-power instead of (1 + n) / (10 + n) (EMAModel's use_ema_warmup).
    use_warmup: bool = False
    # Inverse multiplicative factor of the warm-up.
    inv_gamma: float = 1.0
    # Exponent of the warm-up (2/3 for runs of a million steps, 3/4 for shorter ones).
    power: float = 2 / 3
    # torch._foreach updates (diffusers' --foreach_ema): faster, the same math in another order.
    foreach: bool = False

    def __post_init__(self):
        require(
            0.0 <= self.min_decay <= self.decay <= 1.0,
            "decay",
            f"need 0 <= min_decay <= decay <= 1, got min_decay={self.min_decay}, decay={self.decay}",
        )
        require(self.update_after_step >= 0, "update_after_step", "must be >= 0")
        require(0 < self.inv_gamma < float("inf"), "inv_gamma", f"must be a finite number > 0, got {self.inv_gamma}")
        require(0 < self.power < float("inf"), "power", f"must be a finite number > 0, got {self.power}")


@dataclass(frozen=True)
class TrainConfig:
    """Optimization and the hardware it runs on."""

    # Examples per step on each rank.
    batch_size: int = 16
    # Optimizer steps of the run.
    max_steps: int = 500
    # Lightning precision name; the arm applies it (autocast + loss scaler for 16-mixed).
    precision: Literal["32-true", "16-mixed", "bf16-mixed"] = "32-true"
    # AdamW learning rate after warmup.
    lr: float = 1e-3
    # AdamW betas.
    betas: tuple[float, float] = (0.9, 0.999)
    # AdamW epsilon.
    eps: float = 1e-8
    # AdamW decoupled weight decay.
    weight_decay: float = 0.01
    # Micro-batches per optimizer step (gradient accumulation): the global batch is
    # batch_size x devices x num_nodes x accumulate, and what it holds depends on the step only.
    accumulate: int = 1
    # LR schedule, by ``diffusers.optimization.get_scheduler``'s names: constant (no warm-up),
    # constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial (to 1e-7).
    lr_schedule: Literal[LR_SCHEDULES] = "constant"
    # Steps of linear LR warm-up from zero (get_scheduler's num_warmup_steps).
    warmup_steps: int = 0
    # Hard restarts of cosine_with_restarts (get_scheduler's num_cycles, diffusers' --lr_num_cycles).
    lr_num_cycles: int = 1
    # Power of the polynomial decay (get_scheduler's power, diffusers' --lr_power).
    lr_power: float = 1.0
    # Exponential moving average of the trainable weights (diffusers' EMAModel); null: off.
    ema: EMAConfig | None = None
    # AdamW implementation: torch's default choice, the per-tensor ``loop``, the multi-tensor
    # ``foreach``, or the single-kernel ``fused`` (same math, different operation order).
    adamw_impl: Literal[ADAMW_IMPLS] = "default"
    # Max global gradient norm (after unscaling); null disables clipping.
    grad_clip: float | None = 1.0
    # Weights-only safetensors and a resumable .ckpt every N steps (0: only at the end).
    checkpoint_every: int = 100
    # Lightning accelerator: auto, cpu or gpu.
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    # Devices per node (Lightning ``devices``).
    devices: int = 1
    # Lightning strategy name (auto, ddp, fsdp, ...).
    strategy: str = "auto"
    # Nodes (Lightning ``num_nodes``).
    num_nodes: int = 1
    # torch intra-op CPU threads of the run (or of a lockstep pair's job). A CPU splits its
    # reductions by thread, so a run's numbers depend on it: fixed here, the same whatever the
    # machine or ``divergence study --jobs``, recorded in pair.json, and a resume may not change it.
    # 0: torch's default (one per core: the numbers then depend on the machine).
    cpu_threads: int = 1
    # Deterministic kernels (torch.use_deterministic_algorithms, cuDNN benchmark off, the cuBLAS
    # workspace CUBLAS_WORKSPACE_CONFIG=:4096:8), so a control pair is exactly zero on a GPU too;
    # false trades that for speed (see divergence.models.determinism).
    deterministic: bool = True
    # TensorFloat-32 tensor-core math for fp32 matmuls and convolutions on CUDA (10 mantissa bits
    # instead of 23); off unless set, e.g. by the tf32 variant. No effect on a CPU.
    tf32: bool = False
    # bf16/fp16 autocast on a CPU. ``emulate``: convolutions and linear layers run fp32 kernels on
    # 16-bit-rounded inputs and round their outputs to 16 bits, the arithmetic of a GPU's tensor
    # cores, 6x faster than PyTorch's CPU bf16 path on CPUs without AVX512-BF16, op for op the
    # same values up to one unit in the last place (divergence.training.emulated_autocast);
    # ``native``: PyTorch's CPU kernels. Attention kernels run natively either way. No effect in
    # fp32 or on a GPU; recorded in pair.json, and a resume may not change it.
    cpu_autocast: Literal["emulate", "native"] = "emulate"
    # Calibration: multiply every gradient elementwise by (1 + grad_noise * xi), xi ~ N(0, 1),
    # after unscaling and before clipping (the ``grad-noise`` variant; null: off). 0 is bitwise off.
    grad_noise: float | None = None
    # Linear layers trained in FP8 with torchao.float8 (``tensorwise`` or ``rowwise`` scaling;
    # emulated where no sm89+ GPU runs it), the ``fp8`` variant; null: off.
    fp8: str | None = None
    # Linear layers trained with torchao's INT8 mixed-precision matmuls (the ``int8-mixed`` variant).
    int8: bool = False
    # The denoiser compiled with torch.compile (inductor), the ``compile`` variant.
    compile: bool = False
    # Ranks each DiT block's attention and MLP linears are sharded over (Megatron-style tensor
    # parallelism, torch.distributed.tensor.parallel, Lightning's ModelParallelStrategy; the
    # ``tensor-parallel`` variant): 1 (off) or devices x num_nodes. The ranks of the group see the
    # same batch, so the global batch is batch_size x accumulate.
    tensor_parallel: int = 1
    # Ranks each MoE layer's experts are spread over (expert e on rank e // (experts / N)), tokens
    # sent to their experts' ranks with all-to-all (divergence.models.expert_parallel, Lightning's
    # ModelParallelStrategy; the ``expert-parallel`` variant): 1 (off) or devices x num_nodes. Each rank
    # takes its slice of the global batch, as under data parallelism.
    expert_parallel: int = 1
    # Linear layers trained with torchao's quantization-aware training (fake-quantized int8 weights
    # and activations in the forward, straight-through gradients; the ``int8-qat`` variant).
    qat: bool = False
    # AdamW's state sharded over the ranks with torch.distributed.optim.ZeroRedundancyOptimizer
    # (ZeRO stage 1, the ``zero-1`` variant; under train.strategy=ddp); null: off.
    shard_optimizer: bool | None = None
    # FSDP2 (torch.distributed.fsdp.fully_shard under Lightning's ModelParallelStrategy, gloo on a
    # CPU, NCCL on GPUs; the ``fsdp`` variant) with train.strategy=fsdp: FULL_SHARD (ZeRO-3: weights,
    # gradients and optimizer state sharded, weights gathered again for the backward) or
    # SHARD_GRAD_OP (ZeRO-2: weights kept gathered from forward to backward); null: train.strategy=fsdp
    # is Lightning's FSDPStrategy (FSDP1, GPUs only, as fsdp-offload uses it).
    fsdp_sharding: Literal["FULL_SHARD", "SHARD_GRAD_OP"] | None = None
    # A known bug injected into the DDP all-reduce, to prove the reordering yardstick finds it (the
    # ``injected-bug`` variant, tests and docs/atlas.md only): ``rank-scale`` (rank 1's gradient
    # times 1 + 1e-3 before the all-reduce) or ``unreduced-param`` (one parameter's gradient kept
    # local); null: off.
    inject_bug: Literal["rank-scale", "unreduced-param"] | None = None

    def __post_init__(self):
        require(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.max_steps >= 1, "max_steps", f"must be >= 1, got {self.max_steps}")
        # AdamW moves every weight by about lr a step: above 1 it overwrites the weights within a step.
        require(0 < self.lr <= 1, "lr", f"must be in (0, 1], got {self.lr}")
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            f"must be two numbers in [0, 1), got {list(self.betas)}",
        )
        require(self.eps > 0, "eps", "must be > 0")
        require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        require(self.accumulate >= 1, "accumulate", f"must be an integer >= 1, got {self.accumulate}")
        self._check_lr_schedule()
        require(self.grad_clip is None or self.grad_clip > 0, "grad_clip", "must be > 0 or null")
        require(self.checkpoint_every >= 0, "checkpoint_every", "must be >= 0")
        require(self.devices >= 1 and self.num_nodes >= 1, "devices", "devices and num_nodes must be >= 1")
        require(self.cpu_threads >= 0, "cpu_threads", "must be >= 0 (0: torch's default)")
        check_strategy(self.strategy)
        self._check_tensor_parallel()
        self._check_expert_parallel()
        require(
            self.fp8 in (None, "tensorwise", "rowwise"),
            "fp8",
            f"expected tensorwise, rowwise or null, got {self.fp8!r}",
        )
        require(
            self.grad_noise is None or 0 <= self.grad_noise < float("inf"),
            "grad_noise",
            f"must be a finite number >= 0 or null, got {self.grad_noise}",
        )
        distributed = self.strategy.lower().startswith("ddp")
        require(
            not self.shard_optimizer or distributed,
            "shard_optimizer",
            f"ZeroRedundancyOptimizer shards over DDP ranks; set train.strategy=ddp (got {self.strategy})",
        )
        require(
            self.inject_bug is None or distributed,
            "inject_bug",
            f"the bug is injected into DDP's all-reduce; set train.strategy=ddp (got {self.strategy})",
        )
        require(
            self.fsdp_sharding is None or self.strategy == "fsdp",
            "fsdp_sharding",
            f"shards with FSDP2 under train.strategy=fsdp; got train.strategy={self.strategy}: set it to fsdp",
        )
        require(
            self.ema is None or not self.strategy.lower().startswith(("fsdp", "deepspeed")),
            "ema",
            f"EMA of weights sharded by train.strategy={self.strategy} is not supported; use ddp or set ema: null",
        )

    def _check_tensor_parallel(self) -> None:
        world = self.devices * self.num_nodes
        require(
            self.tensor_parallel in (1, world),
            "tensor_parallel",
            f"must be 1 or devices x num_nodes ({world}): every rank in one tensor-parallel group (data "
            f"parallelism across groups is not built), got {self.tensor_parallel}",
        )
        require(
            self.tensor_parallel == 1 or self.strategy == "auto",
            "tensor_parallel",
            f"trains under Lightning's ModelParallelStrategy; train.strategy={self.strategy} is another: "
            "set train.strategy=auto",
        )

    def _check_expert_parallel(self) -> None:
        world = self.devices * self.num_nodes
        require(
            self.expert_parallel in (1, world),
            "expert_parallel",
            f"must be 1 or devices x num_nodes ({world}): the experts spread over every rank, got {self.expert_parallel}",
        )
        if self.expert_parallel == 1:
            return
        require(
            self.strategy == "auto" and self.tensor_parallel == 1,
            "expert_parallel",
            f"trains under Lightning's ModelParallelStrategy without tensor parallelism; train.strategy="
            f"{self.strategy}, tensor_parallel={self.tensor_parallel}: set train.strategy=auto, tensor_parallel: 1",
        )
        require(
            self.ema is None and self.shard_optimizer is None and self.inject_bug is None,
            "expert_parallel",
            "an EMA, ZeRO-1 and the injected DDP bugs are not built for experts sharded over ranks; set "
            "ema, shard_optimizer and inject_bug to null",
        )

    def _check_lr_schedule(self) -> None:
        require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        # diffusers' ``constant`` ignores num_warmup_steps: refuse rather than silently drop the warm-up
        require(
            self.lr_schedule != "constant" or self.warmup_steps == 0,
            "lr_schedule",
            f"constant ignores warmup_steps={self.warmup_steps} (as diffusers' get_scheduler does); use "
            "lr_schedule: constant_with_warmup, or warmup_steps: 0",
        )
        require(self.lr_num_cycles >= 1, "lr_num_cycles", f"must be >= 1, got {self.lr_num_cycles}")
        require(0 < self.lr_power < float("inf"), "lr_power", f"must be a finite number > 0, got {self.lr_power}")
        if self.lr_schedule == "polynomial":
            require(self.lr > POLYNOMIAL_LR_END, "lr", f"polynomial decays to {POLYNOMIAL_LR_END}; lr must be above it")
            require(
                self.warmup_steps < self.max_steps,
                "warmup_steps",
                f"polynomial needs warmup_steps < max_steps ({self.max_steps}), got {self.warmup_steps}",
            )


@dataclass(frozen=True)
class SampleConfig:
    """The fixed prompts whose images show the model learning."""

    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    # A grid every N steps (0: only at the end of training).
    every: int = 0
    # Images per prompt (one row each).
    per_prompt: int = 4
    # Denoising steps of the sampler.
    steps: int = 25
    # ``ddim`` (deterministic, few steps) or ``ddpm`` (ancestral).
    sampler: Literal["ddim", "ddpm"] = "ddim"
    # Classifier-free guidance scale; 1 disables guidance.
    guidance_scale: float = 3.0
    # Seed of the starting noise: the same images at every step and in every arm.
    seed: int = 0
    # Turn sampling off entirely.
    enabled: bool = True

    def __post_init__(self):
        require(len(self.prompts) >= 1, "prompts", "needs at least one prompt")
        require(self.every >= 0, "every", "must be >= 0")
        require(self.per_prompt >= 1, "per_prompt", "must be >= 1")
        require(self.steps >= 1, "steps", "must be >= 1")
        require(self.guidance_scale >= 1.0, "guidance_scale", "must be >= 1")


@dataclass(frozen=True)
class RunRecipe:
    """One training run: everything `divergence train` needs, validated."""

    # A name for the run (wandb run name, sample titles).
    name: str = "tiny"
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self):
        unet, vae = self.model.unet, self.model.vae
        down = 2 ** (len(vae.block_out_channels) - 1) if vae is not None else 1
        if self.model.denoiser == "transformer":
            levels, what = self.model.transformer.patch_size, "transformer patch_size"
        else:
            levels, what = 2 ** (len(unet.block_out_channels) - 1), "UNet downsampling"
        require(
            self.data.resolution % (down * levels) == 0,
            "data.resolution",
            f"{self.data.resolution} must be a multiple of {down * levels} (VAE downsampling {down} x {what} {levels})",
        )
        require(
            self.train.tensor_parallel == 1
            or (self.model.denoiser == "transformer" and self.model.transformer.kind == "pixart"),
            "train.tensor_parallel",
            "shards the PixArt DiT's attention and MLP linears (divergence.training.tensor_parallel); use "
            "model.denoiser=transformer with model.transformer.kind=pixart, or train.tensor_parallel=1",
        )
        moe = self.model.moe
        require(
            self.train.expert_parallel == 1 or (moe is not None and moe.experts % self.train.expert_parallel == 0),
            "train.expert_parallel",
            f"spreads model.moe's experts over {self.train.expert_parallel} ranks: "
            + (
                "the model has no experts; set model.moe (recipes/tiny-moe.yaml) or train.expert_parallel=1"
                if moe is None
                else f"{moe.experts} experts do not split evenly; choose model.moe.experts a multiple of it"
            ),
        )
        require(
            self.train.expert_parallel == 1 or not self.sample.enabled,
            "sample.enabled",
            "the sampler runs on rank zero only, and under train.expert_parallel every forward needs every "
            "rank's experts; add sample.enabled=false",
        )
        require(
            self.train.ema is None or self.model.lora is None,
            "train.ema",
            "an EMA of LoRA factors is not an EMA of the weight change B A; train LoRA with ema: null",
        )


def load_run_recipe(path: str | Path, overrides: Iterable[str] = ()) -> RunRecipe:
    """Read, override and validate a run recipe; every problem is a RecipeError naming its key."""
    return parse(RunRecipe, apply_overrides(load_yaml(path), overrides))


def latent_shape(recipe: RunRecipe) -> tuple[int, int, int]:
    """(C, H, W) of what the UNet denoises: RGB pixels, or VAE latents."""
    vae, side = recipe.model.vae, recipe.data.resolution
    if vae is None:
        return 3, side, side
    down = 2 ** (len(vae.block_out_channels) - 1)
    return vae.latent_channels, side // down, side // down
