"""The one-step check: a change's gradient (or update) against a reordering of the baseline's sums.

Two code paths that should compute the same thing (a change and its baseline: 2 data-parallel ranks
and 1, a fused kernel and a plain one, gradient accumulation and one batch) are run on the same
weights and the same batch. Their difference is stated against the same baseline's result with its
fp32 sums taken in another order: the batch split into k micro-batches whose gradients are summed in
reverse order, each weighted by its share of the examples. A correct change only reorders fp32 sums
and lands near that yardstick; a bug that shows in one step (a parameter left out of the all-reduce,
an unmasked padded logit, clipping the still-scaled gradients) lands orders of magnitude above it.
It is decided in the time of a few forward and backward passes, with no training run.

For each reference k (``splits``, default 2, 4 and 8 micro-batches),

    E_X = || g_change - g_base ||,    E_R,k = || g_R,k - g_base ||,    r_k = log10(E_X / E_R,k)

over the whole model (all returned tensors flattened together) and per tensor. The whole model's r_k
are pooled as replicates are (``analysis.replicates.pool``: their mean and two-sided 95% t interval,
the spread being how much the yardstick itself moves with the split), and read with the reordering
yardstick's constant d = ``REORDERING_DEX`` (+1 dex: 10x a reordering, ``analysis.reordering``):

- ``beyond_reordering``: the interval's low end is above d (a single reference: its r above d);
- ``reordering_like``: its high end is at most d, or the two paths are bitwise equal (E_X = 0);
- ``inconclusive``: the interval holds d.

The derived reference assumes the baseline's result is a mean over the examples of the batch's leading
dimension (a per-example or per-token mean over equal-length rows): then sum_i (n_i / N) g_i is the same
gradient, summed otherwise. A path that is not (clipping, a token-count normalization over padded rows,
an optimizer update) needs its reordered reference given: ``reordered=`` a callable (or several), the
baseline with its sums reordered in a way the user knows is exact, e.g. its own micro-batch loop.

Each path is called as ``path(model, batch)`` after the model's weights are put back and its gradients
cleared, under the same RNG seed; it returns ``{name: tensor}`` (its gradient or update), or None to
have the parameters' ``.grad`` read. Anything else it changes besides the weights (an optimizer's
state, a scheduler) it must rebuild inside the call. Reference for the yardstick: docs/method.md,
"The reordering yardstick".
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from divergence.analysis.replicates import pool
from divergence.errors import UserInputError

SPLITS = (2, 4, 8)  # micro-batch counts of the derived reordered references
SEED = 0  # every call runs under this RNG seed, so dropout masks and noise draws match


@dataclass
class OneStepResult:
    """What ``one_step_check`` found. ``log10_ratio`` is the mean of the references' r_k (None when
    the paths are bitwise equal); ``lo``/``hi`` its t interval (None with one reference)."""

    status: str
    log10_ratio: float | None
    lo: float | None
    hi: float | None
    e_change: float
    base_norm: float
    references: list[dict]
    tensors: dict[str, dict]
    kind: str = "gradient"
    seconds: float = 0.0
    threshold: float = 1.0
    notes: list[str] = field(default_factory=list)

    def worst(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` tensors furthest above their reordering (name, log10 ratio), largest first."""
        finite = [(k, v["log10_ratio"]) for k, v in self.tensors.items() if v["log10_ratio"] is not None]
        return sorted(finite, key=lambda kv: -kv[1])[:n]

    def line(self) -> str:
        """One sentence: the status, the ratio with its interval, where it is largest."""
        if self.log10_ratio is None:
            return f"reordering-like: the change's {self.kind} equals the baseline's bit for bit"
        span = f" (95% CI {self.lo:+.2f} to {self.hi:+.2f})" if self.lo is not None else ""
        words = self.status.replace("_", " ").replace("reordering like", "reordering-like")
        top = ", ".join(f"{k} {v:+.1f}" for k, v in self.worst(2))
        return (
            f"{words}: the change's {self.kind} differs from the baseline's {10**self.log10_ratio:.3g}x a "
            f"reordering of its sums (log10 {self.log10_ratio:+.2f}{span}; d = +{self.threshold:g}); "
            f"largest: {top}; {self.seconds:.1f} s"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def one_step_check(
    change: Callable,
    baseline: Callable,
    model: torch.nn.Module,
    batch,
    *,
    reordered: Callable | list | None = None,
    splits: tuple[int, ...] = SPLITS,
    kind: str = "gradient",
) -> OneStepResult:
    """The change's ``kind`` ("gradient" or "update") against the baseline's and its reorderings.

    ``change`` and ``baseline``: ``path(model, batch) -> {name: tensor} | None`` (module docstring).
    ``reordered``: the reference path(s); default (gradients only) the baseline on ``batch`` split into
    each of ``splits`` micro-batches along its leading dimension, summed in reverse order.
    """
    if kind not in ("gradient", "update"):
        raise UserInputError(f"kind={kind!r}: must be 'gradient' or 'update'")
    start = time.perf_counter()
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g_base = run_path(baseline, model, batch, saved, "baseline")
    g_change = run_path(change, model, batch, saved, "change")
    check_same_tensors(g_base, g_change, "change")
    refs = reference_paths(baseline, batch, reordered, splits, kind)
    g_refs = []
    for label, path in refs:
        g_ref = run_path(path, model, batch, saved, label)
        check_same_tensors(g_base, g_ref, label)
        g_refs.append((label, g_ref))
    result = compare(g_base, g_change, g_refs, kind)
    result.seconds = time.perf_counter() - start
    return result


def run_path(path: Callable, model: torch.nn.Module, batch, saved: dict, label: str) -> dict[str, torch.Tensor]:
    """``path``'s result on the saved weights, as float64 copies; the weights put back after it."""
    if not callable(path):
        raise UserInputError(f"{label}: {path!r} is not callable; give a function path(model, batch)")
    model.load_state_dict(saved)
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        out = path(model, batch)
    if out is None:
        out = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        if not out:
            raise UserInputError(f"{label}: returned None and left no parameter with a .grad; return {{name: tensor}}")
    if not isinstance(out, dict) or not all(isinstance(v, torch.Tensor) for v in out.values()):
        raise UserInputError(f"{label}: returned {type(out).__name__}; return {{name: tensor}} or None")
    result = {}
    for name, value in out.items():
        value = value.detach().to("cpu", torch.float64)
        if not torch.isfinite(value).all():
            raise UserInputError(f"{label}: tensor {name!r} is not finite (NaN or inf)")
        result[name] = value
    model.load_state_dict(saved)
    model.zero_grad(set_to_none=True)
    return result


def check_same_tensors(base: dict, other: dict, label: str) -> None:
    """Both paths return the same names with the same shapes, or one line naming the first that differs."""
    missing, extra = sorted(set(base) - set(other)), sorted(set(other) - set(base))
    if missing or extra:
        which = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which the baseline lacks"
        raise UserInputError(f"{label}: its result {which}; both paths must return the same tensors")
    for name, value in base.items():
        if other[name].shape != value.shape:
            raise UserInputError(
                f"{label}: tensor {name!r} has shape {tuple(other[name].shape)}, the baseline's {tuple(value.shape)}"
            )


def reference_paths(baseline: Callable, batch, reordered, splits, kind: str) -> list[tuple[str, Callable]]:
    """The reordered references: the given callables, or the baseline over micro-batches."""
    if reordered is not None:
        given = list(reordered) if isinstance(reordered, (list, tuple)) else [reordered]
        if not given:
            raise UserInputError("reordered: give at least one reference path")
        return [(f"reordered {i + 1}", path) for i, path in enumerate(given)]
    if kind == "update":
        raise UserInputError(
            "kind='update': give reordered= (the baseline's update with its gradient's sums reordered); an "
            "update is not a mean over examples, so it cannot be split into micro-batches"
        )
    rows = leading_size(batch)
    usable = [k for k in splits if isinstance(k, int) and 2 <= k <= rows]
    if not usable:
        raise UserInputError(
            f"batch: {rows} row(s) cannot be split into {tuple(splits)} micro-batches; give a larger batch or reordered="
        )
    return [(f"{k} micro-batches", micro_batch_path(baseline, k)) for k in usable]


def micro_batch_path(baseline: Callable, k: int) -> Callable:
    """The baseline over ``k`` micro-batches of the batch, summed last to first, weighted n_i / N."""

    def path(model, batch):
        rows = leading_size(batch)
        parts = split_batch(batch, k)
        results = []
        for part in parts:
            model.zero_grad(set_to_none=True)
            out = baseline(model, part)
            if out is None:
                out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            results.append((leading_size(part) / rows, {n: v.detach().clone() for n, v in out.items()}))
        total = {}
        for weight, out in reversed(results):  # the other order
            for name, value in out.items():
                total[name] = total[name] + weight * value if name in total else weight * value
        return total

    return path


def leading_size(batch) -> int:
    """The leading dimension shared by the batch's tensors (a tensor, a tuple/list or a dict of them)."""
    sizes = {t.shape[0] for t in _tensors(batch) if t.dim() > 0}
    if len(sizes) != 1:
        raise UserInputError(
            "batch: its tensors do not share one leading (example) dimension "
            f"(sizes {sorted(sizes) or 'none'}); give reordered= yourself"
        )
    return sizes.pop()


def split_batch(batch, k: int) -> list:
    """``batch`` cut into ``k`` consecutive parts along the leading dimension (sizes differ by at most 1)."""
    if isinstance(batch, torch.Tensor):
        return list(torch.tensor_split(batch, k))
    if isinstance(batch, dict):
        parts = {key: split_batch(value, k) for key, value in batch.items()}
        return [{key: parts[key][i] for key in batch} for i in range(k)]
    if isinstance(batch, (list, tuple)):
        parts = [split_batch(value, k) for value in batch]
        return [type(batch)(p[i] for p in parts) for i in range(k)]
    return [batch] * k  # a non-tensor entry (a flag, a count) rides along unchanged


def _tensors(batch):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from _tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _tensors(value)


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.square().sum()) for t in tensors))


