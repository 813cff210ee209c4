"""Range checks a recipe needs from outside itself: Lightning's strategy names.

(The checks of the machine a run starts on, such as its memory, are
``divergence.training.host``'s: they run where a run starts, not when a recipe is read.)
"""

from __future__ import annotations

from divergence.errors import RecipeError


# Lightning's registered strategy names (``lightning.pytorch.strategies.StrategyRegistry``, 2.x),
# listed here because importing Lightning to read them costs seconds of CPU before any check;
# tests/recipe/test_limits.py keeps this list equal to the installed Lightning's registry.
STRATEGIES = (
    "auto",
    "ddp",
    "ddp_spawn",
    "ddp_fork",
    "ddp_notebook",
    "ddp_find_unused_parameters_false",
    "ddp_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_false",
    "ddp_spawn_find_unused_parameters_true",
    "ddp_fork_find_unused_parameters_false",
    "ddp_fork_find_unused_parameters_true",
    "ddp_notebook_find_unused_parameters_false",
    "ddp_notebook_find_unused_parameters_true",
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme",
    "fsdp",
    "fsdp_cpu_offload",
    "single_device",
    "single_xla",
    "xla_debug",
    "xla",
    "single_tpu",
)


def check_strategy(name: str) -> None:
    """``train.strategy`` must name a Lightning strategy (Lightning compares it lowercased)."""
    if name.lower() not in STRATEGIES:
        from divergence.config.yaml_safe import short

        raise RecipeError(
            f"strategy: {short(name)} is not a Lightning strategy; use one of auto, ddp, fsdp, "
            f"deepspeed, ... ({len(STRATEGIES)} names, as in lightning.pytorch.strategies"
            ".StrategyRegistry)"
        )
