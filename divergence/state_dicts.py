"""``compare_state_dicts`` and ``compare_checkpoints`` for Python callers: any two models' weights.

The engine is ``divergence.checkpoints.compare`` (what ``divergence compare`` runs); these wrappers
take name maps and ``intersection`` as arguments and say what to pass in Python, not which
command-line flag to use, when the two sides do not match.

>>> import torch
>>> a = {"layer.weight": torch.zeros(3), "layer.bias": torch.zeros(1)}
>>> b = {"model.layer.weight": torch.ones(3), "model.layer.bias": torch.zeros(1)}
>>> compare_state_dicts(a, b).summary["max_abs_diff"]       # "model." is stripped to match
1.0
"""

from __future__ import annotations

import re
from pathlib import Path

from divergence.errors import CheckpointError, UserInputError


def compare_state_dicts(a: dict, b: dict, maps=None, intersection: bool = False, device=None):
    """Compare two ``{name: tensor}`` dicts (``model.state_dict()``) tensor by tensor.

    Parameters
    ----------
    a, b : state dicts of the same architecture, on any device.
    maps : renaming rules applied to both sides' names, each a regular expression and its
        replacement: ``{"attn\\.q": "attn.to_q"}``, ``[("attn\\.q", "attn.to_q")]`` or
        ``["attn\\.q=attn.to_q"]``.
    intersection : compare only the names both sides have (the rest in ``result.skipped``);
        otherwise names on one side only, or with different shapes, are an error.
    device : where to compute; ``None``: where each tensor of ``a`` lives.

    Returns
    -------
    divergence.checkpoints.compare.Comparison: ``records`` (one dict per tensor: the metrics, ``module``,
    ``kind``), ``summary`` (whole model) and ``skipped``.
    """
    from divergence.checkpoints.source import InMemorySource

    for side, state in (("a", a), ("b", b)):
        if not isinstance(state, dict):
            raise UserInputError(f"compare_state_dicts: {side} is a {type(state).__name__}; pass model.state_dict()")
    source_a, source_b = InMemorySource("a", _tensors(a)), InMemorySource("b", _tensors(b))
    return _compare(source_a, source_b, maps, intersection, device)


def compare_checkpoints(path_a: str | Path, path_b: str | Path, maps=None, intersection: bool = False,
                        device="cpu"):
    """``compare_state_dicts`` of two checkpoints (any format ``divergence compare`` reads), streamed."""
    from divergence.checkpoints import open_checkpoint

    comparison = _compare(open_checkpoint(path_a), open_checkpoint(path_b), maps, intersection, device)
    comparison.summary.update(a=str(path_a), b=str(path_b))
    return comparison


def _compare(source_a, source_b, maps, intersection: bool, device):
    from divergence.checkpoints import match_tensors
    from divergence.checkpoints.compare import compare_sources

    match = match_tensors(source_a, source_b, compile_maps(maps), intersection=True)
    if not intersection:
        _check_complete(match, source_a, source_b)
    return compare_sources(source_a, source_b, match, device)


def compile_maps(maps) -> list[tuple[re.Pattern, str]]:
    """Renaming rules as ``(compiled pattern, replacement)``; see ``compare_state_dicts``."""
    if maps is None:
        return []
    items = maps.items() if isinstance(maps, dict) else maps
    rules = []
    for item in items:
        if isinstance(item, str):
            if "=" not in item:
                raise UserInputError(f"maps: {item!r} is not 'PATTERN=REPLACEMENT'")
            item = item.split("=", 1)
        pattern, replacement = item
        try:
            rules.append((re.compile(pattern), replacement))
        except re.error as err:
            raise UserInputError(f"maps: {pattern!r} is not a valid regular expression ({err})") from None
    return rules


def _tensors(state: dict) -> dict:
    import torch

    return {str(k): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _check_complete(match, a, b) -> None:
    from divergence.checkpoints.matching import mismatch_problems

    problems = mismatch_problems(match, a, b)
    if problems:
        raise CheckpointError("the two sides do not match: " + "; ".join(problems) + ". Pass maps={PATTERN: "
                              "REPLACEMENT} for renamed tensors, or intersection=True to compare the common ones")


