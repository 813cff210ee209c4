"""``Pair``: both arms of a pair trained in one plain PyTorch loop, their weights compared in memory.

::

    pair = divergence.Pair("runs/bf16-vs-fp32", model_a, model_b, max_steps=100, every=10,
                           name="bf16-vs-fp32", category="precision")
    with pair:                                    # step 0 (the initial weights) is recorded here
        for step in range(1, 101):
            loss_a, loss_b = train_step(model_a, batch), train_step(model_b, batch)
            pair.record(step, loss_a, loss_b)     # the losses; the weights compared at tracked steps

No Lightning, no second process and no weights files: at step 0, every ``every`` steps (and the
denser early schedule) and the last step the two models' floating-point state-dict entries are
compared where they are, and ``out`` gets ``pair.json`` and ``metrics.jsonl`` with the records
``LockstepPair`` and ``divergence watch`` write (the tracker is ``LockstepPair``'s,
``divergence.tracking.pair_tracker``). ``divergence report`` and ``export`` read the folder.

Your loop is the lockstep: give both models the same batch and the same random draws (noise,
dropout) at each step, so that the one change under study is the only difference between them.
It is one process's writer: under ``torchrun``, use ``LockstepPair`` or an ``ArmWriter`` per arm.

Restarting: a loop resumed from its own checkpoint at step G passes ``start_step=G``; the stored
steps after G are dropped (the loop computes them again), the steps up to G are kept, and the
loss-spike detectors are rebuilt from the stored losses (they saw exactly those), so the store is
the one an uninterrupted run writes. A fresh start (``start_step=0``) into a folder whose store
already holds steps is refused, unless ``resume=True`` says to train the pair again from step 0
(its stored steps are then replaced). One process writes a folder at a time: a second writer is
refused naming the holder's pid. A refusal is a ``ScriptError`` (``divergence.errors``): uncaught,
the script ends with its one line.
"""

from __future__ import annotations

from pathlib import Path

from divergence.errors import UserInputError, in_script
from divergence.pairfolder.arm.steps import check_step, loss_value
from divergence.pairfolder.pair_json import DEFAULT_EVERY
from divergence.tracking.pair_tracker import PairTracker
from divergence.writers.arm_writer import state_weights

RESTART_ADVICE = (
    "To continue it, pass Pair(..., start_step=G), G the step your loop resumes from; to train it again "
    "from step 0, pass Pair(..., resume=True)"
)


class Pair:
    """Track ``model_a`` against ``model_b``, trained side by side in one process, into ``out``.

    Parameters
    ----------
    out : the pair folder (``pair.json``, ``metrics.jsonl``).
    model_a, model_b : the two arms (modules, or anything with a ``state_dict()``), built with the
        same architecture so their weights match by name.
    max_steps : the number of optimizer steps (the last is compared and ends the pair).
    every : compare the weights every ``every`` steps (and at step 0 and the last).
    start_step : the step the loop resumes from (0: a fresh start, step 0 recorded now).
    resume : train the pair again from step 0 into a folder whose store holds its steps.
    name, category, arms, description, replicate, expect_identity : ``pair.json``'s fields
        (``docs/pair-folder.md``); None: ``pair.json``'s default (the folder's name, an optimization).
    dense : the early schedule on top of ``every`` (``[[until, every], ...]``; default every step to
        20 and every 5th to 100; ``[]``: off).
    """

    @in_script
    def __init__(
        self,
        out: str | Path,
        model_a,
        model_b,
        *,
        max_steps: int,
        every: int = DEFAULT_EVERY,
        start_step: int = 0,
        resume: bool = False,
        name: str | None = None,
        category: str | None = None,
        arms: dict | None = None,
        description: str | None = None,
        replicate: int | None = None,
        expect_identity: bool | None = None,
        dense: list | None = None,
    ):
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise UserInputError(f"Pair(max_steps={max_steps!r}): must be an integer >= 1")
        if model_a is model_b:
            raise UserInputError(
                "Pair: model_a and model_b are the same object; build two models (a control pair is two "
                "copies built from the same seed)"
            )
        start_step = check_step(start_step, expected=start_step, max_steps=max_steps, where="Pair(start_step=...)")
        given = dict(name=name, category=category, arms=arms, description=description, replicate=replicate)
        pair = {k: v for k, v in dict(given, dense=dense, expect_identity=expect_identity).items() if v is not None}
        self.models = (model_a, model_b)
        self.max_steps, self.next_step = max_steps, start_step + 1
        self.tracker = PairTracker.of_pair(out, every, pair, resume=resume, restart_advice=RESTART_ADVICE)
        self.out = self.tracker.out
        self.tracker.start(start_step, max_steps, self._weights)
        if start_step > 0:
            self._continue(start_step)

    def _continue(self, start_step: int) -> None:
        """A restart at ``start_step``: the store must hold it (else the steps between would be missing);
        the spike detectors are rebuilt from the stored losses."""
        last = self.tracker.recorder.store.last_step()
        if last is None or last < start_step:
            self.close()
            held = "no steps" if last is None else f"steps 0 to {last}"
            raise UserInputError(
                f"Pair(start_step={start_step}): {self.out} holds {held}, so the steps up to {start_step} would be "
                "missing; resume the loop from a checkpoint at a stored step, or start the pair again (start_step=0, "
                "resume=True)"
            )
        self.tracker.recorder.replay()

    def _weights(self) -> tuple[dict, dict]:
        return state_weights(self.models[0]), state_weights(self.models[1])

    def tracked(self, step: int) -> bool:
        """Whether the weights are compared at ``step``."""
        return self.tracker.tracked(step)

    @in_script
    def record(self, step: int, loss_a, loss_b) -> None:
        """Optimizer step ``step``'s two losses (floats or one-element tensors) and, at a tracked step,
        the comparison of the two models' weights as they are now. Steps come in order, each once:
        1, 2, ... ``max_steps`` (or from ``start_step + 1``). A NaN or infinite loss is recorded, then
        stops the pair (a ``ScriptError`` naming the arm, its loss and the step)."""
        where = f"Pair.record({step!r}, ...)"
        if self.tracker.lock is None:
            raise UserInputError(f"{where}: the pair has finished ({self.out}); start a new Pair to record more")
        step = check_step(step, expected=self.next_step, max_steps=self.max_steps, where=where)
        losses = {"a": loss_value(loss_a, f"{where} loss_a"), "b": loss_value(loss_b, f"{where} loss_b")}
        self.next_step = step + 1
        self.tracker.record(step, losses, self._weights)
        self.tracker.stop_if_diverged(step, losses)

    def finish(self) -> None:
        """``pair.json`` says the last stored step and whether the pair is complete (it reached
        ``max_steps``); the folder's lock is dropped. Called again, it does nothing."""
        if self.tracker.lock is not None:
            self.tracker.finish()

    def close(self) -> None:
        """Drop the folder's lock without finishing the pair (a loop that failed or stopped)."""
        self.tracker.release()

    def __enter__(self) -> "Pair":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """On an exception the lock is dropped and the pair left unfinished (a restart continues it)."""
        if exc_type is None:
            self.finish()
        else:
            self.close()
