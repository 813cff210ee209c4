"""A known bug in DDP's gradient all-reduce (``train.inject_bug``), to prove the reordering yardstick.

DDP averages each bucket of gradients over the ranks (a ``torch.distributed`` all-reduce of the
flat bucket divided by the world size, ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks
.allreduce_hook``). The hooks here are that hook with one line wrong:

- ``rank-scale``: rank 1 multiplies its bucket by ``1 + 1e-3`` before the all-reduce, so every
  averaged gradient is ``(g_0 + (1 + 1e-3) g_1) / 2``: a 5e-4 relative error, far below bf16's;
- ``unreduced-param``: the first parameter of bucket 0 keeps its rank's own gradient (its slice of
  the batch only), as a parameter left out of the all-reduce would; rank 0 writes the weights.

Both read like a correct DDP run in the loss; the yardstick must say ``beyond_reordering``
(tests/training/test_separate_pair.py).
"""

from __future__ import annotations

import lightning as L
import torch
import torch.distributed as dist

RANK_SCALE = 1 + 1e-3


class InjectedBug(L.Callback):
    """Register the bug's communication hook on the DDP-wrapped module before the first backward."""

    def __init__(self, kind: str):
        self.kind = kind

    def on_train_start(self, trainer, pl_module) -> None:
        model = trainer.strategy.model
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise RuntimeError(f"train.inject_bug={self.kind} needs DDP; the arm trains {type(model).__name__}")
        model.register_comm_hook(None, rank_scale_hook if self.kind == "rank-scale" else unreduced_param_hook)


def _average(buffer: torch.Tensor) -> torch.futures.Future:
    buffer.div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future()


def rank_scale_hook(state, bucket):  # no annotations: DDP compares them as objects, and this module defers them
    buffer = bucket.buffer()
    if dist.get_rank() == 1:
        buffer.mul_(RANK_SCALE)
    return _average(buffer).then(lambda fut: fut.value()[0])


def unreduced_param_hook(state, bucket):
    buffer = bucket.buffer()
    size = bucket.parameters()[0].numel() if bucket.index() == 0 else 0
    local = buffer[:size].clone()

    def keep_local(fut):
        reduced = fut.value()[0]
        reduced[:size] = local
        return reduced

    return _average(buffer).then(keep_local)
