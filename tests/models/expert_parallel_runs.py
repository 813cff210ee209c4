"""One MoE layer with its experts over the 2 gloo ranks of the shared spawn (``tests.gloo_runs``),
against the same layer with every expert on one process; rank 0 writes ``result.json``.

The layer (4 experts, top-2, capacity factor 1: some choices dropped) takes a global batch of 4 x 8
tokens: the one-process copy all of it, the expert-parallel copies (``a`` and its control ``a2``,
built alike) rank r's 2 examples. One forward and backward of ``mean(y^2) + balance x aux`` each,
then ``average_gradients``; the numbers compare the output rows, routing, drops, balance loss and
gradients (experts gathered from both ranks) with the one-process layer's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch


def write_on_rank(root: Path, rank: int, world: int) -> None:
    with torch.random.fork_rng(devices=[]):  # the spawn's other runs see the RNG as they found it
        _write(root, rank, world)


def _write(root: Path, rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from divergence.models.expert_parallel import shard_experts, sharded_experts
    from divergence.models.moe import MoEFeedForward
    from divergence.recipe.model import MoEConfig
    from divergence.training.expert_parallel import average_gradients

    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, balance_loss=0.01)
    one = torch.nn.ModuleDict({"ff": MoEFeedForward(16, 32, config)})
    initial = {k: v.clone() for k, v in one.state_dict().items()}
    x = torch.randn(2 * world, 8, 16)
    mine = slice(2 * rank, 2 * rank + 2)
    mesh = init_device_mesh("cpu", (world,))
    parallel = {name: copy.deepcopy(one) for name in ("a", "a2")}
    for layer in parallel.values():
        shard_experts(layer, mesh)
    local_experts = parallel["a"]["ff"].w1.to_local().shape[0]
    full_at_start = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in parallel["a"].state_dict().items()}

    def step(model, tokens):
        y = model["ff"](tokens)
        aux = model["ff"].aux_loss
        ((y**2).mean() + config.balance_loss * aux).backward()
        return y.detach(), float(aux.detach())

    y_one, aux_one = step(one, x)
    out = {name: step(model, x[mine]) for name, model in parallel.items()}
    for model in parallel.values():
        average_gradients(list(model.parameters()))
    grads = {
        name: {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for n, p in m.named_parameters()}
        for name, m in parallel.items()
    }
    routing, one_routing = parallel["a"]["ff"].routing, one["ff"].routing
    rows = slice(rank * 16, rank * 16 + 16)  # this rank's tokens among the 32
    other = ((routing.experts // local_experts != rank) & routing.kept).sum()
    one_grads = {n: p.grad for n, p in one.named_parameters()}
    checks = {
        "sharded": sharded_experts(parallel["a"]),
        "local_experts": local_experts,
        "sent_away": int(other),  # kept choices whose expert lives on the other rank
        "start_equal": all(torch.equal(full_at_start[k], initial[k]) for k in initial)
        and list(full_at_start) == list(initial),
        "same_choices": torch.equal(routing.experts, one_routing.experts[rows]),
        "same_drops": torch.equal(routing.kept, one_routing.kept[rows]),
        "dropped": int((~one_routing.kept).sum()),
        "output": float((out["a"][0] - y_one[mine]).abs().max() / y_one.abs().max()),
        "aux": abs(out["a"][1] - aux_one) / aux_one,
        "grads": max(float((grads["a"][n] - g).norm() / g.norm()) for n, g in one_grads.items()),
        "control_output": float((out["a"][0] - out["a2"][0]).abs().max()),
        "control_grads": max(float((grads["a"][n] - grads["a2"][n]).abs().max()) for n in one_grads),
    }
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, checks)
    if rank == 0:
        (root / "result.json").write_text(json.dumps(gathered))
