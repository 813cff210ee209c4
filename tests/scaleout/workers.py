"""Code the spawned ranks of the distributed tests run (importable by a fresh interpreter)."""

import pickle

import torch
import torch.distributed as dist


def compare_then_watch(rank: int, world_size: int, init: str, a: str, b: str, pair: str, result: str) -> None:
    """Rank ``rank`` of a gloo group: compare one checkpoint pair, then follow a pair folder."""
    from divergence.comparator.distributed import compare_files
    from divergence.comparator.follow import Comparator
    from divergence.training.probe_files import FileProbe
    from divergence.comparator.ranks import ProcessGroupRanks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    ranks = ProcessGroupRanks()
    try:
        comparison = compare_files(a, b, ranks, "cpu")
        if rank == 0:
            with open(result, "wb") as f:
                pickle.dump((comparison.records, comparison.summary), f)
        assert (comparison is None) == (rank != 0)
        assert (
            Comparator(pair, ranks, "cpu", log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=60) == 0
        )
    finally:
        ranks.close()
