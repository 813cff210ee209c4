"""The trajectory check: a pair against its reordering pair, step by step, for bugs that show only over steps.

A schedule stepped per micro-batch, a scheduler not restored on resume, optimizer state lost: the first
step's gradient is the baseline's bit for bit, so the one-step check (``analysis.one_step``) cannot see
them. Over a short paired run they show in the weights. Two pair folders, each written by two arm
writers (``ArmWriter``, every step tracked or a dense early schedule):

- ``pair``: arm a the change, arm b the baseline;
- ``reference``: arm a the baseline with its fp32 sums reordered (its own loop over 2 micro-batches,
  summed in another order), arm b the same baseline: the yardstick.

At each step t both pairs tracked (the weights files of both arms of both pairs),

    E_X(t) = ||theta_a - theta_b|| / ||theta_b||  (``pair``),   E_R(t) the same of ``reference``,
    r(t) = log10(E_X(t) / E_R(t)),

over the whole model; a step where the reference's arms are bitwise equal (E_R = 0) measures no
reordering and is left out; E_X = 0 is below any reordering (r = -inf). The reading, with d =
``REORDERING_DEX`` (+1 dex) as everywhere:

- ``beyond_reordering`` once ``RUN`` consecutive valid steps have r > d, decided at the last of them
  (one step above d can be a reference that has barely moved yet; a bug's difference, once there, is
  amplified like the reordering's and stays above);
- ``reordering_like`` when no step has r > d, decided at the last step read (a bug may show later: the
  run's length is the horizon of the statement);
- ``inconclusive`` otherwise (r above d at isolated steps), with the steps.

Its number is the median of r over the steps it was read on (from the first step above d for a bug,
every valid step otherwise) with their range [min, max]: the spread over steps of one run, not a
confidence interval. One replicate decides: the rule is read step by step, as the no-window reading of
the reordering yardstick is (docs/method.md), so it needs no interval over replicates; a replicate adds
another data order's steps and can only move a borderline call.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

from divergence.errors import UserInputError

RUN = 3  # consecutive valid steps above d that decide "beyond reordering"


def weights_of(arm_dir: Path, step: int) -> dict[str, torch.Tensor] | None:
    """The float64 weights an arm saved at ``step`` (each tied tensor once), or None when not saved."""
    from divergence.checkpoints.safetensors_file import SafetensorsFile
    from divergence.pairfolder.folder import ArmFolder

    path = ArmFolder(arm_dir).weights(step)
    if not path.is_file():
        return None
    source = SafetensorsFile(path)
    return {name: source.load(name).to(torch.float64) for name in source.names}


def rel_l2(a: dict, b: dict, where: str) -> float:
    """||a - b|| / ||b|| over the tensors of both (the store's ``rel_l2``, whole model)."""
    if set(a) != set(b):
        odd = sorted(set(a) ^ set(b))[0]
        raise UserInputError(f"{where}: tensor {odd!r} is saved by one arm only; the arms must be one model")
    num = math.sqrt(sum(float((a[k] - b[k]).square().sum()) for k in b))
    den = math.sqrt(sum(float(b[k].square().sum()) for k in b))
    return num / den if den else math.inf


def pair_distances(pair_dir: str | Path) -> dict[int, float]:
    """E(t) of a pair folder at every step both arms saved."""
    pair_dir = Path(pair_dir)
    if not (pair_dir / "pair.json").is_file():
        raise UserInputError(f"{pair_dir}: not a pair folder (no pair.json); write it with two ArmWriters")
    steps = sorted(
        {int(p.stem.split("_")[1]) for p in (pair_dir / "a" / "checkpoints").glob("step_*.safetensors")}
        if (pair_dir / "a" / "checkpoints").is_dir()
        else set()
    )
    out = {}
    for step in steps:
        a, b = weights_of(pair_dir / "a", step), weights_of(pair_dir / "b", step)
        if a is not None and b is not None:
            out[step] = rel_l2(a, b, f"{pair_dir} step {step}")
    if not out:
        raise UserInputError(f"{pair_dir}: no step whose weights both arms saved (safetensors)")
    return out


def trajectory_check(pair: str | Path, reference: str | Path) -> dict:
    """``pair`` (change vs baseline) read against ``reference`` (reordered baseline vs baseline).

    Returns ``{status, log10_ratio, lo, hi, decided_step, steps, curve}``: ``curve`` is
    ``[(step, E_X, E_R, r)]`` over the steps both tracked (module docstring)."""
    ex, er = pair_distances(pair), pair_distances(reference)
    shared = [t for t in sorted(set(ex) & set(er)) if t > 0]
    if not shared:
        raise UserInputError(f"{pair} and {reference}: no tracked step after 0 in common")
    curve = [(t, ex[t], er[t], _ratio(ex[t], er[t])) for t in shared]
    return read_curve(curve)


def _ratio(e_x: float, e_r: float) -> float | None:
    if e_r == 0:
        return None  # the reference's arms are equal here: no yardstick at this step
    return -math.inf if e_x == 0 else math.log10(e_x / e_r)


def read_curve(curve: list[tuple]) -> dict:
    """The reading of ``[(step, E_X, E_R, r)]`` (module docstring); pure, for the tests and the zoo."""
    from divergence.analysis.reordering import REORDERING_DEX as d  # not at import, as in one_step.compare

    valid = [(t, r) for t, _, _, r in curve if r is not None]
    result = {"steps": len(valid), "threshold": d, "curve": [list(c) for c in curve]}
    if not valid:
        return {**result, "status": None, "log10_ratio": None, "lo": None, "hi": None, "decided_step": None,
                "reason": "the reference pair's arms are equal at every step: no reordering to compare with"}  # fmt: skip
    above, first_above, decided = 0, None, None
    for t, r in valid:
        above = above + 1 if r > d else 0
        if above == 1:
            first_above = t
        if above >= RUN:
            decided = t
            break
    if decided is not None:
        read = [r for t, r in valid if t >= first_above]
        status = "beyond_reordering"
    elif all(r <= d for _, r in valid):
        read, status, decided = [r for _, r in valid], "reordering_like", valid[-1][0]
    else:
        read, status = [r for _, r in valid], "inconclusive"
    finite = [r for r in read if math.isfinite(r)]
    median = statistics.median(finite) if finite else -math.inf
    lo, hi = (min(finite), max(finite)) if finite else (None, None)
    return {**result, "status": status, "log10_ratio": median, "lo": lo, "hi": hi, "decided_step": decided}
