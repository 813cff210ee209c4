"""Code the 2 ranks of the distributed tests run (``tests.scaleout.ddp_train``, its ``compare`` job)."""

import pickle

import torch.distributed as dist


def compare_then_watch(a: str, b: str, pair: str, result: str) -> None:
    """This rank of the launch's gloo group: compare one checkpoint pair, then follow a pair folder."""
    from divergence.comparator.distributed import compare_files
    from divergence.comparator.follow import Comparator
    from divergence.training.probe_files import FileProbe
    from divergence.comparator.distributed import ProcessGroupRanks

    assert dist.is_initialized() and dist.get_world_size() == 2
    ranks = ProcessGroupRanks()
    comparison = compare_files(a, b, ranks, "cpu")
    if ranks.rank == 0:
        with open(result, "wb") as f:
            pickle.dump((comparison.records, comparison.summary), f)
    assert (comparison is None) == (ranks.rank != 0)
    assert Comparator(pair, ranks, "cpu", log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=60) == 0
