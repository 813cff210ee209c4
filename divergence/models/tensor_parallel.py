"""Tensor parallelism of the DiT (``train.tensor_parallel``): Megatron-style sharding of each
transformer block's attention and MLP linears over the ranks of a device mesh (the plan; training
with it, its gradients, weights and optimizer state: ``divergence.training.tensor_parallel``).

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
``divergence.lightning.gather.gather_state``), so the comparator matches them one to one.
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
        prefix = next(name for name, module in denoiser.named_modules() if module is block)
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
