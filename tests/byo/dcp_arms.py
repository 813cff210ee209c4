"""Two arms of a tiny FSDP2-sharded model trained on 2 CPU ranks (gloo), each written twice by
``ArmWriter``: as DCP from every rank (``format="dcp"``, no gather) and, for the oracle, as
safetensors of the same weights gathered to full tensors (``DTensor.full_tensor()``).

    root/dcp/{a,b}/checkpoints/step_NNNNNN.dcp/    ArmWriter(..., format="dcp")
    root/st/{a,b}/checkpoints/step_NNNNNN.safetensors
    root/mismatch/rank<R>.txt                      the one line each rank raised for a step whose
                                                   weights hold other tensors (checked on rank 0)
    root/tied-dcp/{a,b}/, root/tied-st/{a,b}/      a model whose head.weight is wte.weight, one row
                                                   sharded over 2 ranks (rank 1's shard empty), in
                                                   DCP and, gathered, in safetensors

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
        _tied(root, arm, lr)
    _mismatch(root)


def _mismatch(root: Path) -> None:
    """Step 2's weights lack a tensor step 0 had: rank 0 finds it (only it reads the arm's records)
    and every rank must raise its line before the collective DCP save, not wait in it."""
    import torch.distributed as dist

    from divergence.errors import UserInputError
    from divergence.writers import ArmWriter

    writer = ArmWriter(root / "mismatch", "a", format="dcp", max_steps=2, every=2, name="mismatch", dense=[])
    weights = {"w": torch.ones(4, 2), "b": torch.zeros(4)}
    writer.record(0, weights)
    writer.record(1, None, 1.0)
    try:
        writer.record(2, {"w": weights["w"]}, 0.5)
        said = "no error"
    except UserInputError as err:
        said = str(err)
    (root / "mismatch" / f"rank{dist.get_rank()}.txt").write_text(said)


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


class Tied(torch.nn.Module):
    """An output layer tied to a one-row embedding: FSDP2 shards the row to rank 0, rank 1's shard is
    empty (no storage to see the tie by), so the ranks must agree on the tie before DCP's save."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(1, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 1, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tokens):
        return self.head(self.norm(self.wte(tokens)))


def _tied(root: Path, arm: str, lr: float) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from divergence.writers import ArmWriter

    model = Tied()
    fully_shard(model)
    optim = torch.optim.SGD(model.parameters(), lr=lr)
    pair = dict(max_steps=2, every=1, name="fsdp-tied", dense=[])
    sharded = ArmWriter(root / "tied-dcp", arm, format="dcp", **pair)
    gathered = ArmWriter(root / "tied-st", arm, **pair)

    def full():  # the tie kept: one gathered tensor under both names
        state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
        return {**state, "head.weight": state["wte.weight"]}

    sharded.record(0, model)
    gathered.record(0, full())
    for step in (1, 2):
        loss = model(torch.zeros(4, dtype=torch.long)).pow(2).mean() + 1.0
        loss.backward()
        optim.step()
        optim.zero_grad()
        sharded.record(step, model, loss.detach())
        gathered.record(step, full(), loss.detach())
    sharded.finish()
    gathered.finish()
