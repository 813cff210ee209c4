"""Fuzzing a study re-run over the pair runs already in its folder.

An earlier run's ``pair.yaml`` is the study's own resolved recipe with one key changed (a seeded
sweep over every key of it): the re-run either reuses the run (a key a resume may change: the
length, checkpoint, sample and log cadences, data workers) or is refused in one line naming the
run folder and that key, before anything is written; never a silent reuse or a mix. A run folder
a live process writes is refused the same way (the orphaned ``train`` of a killed study).
"""

import copy
import random
import time
from pathlib import Path

import pytest
import yaml

from divergence.cli import main
from divergence.errors import UserInputError
from divergence.study import load_study
from divergence.study.reuse import REUSED, check_reusable
from divergence.study.runner import plan_jobs
from divergence.training.folder_check import _may_change, flatten_keys

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
MAX_LINE = 600


def _study_file(tmp_path) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "base": str(RECIPES / "tiny.yaml"),
                "study": str(RECIPES / "pairs/fused-adamw.yaml"),
                "references": {"control": str(RECIPES / "pairs/control.yaml")},
            }
        )
    )
    return path


def _dump(data: dict) -> str:
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def _other(value):
    """A different value of about the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-x"
    if isinstance(value, list):
        return [*value, copy.deepcopy(value[-1]) if value else 1]  # a copy: no YAML alias
    return 1 if value is None else "x"


def _changed(config: dict, key: str) -> dict:
    data = copy.deepcopy(config)
    node, (*parents, leaf) = data, key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = _other(node[leaf])
    return data


def test_every_changed_key_of_a_reused_run_is_reused_or_refused_in_one_line(tmp_path):
    study = load_study(_study_file(tmp_path), device_type="cpu")
    out = tmp_path / "out"
    jobs = plan_jobs(study, out, ["train.max_steps=4"])
    job = jobs[0]
    keys = sorted(flatten_keys(job.config))
    rng = random.Random(0)
    started, refused, reused = time.process_time(), 0, 0
    for key in rng.sample(keys, min(30, len(keys))):
        job.out.mkdir(parents=True, exist_ok=True)
        (job.out / "pair.yaml").write_text(_dump(_changed(job.config, key)))
        try:
            check_reusable([job])
        except UserInputError as err:
            refused += 1
            message = str(err)
            assert "\n" not in message and len(message) < MAX_LINE, message[:300]
            assert message.startswith(f"{job.out}: its pair.yaml") and f" {key} = " in message, (key, message)
            assert not _may_change(key, REUSED), (key, message)
        else:
            reused += 1
            assert _may_change(key, REUSED), f"{key} changed and the run was reused"
    assert refused > 15 and reused > 0  # most keys decide what a run computes; a few are cadences
    assert time.process_time() - started < 60


@pytest.mark.parametrize("case", ["edited", "partial", "live-writer"])
def test_a_re_run_over_an_edited_partial_or_live_run_writes_nothing(case, tmp_path, capsys):
    """The real command: one line, exit 2, and not even ``OUT/recipes`` written."""
    from divergence.pairfolder.arm.lock import PairLock

    recipe, out = _study_file(tmp_path), tmp_path / "out"
    (job,) = [j for j in plan_jobs(load_study(recipe), out, ["train.max_steps=4"]) if j.pair.name == "control"]
    job.out.mkdir(parents=True)
    config = job.config if case == "live-writer" else _changed(job.config, "recipes.b.train.lr")
    (job.out / "pair.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if case == "partial":  # an interrupted run: a store and a resume folder, not finished
        (job.out / "metrics.jsonl").write_text("")
        (job.out / "resume").mkdir()
    lock = PairLock(job.out) if case == "live-writer" else None
    try:
        args = ["study", "--recipe", str(recipe), "--out", str(out), "--max-steps", "4", "--no-wandb", "--quiet"]
        assert main(args) == 2
    finally:
        if lock is not None:
            lock.release()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(job.out) in err, err
    assert ("still writing this pair run" if case == "live-writer" else "recipes.b.train.lr") in err
    assert not (out / "recipes").exists() and not (out / "logs").exists()
