"""One checkpoint pair compared on several ranks: each tensor measured once, results on rank 0.

The matched tensors are divided among the ranks by size (largest first, each to the rank
holding the fewest elements so far: a greedy balance of the work, which is about linear in
the elements). Every rank opens both files itself and streams its own tensors through
``divergence.checkpoints.compare.compare_sources`` on its own device, so a rank holds at most one
pair of its tensors at a time: peak memory per rank is about the largest pair it is given,
never the model. Rank 0 gathers the records, puts them back in match order, and recomputes
the layer kinds from all shapes (a bias's kind follows its module's weight, which may have
been measured on another rank) and the summary (an exact function of the records).

The result equals the single-rank ``compare_sources`` record for record: each record is
computed by the same code on the same kind of device, and ``summarize`` is independent of
where the records were made.

Under ``divergence watch`` every rank runs ``measure`` on the ``Task`` rank 0 planned
(``comparator.planner.Task``): the records are gathered on rank 0, which gets the ``Measurement`` (the
``Comparison``, or the error that kept the files from being compared) and records the step
(``comparator.planner.Planner.record``). The other ranks get nothing back: they write nothing and
decide nothing.

The processes a comparison runs on are a ``Ranks``: one, or the ranks of a ``torchrun`` launch
(``ranks_from_environment``). Rank 0 decides (which step to compare, when to stop) and writes;
every rank computes its share of the tensors. ``broadcast`` sends rank 0's decision to all ranks,
``gather`` brings every rank's results to rank 0. On CPU the ranks talk over gloo; with GPUs, over
NCCL, each rank on ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from divergence.checkpoints import Match, TensorSource, match_tensors, open_checkpoint
from divergence.checkpoints.compare import Comparison, compare_sources, summarize_by_family
from divergence.errors import CheckpointError, UserInputError
from divergence.metrics import classify_kinds


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


def assign(sizes: list[int], world_size: int) -> list[int]:
    """The rank of each item: largest first, each to the least loaded rank (ties: lowest rank)."""
    owner = [0] * len(sizes)
    loads = [(0, rank) for rank in range(world_size)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, rank = heapq.heappop(loads)
        owner[index] = rank
        heapq.heappush(loads, (load + max(sizes[index], 1), rank))
    return owner


def compare_files(path_a: str | Path, path_b: str | Path, ranks: Ranks, device="cpu", order=None) -> Comparison | None:
    """Compare two checkpoint files on ``ranks``, the matched pairs divided among them (``assign``);
    records in ``order`` (names of A) when given; None off rank 0. Collective: every rank calls it.

    A file that cannot be read on any rank is a ``CheckpointError`` on rank 0.
    """
    try:
        a, b = open_checkpoint(path_a), open_checkpoint(path_b)
        match = match_tensors(a, b)
    except (CheckpointError, OSError) as err:
        failed = ranks.gather(CheckpointError(f"rank {ranks.rank}: {err}"))
        if ranks.is_zero:
            raise next(e for e in failed if isinstance(e, Exception)) from err
        return None
    if order:
        index = {name: i for i, name in enumerate(order)}
        match.pairs.sort(key=lambda p: (index.get(p[1], len(index)), p[1]))
    owner = assign([a.info(name_a).numel for _, name_a, _ in match.pairs], ranks.world_size)
    mine = replace(match, pairs=[p for p, rank in zip(match.pairs, owner) if rank == ranks.rank])
    try:
        part = compare_sources(a, b, mine, device).records
    except (CheckpointError, OSError) as err:  # reported on rank 0; every rank still joins the gather
        part = CheckpointError(f"rank {ranks.rank}: {err}")
    result = _assemble(ranks.gather(part), a, match)
    if result is not None:
        result.summary.update(a=str(path_a), b=str(path_b))
    return result


def _assemble(parts: list | None, a: TensorSource, match: Match) -> Comparison | None:
    if parts is None:
        return None
    errors = [p for p in parts if isinstance(p, Exception)]
    if errors:
        raise errors[0]
    by_name = {record["name"]: record for part in parts for record in part}
    kinds = classify_kinds({name: a.info(name_a).shape for name, name_a, _ in match.pairs})
    records = [dict(by_name[name], kind=kinds[name]) for name, _, _ in match.pairs]
    summary = summarize_by_family(records)
    summary.update(
        matched=len(match.pairs),
        skipped=len(match.skipped),
        stripped_prefix_a=match.stripped_a,
        stripped_prefix_b=match.stripped_b,
    )
    return Comparison(records, summary, match.skipped)


@dataclass(frozen=True)
class Measurement:
    """Rank 0's result of a step: its ``comparison`` (None at an untracked step), or the ``error``
    that kept the two files from being compared. Off rank 0 both are None."""

    comparison: Comparison | None = None
    error: CheckpointError | None = None


def measure(task, ranks: Ranks, device="cpu") -> Measurement:
    """Compare ``task``'s two weights files (a ``comparator.planner.Task``) on every rank (collective at a tracked step)."""
    if not task.tracked:
        return Measurement()
    try:
        comparison = compare_files(task.paths["a"], task.paths["b"], ranks, device, task.order)
    except CheckpointError as err:  # raised on rank 0 only
        return Measurement(error=err)
    return Measurement(comparison=comparison)
