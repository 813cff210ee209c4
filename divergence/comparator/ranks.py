"""The processes a comparison runs on: one, or the ranks of a ``torchrun`` launch.

Rank 0 decides (which step to compare, when to stop) and writes; every rank computes its
share of the tensors. ``broadcast`` sends rank 0's decision to all ranks, ``gather`` brings
every rank's results to rank 0. On CPU the ranks talk over gloo; with GPUs, over NCCL, each
rank on ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import os

import torch

from divergence.errors import UserInputError


class Ranks:
    """A single process: rank 0 of 1."""

    rank, world_size = 0, 1

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj):
        return obj

    def gather(self, obj) -> list | None:
        return [obj]

    def close(self) -> None:
        pass


class ProcessGroupRanks(Ranks):
    """The ranks of an initialized default ``torch.distributed`` process group."""

    def __init__(self):
        import torch.distributed as dist

        self._dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def broadcast(self, obj):
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on the other ranks."""
        out = [None] * self.world_size if self.is_zero else None
        self._dist.gather_object(obj, out, dst=0)
        return out

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


def ranks_from_environment(device: str = "auto") -> tuple[Ranks, torch.device]:
    """Join the torchrun group when ``WORLD_SIZE`` > 1; return the ranks and this rank's device.

    ``device``: ``auto`` (this rank's GPU when CUDA is available, else the CPU), ``cpu``, or
    ``cuda`` (this rank's GPU).
    """
    if device not in ("auto", "cpu", "cuda"):
        raise UserInputError(f"--device {device!r}: must be auto, cpu or cuda (each rank uses cuda:LOCAL_RANK)")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise UserInputError("--device cuda: CUDA is not available on this machine; use --device cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    here = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if world_size <= 1:
        return Ranks(), here
    import torch.distributed as dist

    if use_cuda:
        torch.cuda.set_device(here)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return ProcessGroupRanks(), here
