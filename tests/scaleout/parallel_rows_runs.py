"""The parallel rows' pairs (``tests/scaleout/test_parallel_rows.py``), and their buggy 2-rank arms a
trained on the 2 gloo ranks of the shared spawn (``tests.gloo_runs``).

Each injected bug's arm a is ``divergence train --arm a`` of the data-parallel pair on 2 ranks started
outside Lightning (``LOCAL_RANK`` set, as torchrun does): the processes of the spawn, which have imported
torch and Lightning already, instead of a job of 2 fresh ranks a pair's command would launch for each
(the correct DDP pair is trained that way, by ``divergence train``, in the test's fixture).
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
BUGS = ("rank-scale", "unreduced-param")  # their arms a: trained in the spawn


def command(name: str, out: Path) -> list[str]:
    """``divergence train`` of the pair ``name`` (the data-parallel pair, its arm a ``ARMS_A[name]``)."""
    recipe = str(PAIRS / "data-parallel.yaml")
    return ["train", "--recipe", recipe, "--out", str(out / name), *PAIR_FAST, *SHORT, ARMS_A[name], *DDP]


def train_on_rank(out: Path) -> None:
    """Each bug's arm a into ``out/<bug>/a``: this rank's part, its ranks' environment set (a launcher's)."""
    from divergence.cli import main

    for name in BUGS:
        assert main([*command(name, out), "--arm", "a"]) == 0, name
