"""Variants for parallel training, each mathematically the identity: the arms' ranks only sum in
another order. A pair of them trains each arm as its own multi-process job (``per_process``;
``divergence.training.separate_pair``), on the same global batch, rank r taking its slice
(``divergence.data.batches``), so a correct parallelization differs from its reference only by
the order of fp32 sums, and the reordering yardstick says whether it does (docs/method.md).

- ``data-parallel``: ``NxB``, N DDP ranks of B examples each (``{data-parallel: 1x16}``: one
  process, a batch of 16): the global batch N B either way;
- ``zero-1``: AdamW's state sharded over the DDP ranks (``ZeroRedundancyOptimizer``, ZeRO stage 1);
- ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard`` under Lightning's ModelParallelStrategy,
  ``divergence.models.fully_sharded``) over the data-parallel ranks, ``full`` (FULL_SHARD, ZeRO-3:
  weights gathered again for the backward) or ``grad-op`` (SHARD_GRAD_OP, ZeRO-2: weights kept
  gathered from forward to backward); gloo on a CPU, NCCL on GPUs. After ``{data-parallel: NxB}``
  in the same arm (``Variant.refines``) it shards over those N ranks of B: the layout rides with
  the arm, so a study or an atlas, which rewrites every pair onto its own base, keeps it;
- ``injected-bug``: a known bug in DDP's all-reduce (``rank-scale``: rank 1's gradient times
  1 + 1e-3; ``unreduced-param``: one parameter's gradient left local), for the tests and the docs
  that prove the yardstick tells a bug from a reordering.
"""

from __future__ import annotations

import sys

from divergence.variants.registry import Switch, Variant, one_batch, register

FSDP_SHARDING = {"full": "FULL_SHARD", "grad-op": "SHARD_GRAD_OP"}
BUGS = ("rank-scale", "unreduced-param")


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@register
class DataParallel(Variant):
    name = "data-parallel"
    sets = ("train.devices", "train.batch_size", "train.strategy")
    help = "NxB: N DDP ranks of B examples each (1x16: one process, one batch of 16), the same global batch"
    default = "2x8"
    fp32_equivalent = True  # the same mean gradient over the same examples, the ranks' sums added by the all-reduce
    per_process = True

    def validate(self):
        self.ranks, self.per_rank = self.counts("NxB (ranks x examples each, e.g. 2x8 against 1x16)")

    def overrides(self):
        strategy = "ddp" if self.ranks > 1 else "auto"
        return {"train.devices": self.ranks, "train.batch_size": self.per_rank, "train.strategy": strategy}

    @classmethod
    def as_base(cls, recipe: dict, base: dict) -> dict:
        """The step's examples on one process: N ranks of B read as one batch of N B."""
        return one_batch(recipe, "devices", strategy=base["train"]["strategy"])

    def verify(self, arm):
        train, ranks = arm.recipe.train, _world_size()
        if (train.devices, train.batch_size) != (self.ranks, self.per_rank) or ranks != self.ranks:
            raise RuntimeError(
                f"data-parallel {self.value} but the arm trains {ranks} ranks of {train.batch_size} "
                f"(train.devices={train.devices})"
            )


@register
class Zero1(Switch):
    name = "zero-1"
    sets = ("train.shard_optimizer",)
    help = "AdamW's state sharded over the DDP ranks (torch.distributed.optim.ZeroRedundancyOptimizer, ZeRO-1)"
    fp32_equivalent = True  # each weight's AdamW update, computed on the rank that owns it, then broadcast
    per_process = True

    def verify(self, arm):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        sharded = isinstance(arm.optimizer, ZeroRedundancyOptimizer)
        if sharded != self.value:
            raise RuntimeError(f"zero-1 {self.value} but the arm's optimizer is {type(arm.optimizer).__name__}")


@register
class FSDP(Variant):
    name = "fsdp"
    sets = ("train.strategy", "train.fsdp_sharding")
    help = (
        "FSDP2 (fully_shard) over the data-parallel ranks: full (FULL_SHARD, ZeRO-3) or grad-op "
        "(SHARD_GRAD_OP, ZeRO-2); CPUs (gloo) and GPUs"
    )
    default = "full"
    choices = tuple(FSDP_SHARDING)
    fp32_equivalent = True  # gathered weights, reduce-scattered gradients: the same sums in another order
    per_process = True
    refines = ("train.strategy",)  # after {data-parallel: NxB}: FSDP over its N ranks of B

    def overrides(self):
        return {"train.strategy": "fsdp", "train.fsdp_sharding": FSDP_SHARDING[self.value]}

    def verify(self, arm):
        """Every trained weight a row shard (``Shard(0)``) over the arm's ranks, and every FSDP unit
        freeing its gathered weights after its forward exactly under ``full``."""
        from divergence.models.fully_sharded import reshards_after_forward, sharded_parameters

        train, ranks = arm.recipe.train, _world_size()
        if train.strategy != "fsdp" or train.fsdp_sharding != FSDP_SHARDING[self.value]:
            raise RuntimeError(f"fsdp {self.value} but the arm trains strategy {train.strategy}, {train.fsdp_sharding}")
        trained = {n for n, p in arm.named_parameters() if p.requires_grad}
        sharded = {f"{net}.{n}" for net in ("unet", "text_encoder") for n in sharded_parameters(getattr(arm, net))}
        if ranks > 1 and trained - sharded:
            raise RuntimeError(
                f"fsdp {self.value}: {len(trained - sharded)} trained weights not sharded over {ranks} ranks"
            )
        said = reshards_after_forward(arm)
        if said != {self.value == "full"}:
            raise RuntimeError(f"fsdp {self.value}: the FSDP units reshard after forward: {sorted(said)}")
        print(
            f"fsdp {self.value}: {len(sharded)} weights sharded over {ranks} ranks, "
            f"reshard after forward {self.value == 'full'}",
            file=sys.stderr,
            flush=True,
        )


@register
class InjectedBug(Variant):
    name = "injected-bug"
    sets = ("train.inject_bug",)
    help = (
        "a known bug in DDP's all-reduce (rank-scale: rank 1's gradient x (1 + 1e-3); unreduced-param: one kept local)"
    )
    default = "rank-scale"
    choices = BUGS
    per_process = True
    # claimed, as the buggy code it stands for claims: DDP that should be the identity, so the yardstick
    # must draw "if it should be the identity, look for a bug" (tests/scaleout/test_parallel_rows.py)
    fp32_equivalent = True
