"""The optimizations the atlas measures, by the name ``--only`` takes, and the backbones.

Each is a shipped pair recipe (``recipes/pairs/``) studied on the backbone's base with the
study's references; ``devices`` says where it runs (a row on another device says so instead of a
number); ``needs`` marks one the lockstep pair cannot measure, with what it would need;
``backbones`` the backbones it is a row of (the MoE rows only on ``moe``; the optimizations that
change attention, precision or the order of sums on every backbone).
A row whose arms differ in world size or strategy trains each arm as its own multi-process job
(``training.separate_pair``).
"""

from __future__ import annotations

from dataclasses import dataclass

from divergence.errors import UserInputError

BACKBONES = {"unet": "tiny.yaml", "dit": "tiny-dit.yaml", "moe": "tiny-moe.yaml"}  # base run recipe of each (recipes/)
DENSE = ("unet", "dit")
EVERY = tuple(BACKBONES)
# ``--backbone``: one of BACKBONES, or ALL; without it the dense backbones (the CPU atlas),
# the MoE atlas being its own run (``--backbone moe``)
DEFAULT_BACKBONES = DENSE
ALL = "all"
# Study overrides a backbone sets before the command line's (which may set them back). On the MoE
# backbone 4x4 accumulation is no reordering: the capacity limit and the balance loss are per
# forward pass (divergence/models/moe.py), so micro-batches of 4 drop other tokens than a batch of 16.
# Its yardstick is fused vs loop AdamW in fp32 (recipes/pairs/reordering-adamw.yaml): the optimizer
# touches no route, so every forward is the base's and only the update's fp32 operations are reordered.
BACKBONE_STUDY = {"moe": ("references.reordering=pairs/reordering-adamw.yaml",)}
# Pair-recipe overrides every pair of a backbone's study gets (written into its recipe), before the
# command line's. The MoE study tracks every step: a 30-step study tracks every step to 20, then
# every 5th, and on the MoE the fp32 reorderings (expert-grouped) settle late (step 18 or so:
# E starts near 4e-9 and grows faster than bf16's at first), so their window held 4-5 tracked
# steps, under the 5 it needs, in 2 of 3 replicates (docs/measurements.md, "The MoE atlas").
# Tracking a step costs one weight comparison (the probe stays at its own cadence).
BACKBONE_PAIRS = {"moe": ("tracking.every=1",)}


@dataclass(frozen=True)
class Optimization:
    name: str
    pair: str | None  # pair recipe under recipes/, or None when the atlas cannot train it
    what: str  # one line: a vs b
    devices: tuple[str, ...] = ()  # device types it runs on; (): any
    needs: str = ""  # why it is not measured here, when pair is None
    backbones: tuple[str, ...] = DENSE  # the backbones it is measured on
    alias_of: str = ""  # an earlier name of that row: ``--only`` takes it, the whole atlas trains the row once

    def applies(self, backbone: str) -> bool:
        """Whether the row is listed on ``backbone``: measured there, or a dense-only row on the other
        dense backbone (the tensor-parallel row says "dit only" on the UNet's table)."""
        dense_row = set(self.backbones) <= set(DENSE)
        return backbone in self.backbones or (dense_row and backbone in DENSE)

    def unavailable(self, device: str, backbone: str | None = None) -> str | None:
        """Why this row has no measurement on ``device`` ("GPU only: ...") and ``backbone``, or None."""
        if self.pair is None:
            return self.needs
        if backbone is not None and backbone not in self.backbones:
            return f"{' and '.join(self.backbones)} only: {self.what}"
        if self.devices and device not in self.devices:
            where = "GPU only" if self.devices == ("cuda",) else "CPU only"
            return f"{where}: {self.what} runs on {' or '.join(self.devices)}"
        return None


