"""Training a tensor-parallel arm (``train.tensor_parallel``; the sharding plan is
``divergence.models.tensor_parallel``): Lightning's ``ModelParallelStrategy`` with every rank in one
tensor-parallel group, the data-parallel rank each process reads its batch slice by, the global
gradient norm over sharded and whole gradients, and the full weights and AdamW moments gathered
from the shards (what the weights files and the resumable checkpoint hold: plain tensors under the
1-rank names, so the comparator matches them and the checkpoint loads weights-only).
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import ModelParallelStrategy


def full_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each DTensor gathered into its full tensor (collective: every rank of its mesh
    calls it, in the same order), plain tensors as they are."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over parameters some of which are DTensors: the global
    2-norm ``sqrt(sum_p ||g_p||^2)`` with each sharded gradient's norm over its full tensor, then
    every gradient scaled by ``min(1, max_norm / (norm + 1e-6))`` as torch does. Returns the norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    norms = [g.norm(2.0) for g in grads]  # a DTensor's norm: a replicated DTensor over its mesh
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient.to(g.device))
    return total


def model_parallel_strategy(train):
    """Lightning's ``ModelParallelStrategy`` for ``train.tensor_parallel`` ranks in one tensor-parallel
    group (no data-parallel dimension), or, under ``train.expert_parallel``, every rank a data-parallel
    replica (``divergence.training.expert_parallel``); its resumable checkpoint gathered into one file
    on rank zero, and resumed by ``FullCheckpointStrategy``."""
    replicas = train.devices * train.num_nodes // train.tensor_parallel
    return FullCheckpointStrategy(
        data_parallel_size=replicas, tensor_parallel_size=train.tensor_parallel, save_distributed_checkpoint=False
    )


class FullCheckpointStrategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` resuming from its one-file checkpoint through the run's checkpoint IO
    (``AtomicCheckpointIO``: weights-only, the allow-list checked): the full weights loaded into the
    shards (Lightning's ``_load_raw_module_state``), the checkpoint returned whole for the module's
    ``on_load_checkpoint``, which restores each arm's optimizer. Lightning's own loader fails on the
    optimizer it holds (``StepCounter``: no state, so its state dict has no entry to rekey)."""

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        from lightning.fabric.strategies.model_parallel import _load_raw_module_state

        path = self.broadcast(checkpoint_path)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        _load_raw_module_state(checkpoint["state_dict"], self.model, strict=self.lightning_module.strict_loading)
        return checkpoint


def data_parallel(trainer) -> tuple[int, int]:
    """``(rank, replicas)`` of this process among the data-parallel replicas: ``(global_rank,
    world_size)`` under DDP or FSDP, ``(0, 1)`` for the ranks of one tensor-parallel group, which
    all take the same examples (Lightning's ``distributed_sampler_kwargs``)."""
    kwargs = getattr(trainer.strategy, "distributed_sampler_kwargs", None) or {}
    return kwargs.get("rank", trainer.global_rank), kwargs.get("num_replicas", trainer.world_size)


def full_optimizer_state(state: dict) -> dict:
    """An optimizer's ``state_dict()`` with every DTensor state (AdamW's moments of a sharded weight)
    gathered into its full tensor (collective: every rank calls it), so the resumable checkpoint holds
    plain tensors only (loaded weights-only) and reads the same as a 1-rank arm's."""
    return {**state, "state": {i: full_tensors(s) for i, s in state["state"].items()}}


def shard_optimizer_state(optimizer) -> None:
    """After ``optimizer.load_state_dict`` of a ``full_optimizer_state``: each state tensor of a DTensor
    parameter redistributed as that parameter is (its shard of the full tensor on this rank)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for param, state in optimizer.state.items():
        if not isinstance(param, DTensor):
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.shape == param.shape:
                state[key] = distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
