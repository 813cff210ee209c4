"""Write the job scripts under ``DIR/launch`` and submit (SLURM) or start (torchrun) them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from divergence.errors import UserInputError
from divergence.launch.scripts import LaunchPlan, build_scripts

DRIVERS = {"slurm": ("submit.sh", "sbatch"), "torchrun": ("start.sh", "torchrun")}


def render(plan: LaunchPlan) -> str:
    """Every script, each under a ``# ==> path <==`` line: what ``--dry-run`` prints."""
    return "\n".join(f"# ==> {plan.launch_dir / name} <==\n{text}" for name, text in build_scripts(plan).items())


def write_scripts(plan: LaunchPlan) -> dict[str, Path]:
    """The scripts under ``plan.launch_dir`` (executable), and the log folder the jobs write to."""
    plan.launch_dir.mkdir(parents=True, exist_ok=True)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in build_scripts(plan).items():
        path = plan.launch_dir / name
        path.write_text(text)
        path.chmod(0o755)
        paths[name] = path
    return paths


def launch(plan: LaunchPlan) -> int:
    """Check the scheduler's command is here, write the scripts, then run the driver script."""
    driver, tool = DRIVERS[plan.scheduler]
    if shutil.which(tool) is None:
        hint = (
            "run this on a SLURM login node"
            if tool == "sbatch"
            else "install torch in this environment (it provides torchrun)"
        )
        raise UserInputError(
            f"--scheduler {plan.scheduler}: {tool!r} is not on PATH; {hint}, or use --dry-run to print the scripts"
        )
    paths = write_scripts(plan)
    if plan.scheduler == "torchrun" and plan.nodes > 1:
        print(
            f"wrote {', '.join(str(p) for p in paths.values())}\n"
            f"--nodes {plan.nodes}: run arm-a.sh and arm-b.sh on each node of that arm with NODE_RANK and "
            "MASTER_ADDR set (and MASTER_PORT_A/B), and watch.sh on one machine that sees the folder"
        )
        return 0
    print(f"wrote the scripts to {plan.launch_dir}; running {driver}", flush=True)
    return subprocess.call(["bash", str(paths[driver])], env=dict(os.environ))
