"""The step rules' checks, called by every arm writer: the step, its loss, the weights' names.

The rules are stated once, in ``docs/pair-folder.md`` ("The step rules every arm writer
checks"); this module is their code: ``check_step`` (the step), ``loss_value`` and
``check_loss`` (the loss), ``check_tensor_names`` (the weights), ``check_stride`` and
``tracked_with_stride`` (which recorded steps are tracked when the arm counts ``stride`` steps
per record: two optimizers stepped once per batch record steps 0, 2, 4, ...).
"""

from __future__ import annotations

import math
import operator
from typing import Callable

from divergence.errors import UserInputError, check_int

MAX_STEP = 2**63 - 1  # steps are stored and exported as int64


def check_step(step, *, expected: int, max_steps: int | None, stride: int = 1, where: str) -> int:
    """``step`` as an int when it is the step a writer expects next, else a one-line ``UserInputError``.

    ``expected``: 0 at a fresh start (the initial weights come first), ``start_step + stride``
    after a restart from ``start_step``, ``last + stride`` after a recorded step ``last``.

    >>> check_step(3, expected=3, max_steps=10, where="record")
    3
    """
    if isinstance(step, bool) or not _is_integer(step):
        raise UserInputError(
            f"{where}: step {step!r} ({type(step).__name__}) is not an integer; give the optimizer "
            "step count (0 for the initial weights)"
        )
    step = operator.index(step)
    limit = MAX_STEP if max_steps is None else max_steps
    if not 0 <= step <= limit:
        what = "negative" if step < 0 else f"past max_steps={max_steps}" if max_steps is not None else "past int64"
        raise UserInputError(f"{where}: step {step} is {what}; steps run from 0 to max_steps")
    if step == expected:
        return step
    if expected == 0:
        raise UserInputError(
            f"{where}: step {step} before step 0; call record(0, model) before the first training "
            "step, so the initial weights are saved"
        )
    if step < expected:
        last = expected - stride
        what = "is recorded already" if step == last else f"comes after step {last}"
        raise UserInputError(
            f"{where}: step {step} {what} (the last step recorded, or resumed from); each step is "
            f"recorded once, in order: the next is {expected}"
        )
    raise UserInputError(
        f"{where}: step {step} skips step {expected}: record every "
        + (f"{stride}-th step" if stride > 1 else "step")
        + " in order (divergence watch needs "
        f"the loss of each one and would wait for step {expected} forever)"
    )


def _is_integer(value) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def loss_value(loss, where: str) -> float:
    """The loss of a step as a float: a number, or a tensor/array of one element; NaN and
    infinities stay what they are. Anything else is a one-line ``UserInputError``.

    >>> loss_value(float("inf"), "record")
    inf
    """
    check_loss(loss, where)
    if hasattr(loss, "detach"):
        loss = loss.detach()
    try:
        return float(loss.item() if hasattr(loss, "item") else loss)
    except (TypeError, ValueError):
        raise UserInputError(
            f"{where}: loss {loss!r} ({type(loss).__name__}) is not a number; give the step's "
            "loss (a float or a one-element tensor)"
        ) from None


def check_loss(loss, where: str) -> None:
    """``loss`` could be a step's loss: a real number or one element (checked without reading a
    tensor's value, so without a device sync); else a one-line ``UserInputError``."""
    if isinstance(loss, bool) or loss is None or isinstance(loss, (str, bytes)):
        raise UserInputError(
            f"{where}: loss {loss!r} ({type(loss).__name__}) is not a number; give the step's "
            "loss (a float or a one-element tensor)"
        )
    shape = getattr(loss, "shape", None)
    if shape is not None and math.prod(shape) != 1:
        raise UserInputError(
            f"{where}: loss is a {type(loss).__name__} of shape {tuple(shape)}; give the step's "
            "mean loss (a float or a one-element tensor), e.g. loss.mean()"
        )
    if getattr(loss, "is_complex", lambda: False)():
        raise UserInputError(f"{where}: loss {loss!r} is complex; give a real number")


def check_tensor_names(names, first: list[str], step: int, where: str) -> None:
    """The weights of ``step`` hold exactly the names of the first tracked step (``first``)."""
    names, known = list(names), set(first)
    new = [n for n in names if n not in known]
    gone = sorted(known - set(names))
    if not new and not gone:
        return
    what = (
        f"tensor {new[0]!r} is new" + (f" (and {len(new) - 1} more)" if len(new) > 1 else "")
        if new
        else f"tensor {gone[0]!r} is missing" + (f" (and {len(gone) - 1} more)" if len(gone) > 1 else "")
    )
    raise UserInputError(
        f"{where}: at step {step}, {what}: the weights of every tracked step must hold the same "
        f"tensors as the first ({len(first)}); a tensor added mid-run has no initial value to "
        "compare from: compare it from the start, or leave it out (weights=...)"
    )


def tracked_with_stride(step: int, stride: int, tracked: Callable[[int], bool]) -> bool:
    """Whether recorded step ``step`` is tracked when steps are recorded every ``stride``.

    ``tracked`` is the schedule of one step at a time (``is_tracked``). With ``stride`` 1 it is
    that; otherwise a multiple of ``stride`` is tracked when any step since the previous
    multiple is, so each scheduled step is compared at the first recorded step at or after it
    (the last step, a multiple of ``stride``, always is).

    >>> [s for s in range(0, 13, 2) if tracked_with_stride(s, 2, lambda t: t % 3 == 0)]
    [0, 4, 6, 10, 12]
    """
    if stride == 1:
        return tracked(step)
    if step % stride:
        return False
    return step == 0 or any(tracked(t) for t in range(step - stride + 1, step + 1))


def check_stride(stride, max_steps: int | None, where: str) -> int:
    """``stride`` is an integer >= 1 that divides ``max_steps`` (the last step is a recorded one;
    None: open-ended, the last step is a recorded one by construction)."""
    check_int(stride, f"{where}: stride", 1, " (steps counted per record)")
    if max_steps is not None and max_steps % stride:
        raise UserInputError(
            f"{where}: max_steps={max_steps} is not a multiple of stride={stride} (steps counted "
            f"per record, e.g. one per optimizer of a manual-optimization module); use "
            f"max_steps={max_steps - max_steps % stride + stride}"
        )
    return stride
