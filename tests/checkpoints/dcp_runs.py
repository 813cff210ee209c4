"""Two training runs of a tiny model sharded with FSDP2 on 2 CPU ranks (gloo), checkpointed with
the real ``torch.distributed.checkpoint.save``, each step also saved as safetensors of the same
full weights (``DTensor.full_tensor()``) for the oracle.

    root/a/step-N/                DCP, {"model": model.state_dict()}  (accelerate / Lightning layout)
    root/b/checkpoint-N/          DCP, torch.compile wrapper's keys (``_orig_mod.``) at the top level
                                  plus {"optimizer": Adam state} (torchtitan layout)
    root/a_st/step_N.safetensors  the same weights, unsharded, plain names
    root/b_st/step_N.safetensors
    root/columns/                 DCP of one bf16 tensor sharded by columns (Shard(1)), and
    root/columns.safetensors      the same tensor whole
    root/megatron/iter_0000004/   a Megatron-Core torch_dist folder built from its layout, and
    root/megatron.safetensors     its weights per layer (decoder.layers.N....)

The model has a Linear whose rows do not split evenly over 2 ranks (chunks of 3 and 2 rows, ...),
a BatchNorm (replicated buffers: one chunk, a 0-d int64 counter) and an Embedding. Both ranks
train on the same batches, so the replicated buffers are equal on every rank (DCP keeps one
rank's copy; the safetensors oracle rank 0's).
"""

from __future__ import annotations

from pathlib import Path

import torch

STEPS = (0, 2, 4)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(10, 8),
        torch.nn.Linear(8, 5),
        torch.nn.BatchNorm1d(5),
        torch.nn.Linear(5, 3),
    )


def write_on_rank(root: Path, rank: int, world: int) -> None:
    """This rank's part of both runs, in a process group already initialised (``tests.gloo_runs``)."""
    for arm, lr in (("a", 1e-2), ("b", 2e-2)):
        _train_and_save(root, arm, lr, rank)
    _save_columns(root, rank, world)
    _save_megatron(root, rank, world)


def _train_and_save(root: Path, arm: str, lr: float, rank: int) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    model = tiny_model()
    for layer in (model[0], model[1], model[3]):
        fully_shard(layer)
    fully_shard(model)
    compiled = torch.compile(model)  # lazy: never run, only its state_dict keys (_orig_mod.) are used
    optim = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)  # the same batch on both ranks: BatchNorm's buffers (not
    # synchronized across ranks, and saved by DCP from one rank only) then agree with rank 0's
    for step in range(STEPS[-1] + 1):
        if step in STEPS:
            if arm == "a":
                state = {"model": model.state_dict()}
                folder = root / "a" / f"step-{step}"
            else:
                state = {**compiled.state_dict(), "optimizer": get_optimizer_state_dict(model, optim)}
                folder = root / "b" / f"checkpoint-{step}"
            _save(state, folder)
            _save_full(model, root / f"{arm}_st" / f"step_{step}.safetensors", rank)
        tokens = torch.randint(0, 10, (8,), generator=g)
        loss = model(tokens).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
    dist.barrier()


def _save_columns(root: Path, rank: int, world: int) -> None:
    """A tensor sharded by columns (tensor parallel's ``Shard(1)``): chunks that are not rows."""
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(4 * 7, dtype=torch.bfloat16).reshape(4, 7)
    _save({"model": {"w": distribute_tensor(full, init_device_mesh("cpu", (world,)), [Shard(1)])}}, root / "columns")
    if rank == 0:
        save_file({"w": full}, root / "columns.safetensors")


def _save_megatron(root: Path, rank: int, world: int) -> None:
    """A Megatron-Core torch_dist folder BUILT FROM ITS LAYOUT (megatron-core is not installed): the
    real DCP save of Megatron's keys, stacked layers along dim 0 (3 layers over 2 ranks: chunks of
    2 layers and 1), optimizer state, ``metadata.json`` and a ``common.pt`` that must never be
    opened (unpickling it would run code)."""
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from .forge import RunsCode

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(7)
    full = {
        "embedding.word_embeddings.weight": torch.randn(10, 4, generator=g),
        "decoder.layers.self_attention.linear_proj.weight": torch.randn(3, 4, 4, generator=g),
        "decoder.layers.mlp.linear_fc1.weight": torch.randn(3, 6, 4, generator=g),
        "decoder.final_layernorm.weight": torch.randn(4, generator=g),
    }
    state = {k: distribute_tensor(v, mesh, [Shard(0)]) if v.dim() > 1 else v for k, v in full.items()}
    state["optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight"] = torch.zeros(3, 6, 4)
    folder = root / "megatron" / "iter_0000004"
    _save(state, folder)
    if rank == 0:
        (folder / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
        torch.save({"iteration": 4, "args": RunsCode(root / "pwned")}, folder / "common.pt")
        per_layer = {}
        for name, tensor in full.items():
            if ".layers." in name:
                for i in range(tensor.shape[0]):
                    per_layer[name.replace("layers.", f"layers.{i}.")] = tensor[i].clone()
            else:
                per_layer[name] = tensor
        save_file(per_layer, root / "megatron.safetensors")


def _save(state: dict, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=folder)


def _save_full(model, path: Path, rank: int) -> None:
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    full = {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.state_dict().items()
    }
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(full, path)
