"""``divergence watch`` on a step that can never come: one line and exit 2, not a wait without end.

The issue's cases: an arm that finished with a gap ("waiting for step 2 (a: finished at 3; b:
finished at 3)"), arms that stopped before ``max_steps`` (both "failed at 4", watch waited for
5), a finished ``track`` output (no arm folders). Arms still running are waited for as before.
Each arm here is written through the contract's own writers (``LossFile``, ``save_weights``,
``ArmStatus``), as a user's own writer would write it, or with ``ArmWriter``.
"""

import time

import torch

from divergence.cli import main
from divergence.pairfolder import write_pair_files
from divergence.store import MetricsStore
from divergence.pairfolder.arm.status import ArmStatus
from divergence.pairfolder.arm.losses import LossFile
from divergence.pairfolder import ArmFolder
from divergence.pairfolder.arm.weights_file import save_weights
from divergence.writers import ArmWriter

# seconds: watch's --timeout. A refusal is exit 2, the old hang ends here with exit 1 ("timed out"); long
# enough that a loaded machine's slow first watch is not taken for a hang (8 s was, at a load of 15)
BOUND = 60


def watch(out, capsys, timeout=BOUND):
    started = time.monotonic()
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", str(timeout)])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err, time.monotonic() - started


def own_writer(out, arm, loss_steps, weight_steps, state="finished", last_step=3):
    """An arm as a user's own writer leaves it (files of the contract, written by its classes)."""
    folder = out / arm
    losses = LossFile(folder)
    for step in loss_steps:
        losses.append(step, 1.0 / step)
    for step in weight_steps:
        save_weights(
            ArmFolder(folder).weights(step), {"w": torch.full((3,), float(step))}, step=step, arm=arm, recipe={}
        )
    ArmStatus(arm, state=state, last_step=last_step, max_steps=3).write(folder)


def test_an_arm_that_finished_with_a_gap_is_one_line_and_exit_2(tmp_path, capsys):
    write_pair_files(tmp_path, max_steps=3, every=1, dense=[], log={"wandb": False})
    own_writer(tmp_path, "a", [1, 3], [0, 1, 2, 3])  # no loss of step 2
    own_writer(tmp_path, "b", [1, 2, 3], [0, 1, 2, 3])
    code, err, took = watch(tmp_path, capsys)
    assert code == 2 and took < BOUND and len(err) == 1
    assert "arm a finished at step 3, but its a/losses.jsonl has no step 2 (a gap)" in err[0]
    assert MetricsStore(tmp_path).steps() == [0, 1]  # what could be built is built


def test_a_missing_weights_file_of_a_tracked_step_is_a_gap(tmp_path, capsys):
    write_pair_files(tmp_path, max_steps=3, every=1, dense=[], log={"wandb": False})
    own_writer(tmp_path, "a", [1, 2, 3], [0, 1, 3])
    own_writer(tmp_path, "b", [1, 2, 3], [0, 1, 2, 3])
    code, err, took = watch(tmp_path, capsys)
    assert code == 2 and took < BOUND and len(err) == 1
    assert "arm a finished at step 3, but it has no a/checkpoints/step_000002.safetensors (tracked step 2)" in err[0]


def test_arms_that_stopped_before_max_steps_are_one_line_and_exit_2(tmp_path, capsys):
    for arm in ("a", "b"):
        with ArmWriter(tmp_path, arm, max_steps=4, every=2, dense=[], log={"wandb": False}) as writer:
            writer.record(0, torch.nn.Linear(2, 1))
            for step in (1, 2):
                writer.record(step, torch.nn.Linear(2, 1), 0.5)
    assert ArmStatus.read(tmp_path / "a").state == "failed"  # finish() before max_steps
    code, err, took = watch(tmp_path, capsys)
    assert code == 2 and took < BOUND and len(err) == 1
    assert "arm a failed at step 2, before step 3 (max_steps 4)" in err[0] and "Restart the arm" in err[0]
    assert MetricsStore(tmp_path).steps() == [0, 1, 2]


def test_a_running_arm_is_still_waited_for(tmp_path, capsys):
    write_pair_files(tmp_path, max_steps=3, every=1, dense=[], log={"wandb": False})
    own_writer(tmp_path, "a", [1], [0, 1], state="running", last_step=None)
    own_writer(tmp_path, "b", [1, 2, 3], [0, 1, 2, 3])
    code, err, took = watch(tmp_path, capsys, timeout=0.5)
    assert code == 1 and "timed out: no progress for 0.5 s at step 2" in err[-1]
    assert MetricsStore(tmp_path).steps() == [0, 1]


def test_a_store_without_arm_folders_is_done_or_one_line(tmp_path, capsys):
    """A finished ``track`` output (or one-process pair) has nothing to follow: complete, it is done."""
    from safetensors.torch import save_file

    for side, scale in (("A", 1.0), ("B", 1.01)):
        (tmp_path / side).mkdir()
        for step in (0, 5, 10):
            save_file({"w": torch.full((4,), scale * step)}, str(tmp_path / side / f"step_{step}.safetensors"))
    out = tmp_path / "tracked"
    assert main(["track", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    code, err, took = watch(out, capsys)
    assert code == 0 and took < BOUND and MetricsStore(out).steps() == [0, 5, 10]
    cut = tmp_path / "cut"  # a one-process pair whose run ended at step 0 of 4
    write_pair_files(cut, max_steps=4, every=1, dense=[], log={"wandb": False})
    MetricsStore(cut).open_for_append().append_step(
        0, [], {"tracked": True, "loss_a": float("nan"), "loss_b": float("nan")}
    )
    code, err, took = watch(cut, capsys)
    assert code == 2 and took < BOUND and len(err) == 1
    assert "no arm folders (a/, b/) to follow, and its store ends at step 0 of 4" in err[0]


def test_a_restart_caught_between_its_cut_and_its_status_is_not_a_stall(tmp_path):
    """A restarting arm cuts its later records, then writes its new status: a look between the two
    sees an ended arm with a gap. Only a stall seen twice with the same statuses stops watch."""
    from divergence.comparator.follow import Comparator
    from divergence.training.probe_files import FileProbe

    write_pair_files(tmp_path, max_steps=3, every=1, dense=[], log={"wandb": False})
    own_writer(tmp_path, "a", [1], [0, 1], state="failed", last_step=3)  # losses 2, 3 just cut
    own_writer(tmp_path, "b", [1, 2, 3], [0, 1, 2, 3])
    comparator = Comparator(tmp_path, log=False, progress=False, probe=FileProbe)
    for _ in range(2):  # steps 0 and 1 are there
        task = comparator.planner.plan(None)
        assert task.kind == "step" and comparator._take(task)
    assert comparator.planner.plan(None).kind == "wait"  # step 2: the gap, seen once, not yet acted on
    ArmStatus("a", attempt=2, start_step=1, max_steps=3).write(tmp_path / "a")  # the restart's new status
    assert comparator.planner.plan(None).kind == "wait"  # running: waited for
    ArmStatus("a", state="failed", attempt=2, start_step=1, last_step=1, max_steps=3).write(tmp_path / "a")
    assert comparator.planner.plan(None).kind == "wait"
    stop = comparator.planner.plan(None)
    assert stop.kind == "stop" and stop.code == 2 and "arm a failed at step 1, before step 2" in stop.message
