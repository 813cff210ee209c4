"""The zoo's cases that need real ranks: FSDP vs DDP and ZeRO-1 vs DDP, each arm 2 gloo processes on the CPU.

One spawn of 2 processes (a gloo process group) trains the zoo's tiny GPT-2 (``zoo_cases``) ``steps`` optimizer
steps from its initial weights on its batches, rank r on the r-th half of each batch's rows:

- ``ddp``: ``DistributedDataParallel``, AdamW foreach: the baseline of both cases;
- ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard`` on each block, then on the root): weights,
  gradients and AdamW's moments sharded over the ranks, the gradients reduce-scattered;
- ``zero``: DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO stage 1: AdamW foreach on
  each rank's partition of the parameters, each partition broadcast after its step).

Rank r's loss is world * (its token sum) / (the all-reduced token count of the batch), so the ranks' average
gradient is the batch's token-mean gradient; it is clipped at ``CLIP`` over the whole model (FSDP2: the norm
of the sharded gradients, all-reduced) and the learning rate follows the zoo's warm-up. Every rank writes
the arms through ``ArmWriter`` (only rank 0 writes files): ``OUT/fsdp-vs-ddp`` (a: fsdp, b: ddp) and
``OUT/zero-1`` (a: zero, b: ddp), every step tracked, the full weights gathered on every rank first.

Then the one-step check (``one_step_check``) on both ranks, its collectives in the same order on each:

- fsdp-vs-ddp: the FSDP2 gradient against DDP's on the initial weights and step 1's batch;
- zero-1: ZeroRedundancyOptimizer's update against AdamW's after DDP's gradient, from AdamW's state after
  3 baseline steps (ZeRO-1 changes no gradient: it shards the optimizer's state and step);

each against the zoo's reordered references (the one-process baseline over 2, 4 and 8 micro-batches summed
last to first). Rank 0 writes ``OUT/distributed.json``: per case the two arms' losses, the one-step
reading, and the seconds the case took inside the spawn.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import time
from functools import partial
from pathlib import Path

import torch

import zoo_cases as zc

CASES = {"fsdp-vs-ddp": "fsdp", "zero-1": "zero"}  # case: its arm a (arm b: ddp)
WORLD = 2


class TokenLoss(torch.nn.Module):
    """The zoo's per-token cross-entropy as a module's forward, so DDP's and FSDP2's hooks run around it."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return zc.token_ce(self.lm, {"ids": ids, "mask": mask})


