"""Compare two checkpoints tensor by tensor: the engine behind ``divergence compare``.

Tensors are streamed: for each matched name, the two tensors are loaded, moved to the
comparison device, measured with ``divergence.metrics.compare_pairs`` and dropped, so peak
memory is a few pairs of tensors (those in flight on the worker threads), not the two models.
On CPU the next pairs are loaded while the worker threads measure the current ones.

Every tensor compared has a record; integer and bool buffers are left out of the
whole-model summary unless ``include_buffers`` (see ``divergence.metrics.grouping``).
The summary is per key family (``divergence.checkpoints.families``): the raw weights' at the
top level, as always, and with EMA tensors (``ema.<name>``) their own under ``summary["ema"]``,
so the EMA never mixes into the raw weights' whole-model numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from divergence.checkpoints import Match, TensorSource, match_tensors, open_checkpoint
from divergence.checkpoints.families import by_family
from divergence.checkpoints.source import InMemorySource
from divergence.errors import CheckpointError
from divergence.metrics import classify_kinds, compare_pairs, module_of, summarize


@dataclass
class Comparison:
    """Per-tensor records, the whole-model summary and what was skipped."""

    records: list[dict]
    summary: dict
    skipped: list[dict]


def compare_checkpoints(
    path_a: str | Path,
    path_b: str | Path,
    maps: list[str] | None = None,
    intersection: bool = False,
    device: str | torch.device = "cpu",
    progress: Callable | None = None,
    exclude: list[str] | None = None,
    include_buffers: bool = False,
) -> Comparison:
    """Open, match and measure two checkpoints; see ``compare_sources``.

    ``exclude``: regular expressions; matching tensors are not compared (listed as skipped).
    """
    a, b = open_checkpoint(path_a), open_checkpoint(path_b)
    match = match_tensors(a, b, maps, intersection, exclude)
    comparison = compare_sources(a, b, match, device, progress, include_buffers)
    comparison.summary.update(a=str(path_a), b=str(path_b))
    notes = {s.metadata.get("lora") for s in (a, b)} - {None}
    if notes:  # LoRA adapters: say what was compared (divergence.checkpoints.lora)
        comparison.summary["lora"] = notes.pop()
    return comparison


def compare_state_dicts(a: dict, b: dict, device=None) -> Comparison:
    """Compare two in-memory weight dicts (the arms of a pair) where the tensors live.

    The same code path as ``divergence compare`` on the two arms' saved checkpoints, so the
    numbers a training callback logs are the numbers ``compare`` reproduces offline.
    """
    source_a, source_b = InMemorySource("arm a", a), InMemorySource("arm b", b)
    return compare_sources(source_a, source_b, match_tensors(source_a, source_b), device)


def compare_sources(a: TensorSource, b: TensorSource, match: Match, device="cpu", progress=None,
                    include_buffers: bool = False) -> Comparison:
    """One record per matched pair, with ``name, shape, numel, dtype_a, dtype_b``, the
    metrics, ``nonfinite_a/b``, and ``module`` and ``kind`` for grouping. ``device=None``
    compares each pair where tensor a lives."""
    kinds = classify_kinds({name: a.info(na).shape for name, na, _ in match.pairs})
    pairs = progress(match.pairs) if progress else match.pairs
    records = [
        {"name": name, "shape": list(a.info(name_a).shape), "dtype_a": a.info(name_a).dtype,
         "dtype_b": b.info(name_b).dtype, "module": module_of(name), "kind": kinds[name]}
        for name, name_a, name_b in match.pairs
    ]
    for record, measured in zip(records, compare_pairs(_loaded(a, b, pairs, device))):
        record.update(measured)
    summary = summarize_by_family(records, include_buffers)
    summary.update(
        matched=len(match.pairs),
        skipped=len(match.skipped),
        stripped_prefix_a=match.stripped_a,
        stripped_prefix_b=match.stripped_b,
    )
    return Comparison(records, summary, match.skipped)


def _loaded(a: TensorSource, b: TensorSource, pairs, device):
    """Each matched pair's two tensors, loaded when ``compare_pairs`` asks for the next one."""
    for name, name_a, name_b in pairs:
        info_a, info_b = a.info(name_a), b.info(name_b)
        if info_a.torch_dtype.is_complex != info_b.torch_dtype.is_complex:
            raise CheckpointError(
                f"tensor {name!r} is {info_a.dtype} in {a.path} but {info_b.dtype} in {b.path}; "
                "a complex tensor can only be compared with a complex one (use --exclude to leave it out)"
            )
        ta = a.load(name_a)
        ta = ta if device is None else ta.to(device)
        yield ta, b.load(name_b).to(ta.device)


def summarize_by_family(records: list[dict], include_buffers: bool = False) -> dict:
    """The raw weights' whole-model summary, plus ``"ema"``: the EMA tensors' own, when there are any."""
    families = by_family(records)
    summary = summarize(families.get("weights", []), include_buffers)
    if "ema" in families:
        summary["ema"] = summarize(families["ema"], include_buffers)
    return summary
