"""Cluster options of the launcher, a requeueable CPU comparator, and a whole study submitted at once."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from divergence.cli import main
from divergence.launch.scripts import LaunchPlan, build_scripts
from tests.pairs.helpers import PAIRS

from .test_launch import _bash_n, _fake

RECIPE = str(PAIRS / "seed-vs-seed.yaml")
STUDY = str(PAIRS.parent / "study.yaml")


def test_cluster_options_reach_every_job(tmp_path, capsys):
    assert (
        main(
            [
                "launch",
                "--recipe",
                RECIPE,
                "--scheduler",
                "slurm",
                "--out",
                str(tmp_path / "run"),
                "--dry-run",
                "--cpus-per-task",
                "12",
                "--mem",
                "200G",
                "--container-image",
                "/img/div.sqsh",
                "--sbatch",
                "constraint=h100",
                "--sbatch",
                "exclusive",
                "--comparator-cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    scripts = dict(part.split(" <==\n", 1) for part in out.split("# ==> ")[1:])
    for name in ("arm-a.sbatch", "arm-b.sbatch", "watch.sbatch"):
        text = scripts[str(tmp_path / "run/launch" / name)]
        for line in (
            "#SBATCH --cpus-per-task=12",
            "#SBATCH --mem=200G",
            "#SBATCH --constraint=h100",
            "#SBATCH --exclusive",
            "#SBATCH --requeue",
            f"srun --container-image=/img/div.sqsh --container-mounts={tmp_path / 'run'}:{tmp_path / 'run'},"
            f"{PAIRS.resolve()}:{PAIRS.resolve()} divergence ",
        ):
            assert line in text, (name, line)
    watch, arm = scripts[str(tmp_path / "run/launch/watch.sbatch")], scripts[str(tmp_path / "run/launch/arm-a.sbatch")]
    assert "--gres" not in watch and "--device cpu" in watch and "#SBATCH --signal=B:USR1@120" in watch
    assert "#SBATCH --gres=gpu:1" in arm and "#SBATCH --signal=SIGUSR1@120" in arm


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sbatch", "time=1:00:00"], "launch sets --time itself; use --time"),
        (["--sbatch", "gres=gpu:8"], "launch sets --gres itself"),
        (["--sbatch", "constraint=a b"], "expected KEY=VALUE"),
        (["--cpus-per-task", "0"], "--cpus-per-task 0: must be >= 1"),
    ],
)
def test_bad_cluster_options_are_one_line(tmp_path, capsys, args, message):
    assert main(["launch", "--recipe", RECIPE, "--scheduler", "slurm", "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def _run_watch_script(tmp_path, sig):
    """Run watch.sbatch as SLURM's batch shell would, with a watch that runs until stopped; send ``sig``."""
    calls = tmp_path / "calls"
    _fake(
        tmp_path / "bin",
        "srun",
        f'echo "srun $@" >> {calls}\ntrap "echo stopped >> {calls}; exit 143" TERM\nsleep 60 & wait\n',
    )
    _fake(tmp_path / "bin", "scontrol", f'echo "scontrol $@" >> {calls}\n')
    plan = LaunchPlan(recipe=Path(RECIPE), out=tmp_path / "run", name="p", comparator_cpu=True)
    script = tmp_path / "watch.sbatch"
    script.write_text(build_scripts(plan)["watch.sbatch"])
    _bash_n(script)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "777"}
    proc = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    deadline = time.time() + 10
    while not (calls.exists() and "srun" in calls.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    try:
        code = proc.wait(10)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    return code, calls.read_text().splitlines()


def test_the_comparator_job_requeues_itself_on_usr1_and_stops_watch(tmp_path):
    code, calls = _run_watch_script(tmp_path, signal.SIGUSR1)
    assert code == 0
    assert calls[0].startswith(f"srun divergence watch {tmp_path / 'run'} --poll 30 --device cpu")
    assert "scontrol requeue 777" in calls and "stopped" in calls


def test_the_comparator_job_exits_cleanly_on_term(tmp_path):
    code, calls = _run_watch_script(tmp_path, signal.SIGTERM)
    assert code == 0 and "stopped" in calls and not any(c.startswith("scontrol") for c in calls)


def test_study_dry_run_prints_every_job_with_its_dependencies(tmp_path, capsys):
    out = tmp_path / "study"
    assert (
        main(["launch", "--study", STUDY, "--scheduler", "slurm", "--out", str(out), "--dry-run", "replicates=2"]) == 0
    )
    text = capsys.readouterr().out
    runs = [
        f"{pair}-r{r}" for r in (0, 1) for pair in ("flash-vs-baseline", "seed-vs-seed", "fp16-vs-fp32", "reordering")
    ]
    runs.append("control-r0")  # the control once
    assert f"# study flash-attention: {len(runs)} pair runs" in text
    table = text.split("\n\n")[0].splitlines()[1:]
    jobs = {row.split()[0]: (row.split()[1], row.split("waits for: ")[1]) for row in table}
    assert len(jobs) == 3 * len(runs) + 1
    for run in runs:
        pair, r = run.rsplit("-", 1)
        job = f"flash-attention-{run}"
        assert jobs[f"{job}-arm-a"] == (str(out / pair / r / "launch/arm-a.sbatch"), "-")
        assert jobs[f"{job}-arm-b"] == (str(out / pair / r / "launch/arm-b.sbatch"), "-")
        assert jobs[f"{job}-watch"] == (
            str(out / pair / r / "launch/watch.sbatch"),
            f"after (started): {job}-arm-a, {job}-arm-b",
        )
    assert "control-r1" not in text
    assert jobs["flash-attention-report"] == (
        str(out / "launch/report.sbatch"),
        f"afterok (succeeded): all {3 * len(runs)} jobs above",
    )
    assert "--dependency=afterok$all" in text and f"srun divergence report {out}" in text
    assert not out.exists()


def test_study_submission_chains_every_pair_then_the_report(tmp_path, monkeypatch, capfd):
    calls = tmp_path / "sbatch-calls"
    _fake(tmp_path / "bin", "sbatch", f'echo "$@" >> {calls}\necho "$((100 + $(wc -l < {calls})));cluster"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    out = tmp_path / "study"
    assert (
        main(
            [
                "launch",
                "--study",
                STUDY,
                "--scheduler",
                "slurm",
                "--out",
                str(out),
                "--comparator-cpu",
                "--mem",
                "32G",
                "replicates=1",
                "train.max_steps=50",
            ]
        )
        == 0
    )
    for script in [*out.glob("*/r*/launch/*"), *out.glob("launch/*")]:
        _bash_n(script)
    lines = calls.read_text().splitlines()
    # 5 pair runs (the pair under study, seed, precision, reordering, control) x (2 arms + comparator),
    # then the report
    assert len(lines) == 5 * 3 + 1
    for i in range(0, 15, 3):
        assert f"--dependency=after:{101 + i}:{102 + i} " in lines[i + 2]
        assert lines[i + 2].endswith("watch.sbatch")
    assert lines[-1].startswith("--parsable --dependency=afterok:" + ":".join(str(101 + i) for i in range(15)))
    assert lines[-1].endswith("report.sbatch")
    assert "report: job 116" in capfd.readouterr().out
    recipe = yaml.safe_load((out / "recipes/seed-vs-seed-r0.yaml").read_text())
    assert recipe["replicate"] == 0
    assert "train.max_steps=50" in (out / "seed-vs-seed/r0/launch/arm-a.sbatch").read_text()
    assert (out / "seed-vs-seed/r0/logs").is_dir() and (out / "logs").is_dir()


def test_a_study_launch_over_a_run_of_another_recipe_writes_nothing(tmp_path, monkeypatch, capsys):
    """As ``divergence study`` refuses to mix runs (``divergence.study.reuse``), so does ``launch --study``:
    a pair run whose pair.yaml holds another learning rate is named in one line, exit 2, and neither
    the recipes nor a script nor a submission is written."""
    from divergence.study.config import load_study
    from divergence.study.runner import plan_jobs

    calls = tmp_path / "sbatch-calls"
    _fake(tmp_path / "bin", "sbatch", f'echo "$@" >> {calls}\necho "101;cluster"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    out = tmp_path / "study"
    job = plan_jobs(load_study(STUDY, ["replicates=1"], "cuda"), out.resolve(), [])[0]
    job.out.mkdir(parents=True)
    old = {**job.config, "recipes": {**job.config["recipes"]}}
    old["recipes"]["a"] = {**old["recipes"]["a"], "train": {**old["recipes"]["a"]["train"], "lr": 0.5}}
    (job.out / "pair.yaml").write_text(yaml.safe_dump(old))
    assert main(["launch", "--study", STUDY, "--scheduler", "slurm", "--out", str(out), "replicates=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{job.out}: its pair.yaml" in err and "train.lr = 0.5" in err, err
    assert not (out / "recipes").exists() and not (out / "launch").exists() and not calls.exists()


def test_study_launch_needs_slurm(tmp_path, capsys):
    assert main(["launch", "--study", STUDY, "--scheduler", "torchrun", "--dry-run"]) == 2
    assert "--study: needs --scheduler slurm" in capsys.readouterr().err