def wrap(kind: str) -> torch.nn.Module:
    """The zoo's initial model wrapped as arm ``kind`` ("ddp", "zero": DDP; "fsdp": FSDP2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    module = TokenLoss(zc.make_model())
    if kind != "fsdp":
        return DistributedDataParallel(module)
    mesh = init_device_mesh("cpu", (WORLD,))
    for block in module.lm.transformer.h:
        fully_shard(block, mesh=mesh)
    return fully_shard(module, mesh=mesh)  # the root: embeddings (tied with lm_head) and final norm


def lm_of(wrapped: torch.nn.Module) -> torch.nn.Module:
    return wrapped.module.lm if hasattr(wrapped, "module") else wrapped.lm


def optimizer_of(kind: str, wrapped: torch.nn.Module):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if kind == "zero":
        return ZeroRedundancyOptimizer(
            wrapped.parameters(), optimizer_class=torch.optim.AdamW, lr=zc.LR, weight_decay=0.01, foreach=True
        )
    return torch.optim.AdamW(wrapped.parameters(), lr=zc.LR, weight_decay=0.01, foreach=True)


def grad_step(wrapped: torch.nn.Module, batch: dict) -> float:
    """This rank's gradient on its rows, averaged over the ranks by the wrapper, clipped; the batch's loss."""
    import torch.distributed as dist

    rank = dist.get_rank()
    part = zc.rows_of(batch, WORLD)[rank]
    total = zc.tokens(part).clone()
    dist.all_reduce(total)  # the batch's token count
    loss = WORLD * wrapped(part["ids"], part["mask"]).sum() / total
    loss.backward()
    torch.nn.utils.clip_grad_norm_(wrapped.parameters(), zc.CLIP)
    value = loss.detach().clone() / WORLD
    dist.all_reduce(value)  # the token mean over the batch
    return float(value)


def full_state(wrapped: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole weights on every rank (FSDP2's shards gathered: a collective)."""
    state = lm_of(wrapped).state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def full_grads(wrapped: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad for n, p in lm_of(wrapped).named_parameters()}
    return {n: (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone() for n, g in grads.items()}


def load_weights(wrapped: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``state`` (whole tensors, the same on every rank) into the wrapped model (FSDP2: each rank its shards)."""
    from torch.distributed.tensor import distribute_tensor

    with torch.no_grad():
        for name, p in lm_of(wrapped).named_parameters():
            full = state[name]
            if hasattr(p, "device_mesh"):
                p.copy_(distribute_tensor(full, p.device_mesh, p.placements))
            else:
                p.copy_(full)
    wrapped.zero_grad(set_to_none=True)


def train_arm(kind: str, steps: int, writers: list) -> tuple[dict, float]:
    """Arm ``kind`` trained ``steps`` steps, each step recorded by every writer; its losses and seconds."""
    start = time.perf_counter()
    wrapped = wrap(kind)
    optimizer = optimizer_of(kind, wrapped)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, zc.warmup)
    losses = {}
    state = full_state(wrapped)
    for writer in writers:
        writer.record(0, state)
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        losses[step] = grad_step(wrapped, zc.make_batch(step))
        optimizer.step()
        scheduler.step()
        state = full_state(wrapped)
        for writer in writers:
            writer.record(step, state, losses[step])
    return losses, time.perf_counter() - start


def gradient_path(wrapped: torch.nn.Module):
    """A one-step path: the wrapped arm's whole gradient on the weights ``one_step_check`` gives."""

    def path(model, batch):
        load_weights(wrapped, model.state_dict())
        grad_step(wrapped, batch)
        return full_grads(wrapped)

    return path


def update_path(kind: str, wrapped: torch.nn.Module, state: dict):
    """A one-step path: DDP's gradient, then arm ``kind``'s optimizer (loaded from ``state``) steps once."""

    def path(model, batch):
        load_weights(wrapped, model.state_dict())
        grad_step(wrapped, batch)
        optimizer = optimizer_of(kind, wrapped)
        optimizer.load_state_dict(copy.deepcopy(state))  # ZeRO's load clears the other ranks' entries in place
        before = {n: p.detach().clone() for n, p in lm_of(wrapped).named_parameters()}
        optimizer.step()
        return {n: p.detach() - before[n] for n, p in lm_of(wrapped).named_parameters()}

    return path


def one_step(case: str, ddp: torch.nn.Module) -> dict:
    from divergence.analysis.one_step import one_step_check

    refs = [partial(zc.baseline, micro=k, reverse=True) for k in zc.REFERENCE_SPLITS]
    batch = zc.make_batch(1)
    if case == "fsdp-vs-ddp":
        result = one_step_check(
            gradient_path(wrap("fsdp")), gradient_path(ddp), zc.make_model(), batch,
            reordered=[zc._gradient_only(r) for r in refs], kind="gradient",
        )  # fmt: skip
    else:
        model, state = zc.warmed()
        result = one_step_check(
            update_path("zero", wrap("zero"), state["state"]), update_path("ddp", ddp, state["state"]), model, batch,
            reordered=[zc.update_path(False, r, state["state"]) for r in refs], kind="update",
        )  # fmt: skip
    return result.to_dict()


def _worker(rank: int, out: str, names: list[str], steps: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        run_on_rank(Path(out), names, steps)
    finally:
        dist.destroy_process_group()


def run_on_rank(out: Path, names: list[str], steps: int) -> None:
    """Train, write and check the cases ``names`` on this rank of a 2-rank gloo process group already
    initialized (this module's spawn, or a test session's shared one: ``tests.gloo_runs``)."""
    import torch.distributed as dist

    from divergence import ArmWriter

    result = {}
    pair = {"category": "optimization", "expect_identity": True, "max_steps": steps, "every": 1}
    with _writers(ArmWriter, out, names, "b", pair) as writers:
        base, base_seconds = train_arm("ddp", steps, writers)
    for name in names:
        with _writers(ArmWriter, out, [name], "a", pair) as writers:
            change, seconds = train_arm(CASES[name], steps, writers)
        start = time.perf_counter()
        reading = one_step(name, wrap("ddp"))
        seconds += time.perf_counter() - start + base_seconds / len(names)
        result[name] = {"change": change, "base": base, "one_step": reading, "seconds": seconds}
    if dist.get_rank() == 0:
        (out / "distributed.json").write_text(json.dumps(result) + "\n")
    dist.barrier()


class _writers:
    """One ``ArmWriter`` of arm ``arm`` per case folder, all finished on exit."""

    def __init__(self, cls, out: Path, names: list[str], arm: str, pair: dict):
        self.writers = [cls(out / name, arm, name=name, **pair) for name in names]

    def __enter__(self) -> list:
        return self.writers

    def __exit__(self, exc_type, *_) -> None:
        for writer in self.writers:
            writer.finish("failed" if exc_type is not None else None)


def run(out: str | Path, names: list[str], steps: int) -> dict:
    """Train and check the cases ``names`` (keys of ``CASES``) in one spawn of 2 ranks; ``distributed.json``'s
    content, its losses keyed by int step."""
    import torch.multiprocessing as mp

    out = Path(out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(str(out), names, steps, port), nprocs=WORLD, join=True)
    return load(out)


def load(out: str | Path) -> dict:
    """``OUT/distributed.json`` as ``run`` returns it (``run_on_rank`` wrote it), losses keyed by int step."""
    result = json.loads((Path(out) / "distributed.json").read_text())
    for case in result.values():
        for key in ("change", "base"):
            case[key] = {int(k): v for k, v in case[key].items()}
    return result
