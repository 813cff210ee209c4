"""The parallel rows' pairs (``tests/scaleout/test_parallel_rows.py``), and their 2-rank arms a trained
on the 2 gloo ranks of the shared spawn (``tests.gloo_runs``).

Each pair's arm a (correct DDP and each injected bug) is ``divergence train --arm a`` of the data-parallel
pair on 2 ranks started outside Lightning (``LOCAL_RANK`` set, as torchrun does): the processes of the
spawn, which have imported torch and Lightning already, instead of a job of 2 fresh ranks a pair's command
would launch for each (a zygote and Lightning's rank 1: two interpreters, ~20 s of CPU). A pair's command
launching its 2-rank arm a as a child job, rank 1 Lightning's, is trained for the same data-parallel pair
of the tiny DiT in ``tests/training/test_rank_fork.py`` and ``tests/models/test_expert_parallel.py``.
"""

from __future__ import annotations

from pathlib import Path

from tests.pairs.helpers import PAIR_FAST, PAIRS

SHORT = (
    "model.denoiser=transformer",
    "train.max_steps=6",
    "train.checkpoint_every=6",
    "tracking.every=1",
    "tracking.probe.enabled=false",
)
DDP = ("arms.b=[{data-parallel: 1x4}]",)
ARMS_A = {
    "ddp": "arms.a=[{data-parallel: 2x2}]",
    "rank-scale": "arms.a=[{data-parallel: 2x2}, {injected-bug: rank-scale}]",
    "unreduced-param": "arms.a=[{data-parallel: 2x2}, {injected-bug: unreduced-param}]",
}


def command(name: str, out: Path) -> list[str]:
    """``divergence train`` of the pair ``name`` (the data-parallel pair, its arm a ``ARMS_A[name]``)."""
    recipe = str(PAIRS / "data-parallel.yaml")
    return ["train", "--recipe", recipe, "--out", str(out / name), *PAIR_FAST, *SHORT, ARMS_A[name], *DDP]


def train_on_rank(out: Path) -> None:
    """Each pair's arm a into ``out/<name>/a``: this rank's part, its ranks' environment set (a launcher's)."""
    from divergence.cli import main

    for name in ARMS_A:
        assert main([*command(name, out), "--arm", "a"]) == 0, name
