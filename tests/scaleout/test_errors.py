"""Bad input to the separate-job commands: one line on stderr, exit code 2, before any work."""

import shutil

from divergence.cli import main
from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.pairfolder.arm.status import ArmStatus
from tests.pairs.helpers import PAIR_FAST, PAIRS
from tests.helpers import assert_one_line

from .conftest import STEPS


def test_arm_needs_a_pair_recipe(tmp_path, capsys):
    assert main(["train", "--recipe", str(PAIRS.parent / "tiny.yaml"), "--arm", "a", "--out", str(tmp_path)]) == 2
    assert_one_line(capsys, "--arm a: needs a pair recipe")


def test_arm_refuses_a_lockstep_folder_and_a_different_pair(trained, tmp_path, capsys):
    train = ["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--arm", "b"]
    assert main([*train, "--out", str(trained / "lockstep"), *PAIR_FAST, *STEPS]) == 2
    assert_one_line(capsys, "holds a lockstep pair run")
    shutil.copytree(trained / "arms", tmp_path / "arms")
    assert main([*train, "--out", str(tmp_path / "arms"), *PAIR_FAST, *STEPS, "train.lr=0.5"]) == 2
    assert_one_line(capsys, "train.lr = 0.001", "must train the same pair")


def test_arm_refuses_a_global_batch_other_than_the_other_arms(trained, tmp_path, capsys):
    shutil.copytree(trained / "arms", tmp_path / "arms")
    shutil.rmtree(tmp_path / "arms" / "b")
    assert ArmStatus.read(tmp_path / "arms/a").global_batch == 2
    train = ["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--arm", "b", "--out", str(tmp_path / "arms")]
    assert main([*train, *PAIR_FAST, *STEPS, "train.devices=2"]) == 2
    assert_one_line(
        capsys, "arm b: global batch 4 (train.batch_size 2 x 2 ranks x train.accumulate 1)", "the other arm's is 2"
    )
    assert main([*train, *PAIR_FAST, *STEPS, "train.accumulate=3"]) == 2
    assert_one_line(capsys, "arm b: global batch 6", "the other arm's is 2")


def test_arm_beside_a_status_without_its_global_batch_is_refused(trained, tmp_path, capsys):
    shutil.copytree(trained / "arms", tmp_path / "arms")
    shutil.rmtree(tmp_path / "arms" / "b")
    status = ArmStatus.read(tmp_path / "arms/a")
    status.global_batch = None  # a status that records no global batch: nothing says the batches agree
    status.write(tmp_path / "arms/a")
    train = ["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--arm", "b", "--out", str(tmp_path / "arms")]
    assert main([*train, *PAIR_FAST, *STEPS]) == 2
    assert_one_line(
        capsys, "arm b: global batch 2", "the other arm's is None (its status.json)", "train that arm again"
    )


def test_fsdp_limits_are_explicit(tmp_path, capsys):
    train = ["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--arm", "a", "--out", str(tmp_path)]
    assert main([*train, *PAIR_FAST, "train.strategy=fsdp"]) == 2
    assert_one_line(capsys, "train.strategy=fsdp needs GPUs")


def test_watch_bad_input(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["watch", str(tmp_path / "file")]) == 2
    assert_one_line(capsys, "not a folder")
    assert main(["watch", str(tmp_path), "--poll", "0"]) == 2
    assert_one_line(capsys, "--poll 0: must be > 0")


def test_watch_stops_when_the_arms_train_on_different_world_sizes(trained, tmp_path, capsys):
    shutil.copytree(trained / "arms", tmp_path / "arms")
    status = ArmStatus.read(tmp_path / "arms/b")
    status.world_size, status.global_batch = 4, 8
    status.write(tmp_path / "arms/b")
    assert Comparator(tmp_path / "arms", log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=5) == 2
    assert_one_line(capsys, "different global batches (arm a: 2, arm b: 8)")


def test_watch_accepts_world_sizes_that_differ_at_one_global_batch(trained, tmp_path, capsys):
    """(2 ranks, accumulate 1) and (1 rank, accumulate 2) train on the same examples."""
    shutil.copytree(trained / "arms", tmp_path / "arms")
    status = ArmStatus.read(tmp_path / "arms/b")
    status.world_size = 2
    status.write(tmp_path / "arms/b")
    assert Comparator(tmp_path / "arms", log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=60) == 0


def test_watch_compares_world_sizes_where_a_status_has_no_global_batch(trained, tmp_path, capsys):
    shutil.copytree(trained / "arms", tmp_path / "arms")
    status = ArmStatus.read(tmp_path / "arms/b")
    status.world_size, status.global_batch = 4, None
    status.write(tmp_path / "arms/b")
    assert Comparator(tmp_path / "arms", log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=5) == 2
    assert_one_line(capsys, "different world sizes (arm a: 1, arm b: 4)")
