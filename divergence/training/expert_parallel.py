"""Training an expert-parallel arm (``train.expert_parallel``; the experts' sharding and all-to-all
dispatch: ``divergence.models.expert_parallel``): Lightning's ``ModelParallelStrategy`` with every
rank a data-parallel replica (``training.tensor_parallel.model_parallel_strategy``: its mesh's
``data_parallel`` dimension is the expert-parallel group, each rank reads its slice of the global
batch), and the gradients made the one-process gradient by hand (no DDP: DDP would all-reduce the
experts, which differ from rank to rank).

After every rank's backward of its own loss ``L_r``::

    whole weight (router, attention, norms, embeddings, text encoder):  g <- (1/W) sum_r g_r   (all-reduce)
    expert weight (a DTensor shard, on its rank only):                  g <- g / W

where an expert's ``g`` already holds ``sum_r dL_r/dtheta`` (the all-to-all's backward brought every
rank's share): both are then the gradient of ``(1/W) sum_r L_r``, the global batch's mean loss.
The whole weights' sum is one all-reduce of their concatenated gradients; with W = 2 it is
``g_0 + g_1`` on both ranks (gloo adds the same two numbers), so the replicas stay bitwise equal.
The global gradient norm, clipping, AdamW over DTensor shards and the full weights and moments in
the checkpoints are tensor parallelism's (``divergence.training.tensor_parallel``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Turn each rank's gradients of its own loss into the gradient of the ranks' mean loss (see
    the module docstring). Collective over the default group: every rank calls it once a step."""
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size()
    whole = [p.grad for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
    for p in params:
        if isinstance(p.grad, DTensor):
            p.grad.to_local().div_(world)
    if not whole:
        return
    flat = torch.cat([g.reshape(-1) for g in whole])
    dist.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for g in whole:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
