"""Two arms of a tiny FSDP2-sharded model trained on 2 CPU ranks (gloo), each written twice by
``ArmWriter``: as DCP from every rank (``format="dcp"``, no gather) and, for the oracle, as
safetensors of the same weights gathered to full tensors (``DTensor.full_tensor()``).

    root/dcp/{a,b}/checkpoints/step_NNNNNN.dcp/    ArmWriter(..., format="dcp")
    root/st/{a,b}/checkpoints/step_NNNNNN.safetensors

The model is ``tests.checkpoints.dcp_runs.tiny_model`` (uneven row shards, a BatchNorm's
replicated buffers); both ranks train on the same batches, so the replicated buffers agree.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.checkpoints.dcp_runs import tiny_model

MAX_STEPS, EVERY = 4, 2


def write_on_rank(root: Path) -> None:
    """This rank's part of both arms, in a process group already initialised (``tests.gloo_runs``)."""
    for arm, lr in (("a", 1e-2), ("b", 2e-2)):
        _train(root, arm, lr)


def _train(root: Path, arm: str, lr: float) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from divergence.writers import ArmWriter

    model = tiny_model()
    for layer in (model[0], model[1], model[3]):
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.Adam(model.parameters(), lr=lr)
    pair = dict(max_steps=MAX_STEPS, every=EVERY, name="fsdp-lr", dense=[])
    sharded = ArmWriter(root / "dcp", arm, format="dcp", **pair)
    gathered = ArmWriter(root / "st", arm, **pair)

    def full():  # every rank (a collective); rank 0's writer saves it
        return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}

    sharded.record(0, model)
    gathered.record(0, full())
    g = torch.Generator().manual_seed(1)
    for step in range(1, MAX_STEPS + 1):
        tokens = torch.randint(0, 10, (8,), generator=g)
        loss = model(tokens).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        sharded.record(step, model, loss.detach())
        gathered.record(step, full(), loss.detach())
    sharded.finish()
    gathered.finish()
