"""Separate jobs land in one wandb group: every launch script exports it, the user's own wins."""

from pathlib import Path

import pytest

from divergence.launch.scripts import LaunchPlan, build_scripts


@pytest.mark.parametrize("scheduler", ["slurm", "torchrun"])
@pytest.mark.parametrize("group, expected", [(None, "flash-vs-baseline"), ("nightly-7", "nightly-7")])
def test_every_job_script_exports_the_group(scheduler, group, expected):
    plan = LaunchPlan(
        recipe=Path("/r/pair.yaml"), out=Path("/runs/flash-vs-baseline"), name="flash", scheduler=scheduler, group=group
    )
    scripts = build_scripts(plan)
    jobs = [text for name, text in scripts.items() if name.startswith(("arm-", "watch"))]
    assert len(jobs) == 3
    for text in jobs:  # ${WANDB_RUN_GROUP:-...}: a group the user exported wins
        assert f"export WANDB_RUN_GROUP=${{WANDB_RUN_GROUP:-{expected}}}" in text.splitlines()
