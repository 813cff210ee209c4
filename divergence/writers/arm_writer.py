"""``ArmWriter``: one arm's side of the pair folder, from any training loop.

::

    writer = divergence.ArmWriter("runs/flash-vs-sdpa", "a", max_steps=1000, every=50)
    writer.record(0, model)                      # the initial weights
    for step in range(1, 1001):
        loss = train_one_step(model)
        writer.record(step, model, loss)         # the loss; the weights at tracked steps
    writer.finish()

Arm ``b`` runs the same loop (another process, another machine) into the same folder, and
``divergence watch runs/flash-vs-sdpa`` builds the pair's metrics store as both go.

What it writes (``docs/pair-folder.md``): ``<out>/<arm>/losses.jsonl`` (one line per step),
``<out>/<arm>/checkpoints/step_NNNNNN.safetensors`` at the tracked steps (step 0, every
``every`` steps, the last: ``divergence.tracking.records.is_tracked``), each file written
under a temporary name and renamed, and ``<out>/<arm>/status.json``. The first arm to start
writes ``<out>/pair.json`` when it is missing.

Step ``N`` is the state after ``N`` optimizer steps; ``record(N, model, loss)`` takes the loss
of the N-th step. Only the process of global rank 0 writes (``RANK`` in the environment, or
``torch.distributed``); the others may call every method, and nothing happens. Under FSDP,
gather the full state dict yourself (every rank) and pass it as ``model``.

Restarted from a checkpoint at step G, pass ``start_step=G``: the losses and weights files
after G are removed (the arm computes them again) and ``status.json`` counts a new attempt,
which ``divergence watch`` follows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from divergence.errors import UserInputError
from divergence.pairfolder.layout import CHECKPOINTS
from divergence.pairfolder.pair_json import DEFAULT_EVERY, ensure_pair_files, schedule_config, tracking_schedule
from divergence.pairfolder.weights_file import save_weights, weights_path
from divergence.recipe.pair import DENSE_DEFAULT
from divergence.store.arm_status import ArmStatus
from divergence.store.losses import LossFile
from divergence.tracking.records import ARMS, is_tracked



class ArmWriter:
    """Write arm ``arm`` (``"a"`` or ``"b"``) of the pair folder ``out``.

    Parameters
    ----------
    out : the pair folder both arms write into.
    arm : ``"a"`` or ``"b"``.
    max_steps : the arm's number of optimizer steps (both arms the same).
    every : compare the arms' weights every ``every`` steps (and at step 0 and the last).
    start_step : the step this process resumes from (0 for a fresh start).
    weights : ``model -> {name: tensor}``; default: the floating-point entries of
        ``model.state_dict()`` (``model`` may also be such a dict already).
    rank : this process's global rank; default from ``torch.distributed`` or ``$RANK``.
    **pair : for ``pair.json`` when this arm writes it: ``name``, ``category``, ``arms``,
        ``description``, ``replicate``, ``spike_factor``, ``spike_window``, ``log``.
    """

    def __init__(self, out: str | Path, arm: str, *, max_steps: int, every: int = DEFAULT_EVERY,
                 start_step: int = 0, weights: Callable | None = None, rank: int | None = None, **pair):
        if arm not in ARMS:
            raise UserInputError(f"arm={arm!r}: must be one of {', '.join(ARMS)}")
        self.out, self.arm, self.max_steps, self.every = Path(out), arm, max_steps, every
        self.folder = self.out / arm
        self.weights = weights or state_weights
        self.rank = global_rank() if rank is None else rank
        self.status: ArmStatus | None = None
        self.last_step = start_step
        self.saved_step: int | None = None  # the step whose weights ``save`` wrote last
        self.schedule = schedule_config(tracking_schedule(every, dense=pair.get("dense", DENSE_DEFAULT)))
        if self.is_writer:
            saved = ensure_pair_files(self.out, max_steps=max_steps, every=every, **pair)
            self.schedule = schedule_config(saved.get("tracking") or {"every": every})
            self._start(start_step)

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def tracked(self, step: int) -> bool:
        """Whether the weights of ``step`` are saved (and compared)."""
        return is_tracked(step, self.max_steps, self.schedule, 0)

    def record(self, step: int, model=None, loss=None) -> None:
        """The loss of optimizer step ``step`` (none at step 0) and, at tracked steps, ``model``'s weights."""
        if not self.is_writer:
            return
        if step > 0:
            if loss is None:
                raise UserInputError(f"ArmWriter.record({step}, ...): give the step's loss (a float or a 0-d tensor)")
            if not weights_path(self.folder / CHECKPOINTS, 0).exists():
                raise UserInputError(f"{self.folder}: no step-0 weights; call record(0, model) before the first "
                                     "training step, so the initial weights are saved")
        if self.tracked(step) and self.saved_step != step:
            if model is None:
                raise UserInputError(f"ArmWriter.record({step}, ...): step {step} is tracked; give the model "
                                     "(or its state dict)")
            self.save(step, self.weights(model))
        if step > 0:
            self.loss_file.append(step, float(loss.detach() if isinstance(loss, torch.Tensor) else loss))
        self.last_step = step

    def save(self, step: int, tensors: dict) -> Path:
        """Write the weights file of ``step`` (atomically; any device, copied to the CPU)."""
        self.saved_step = step
        if not self.status.tensor_order:
            self.status.tensor_order = list(tensors)
            self.status.write(self.folder)
        cpu = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}  # copies: tied weights
        return save_weights(weights_path(self.folder / CHECKPOINTS, step), cpu, step=step, arm=self.arm, recipe={})

    def finish(self, state: str | None = None) -> None:
        """Mark the arm ``finished`` (all ``max_steps`` recorded) or ``failed``; call it once at the end."""
        if not self.is_writer:
            return
        self.status.state = state or ("finished" if self.last_step >= self.max_steps else "failed")
        self.status.last_step = self.last_step
        self.status.write(self.folder)

    def __enter__(self) -> "ArmWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("failed" if exc_type is not None else None)

    def _start(self, start_step: int) -> None:
        previous = ArmStatus.read(self.folder)
        self.loss_file = LossFile(self.folder)
        self.loss_file.truncate_after(start_step)
        for path in (self.folder / CHECKPOINTS).glob("step_*.safetensors"):
            if _step_of(path) is not None and _step_of(path) > start_step:
                path.unlink()
        attempt = previous.attempt + 1 if previous is not None else 1
        self.status = ArmStatus(self.arm, attempt=attempt, start_step=start_step, max_steps=self.max_steps,
                                world_size=world_size(), tensor_order=previous.tensor_order if previous else [])
        self.folder.mkdir(parents=True, exist_ok=True)
        self.status.write(self.folder)


def state_weights(model) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a module's state dict (or of a state dict), by name."""
    state = model if isinstance(model, dict) else model.state_dict()
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}


def global_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def _step_of(path: Path) -> int | None:
    digits = path.name.removeprefix("step_").removesuffix(".safetensors")
    return int(digits) if digits.isdigit() else None
