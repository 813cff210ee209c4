"""Tensor parallelism of the DiT (``train.tensor_parallel``): Megatron-style sharding of each
transformer block's attention and MLP linears over the ranks of a device mesh.

In every block (Shoeybi et al. 2019, "Megatron-LM", section 3; PyTorch's
``torch.distributed.tensor.parallel``)::

    attention:  q, k, v = x W_q, x W_k, x W_v      W_{q,k,v} split by output column (ColwiseParallel):
                                                  rank r holds heads [r H/t, (r+1) H/t)
                o = softmax(q k^T / sqrt d) v       per head, on the rank's own heads only
                y = o W_o + b_o                     W_o split by input row (RowwiseParallel): each rank
                                                  adds its heads' share, one all-reduce sums them
    MLP:        y = gelu(x W_1 + b_1) W_2 + b_2     W_1 column-, W_2 row-sharded: one all-reduce

so the forward is the 1-rank forward with the output projection's sums over heads (and the MLP's
over hidden units) split into t partial sums added by an all-reduce, and the backward likewise:
mathematically the identity, numerically a reordering of fp32 sums. Every other weight (norms,
embeddings, adaLN, the text encoder) stays whole on every rank, its gradient computed from the same
replicated activations. Every rank sees the same batch (one data-parallel replica; the data
loader's rank and size come from the strategy, ``ModelParallelStrategy.distributed_sampler_kwargs``).

The weights written are the full tensors under the 1-rank names (``DTensor.full_tensor``,
``divergence.training.callbacks.weight_checkpoints``), so the comparator matches them one to one.
"""

from __future__ import annotations

import torch

from divergence.errors import RecipeError

# Linear layers of a diffusers BasicTransformerBlock (PixArt) sharded by output column / input row
COLWISE = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q", "attn2.to_k", "attn2.to_v", "ff.net.0.proj")
ROWWISE = ("attn1.to_out.0", "attn2.to_out.0", "ff.net.2")
ATTENTIONS = ("attn1", "attn2")


def blocks(denoiser: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a ``TransformerDenoiser`` holding a PixArt transformer; a RecipeError
    naming ``model.transformer.kind`` for anything else (the UNet, SD3's joint blocks)."""
    transformer = getattr(denoiser, "transformer", None)
    if getattr(denoiser, "kind", None) != "pixart" or transformer is None:
        what = f"model.transformer.kind={denoiser.kind}" if hasattr(denoiser, "kind") else "the UNet"
        raise RecipeError(
            f"train.tensor_parallel: shards the attention and MLP linears of the PixArt DiT; {what} has no such "
            "plan here; use model.denoiser=transformer with model.transformer.kind=pixart, or tensor_parallel: 1"
        )
    return list(transformer.transformer_blocks)


def parallelize(denoiser: torch.nn.Module, mesh) -> list[str]:
    """Shard ``denoiser``'s blocks over the 1-D device mesh ``mesh`` (in place); return the sharded
    linears' names (relative to ``denoiser``). Each attention keeps ``heads / t`` heads per rank."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    size = mesh.size()
    sharded = []
    for block in blocks(denoiser):
        for name in ATTENTIONS:
            attention = block.get_submodule(name)
            if attention.heads % size:
                raise RecipeError(
                    f"train.tensor_parallel={size}: attention has {attention.heads} heads, not a multiple of it; "
                    "choose a tensor_parallel that divides model.transformer.attention_heads"
                )
            attention.heads //= size  # the heads of this rank (the processors view q, k, v by them)
        plan = {name: ColwiseParallel() for name in COLWISE} | {name: RowwiseParallel() for name in ROWWISE}
        parallelize_module(block, mesh, plan)
        prefix = _path(denoiser, block)
        sharded += [f"{prefix}.{name}" for name in (*COLWISE, *ROWWISE)]
    return sharded


def sharded_linears(module: torch.nn.Module) -> list[str]:
    """The names of ``module``'s linear layers whose weight is a DTensor sharded over more than one rank."""
    from torch.distributed.tensor import DTensor

    return [
        name
        for name, layer in module.named_modules()
        if isinstance(layer, torch.nn.Linear)
        and isinstance(layer.weight, DTensor)
        and layer.weight.device_mesh.size() > 1
    ]


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


def _path(root: torch.nn.Module, target: torch.nn.Module) -> str:
    return next(name for name, module in root.named_modules() if module is target)


def model_parallel_strategy(train):
    """Lightning's ``ModelParallelStrategy`` for ``train.tensor_parallel`` ranks in one tensor-parallel
    group (no data-parallel dimension), its resumable checkpoint gathered into one file on rank zero."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return ModelParallelStrategy(
        data_parallel_size=1, tensor_parallel_size=train.tensor_parallel, save_distributed_checkpoint=False
    )


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
