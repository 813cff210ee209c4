"""A separate-job pair resumed after a kill: only the killed arm's remaining steps train again.

The pair (the tiny DiT): arm a one plain process, arm b ZeRO-1 under DDP on one gloo rank (``train.strategy``
and ``train.shard_optimizer`` differ, so ``divergence train`` trains each arm as its own job).
On one rank ZeroRedundancyOptimizer owns every weight and steps it exactly as AdamW does, so the
two arms compute the same weights bitwise: arm a, trained once without interruption, is the
uninterrupted run that arm b's resumed weights must equal at every step, and the pair's store
must hold every step once with E = 0. Arm a finished; arm b is SIGKILLed after step 3 of 4 (its last
resume checkpoint at step 2); ``divergence train`` again must leave arm a alone, resume arm b
from step 2, and complete the store.
"""

import json
import multiprocessing
import os
import signal

import torch
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load_file

from divergence.cli import main
from divergence.pairfolder.arm.status import ArmStatus
from divergence.training.separate_arm import train_arm
from divergence.training.separate_pair import separate_jobs
from tests.pairs.helpers import PAIR_FAST, PAIRS, pair_recipe, store_lines

OVERRIDES = (
    "model.denoiser=transformer",  # the tiny DiT: a quarter of the UNet's CPU a step, and ZeRO-1 alike
    "arms.a=[{data-parallel: 1x2}]",  # one plain process (strategy auto)
    "arms.b=[zero-1]",  # ZeRO-1 under DDP, one rank
    "train.strategy=ddp",
    "train.max_steps=4",
    "train.checkpoint_every=2",
    "tracking.every=1",
    "tracking.probe.enabled=false",
)


class KillAfterStep3(Callback):
    """SIGKILL this process once step 3 is done: no cleanup, arm b's status left "running"."""

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGKILL)


def _arm_b_killed(out):
    train_arm(pair_recipe("zero-1", *OVERRIDES), "b", out, callbacks=[KillAfterStep3()])


def test_a_killed_arm_resumes_alone_and_the_store_equals_the_uninterrupted_arms(tmp_path, job_env, monkeypatch):
    recipe, out = PAIRS / "zero-1.yaml", tmp_path / "pair"
    pair = pair_recipe("zero-1", *OVERRIDES)
    assert separate_jobs(pair) is not None  # the separate-job path, with one rank per arm
    train_arm(pair, "a", out)
    finished_a = {p.name: p.stat().st_mtime_ns for p in (out / "a" / "checkpoints").iterdir()}
    # arm b in its own process, killed mid-run; spawned, not forked: a fork of a process whose torch
    # threads already ran (an xdist worker after other tests) can deadlock in the child
    killed = multiprocessing.get_context("spawn").Process(target=_arm_b_killed, args=(out,))
    killed.start()
    killed.join(timeout=300)
    if killed.exitcode is None:
        killed.kill()
    assert killed.exitcode == -signal.SIGKILL
    assert ArmStatus.read(out / "b").state == "running" and not (out / "metrics.jsonl").exists()

    for name, value in job_env.items():  # arm b's job forked from the zygote test_parallel_rows' jobs fork from
        monkeypatch.setenv(name, value)
    assert main(["train", "--recipe", str(recipe), "--out", str(out), *PAIR_FAST, *OVERRIDES]) == 0

    status_a, status_b = ArmStatus.read(out / "a"), ArmStatus.read(out / "b")
    assert (status_a.attempt, status_a.finished, status_a.last_step) == (1, True, 4)  # not trained again
    assert {p.name: p.stat().st_mtime_ns for p in (out / "a" / "checkpoints").iterdir()} == finished_a
    assert (status_b.attempt, status_b.start_step, status_b.finished, status_b.last_step) == (2, 2, True, 4)
    assert status_b.world_size == 1
    for step in range(5):  # arm b, killed and resumed, equals arm a, never interrupted, bitwise
        a, b = (load_file(out / arm / "checkpoints" / f"step_{step:06d}.safetensors") for arm in "ab")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), step
    losses = {arm: [json.loads(x) for x in (out / arm / "losses.jsonl").read_text().splitlines()] for arm in "ab"}
    assert [x["step"] for x in losses["b"]] == [1, 2, 3, 4]  # step 3 of the killed attempt not twice
    assert [x["loss"] for x in losses["b"]] == [x["loss"] for x in losses["a"]]
    steps = [x for x in store_lines(out) if x.get("type") == "step"]
    assert [x["step"] for x in steps] == list(range(5)) and all(x["rel_l2"] == 0.0 for x in steps)
    info = json.loads((out / "pair.json").read_text())
    assert info["finished"] and info["last_step"] == 4