OPTIMIZATIONS = {
    o.name: o
    for o in (
        Optimization(
            "fp8-tensorwise",
            "pairs/fp8-tensorwise.yaml",
            "FP8 linear layers, tensorwise scaling, vs bf16",
            backbones=EVERY,
        ),
        Optimization(
            "fp8-rowwise", "pairs/fp8-rowwise.yaml", "FP8 linear layers, rowwise scaling, vs bf16", backbones=EVERY
        ),
        Optimization("int8-mixed", "pairs/int8-mixed.yaml", "INT8 mixed-precision linear layers vs fp32"),
        Optimization("compile", "pairs/compile.yaml", "torch.compile (inductor) vs eager", backbones=EVERY),
        Optimization(
            "grad-accumulation",
            "pairs/grad-accumulation.yaml",
            "4 micro-batches of 4 vs one batch of 16",
            backbones=EVERY,
        ),
        Optimization(
            "cpu-threads", "pairs/cpu-threads.yaml", "2 vs 1 intra-op CPU threads", devices=("cpu",), backbones=EVERY
        ),
        Optimization(
            "flash",
            "pairs/flash-vs-baseline.yaml",
            "flash attention (sdpa-flash) vs baseline attention",
            backbones=EVERY,
        ),
        Optimization(
            "flash-unbiased",
            "pairs/flash-unbiased.yaml",
            "flash attention with Qiu and Yao's row-maximum change vs baseline attention",
        ),
        Optimization(
            "gradient-checkpointing",
            "pairs/gradient-checkpointing.yaml",
            "gradient checkpointing vs stored activations",
        ),
        Optimization("fused-adamw", "pairs/fused-adamw.yaml", "fused AdamW vs per-tensor loop AdamW"),
        Optimization("tf32", "pairs/tf32-vs-fp32.yaml", "TF32 matmuls vs fp32", devices=("cuda",)),
        Optimization(
            "sdpa-efficient",
            "pairs/sdpa-efficient.yaml",
            "memory-efficient SDPA vs baseline attention",
            devices=("cuda",),
        ),
        Optimization("data-parallel", "pairs/data-parallel.yaml", "DDP on 2 ranks of 8 vs 1 process of 16"),
        Optimization("zero-1", "pairs/zero-1.yaml", "ZeroRedundancyOptimizer (ZeRO-1) vs DDP, 2 ranks"),
        Optimization(
            "int8-qat",
            "pairs/int8-qat.yaml",
            "INT8 quantization-aware training (torchao fake-quantized linears) vs fp32",
        ),
        Optimization(
            "tensor-parallel",
            "pairs/tensor-parallel.yaml",
            "the DiT's attention and MLP linears sharded over 2 ranks (tensor parallel) vs 1 rank",
            backbones=("dit",),
        ),
        Optimization(
            "pipeline",
            None,
            "2 pipeline stages with micro-batches vs 1 rank",
            needs="not measured: torch.distributed.pipelining runs on CPU gloo here (a 2-stage GPipe toy trains), "
            "but the DiT's split into stages (caption and timestep embeddings crossing the cut) is not built yet",
        ),
        Optimization(
            "fsdp-offload",
            "pairs/fsdp-offload.yaml",
            "FSDP with parameters and optimizer state offloaded to host memory vs plain FSDP, 2 ranks",
            devices=("cuda",),
        ),
        Optimization(
            "deepspeed-zero",
            None,
            "DeepSpeed ZeRO stages vs DDP",
            needs="not measured: deepspeed is not a dependency (the torch rows zero-1, fsdp-grad-op and fsdp-full "
            "stand for ZeRO 1-3); DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8 runs ZeRO-2 "
            "on 2 gloo CPU ranks (DS_ACCELERATOR=cpu)",
        ),
        Optimization(
            "fsdp-grad-op",
            "pairs/fsdp-grad-op.yaml",
            "FSDP2 SHARD_GRAD_OP (ZeRO-2) vs DDP, 2 ranks",
        ),
        Optimization(
            "fsdp-full",
            "pairs/fsdp-full.yaml",
            "FSDP2 FULL_SHARD (ZeRO-3) vs DDP, 2 ranks",
        ),
        Optimization(
            "router-bf16",
            "pairs/router-bf16.yaml",
            "MoE router logits and softmax in bf16 vs fp32 (both arms bf16 autocast)",
            backbones=("moe",),
        ),
        Optimization(
            "expert-grouped",
            "pairs/expert-grouped.yaml",
            "MoE experts in one batched matmul vs a loop over experts",
            backbones=("moe",),
        ),
        Optimization(
            "expert-parallel",
            "pairs/expert-parallel.yaml",
            "MoE experts over 2 ranks of 8 with all-to-all dispatch vs all on one process of 16",
            backbones=("moe",),
        ),
        # the name earlier atlases gave the FSDP row: the same pair as fsdp-full (docs/atlas.md)
        Optimization("fsdp", "pairs/fsdp-full.yaml", "fsdp-full under its earlier name", alias_of="fsdp-full"),
    )
}


def select(only: list[str] | None) -> list[Optimization]:
    """The optimizations ``--only`` names (all but the earlier names of rows when None), in the catalog's
    order; an unknown name is one line."""
    if not only:
        return [o for o in OPTIMIZATIONS.values() if not o.alias_of]
    unknown = [n for n in only if n not in OPTIMIZATIONS]
    if unknown:
        raise UserInputError(f"--only {unknown[0]}: unknown optimization; known: {', '.join(OPTIMIZATIONS)}")
    return [o for o in OPTIMIZATIONS.values() if o.name in only]


def backbones(choice: str | None) -> list[str]:
    """``--backbone``: the dense backbones (``DEFAULT_BACKBONES``) when None, every backbone for
    ``all``, else the one named; an unknown one is one line naming the choices."""
    if choice is None:
        return list(DEFAULT_BACKBONES)
    if choice == ALL:
        return list(BACKBONES)
    if choice not in BACKBONES:
        raise UserInputError(f"--backbone {choice}: unknown backbone; known: {', '.join([*BACKBONES, ALL])}")
    return [choice]


def check_rows(optimizations: list[Optimization], chosen: list[str]) -> None:
    """One line when an optimization ``--only`` names is a row of none of the ``--backbone`` chosen."""
    for opt in optimizations:
        if not any(opt.applies(b) for b in chosen):
            raise UserInputError(
                f"--only {opt.name}: a row of {', '.join(opt.backbones)} only, not of --backbone "
                f"{', '.join(chosen)}; choose --backbone {opt.backbones[0]} or --backbone {ALL}"
            )
