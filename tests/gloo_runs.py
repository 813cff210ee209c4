"""Every 2-rank gloo run the tests read, written by ONE spawn of 2 CPU processes.

Each spawned process starts torch (and Lightning) again: seconds of CPU per process, so the runs
share one spawn and one process group (the session fixture ``gloo_runs`` in ``tests/conftest.py``,
its tests on one xdist worker):

    root/runs/        tests.checkpoints.dcp_runs     (FSDP2 + DCP saves, columns, Megatron layout)
    root/arms/        tests.byo.dcp_arms             (ArmWriter in DCP and safetensors)
    root/lightning/   tests.byo.dcp_lightning        (Lightning ModelParallelStrategy + ArmCheckpoints)
    root/fsdp/        tests.training.fsdp_arms       (the fsdp variant's FSDP2 arms, the fsdp-full pair)
    root/experts/     tests.models.expert_parallel_runs  (an MoE layer's experts over the 2 ranks)
    root/tensor/      tests.training.tensor_parallel_runs  (the tensor-parallel arm, and its
                      ``divergence train --arm a`` once the shared process group has ended)
    root/zoo/         benchmarks/zoo_distributed.py  (the bug zoo's FSDP2 and ZeRO-1 arms against DDP)
    root/rows/        tests.scaleout.parallel_rows_runs  (the parallel rows' data-parallel arms a, correct
                      DDP's and the injected bugs', each ``divergence train --arm a`` after the
                      tensor-parallel one, in its process group)
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch


def write_all(root: Path) -> Path:
    import torch.multiprocessing as mp

    for name in ("runs", "arms", "lightning", "fsdp", "experts", "tensor", "zoo", "rows"):
        (root / name).mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(2, str(root), *_free_ports(2)), nprocs=2, join=True)
    return root


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so none is handed out twice)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _worker(rank: int, world: int, root: str, port: int, train_port: int) -> None:
    import torch.distributed as dist

    from tests.byo import dcp_arms, dcp_lightning
    from tests.checkpoints import dcp_runs
    from tests.training import fsdp_arms
    from tests.models import expert_parallel_runs
    from tests.scaleout import parallel_rows_runs
    from tests.training import tensor_parallel_runs

    # the launcher's environment: Lightning reads its ranks from it
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        dcp_runs.write_on_rank(Path(root) / "runs", rank, world)
        dcp_arms.write_on_rank(Path(root) / "arms")
        expert_parallel_runs.write_on_rank(Path(root) / "experts", rank, world)
        dcp_lightning.fit_on_rank(Path(root) / "lightning")
        fsdp_arms.write_on_rank(Path(root) / "fsdp", rank, world)
        tensor_parallel_runs.check_on_rank(Path(root) / "tensor", rank)
        zoo_on_rank(Path(root) / "zoo")
        dist.destroy_process_group()
        tensor_parallel_runs.train_on_rank(Path(root) / "tensor", rank, train_port)  # its own process group
        parallel_rows_runs.train_on_rank(Path(root) / "rows")  # in the environment the one before set
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


ZOO_CASES, ZOO_STEPS = ["fsdp-vs-ddp", "zero-1"], 2  # the bug zoo's cases on real ranks, and their steps


def zoo_on_rank(out: Path) -> None:
    """The bug zoo's FSDP2 vs DDP and ZeRO-1 vs DDP arms, trained, written and checked on this rank."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import zoo_distributed

    zoo_distributed.run_on_rank(out, ZOO_CASES, ZOO_STEPS)
