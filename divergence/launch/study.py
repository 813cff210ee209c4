"""``divergence launch --study``: every pair run of a study as separate SLURM jobs, then its report.

Each (pair, replicate) of the study (``divergence.study``: the control once, every other pair
``replicates`` times) gets its recipe in ``OUT/recipes/<pair>-r<r>.yaml`` and its pair folder
``OUT/<pair>/r<r>``, as ``divergence study`` lays them out, and the scripts of a separate-job
pair there (``divergence.launch.scripts``: both arms and the comparator). ``OUT/launch/submit.sh``
submits every pair (each comparator ``after`` its two arms have started) and then
``OUT/launch/report.sbatch`` (``divergence report OUT`` on one CPU task) with
``--dependency=afterok`` on every job of every pair: it runs once all have succeeded.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from divergence.launch.scripts import LaunchPlan, command_line, sbatch_header, script, srun_prefix, submit_lines
from divergence.launch.submit import pair_scripts, render, write
from divergence.study.config import Study
from divergence.study.reuse import check_reusable
from divergence.study.runner import plan_jobs

JOBS = ("arm-a", "arm-b", "watch")


@dataclass(frozen=True)
class StudyLaunch:
    study: Study
    out: Path
    plans: tuple[LaunchPlan, ...]  # one per (pair, replicate), in the study runner's order
    recipes: dict  # {recipe path: recipe text} to write before submitting
    template: LaunchPlan  # the cluster options every job shares (report job included)
    jobs: tuple = ()  # the study runner's PairJobs: what write_study checks the folder's runs against

    @property
    def launch_dir(self) -> Path:
        return self.out / "launch"


def plan_study(study: Study, out: Path, overrides: list[str], template: LaunchPlan) -> StudyLaunch:
    """Plans for every pair run; each recipe is validated now (``divergence.study.runner.plan_jobs``),
    so a bad one fails here, not in a job hours later."""
    jobs = plan_jobs(study, out, overrides)
    plans = tuple(
        replace(
            template,
            recipe=job.recipe_path,
            out=job.out,
            name=f"{study.name}-{job.label}",
            overrides=tuple(overrides),
            group=template.group or out.name,
        )
        for job in jobs
    )
    return StudyLaunch(study, out, plans, {job.recipe_path: job.recipe_text for job in jobs}, template, tuple(jobs))


def build_study_scripts(launch: StudyLaunch) -> dict[Path, str]:
    """``{path: text}``: every pair's scripts, the report job and the study's ``submit.sh`` (last)."""
    scripts = {}
    for plan in launch.plans:
        scripts.update({path: text for path, text in pair_scripts(plan).items() if path.name != "submit.sh"})
    scripts[launch.launch_dir / "report.sbatch"] = _report(launch)
    scripts[launch.launch_dir / "submit.sh"] = _submit(launch)
    return scripts


def job_table(launch: StudyLaunch) -> str:
    """One line per job: its name, its script and what it waits for (what ``--dry-run`` prints first)."""
    rows = []
    for plan in launch.plans:
        arms = f"{plan.name}-arm-a, {plan.name}-arm-b"
        for job in JOBS:
            waits = f"after (started): {arms}" if job == "watch" else "-"
            rows.append((f"{plan.name}-{job}", str(plan.launch_dir / f"{job}.sbatch"), waits))
    rows.append(
        (
            f"{launch.study.name}-report",
            str(launch.launch_dir / "report.sbatch"),
            f"afterok (succeeded): all {len(launch.plans) * len(JOBS)} jobs above",
        )
    )
    width = max(len(r[0]) for r in rows)
    head = (
        f"# study {launch.study.name}: {len(launch.plans)} pair runs ({launch.study.replicates} replicate(s), "
        f"the control once), {len(rows)} jobs, into {launch.out}"
    )
    return "\n".join([head, *(f"{name:<{width}}  {path}  waits for: {waits}" for name, path, waits in rows)])


def _report(launch: StudyLaunch) -> str:
    plan = replace(launch.template, out=launch.out, recipe=launch.out / "recipes" / "-", name=launch.study.name)
    return script(
        plan,
        sbatch_header(plan, "report", 1, 1, 0),  # its log: OUT/logs/report-%j.out
        ["# the study's report, once every pair run of the study folder has finished"],
        [f"{srun_prefix(plan)} {command_line(plan, ['report', str(launch.out)])}"],
    )


def _submit(launch: StudyLaunch) -> str:
    logs = {shlex.quote(str(p.log_dir)) for p in launch.plans} | {shlex.quote(str(launch.out / "logs"))}
    lines = [
        "#!/bin/bash",
        f"# Submits every pair run of study {launch.study.name}, then its report once all of them have succeeded.",
        "set -euo pipefail",
        f"mkdir -p {' '.join(sorted(logs))}",
        "all=''",
    ]
    for plan in launch.plans:
        lines += [
            *submit_lines(plan),
            'all="$all:$a:$b:$w"',
            f'echo {shlex.quote(plan.name + ":")} "arm a $a, arm b $b, comparator $w"',
        ]
    report = shlex.quote(str(launch.launch_dir / "report.sbatch"))
    lines += [
        f"r=$(sbatch --parsable --dependency=afterok$all {report}); r=${{r%%;*}}",
        'echo "report: job $r (after every job above has succeeded)"',
        "",
    ]
    return "\n".join(lines)


def render_study(launch: StudyLaunch) -> str:
    """The job table, then the study's own scripts (each pair's scripts are those of ``launch --recipe``)."""
    scripts = build_study_scripts(launch)
    own = [launch.launch_dir / "report.sbatch", launch.launch_dir / "submit.sh"]
    return "\n".join([job_table(launch), "", render({p: scripts[p] for p in own})])


def write_study(launch: StudyLaunch) -> Path:
    """The recipes and every script; the path of ``submit.sh``. As ``divergence study`` does
    (``divergence.study.reuse``), nothing is written over a pair run that a live process still
    writes or that trained another recipe: one line naming the run and the key."""
    check_reusable(launch.jobs)
    write({**launch.recipes, **build_study_scripts(launch)}, {p.log_dir for p in launch.plans})
    return launch.launch_dir / "submit.sh"
