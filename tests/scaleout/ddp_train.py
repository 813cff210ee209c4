"""Every 2-rank DDP run of the scaleout tests, in ONE torchrun launch of 2 gloo ranks.

Each process of a launch starts torch and Lightning again (seconds of CPU each), so the runs share
one ``torchrun --nproc-per-node=2`` and one process group, one job after the other in each rank
(the session fixture ``two_rank_runs`` in ``tests/scaleout/conftest.py``):

    arm        ``divergence train --arm a`` of a pair, train.strategy=ddp on 2 ranks (test_distributed)
    control    ``divergence train`` of the control pair in lockstep under DDP (test_ddp_lockstep)
    compare    one checkpoint pair compared over the 2 ranks, then a pair folder followed (test_distributed)
    nan        ``divergence train`` of a lockstep pair with rank 1's loss of arm a NaN at step 1
               (test_ddp_lockstep): last, as it stops both ranks' training

Run as ``python -m tests.scaleout.ddp_train ROOT`` by torchrun (``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``: Lightning joins them instead of launching its own). ROOT holds
``jobs.json`` (``[{name, kind, args, nan_at_step?}]``); rank r writes ``NAME.rank{r}.err`` (the
job's stderr, file descriptor 2 itself, so C-level output too) and ``NAME.rank{r}.code`` (the exit
code ``divergence train`` returns, what its process would exit with).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    rank = int(os.environ["LOCAL_RANK"])
    for job in json.loads((root / "jobs.json").read_text()):
        with _stderr_to(root / f"{job['name']}.rank{rank}.err"):
            code = _run(job, rank)
        (root / f"{job['name']}.rank{rank}.code").write_text(str(code))
    return 0


def _run(job: dict, rank: int) -> int:
    if job["kind"] == "compare":
        from tests.scaleout.workers import compare_then_watch

        compare_then_watch(*job["args"])
        return 0
    from divergence.cli import main as cli

    with poisoned(job.get("nan_at_step") if rank == 1 else None):  # rank 0's own loss stays finite
        return cli(["train", *job["args"]])


@contextlib.contextmanager
def _stderr_to(path: Path):
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def poisoned(step: int | None):
    """This rank reports a NaN loss for arm a's batch of step ``step`` (the other ranks do not)."""
    import torch

    from divergence.training import arm as arm_module

    original = arm_module.Arm.training_step

    def poisoned(self, inputs, **kwargs):
        out = original(self, inputs, **kwargs)
        if self.name.endswith(".a") and inputs.step == step:
            out.loss = torch.tensor(float("nan"))
        return out

    if step is not None:
        arm_module.Arm.training_step = poisoned
    try:
        yield
    finally:
        arm_module.Arm.training_step = original


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
