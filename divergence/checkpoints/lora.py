"""LoRA adapters read as what they change: the effective weight update of each layer.

A LoRA layer (Hu et al., 2021, "LoRA", eq. 3) computes ``W x + s B A x`` with A (r, in),
B (out, r) and scale ``s = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA). The factors are not
unique: ``(B R)(R^-1 A) = B A`` for any invertible (r, r) ``R``, so distances between factors can
be large while the adapters are identical. What is compared is therefore, per layer::

    delta_W = s B A          (out, in); convolutions: (out, in, k, k) from the flattened factors

named ``<module>.lora_delta`` (``down_blocks.1.attentions.0...attn1.to_q.lora_delta``), so module
grouping and kinds (``attn_q``...) work as for full weights. ``open_adapter`` reads a folder written
by peft's ``save_pretrained`` (``adapter_config.json`` + ``adapter_model.safetensors``); a model
with adapters injected gives the same records through ``divergence.models.lora``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.checkpoints.source import InMemorySource
from divergence.errors import CheckpointError

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
SUFFIX = "lora_delta"
NOTE = (
    "LoRA adapters: compared on the effective weight change delta_W = (alpha/r) B A per layer, not the A and B factors"
)
# ``<module>.lora_A[.<adapter>].weight``: peft's in-model names and its saved names.
_FACTOR = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
PEFT_PREFIX = "base_model.model."


def is_adapter_folder(path: Path) -> bool:
    return (path / CONFIG).is_file()


def lora_delta(a: torch.Tensor, b: torch.Tensor, scale: float, fan_in_fan_out: bool = False) -> torch.Tensor:
    """``scale * B @ A`` in float32: (out, r) x (r, in) -> (out, in); conv factors
    (r, in, k, k) and (out, r, 1, 1) give (out, in, k, k)."""
    delta = scale * (b.float().flatten(1) @ a.float().flatten(1))
    if a.dim() > 2:
        delta = delta.reshape(b.shape[0], *a.shape[1:])
    return delta.T if fan_in_fan_out else delta


def factor_pairs(names) -> dict[str, tuple[str, str]]:
    """``{module: (name of A, name of B)}`` for every LoRA layer among ``names``."""
    found: dict[str, dict[str, str]] = {}
    for name in names:
        m = _FACTOR.match(name)
        if m:
            found.setdefault(m["module"], {})[m["which"]] = name
    broken = sorted(mod for mod, f in found.items() if len(f) != 2)
    if broken:
        raise CheckpointError(f"LoRA layer {broken[0]!r} has only one of its lora_A / lora_B factors")
    return {mod: (f["A"], f["B"]) for mod, f in found.items()}


def open_adapter(path: Path) -> InMemorySource:
    """A peft adapter folder as ``<module>.lora_delta`` tensors (see the module docstring)."""
    config = _read_config(path)
    weights = path / WEIGHTS
    if not weights.exists():
        raise CheckpointError(f"{path}: {CONFIG} but no {WEIGHTS}; save the adapter with peft's save_pretrained")
    source = SafetensorsFile(weights)  # a regular file (files.check_path), or one line saying what it is
    deltas = {}
    for module, (name_a, name_b) in sorted(factor_pairs(source.names).items()):
        a, b = source.load(name_a), source.load(name_b)
        short = module.removeprefix(PEFT_PREFIX)
        deltas[f"{short}.{SUFFIX}"] = lora_delta(
            a, b, _scale(config, short, a.shape[0]), bool(config.get("fan_in_fan_out", False))
        )
    if not deltas:
        raise CheckpointError(f"{weights}: no lora_A / lora_B tensors; is this a LoRA adapter?")
    result = InMemorySource(path, deltas)
    result.metadata = {"lora": NOTE}
    return result


def _read_config(path: Path) -> dict:
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path / CONFIG}: cannot read the adapter config ({err})") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise CheckpointError(f"{path / CONFIG}: not a LoRA adapter config (peft_type {config.get('peft_type')!r})")
    if config.get("use_dora"):
        raise CheckpointError(
            f"{path / CONFIG}: DoRA adapters (use_dora) are not supported: their update is not B A alone"
        )
    return config


def _scale(config: dict, module: str, rank: int) -> float:
    """peft's scaling: ``alpha / r`` (``alpha / sqrt(r)`` with use_rslora); rank_pattern and
    alpha_pattern override r and alpha for modules whose name ends with the pattern."""
    r, alpha = config.get("r", rank), config.get("lora_alpha", config.get("r", rank))
    for pattern, value in (config.get("rank_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            r = value
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
    if r != rank:
        raise CheckpointError(f"LoRA layer {module!r}: factors have rank {rank} but the config says r={r}")
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
