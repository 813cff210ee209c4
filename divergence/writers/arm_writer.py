"""``ArmWriter``: one arm's side of the pair folder, from any training loop.

::

    writer = divergence.ArmWriter("runs/flash-vs-sdpa", "a", max_steps=1000, every=50)
    writer.record(0, model)                      # the initial weights
    for step in range(1, 1001):
        loss = train_one_step(model)
        writer.record(step, model, loss)         # the loss; the weights at tracked steps
    writer.finish()

A loop that does not know its length (epochs over a stream, an early stop) leaves ``max_steps``
out: ``ArmWriter(out, "a")``. The last step is then the one recorded last when ``finish()`` is
called: ``finish`` saves its weights (the model last given to ``record``, or ``finish(model=...)``)
and ``divergence watch`` ends the pair there (``pair.json``'s ``max_steps`` is null until then).
A loop told its length that stops early on purpose (EarlyStopping, a loss target) calls
``finish("finished")``: the arm ends at the step reached, its weights saved there, and ``watch``
ends the pair there once both arms finished at it.

Arm ``b`` runs the same loop (another process, another machine) into the same folder, and
``divergence watch runs/flash-vs-sdpa`` builds the pair's metrics store as both go.

What it writes (``docs/pair-folder.md``): ``<out>/<arm>/losses.jsonl`` (one line per step),
``<out>/<arm>/checkpoints/step_NNNNNN.safetensors`` at the tracked steps (step 0, every
``every`` steps, the last: ``divergence.pairfolder.settings.is_tracked``), each file written
under a temporary name and renamed, and ``<out>/<arm>/status.json``. The first arm to start
writes ``<out>/pair.json`` when it is missing.

Step ``N`` is the state after ``N`` optimizer steps; ``record(N, model, loss)`` takes the loss
of the N-th step. Only the process of global rank 0 writes (``RANK`` in the environment, or
``torch.distributed``); the others may call every method, and nothing happens. Under FSDP,
gather the full state dict yourself (every rank) and pass it as ``model``, or write DCP:

``format="dcp"`` writes each tracked step as ``checkpoints/step_NNNNNN.dcp/``, a
``torch.distributed.checkpoint`` folder, from every rank: each rank saves its own shards of the
(sharded) state dict, nothing is gathered; rank 0 marks the folder complete once all ranks have
written (``divergence.pairfolder.arm.weights_dcp``). Every rank then calls ``record`` (and ``finish``)
with its model: a tracked step is a collective. Without a process group it is one process's save.

Restarted from a checkpoint at step G, pass ``start_step=G``: the losses and weights files
after G are removed (the arm computes them again) and ``status.json`` counts a new attempt,
which ``divergence watch`` follows. Started at step 0 into an arm folder that already holds
later records (a re-run), it refuses, unless ``resume=True`` says to train the arm again from
step 0 (its records are then replaced).

What is checked: the step rules every arm writer shares (``docs/pair-folder.md``, "The step
rules every arm writer checks"; ``divergence.pairfolder.arm``); the arm's lock is refused
naming the holder's pid (a crashed writer's lock is released by the OS). A refusal is a
``ScriptError`` (``divergence.errors``): uncaught, the script ends with its one line, no traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from divergence.errors import UserInputError, check_int, in_script
from divergence.pairfolder import ARMS
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.arm import (
    ArmJournal,
    ArmLock,
    check_loss,
    check_step,
    check_stride,
    claim_arm_folder,
    loss_value,
    save_dcp,
    save_weights,
    tracked_with_stride,
)
from divergence.pairfolder.arm.weights_dcp import remove_weights
from divergence.pairfolder.arm.weights_file import completed
from divergence.pairfolder.pair_json import (
    DEFAULT_EVERY,
    check_pair_files,
    schedule_config,
    tracking_schedule,
    write_pair_files,
)
from divergence.pairfolder.settings import DENSE_DEFAULT, is_tracked
from divergence.writers.every_rank import on_every_rank


WEIGHTS_FORMATS = ("safetensors", "dcp")


class ArmWriter:
    """Write arm ``arm`` (``"a"`` or ``"b"``) of the pair folder ``out``.

    Parameters
    ----------
    out : the pair folder both arms write into.
    arm : ``"a"`` or ``"b"``.
    max_steps : the arm's number of optimizer steps (both arms the same); None (default): not
        known in advance, the last step is the one recorded when ``finish()`` is called.
    every : compare the arms' weights every ``every`` steps (and at step 0 and the last).
    start_step : the step this process resumes from (0 for a fresh start).
    resume : continue an arm folder that holds records of later steps from ``start_step`` 0
        (they are replaced); ``start_step > 0`` is a resume by itself.
    stride : the step counter moves by ``stride`` per record (default 1); recorded steps are
        0, stride, 2 stride, ... (``ArmCheckpoints`` sets it for a manual-optimization module
        with several optimizers, whose steps Lightning counts one by one).
    weights : ``model -> {name: tensor}``; default: the floating-point entries of
        ``model.state_dict()`` (``model`` may also be such a dict already).
    rank : this process's global rank; default from ``torch.distributed`` or ``$RANK``.
    format : ``"safetensors"`` (default: rank 0 writes ``step_NNNNNN.safetensors`` of the weights it
        is given) or ``"dcp"`` (every rank writes its shards into ``step_NNNNNN.dcp/``).
    global_batch : examples per optimizer step over all ranks (batch size x ranks x accumulation),
        in ``status.json``; given by both arms, ``divergence watch`` compares it instead of the
        world sizes (2 ranks x batch 2 and 1 rank x batch 4 are one pair).
    name, category, arms, description, replicate, spike_factor, spike_window, dense, log, keep,
    start, expect_identity : ``pair.json`` when this arm writes it: ``write_pair_files`` says what
        each is (None: its default; ``keep`` both arms the same). A folder whose ``pair.json``
        differs in a given ``name``, ``category``, ``arms`` or ``replicate`` is refused (another pair).
    records : False: the weights files alone, no ``losses.jsonl``, ``status.json``, ``pair.json`` or
        lock (the built-in trainer's single run and lockstep arms, whose losses its tracker keeps);
        ``arm`` may then be ``""``, the folder ``out`` itself.
    label, recipe : the ``arm`` name (default ``arm``) and the recipe (default ``{}``) in each
        weights file's metadata.
    checkpoint_every : also save the weights every ``checkpoint_every`` steps (0: not); the built-in
        trainer's ``train.checkpoint_every``, which its ``pair.json`` makes compared steps.
    locked : True: the caller holds the arm's lock (an ``ArmLock``, or a ``PairLock`` on the pair) for
        this writer's life, so it takes none.
    """

    how_to_resume = "pass start_step=G, the step of the checkpoint this process resumes from"

    @in_script
    def __init__(
        self,
        out: str | Path,
        arm: str,
        *,
        max_steps: int | None = None,
        every: int = DEFAULT_EVERY,
        start_step: int = 0,
        resume: bool = False,
        stride: int = 1,
        weights: Callable | None = None,
        rank: int | None = None,
        global_batch: int | None = None,
        format: str = "safetensors",
        name: str | None = None,
        category: str | None = None,
        arms: dict | None = None,
        description: str | None = None,
        replicate: int | None = None,
        spike_factor: float | None = None,
        spike_window: int | None = None,
        dense: list | tuple | None = None,
        log: dict | None = None,
        keep: int | None = None,
        start: str | None = None,
        expect_identity: bool | None = None,
        records: bool = True,
        label: str | None = None,
        recipe: dict | None = None,
        checkpoint_every: int = 0,
        locked: bool = False,
    ):
        pair = dict(name=name, category=category, arms=arms, description=description, replicate=replicate)
        pair.update(spike_factor=spike_factor, spike_window=spike_window, dense=dense, log=log, keep=keep)
        pair = {k: v for k, v in dict(pair, start=start, expect_identity=expect_identity).items() if v is not None}
        if format not in WEIGHTS_FORMATS:
            raise UserInputError(f"ArmWriter(format={format!r}): must be one of {', '.join(WEIGHTS_FORMATS)}")
        self.dcp = format == "dcp"  # every rank saves its shards at tracked steps
        if arm not in ARMS and (records or arm != ""):
            raise UserInputError(f"arm={arm!r}: must be one of {', '.join(ARMS)}")
        why = ", or None (the last step is the one recorded when finish() is called)"
        check_int(max_steps, "max_steps", 1, why, optional=True)
        self.out, self.arm, self.max_steps, self.every = Path(out), arm, max_steps, every
        self.pair_folder = as_pair_folder(out)
        self.arm_folder = self.pair_folder.arm(arm)
        self.weights = weights or state_weights
        self.rank = _distributed("rank") if rank is None else rank
        self.records, self.label, self.recipe, self.locked = records, label or arm, recipe or {}, locked
        self.lock: ArmLock | None = None
        self.opened = self.is_writer and not records  # rank 0 writes until ``finish``
        why = ", the examples of one optimizer step over all ranks (batch size x ranks x accumulation), or None"
        self.global_batch = check_int(global_batch, "global_batch", 1, why, optional=True)
        self.schedule = schedule_config(tracking_schedule(every, dense=pair.get("dense", DENSE_DEFAULT)))
        self.checkpoint_every = checkpoint_every
        self.stride = check_stride(stride, max_steps, "ArmWriter")
        start_step = check_step(start_step, expected=start_step, max_steps=max_steps, where="ArmWriter(start_step=...)")
        if start_step % self.stride:
            raise UserInputError(f"ArmWriter: start_step={start_step} is not a multiple of stride={self.stride}")
        # status, losses, steps
        self.journal = ArmJournal(self.arm_folder, arm, max_steps=max_steps, stride=self.stride)
        self.journal.resume_at(start_step, initial=start_step == 0)  # a fresh start records step 0 first
        self.saved_step: int | None = None  # the step whose weights ``save`` wrote last
        self.last_model: tuple | None = None  # (step, model) given to ``record`` last: ``finish`` saves its last step
        if self.is_writer and records:
            self._open(start_step, resume, stride, pair)

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    @property
    def status(self):
        """The arm's ``ArmStatus`` as written to ``status.json`` (rank zero; None elsewhere)."""
        return self.journal.status

    @property
    def last_step(self) -> int:
        """The step recorded last (or resumed from)."""
        return self.journal.last_step

    @property
    def next_step(self) -> int:
        """The step ``record`` takes next."""
        return self.journal.next_step

    def tracked(self, step: int) -> bool:
        """Whether the weights of ``step`` are saved (and compared)."""
        every = self.checkpoint_every
        return tracked_with_stride(step, self.stride, lambda t: is_tracked(t, self.max_steps, self.schedule, every))

    @in_script
    def record(self, step: int, model=None, loss=None, router_drop: float | None = None) -> None:
        """The loss of optimizer step ``step`` (none at step 0) and, at tracked steps, ``model``'s weights.

        Steps come in order, each once: 0 (the initial weights), then 1, 2, ... ``max_steps``
        (every ``stride``-th), or from ``start_step + 1`` after a restart. Checked on every rank
        (the same steps everywhere, so every rank stops alike); only rank 0 writes. ``router_drop``:
        the step's capacity-drop fraction of an arm with experts, written beside the loss.
        """
        where = f"ArmWriter.record({step!r}, ...)"
        step = self.check(step, where)
        value = None
        if step > 0:
            check_loss(loss, where)  # None too: "give the step's loss"
            value = loss_value(loss, where) if self.opened and self.records else None  # a device sync: where written
        if self.is_writer or self.dcp:  # DCP: every rank saves its shards
            if model is not None:
                self.last_model = (step, model)
            if self.tracked(step) and self.saved_step != step:
                if model is None:
                    raise UserInputError(f"{where}: step {step} is tracked; give the model (or its state dict)")
                self.save(step, self.weights(model))
            if value is not None:
                self.journal.append(step, value, where, router_drop=router_drop)
        self.journal.advance(step)

    @in_script
    def check(self, step, where: str | None = None) -> int:
        """``step`` when it is the one ``record`` takes next (the step rules: ``docs/pair-folder.md``), else a one-line error."""
        return self.journal.check(step, where)

    @in_script
    def save(self, step: int, tensors: dict) -> Path:
        """Write the weights file of ``step`` (atomically; any device, copied to the CPU); with
        ``format="dcp"`` every rank's shards into the step's DCP folder (a collective)."""
        check = (lambda: self.journal.check_tensors(tensors, step)) if self.opened and self.records else (lambda: None)
        if self.dcp:
            on_every_rank(check)  # every rank stops before the collective save, not rank zero alone
        else:
            check()
        self.saved_step = step
        if self.is_writer:  # the other format's entry of the step (an earlier attempt's) would shadow this one
            remove_weights(self.arm_folder.weights(step) if self.dcp else self.arm_folder.weights_dcp(step))
        if self.dcp:
            return save_dcp(self.arm_folder.weights_dcp(step), tensors, step=step, arm=self.arm, writer=self.is_writer)
        # a tied tensor (wte / lm_head) is saved once, its other names in the file (checkpoints.tied)
        return save_weights(self.arm_folder.weights(step), tensors, step=step, arm=self.label, recipe=self.recipe)

    @in_script
    def checkpointed(self, step: int) -> None:
        """Say that a resumable checkpoint of ``step`` (a recorded step) is saved: a restart resumes
        there or later. With ``tracking.keep``, ``divergence watch`` deletes no compared weights file
        of a step after both arms' newest checkpoints, since a restart from one recomputes those steps
        and they are compared again; call it after each checkpoint is written. Until the first call
        the arm's start counts (step 0, or ``start_step``)."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self.last_step:
            raise UserInputError(
                f"ArmWriter.checkpointed({step!r}): give the step of the checkpoint saved, an integer from 0 "
                f"to {self.last_step} (the step recorded last)"
            )
        if self.opened and self.records:
            self.journal.checkpointed(step)

    @in_script
    def finish(self, state: str | None = None, model=None) -> None:
        """Mark the arm ``finished`` or ``failed``; call it once at the end.

        Without ``state``: ``finished`` when every step was recorded (all ``max_steps``; without
        ``max_steps``, any step after 0), else ``failed``. ``finish("finished")`` before ``max_steps``
        is an early stop (EarlyStopping, a loss target): the arm ends at the step reached, and
        ``divergence watch`` ends the pair there once both arms finished there.

        An arm that finishes is compared at its last step, whose weights are saved here when the
        schedule did not: ``model``'s, else what ``record`` was given at that step, else the module
        last given to ``record`` (its weights as they are now: call ``finish`` right after the last
        ``record``); a state dict given at an earlier step may be a stale copy, so it is refused.
        It also releases the arm's lock: another process may write the arm after it.
        """
        state = state or ("finished" if self.last_step >= (self.max_steps or 1) else "failed")
        if self.dcp and not self.is_writer and state == "finished" and self.last_step > 0:
            self._save_last(model)  # the collective save of the last step, as rank 0 does below
        if not self.opened:
            return
        try:
            if state == "finished" and self.last_step > 0:
                self._save_last(model)
        except BaseException:
            self._end("failed")
            raise
        self._end(state)

    def _end(self, state: str) -> None:
        """Rank 0: ``status.json`` says ``state``; the arm's lock released (another process may write it)."""
        self.opened = False
        if self.records:
            self.journal.end(state, self.last_step)
        if self.lock is not None:
            self.lock.release()

    def _save_last(self, model) -> None:
        """A finished arm's last step is a compared one: its weights file, if not written yet."""
        step = self.last_step
        if self.saved_step == step or (self.saved_step is None and self._complete(step)):
            return  # saved by the schedule (or, after a restart at this very step, by the earlier attempt)
        if model is None and self.last_model is not None:
            given_at, given = self.last_model
            model = given if given_at == step or isinstance(given, torch.nn.Module) else None
        if model is None:
            raise UserInputError(
                f"ArmWriter.finish(): the last step {step} is compared but no model was given to record it; "
                "call finish(model=...) with the model (or its state dict)"
            )
        self.save(step, self.weights(model))

    def _complete(self, step: int) -> bool:
        """The weights of ``step`` are there and complete: an earlier attempt killed while it saved them
        (a DCP folder without its ``complete.json``, a file cut short) left them to be written again."""
        try:
            return completed(self.arm_folder.saved_weights(step), step, arm=self.arm) is not None
        except UserInputError:  # not written by an arm writer, or another arm's: written again
            return False

    def __enter__(self) -> "ArmWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("failed" if exc_type is not None else None)

    def _open(self, start_step: int, resume: bool, stride: int, pair: dict) -> None:
        """Rank 0: check the folder (reading only), take the arm's lock, then write."""
        saved = check_pair_files(self.pair_folder, max_steps=self.max_steps, every=self.every, stride=stride, **pair)
        self.lock = None if self.locked else ArmLock(self.arm_folder)  # the lock creates the folder
        try:
            self.arm_folder.path.mkdir(parents=True, exist_ok=True)
            claim_arm_folder(self.arm_folder, self.arm, start_step, resume, self.how_to_resume)
            if saved is None:
                saved = write_pair_files(
                    self.pair_folder, max_steps=self.max_steps, every=self.every, stride=stride, **pair
                )
            self.schedule = schedule_config(saved.get("tracking") or {"every": self.every})
            self.journal.start(start_step, world_size=_distributed("world_size"), global_batch=self.global_batch)
            self.opened = True
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise


def state_weights(model) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a module's state dict (or of a state dict), by name."""
    state = model if isinstance(model, dict) else model.state_dict()
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}


def _distributed(what: str) -> int:
    """This process's ``rank`` or the ``world_size``: from ``torch.distributed``, else ``$RANK`` or
    ``$WORLD_SIZE`` (default 0 and 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return getattr(torch.distributed, f"get_{what}")()
    return int(os.environ.get(what.upper(), 0 if what == "rank" else 1))
