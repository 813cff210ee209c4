"""The pair-folder contract: pair.json kept whole when rewritten, the schedule read from pair.json
alone (pair.yaml only for the probe), a pair.json of another contract refused, and the readers free
of the training package."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.errors import UserInputError
from divergence.pairfolder import CONTRACT, PAIR_FILE, PAIR_RECIPE_FILE, PairInfo, read_schedule, write_pair_files
from divergence.store import MetricsStore
from divergence.writers import ArmWriter

ROOT = Path(__file__).resolve().parents[2]


def _train(out, arm: str, lr: float, steps: int = 4, **pair) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(1)
    with ArmWriter(out, arm, max_steps=steps, every=2, dense=[], **pair) as writer:
        writer.record(0, model)
        for step in range(1, steps + 1):
            x = torch.randn(8, 3, generator=data)
            loss = (model(x) - x[:, :2]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            writer.record(step, model, loss)


def test_pair_info_rewrite_keeps_contract_replicate_tracking_and_unknown_keys(tmp_path):
    written = write_pair_files(tmp_path, max_steps=8, every=4, replicate=2, log={"wandb": False})
    data = json.loads((tmp_path / PAIR_FILE).read_text())
    data["from_a_newer_writer"] = {"x": 1}
    (tmp_path / PAIR_FILE).write_text(json.dumps(data))
    info = PairInfo.read(tmp_path)
    info.finished, info.last_step = True, 8
    info.write(tmp_path)
    after = json.loads((tmp_path / PAIR_FILE).read_text())
    assert after == {**written, "from_a_newer_writer": {"x": 1}, "finished": True, "last_step": 8}
    assert after["contract"] == CONTRACT and after["replicate"] == 2 and after["tracking"]["every"] == 4


def test_watch_follows_a_writer_folder_from_pair_json_alone_and_keeps_its_keys(tmp_path):
    _train(tmp_path, "a", 0.1, replicate=3)
    _train(tmp_path, "b", 0.2)
    assert not (tmp_path / PAIR_RECIPE_FILE).exists()  # the writers no longer fake a recipe of ours
    before = json.loads((tmp_path / PAIR_FILE).read_text())
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.02, timeout=10) == 0
    store = MetricsStore(tmp_path)
    assert [r["step"] for r in store.step_records() if r["tracked"]] == [0, 2, 4]
    assert all("probe_rel_diff" not in r for r in store.step_records())  # no recipe: no probe
    after = json.loads((tmp_path / PAIR_FILE).read_text())
    assert after == {**before, "finished": True, "last_step": 4}
    assert after["replicate"] == 3 and after["contract"] == CONTRACT


def test_schedule_of_the_built_in_trainers_pair_json(tmp_path):
    # the built-in trainer keeps checkpoint_every and log in pair.json's recipe
    info = PairInfo(
        name="p",
        category="control",
        arms={"a": [], "b": []},
        max_steps=30,
        recipe={"train": {"checkpoint_every": 7}, "log": {"wandb": False}},
        tracking={"every": 10, "dense": [], "probe": {"enabled": True, "size": 2}},
    )
    info.write(tmp_path)
    schedule = read_schedule(tmp_path)
    assert (schedule.name, schedule.max_steps, schedule.checkpoint_every) == ("p", 30, 7)
    assert schedule.log.wandb is False
    assert [s for s in range(31) if schedule.tracked(s)] == [0, 7, 10, 14, 20, 21, 28, 30]
    assert not schedule.tracking.probe.enabled  # the probe builds our models from pair.yaml: absent here


def test_a_folder_without_tracking_in_pair_json_is_refused_whatever_pair_yaml_holds(tmp_path):
    PairInfo(name="old", category="optimization", arms={"a": ["x"], "b": ["y"]}, max_steps=12).write(tmp_path)
    recipe = {"name": "old", "tracking": {"every": 5}, "recipes": {"a": {"train": {"max_steps": 12}}}}
    (tmp_path / PAIR_RECIPE_FILE).write_text(yaml.safe_dump(recipe))
    with pytest.raises(UserInputError, match=r"pair.json: no tracking.every; write pair.json with "):
        read_schedule(tmp_path)


PAIR = {"name": "p", "category": "control", "arms": {"a": [], "b": []}, "max_steps": 3}


@pytest.mark.parametrize(
    "content, message",
    [
        ({"contract": CONTRACT, **PAIR}, "no tracking.every"),
        ({"contract": CONTRACT + 1, "name": "p"}, "upgrade divergence"),
        (
            {**PAIR, "tracking": {"every": 1}},
            r"contract None, not 1: not written by this divergence; train the pair again",
        ),
        ({"contract": "1", **PAIR, "tracking": {"every": 1}}, r"contract '1', not 1: .* train the pair again"),
    ],
)
def test_unreadable_schedule_names_the_file(tmp_path, content, message):
    (tmp_path / PAIR_FILE).write_text(json.dumps(content))
    with pytest.raises(UserInputError, match=message) as err:
        read_schedule(tmp_path)
    assert str(err.value).startswith(str(tmp_path / PAIR_FILE)) and "\n" not in str(err.value)


def test_a_folder_without_contract_is_refused_at_the_command_line_in_one_line(tmp_path, capsys):
    from divergence.cli import main
    from tests.helpers import assert_one_line

    _train(tmp_path / "pair", "a", 0.1)
    _train(tmp_path / "pair", "b", 0.2)
    path = tmp_path / "pair" / PAIR_FILE
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "contract"}))
    assert main(["report", str(tmp_path / "pair"), "--out", str(tmp_path / "r"), "--no-wandb"]) == 2
    assert_one_line(capsys, str(path), "contract None, not 1", "train the pair again")


def test_no_pair_json_says_to_start_the_arms(tmp_path):
    with pytest.raises(UserInputError, match="no pair.json; start the arms first"):
        read_schedule(tmp_path)


def test_readers_never_import_the_training_package():
    importing = re.compile(r"^\s*(from|import) divergence\.training", re.M)
    for package in ("comparator", "tracking", "pairfolder", "store"):
        for path in (ROOT / "divergence" / package).glob("*.py"):
            assert not importing.search(path.read_text()), path
    assert not any("divergence.training" in p.read_text() for p in (ROOT / "divergence/comparator").glob("*.py"))


BLOCKED = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "divergence.training" or name.startswith("divergence.training."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import torch
from divergence.comparator.follow import Comparator
sys.exit(Comparator(sys.argv[1], log=False, progress=False).run(poll=0.02, timeout=10))
"""


def test_watch_runs_with_the_training_package_blocked(tmp_path):
    _train(tmp_path, "a", 0.1)
    _train(tmp_path, "b", 0.2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert MetricsStore(tmp_path).last_step() == 4


def test_watch_logs_with_the_log_section_of_pair_json(tmp_path):
    _train(tmp_path, "a", 0.1, log={"wandb": False})
    _train(tmp_path, "b", 0.2)
    assert json.loads((tmp_path / PAIR_FILE).read_text())["log"] == {"wandb": False}
    assert Comparator(tmp_path, log=True, progress=False, probe=FileProbe).run(poll=0.02, timeout=20) == 0
    assert not (tmp_path / "wandb").exists()  # wandb off, as pair.json says
    logged = [p.read_text() for p in (tmp_path / "csv").rglob("metrics.csv")]
    assert logged and "divergence/model/wasserstein" in logged[0]
