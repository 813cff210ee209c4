"""Compare two models' weights tensor by tensor: ``compare_state_dicts`` and ``compare_checkpoints``
(the public Python API, ``divergence.compare_*``), the engine behind ``divergence compare``
(``compare_sources``) and the lockstep trackers' ``compare_arms``.

>>> import torch
>>> a = {"layer.weight": torch.zeros(3), "layer.bias": torch.zeros(1)}
>>> b = {"model.layer.weight": torch.ones(3), "model.layer.bias": torch.zeros(1)}
>>> compare_state_dicts(a, b).summary["max_abs_diff"]       # "model." is stripped to match
1.0

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

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from divergence.checkpoints import Match, TensorSource, match_tensors, open_checkpoint
from divergence.checkpoints.families import by_family
from divergence.checkpoints.matching import check_complete, parse_maps
from divergence.checkpoints.source import InMemorySource
from divergence.errors import CheckpointError, UserInputError
from divergence.metrics import classify_kinds, compare_pairs, module_of, summarize


@dataclass
class Comparison:
    """Per-tensor records, the whole-model summary and what was skipped."""

    records: list[dict]
    summary: dict
    skipped: list[dict]


def compare_state_dicts(
    a: dict,
    b: dict,
    maps=None,
    intersection: bool = False,
    device=None,
    progress=None,
    exclude: list[str] | None = None,
    include_buffers: bool = False,
) -> Comparison:
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
    progress : wraps the matched pairs as they are measured (e.g. ``tqdm``); None: silent.
    exclude : regular expressions; matching tensors are not compared (listed in ``result.skipped``).
    include_buffers : count integer and bool buffers in the whole-model summary too.

    Returns
    -------
    Comparison: ``records`` (one dict per tensor: the metrics, ``module``,
    ``kind``), ``summary`` (whole model) and ``skipped``.
    """
    sources = []
    for side, state in (("a", a), ("b", b)):
        if not isinstance(state, dict):
            raise UserInputError(f"compare_state_dicts: {side} is a {type(state).__name__}; pass model.state_dict()")
        sources.append(InMemorySource(side, {str(k): v for k, v in state.items() if isinstance(v, torch.Tensor)}))
    return compare_sources(*sources, _match(*sources, maps, intersection, exclude), device, progress, include_buffers)


def compare_checkpoints(
    path_a: str | Path,
    path_b: str | Path,
    maps=None,
    intersection: bool = False,
    device="cpu",
    progress=None,
    exclude: list[str] | None = None,
    include_buffers: bool = False,
) -> Comparison:
    """``compare_state_dicts`` of two checkpoints (any format ``divergence compare`` reads), streamed:
    for each matched name the two tensors are loaded, measured and dropped. Two LoRA adapters are
    compared as each layer's weight change ``(alpha/r) B A``, said in ``summary["lora"]``."""
    a, b = open_checkpoint(path_a), open_checkpoint(path_b)
    comparison = compare_sources(a, b, _match(a, b, maps, intersection, exclude), device, progress, include_buffers)
    return with_sources(comparison, path_a, path_b, a, b)


def with_sources(comparison: Comparison, path_a, path_b, a: TensorSource, b: TensorSource) -> Comparison:
    """The summary names both files, and what a LoRA adapter's tensors are (divergence.checkpoints.lora)."""
    comparison.summary.update(a=str(path_a), b=str(path_b))
    notes = {s.metadata.get("lora") for s in (a, b)} - {None}
    if notes:
        comparison.summary["lora"] = notes.pop()
    skipped = [s.metadata["skipped_folders"] for s in (a, b) if s.metadata.get("skipped_folders")]
    if skipped:
        comparison.summary["skipped_folders"] = skipped  # checkpoint-N/ beside a final pipeline
    return comparison


def _match(source_a: TensorSource, source_b: TensorSource, maps, intersection: bool, exclude) -> Match:
    """The Python callers' matching: errors name ``maps=``/``intersection=``, not the command's flags."""
    match = match_tensors(source_a, source_b, parse_maps(maps, "maps"), intersection=True, exclude=exclude)
    if not intersection:
        fix = "Pass maps={PATTERN: REPLACEMENT} for renamed tensors, or intersection=True to compare the common ones"
        check_complete(match, source_a, source_b, "the two sides", fix)
    return match


def compare_arms(a: dict, b: dict, device=None) -> Comparison:
    """Compare the two arms' in-memory weights (a lockstep pair) where the tensors live: the same
    code path as ``divergence compare`` on the two arms' saved checkpoints, so the numbers a
    training callback logs are the numbers ``compare`` reproduces offline."""
    source_a, source_b = InMemorySource("arm a", a), InMemorySource("arm b", b)
    return compare_sources(source_a, source_b, match_tensors(source_a, source_b), device)


def compare_sources(
    a: TensorSource, b: TensorSource, match: Match, device="cpu", progress=None, include_buffers: bool = False
) -> Comparison:
    """One record per matched pair, with ``name, shape, numel, dtype_a, dtype_b``, the
    metrics, ``nonfinite_a/b``, and ``module`` and ``kind`` for grouping. ``device=None``
    compares each pair where tensor a lives."""
    match, tied = counted_once(a, b, match)
    kinds = classify_kinds({name: a.info(na).shape for name, na, _ in match.pairs})
    pairs = progress(match.pairs) if progress else match.pairs
    records = [
        {
            "name": name,
            "shape": list(a.info(name_a).shape),
            "dtype_a": a.info(name_a).dtype,
            "dtype_b": b.info(name_b).dtype,
            "module": module_of(name),
            "kind": kinds[name],
            **({"tied": tied[name]} if name in tied else {}),  # its other names, counted once
        }
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


def counted_once(a: TensorSource, b: TensorSource, match: Match) -> tuple[Match, dict[str, list[str]]]:
    """``match`` without the pairs that are a second name of one tensor on both sides (a tied
    ``lm_head.weight``: ``divergence.checkpoints.tied``), and ``{matched name: [its tied names]}``.
    Tied on one side only, the two names are two tensors on the other: both are compared.
    A weights file of ``pairfolder.arm.weights_file`` holds a tied tensor once and names the others."""
    matched_a = {name_a: name for name, name_a, _ in match.pairs}
    matched_b = {name_b: name for name, _, name_b in match.pairs}
    alias_a = {n: kept for kept, names in a.tied.items() for n in names}
    alias_b = {n: kept for kept, names in b.tied.items() for n in names}
    tied: dict[str, list[str]] = defaultdict(list)
    for kept, names in a.tied.items():  # named in a file's metadata, not in the file
        if kept in matched_a:
            tied[matched_a[kept]] += [n for n in names if n not in matched_a]
    pairs = []
    for name, name_a, name_b in match.pairs:
        kept = matched_a.get(alias_a.get(name_a))
        if kept is not None and kept == matched_b.get(alias_b.get(name_b)):
            tied[kept].append(name)  # the same tensor as ``kept`` on both sides
        else:
            pairs.append((name, name_a, name_b))
    return replace(match, pairs=pairs), {k: v for k, v in tied.items() if v}


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
