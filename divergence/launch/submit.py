"""Write the job scripts under ``DIR/launch`` and submit (SLURM) or start (torchrun) them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from divergence.errors import UserInputError
from divergence.launch.scripts import LaunchPlan, build_scripts

DRIVERS = {"slurm": ("submit.sh", "sbatch"), "torchrun": ("start.sh", "torchrun")}


def render(scripts: dict[Path, str]) -> str:
    """Every script, each under a ``# ==> path <==`` line: what ``--dry-run`` prints."""
    return "\n".join(f"# ==> {path} <==\n{text}" for path, text in scripts.items())


def pair_scripts(plan: LaunchPlan) -> dict[Path, str]:
    return {plan.launch_dir / name: text for name, text in build_scripts(plan).items()}


def write(files: dict[Path, str], log_dirs) -> None:
    """``files`` (the scripts executable), and the log folders the jobs write to."""
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.suffix in (".sh", ".sbatch"):
            path.chmod(0o755)
    for folder in log_dirs:
        folder.mkdir(parents=True, exist_ok=True)


def need_tool(scheduler: str, printed: str = "the scripts") -> None:
    """The scheduler's command is on PATH, else one line saying where to run (or ``--dry-run``)."""
    tool = DRIVERS[scheduler][1]
    if shutil.which(tool) is None:
        hint = (
            "run this on a SLURM login node"
            if tool == "sbatch"
            else "install torch in this environment (it provides torchrun)"
        )
        raise UserInputError(
            f"--scheduler {scheduler}: {tool!r} is not on PATH; {hint}, or use --dry-run to print {printed}"
        )


def run_driver(path: Path) -> int:
    return subprocess.call(["bash", str(path)], env=dict(os.environ))


def launch(plan: LaunchPlan) -> int:
    """Check the scheduler's command is here, write the scripts, then run the driver script."""
    need_tool(plan.scheduler)
    scripts = pair_scripts(plan)
    write(scripts, [plan.log_dir])
    if plan.scheduler == "torchrun" and plan.nodes > 1:
        print(
            f"wrote {', '.join(map(str, scripts))}\n"
            f"--nodes {plan.nodes}: run arm-a.sh and arm-b.sh on each node of that arm with NODE_RANK and "
            "MASTER_ADDR set (and MASTER_PORT_A/B), and watch.sh on one machine that sees the folder"
        )
        return 0
    driver = DRIVERS[plan.scheduler][0]
    print(f"wrote the scripts to {plan.launch_dir}; running {driver}", flush=True)
    return run_driver(plan.launch_dir / driver)
