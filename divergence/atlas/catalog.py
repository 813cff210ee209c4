"""The optimizations the atlas measures, by the name ``--only`` takes, and the backbones.

Each is a shipped pair recipe (``recipes/pairs/``) studied on the backbone's base with the
study's references; ``devices`` says where it runs (a row on another device says so instead of a
number); ``needs`` marks one the atlas cannot measure, with what it would need. A row whose arms differ in
world size or strategy trains each arm as its own multi-process job (``training.separate_pair``).
"""

from __future__ import annotations

from dataclasses import dataclass

from divergence.errors import UserInputError

BACKBONES = {"unet": "tiny.yaml", "dit": "tiny-dit.yaml"}  # base run recipe of each (recipes/)


@dataclass(frozen=True)
class Optimization:
    name: str
    pair: str | None  # pair recipe under recipes/, or None when the atlas cannot train it
    what: str  # one line: a vs b
    devices: tuple[str, ...] = ()  # device types it runs on; (): any
    needs: str = ""  # why it is not measured here, when pair is None

    def unavailable(self, device: str) -> str | None:
        """Why this row has no measurement on ``device`` ("GPU only: ..."), or None."""
        if self.pair is None:
            return self.needs
        if self.devices and device not in self.devices:
            where = "GPU only" if self.devices == ("cuda",) else "CPU only"
            return f"{where}: {self.what} runs on {' or '.join(self.devices)}"
        return None


OPTIMIZATIONS = {
    o.name: o
    for o in (
        Optimization("fp8-tensorwise", "pairs/fp8-tensorwise.yaml", "FP8 linear layers, tensorwise scaling, vs bf16"),
        Optimization("fp8-rowwise", "pairs/fp8-rowwise.yaml", "FP8 linear layers, rowwise scaling, vs bf16"),
        Optimization("int8-mixed", "pairs/int8-mixed.yaml", "INT8 mixed-precision linear layers vs fp32"),
        Optimization("compile", "pairs/compile.yaml", "torch.compile (inductor) vs eager"),
        Optimization("grad-accumulation", "pairs/grad-accumulation.yaml", "4 micro-batches of 4 vs one batch of 16"),
        Optimization("cpu-threads", "pairs/cpu-threads.yaml", "2 vs 1 intra-op CPU threads", devices=("cpu",)),
        Optimization("flash", "pairs/flash-vs-baseline.yaml", "flash attention (sdpa-flash) vs baseline attention"),
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
            "fsdp-grad-op",
            "pairs/fsdp-grad-op.yaml",
            "FSDP SHARD_GRAD_OP (ZeRO-2) vs DDP, 2 ranks (one GPU each)",
            devices=("cuda",),
        ),
        Optimization(
            "fsdp-full",
            "pairs/fsdp-full.yaml",
            "FSDP FULL_SHARD (ZeRO-3) vs DDP, 2 ranks (one GPU each)",
            devices=("cuda",),
        ),
        # the name earlier atlases gave the FSDP row: the same pair as fsdp-full (docs/atlas.md)
        Optimization("fsdp", "pairs/fsdp-full.yaml", "fsdp-full under its earlier name", devices=("cuda",)),
    )
}


def select(only: list[str] | None) -> list[Optimization]:
    """The optimizations ``--only`` names (all when None), in the catalog's order; an unknown name is one line."""
    if not only:
        return list(OPTIMIZATIONS.values())
    unknown = [n for n in only if n not in OPTIMIZATIONS]
    if unknown:
        raise UserInputError(f"--only {unknown[0]}: unknown optimization; known: {', '.join(OPTIMIZATIONS)}")
    return [o for o in OPTIMIZATIONS.values() if o.name in only]


def backbones(choice: str | None) -> list[str]:
    """``--backbone`` (both when None); an unknown one is one line."""
    if choice is None:
        return list(BACKBONES)
    if choice not in BACKBONES:
        raise UserInputError(f"--backbone {choice}: unknown backbone; known: {', '.join(BACKBONES)}")
    return [choice]
