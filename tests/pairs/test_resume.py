"""A pair killed with SIGKILL and started again ends exactly like one never interrupted."""

import os
import signal
import subprocess
import sys
import time

from safetensors.torch import load_file

from divergence.cli import main

from .helpers import PAIR_FAST, PAIRS, step_records, wandb_history, wandb_synced_steps

# killed after step 7 (in the segment after the step-4 checkpoint), resumed across the end of every-step tracking (8)
STEPS = ("train.max_steps=12", "train.checkpoint_every=4", "tracking.every=2", "tracking.dense=[[8,1]]")
CHECKPOINT = 4
WASSERSTEIN = "divergence/model/wasserstein"
# seed-vs-seed on the tiny DiT at 16x16 (data.resolution=16 below: 8x8 patches): a step about 4x cheaper than
# the UNet's and ~2x again than the DiT's at 32x32; what is resumed (weights, optimizer and data positions, the
# store, the wandb steps) is the same at any image size
PAIR = """name: seed-vs-seed-dit
base: {base}
arms:
  a: [{{seed: 0}}]
  b: [{{seed: 1}}]
"""


def _command(recipe, out, *extra):
    return ["train", "--recipe", str(recipe), "--out", str(out), *PAIR_FAST, "data.resolution=16", *STEPS, *extra]


def _wandb_holds(out, step):
    """Whether the (still written) offline wandb file under ``out`` holds the tracked ``step``."""
    try:
        return any(row["_step"] >= step and WASSERSTEIN in row for row in wandb_history(out))
    except Exception:  # a record cut mid-write: not yet
        return False


def _kill_mid_segment(recipe, out, *extra, after_step=7, timeout=120):
    """Start the pair in a child process and SIGKILL it once the store has passed ``after_step`` and its
    wandb file holds the checkpoint's step (wandb writes behind the trainer: killed before, the steps up to
    the checkpoint would be in neither run, and the wandb check would fail for a reason not the resume's).

    The whole process group is killed, as a scheduler kills a job: the trainer and its wandb
    service process alike."""
    # a fresh job: not attached to this test process's wandb service (WANDB_SERVICE)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = os.getcwd()
    proc = subprocess.Popen(
        [sys.executable, "-m", "divergence", *_command(recipe, out, *extra)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    stopped = False
    while time.time() < deadline and proc.poll() is None:
        store = out / "metrics.jsonl"
        if not stopped and store.exists() and f'"step":{after_step},' in store.read_text():
            # the trainer paused past after_step, so a loaded machine cannot end the run while wandb's
            # service (another process of the group, still running) writes out the records it was sent
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = True
        if stopped and _wandb_holds(out, CHECKPOINT):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"


def test_resume_after_sigkill_equals_uninterrupted(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    recipe = tmp_path / "seed-vs-seed-dit.yaml"
    recipe.write_text(PAIR.format(base=PAIRS.parent / "tiny-dit.yaml"))
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # the uninterrupted reference without wandb: its store and weights are compared, never its wandb file (the
    # killed and resumed runs' wandb steps are checked against its store), and wandb must change neither
    assert main(_command(recipe, straight, "log.wandb=false")) == 0
    _kill_mid_segment(recipe, killed, "log.wandb=true")
    killed_at = max(step_records(killed))
    assert 6 <= killed_at < 12  # killed after step 6 committed, before the end
    assert main(_command(recipe, killed, "log.wandb=true")) == 0

    # the metrics series: byte for byte the same records, no duplicates, no gaps
    assert (killed / "metrics.jsonl").read_bytes() == (straight / "metrics.jsonl").read_bytes()
    # the final weights of both arms: bitwise equal
    for arm in "ab":
        final = f"{arm}/checkpoints/step_000012.safetensors"
        a, b = load_file(straight / final), load_file(killed / final)
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    # wandb: every tracked step exactly once across the killed and the resumed run, once wandb
    # drops the re-logged steps it already holds (its rule for resumed runs)
    rows = wandb_history(killed)
    assert len({row["_file"] for row in rows}) == 2
    synced = wandb_synced_steps(rows, WASSERSTEIN)
    assert synced == [s for s, r in step_records(straight).items() if r["tracked"]]
