"""Training an arm whose weights are DTensors: tensor parallel (``train.tensor_parallel``; the plan
is ``divergence.models.tensor_parallel``) or fully sharded data parallel (FSDP2, ``train.strategy:
fsdp`` with ``train.fsdp_sharding``; ``divergence.models.fully_sharded``). Lightning's
``ModelParallelStrategy`` with every rank in one tensor-parallel group or in one data-parallel
group, the data-parallel rank each process reads its batch slice by, the global gradient norm over
sharded and whole gradients, and the full weights and AdamW moments gathered from the shards (what
the weights files and the resumable checkpoint hold: plain tensors under the 1-rank names, so the
comparator matches them and the checkpoint loads weights-only).
"""

from __future__ import annotations

import torch


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
    if grads and all(isinstance(g, DTensor) for g in grads) and len({g.device_mesh for g in grads}) == 1:
        return _clip_sharded(params, grads, max_norm)
    norms = [g.norm(2.0) for g in grads]  # a DTensor's norm: a replicated DTensor over its mesh
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient.to(g.device))
    return total


def _clip_sharded(params: list[torch.nn.Parameter], grads: list, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm`` when every gradient is a DTensor on one mesh (FSDP2): torch's own total
    norm over them (``sqrt(sum_p ||g_p||^2)``, each shard's norm computed locally) completed by one
    collective instead of one a parameter, then torch's clipping by it (torchtitan's recipe)."""
    from torch.distributed.tensor import DTensor

    total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    total = total.full_tensor() if isinstance(total, DTensor) else total
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


def model_parallel(train) -> bool:
    """Whether the arm of ``train`` (a ``TrainConfig``) holds DTensor weights and trains under
    ``model_parallel_strategy``: tensor parallel, FSDP2 (``fsdp_sharding`` set; ``train.strategy:
    fsdp`` without it is Lightning's ``FSDPStrategy``), or experts over the ranks
    (``train.expert_parallel``, ``divergence.training.expert_parallel``)."""
    return train.tensor_parallel > 1 or train.fsdp_sharding is not None or train.expert_parallel > 1


def model_parallel_strategy(train):
    """Lightning's ``ModelParallelStrategy`` for ``train``: its ranks in one tensor-parallel group
    (``train.tensor_parallel``), or in one data-parallel group that FSDP2 or the experts shard over
    (each rank its slice of the batch); its resumable checkpoint gathered into one file on rank zero, from which it
    resumes (``divergence.training.sharded_strategy``)."""
    from divergence.training.sharded_strategy import ArmsModelParallelStrategy

    world, tensor = train.devices * train.num_nodes, train.tensor_parallel
    return ArmsModelParallelStrategy(
        data_parallel_size=world // tensor, tensor_parallel_size=tensor, save_distributed_checkpoint=False
    )


def data_parallel(trainer) -> tuple[int, int]:
    """``(rank, replicas)`` of this process among the data-parallel replicas: ``(global_rank,
    world_size)`` under DDP or FSDP (FSDP2: its data-parallel mesh), ``(0, 1)`` for the ranks of one
    tensor-parallel group, which all take the same examples (Lightning's ``distributed_sampler_kwargs``)."""
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
