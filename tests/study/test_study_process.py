"""A stopped study ends its ``train`` children; a study folder takes one study at a time.

The studies here are real, their children real ``divergence train`` processes. A study that is itself
killed with SIGKILL is ``python -m divergence study`` in a subprocess; the others run in this process
(``main``, as the command does), stopped with SIGTERM or their children killed from a thread.
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import yaml

from divergence.cli import main
from divergence.pairfolder.pair_json import PairInfo
from tests.procs import alive, parent

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
QUICK = [
    "--no-wandb",
    "--quiet",
    "--replicates",
    "1",
    "tracking.every=1",
    "tracking.probe.size=4",
    "train.batch_size=2",
    "sample.enabled=false",
    "log.wandb=false",  # each arm's offline wandb run (~2.4 s of CPU a child): tests/loggers
]


def _study_recipe(tmp_path, *references) -> Path:
    """A study of fused AdamW on the DiT (its children start and train faster than the UNet's), with the named
    reference pairs (each one more child)."""
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "small",
                "base": str(RECIPES / "tiny-dit.yaml"),
                "study": str(RECIPES / "pairs" / "fused-adamw.yaml"),
                "references": {role: str(RECIPES / "pairs" / f"{pair}.yaml") for role, pair in references},
            }
        )
    )
    return path


def _train_children(pid: int) -> list[int]:
    """Live ``divergence train`` children of ``pid``: started by it (Popen), or forked by its zygote
    (``training.child_start``; a forked child's command line is the zygote's)."""
    processes = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            processes[int(entry.name)] = parent(int(entry.name)), (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    zygotes = {p for p, (up, command) in processes.items() if up == pid and _is_zygote(command)}
    return [
        p
        for p, (up, command) in processes.items()
        if alive(p) and ((up == pid and b"train" in command) or up in zygotes)
    ]


def _is_zygote(command: list[bytes]) -> bool:
    return any(b"divergence.training.child_start" in part for part in command)


def _start_study(recipe: Path, out: Path, *extra: str) -> tuple[subprocess.Popen, list[int]]:
    """A study in a subprocess, once it has started ``len(references) + 1`` children; its children's pids."""
    process = subprocess.Popen(
        [sys.executable, "-m", "divergence", "study", "--recipe", str(recipe), "--out", str(out), *QUICK, *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    wanted = len(yaml.safe_load(recipe.read_text())["references"]) + 1
    while time.monotonic() < deadline:
        children = _train_children(process.pid)
        if len(children) >= wanted:
            time.sleep(0.5)  # the zygote's own short-lived fork (``child_start._quiesce``) is no train child
            children = [p for p in _train_children(process.pid) if p in children]
            if len(children) >= wanted:
                return process, children
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.2)
    process.kill()
    raise AssertionError("the study started no train child in 180 s")


def _gone(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still alive after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    _gone(pids, 30)


def test_a_study_folder_takes_one_study_and_a_stopped_study_ends_its_children(tmp_path, capsys):
    """One folder through a study's life, each check on the processes the one before left (so the file starts
    one study process, not four): a second study or calibration is refused while the first trains; the first
    killed, the restarted study refuses the folder its orphan still trains; the orphan gone, a study gets the
    lock, and SIGTERM to it ends every train child."""
    out = tmp_path / "out"
    recipe = _study_recipe(tmp_path)
    _import_what_a_refused_study_imports(recipe)
    first, children = _start_study(recipe, out, "--max-steps", "500")
    try:
        _a_second_study_on_the_folder_is_refused_while_the_first_trains(recipe, out, first, capsys)
        _a_restarted_study_refuses_the_folder_its_orphan_still_trains(recipe, out, first, children, capsys)
    finally:
        _kill([first.pid, *children])  # its orphan: the test's own cleanup
    # the first killed (the kernel dropped its lock) and its orphan gone: a study gets the lock and trains
    # (fused-adamw resumed, the control one more child beside it); it runs in this process (``main``), sent
    # SIGTERM from a thread once both children train
    recipe = _study_recipe(tmp_path, ("control", "control"))
    stopped = _in_thread(lambda before: _sigterm_this_study(out, before, children=2))
    try:
        assert (
            main(["study", "--recipe", str(recipe), "--out", str(out), *QUICK, "--jobs", "2", "--max-steps", "500"])
            == 130
        )
        holder, children = stopped.result()
        assert holder == f"{os.getpid()}\n"  # the lock was this study's
        survivors = _gone(children, 5)
        assert not survivors, f"train children {survivors} outlived the study"
        assert "study: interrupted" in capsys.readouterr().err
    finally:
        _kill(_train_children(os.getpid()))


def _import_what_a_refused_study_imports(recipe):
    """The report's modules and torch (~5 s of CPU), imported before the first study starts: its child then
    trains only while the checks run, not while this process imports. Nothing is written (``plan_jobs``)."""
    from divergence.report import build_report  # noqa: F401
    from divergence.study import load_study
    from divergence.study.runner import plan_jobs

    assert plan_jobs(load_study(recipe), recipe.parent / "out", [])


def _sigterm_this_study(out: Path, before: set[int], children: int) -> tuple[str, list[int]]:
    """SIGTERM to this process once the study ``main`` runs in it has ``children`` train children (none of
    ``before``): what its lock file said then, and those children."""
    try:
        started = _new_train_children(os.getpid(), before, children)
        return (out / ".study.lock").read_text(), started
    finally:  # sent even when the above failed: the study ends, and the test with it
        handler = signal.getsignal(signal.SIGTERM)  # the study's (``signals_raise``): it ends the study, not pytest
        assert "signals_raise" in getattr(handler, "__qualname__", ""), handler
        os.kill(os.getpid(), signal.SIGTERM)


def _a_second_study_on_the_folder_is_refused_while_the_first_trains(recipe, out, first, capsys):
    assert main(["study", "--recipe", str(recipe), "--out", str(out), "--max-steps", "500", *QUICK]) == 2
    assert (
        main(
            [
                "calibrate",
                "--out",
                str(out),
                "--quiet",
                "--max-steps",
                "3",
                "doses=[1.0e-4,1.0e-3,1.0e-2]",
                "references.precision=null",
                "train.batch_size=2",
                "sample.enabled=false",
            ]
        )
        == 2
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 2
    for err in errors:
        assert f"{out}: another study or calibration (pid {first.pid}) is training in this folder" in err, err


def _a_restarted_study_refuses_the_folder_its_orphan_still_trains(recipe, out, first, children, capsys):
    """A study killed with SIGKILL leaves its ``train`` child running; the restarted study started
    a second ``train`` on the folder (which cut the store while the orphan appended) and quoted the orphan's log.
    Now it is refused in one line naming the orphan, before anything is written, and the orphan's store is kept."""
    from divergence.pairfolder.arm.lock import PairLock

    run = out / "fused-adamw" / "r0"
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    first.kill()  # SIGKILL: no code of the study runs; the kernel drops its lock; its train child goes on
    first.wait(timeout=30)
    (orphan,) = children
    assert alive(orphan) and PairLock.is_held(run)
    store = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["study", "--recipe", str(recipe), "--out", str(out), "--max-steps", "500", *QUICK]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run}: another process (pid {orphan} on" in err, err
    assert "still writing this pair run" in err
    time.sleep(1.0)
    assert (run / "metrics.jsonl").read_bytes().startswith(store)  # the orphan's records: not cut


def test_the_lock_names_its_holder_and_is_free_once_released(tmp_path):
    from divergence.errors import UserInputError
    from divergence.study.lock import study_lock

    with study_lock(tmp_path):
        try:
            with study_lock(tmp_path):
                raise AssertionError("a second holder was let in")
        except UserInputError as err:
            assert f"(pid {os.getpid()})" in str(err)
    with study_lock(tmp_path):  # released on the way out
        pass


def test_a_pair_run_that_dies_is_started_again_from_its_checkpoint_once(tmp_path, capsys):
    """A train child killed (as a rank's segfault or the OOM killer would) is started once more and resumes
    from its last checkpoint: the study ends as if nothing happened, its store holding every step once. Killed
    twice, the study fails, in one line that says it was restarted.

    Both studies run in this process, their children killed from a thread: what is checked is the study's
    handling of its children, the same in a study process of its own."""
    recipe = _study_recipe(tmp_path)
    out = tmp_path / "once"
    run = out / "fused-adamw" / "r0"
    killed = _in_thread(lambda before: _kill_after_a_checkpoint(_new_train_children(os.getpid(), before)[0], run))
    assert main(["study", "--recipe", str(recipe), "--out", str(out), *QUICK, *ONCE]) == 0
    killed.result()
    err = capsys.readouterr().err
    assert "divergence: pair fused-adamw (replicate 0) failed (exit " in err, err
    assert "; starting it again from its last checkpoint" in err
    info = PairInfo.read(run)
    assert info.finished and info.last_step == 6
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["type"] == "step"]
    assert steps == list(range(7))  # resumed: every step recorded once (dense tracking), none lost or twice
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)

    out = tmp_path / "twice"

    def twice(before):
        (child,) = _new_train_children(os.getpid(), before)
        _kill_after_a_checkpoint(child, out / "fused-adamw" / "r0")
        _kill(_new_train_children(os.getpid(), {*before, child}))

    killed = _in_thread(twice)
    assert main(["study", "--recipe", str(recipe), "--out", str(out), *QUICK, *TWICE]) == 1
    killed.result()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert "pair fused-adamw (replicate 0) failed again, after a restart from its checkpoint (exit " in line, line


# the dying pair run: a checkpoint every 2 steps on the DiT at 16x16 (8x8 patches: a step ~2x cheaper),
# 6 steps (killed after its first checkpoint, the restart trains 4) or more than it trains before the kills
ONCE = ["train.checkpoint_every=2", "data.resolution=16", "--max-steps", "6"]
TWICE = ["train.checkpoint_every=2", "data.resolution=16", "--max-steps", "500"]


def _in_thread(act) -> Future:
    """``act(before)`` in a thread (``before``: this process's train children now, none of them those it
    acts on), while the study runs in this process's main thread; its future."""
    before = set(_train_children(os.getpid()))
    pool = ThreadPoolExecutor(1)
    future = pool.submit(act, before)
    pool.shutdown(wait=False)
    return future


def _kill_after_a_checkpoint(child: int, run: Path) -> None:
    """SIGKILL ``child`` once ``run`` holds a resumable checkpoint (``resume/last.ckpt``)."""
    deadline = time.monotonic() + 120
    while not (run / "resume" / "last.ckpt").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run / "resume" / "last.ckpt").is_file(), f"{run}: no checkpoint in 120 s"
    _kill([child])


def _new_train_children(pid: int, before: set[int], wanted: int = 1) -> list[int]:
    """``wanted`` train children of ``pid`` that are none of ``before``, once it has them."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        started = [p for p in _train_children(pid) if p not in before]
        if len(started) >= wanted:
            time.sleep(0.5)  # the zygote's own short-lived fork (``child_start._quiesce``) is no train child
            started = [p for p in _train_children(pid) if p in started]
            if len(started) >= wanted:
                return started
        time.sleep(0.2)
    raise AssertionError(f"{wanted} train children did not start in 120 s")
