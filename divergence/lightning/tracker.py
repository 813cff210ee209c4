"""``DivergenceTracker``: the pair's tracker (``divergence.tracking.pair_tracker``) driven by a Trainer's hooks.

The one Lightning callback of a pair trained in one process: the built-in trainer's and
``LockstepPair``'s. ``losses(pl_module)``: each arm's loss of the step, averaged over ranks;
``weights(pl_module)``: both arms' ``{name: tensor}`` on rank zero, None elsewhere (every rank calls
it at a tracked step, so it may gather shards). A callback's ``on_train_batch_end`` runs before the
module's and before the checkpoint callbacks Lightning orders last, so a checkpoint written at a
step holds the spike detectors (the callback's state) after that step.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch
from lightning.pytorch.callbacks import Callback

from divergence.lightning.gather import max_steps
from divergence.tracking.pair_tracker import PairTracker


class DivergenceTracker(Callback):
    """Records ``losses(pl_module)`` at every step and compares ``weights(pl_module)`` at tracked steps."""

    def __init__(
        self,
        tracker: PairTracker,
        *,
        losses: Callable[[object], dict[str, float]],
        weights: Callable[[object], tuple[dict, dict] | None],
    ):
        self.tracker, self.losses, self.weights = tracker, losses, weights

    def on_train_start(self, trainer, pl_module) -> None:
        # the ranks as the tracker takes them: rank zero, and the strategy's broadcast
        ranks = SimpleNamespace(is_zero=trainer.is_global_zero, broadcast=trainer.strategy.broadcast)
        weights = lambda: self.weights(pl_module)  # noqa: E731
        self.tracker.start(trainer.global_step, max_steps(trainer), weights, ranks, trainer.loggers)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.tracker.record(trainer.global_step, self.losses(pl_module), lambda: self.weights(pl_module))

    def on_train_end(self, trainer, pl_module) -> None:
        self.tracker.finish()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.tracker.release()  # a failed or interrupted fit drops the folder's lock

    def state_dict(self) -> dict:
        return self.tracker.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.tracker.load_state_dict(state_dict)


def mean_over_ranks(trainer, losses: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each arm's loss averaged over all ranks, in one all-reduce (the identity on one process): what the
    tracker, the loggers and the arm journals get, the same numbers on every rank."""
    local = torch.stack([loss.detach().float() for loss in losses.values()])
    return dict(zip(losses, trainer.strategy.reduce(local, reduce_op="mean").tolist()))
