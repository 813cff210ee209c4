"""Both arms of a tiny model trained by Lightning's ``ModelParallelStrategy`` (FSDP2) on 2 CPU
ranks (gloo), each written by two ``ArmCheckpoints``: ``format="dcp"`` (every rank its shards)
into ``root/dcp`` and the default (gathered to rank zero) into ``root/st``, the oracle.

The processes are started by ``tests.gloo_runs`` (one spawn for every 2-rank run the tests read),
whose process group Lightning takes as its ranks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.checkpoints.dcp_runs import tiny_model

MAX_STEPS, EVERY = 4, 2


def fit_on_rank(root: Path) -> None:
    """This rank's fit of both arms; Lightning takes the process group if one is initialised
    (``tests.gloo_runs``), else starts its own from the launcher's environment."""
    for arm, lr in (("a", 1e-2), ("b", 2e-2)):
        _fit(root, arm, lr)


def _fit(root: Path, arm: str, lr: float) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy

    from divergence.lightning import ArmCheckpoints

    class Sharded(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = tiny_model()

        def configure_model(self):
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in (self.net[0], self.net[1], self.net[3]):
                fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def training_step(self, batch, batch_idx):
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=lr)

    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 10, (8,), generator=g) for _ in range(MAX_STEPS)]  # the same on both ranks
    pair = dict(every=EVERY, name="fsdp-lr", dense=[])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=MAX_STEPS,
        callbacks=[ArmCheckpoints(root / "dcp", arm, format="dcp", **pair), ArmCheckpoints(root / "st", arm, **pair)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(Sharded(), torch.utils.data.DataLoader(batches, batch_size=None))
