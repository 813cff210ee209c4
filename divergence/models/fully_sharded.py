"""Fully sharded data parallelism of an arm's trained networks (``train.fsdp_sharding``): FSDP2,
``torch.distributed.fsdp.fully_shard``, over the ranks of a 1-D data-parallel device mesh (training
with it, its gradients, weights and optimizer state: ``divergence.training.tensor_parallel``).

Each rank keeps a ``1/N`` row slice of every weight (a DTensor placed ``Shard(0)``), of its
gradient and of AdamW's moments (Rajbhandari et al. 2020, "ZeRO", section 5; Zhao et al. 2023,
"PyTorch FSDP"). A unit (each block, then the network) gathers its full weights before its forward
(all-gather: copies, no arithmetic); after the backward each rank's gradient of the full weight is
reduce-scattered, rank r keeping the mean over ranks of its slice::

    g_r = (1/N) sum_n g^(n)[slice r]        the same mean gradient DDP all-reduces, summed per slice

and AdamW steps each slice on its own rank (elementwise: the same update). So a correct FSDP arm
is DDP up to the order of fp32 sums. The two ZeRO stages differ in what a unit keeps after its
forward (``reshard_after_forward``):

- ``FULL_SHARD`` (ZeRO-3): its slice only; the weights are gathered again for the backward;
- ``SHARD_GRAD_OP`` (ZeRO-2): the gathered weights, until its backward has run.

The units: every block of the diffusers convention (``down_blocks.i``, ``mid_block``,
``up_blocks.i`` of the UNet, ``transformer_blocks.i`` of the DiT, ``encoder.layers.i`` of the CLIP
text encoder), then the network itself for what is left (embeddings, norms, output layers).
"""

from __future__ import annotations

import torch

# Names (last components) of the ModuleLists whose elements are units, and of single-module units
BLOCK_LISTS = ("down_blocks", "up_blocks", "transformer_blocks", "layers")
BLOCKS = ("mid_block",)
SHARDINGS = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # train.fsdp_sharding -> reshard_after_forward


def units(network: torch.nn.Module) -> list[str]:
    """The names (relative to ``network``) of its blocks that become FSDP units, outermost first;
    a block inside another unit is part of it."""
    found: list[str] = []
    for name, _ in network.named_modules():
        last = name.rsplit(".", 1)[-1]
        parent = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
        is_block = (parent in BLOCK_LISTS and last.isdigit()) or last in BLOCKS
        if is_block and not any(name.startswith(f"{outer}.") for outer in found):
            found.append(name)
    return found


def shard(network: torch.nn.Module, mesh, sharding: str) -> list[str]:
    """Shard ``network`` (in place) over the 1-D device mesh ``mesh``: each of its ``units`` with
    ``fully_shard``, then the network; ``sharding`` (``FULL_SHARD`` or ``SHARD_GRAD_OP``) sets
    ``reshard_after_forward`` on every unit, the network's included (FSDP2 would otherwise keep the
    root's weights gathered after its forward). Returns the units' names."""
    from torch.distributed.fsdp import fully_shard

    reshard = SHARDINGS[sharding]
    names = units(network)
    for name in names:
        fully_shard(network.get_submodule(name), mesh=mesh, reshard_after_forward=reshard)
    fully_shard(network, mesh=mesh, reshard_after_forward=reshard)
    return names


def sharded_parameters(network: torch.nn.Module) -> list[str]:
    """The names of ``network``'s parameters held as DTensors split by rows (``Shard(0)``) over a
    mesh of more than one rank."""
    from torch.distributed.tensor import DTensor, Shard

    return [
        name
        for name, p in network.named_parameters()
        if isinstance(p, DTensor) and p.device_mesh.size() > 1 and tuple(p.placements) == (Shard(0),)
    ]


def reshards_after_forward(network: torch.nn.Module) -> set[bool]:
    """Whether each FSDP unit of ``network`` frees its gathered weights after its forward (FSDP2's
    parameter group keeps a post-forward mesh exactly when it does): ``{True}`` under FULL_SHARD,
    ``{False}`` under SHARD_GRAD_OP, empty when nothing is sharded."""
    from torch.distributed.fsdp import FSDPModule

    said = set()
    for module in network.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                said.add(group.post_forward_mesh_info is not None)
    return said