def _log_ratio(num: float, den: float) -> float | None:
    if num == 0:
        return None  # bitwise equal: below any reordering
    return math.inf if den == 0 else math.log10(num / den)


def compare(base: dict, change: dict, refs: list[tuple[str, dict]], kind: str) -> OneStepResult:
    """E_X, each E_R,k and r_k for the whole model and per tensor, pooled and read (module docstring)."""
    # d and its reading are the reordering yardstick's (imported here: it reads the variants' registry)
    from divergence.analysis.reordering import REORDERING_DEX as d
    from divergence.analysis.reordering import decide

    diff = {n: change[n] - base[n] for n in base}
    e_x = _norm(diff.values())
    references, tensors = [], {}
    for label, ref in refs:
        e_r = _norm((ref[n] - base[n]) for n in base)
        references.append({"reference": label, "e_reordered": e_r, "log10_ratio": _log_ratio(e_x, e_r)})
    for name in base:
        num = _norm([diff[name]])
        dens = [_norm([ref[name] - base[name]]) for _, ref in refs]
        ratios = [_log_ratio(num, den) for den in dens]
        finite = [r for r in ratios if r is not None and math.isfinite(r)]
        value = None if num == 0 else (sum(finite) / len(finite) if finite else math.inf)
        tensors[name] = {"e_change": num, "e_reordered": sorted(dens)[len(dens) // 2], "log10_ratio": value}
    notes, base_norm = [], _norm(base.values())
    if e_x == 0:
        return OneStepResult(
            "reordering_like", None, None, None, 0.0, base_norm, references, tensors, kind, threshold=d
        )
    ratios = [r["log10_ratio"] for r in references]
    if any(r == math.inf for r in ratios):
        notes.append("a reordered reference equals the baseline bit for bit: it measures no reordering")
    pooled = pool([r for r in ratios if math.isfinite(r)])
    if pooled.n == 0:
        status, mean, lo, hi = "inconclusive", math.inf, None, None
        notes.append("no reference moved the baseline: no yardstick")
    else:
        mean, lo, hi, status = pooled.mean, pooled.lo, pooled.hi, decide(pooled)
    return OneStepResult(status, mean, lo, hi, e_x, base_norm, references, tensors, kind, threshold=d, notes=notes)
