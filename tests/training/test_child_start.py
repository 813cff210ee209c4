"""``divergence train`` children forked from the zygote (``training.child_start``) are the Popen ones.

One tiny lockstep DiT pair (fused AdamW, 2 steps) is trained by a ``Popen`` child and by a forked child:
its store and final weights must be the same bytes. The other tests reuse that zygote, which
test_rank_fork's children fork from too (``tests.training.forks``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from divergence.errors import UserInputError
from divergence.training import child_start
from tests.procs import parent
from tests.training.forks import child_env

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "model.denoiser=transformer",  # the tiny DiT: a quarter of the UNet's CPU a step
    "train.max_steps=2",
    "train.checkpoint_every=2",
    "train.batch_size=2",
    "train.cpu_threads=1",
    "sample.enabled=false",
    "log.wandb=false",
    "log.progress_bar=false",
    "tracking.every=1",
    "tracking.probe.size=4",
]


def _train(out: Path, *extra: str) -> list[str]:
    recipe = ROOT / "recipes" / "pairs" / "fused-adamw.yaml"
    return [sys.executable, "-m", "divergence", "train", "--recipe", str(recipe), "--out", str(out), *QUICK, *extra]


def _env(zygote: Path, mode: str) -> dict[str, str]:
    """The shared zygote's children's environment (``tests.training.forks``: test_rank_fork's zygote
    serves ours); a Popen child's start is not logged there (test_rank_fork counts the starts)."""
    return child_env(zygote, mode, log_starts=mode != "popen")


def _run(command: list[str], env: dict[str, str], log: Path):
    with open(log, "w") as f:
        child = child_start.start(command, env, stdout=f, stderr=subprocess.STDOUT)
    child.wait(timeout=600)
    return child


@pytest.fixture(scope="module")
def both(tmp_path_factory, zygote_root):
    root = tmp_path_factory.mktemp("child_start")
    modes = ("popen", "fork")
    children = {mode: _run(_train(root / mode), _env(zygote_root, mode), root / f"{mode}.log") for mode in modes}
    return root, children


def test_a_forked_child_trains_the_popen_childs_bytes(both):
    root, children = both
    assert type(children["popen"]) is subprocess.Popen
    assert type(children["fork"]) is child_start.ForkedChild
    for mode, child in children.items():
        assert child.returncode == 0, (root / f"{mode}.log").read_text()[-2000:]
    files = ["metrics.jsonl", "a/checkpoints/step_000002.safetensors", "b/checkpoints/step_000002.safetensors"]
    for name in files:
        assert (root / "fork" / name).read_bytes() == (root / "popen" / name).read_bytes(), name


def test_the_zygote_has_one_thread_froze_its_imports_and_is_the_forked_childs_parent(both, zygote_root):
    (zygote,) = child_start._zygotes.values()
    assert len(os.listdir(f"/proc/{zygote.process.pid}/task")) == 1
    # its imports frozen for the children's collectors (gc.freeze: ~2.3 s of CPU a child's exit took without)
    assert zygote.frozen > 100_000
    child = child_start.start(_train(both[0] / "long", "train.max_steps=1000"), _env(zygote_root, "fork"))
    try:
        assert parent(child.pid) == zygote.process.pid
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.1)
    finally:
        child.kill()
    assert child.wait(timeout=60) == -9
    assert child.poll() == -9


def test_bad_input_exits_2_with_its_line_in_the_log(both, zygote_root):
    log = both[0] / "bad.log"
    child = _run(_train(both[0] / "bad", "train.nope=1"), _env(zygote_root, "fork"), log)
    assert type(child) is child_start.ForkedChild
    assert child.returncode == 2
    assert log.read_text().splitlines()[-1].startswith("divergence train: error: unknown key 'train.nope'")


def test_the_zygote_key_ignores_only_the_wandb_run_variables_and_the_pytest_test_name():
    env = {"PATH": "/bin", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"}
    key = child_start._key(env, "/")
    assert child_start._key({**env, "WANDB_RUN_GROUP": "g"}, "/") == key
    assert child_start._key({**env, "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"}, "/") == key
    assert child_start._key({**env, "TORCHINDUCTOR_CACHE_DIR": "/tmp/y"}, "/") != key
    assert child_start._key({**env, "OMP_NUM_THREADS": "1"}, "/") != key
    # Lightning and torchmetrics read their rank from these at import (``rank_zero_only.rank``)
    assert all(child_start._key({**env, name: "1"}, "/") != key for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE"))
    assert child_start._key(env, "/tmp") != key


def test_the_switch_starts_a_popen_and_refuses_an_unknown_mode():
    command = [sys.executable, "-m", "divergence", "--version"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = child_start.start(command, dict(env, DIVERGENCE_CHILD_START="popen"), stdout=subprocess.DEVNULL)
    assert type(child) is subprocess.Popen and child.wait(timeout=60) == 0
    with pytest.raises(UserInputError, match="DIVERGENCE_CHILD_START=spawn: use one of fork, popen"):
        child_start.start(command, dict(env, DIVERGENCE_CHILD_START="spawn"))
